"""What the static engine's tests share (test_fused.py, test_fused_capture.py, test_prefill.py,
test_eagle_static.py): a prompt, a tree, a decoder on the static cache, the aten ops a step runs inside and
outside its program, and a stand-in for torch.cuda that records where a capture runs."""

import contextlib
from collections import Counter

import torch

from medusa_lib import DecodeConfig, build_tree, cartesian_choices
from medusa_lib.core.compose import make_decoder
from medusa_lib.pipeline.profile_step import count_ops

HOST_READS = {"_local_scalar_dense", "item", "equal", "is_nonzero", "nonzero", "masked_select", "allclose"}
# aten ops outside the program per decode step: the read of the result row (slice, .tolist())
READ_BOUND = 3
# CPU tensors the step records make from the row (Step.tree_tokens): host memory, no device op
HOST_MADE = {"lift_fresh", "detach_"}

PROMPT = [1, 17, 33, 250, 99, 4, 61, 17, 33, 250]
TREE = build_tree(cartesian_choices([3, 2, 2]))


def decoder(model, heads, method="medusa-greedy", *, lookup=3, temperature=0.0, n=24, kv=None, top_p=1.0):
    cfg = DecodeConfig(
        max_new_tokens=n,
        stop_on_eos=False,
        cache="static",
        lookup=lookup,
        temperature=temperature,
        top_p=top_p,
        seed=5,
        sample_root=True,
    )
    return make_decoder(
        model,
        method=method,
        heads=None if method == "plain" else heads,
        tree=None if method == "plain" else TREE,
        config=cfg,
        static_kv=kv,
    )


def step_ops(steps) -> tuple[set, Counter, int]:
    """Run a decoder's ``steps()`` iterator past its prefill (eager, it reads its first token) under a
    dispatch-mode counter (``profile_step.count_ops``): (the aten ops run inside ``fused.Program.step``,
    those run outside it by name with HOST_MADE left out, the decode steps)."""
    log, n = count_ops(steps, skip=0)
    inside = {name for (where, name) in log.counts if where == "inside"}
    outside = Counter(
        {name: k for (where, name), k in log.counts.items() if where == "outside" and name not in HOST_MADE}
    )
    return inside, outside, n


class FakeCuda:
    """Stands in for torch.cuda in StaticKV.record: records where the capture runs, and "replays"
    by calling ``replay`` (the program's eager step), or fails where told to."""

    def __init__(self, replay=None, fail: str | None = None):
        self.devices, self.streams, self.modes, self.replay, self.fail = [], [], [], replay, fail

    def device(self, dev):
        self.devices.append(torch.device(dev))
        return contextlib.nullcontext()

    def Stream(self, dev):  # noqa: N802
        self.streams.append(torch.device(dev))
        return self

    def current_stream(self, dev):
        return self

    def wait_stream(self, other):
        pass

    def stream(self, s):
        return contextlib.nullcontext()

    def CUDAGraph(self):  # noqa: N802
        outer = self

        class Graph:
            def replay(self):
                if outer.replay:
                    outer.replay()

            def pool(self):
                return None

        return Graph()

    @contextlib.contextmanager
    def graph(self, g, *, pool=None, stream=None, capture_error_mode="global"):
        self.modes.append(capture_error_mode)
        if self.fail:
            raise RuntimeError(self.fail)
        yield
