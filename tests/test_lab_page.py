"""The Tree lab tab: its presenter (medusa_lib/present/lab.py, tree_editor.py, lab_measure.py) and handlers (ui/lab.py)
on the tiny model."""

from __future__ import annotations

import pytest
from conftest import PROMPT, status_text, tiny_playground

from medusa_lib.core.lab import gain_curve
from medusa_lib.core.tree import build_tree, greedy_choices
from medusa_lib.core.tree.edit import add_best_node
from medusa_lib.present import Playground
from medusa_lib.present.lab import curves, tree_lab, tree_point
from medusa_lib.present.lab_measure import run_acceptance
from medusa_lib.present.tree_editor import editor_mask, editor_nodes, editor_tree

ACC = [[0.6, 0.2, 0.1, 0.05], [0.5, 0.2, 0.05, 0.02], [0.4, 0.1, 0.1, 0.01], [0.3, 0.1, 0.05, 0.01]]
RECORD = {
    "accuracy": ACC,
    "lookup": 2,
    "device": "CPU, 2 threads",
    "device_kind": "cpu",
    "trees": {
        "calibrated-4": {
            "nodes": 5,
            "heads_only_simulated_tokens_per_step": 2.0,
            "simulated_tokens_per_step": 2.3,
            "measured_tokens_per_step": 2.4,
            "speedup": 1.6,
        },
        "calibrated-16": {
            "nodes": 17,
            "heads_only_simulated_tokens_per_step": 2.4,
            "simulated_tokens_per_step": 2.6,
            "measured_tokens_per_step": 2.7,
            "speedup": 1.2,
        },
    },
}


def calibrated_playground(record: dict = RECORD) -> Playground:
    """The tiny oracle playground whose heads carry a CPU calibration (what load_heads sets from config.json)."""
    base = tiny_playground()
    heads = base.heads
    heads.tree_presets, heads.default_tree, heads.lookup, heads.calibration = (
        {"calibrated-4": [[0], [0, 0], [1], [0, 0, 0]]},
        "calibrated-4",
        2,
        record,
    )
    return Playground(base.model, base.tokenizer, heads, heads_note="test heads")


@pytest.fixture(scope="module")
def pg():
    return calibrated_playground()


def outputs(names, values) -> dict:
    return dict(zip(names, values))


def names_of(fig) -> list[str]:
    return [t.name for t in fig.data]


def test_the_lab_reads_the_calibration_of_this_device_kind(pg):
    lab = tree_lab(pg)
    assert lab.accuracy == ACC and lab.lookup == 2 and lab.cost.source == "calibration"
    assert lab.cost.sizes == (1, 7, 19)  # nodes + the lookup branch the trees were measured with
    assert lab.cost.measured[1] == pytest.approx(2.4 / 1.6)
    c = curves(lab)
    assert len(c.speedup) == len(c.sizes) == 64 and c.optimum == c.sizes[max(range(64), key=c.speedup.__getitem__)]
    assert c.speedup_lookup is not None and c.optimum_lookup in c.sizes
    assert lab.gain == gain_curve(ACC, c.sizes, record=RECORD)


def test_a_calibration_from_another_device_kind_gives_no_costs_until_measured():
    pg = calibrated_playground({**RECORD, "device_kind": "cuda", "device": "NVIDIA H100"})
    lab = tree_lab(pg)
    assert lab.cost is None and lab.accuracy == ACC  # the accuracies hold on any device; the costs do not
    assert "Measure costs" in lab.cost_note and curves(lab).speedup is None


def test_a_tree_point_is_its_expected_gain_over_its_step_cost(pg):
    lab = tree_lab(pg)
    tree = editor_tree(pg, "[[0], [1], [0, 0]]")
    alone, both = tree_point(lab, tree, lookup_on=False), tree_point(lab, tree, lookup_on=True)
    assert alone.size == alone.tokens == 4 and both.tokens == 6
    assert alone.gain == pytest.approx(1 + 0.6 + 0.2 + 0.6 * 0.5)
    assert alone.speedup == pytest.approx(alone.gain / lab.cost.at(4))
    assert both.gain == pytest.approx(alone.gain + lab.gain.lookup_gain_at(4)) and both.speedup == pytest.approx(
        both.gain / lab.cost.at(6)
    )


