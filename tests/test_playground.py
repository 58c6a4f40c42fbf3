"""medusa_lib.present.playground: the event stream, the greedy badge, summary rows, inspector data, escaping.

Everything runs on a tiny random Llama with a tiny word-level tokenizer built here (no network).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import (
    CUDA_CALIBRATION,
    PROMPT,
    VOCAB,
    cuda_calibrated_playground,
    tiny_playground,
    two_numerics_playground,
)

from medusa_lib.present import (
    GREEDY_VIEWS,
    LABELS,
    SAMPLED_VIEWS,
    SUMMARY_COLUMNS,
    Detokenizer,
    Piece,
    Playground,
    PlaygroundError,
    RunRecord,
    Settings,
    greedy_check,
    load_examples,
    mask_data,
    numerics_label,
    numerics_note,
    path_rows,
    summary_rows,
    threshold_curve,
    tree_layout,
    tree_nodes,
    untrained_heads,
    visible_steps,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pg():
    return tiny_playground()


@pytest.fixture(scope="module")
def events(pg):
    return list(pg.stream(PROMPT, Settings(max_new_tokens=20, tree="topk-3x2x1", temperature=0.7)))


def records_of(events) -> dict[str, RunRecord]:
    return {e.method: e.record for e in events if e.kind == "end"}


def test_event_stream_runs_three_methods_in_order(events):
    kinds = [(e.method, e.kind) for e in events]
    order = [m for m, k in kinds if k == "start"]
    assert order == ["plain", "medusa-greedy", "medusa-typical"]
    for m in order:  # start, steps, end, and nothing of another method in between
        block = [k for mm, k in kinds if mm == m]
        assert block[0] == "start" and block[-1] == "end" and set(block[1:-1]) == {"step"}
        first, last = kinds.index((m, "start")), kinds.index((m, "end"))
        assert all(mm == m for mm, _ in kinds[first : last + 1])
    seen: dict[str, int] = {}
    for e in events:
        views = e.record.views
        assert [v.step.index for v in views] == list(range(len(views)))  # step 0 = prefill
        assert all(a.elapsed <= b.elapsed for a, b in zip(views, views[1:]))  # cumulative time
        assert len(views) == seen.get(e.method, 0) + (e.kind == "step")  # each step event adds exactly its own view
        seen[e.method] = len(views)


def test_three_outputs_and_greedy_equality(events):
    recs = records_of(events)
    assert set(recs) == {"plain", "medusa-greedy", "medusa-typical"}
    for r in recs.values():
        assert r.done and len(r.tokens) == 20 and r.result.finish_reason == "length"
        assert r.text.strip()
    assert recs["medusa-greedy"].tokens == recs["plain"].tokens
    assert recs["medusa-greedy"].text == recs["plain"].text
    assert greedy_check(recs["plain"].tokens, recs["medusa-greedy"].tokens).equal
    # the oracle heads get guesses accepted: fewer steps than tokens
    assert recs["medusa-greedy"].result.tokens_per_step > 1.5
    assert recs["plain"].result.tokens_per_step == 1.0


def test_pieces_mark_head_tokens_and_base_tokens(events):
    recs = records_of(events)
    assert {p.origin for p in recs["plain"].pieces} == {"base"}
    for v in recs["medusa-greedy"].views[1:]:
        origins = [p.origin for p in v.pieces]
        drafted = "lookup" if v.step.lookup_accepted else "draft"
        assert origins == [drafted] * v.step.accept_length + ["base"] * (len(v.step.tokens) - v.step.accept_length)
        assert all(p.step == v.step.index for p in v.pieces)
    assert any(p.origin == "draft" for p in recs["medusa-greedy"].pieces)


def test_detokenizer_pieces_join_to_the_full_text(pg, events):
    for r in records_of(events).values():
        assert "".join(p.text for p in r.pieces) == pg.tokenizer.decode(r.tokens, skip_special_tokens=True)
    d = Detokenizer(pg.tokenizer)
    assert [d.push(i) for i in pg.tokenizer.convert_tokens_to_ids(["<script>", "a&b", "</s>"])] == [
        "<script>",
        " a&b",
        "",
    ]


@pytest.mark.parametrize(
    "plain, medusa, equal, first",
    [
        ([1, 2, 3], [1, 2, 3], True, None),
        ([1, 2, 3], [1, 5, 3], False, 1),
        ([7, 2], [1, 2], False, 0),
        ([1, 2, 3], [1, 2], False, 2),
        ([1, 2], [1, 2, 3, 4], False, 2),
        ([], [], True, None),
    ],
)
def test_greedy_check(plain, medusa, equal, first):
    c = greedy_check(plain, medusa)
    assert (c.equal, c.first_diff) == (equal, first)
    assert ("identical" in c.message) == equal
    if not equal:
        assert f"token {first}" in c.message


def test_greedy_check_explains_a_difference_with_the_logit_gap(pg, events):
    plain = records_of(events)["plain"]
    assert pg.greedy_check(plain, records_of(events)["medusa-greedy"]).equal
    v = plain.views[5]  # a medusa record whose 6th token differs (token ids are what the check compares)
    fake = replace(
        plain,
        views=plain.views[:5]
        + (replace(v, pieces=(replace(v.pieces[0], token_id=v.pieces[0].token_id + 1),)),)
        + plain.views[6:],
    )
    check = pg.greedy_check(plain, fake)
    with torch.inference_mode():
        top = pg.model(torch.tensor([list(plain.prompt_ids) + plain.tokens[:5]])).logits[0, -1].topk(2).values
    assert check.first_diff == 5 and check.logit_gap == pytest.approx(float(top[0] - top[1]), abs=1e-4)
    assert check.tie == (check.logit_gap <= 1e-3) and "two best logits differ by" in check.message
    tie = replace(check, logit_gap=0.0, tie=True)
    assert tie.message.endswith("a floating-point tie, not a bug.")
    from ui.render import badge_html

    assert (
        'data-tie="true"' in badge_html(tie)
        and "badge-tie" in badge_html(tie)
        and 'data-tie="false"' in badge_html(replace(tie, tie=False))
    )


def test_summary_rows(events):
    recs = records_of(events)
    rows = summary_rows(recs)
    assert [r["method"] for r in rows] == [LABELS[m] for m in ("plain", "medusa-greedy", "medusa-typical")]
    assert all(list(r) == SUMMARY_COLUMNS for r in rows)
    assert rows[0]["speedup"] == 1.0 and rows[0]["tokens/step"] == 1.0
    assert rows[1]["steps"] == recs["medusa-greedy"].result.decode_steps
    assert all(r["wall (s)"] >= r["prefill (s)"] > 0 for r in rows)
    assert summary_rows({"medusa-greedy": recs["medusa-greedy"]})[0]["speedup"] is None  # no plain run to compare with


def test_inspector_data(pg, events):
    rec = records_of(events)["medusa-greedy"]
    v = max(rec.views[1:], key=lambda v: v.step.accept_length)
    tree = v.step.tree
    nodes = tree_nodes(v, pg.tokenizer)
    assert len(nodes) == tree.num_nodes + 1 and nodes[-1]["kind"] == "bonus"  # + the bonus token
    assert [n["node"] for n in nodes if n["accepted"] and n["kind"] != "bonus"] == list(v.step.accepted_nodes)
    assert nodes[-1]["token_id"] == v.step.tokens[v.step.accept_length]
    z, cols, rows = mask_data(v, pg.tokenizer)
    assert len(z) == len(rows) == tree.num_nodes and len(cols) == tree.num_nodes + 1
    assert cols[0].startswith(f"prefix ({v.prefix_len} ") and all(row[0] == 1 for row in z)
    assert len(set(rows)) == len(rows)  # unique labels (plotly merges equal category names)
    assert [[int(x > 0) for x in row[1:]] for row in z] == tree.attn_mask.tolist()
    acc = v.step.accepted_nodes
    assert all(z[i][j + 1] == 2 for i in acc for j in acc if j <= i)
    table = path_rows(rec, pg.tokenizer)
    assert len(table) == len(rec.views) - 1 and table[0]["step"] == 1
    assert max(r["accept length"] for r in table) == v.step.accept_length
    # every step's own time, on either engine (the static one has no verify phase to show)
    assert [r["step (ms)"] for r in table] == [round(1000 * w.step.seconds, 1) for w in rec.views[1:]]
    assert all(r["step (ms)"] > 0 for r in table)
    # prefix = prompt + tokens committed before the step - the root (which is not in the cache yet)
    assert v.prefix_len == rec.prompt_len + sum(len(w.step.tokens) for w in rec.views[: v.step.index]) - 1


def test_tree_layout_centres_parents():
    y = tree_layout([-1, 0, 0, 1, 1, 2])  # root -> (1 -> 3, 4), (2 -> 5)
    assert y[3:] == [0.0, 1.0, 2.0] and y[1] == 0.5 and y[2] == 2.0 and y[0] == 1.25


def test_visible_steps_and_threshold_curve(events):
    rec = records_of(events)["plain"]
    assert visible_steps(rec, -1.0) == 0 and visible_steps(rec, rec.elapsed) == len(rec.views)
    assert visible_steps(rec, rec.views[2].elapsed) == 3
    h, thr = threshold_curve(epsilon=0.09, delta=0.3, vocab_size=VOCAB)
    assert h[0] == 0 and math.isclose(h[-1], math.log(VOCAB)) and thr[0] == pytest.approx(0.09)
    assert all(a >= b for a, b in zip(thr, thr[1:])) and thr[-1] == pytest.approx(0.3 / VOCAB)


@pytest.mark.parametrize(
    "prompt, settings, words",
    [
        ("", Settings(), "prompt is empty"),
        ("   ", Settings(), "prompt is empty"),
        (PROMPT, Settings(custom_tree="[[0], [0, 0"), "not valid JSON"),
        (PROMPT, Settings(custom_tree="[[0], [0, 0, 0, 0, 0]]"), "no parent"),
        (PROMPT, Settings(custom_tree="[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]"), "5 levels deep"),
        (PROMPT, Settings(tree="no-such-tree"), "Unknown tree preset"),
        (PROMPT, Settings(max_new_tokens=0), "Max new tokens"),
        (PROMPT, Settings(max_new_tokens=10**6), "Max new tokens"),
        (PROMPT, Settings(temperature=-1), "Temperature"),
        (PROMPT, Settings(epsilon=1.5), "Epsilon"),
        (PROMPT, Settings(delta=float("nan")), "Delta"),
        (PROMPT, Settings(max_new_tokens=2.5), "whole number"),
        (PROMPT, Settings(lookup=9), "lookup branch's length"),
        (PROMPT, Settings(lookup=True), "lookup branch's length"),
        (" ".join(["w9"] * 600), Settings(), "shorten the prompt"),
    ],
)
def test_bad_input_gets_one_clear_sentence_before_anything_runs(pg, prompt, settings, words):
    with pytest.raises(ValueError) as err:
        next(pg.stream(prompt, settings))
    msg = str(err.value)
    assert words in msg and msg.count(". ") == 0 and msg.endswith(".")


def test_custom_tree_and_compare_dict(pg):
    out = pg.compare(PROMPT, Settings(max_new_tokens=8, custom_tree="[[0], [0, 0], [1]]"))
    json.dumps(out)  # JSON-able
    assert out["tree"] == "custom" and set(out["methods"]) == {"plain", "medusa-greedy", "medusa-typical"}
    assert out["greedy_match"]["equal"] is True and [r["method"] for r in out["summary"]] == [
        LABELS[v] for v in GREEDY_VIEWS
    ]
    assert all(m["tokens"] == 8 and m["text"] for m in out["methods"].values())


# ------------------------------------------------------------------ the sampled comparison
def test_compare_without_sample_is_todays_greedy_comparison(pg):
    out = pg.compare(PROMPT, Settings(max_new_tokens=6))
    assert (
        list(out["methods"]) == list(GREEDY_VIEWS)
        and "greedy_match" in out
        and "sampling" not in out
        and "sampling_match" not in out
    )


def test_the_sampled_comparison_is_fair_and_exact_sampling_equals_plain_sampling(pg):
    settings = Settings(max_new_tokens=24, temperature=0.8, seed=11, sample=True, tree="topk-3x2x1")
    out = pg.compare(PROMPT, settings)
    json.dumps(out)
    methods = out["methods"]
    assert list(methods) == list(SAMPLED_VIEWS)
    assert (
        methods["medusa-sample"]["token_ids"] == methods["plain-sample"]["token_ids"]
    )  # lossless: the same seed, the same tokens
    assert out["sampling_match"] == {
        "equal": True,
        "first_diff": None,
        "logit_gap": None,
        "tie": False,
        "message": "Medusa exact sampling = plain sampling, same seed (float32): all 24 tokens identical.",
    }
    greedy = pg.compare(PROMPT, Settings(max_new_tokens=24, tree="topk-3x2x1"))["methods"]["plain"]["token_ids"]
    assert methods["plain-sample"]["token_ids"] != greedy  # it did sample
    other = pg.compare(PROMPT, replace(settings, seed=12))["methods"]
    assert (
        other["plain-sample"]["token_ids"] != methods["plain-sample"]["token_ids"]
        and other["medusa-sample"]["token_ids"] == other["plain-sample"]["token_ids"]
    )
    rows = {r["method"]: r for r in out["summary"]}
    plain = methods["plain-sample"]["tokens_per_second"]
    assert rows["Plain (sampling)"]["speedup"] == 1.0  # the speed-ups are against plain sampling
    # the row rounds the quotient of the unrounded rates (the JSON holds them to 0.01 tok/s): so it is within 0.005
    # of this quotient
    assert rows["Medusa exact sampling"]["speedup"] == pytest.approx(
        methods["medusa-sample"]["tokens_per_second"] / plain, abs=0.006
    )
    assert out["sampling"]["temperature"] == 0.8 and out["sampling"]["seed"] == 11
    panel = {r["method"]: r for r in out["sampling"]["rows"]}
    assert list(panel) == [LABELS[v] for v in SAMPLED_VIEWS]
    same = ("mean log p", "mean entropy", "log p + entropy")
    assert [panel["Plain (sampling)"][k] for k in same] == [
        panel["Medusa exact sampling"][k] for k in same
    ]  # the same tokens score the same


def test_sample_scores_are_the_models_log_probabilities_at_t(pg):
    settings = Settings(max_new_tokens=12, temperature=0.6, seed=2, sample=True, tree="topk-3x2x1")
    rec = {e.method: e.record for e in pg.stream(PROMPT, settings) if e.kind == "end"}["plain-sample"]
    logp, entropy = pg.sample_scores(rec, temperature=0.6)
    ids = list(rec.prompt_ids) + list(rec.tokens)
    want_logp, want_h = [], []
    with torch.no_grad():
        for i, t in enumerate(rec.tokens):  # one forward per token, the way the run saw them
            z = pg.model(input_ids=torch.tensor([ids[: len(rec.prompt_ids) + i]])).logits[0, -1].float() / 0.6
            lp = torch.log_softmax(z, -1)
            want_logp.append(float(lp[t]))
            want_h.append(float(-(lp.exp() * lp).sum()))
    assert logp == pytest.approx(sum(want_logp) / len(want_logp), abs=1e-4) and entropy == pytest.approx(
        sum(want_h) / len(want_h), abs=1e-4
    )


def test_draw_gap_replays_the_seeded_draw_that_chose_each_token(pg):
    """Where exact sampling and plain sampling differ, the badge says how close the draw was: the
    replayed draw must rank plain's own token first at every position (else the replay is off)."""
    settings = Settings(max_new_tokens=10, temperature=0.9, seed=4, sample=True, tree="topk-3x2x1")
    rec = {e.method: e.record for e in pg.stream(PROMPT, settings) if e.kind == "end"}["plain-sample"]
    cfg = settings.config("medusa-sample")
    for k in (0, 3, 9):
        a = rec.tokens[k]
        others = [b for b in (5, 77, 150, 300) if b != a]
        gaps = [pg.draw_gap(rec.prompt_ids, rec.tokens[:k], a, b, cfg, draw=k, signed=True) for b in others]
        assert all(g > 0 for g in gaps), (k, gaps)
    fake = replace(
        rec,
        views=rec.views[:-1]
        + (replace(rec.views[-1], pieces=(replace(rec.views[-1].pieces[0], token_id=(rec.tokens[-1] + 1) % VOCAB),)),),
    )
    check = pg.greedy_check(rec, fake, settings)
    assert check.sampled and check.first_diff == 9 and check.logit_gap > 0
    assert (
        check.headline == "Medusa exact sampling differs from plain sampling, same seed (float32) from token 9 on "
        "(0-based; 10 vs 10 tokens)."
    )
    assert "log p - log E" in check.reason


