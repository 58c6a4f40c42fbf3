"""Self-distillation data: the base model's own answers to a prompt set (Medusa paper, Sec. 2.3.2).

Heads learn best from what the model will actually say, so we generate the base model's greedy
answers through its chat template, many prompts at a time (left padding; batching is much faster
than one prompt at a time on CPU, measured). Results are appended to a JSONL file as they come, so an
interrupted run resumes where it stopped.

    python -m medusa_lib.pipeline.distill --prompts assets/data/train_prompts.jsonl --out runs/distill/train.jsonl

Hand-written prompt sets run out of *content* long before they run out of forms: heads trained on
them memorise their topics. ``--self-instruct N`` adds N prompts the model writes itself
(self-instruct): it samples the user's turn of its own chat template, started with the opening
words of a seed prompt (so every category's forms stay represented), then answers it greedily
like any other prompt. Prompts that contain a held-out topic's key phrase verbatim
(``--exclude-topics``; any case, whole words) are dropped. That keeps the held-out topics out of the
prompts, not every paraphrase of them ("the beekeeper" for "a beekeeper" passes), nor out of the answers.

    python -m medusa_lib.pipeline.distill --self-instruct 4000 --out runs/train/self_answers.jsonl \
        --prompts assets/data/train_prompts.jsonl --exclude-topics assets/data/heldout_prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Iterable, Iterator

import torch

from ..core.chat import chat_prompt_ids
from ..core.model import eos_token_ids, input_device
from .cli import add_model_arguments
from .jsonl import load_jsonl
from .prompts import key_pattern


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [len(rows), longest]: each row right-aligned after ``pad`` ids, as generate wants."""
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, width - len(ids) :] = torch.tensor(ids)
        attention[i, width - len(ids) :] = 1
    return input_ids, attention


