"""The app end to end through gradio_client: the app launched in-process around a tiny random model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROMPT, free_port, page_values, tiny_playground, two_numerics_playground

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server():
    from gradio_client import Client

    from medusa_lib.present import load_examples
    from ui import build_demo, serve

    demo = build_demo(tiny_playground(), examples=load_examples(ROOT / "assets" / "examples.json"), max_new_tokens=16)
    port = free_port()
    serve(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield Client(f"http://127.0.0.1:{port}/", verbose=False)
    finally:
        demo.close()


def test_compare_returns_three_texts_and_statistics(server):
    out = server.predict(
        PROMPT, api_name="/compare"
    )  # prompt only: every other parameter has a default (max new tokens: the slider's start, 16 here)
    methods = out["methods"]
    assert list(methods) == ["plain", "medusa-greedy", "medusa-typical"]
    for m in methods.values():
        assert m["text"].strip() and m["tokens"] == 16 and m["steps"] >= 1
        assert m["tokens_per_second"] > 0 and m["wall_seconds"] >= m["prefill_seconds"] > 0
    assert methods["medusa-greedy"]["text"] == methods["plain"]["text"]
    assert out["greedy_match"] == {
        "equal": True,
        "first_diff": None,
        "logit_gap": None,
        "tie": False,
        "message": "Medusa greedy = plain greedy (float32): all 16 tokens identical.",
    }
    assert [r["speedup"] for r in out["summary"]][0] == 1.0
    assert out["numerics"] == "float32"  # the loaded dtype: /compare's default
    assert methods["medusa-greedy"]["tokens_per_step"] > 1.5  # the rigged heads get guesses accepted


def test_compare_with_settings(server):
    out = server.predict(PROMPT, 8, 0.0, 0.2, 0.5, "chain-2", "", False, api_name="/compare")
    assert out["tree"] == "chain-2" and all(m["tokens"] == 8 for m in out["methods"].values())
    # T = 0: typical acceptance degenerates to greedy matching
    assert out["methods"]["medusa-typical"]["token_ids"] == out["methods"]["plain"]["token_ids"]


@pytest.mark.parametrize(
    "args, words",
    [
        (("",), "The prompt is empty"),
        ((PROMPT, 8, 0.7, 0.09, 0.3, "chain-2", "[[0], [0, 1"), "not valid JSON"),
        (
            (PROMPT, 8, 0.7, 0.09, 0.3, "chain-2", "[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]"),
            "5 levels deep",
        ),
        ((PROMPT, 5000), "Max new tokens must be"),
        ((PROMPT, 8, 0.7, 2.0), "Epsilon must be between 0 and 1"),
    ],
)
def test_bad_input_gets_a_clear_message_and_the_server_keeps_serving(server, args, words):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as err:
        server.predict(*args, api_name="/compare")
    assert words in str(err.value)
    assert server.predict(PROMPT, 4, api_name="/compare")["methods"]["plain"]["tokens"] == 4


def test_ui_run_streams_into_the_three_columns(server):
    """The page's own Run handler (undocumented endpoint): final update has the badge, summary and inspector."""
    job = server.submit(*page_values(tree="topk-3x2x1"), api_name="/run")
    updates = list(job)
    final = job.result()
    assert len(updates) >= 3
    status, *_ = final
    assert status.startswith("Done")
    badge = final[5]
    assert 'data-equal="true"' in badge
    summary = final[6]
    assert [row[0] for row in summary["data"]] == [
        "Plain (greedy)",
        "Medusa greedy",
        "Medusa typical",
    ]  # the greedy mode, typical at T = 0.7
    assert (
        'data-sampled="false"' in badge and "Medusa greedy = plain greedy (float32): all 12 tokens identical." in badge
    )
    streamed = " ".join(str(u) for u in updates)
    for name in ("Plain (greedy)", "Medusa greedy", "Medusa typical"):
        assert name in streamed


def test_handlers_bad_tree_shows_one_sentence_in_status():
    from ui.handlers import RUN_OUTPUTS, Handlers

    h = Handlers(tiny_playground(oracle=False))
    with pytest.warns(UserWarning, match="has no parent"):  # gr.Warning outside a request: a Python warning
        outs = list(
            h.run(
                PROMPT,
                8,
                0.7,
                0.09,
                0.3,
                "chain-2",
                "[[1], [0, 0]]",
                True,
                True,
                0,
                None,
                "Medusa greedy / exact sampling",
            )
        )
    status = outs[-1][RUN_OUTPUTS.index("status")]
    assert status == r"**Cannot run:** Tree node \[0, 0\] has no parent: add \[0\] to the tree."  # Markdown: as typed
    with pytest.warns(UserWarning, match="Run the three methods first"):
        replay = list(h.replay(None, "1x"))
    assert "press Run first" in replay[-1][0]


