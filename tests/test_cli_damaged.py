"""Start-up with damaged files: a model folder without a model, cut weights, damaged heads files and settings,
a damaged EAGLE head beside the heads (left out with a note) or named (refused), a damaged model config: each
one sentence."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from cli_helpers import start
from conftest import ROOT, random_heads

from medusa_lib.present import Playground


# ------------------------------------------------------------------ start-up: damaged heads, trees, EAGLE heads, models
def test_a_folder_without_a_model_and_damaged_weights_are_one_sentence(monkeypatch, model_folder, tmp_path):
    import shutil

    assert start(monkeypatch, "--model", "/etc", "--device", "cpu") == (
        "error: The folder '/etc' has no config.json, so it holds no model; "
        "give a folder with config.json and the weights, or a Hub id such as HuggingFaceTB/SmolLM2-135M-Instruct."
    )
    damaged = tmp_path / "damaged-model"
    shutil.copytree(model_folder, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a copy cut short
    message = start(monkeypatch, "--model", str(damaged), "--device", "cpu")
    assert message.startswith(f"error: Could not load model {str(damaged)!r} (") and message.endswith(
        "); check its files, or give another folder or Hub id."
    ), message
    assert "\n" not in message


@pytest.mark.parametrize("damage", ["truncated", "random bytes"])
def test_a_damaged_heads_file_is_one_sentence(monkeypatch, model_folder, tmp_path, damage):
    folder = tmp_path / "heads"
    random_heads().save(folder)
    weights = folder / "medusa_lm_head.safetensors"
    weights.write_bytes(weights.read_bytes()[:200] if damage == "truncated" else os.urandom(4096))
    message = start(
        monkeypatch, "--model", str(model_folder), "--heads", str(folder), "--device", "cpu", "--dtype", "float32"
    )
    assert message.startswith(
        f"error: The heads file {weights} is not a readable safetensors file ("
    ) and message.endswith("); copy the heads again or train new ones."), message
    assert "\n" not in message


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def edit_json(path: Path, **fields) -> None:
    import json

    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.fixture
def served(model_folder, tmp_path):
    """A tiny model's heads (with the shipped trees.json) and an EAGLE head beside them, as app.py finds it."""
    import shutil

    from conftest import make_model

    from medusa_lib.core.dynamic_tree import DynamicTreeConfig
    from medusa_lib.core.eagle import new_eagle_head

    heads, eagle = tmp_path / "heads", tmp_path / "heads-eagle"
    random_heads().save(heads)
    shutil.copy(ROOT / "assets" / "heads" / "smollm2-135m-instruct" / "trees.json", heads / "trees.json")
    new_eagle_head(make_model("llama"), tree=DynamicTreeConfig(top_k=2, depth=3, num_nodes=6)).save(eagle)
    return heads, eagle


EAGLE_DAMAGE = {
    "cut eagle.safetensors": (
        lambda e: cut(e / "eagle.safetensors"),
        "eagle.safetensors are not a readable safetensors file (SafetensorError: ",
    ),
    "random eagle.safetensors": (
        lambda e: (e / "eagle.safetensors").write_bytes(os.urandom(4096)),
        "eagle.safetensors are not a readable safetensors file (SafetensorError: ",
    ),
    "hidden_size as text": (
        lambda e: edit_json(e / "config.json", hidden_size="64"),
        "config.json has hidden_size='64'; it must be a whole number of at least 1",
    ),
    "config.json of []": (
        lambda e: (e / "config.json").write_text("[]"),
        "config.json holds a list, not an object, so it is not an EAGLE head of this project",
    ),
    "a tree that cannot be built": (
        lambda e: edit_json(e / "config.json", num_nodes=1000),
        "config.json holds a dynamic tree that cannot be built (The dynamic tree keeps between 1 and 10 nodes",
    ),
    "calibration as text": (
        lambda e: edit_json(e / "config.json", calibration={"speedup": "fast"}),
        "config.json has a calibration that is not a record of numbers",
    ),
    "tree sweeps as a list": (
        lambda e: edit_json(e / "config.json", tree_sweeps=[1]),
        "config.json has tree_sweeps=[1]; it must be an object of sweeps by kind of machine",
    ),
    "a tree sweep's choice as a list": (
        lambda e: edit_json(e / "config.json", tree_sweeps={"cpu-float32-avx2": [1]}),
        "config.json has tree_sweeps=",
    ),
    "config.json nested 100,000 deep": (
        lambda e: (e / "config.json").write_text("[" * 100_000 + "]" * 100_000),
        "config.json cannot be read (it is nested too deeply)",
    ),
}


