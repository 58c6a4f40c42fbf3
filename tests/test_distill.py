"""Self-distillation data: the chat template's user turn, and self-instruct prompts on a tiny model."""

import json

import pytest
from conftest import make_model, tiny_tokenizer

from medusa_lib.pipeline.distill import clean_prompt, openers, self_instruct, user_turn_prefix
from medusa_lib.pipeline.distill import main as distill_main


def test_user_turn_prefix_is_the_template_text_before_the_message():
    tok = tiny_tokenizer()
    assert user_turn_prefix(tok) == "<s> "
    full = tok.apply_chat_template([{"role": "user", "content": "w5 w6"}], tokenize=False)
    assert full.startswith(user_turn_prefix(tok) + "w5 w6")


def test_user_turn_prefix_refuses_a_template_that_hides_the_message():
    tok = tiny_tokenizer()
    tok.chat_template = "{% for m in messages %}<s> {{ m['content'] | upper }} {% endfor %}"
    with pytest.raises(ValueError, match="verbatim"):
        user_turn_prefix(tok)


def test_openers_and_clean_prompt():
    seeds = openers(
        [
            {"prompt": "Write a poem about rain.", "category": "writing"},
            {"prompt": "  ", "category": "x"},
            {"prompt": "Why?", "category": "qa"},
        ]
    )
    assert seeds == [("Write a", "writing"), ("Why?", "qa")]
    assert clean_prompt("  Write   a poem\nabout rain. ") == "Write a poem about rain."
    assert clean_prompt("Too short") is None
    assert clean_prompt("x " * 400) is None
    assert clean_prompt("Write a \x00 poem about rain") is None


def test_self_instruct_prompts_start_from_a_seed_and_avoid_excluded_topics():
    model, tok = make_model("llama"), tiny_tokenizer()
    model.generation_config.eos_token_id = 2
    seeds = [("w10 w11", "writing"), ("w20", "math")]
    stats = {}
    got = list(
        self_instruct(model, tok, seeds, 4, batch_size=16, max_prompt_tokens=200, exclude=["w5"], seed=3, stats=stats)
    )
    assert len(got) == 4 and stats["kept"] == 4
    assert stats["excluded"] > 0  # the filter did reject prompts (w5 is one word of 320 in ~100-token samples)
    assert [g["id"] for g in got] == [f"self-3-{i:05d}" for i in range(1, 5)]
    assert len({g["id"] for g in got}) == 4 and len({g["prompt"] for g in got}) == 4
    for g in got:
        words = g["prompt"].split()
        assert (
            g["prompt"].startswith("w10 w11 ")
            and g["category"] == "writing"
            or g["prompt"].startswith("w20 ")
            and g["category"] == "math"
        )
        assert "w5" not in words and "</s>" not in words and len(words) >= 4
    again = list(self_instruct(model, tok, seeds, 4, batch_size=16, max_prompt_tokens=200, exclude=["w5"], seed=3))
    assert again == got  # seeded: the same data on a rerun
    later = list(
        self_instruct(
            model,
            tok,
            seeds,
            2,
            batch_size=16,
            max_prompt_tokens=200,
            seed=3,
            first=5,
            known=[g["prompt"] for g in got],
        )
    )
    assert [g["id"] for g in later] == ["self-3-00005", "self-3-00006"]  # a resumed run goes on numbering
    assert not {g["prompt"] for g in later} & {g["prompt"] for g in got}


def test_self_instruct_cli_answers_and_resumes(tmp_path, monkeypatch):
    model, tok = make_model("llama"), tiny_tokenizer()
    model.generation_config.eos_token_id = 2
    monkeypatch.setattr("medusa_lib.core.model.load_model", lambda *a, **k: (model, tok))
    prompts, held = tmp_path / "p.jsonl", tmp_path / "h.jsonl"
    prompts.write_text(json.dumps({"prompt": "w10 w11 w12", "category": "writing"}) + "\n")
    held.write_text(json.dumps({"prompt": "w7 w8", "topic": "w7"}) + "\n")
    out = tmp_path / "self.jsonl"
    args = [
        "--self-instruct",
        "3",
        "--prompts",
        str(prompts),
        "--exclude-topics",
        str(held),
        "--out",
        str(out),
        "--batch-size",
        "16",
        "--max-new-tokens",
        "5",
    ]
    distill_main(args)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3
    for r in rows:
        assert r["prompt"].startswith("w10 w11") and "w7" not in r["prompt"].split()
        assert (
            r["prompt_ids"]
            == tok.apply_chat_template(
                [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=True
            )["input_ids"]
        )
        assert 1 <= len(r["answer_ids"]) <= 5
    distill_main(args[:1] + ["5"] + args[2:])  # resume: two more, new ones
    rows2 = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows2[:3] == rows and len(rows2) == 5 and len({r["prompt"] for r in rows2}) == 5
    assert sorted(r["id"] for r in rows2) == [
        f"self-0-{i:05d}" for i in range(1, 6)
    ]  # written shortest prompt first within a batch
