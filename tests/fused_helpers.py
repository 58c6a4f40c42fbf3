"""What the static engine's tests share (test_fused.py, test_fused_capture.py, test_prefill.py): a prompt, a
tree, a decoder on the static cache, and a stand-in for torch.cuda that records where a capture runs."""

import contextlib

import torch

from medusa_lib import DecodeConfig, Decoder, build_tree, cartesian_choices

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
    return Decoder(
        model,
        method=method,
        heads=None if method == "plain" else heads,
        tree=None if method == "plain" else TREE,
        config=cfg,
        static_kv=kv,
    )


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