def test_untrained_heads_and_calibrated_tree_presets():
    pg = tiny_playground(oracle=False)
    out = pg.compare(PROMPT, Settings(max_new_tokens=6, chat_template=False))
    assert out["greedy_match"]["equal"]
    assert pg.heads.num_heads == 4 and pg.defaults.tree == "topk-4x3x2-16"
    heads = untrained_heads(pg.model, num_heads=2)  # too shallow for the 3-level default: a chain as deep as the heads
    assert Playground(pg.model, pg.tokenizer, heads).defaults.tree == "chain-2"
    heads.tree_presets, heads.default_tree = (
        {"calibrated-3": [[0], [0, 0], [1]]},
        "calibrated-3",
    )  # what load_heads sets from trees.json
    pg2 = Playground(pg.model, pg.tokenizer, heads)
    assert pg2.defaults.tree == "calibrated-3" == pg2.tree_names()[0]
    assert pg2.resolve_tree(Settings(tree="calibrated-3")).num_nodes == 4
    with pytest.raises(ValueError, match="3 levels deep but the heads only predict 2"):
        pg2.resolve_tree(Settings(tree="chain-3"))


def test_heads_calibrated_on_another_device_kind_run_that_tree_and_say_so():
    pg2 = cuda_calibrated_playground()
    d = pg2.defaults
    assert (d.tree, d.lookup_length, d.calibration) == ("calibrated-3", 0, CUDA_CALIBRATION)
    assert d.note == (
        "These heads have no tree calibrated on CPU; using the tree calibrated on NVIDIA H100 80GB HBM3 "
        "(run python -m medusa_lib.pipeline.calibrate --write on this device for one)."
    )
    # tree and lookup switch left out: the heads' defaults, calibrated without the branch
    settings = pg2.settings_of({"max_new_tokens": 4, "temperature": 0.0, "chat_template": False})
    assert (settings.tree, settings.lookup) == ("calibrated-3", 0)
    assert pg2.compare(PROMPT, settings)["tree"] == "calibrated-3"
    assert tiny_playground(oracle=False).defaults.note is None  # never calibrated: no note