def test_the_editor_draws_the_tree_and_its_mask_without_running_the_model(pg):
    tree = editor_tree(pg, "[[0], [1], [0, 0]]")
    nodes = editor_nodes(tree)
    assert [n["label"] for n in nodes] == ["root", "h1 r0", "h1 r1", "h2 r0"] and [n["parent"] for n in nodes] == [
        -1,
        0,
        0,
        1,
    ]
    z, cols, rows = editor_mask(tree)
    assert [r[1:] for r in z] == tree.attn_mask.tolist() and all(r[0] == 1 for r in z) and len(cols) == len(rows) + 1


def test_edits_redraw_everything_and_keep_a_valid_tree(pg):
    from ui.lab import EDIT_OUTPUTS, LabHandlers

    h = LabHandlers(pg)
    out = outputs(EDIT_OUTPUTS, h.add_node(None, "[[0], [1]]", False))
    assert out["lab_paths"] == "[[0], [1], [0, 0]]" == str(add_best_node([[0], [1]], ACC, num_heads=4))
    assert "This tree: 4 tokens" in out["lab_status"]
    for name in ("lab_cost", "lab_gain", "lab_speedup"):
        assert any(n and n.startswith("this tree") for n in names_of(out[name])), name
    assert any(n and n.startswith("optimum") for n in names_of(out["lab_speedup"]))
    assert out["lab_leaf"]["choices"] == ["[1]", "[0, 0]"]
    out = outputs(EDIT_OUTPUTS, h.remove(None, out["lab_paths"], "[0, 0]", False))
    assert out["lab_paths"] == "[[0], [1]]"
    grown = "[[0]]"
    for n in range(2, 9):  # from one node, Add grows the greedy tree of each size
        grown = outputs(EDIT_OUTPUTS, h.add_node(None, grown, False))["lab_paths"]
        assert build_tree(editor_tree(pg, grown).choices).choices == build_tree(greedy_choices(ACC, n)[0]).choices
    out = outputs(EDIT_OUTPUTS, h.preset(None, "chain-3", False))
    assert out["lab_paths"] == "[[0], [0, 0], [0, 0, 0]]"


def test_a_bad_tree_gets_the_custom_tree_box_sentence_and_leaves_the_figures(pg):
    from ui.lab import EDIT_OUTPUTS, LabHandlers

    h = LabHandlers(pg)
    for text in ("[[0], [0, 0, 0]]", "[[0], [0]]", "not json", "", "[[0, 0, 0, 0, 0]]"):
        with pytest.raises(Exception) as err:
            editor_tree(pg, text)
        out = outputs(EDIT_OUTPUTS, h.edit(None, text, True))
        assert status_text(out["lab_status"]) == f"**Cannot use this tree:** {err.value}"
        assert set(out) == set(EDIT_OUTPUTS) and all(
            type(out[n]).__name__ != "Figure" for n in EDIT_OUTPUTS if n != "lab_status"
        )  # gr.skip()
    out = outputs(EDIT_OUTPUTS, h.remove(None, "[[0], [0, 0]]", "[0]", True))
    assert "has children" in out["lab_status"]
    assert (
        outputs(EDIT_OUTPUTS, h.remove(None, "[[0], [0, 0]]", None, True))["lab_status"]
        == "**Cannot remove it:** Pick a leaf to remove from the list."
    )


def test_use_this_tree_fills_the_custom_tree_box(pg):
    from ui.lab import LabHandlers

    text, status = LabHandlers(pg).use("[[1],[0]]")
    assert text == "[[0], [1]]" and "Custom tree" in status
    assert pg.resolve_tree(pg.settings_of({"custom_tree": text})).choices == ((0,), (1,))


def test_measure_puts_the_measured_point_beside_the_predicted_one(pg):
    from ui.lab import MEASURE_OUTPUTS, LabHandlers

    h = LabHandlers(pg)
    settings = dict(prompt=PROMPT, max_new_tokens=24, chat_template=True, lookup_branch=False, numerics=None)
    out = outputs(MEASURE_OUTPUTS, h.measure(None, custom_tree="[[0], [1], [0, 0], [0, 0, 0]]", **settings))
    m = out["lab_state"]["measured"]
    assert m.size == 5 and m.tokens == 5 and m.medusa.method == "medusa-greedy" and m.plain.method == "plain"
    assert (
        m.tokens_per_step == pytest.approx(m.medusa.result.tokens_per_step) and m.tokens_per_step > 1
    )  # the oracle heads are right
    assert m.speedup == pytest.approx(m.medusa.result.tokens_per_second / m.plain.result.tokens_per_second)
    assert m.cost == pytest.approx(m.tokens_per_step / m.speedup)
    assert m.medusa.tokens == m.plain.tokens  # Medusa greedy == plain greedy
    for name in ("lab_cost", "lab_gain", "lab_speedup"):
        assert "measured run" in names_of(out[name])
    assert "tokens/step" in out["lab_status"]
    acc = run_acceptance(m.medusa, depth=4)
    heat = out["lab_acceptance"].data[0]
    assert heat.text[0][0] == f"{acc.accepted[0][0]}/{acc.reached[0][0]}" and acc.accepted[0][0] > 0
    again = outputs(MEASURE_OUTPUTS, h.measure(out["lab_state"], custom_tree="[[0]]", **{**settings, "prompt": ""}))
    assert again["lab_status"] == "**Cannot measure:** The prompt is empty; type a question or pick an example."


