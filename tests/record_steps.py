"""Record every step of every decoder on the test models, to prove a refactor moved nothing.

    python tests/record_steps.py before.json             # record
    python tests/record_steps.py after.json --compare before.json

Records, per run, each step's tokens, accept length, lookup tokens, tree (choices), tree tokens,
accepted path and finish reason, over methods x drafters x caches x lookup on/off x two seeds on
tiny random models (conftest.py): the oracle heads (long accepted paths), random root- and
path-conditioned heads, an EAGLE head, and the prompt lookup drafter where the code has one.
A run near the context limit and runs that hit EOS exercise the cuts. Nothing here is timed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import OracleHeads, make_model, random_heads  # noqa: E402

from medusa_lib.core.compose import make_decoder
from medusa_lib.core.config import DecodeConfig  # noqa: E402
from medusa_lib.core.dynamic_tree import DynamicTreeConfig  # noqa: E402
from medusa_lib.core.eagle import new_eagle_head  # noqa: E402
from medusa_lib.core.kv import StaticKV  # noqa: E402
from medusa_lib.core.tree import get_tree  # noqa: E402

RUNS = {  # method -> temperature
    "plain": 0.0,
    "plain-sample": 0.8,
    "medusa-greedy": 0.0,
    "medusa-typical": 0.8,
    "medusa-sample": 0.8,
}


def prompts(vocab: int) -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(7)
    rand = torch.randint(3, vocab, (12,), generator=g).tolist()
    loop = [5, 6, 7, 8, 9] * 4  # repeats: the lookup match fires
    near_limit = torch.randint(3, vocab, (490,), generator=g).tolist()  # context 512: the context cut
    return {"random": rand, "repeating": loop, "near-limit": near_limit}


def step_row(s) -> dict:
    return {
        "tokens": list(s.tokens),
        "accept": s.accept_length,
        "lookup": s.lookup_accepted,
        "tree": [list(c) for c in s.tree.choices] if s.tree is not None else None,
        "tree_tokens": s.tree_token_ids,
        "best": s.best_path,
        "finish": s.finish_reason,
        "drafter": s.drafter,
    }


def drafters(model, ids) -> dict[str, dict]:
    """name -> Decoder keywords of each drafter (built fresh per model)."""
    seq = make_decoder(model, method="plain", config=DecodeConfig(max_new_tokens=60, stop_on_eos=False)).run(ids).tokens
    out = {
        "oracle": dict(heads=OracleHeads(model, list(ids) + seq), tree=get_tree("chain-3", num_heads=4)),
        "root": dict(heads=random_heads(4, root=True, seed=3), tree=get_tree("chain-2", num_heads=4)),
        "path": dict(heads=random_heads(4, path=True, seed=4), tree=get_tree("chain-2", num_heads=4)),
    }
    from medusa_lib.core import tree as tree_mod

    big = [n for n in tree_mod.preset_names() if n.startswith("mc_sim")][:1]
    if big:
        out["oracle-big"] = dict(heads=out["oracle"]["heads"], tree=get_tree(big[0], num_heads=4))
    torch.manual_seed(5)
    eagle = new_eagle_head(model, tree=DynamicTreeConfig(top_k=4, depth=3, num_nodes=10)).eval()
    for p in eagle.parameters():
        torch.nn.init.normal_(p, std=0.3)
    out["eagle"] = dict(eagle=eagle, tree=eagle.config.tree)
    try:
        from medusa_lib.core.drafters import LookupDrafter

        out["lookup"] = dict(drafter=LookupDrafter(length=4))
    except ImportError:
        pass
    return out


def record() -> dict:
    torch.set_num_threads(2)
    rows = {}
    for arch in ("llama", "qwen2"):
        model = make_model(arch)
        model.config.eos_token_id = 2
        ps = prompts(model.config.vocab_size)
        drafts = drafters(model, ps["random"])
        static_kv = StaticKV(model, max_len=1024)
        for pname, ids in ps.items():
            for dname, kw in drafts.items():
                if arch != "llama" and dname in ("eagle", "oracle-big"):
                    continue
                for method, temp in RUNS.items():
                    if method.startswith("plain") and dname != "oracle":
                        continue
                    for cache in ("dynamic", "static"):
                        for lookup in (0, 3):
                            if method.startswith("plain") and lookup:
                                continue
                            for seed in (0, 1):
                                if temp == 0 and seed:
                                    continue
                                n = 24 if pname == "near-limit" else 40
                                cfg = DecodeConfig(
                                    max_new_tokens=n,
                                    temperature=temp,
                                    seed=seed,
                                    lookup=lookup,
                                    cache=cache,
                                    sample_root=method == "medusa-typical",
                                )
                                kind = "plain" if method.startswith("plain") else method
                                dec = make_decoder(
                                    model,
                                    method=kind,
                                    config=cfg,
                                    static_kv=static_kv,
                                    **({} if kind == "plain" else kw),
                                )
                                key = f"{arch}|{pname}|{dname}|{method}|{cache}|lookup={lookup}|seed={seed}"
                                rows[key] = [step_row(s) for s in dec.steps(ids)]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--compare", help="an earlier record: report every run whose steps differ")
    args = ap.parse_args()
    rows = record()
    Path(args.out).write_text(json.dumps(rows))
    print(f"{len(rows)} runs, {sum(len(v) for v in rows.values())} steps -> {args.out}")
    if args.compare:
        before = json.loads(Path(args.compare).read_text())
        common = [k for k in before if k in rows]
        differ = [k for k in common if before[k] != rows[k]]
        print(
            f"compared {len(common)} runs ({len(rows) - len(common)} new, {len(before) - len(common)} gone): "
            f"{len(differ)} differ"
        )
        for k in differ[:20]:
            a, b = before[k], rows[k]
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"  {k}: step {i}: {a[i] if i < len(a) else None} != {b[i] if i < len(b) else None}")
        return 1 if differ or len(common) < len(before) else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