def test_cli_help_lists_the_flags_and_defaults():
    out = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    for flag in ("--host", "--port", "--model", "--heads", "--device", "--dtype", "--no-float32-copy", "--share"):
        assert flag in out.stdout
    assert "127.0.0.1" in out.stdout and "7860" in out.stdout


def test_the_numerics_choice_is_on_the_page_when_two_copies_are_loaded():
    from medusa_lib.present import load_examples
    from ui import build_demo
    from ui.handlers import RUN_OUTPUTS, Handlers

    def radio(pg):
        demo = build_demo(pg, examples=load_examples(ROOT / "assets" / "examples.json"), max_new_tokens=16)
        return next(c["props"] for c in demo.config["components"] if c.get("props", {}).get("elem_id") == "numerics")

    pg2 = two_numerics_playground()
    props = radio(pg2)
    assert props["visible"] is True and props["value"] == "float32" and props["label"] == "Numerics"
    assert [list(c) for c in props["choices"]] == [["float32 (exact)", "float32"], ["bfloat16 (fast)", "bfloat16"]]
    assert radio(tiny_playground(oracle=False))["visible"] is False  # one copy: nothing to choose
    from ui.render import info_html

    assert "(float32, and a bfloat16 copy (the Numerics choice))" in info_html(
        model="m", device="cpu", dtype="float32", heads=4, heads_note="", numerics=list(pg2.variants)
    )
    assert "(float32)" in info_html(
        model="m", device="cpu", dtype="float32", heads=4, heads_note="", numerics=["float32"]
    )
    outs = list(
        Handlers(pg2).run(
            PROMPT, 6, 0.0, 0.09, 0.3, "chain-2", "", True, True, 0, "bfloat16", "Medusa greedy / exact sampling"
        )
    )
    assert "(bfloat16)" in outs[-1][RUN_OUTPUTS.index("badge")]


def test_heads_calibrated_on_another_device_kind_say_so_beside_the_tree_and_the_page_quotes_that_calibration():
    import html

    from conftest import CUDA_CALIBRATION, cuda_calibrated_playground

    from ui import build_demo

    def props(pg) -> dict:
        demo = build_demo(pg, max_new_tokens=16)
        return {
            c["props"]["elem_id"]: c["props"] for c in demo.config["components"] if c.get("props", {}).get("elem_id")
        }

    pg = cuda_calibrated_playground()
    page = props(pg)
    assert html.unescape(page["calibration-note"]["value"]) == f'<div class="calibration-note">{pg.defaults.note}</div>'
    assert page["tree-preset"]["value"] == "calibrated-3" and page["lookup-branch"]["value"] is False
    tree = CUDA_CALIBRATION["trees"]["calibrated-3"]
    explain = page["explain"][
        "value"
    ]  # the figures of the calibration the tree came from, the device it was made on named
    assert (
        f"calibrated (bfloat16, on {CUDA_CALIBRATION['device']})" in explain
        and f"({tree['nodes']} nodes" not in explain
    )
    assert (
        f"(calibrated-3, {tree['nodes']} nodes)" in explain
        and f"{tree['speedup']:.2f}x plain decoding's speed" in explain
    )
    assert "calibration-note" not in props(tiny_playground(oracle=False))  # never calibrated: no note


