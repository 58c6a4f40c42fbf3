"""The page's Drafter choice (present/drafter.py): an EAGLE head drafts the Medusa columns, exactly, and the page
says so."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import PROMPT, make_model, random_heads, serving, tiny_playground

from medusa_lib import DecodeConfig
from medusa_lib.core.compose import make_decoder
from medusa_lib.core.drafters import EagleDrafter, MedusaDrafter
from medusa_lib.core.dynamic_tree import DynamicTreeConfig
from medusa_lib.core.eagle import EagleError, new_eagle_head
from medusa_lib.present import Playground, PlaygroundError, Settings, default_drafter, eagle_budgets
from medusa_lib.present.drafter import make_drafters
from medusa_lib.present.drafter_files import find_eagle
from medusa_lib.present.inspector import mask_data, path_rows, tree_nodes

TREE = DynamicTreeConfig(top_k=2, depth=4, num_nodes=8)
GREEDY_LABEL = "Medusa greedy / exact sampling"


def trained_eagle(model, ids: list[int], answer: list[int], steps: int = 120):
    """A tiny EAGLE head over-fitted to the model's own greedy answer, so its paths get accepted."""
    from medusa_lib.pipeline.eagle_loss import eagle_loss
    from medusa_lib.pipeline.feature_cache import FeatureCache

    with torch.no_grad():
        cache = FeatureCache.build(model, [{"prompt_ids": ids, "answer_ids": answer}], desc="test features")
    head = new_eagle_head(model, tree=TREE)
    torch.manual_seed(0)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    proj = head.projection_weight().detach().float()
    for _ in range(steps):
        loss, _ = eagle_loss(head, proj, cache, [0], noise=0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval().requires_grad_(False)


def eagle_playground(**kw) -> Playground:
    base = tiny_playground()
    ids = base.prompt_ids(PROMPT)
    answer = make_decoder(base.model, config=DecodeConfig(max_new_tokens=40, stop_on_eos=False)).run(ids).tokens
    head = trained_eagle(base.model, ids, answer)
    return Playground(
        base.model, base.tokenizer, base.heads, heads_note="test heads", drafters={"eagle": {"float32": head}}, **kw
    )


def with_eagle(pg, head, numerics: str = "float32") -> dict:
    """What a playground loaded, with ``head`` as its EAGLE head."""
    return {**pg.drafters.loaded, "eagle": {numerics: head}}


@pytest.fixture(scope="module")
def pg():
    return eagle_playground()


@pytest.fixture(scope="module")
def eagle_run(pg):
    return {
        ev.method: ev.record
        for ev in pg.stream(PROMPT, Settings(max_new_tokens=24, drafter="eagle"))
        if ev.kind == "end"
    }


# ------------------------------------------------------------------ the default rule
def test_the_default_is_eagle_only_where_its_recorded_speedup_beats_medusas():
    def pick(medusa, eagle):
        return default_drafter({"medusa": medusa, "eagle": eagle})

    assert pick(None, None) == "medusa"
    assert pick(1.7, None) == "medusa"  # no figure for EAGLE: Medusa
    assert pick(1.7, 1.1) == "medusa"  # the shipped heads on this CPU
    assert pick(1.7, 1.7) == "medusa"  # a tie keeps Medusa
    assert pick(1.7, 2.3) == "eagle"
    assert pick(None, 1.2) == "eagle"  # uncalibrated Medusa heads have no figure to beat
    # whatever drafters have a record are compared: the fastest wins
    assert default_drafter({"medusa": 1.7, "eagle": 1.8, "rest": 1.9}) == "rest"


def test_recorded_figures_count_only_on_their_own_kind_of_device(pg):
    head = new_eagle_head(pg.model, tree=TREE)
    head.calibration = {"device_kind": "cuda", "speedup": 3.0}
    speedup = lambda device: EagleDrafter.recorded(head, defaults=pg.defaults, device=torch.device(device))[0]  # noqa: E731
    assert speedup("cpu") is None and speedup("cuda") == 3.0
    head.calibration = {"speedup": 2.5}  # a record without a kind was made on a CPU
    assert speedup("cpu") == 2.5
    drafters = make_drafters(with_eagle(pg, head), defaults=pg.defaults, device=torch.device("cpu"), device_label="CPU")
    assert drafters.default == "eagle" and "2.50x" in drafters.note
    # the tiny heads are not calibrated
    assert MedusaDrafter.recorded(pg.heads, defaults=pg.defaults, device=torch.device("cpu"))[0] is None


def test_figures_of_one_bench_run_decide_the_default_and_are_named_so(pg, monkeypatch):
    """bench --record-eagle with medusa-greedy keeps both drafters' speed-ups of one run; those are
    compared (not the heads' own calibration, perhaps of another machine or numerics)."""
    # a figure of another machine
    monkeypatch.setattr(
        MedusaDrafter, "recorded", classmethod(lambda cls, s, **kw: (9.0, {}, "the heads' calibration"))
    )
    head = new_eagle_head(pg.model, tree=TREE)
    head.calibration = {
        "device_kind": "cpu",
        "speedup": 1.3,
        "medusa_speedup": 1.1,
        "dtype": "torch.float32",
        "date": "2026-11-26",
    }
    drafters = make_drafters(with_eagle(pg, head), defaults=pg.defaults, device=torch.device("cpu"), device_label="CPU")
    assert drafters.default == "eagle"
    assert (
        drafters.note
        == "The EAGLE head starts selected: it is the faster drafter here (measured in one bench run (float32, "
        "2026-11-26) on CPU: Medusa heads 1.10x, EAGLE head 1.30x plain)."
    )
    head.calibration |= {"lookup_speedup": 1.05}  # EAGLE as the page runs it (+ the lookup branch), against the same
    drafters = make_drafters(with_eagle(pg, head), defaults=pg.defaults, device=torch.device("cpu"), device_label="CPU")
    assert drafters.default == "medusa"
    assert drafters.note == (
        "The Medusa heads start selected: they are the faster drafter here (measured in one bench run (float32, "
        "2026-11-26, each with the lookup branch) on CPU: Medusa heads 1.10x, EAGLE head 1.05x plain)."
    )
    head.calibration = {"device_kind": "cpu", "speedup": 1.3}
    drafters = make_drafters(with_eagle(pg, head), defaults=pg.defaults, device=torch.device("cpu"), device_label="CPU")
    assert (
        drafters.default == "medusa"
        and "recorded separately (the heads' calibration and the EAGLE head's bench, perhaps on other machines) "
        "on CPU: Medusa heads 9.00x"
        in drafters.note
    )


def test_the_shipped_records_decide_the_default_drafter_here(pg):
    """A head that records no figure for this kind of device leaves the Medusa heads selected; the shipped EAGLE
    head's record (one bench run of both drafters on a CPU, each with the lookup branch as the page runs them)
    decides between the two, and the note quotes the two figures it compared."""
    assert pg.drafters.available == ("medusa", "eagle", "lookup") and pg.drafters.default == "medusa"
    assert pg.drafters.note.startswith(
        "The Medusa heads start selected: the EAGLE head's config.json records no measured speed-up on CPU"
    )
    from types import SimpleNamespace

    from medusa_lib.core.defaults import heads_defaults
    from medusa_lib.core.heads_load import load_heads

    cal = json.loads(open("assets/heads/smollm2-135m-instruct-eagle/config.json").read())["calibration"]
    assert cal["device_kind"] == "cpu" and cal["draft"] == "int8" and cal["dtype"] == "torch.float32"
    defaults = heads_defaults(load_heads("assets/heads/smollm2-135m-instruct"), "cpu", "float32")
    shipped = make_drafters(
        with_eagle(pg, SimpleNamespace(calibration=cal)),
        defaults=defaults,
        device=torch.device("cpu"),
        device_label="CPU",
    )
    assert shipped.default == default_drafter({"medusa": cal["medusa_speedup"], "eagle": cal["lookup_speedup"]})
    assert f"Medusa heads {cal['medusa_speedup']:.2f}x, EAGLE head {cal['lookup_speedup']:.2f}x plain" in shipped.note
    assert "float32, int8 drafts" in shipped.note and "each with the lookup branch" in shipped.note
    # the same record on a GPU says nothing: the Medusa heads start selected there
    gpu = make_drafters(
        with_eagle(pg, SimpleNamespace(calibration=cal), numerics="bfloat16"),
        defaults=defaults,
        device=torch.device("cuda"),
        device_label="GPU",
    )
    assert gpu.default == "medusa"


# ------------------------------------------------------------------ runs
def test_an_eagle_comparison_drafts_the_medusa_columns_and_greedy_equals_plain_greedy(pg, eagle_run):
    plain, greedy, typical = (eagle_run[v] for v in ("plain", "medusa-greedy", "medusa-typical"))
    assert plain.drafter is None and all(v.step.drafter is None for v in plain.views)
    for rec in (greedy, typical):
        assert rec.drafter == "eagle" and all(v.step.drafter == "eagle" for v in rec.views[1:])
    assert greedy.tokens == plain.tokens  # float32: the drafter changes the speed, never the text
    assert greedy.result.tokens_per_step > 1.5  # the over-fitted drafter gets paths accepted
    medusa = {ev.method: ev.record for ev in pg.stream(PROMPT, Settings(max_new_tokens=24)) if ev.kind == "end"}
    assert medusa["medusa-greedy"].drafter == "medusa" and medusa["medusa-greedy"].tokens == plain.tokens


def test_exact_sampling_with_the_eagle_drafter_equals_plain_sampling(pg):
    out = pg.compare(PROMPT, Settings(max_new_tokens=20, sample=True, temperature=0.9, seed=3, drafter="eagle"))
    assert out["drafter"] == "eagle" and out["sampling_match"]["equal"] is True
    assert out["methods"]["medusa-sample"]["drafter"] == "eagle" and out["methods"]["plain-sample"]["drafter"] is None


def test_the_inspector_draws_each_eagle_step_from_its_own_tree(pg, eagle_run):
    rec = eagle_run["medusa-greedy"]
    shapes = set()
    for v in rec.views[1:]:
        tree = v.step.tree
        shapes.add(tree.parents)
        nodes = tree_nodes(v, pg.tokenizer)
        assert [n["parent"] for n in nodes[: tree.num_nodes]] == list(tree.parents)
        assert [n["node"] for n in nodes if n["accepted"] and n["kind"] != "bonus"] == list(v.step.accepted_nodes)
        z, cols, rows = mask_data(v, pg.tokenizer)
        assert [[int(x > 0) for x in row[1:]] for row in z] == tree.attn_mask.tolist()
    assert len(shapes) > 1  # a dynamic tree: its shape changes from step to step
    table = path_rows(rec, pg.tokenizer)
    assert {r["drafted by"] for r in table if r["accept length"]} == {"EAGLE head"}


def test_the_tree_preset_does_not_apply_to_eagle_and_the_json_says_which_tree_ran(pg):
    out = pg.compare(PROMPT, Settings(max_new_tokens=6, drafter="eagle", custom_tree="[[0], [0, 0]]"))
    assert out["tree"] == "eagle-dynamic (top-k 2, depth 4, 8 nodes)"
    assert pg.compare(PROMPT, Settings(max_new_tokens=6, drafter="medusa", tree="chain-2"))["tree"] == "chain-2"


@pytest.mark.parametrize(
    "value, sentence",
    [
        ("EAGLE", 'The drafter must be "medusa", "eagle", "lookup" or "rest" (got \'EAGLE\').'),
        (3, 'The drafter must be "medusa", "eagle", "lookup" or "rest", not a number (got 3).'),
        (["eagle"], 'The drafter must be "medusa", "eagle", "lookup" or "rest", not a list (got ["eagle"]).'),
    ],
)
def test_a_bad_drafter_gets_one_sentence(pg, value, sentence):
    with pytest.raises(PlaygroundError) as err:
        pg.prepare(PROMPT, Settings(drafter=value))
    assert str(err.value) == sentence


def test_without_an_eagle_head_only_medusa_is_offered():
    pg = tiny_playground(oracle=False)
    assert pg.drafters.available == ("medusa", "lookup") and pg.drafters.default == "medusa"
    with pytest.raises(
        PlaygroundError,
        match=(
            r"^This server has no EAGLE head for its model, "
            r'so the drafter must be "medusa" or "lookup" \(or left empty\)\.$'
        ),
    ):
        pg.prepare(PROMPT, Settings(drafter="eagle"))
    assert pg.compare(PROMPT, Settings(max_new_tokens=3, drafter=None))["drafter"] == "medusa"


# ------------------------------------------------------------------ the page
def shown(names: list[str], frames) -> dict:
    """What the page shows after a handler's frames: each output's last value that was not a skip."""
    out = {}
    for frame in frames:
        out.update(
            {
                n: v
                for n, v in zip(names, frame)
                if not (isinstance(v, dict) and v.get("__type__") == "update" and len(v) == 1)
            }
        )
    return out


def test_the_page_names_the_drafter_in_columns_summary_inspector_status_and_replay(pg):
    from ui.handlers import Handlers
    from ui.outputs import REPLAY_OUTPUTS, RUN_OUTPUTS

    h = Handlers(pg)
    final = shown(
        RUN_OUTPUTS,
        h.run(PROMPT, 16, 0.7, 0.09, 0.3, "chain-2", "", True, True, 0, None, GREEDY_LABEL, "greedy", "eagle"),
    )
    assert "Medusa columns drafted by the EAGLE head" in final["status"]
    assert (
        'data-drafter="eagle"' in final["col_greedy"]
        and 'data-drafter="eagle"' in final["col_typical"]
        and "data-drafter" not in final["col_plain"]
    )
    assert list(final["summary"]["drafter"]) == ["", "EAGLE head", "EAGLE head"]
    assert "drafted by the EAGLE head" in final["tree_plot"].layout.title.text
    assert final["tree_plot"].layout.xaxis.ticktext[1] == "depth 1"  # EAGLE's levels are draft depths, not heads
    records = final["session"]
    replay = shown(REPLAY_OUTPUTS, h.replay(records, "2x"))
    assert (
        "Medusa columns drafted by the EAGLE head" in replay["status"]
        and 'data-drafter="eagle"' in replay["col_greedy"]
    )
    medusa = shown(
        RUN_OUTPUTS, h.run(PROMPT, 8, 0.7, 0.09, 0.3, "chain-2", "", True, True, 0, None, GREEDY_LABEL, "greedy", "")
    )
    assert (
        'data-drafter="medusa"' in medusa["col_greedy"]
        and "drafted by the Medusa heads" in medusa["tree_plot"].layout.title.text
    )


def test_the_drafter_choice_disables_the_tree_controls_for_eagle(pg):
    from ui.handlers import Handlers

    tree, custom, note = Handlers(pg).drafter_choice("eagle")
    assert tree["interactive"] is False and custom["interactive"] is False and note["visible"] is True
    tree, custom, note = Handlers(pg).drafter_choice("medusa")
    assert tree["interactive"] is True and note["visible"] is False


def test_how_to_read_this_page_says_what_eagle_reads_that_medusa_never_sees(pg):
    from ui.text import explain

    text = explain(drafter_note=pg.drafters.note)
    assert "embedding of the token actually chosen at t+1 together with the base model's feature f_t" in text
    assert "reads only h_t" in text and pg.drafters.note in text


def test_how_to_read_this_page_names_every_drafter_of_the_registry_in_its_own_words(pg):
    from medusa_lib.core.drafters import REGISTRY
    from medusa_lib.present import DRAFTER_NAMES
    from ui.text import explain

    text = " ".join(explain(drafter_note=pg.drafters.note).split())
    assert "**Four drafters: Medusa heads, EAGLE head, Prompt lookup or REST (retrieval).**" in text
    # the choice's words
    assert list(DRAFTER_NAMES.values()) == ["Medusa heads", "EAGLE head", "Prompt lookup", "REST (retrieval)"]
    assert all(" ".join(cls.teach.split()) in text for cls in REGISTRY.values())
    assert "*Prompt lookup* needs no weights" in text and "the same for all four" in text


def test_the_lab_measures_eagles_node_budgets(pg):
    done = []
    points = eagle_budgets(pg, PROMPT, max_new_tokens=12, budgets=(2, 8), progress=lambda d, t: done.append((d, t)))
    assert [p.nodes for p in points] == [2, 8] and done == [(1, 3), (2, 3), (3, 3)]
    assert all(p.tokens_per_step >= 1 and p.speedup is not None and p.speedup > 0 for p in points)
    from ui.eagle_lab import budget_figure

    fig = budget_figure(points, default_nodes=8, device="CPU")
    assert "measured on this device" in fig.layout.title.text and any("default (8 nodes)" in t.name for t in fig.data)


# ------------------------------------------------------------------ /compare
@pytest.fixture(scope="module")
def served_eagle():
    yield from serving(eagle_playground())


def test_compare_takes_the_drafter_and_refuses_a_bad_one_with_its_sentence(served_eagle):
    from gradio_client.exceptions import AppError

    pg, url, client = served_eagle
    out = client.predict(PROMPT, 8, api_name="/compare", drafter="eagle")
    assert (
        out["drafter"] == "eagle"
        and out["greedy_match"]["equal"] is True
        and out["summary"][1]["drafter"] == "EAGLE head"
    )
    assert client.predict(PROMPT, 4, api_name="/compare", drafter="")["drafter"] == "medusa"  # "" = the default
    with pytest.raises(AppError) as err:
        client.predict(PROMPT, 4, api_name="/compare", drafter="fast")
    assert str(err.value) == 'The drafter must be "medusa", "eagle", "lookup" or "rest" (got \'fast\').'


# ------------------------------------------------------------------ where the EAGLE head comes from
def test_load_finds_the_eagle_head_beside_the_heads_and_a_named_bad_folder_is_refused_first(model_folder, tmp_path):
    model = make_model("llama")
    random_heads().save(tmp_path / "heads")
    new_eagle_head(model, tree=TREE).save(tmp_path / "heads-eagle")
    kw = dict(model=str(model_folder), heads=tmp_path / "heads", device="cpu", dtype="float32", numerics_copy=False)
    pg = Playground.load(**kw)
    assert pg.drafters.available == ("medusa", "eagle", "lookup") and pg.drafters.tree == TREE
    assert Playground.load(**kw, eagle="none").drafters.available == ("medusa", "lookup")
    assert find_eagle("auto", heads=tmp_path / "elsewhere") == (None, False)
    with pytest.raises(EagleError, match=r"^--eagle '.*nothing' is not a folder; give the folder of an EAGLE head"):
        Playground.load(
            **{**kw, "model": "nobody/not-loaded"}, eagle=str(tmp_path / "nothing")
        )  # refused before the model loads
    with pytest.raises(EagleError, match=r"holds no EAGLE head: it needs eagle.safetensors and config.json"):
        Playground.load(**{**kw, "model": "nobody/not-loaded"}, eagle=str(tmp_path / "heads"))


def test_the_cli_refuses_a_bad_eagle_folder_in_one_sentence(monkeypatch, tmp_path):
    from test_cli import start

    assert start(monkeypatch, "--eagle", str(tmp_path), "--device", "cpu") == (
        f"error: --eagle {str(tmp_path)!r} holds no EAGLE head: it needs eagle.safetensors and config.json "
        "(python -m medusa_lib.pipeline.train_eagle makes them)."
    )
    assert start(monkeypatch, "--device", "cpu", MEDUSA_EAGLE=str(tmp_path / "x")).startswith(
        f"error: MEDUSA_EAGLE {str(tmp_path / 'x')!r} is not a folder"
    )