@pytest.mark.parametrize("damage", list(EAGLE_DAMAGE))
def test_a_damaged_eagle_head_found_beside_the_heads_is_left_out_with_a_note(model_folder, served, damage):
    heads, eagle = served
    spoil, fragment = EAGLE_DAMAGE[damage]
    spoil(eagle)
    said: list[str] = []
    pg = Playground.load(
        model=str(model_folder), heads=heads, device="cpu", dtype="float32", numerics_copy=False, progress=said.append
    )
    notes = [line for line in said if line.startswith("note: The EAGLE head beside the Medusa heads is left out")]
    assert len(notes) == 1 and fragment in notes[0], said
    assert "eagle" not in pg.drafters.available and pg.drafters.available == ("medusa", "lookup")


def test_the_server_serves_with_a_damaged_eagle_head_beside_its_heads(monkeypatch, capsys, model_folder, served):
    import gradio

    heads, eagle = served
    cut(eagle / "eagle.safetensors")
    monkeypatch.setattr(gradio.Blocks, "launch", lambda self, **kw: sys.exit("serving"))
    assert start(monkeypatch, "--model", str(model_folder), "--heads", str(heads), "--device", "cpu") == "serving"
    assert "note: The EAGLE head beside the Medusa heads is left out" in capsys.readouterr().out


@pytest.mark.parametrize("damage", list(EAGLE_DAMAGE))
@pytest.mark.parametrize("named_by", ["--eagle", "MEDUSA_EAGLE"])
def test_a_named_damaged_eagle_head_is_refused_before_the_model_loads(
    monkeypatch, no_model_load, served, damage, named_by
):
    heads, eagle = served
    spoil, fragment = EAGLE_DAMAGE[damage]
    spoil(eagle)
    argv, env = ("--heads", str(heads)), {}
    if named_by == "--eagle":
        argv += ("--eagle", str(eagle))
    else:
        env["MEDUSA_EAGLE"] = str(eagle)
    message = start(monkeypatch, *argv, "--device", "cpu", **env)
    assert message.startswith(f"error: {named_by} {str(eagle)!r}: ") and fragment in message, message
    assert "\n" not in message


HEADS_DAMAGE = {
    "config.json of []": (
        lambda h: (h / "config.json").write_text("[]"),
        "config.json holds a list, not an object of settings; copy the heads again or train new ones.",
    ),
    "config.json nested 100,000 deep": (
        lambda h: (h / "config.json").write_text("[" * 100_000 + "]" * 100_000),
        "config.json cannot be read (it is nested too deeply); copy the heads again or train new ones.",
    ),
    "trees.json nested 100,000 deep": (
        lambda h: (h / "trees.json").write_text("[" * 100_000 + "]" * 100_000),
        "trees.json cannot be read (it is nested too deeply); calibrate again",
    ),
    "trees.json not JSON": (
        lambda h: (h / "trees.json").write_text("{x"),
        "trees.json cannot be read (JSONDecodeError",
    ),
    "trees.json of a list": (
        lambda h: (h / "trees.json").write_text("[[0], [1]]"),
        'trees.json holds a list, not an object of named trees like {"t": [[0], [1]]}; calibrate again',
    ),
    "trees.json tree of text": (
        lambda h: (h / "trees.json").write_text('{"t": "abc"}'),
        "trees.json has a tree 't' these heads cannot verify (it is text, not a list of paths)",
    ),
    "trees.json tree deeper than the heads": (
        lambda h: (h / "trees.json").write_text('{"t": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]}'),
        "trees.json has a tree 't' these heads cannot verify (The tree is 5 levels deep",
    ),
    "accuracies as text": (
        lambda h: edit_json(h / "config.json", calibration={"accuracy": [["0.5", "0.1"]]}),
        'config.json has calibration.accuracy=[["0.5", "0.1"]], but a calibration is an object whose accuracy',
    ),
    "default_tree a number": (
        lambda h: edit_json(h / "config.json", default_tree=5),
        "config.json has default_tree=5; it must be the name of a tree (text) or left out.",
    ),
}


