"""Instruction prompts for training and evaluating Medusa heads, composed from hand-written seeds.

Medusa heads are trained by self-distillation (Cai et al. 2024, Sec. 2.3.2): the base model answers
a set of prompts and the heads learn to predict its own next tokens. What matters is that the
prompts look like what a user asks a small chat model, and cover many kinds of answer (prose,
lists, code, numbers, translations), so that the heads see every style they will meet.

Every category in the seed file (assets/data/prompt_seeds.json) has hand-written instruction
*templates* (the forms a question takes) and hand-written *topics* (what it is about: a subject,
a passage, a word problem, a coding task, a sentence to translate). A prompt is one template
filled with one topic, plus small slots (a language, an audience, the numbers of a word problem).
Composition is seeded and deterministic; no network, no model, nothing downloaded.

The seed file is ``{"names", "categories": [{"name", "templates", "slots"?, "topics"}, ...]}``; a
topic is a string (its own key) or ``{"key", "text", "slots"?}``, whose text may hold more {fields}.
``slots`` list each {field}'s values; {name} is any of ``names``, {p1}, {p2}, ... distinct ones.

The held-out set is split by TOPIC, not by prompt: a held-out topic's key phrase occurs in no
training prompt at all, so accept rates on it measure how heads generalise to unseen content.

    python -m medusa_lib.pipeline.prompts          # writes assets/data/{train,heldout}_prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
import string
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# tests read the written files back with P.load_jsonl
from .jsonl import load_jsonl, write_jsonl  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = ROOT / "assets" / "data"
SEEDS_PATH = DATA_DIR / "prompt_seeds.json"
TRAIN_PATH = DATA_DIR / "train_prompts.jsonl"
HELDOUT_PATH = DATA_DIR / "heldout_prompts.jsonl"

# prompts composed from each topic (distinct templates / slot values)
PER_TOPIC = 10
# share of each category's topics kept out of training
HELDOUT_FRACTION = 0.15
# {p1}, {p2}, ... are distinct values of the {name} slot
PERSON = re.compile(r"p\d")


@dataclass(frozen=True)
class Topic:
    # phrase the split is made by; occurs verbatim in every prompt built from this topic
    key: str
    # what fills {topic}; may hold its own {slots} (word problems, puzzles)
    text: str
    slots: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Category:
    name: str
    # instruction forms, each with a {topic} field
    templates: tuple[str, ...]
    topics: tuple[Topic, ...]
    # values for other fields: {lang}, {audience}, {name} ...
    slots: dict = field(default_factory=dict)


def load_seeds(path: str | Path = SEEDS_PATH) -> tuple[Category, ...]:
    """The seed file's categories, in its order; each one's slots include {name}: the file's names."""
    seeds = json.loads(Path(path).read_text(encoding="utf-8"))
    names = tuple(seeds["names"])

    def slots(d: dict) -> dict:
        return {k: tuple(v) for k, v in d.get("slots", {}).items()}

    def topic(t: str | dict) -> Topic:
        return Topic(t, t) if isinstance(t, str) else Topic(t["key"], t["text"], slots(t))

    return tuple(
        Category(c["name"], tuple(c["templates"]), tuple(map(topic, c["topics"])), {"name": names, **slots(c)})
        for c in seeds["categories"]
    )


def _fields(text: str) -> list[str]:
    """Named {fields} of a format string, in order, without repeats (never a set: hash order varies)."""
    return list(dict.fromkeys(name for _, name, _, _ in string.Formatter().parse(text) if name))


def _fill(text: str, slots: dict, rng: random.Random, **fixed) -> str:
    """Format ``text``; {p1} {p2} ... get distinct values of the {name} slot, other fields a random value
    from ``slots``."""
    values = dict(fixed)
    fields = [f for f in _fields(text) if f not in values]
    people = [f for f in fields if PERSON.fullmatch(f)]
    values.update(zip(people, rng.sample(slots["name"], len(people))))
    for f in fields:
        if f not in values:
            values[f] = rng.choice(slots[f])
    return text.format(**values)


def compose_category(cat: Category, *, seed: int = 0, per_topic: int = PER_TOPIC) -> list[dict]:
    """``per_topic`` distinct prompts for each topic of ``cat``, cycling through its templates."""
    rng = random.Random(f"compose:{seed}:{cat.name}")
    out: list[dict] = []
    for topic in cat.topics:
        order = list(cat.templates)
        rng.shuffle(order)
        seen: set[str] = set()
        for i in range(per_topic * 50):
            if len(seen) == per_topic:
                break
            text = _fill(topic.text, {**cat.slots, **topic.slots}, rng)
            prompt = _fill(order[i % len(order)], cat.slots, rng, topic=text)
            if prompt not in seen:
                # the split relies on it
                assert topic.key.lower() in prompt.lower(), (cat.name, topic.key)
                seen.add(prompt)
                out.append({"category": cat.name, "topic": topic.key, "prompt": prompt})
        if len(seen) < per_topic:
            raise ValueError(
                f"{cat.name}: topic {topic.key!r} gives only {len(seen)} distinct prompts; add templates or slot values"
            )
    # so a prefix of the file still covers many topics
    rng.shuffle(out)
    return out


