"""Self-distillation data: the base model's own answers to a prompt set (Medusa paper, Sec. 2.3.2).

Heads learn best from what the model will actually say, so we generate the base model's greedy
answers through its chat template, many prompts at a time (left padding; batching is ~5x faster
than one prompt at a time on CPU). Results are appended to a JSONL file as they come, so an
interrupted run resumes where it stopped.

    python -m medusa_lib.distill --prompts assets/data/train_prompts.jsonl --out runs/distill/train.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path
from typing import Iterable, Iterator

import torch


def load_jsonl(path: str | Path) -> list[dict]:
    """Read a .jsonl or .jsonl.gz file."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def chat_prompt_ids(tokenizer, prompt: str, *, chat_template: bool = True) -> list[int]:
    """Token ids of a user prompt, through the model's chat template when it has one."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


def batches(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


@torch.inference_mode()
def generate_answers(model, tokenizer, prompts: Iterable[dict], *, max_new_tokens: int, batch_size: int, do_sample: bool = False, seed: int = 0) -> Iterator[dict]:
    """Yield {"id", "category", "prompt_ids", "answer_ids"} for each prompt, generated in batches."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    device = model.get_input_embeddings().weight.device
    rows = [(p, chat_prompt_ids(tokenizer, p["prompt"])) for p in prompts]
    rows.sort(key=lambda r: len(r[1]))  # similar lengths together: less padding
    for group in batches(rows, batch_size):
        width = max(len(ids) for _, ids in group)
        input_ids = torch.full((len(group), width), pad, dtype=torch.long)
        attention = torch.zeros((len(group), width), dtype=torch.long)
        for i, (_, ids) in enumerate(group):
            input_ids[i, width - len(ids) :] = torch.tensor(ids)
            attention[i, width - len(ids) :] = 1
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


def main(argv: list[str] | None = None) -> None:
    from .model import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="assets/data/train_prompts.jsonl")
    ap.add_argument("--out", default="runs/distill/train.jsonl")
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts (0 = all)")
    ap.add_argument("--sample", action="store_true", help="sample (T=0.7, top-p 0.9) instead of greedy")
    ap.add_argument("--shard", default="0/1", help="i/n: only prompts i, i+n, i+2n, ... (run n processes side by side)")
    ap.add_argument("--skip-done", action="append", default=[], help="also skip prompts answered in this JSONL file")
    args = ap.parse_args(argv)

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
        for rec in generate_answers(model, tokenizer, todo, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, do_sample=args.sample):
            f.write(json.dumps(rec) + "\n")
            n += 1
            n_tok += len(rec["answer_ids"])
            if n % args.batch_size == 0 or n == len(todo):
                f.flush()
                dt = time.perf_counter() - t0
                print(f"{len(done) + n}/{len(prompts)} answers, {n_tok} new tokens, {n_tok / dt:.0f} tok/s", flush=True)


if __name__ == "__main__":
    main()