@pytest.mark.parametrize("damage", list(HEADS_DAMAGE))
def test_damaged_heads_settings_are_one_sentence_naming_the_file(monkeypatch, model_folder, served, damage):
    heads, _ = served
    spoil, fragment = HEADS_DAMAGE[damage]
    spoil(heads)
    message = start(monkeypatch, "--model", str(model_folder), "--heads", str(heads), "--device", "cpu")
    assert message.startswith(f"error: {heads}/") and fragment in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    "config, message",
    [
        ("[]", "holds a list, not an object of settings; copy the model again, or give another folder or Hub id."),
        (
            {"num_hidden_layers": "2"},
            "(StrictDataclassFieldValidationError: Validation error for field 'num_hidden_layers'); check its files",
        ),
    ],
)
def test_a_damaged_model_config_is_one_sentence(monkeypatch, model_folder, tmp_path, config, message):
    import shutil

    damaged = tmp_path / "model"
    shutil.copytree(model_folder, damaged)
    if isinstance(config, str):
        (damaged / "config.json").write_text(config)
    else:
        edit_json(damaged / "config.json", **config)
    said = start(monkeypatch, "--model", str(damaged), "--device", "cpu", "--eagle", "none")
    assert said.startswith("error: ") and message in said and "\n" not in said, said


# ------------------------------------------------------------------ start-up: every file read before the model loads
def loaded_after(monkeypatch, said: list[str]) -> None:
    """Record in ``said`` the moment the model starts to load, so a test can check what was said before it."""
    import medusa_lib.present.startup as startup

    real = startup.load_model

    def load_model(*a, **kw):
        said.append("<the model loads>")
        return real(*a, **kw)

    monkeypatch.setattr(startup, "load_model", load_model)


def rest_beside(heads: Path) -> Path:
    from medusa_lib.core.drafters.rest import write_datastore

    return write_datastore(heads.parent / (heads.name + "-rest"), [[5, 6, 7, 8, 9, 10]] * 4, vocab_size=320)


BESIDE_DAMAGE = {
    "a cut EAGLE head": (lambda h: cut(h.parent / "heads-eagle" / "eagle.safetensors"), "The EAGLE head beside"),
    "an empty EAGLE head": (
        lambda h: (h.parent / "heads-eagle" / "eagle.safetensors").write_bytes(b""),
        "The EAGLE head beside",
    ),
    "a cut REST datastore": (lambda h: cut(rest_beside(h) / "datastore.safetensors"), "The REST datastore beside"),
    "an empty REST datastore": (
        lambda h: (rest_beside(h) / "datastore.safetensors").write_bytes(b""),
        "The REST datastore beside",
    ),
    "a REST config that is not JSON": (
        lambda h: (rest_beside(h) / "config.json").write_text("{x"),
        "The REST datastore beside",
    ),
}