def test_measure_costs_replaces_the_calibrated_curve_with_this_machines(pg, monkeypatch):
    from ui.lab import COST_OUTPUTS, LabHandlers

    monkeypatch.setattr("medusa_lib.present.lab.step_costs", _fast_costs)
    out = outputs(COST_OUTPUTS, LabHandlers(pg).measure_costs(None, "[[0]]", False, progress=lambda *a, **k: None))
    lab = out["lab_state"]["lab"]
    assert (
        lab.cost.source == "measured"
        and lab.cost.sizes == (1, 2, 4, 8)
        and "measured on this machine" in out["lab_note"]
    )
    assert "measured (" in names_of(out["lab_cost"])[0]
    assert lab.cost.mkl_rows == () and "MKL" not in out["lab_note"]  # the tiny model is not pre-packed


def test_measured_costs_fit_the_sizes_routed_to_mkl_apart_and_say_so(pg, monkeypatch):
    from ui.lab import COST_OUTPUTS, LabHandlers

    monkeypatch.setattr("medusa_lib.present.lab.step_costs", _fast_costs)
    monkeypatch.setattr("medusa_lib.present.lab.few_row_kernels", lambda model: (2, 4))
    out = outputs(COST_OUTPUTS, LabHandlers(pg).measure_costs(None, "[[0]]", False, progress=lambda *a, **k: None))
    lab = out["lab_state"]["lab"]
    assert lab.cost.mkl_rows == (2, 4)
    assert "Steps of 2, 4 tokens ran their products through MKL" in out["lab_note"]
    assert names_of(out["lab_cost"])[1] == "non-decreasing fit (MKL sizes apart)"


def _fast_costs(model, sizes, *, repeats, progress, static_kv=None):
    from medusa_lib.core.lab import step_costs

    return step_costs(
        model, (1, 2, 4, 8), prefix=16, repeats=1, progress=progress, static_kv=static_kv
    )  # the page asks for every size; a few keep the test fast


def test_the_comparisons_last_run_fills_the_acceptance_heatmap(pg):
    from ui.handlers import Handlers
    from ui.lab import LabHandlers

    frames = list(
        Handlers(pg).run(
            PROMPT, 16, 0.0, 0.09, 0.3, "calibrated-4", "", True, True, 0, None, "Medusa greedy / exact sampling"
        )
    )
    records = frames[-1][8]  # RUN_OUTPUTS' "session"
    fig = LabHandlers(pg).last_run(None, records)
    acc = run_acceptance(records["medusa-greedy"], depth=4)
    assert (
        "Medusa greedy" in fig.layout.title.text
        and fig.data[0].text[0][0] == f"{acc.accepted[0][0]}/{acc.reached[0][0]}"
    )
    assert [list(r[:4]) for r in fig.data[1].z] == ACC  # the calibrated accuracies beside it


def test_heads_without_a_calibration_say_so_and_the_editor_still_works():
    from ui.lab import EDIT_OUTPUTS, LabHandlers

    pg = tiny_playground(oracle=False)
    h = LabHandlers(pg)
    assert h.base.accuracy is None and h.base.cost is None
    out = outputs(EDIT_OUTPUTS, h.edit(None, "[[0], [0, 0]]", True))
    assert "3 tokens" in out["lab_status"] and out["lab_tree"].data
    assert "no calibrated accuracies" in outputs(EDIT_OUTPUTS, h.add_node(None, "[[0]]", True))["lab_status"]