def test_the_page_starts_on_the_tree_calibrated_in_its_default_numerics():
    """Heads calibrated in bfloat16 (the top level) and in float32 (calibrations.cpu-float32): a page whose
    default numerics is float32 starts on the float32 tree and quotes its figures; a bfloat16-only page on
    the other; neither says a word about another device."""
    import copy

    import torch
    from conftest import untrained_heads

    from medusa_lib.present import Playground
    from ui import build_demo

    base = tiny_playground(oracle=False)
    heads = untrained_heads(base.model, num_heads=3)
    bf16 = {
        "device": "CPU, 2 threads",
        "dtype": "torch.bfloat16",
        "lookup": 0,
        "trees": {"calibrated-3": {"nodes": 4, "measured_tokens_per_step": 2.4, "speedup": 1.7}},
    }
    f32 = {
        "device": "CPU, 2 threads",
        "device_kind": "cpu",
        "dtype": "torch.float32",
        "lookup": 0,
        "default_tree": "calibrated-2",
        "trees": {"calibrated-2": {"nodes": 2, "measured_tokens_per_step": 1.9, "speedup": 1.3}},
    }
    heads.tree_presets = {"calibrated-2": [[0], [0, 0]], "calibrated-3": [[0], [0, 0], [1]]}
    heads.default_tree, heads.lookup, heads.calibration = "calibrated-3", 0, bf16
    heads.calibrations = {"cpu-float32": f32}
    m16, h16 = copy.deepcopy(base.model).to(torch.bfloat16), copy.deepcopy(heads).to(torch.bfloat16)
    both = Playground(base.model, base.tokenizer, heads, variants={"bfloat16": (m16, h16)})
    only16 = Playground(m16, base.tokenizer, h16)
    assert (both.default_numerics, both.defaults.tree, both.defaults.calibration) == ("float32", "calibrated-2", f32)
    assert (only16.default_numerics, only16.defaults.tree, only16.defaults.calibration) == (
        "bfloat16",
        "calibrated-3",
        bf16,
    )
    assert both.defaults_for("bfloat16").tree == "calibrated-3"  # a run in bfloat16 naming no tree: its own
    assert both.settings_of({"numerics": "bfloat16", "tree": ""}).tree == "calibrated-3"
    assert both.settings_of({"tree": ""}).tree == "calibrated-2"
    for pg, tree, figures in ((both, "calibrated-2", f32), (only16, "calibrated-3", bf16)):
        page = {
            c["props"]["elem_id"]: c["props"]
            for c in build_demo(pg, max_new_tokens=16).config["components"]
            if c.get("props", {}).get("elem_id")
        }
        assert page["tree-preset"]["value"] == tree and "calibration-note" not in page
        assert f"{figures['trees'][tree]['speedup']:.2f}x plain decoding's speed" in page["explain"]["value"]


def load_app(monkeypatch):
    """app.py as a fresh module, its environment overrides unset (its constants read them at import)."""
    import importlib.util
    import os

    for k in [k for k in os.environ if k.startswith("MEDUSA_") or k.startswith("GRADIO_SERVER_")]:
        monkeypatch.delenv(k)
    spec = importlib.util.spec_from_file_location("app_load", ROOT / "app.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def what_the_page_offers(pg) -> dict:
    """What a user of the page or of /compare meets of a Playground: its copies, heads, trees, drafters, limits and
    starting settings (the measured speeds of its copies aside: two loads measure two figures)."""
    return {
        "numerics": (list(pg.variants), pg.default_numerics, pg.dtype, pg.device),
        "heads": (pg.heads.num_heads, pg.heads_note),
        "trees": (pg.tree_presets, pg.tree_names(), pg.defaults),
        "drafters": (pg.drafters.available, pg.drafters.default, pg.drafters.note),
        "limits": (pg.max_new_tokens_limit, pg.max_prompt_chars, pg.max_prompt_tokens, pg.prompt_limit_why),
        "engine": (pg.cache, pg.engine),
        "start": pg.starting_request(),
    }


@pytest.mark.parametrize("beside", ["no heads", "heads and an EAGLE head"])
def test_app_py_serves_the_playground_that_playground_load_builds(monkeypatch, model_folder, tmp_path, beside):
    """app.py with its flags at their defaults loads what ``Playground.load`` loads from the same model: a model
    named without heads gets untrained heads both ways (app.py once offered the default model's heads to any
    model), and a heads folder brings the EAGLE head beside it both ways."""
    from conftest import make_model, random_heads

    from medusa_lib.core.dynamic_tree import DynamicTreeConfig
    from medusa_lib.core.eagle import new_eagle_head
    from medusa_lib.present import Playground

    app = load_app(monkeypatch)
    flags, named = ["--model", str(model_folder), "--device", "cpu"], {}
    if beside != "no heads":
        random_heads().save(tmp_path / "heads")
        new_eagle_head(make_model("llama"), tree=DynamicTreeConfig(top_k=2, depth=3, num_nodes=6)).save(
            tmp_path / "heads-eagle"
        )
        flags, named = flags + ["--heads", str(tmp_path / "heads")], {"heads": tmp_path / "heads"}
    served = app.load_playground(app.parse_args(flags))
    loaded = Playground.load(model=str(model_folder), device="cpu", **named)
    assert what_the_page_offers(served) == what_the_page_offers(loaded)
    if beside == "no heads":
        assert loaded.heads_note.startswith("untrained heads") and "eagle" not in loaded.drafters.available
    else:
        assert loaded.heads_note.startswith("trained heads") and "eagle" in loaded.drafters.available