def test_html_rendering_escapes_generated_text():
    from ui.render import badge_html, column_html, tokens_html

    pieces = [
        Piece(4, "<script>alert(1)</script>", "base", 0),
        Piece(6, " a&b", "draft", 1),
        Piece(7, '"x"', "base", 1),
    ]
    out = tokens_html(pieces)
    assert "<script>" not in out and "&lt;script&gt;alert(1)&lt;/script&gt;" in out and "a&amp;b" in out
    assert out.count('class="tok head h1"') == 1 and out.count('class="tok base"') == 2
    rec = RunRecord("plain", (1, 2, 3))
    assert "<script>" not in column_html("plain", rec, pieces=pieces)
    assert 'data-equal="true"' in badge_html(greedy_check([1], [1])) and 'data-first-diff="0"' in badge_html(
        greedy_check([1], [2])
    )


def test_example_prompts_file():
    examples = load_examples(ROOT / "assets" / "examples.json")
    assert len(examples) >= 6 and all(e["prompt"].strip() and e.get("label") for e in examples)
    assert load_examples(ROOT / "no-such-file.json") == []


def test_each_run_uses_the_model_of_its_numerics_and_the_default_is_the_loaded_dtype():
    pg2 = two_numerics_playground()
    assert list(pg2.variants) == ["float32", "bfloat16"] and pg2.dtype == "float32"
    for numerics, dtype in ((None, torch.float32), ("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        _, decoders = pg2.prepare(PROMPT, Settings(max_new_tokens=4, numerics=numerics))
        assert {d.dtype for d in decoders.values()} == {dtype} and {
            # the heads its drafter drafts with (beside a lookup chain: the drafter inside it)
            next(getattr(d.drafter, "inner", d.drafter).heads.parameters()).dtype
            for d in decoders.values()
            if d.drafter is not None
        } == {dtype}
    out = pg2.compare(PROMPT, Settings(max_new_tokens=6, tree="chain-2", numerics="bfloat16"))
    assert out["numerics"] == "bfloat16" and "(bfloat16)" in out["greedy_match"]["message"]
    assert pg2.compare(PROMPT, Settings(max_new_tokens=6, tree="chain-2"))["numerics"] == "float32"
    assert pg2._warm == {("float32", "medusa"), ("bfloat16", "medusa")}  # each copy warmed up once per drafter


def test_a_numerics_value_not_loaded_gets_one_sentence():
    pg2 = two_numerics_playground()
    with pytest.raises(PlaygroundError, match=r"^Numerics must be one of: float32, bfloat16 \(got 'float16'\)\.$"):
        pg2.prepare(PROMPT, Settings(max_new_tokens=4, numerics="float16"))
    with pytest.raises(
        PlaygroundError, match=r"^Numerics must be the name of one of: float32, bfloat16, not a number \(got 32\)\.$"
    ):
        pg2.prepare(PROMPT, Settings(max_new_tokens=4, numerics=32))


def test_the_badge_names_the_numerics_and_a_16_bit_tie_points_to_float32_only_when_loaded():
    from medusa_lib.present.page import GreedyCheck

    same = GreedyCheck(True, None, 40, 40, numerics="float32")
    assert same.message == "Medusa greedy = plain greedy (float32): all 40 tokens identical."
    tie = GreedyCheck(False, 7, 40, 40, logit_gap=0.25, tie=True, numerics="bfloat16", exact_available=True)
    assert tie.headline.startswith("Medusa greedy differs from plain greedy (bfloat16) from token 7 on")
    assert tie.reason.endswith(
        "a floating-point tie, not a bug: bfloat16 rounding. Switch Numerics to float32 for the exact result."
    )
    assert replace(tie, exact_available=False).reason.endswith("a floating-point tie, not a bug: bfloat16 rounding.")
    assert "Switch" not in replace(tie, tie=False).reason and "Switch" not in replace(tie, numerics="float32").reason


def test_load_adds_a_float32_copy_of_a_bfloat16_model(tmp_path):
    from conftest import make_model, tiny_tokenizer

    make_model("llama").save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    said: list[str] = []
    pg2 = Playground.load(
        model=str(tmp_path), device="cpu", dtype="bfloat16", max_prompt_tokens=None, progress=said.append
    )
    assert list(pg2.variants) == ["bfloat16", "float32"] and pg2.dtype == "bfloat16"
    m32, h32 = pg2.variants["float32"]
    assert next(m32.parameters()).dtype == torch.float32 and next(h32.parameters()).dtype == torch.float32
    assert any(
        re.fullmatch(
            r"Numerics: float32 \(exact, the comparison's default\) and bfloat16 "
            r"\(\d+\.\dx float32's plain decoding speed here\)",
            s,
        )
        for s in said
    ), said
    assert (
        pg2.default_numerics == "float32"
        and pg2.compare(PROMPT, Settings(max_new_tokens=4, tree="chain-2"))["numerics"] == "float32"
    )  # exact by default
    assert (
        pg2.compare(PROMPT, Settings(max_new_tokens=4, tree="chain-2", numerics="bfloat16"))["numerics"] == "bfloat16"
    )
    assert (
        pg2.numerics_note.startswith("float32 is exact: Medusa greedy writes plain greedy's tokens")
        and "bfloat16 decodes" in pg2.numerics_note
    )
    slow, fast = (
        numerics_note({"float32": 30.0, "bfloat16": 15.0}, device="CPU"),
        numerics_note({"float32": 30.0, "bfloat16": 60.0}, device="CPU"),
    )
    assert (
        "bfloat16 decodes 2.0x as fast as float32 on this CPU" in fast
        and "bfloat16 decodes at 0.5x float32's speed on this CPU (no native bfloat16 here" in slow
    )
    assert (
        numerics_label("bfloat16", {"float32": 30.0, "bfloat16": 60.0}) == "bfloat16 (fast)"
        and numerics_label("bfloat16", {"float32": 30.0, "bfloat16": 15.0}) == "bfloat16 (16-bit)"
    )
    assert numerics_label("float32", {}) == "float32 (exact)"
    one = Playground.load(
        model=str(tmp_path), device="cpu", dtype="bfloat16", max_prompt_tokens=None, numerics_copy=False
    )
    assert list(one.variants) == ["bfloat16"] and one.default_numerics == "bfloat16" and one.numerics_note == ""