def test_the_page_has_the_lab_tab_and_still_offers_only_compare():
    from conftest import launch
    from gradio_client import Client

    demo, url = launch(calibrated_playground())
    try:
        client = Client(url, verbose=False)
        assert list(client.view_api(print_info=False, return_format="dict")["named_endpoints"]) == ["/compare"]
        ids = {c.get("props", {}).get("elem_id") for c in client.config["components"]}
        assert {
            "lab-tab",
            "lab-cost",
            "lab-gain",
            "lab-speedup",
            "lab-paths",
            "lab-add",
            "lab-remove",
            "lab-use",
            "lab-measure",
            "lab-acceptance",
        } <= ids
    finally:
        demo.close()


def test_the_lab_s_measurements_end_at_the_api_s_bound(pg, monkeypatch):
    """Any client can reach Measure and Measure costs through the queue (issue #26: one held it 61 s): they end
    between steps at the same wall-time bound as /compare, or when their caller cancels or leaves."""
    from ui.lab import COST_OUTPUTS, MEASURE_OUTPUTS, LabHandlers

    bound = (
        "The run was stopped after 0 s, the most this server gives one call (MEDUSA_MAX_RUN_SECONDS); "
        "ask for fewer new tokens or send a shorter prompt."
    )
    h = LabHandlers(pg, max_run_seconds=0)
    out = outputs(
        MEASURE_OUTPUTS,
        h.measure(None, custom_tree="[[0], [1], [0, 0]]", prompt=PROMPT, max_new_tokens=24, lookup_branch=False),
    )
    assert status_text(out["lab_status"]) == f"**Cannot measure:** {bound}"
    monkeypatch.setattr("medusa_lib.present.lab.step_costs", _fast_costs)
    out = outputs(COST_OUTPUTS, h.measure_costs(None, "[[0]]", False, progress=lambda *a, **k: None))
    assert status_text(out["lab_note"]) == f"**Cannot measure the costs:** {bound}"


def test_the_page_shows_the_export_hint_once_in_the_tree_lab_and_not_above_the_tabs():
    """A developer's note: not in a student's first look above the tabs, and once in the Tree lab, under
    the heads' per-head acceptance (issue #35)."""
    from medusa_lib.present.export import export_hint
    from ui import build_demo

    pg = tiny_playground(oracle=False)
    demo = build_demo(pg, max_new_tokens=16)
    components = demo.config["components"]
    hints = [c for c in components if "Serving in vLLM" in str(c.get("props", {}).get("value", ""))]
    assert [c["props"]["elem_id"] for c in hints] == ["lab-export"]
    assert hints[0]["props"]["value"] == export_hint(pg.heads) and "untrained heads" in export_hint(pg.heads)
    by_id = {c["id"]: c.get("props", {}) for c in components}

    def ancestors(node, target, path=()):  # elem_ids of the layout's blocks that hold ``target``
        if node["id"] == target:
            return path
        for child in node.get("children", []):
            found = ancestors(child, target, path + (by_id.get(node["id"], {}).get("elem_id"),))
            if found is not None:
                return found
        return None

    above = ancestors(demo.config["layout"], hints[0]["id"])
    assert "lab-tab" in above and "playground-tab" not in above
    order = [c["props"].get("elem_id") for c in components if c.get("props", {}).get("elem_id")]
    assert order.index("lab-acceptance") < order.index("lab-export")  # where the heads are discussed


def test_a_gpus_calibration_draws_its_cost_curve_beside_this_devices():
    """Heads calibrated on a GPU, on this CPU: the lab keeps the GPU's step costs apart (they are not this
    device's), draws them dashed under the device's name, and says in the note what a step costs there."""
    from conftest import cuda_calibrated_playground

    from ui.lab_figures import cost_figure

    lab = tree_lab(cuda_calibrated_playground())
    assert lab.cost is None and [c.device for c in lab.elsewhere] == ["NVIDIA H100 80GB HBM3"]
    gpu = lab.elsewhere[0]
    assert gpu.sizes == (1, 4) and gpu.measured == pytest.approx((1.0, 2.5 / 2.25))
    fig = cost_figure(curves(lab), note=lab.cost_note)
    assert [t.name for t in fig.data] == ["NVIDIA H100 80GB HBM3 (its calibration)"]
    assert fig.data[0].line.dash == "dash" and list(fig.data[0].y) == pytest.approx([1.0, 2.5 / 2.25])
    assert "The dashed curve: the step costs NVIDIA H100 80GB HBM3 measured in its calibration" in lab.cost_note
    here = tree_lab(tiny_playground(oracle=False))  # heads with no other device's calibration: nothing dashed
    assert here.elsewhere == () and "dashed" not in here.cost_note