@pytest.mark.parametrize("damage", list(BESIDE_DAMAGE))
def test_a_damaged_drafter_beside_the_heads_is_left_out_before_the_model_loads(
    monkeypatch, model_folder, served, damage
):
    heads, _ = served
    spoil, start_of_note = BESIDE_DAMAGE[damage]
    spoil(heads)
    said: list[str] = []
    loaded_after(monkeypatch, said)
    pg = Playground.load(
        model=str(model_folder), heads=heads, device="cpu", dtype="float32", numerics_copy=False, progress=said.append
    )
    notes = [i for i, line in enumerate(said) if line.startswith(f"note: {start_of_note}")]
    assert len(notes) == 1 and notes[0] < said.index("<the model loads>"), said
    assert "\n" not in said[notes[0]] and "Traceback" not in said[notes[0]]
    # the others are offered
    assert "medusa" in pg.drafters.available and "lookup" in pg.drafters.available
    left = "eagle" if "EAGLE" in start_of_note else "rest"
    assert left not in pg.drafters.available


HEADS_FILE_DAMAGE = {
    "cut": lambda w: cut(w),
    "empty": lambda w: w.write_bytes(b""),
    "a header that lists other shapes": lambda w: w.write_bytes(
        w.read_bytes().replace(b'"shape":[64,64]', b'"shape":[64,65]', 1)
    ),
}


@pytest.mark.parametrize("damage", list(HEADS_FILE_DAMAGE))
def test_damaged_heads_end_in_one_sentence_before_the_model_loads(monkeypatch, no_model_load, served, damage):
    heads, _ = served
    HEADS_FILE_DAMAGE[damage](heads / "medusa_lm_head.safetensors")
    message = start(monkeypatch, "--heads", str(heads), "--device", "cpu", "--dtype", "float32")
    assert message.startswith("error: ") and "\n" not in message and "Traceback" not in message, message
    assert "medusa_lm_head.safetensors" in message or "Medusa heads" in message, message


def test_heads_for_another_vocabulary_or_model_end_before_the_model_loads(
    monkeypatch, no_model_load, model_folder, tmp_path
):
    """The model's config.json is read before its weights: heads made for another vocabulary or hidden size."""
    for name, heads in (("vocab", random_heads(vocab=999)), ("hidden", random_heads(hidden=32, vocab=320))):
        folder = tmp_path / name
        heads.save(folder)
        message = start(monkeypatch, "--model", str(model_folder), "--heads", str(folder), "--device", "cpu")
        expected = "a vocabulary of 999 tokens, but the model's has 320" if name == "vocab" else "hidden size 32"
        assert message.startswith("error: ") and expected in message and "\n" not in message, message


def test_an_eagle_head_or_datastore_for_another_model_is_left_out_before_the_model_loads(
    monkeypatch, model_folder, served, tmp_path
):
    import shutil

    from conftest import make_model

    from medusa_lib.core.drafters.rest import write_datastore
    from medusa_lib.core.dynamic_tree import DynamicTreeConfig
    from medusa_lib.core.eagle import new_eagle_head

    heads, eagle = served
    shutil.rmtree(eagle)
    other = make_model("llama", hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
    new_eagle_head(other, tree=DynamicTreeConfig(top_k=2, depth=3, num_nodes=6)).save(eagle)
    write_datastore(heads.parent / "heads-rest", [[5, 6, 7, 8]] * 3, vocab_size=999)
    said: list[str] = []
    loaded_after(monkeypatch, said)
    pg = Playground.load(
        model=str(model_folder), heads=heads, device="cpu", dtype="float32", numerics_copy=False, progress=said.append
    )
    model_at = said.index("<the model loads>")
    eagle_note = next(i for i, s in enumerate(said) if s.startswith("note: The EAGLE head beside"))
    rest_note = next(i for i, s in enumerate(said) if s.startswith("note: The REST datastore beside"))
    assert eagle_note < model_at and rest_note < model_at, said
    assert "made for hidden size 32" in said[eagle_note] and "vocabulary of 999 tokens" in said[rest_note]
    assert pg.drafters.available == ("medusa", "lookup")
