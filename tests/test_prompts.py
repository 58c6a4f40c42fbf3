"""Prompt data: composed deterministically, split by topic, committed files in sync with the module."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from medusa_lib.pipeline import prompts as P

BENCH_CATEGORIES = {
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
    "summarization",
    "translation",
    "qa",
    "rag",
}
BENCH_PATH = P.DATA_DIR / "bench_prompts.jsonl"  # hand-written, not composed by the module
EXAMPLES_PATH = P.ROOT / "assets" / "examples.json"


def build_prompts(seed: int) -> list[dict]:
    """Every prompt, training ones first, as the module writes them (ids say the split)."""
    train, heldout = P.split_prompts(P.compose_prompts(seed), seed=seed)
    return train + heldout


@pytest.fixture(scope="module")
def built():
    return build_prompts(seed=0)


@pytest.fixture(scope="module")
def halves(built):
    return P.split_prompts(built)


def test_build_is_deterministic(built):
    assert build_prompts(seed=0) == built
    assert build_prompts(seed=1) != built  # the seed matters


def test_counts_and_uniqueness(built, halves):
    train, heldout = halves
    texts = [p["prompt"] for p in built]
    assert len(set(texts)) == len(texts) >= 4000
    assert len(train) >= 4000
    per_cat = Counter(p["category"] for p in train)
    assert len(per_cat) >= 10 and min(per_cat.values()) >= 200, per_cat
    assert len(heldout) >= 300
    assert {p["category"] for p in heldout} == set(per_cat)
    assert all(set(p) == {"id", "category", "topic", "prompt"} and p["prompt"].strip() for p in built)
    assert all(p["topic"].lower() in p["prompt"].lower() for p in built)


def test_split_is_idempotent(built, halves):
    train, heldout = halves
    assert train + heldout == built
    assert all(p["id"].startswith(f"train-{p['category']}-") for p in train)
    assert all(p["id"].startswith(f"heldout-{p['category']}-") for p in heldout)


def test_heldout_topics_never_in_training(halves):
    train, heldout = halves
    train_text = "\n".join(p["prompt"] for p in train)
    held_topics = {p["topic"] for p in heldout}
    assert not held_topics & {p["topic"] for p in train}
    leaks = [t for t in held_topics if re.search(r"(?<!\w)" + re.escape(t) + r"(?!\w)", train_text, re.IGNORECASE)]
    assert not leaks


def test_committed_files_match_module(halves):
    train, heldout = halves
    assert P.load_jsonl(P.TRAIN_PATH) == train, "run `python -m medusa_lib.pipeline.prompts` to regenerate"
    assert P.load_jsonl(P.HELDOUT_PATH) == heldout, "run `python -m medusa_lib.pipeline.prompts` to regenerate"


def test_bench_is_separate(built):
    bench = P.load_jsonl(BENCH_PATH)
    assert len(bench) == 48
    assert Counter(b["category"] for b in bench) == {c: 4 for c in BENCH_CATEGORIES}
    assert all(re.fullmatch(rf"bench-{b['category']}-0[1-4]", b["id"]) and b["prompt"].strip() for b in bench)
    texts = {p["prompt"] for p in built}
    assert not [b["id"] for b in bench if b["prompt"] in texts]
    topics = {p["topic"] for p in built}
    shared = [(b["id"], t) for b in bench for t in topics if P.key_pattern(t).search(b["prompt"])]
    assert not shared


def test_ids_unique_across_files():
    ids = [r["id"] for path in (P.TRAIN_PATH, P.HELDOUT_PATH, BENCH_PATH) for r in P.load_jsonl(path)]
    assert len(ids) == len(set(ids))


def test_examples():
    examples = json.loads(EXAMPLES_PATH.read_text(encoding="utf-8"))
    assert isinstance(examples, list) and len(examples) >= 6
    assert all(set(e) == {"label", "prompt"} and e["label"].strip() and e["prompt"].strip() for e in examples)
    assert len({e["label"] for e in examples}) == len(examples)