def compose_prompts(seed: int = 0, *, per_topic: int = PER_TOPIC) -> list[dict]:
    """All prompts of the seed file, category by category: ``{"category", "topic", "prompt"}`` (no ids, no
    split yet)."""
    categories = load_seeds()
    keys = [t.key.lower() for c in categories for t in c.topics]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"topic keys must be unique across categories; repeated: {dupes}")
    return [p for cat in categories for p in compose_category(cat, seed=seed, per_topic=per_topic)]


def key_pattern(key: str) -> re.Pattern:
    """``key`` as a whole phrase, any case ("friction" matches "Friction," but not "frictionless")."""
    return re.compile(r"(?<!\w)" + re.escape(key) + r"(?!\w)", re.IGNORECASE)


def split_prompts(
    prompts: list[dict], *, heldout_fraction: float = HELDOUT_FRACTION, seed: int = 0
) -> tuple[list[dict], list[dict]]:
    """Split by topic: ``(train, heldout)``, with ids like ``train-writing-0001``.

    A share ``heldout_fraction`` of each category's topics (seeded pick) is held out; a held-out
    topic whose key phrase still occurs in some training prompt (another category's passage may
    mention it) is moved back to training, until no held-out key occurs in any training prompt.
    Order within each category is kept, so splitting the output again gives the same result.
    """
    if not 0 < heldout_fraction < 1:
        raise ValueError(f"heldout_fraction must be between 0 and 1, got {heldout_fraction}")
    by_cat: dict[str, list[dict]] = {}
    for p in prompts:
        by_cat.setdefault(p["category"], []).append(p)
    held: set[tuple[str, str]] = set()
    for cat, rows in by_cat.items():
        keys = sorted({p["topic"] for p in rows})
        random.Random(f"split:{seed}:{cat}").shuffle(keys)
        held.update((cat, k) for k in keys[: max(1, round(heldout_fraction * len(keys)))])
    # move leaking held-out topics to train until none leak
    while True:
        train_text = "\n".join(p["prompt"] for p in prompts if (p["category"], p["topic"]) not in held)
        lower = train_text.lower()
        leaking = {ck for ck in held if ck[1].lower() in lower and key_pattern(ck[1]).search(train_text)}
        if not leaking:
            break
        held -= leaking
    train, heldout = [], []
    for cat, rows in by_cat.items():
        for split, bucket in (("train", train), ("heldout", heldout)):
            chosen = [p for p in rows if ((cat, p["topic"]) in held) == (split == "heldout")]
            bucket.extend(
                {"id": f"{split}-{cat}-{i:04d}", "category": cat, "topic": p["topic"], "prompt": p["prompt"]}
                for i, p in enumerate(chosen, 1)
            )
    return train, heldout


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Write the training and held-out prompt sets as JSONL.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout-fraction", type=float, default=HELDOUT_FRACTION)
    ap.add_argument("--out-dir", type=Path, default=DATA_DIR)
    args = ap.parse_args(argv)
    try:
        train, heldout = split_prompts(
            compose_prompts(args.seed), heldout_fraction=args.heldout_fraction, seed=args.seed
        )
    except ValueError as e:
        raise SystemExit(str(e)) from None
    write_jsonl(args.out_dir / TRAIN_PATH.name, train)
    write_jsonl(args.out_dir / HELDOUT_PATH.name, heldout)
    tr, he = (Counter(r["category"] for r in rows) for rows in (train, heldout))
    topics_of = lambda rows, c: len({r["topic"] for r in rows if r["category"] == c})  # noqa: E731
    print(f"{'category':<14} {'train':>6} {'heldout':>8}   topics train/heldout")
    for c in tr:
        print(f"{c:<14} {tr[c]:>6} {he.get(c, 0):>8}   {topics_of(train, c)}/{topics_of(heldout, c)}")
    print(f"{'total':<14} {len(train):>6} {len(heldout):>8}")
    print(f"wrote {args.out_dir / TRAIN_PATH.name} and {args.out_dir / HELDOUT_PATH.name}")


if __name__ == "__main__":
    main()
