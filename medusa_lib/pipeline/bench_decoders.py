"""The bench's decoders: each of our methods built on one engine, with the drafters and trees it needs (``bench.py``).

The Medusa heads draft the tree and lookup length the playground picks on this kind of device in
these numerics (``heads_defaults``) unless --tree and --lookup say otherwise; the EAGLE head drafts
its dynamic tree (--eagle-tree); every other registered drafter (core/drafters/) is built from what
it loads beside --heads; each drafter under greedy, exact sampling and typical acceptance. Our
methods share one engine (--cache, --capture; core/kv.py) whose static cache is long enough for the
widest step any of them verifies. A drafter that cannot load or a tree these heads cannot draft
stops the bench with one sentence (cli.py).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from ..core.compose import make_decoder
from ..core.config import DEFAULT_LOOKUP, DecodeConfig
from ..core.decoding import Decoder
from ..core.defaults import heads_defaults
from ..core.drafters import REGISTRY, EagleDrafter
from ..core.dynamic_tree import DynamicTreeConfig
from ..core.eagle import EagleHead
from ..core.eagle_io import load_eagle
from ..core.engine import Engine, prepare_engine
from ..core.heads import MedusaHeads
from ..core.heads_load import load_heads
from ..core.messages import InputError
from ..core.model import input_device
from ..core.tree.presets import get_tree
from ..core.tree.shape import with_lookup
from .bench_args import DRAFTER_METHODS
from .cli import fail


@dataclass
class BenchDecoders:
    """Our decoders by method, the engine they run on, and what the report and the JSON say about them."""

    decoders: dict[str, Decoder]
    engine: Engine
    # the Medusa tree (+ its lookup branch), the lookup length, and a calibration made on another device kind
    tree_name: str | None
    lookup: int
    note: str | None
    heads: MedusaHeads | None
    eagle: EagleHead | None
    eagle_tree: DynamicTreeConfig | None


def build_decoders(
    model, args: argparse.Namespace, methods: list[str], *, sample_cfg: DecodeConfig, static_cache_len: int
) -> BenchDecoders:
    """The decoders of ``methods`` (and baseline, plain-sample) on ``model``, from the bench's flags ``args``.

    ``sample_cfg``: the one sampling config of every sampled method; ``static_cache_len``: the longest
    prompt + --max-new-tokens, the cache length before the widest step."""
    device = input_device(model)
    decoders = {}
    tree_name, lookup, note, tree = None, 0, None, None
    # the drafters loaded: whether they draft in int8 is theirs to say (core/packing.py)
    heads = eagle = None
    if any(m.startswith("medusa") for m in methods):
        try:
            heads = load_heads(args.heads, model=model, int8=False if args.float_draft else None)
        except InputError as e:
            # HeadsError: one sentence
            fail(e)
        # the playground's defaults too (the calibration of this device kind in these numerics)
        defaults = heads_defaults(heads, device, str(next(model.parameters()).dtype))
        # calibrated on another kind of device only
        note = defaults.note
        if note:
            print(f"note: {note}", flush=True)
        tree_name = args.tree or defaults.tree
        try:
            tree = get_tree(tree_name, num_heads=heads.num_heads, extra=heads.tree_presets)
        except InputError as e:
            # TreeError: a preset deeper than these heads
            fail(f"--tree: {e}")
        lookup = args.lookup if args.lookup is not None else defaults.lookup_length
        tree_name = f"{tree_name} + lookup-{lookup}" if lookup else tree_name
    eagle, eagle_tree = None, None
    if any(m.startswith("eagle") for m in methods):
        try:
            eagle = load_eagle(args.eagle, model=model, int8=False if args.float_draft else None)
            eagle_tree = (
                DynamicTreeConfig(*map(int, args.eagle_tree.split(","))) if args.eagle_tree else eagle.config.tree
            )
            eagle_tree.check()
        except (InputError, ValueError, TypeError) as e:
            hint = "write the tree as three whole numbers, top_k,depth,nodes (e.g. 8,5,24)"
            raise SystemExit(f"--eagle / --eagle-tree: {e if isinstance(e, InputError) else hint}") from None
    # eagle-lookup's branch: the medusa methods' length, else --lookup, never 0 (that is eagle-greedy)
    branch = (lookup if tree is not None else args.lookup) or DEFAULT_LOOKUP
    # Our methods' engine: the cache, and with a capture the shared static cache, long enough for the
    # widest step the methods below verify (a tree + its lookup branch); the warm-up captures their steps.
    shapes = [tree, with_lookup(tree, lookup)] if tree is not None else []
    # the trees, EAGLE's with its branch, or a prompt lookup chain if it is longer
    widest = max(
        [t.num_nodes for t in shapes]
        + [1 + (args.lookup or DEFAULT_LOOKUP)]
        + ([eagle_tree.num_nodes + 1 + branch] if eagle_tree is not None else [])
    )
    try:
        engine = prepare_engine(
            model,
            cache=args.cache,
            capture=args.capture,
            max_len=static_cache_len + widest,
            say=lambda m: print(m, flush=True),
        )
    except InputError as e:
        raise SystemExit(str(e)) from None
    own = {"cache": engine.cache}

    def ours(method: str, config: DecodeConfig, **kw) -> Decoder:
        return make_decoder(model, method=method, config=replace(config, **own), static_kv=engine.static_kv, **kw)

    if tree is not None:
        cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, lookup=lookup)
        decoders["medusa-greedy"] = ours("medusa-greedy", cfg, heads=heads, tree=tree)
        decoders["medusa-heads-only"] = ours(
            "medusa-greedy", DecodeConfig(max_new_tokens=args.max_new_tokens), heads=heads, tree=tree
        )
        decoders["medusa-greedy-nodetail"] = ours(
            "medusa-greedy",
            DecodeConfig(max_new_tokens=args.max_new_tokens, record_detail=False, lookup=lookup),
            heads=heads,
            tree=tree,
        )
        decoders["medusa-typical"] = ours(
            "medusa-typical", replace(sample_cfg, sample_root=True, lookup=lookup), heads=heads, tree=tree
        )
        decoders["medusa-sample"] = ours("medusa-sample", replace(sample_cfg, lookup=lookup), heads=heads, tree=tree)

    def rules(prefix: str, drafter) -> dict[str, Decoder]:
        """``drafter`` under greedy, exact sampling and typical acceptance: <prefix>-greedy, -sample, -typical."""
        return {
            f"{prefix}-greedy": ours(
                "medusa-greedy", DecodeConfig(max_new_tokens=args.max_new_tokens), drafter=drafter
            ),
            f"{prefix}-sample": ours("medusa-sample", sample_cfg, drafter=drafter),
            f"{prefix}-typical": ours("medusa-typical", replace(sample_cfg, sample_root=True), drafter=drafter),
        }

    if eagle is not None:
        decoders |= rules("eagle", EagleDrafter(eagle, eagle_tree))
        decoders["eagle-lookup"] = ours(
            "medusa-greedy",
            DecodeConfig(max_new_tokens=args.max_new_tokens, lookup=branch),
            drafter=EagleDrafter(eagle, eagle_tree),
        )
    # every other registered drafter, from what it loads beside --heads (prompt lookup: nothing)
    for name in dict.fromkeys(DRAFTER_METHODS[m] for m in methods if m in DRAFTER_METHODS):
        cls = REGISTRY[name]
        got = cls.load(model, heads=heads, folder=args.heads)
        if got.state is None:
            fail(f"{name}: {got.note}")
        try:
            made = cls.for_run(got.state, heads=heads, tree=lambda: tree, lookup=args.lookup or DEFAULT_LOOKUP)
        except InputError as e:
            fail(f"{name}: {e}")
        decoders |= rules(name, made)
    decoders["baseline"] = ours("plain", DecodeConfig(max_new_tokens=args.max_new_tokens))
    decoders["plain-sample"] = ours("plain", sample_cfg)
    return BenchDecoders(decoders, engine, tree_name, lookup, note, heads, eagle, eagle_tree)