def batches(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


@torch.inference_mode()
def generate_answers(
    model,
    tokenizer,
    prompts: Iterable[dict],
    *,
    max_new_tokens: int,
    batch_size: int,
    do_sample: bool = False,
    seed: int = 0,
) -> Iterator[dict]:
    """Yield {"id", "category", "prompt_ids", "answer_ids"} for each prompt, generated in batches."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_ids = set(eos_token_ids(model))
    device = input_device(model)
    rows = [(p, chat_prompt_ids(tokenizer, p["prompt"])) for p in prompts]
    # similar lengths together: less padding
    rows.sort(key=lambda r: len(r[1]))
    for group in batches(rows, batch_size):
        input_ids, attention = left_padded([ids for _, ids in group], pad)
        width = input_ids.shape[1]
        if do_sample:
            torch.manual_seed(seed)
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            temperature=0.7 if do_sample else None,
            top_p=0.9 if do_sample else None,
            top_k=None,
            pad_token_id=pad,
        )
        for i, (p, ids) in enumerate(group):
            answer = out[i, width:].tolist()
            for j, t in enumerate(answer):
                if t in eos_ids:
                    answer = answer[: j + 1]
                    break
            yield {"id": p["id"], "category": p.get("category", ""), "prompt_ids": ids, "answer_ids": answer}


# a marker no tokenizer merges with its neighbours
USER_SENTINEL = "\u2063user-turn\u2063"


def user_turn_prefix(tokenizer) -> str:
    """The chat template's text up to where the user's message begins (system prompt included)."""
    if not getattr(tokenizer, "chat_template", None):
        return ""
    text = tokenizer.apply_chat_template([{"role": "user", "content": USER_SENTINEL}], tokenize=False)
    if USER_SENTINEL not in text:
        raise ValueError("the chat template does not show the user's message verbatim; self-instruct needs it")
    return text[: text.index(USER_SENTINEL)]


def openers(prompts: list[dict], words: int = 2) -> list[tuple[str, str]]:
    """(opening words, category) of each seed prompt: the forms self-instruct starts from."""
    return [(" ".join(p["prompt"].split()[:words]), p.get("category", "")) for p in prompts if p["prompt"].split()]


def clean_prompt(text: str, *, min_words: int = 4, max_chars: int = 600) -> str | None:
    """A sampled user turn, or None when it is too short, cut off or not plain text."""
    text = " ".join(text.split())
    if len(text.split()) < min_words or len(text) > max_chars or not text.isprintable():
        return None
    return text


@torch.inference_mode()
def self_instruct(
    model,
    tokenizer,
    seeds: list[tuple[str, str]],
    n: int,
    *,
    batch_size: int = 64,
    max_prompt_tokens: int = 48,
    exclude: list[str] = (),
    seed: int = 0,
    first: int = 1,
    known: Iterable[str] = (),
    stats: dict | None = None,
    temperature: float = 1.0,
    top_p: float = 0.95,
) -> Iterator[dict]:
    """Yield up to n new prompts {"id", "category", "prompt"} sampled from the model's own user turn.

    Each starts with the opening words of a seed (picked uniformly) and goes on as the model
    samples it, up to the end of the user's turn; kept only if complete, new (also against
    ``known`` prompts) and free of the ``exclude`` phrases (whole words, any case). Ids are
    ``self-{seed}-{first}``, ``self-{seed}-{first + 1}``, ...; the sampling depends on (seed, first),
    so a resumed run (first = answers so far + 1) draws new prompts. ``stats`` counts what was
    dropped and why.
    """
    rng = random.Random(f"self-instruct:{seed}:{first}")
    stats = {} if stats is None else stats
    for why in ("kept", "unfinished", "unclean", "duplicate", "excluded"):
        stats.setdefault(why, 0)
    prefix = tokenizer(user_turn_prefix(tokenizer), add_special_tokens=False)["input_ids"]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stop = set(eos_token_ids(model))
    device = input_device(model)
    # the same whole-phrase match the held-out split is made with
    banned = [key_pattern(k) for k in exclude]
    seen = {" ".join(k.split()).lower() for k in known}
    made, rounds = 0, 0
    while made < n:
        rounds += 1
        if rounds > 10 + 4 * n // batch_size:
            # the model keeps writing unusable prompts: stop rather than loop forever
            break
        group = [seeds[rng.randrange(len(seeds))] for _ in range(batch_size)]
        starts = [tokenizer(start, add_special_tokens=False)["input_ids"] for start, _ in group]
        input_ids, attention = left_padded([prefix + ids for ids in starts], pad)
        width = input_ids.shape[1]
        torch.manual_seed(rng.randrange(2**62))
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=max_prompt_tokens,
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=None,
            pad_token_id=pad,
        )
        for (_, category), start, row in zip(group, starts, out[:, width:].tolist()):
            end = next((j for j, t in enumerate(row) if t in stop), None)
            if end is None:
                # ran past max_prompt_tokens: cut off mid-sentence
                stats["unfinished"] += 1
                continue
            text = clean_prompt(tokenizer.decode(start + row[:end], skip_special_tokens=True))
            why = (
                "unclean"
                if text is None
                else "duplicate"
                if text.lower() in seen
                else "excluded"
                if any(b.search(text) for b in banned)
                else "kept"
            )
            stats[why] += 1
            if why != "kept":
                continue
            seen.add(text.lower())
            yield {"id": f"self-{seed}-{first + made:05d}", "category": category, "prompt": text}
            made += 1
            if made == n:
                return


def main(argv: list[str] | None = None) -> None:
    from ..core.model import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="assets/data/train_prompts.jsonl")
    ap.add_argument("--out", default="runs/distill/train.jsonl")
    add_model_arguments(ap)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts (0 = all)")
    ap.add_argument("--sample", action="store_true", help="sample (T=0.7, top-p 0.9) instead of greedy")
    ap.add_argument("--shard", default="0/1", help="i/n: only prompts i, i+n, i+2n, ... (run n processes side by side)")
    ap.add_argument("--skip-done", action="append", default=[], help="also skip prompts answered in this JSONL file")
    ap.add_argument(
        "--self-instruct",
        type=int,
        default=0,
        metavar="N",
        help="answer N prompts the model writes itself, started from the opening words of --prompts (--shard, --limit, "
        "--sample, --skip-done do not apply)",
    )
    ap.add_argument(
        "--exclude-topics",
        default=None,
        help="prompts JSONL whose 'topic' phrases self-instruct prompts must not contain (the held-out set)",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    if args.self_instruct:
        return self_instruct_main(args)
    prompts = load_jsonl(args.prompts)
    if args.limit:
        prompts = prompts[: args.limit]
    i, n = (int(x) for x in args.shard.split("/"))
    prompts = prompts[i::n]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {r["id"] for f in [out, *map(Path, args.skip_done)] if f.exists() for r in load_jsonl(f)}
    todo = [p for p in prompts if p["id"] not in done]
    print(f"{len(done)} answers already in {out}; generating {len(todo)} more", flush=True)
    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype, progress=print)
    t0, n_tok, n = time.perf_counter(), 0, 0
    with open(out, "a", encoding="utf-8") as f:
        for rec in generate_answers(
            model,
            tokenizer,
            todo,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            do_sample=args.sample,
        ):
            f.write(json.dumps(rec) + "\n")
            n += 1
            n_tok += len(rec["answer_ids"])
            if n % args.batch_size == 0 or n == len(todo):
                f.flush()
                dt = time.perf_counter() - t0
                print(f"{len(done) + n}/{len(prompts)} answers, {n_tok} new tokens, {n_tok / dt:.0f} tok/s", flush=True)


def self_instruct_main(args) -> None:
    """--self-instruct N: sample N new prompts batch by batch and answer each batch greedily."""
    from ..core.model import load_model

    seeds = openers(load_jsonl(args.prompts))
    exclude = sorted({p["topic"] for p in load_jsonl(args.exclude_topics)}) if args.exclude_topics else []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = load_jsonl(out) if out.exists() else []
    todo = args.self_instruct - len(done)
    print(f"{len(done)} self-instruct answers already in {out}; generating {max(todo, 0)} more", flush=True)
    if todo <= 0:
        return
    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype, progress=print)
    t0, n_tok, n = time.perf_counter(), 0, 0
    stats: dict = {}
    prompts = self_instruct(
        model,
        tokenizer,
        seeds,
        todo,
        batch_size=args.batch_size,
        exclude=exclude,
        seed=args.seed,
        first=len(done) + 1,
        known=[r["prompt"] for r in done if "prompt" in r],
        stats=stats,
    )
    with open(out, "a", encoding="utf-8") as f:
        while True:
            group = [p for _, p in zip(range(args.batch_size), prompts)]
            if not group:
                break
            text = {p["id"]: p["prompt"] for p in group}
            for rec in generate_answers(
                model, tokenizer, group, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size
            ):
                f.write(json.dumps({**rec, "prompt": text[rec["id"]]}) + "\n")
                n += 1
                n_tok += len(rec["answer_ids"])
            f.flush()
            dt = time.perf_counter() - t0
            print(
                f"{len(done) + n}/{args.self_instruct} self-instruct answers, {n_tok} new tokens, "
                f"{n_tok / dt:.0f} tok/s (prompts included)",
                flush=True,
            )
    print("sampled prompts: " + ", ".join(f"{v} {k}" for k, v in stats.items()), flush=True)
    if n < todo:
        print(
            f"stopped short: the model wrote only {n} usable prompts of {todo} (most of its user turns were unusable; "
            "see the counts above)",
            flush=True,
        )


if __name__ == "__main__":
    main()
