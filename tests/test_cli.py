"""Start-up from the command line: one sentence and exit code 1 for bad flags, overrides, models or heads,
safe defaults."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import free_port, random_heads

from medusa_lib.present import Playground

ROOT = Path(__file__).resolve().parents[1]


def load_app_module(monkeypatch, **env):
    """app.py as a fresh module (its constants read the environment at import)."""
    for k in ("MEDUSA_HOST", "GRADIO_SERVER_NAME", "MEDUSA_SHARE", "MEDUSA_TRUST_REMOTE_CODE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("app_cli", ROOT / "app.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def start(monkeypatch, *argv: str, **env: str) -> str:
    """Run app.py's main() in-process (``env``: its environment overrides) until it exits; return the exit
    message. On a free port unless ``argv`` names one: app.py refuses a busy port before it loads anything, and
    7860 may be taken here."""
    app_cli = load_app_module(monkeypatch, **env)
    port = [] if "--port" in argv else ["--port", str(free_port())]
    with pytest.raises(SystemExit) as err:
        app_cli.main([*argv, *port])
    return str(err.value.code)


def test_cli_mismatched_heads_exit_with_one_sentence(model_folder, tmp_path):
    heads = random_heads(hidden=32)
    heads.save(tmp_path / "heads")
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "app.py"),
            "--model",
            str(model_folder),
            "--heads",
            str(tmp_path / "heads"),
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert (
        out.stderr.strip().splitlines()[-1]
        == "error: These Medusa heads were made for hidden size 32, but the model has hidden size 64; "
        "load heads trained for this model."
    )


def test_cli_unknown_model_or_heads_exit_with_one_sentence(monkeypatch, model_folder, tmp_path):
    assert start(monkeypatch, "--model", "nobody/no-such-model", "--device", "cpu") == (
        "error: Model 'nobody/no-such-model' is neither a local folder nor in the Hugging Face cache, "
        "and the Hub cannot be reached; "
        "give a local folder, or check the id and the connection."
    )
    missing = str(tmp_path / "no-such-folder")
    assert start(monkeypatch, "--model", missing, "--device", "cpu") == (
        f"error: No model folder at {missing!r}; give a folder with config.json and the weights, "
        "or a Hub id such as HuggingFaceTB/SmolLM2-135M-Instruct."
    )
    assert start(monkeypatch, "--model", str(model_folder), "--heads", missing, "--device", "cpu").startswith(
        f"error: No Medusa heads found at {missing!r}"
    )
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "config.json").write_text("{not json")
    (damaged / "medusa_lm_head.safetensors").write_bytes(b"garbage")
    assert start(monkeypatch, "--model", str(model_folder), "--heads", str(damaged), "--device", "cpu").startswith(
        f"error: Could not read the Medusa heads at {damaged}"
    )


class Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):  # unpickling this would run a shell command
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_heads_are_refused_at_startup(monkeypatch, model_folder, tmp_path):
    folder, marker = tmp_path / "evil-heads", tmp_path / "pwned"
    random_heads().save(folder)
    (folder / "medusa_lm_head.safetensors").unlink()
    torch.save({"medusa_head.0.0.linear.weight": Evil(marker)}, folder / "medusa_lm_head.pt")
    message = start(monkeypatch, "--model", str(model_folder), "--heads", str(folder), "--device", "cpu")
    assert message == (
        "error: medusa_lm_head.pt is not a plain tensor checkpoint and is not loaded, for safety (UnpicklingError); "
        "save the heads as a state dict of tensors."
    )
    assert not marker.exists()


def test_loopback_by_default_share_and_remote_code_opt_in(monkeypatch):
    args = load_app_module(monkeypatch).parse_args([])
    assert (args.host, args.share, args.trust_remote_code) == ("127.0.0.1", False, False)
    args = load_app_module(monkeypatch).parse_args(["--share", "--trust-remote-code"])
    assert (args.share, args.trust_remote_code) == (True, True)


def test_trust_remote_code_reaches_load_model_only_when_asked(monkeypatch):
    import medusa_lib.present.playground as playground
    from medusa_lib.core.model import ModelError

    seen = []

    def fake_load_model(name, **kw):
        seen.append(kw["trust_remote_code"])
        raise ModelError("stop here.")

    monkeypatch.setattr(playground, "load_model", fake_load_model)
    assert start(monkeypatch, "--model", "x") == "error: stop here."
    assert start(monkeypatch, "--model", "x", "--trust-remote-code") == "error: stop here."
    assert seen == [False, True]


def test_the_app_s_defaults_are_the_library_s(monkeypatch):
    """One set of limits: app.py spells its defaults out (so --help imports nothing heavy); they must be the
    presenter's."""
    from medusa_lib.present import MAX_NEW_TOKENS_LIMIT, MAX_PROMPT_CHARS, MAX_RUN_SECONDS, Settings

    app_cli = load_app_module(monkeypatch)
    for k in (
        "MEDUSA_MAX_NEW_TOKENS",
        "MEDUSA_MAX_NEW_TOKENS_LIMIT",
        "MEDUSA_MAX_PROMPT_CHARS",
        "MEDUSA_MAX_PROMPT_TOKENS",
        "MEDUSA_MAX_RUN_SECONDS",
    ):
        assert k not in os.environ
    assert (
        app_cli.MAX_NEW_TOKENS,
        app_cli.MAX_NEW_TOKENS_LIMIT,
        app_cli.MAX_PROMPT_CHARS,
        app_cli.MAX_RUN_SECONDS,
    ) == (Settings().max_new_tokens, MAX_NEW_TOKENS_LIMIT, MAX_PROMPT_CHARS, MAX_RUN_SECONDS)
    assert app_cli.MAX_PROMPT_TOKENS == "auto"


# ------------------------------------------------------------------ start-up: one sentence per bad flag or override
SERVING_ENV = (
    "MEDUSA_PORT",
    "GRADIO_SERVER_PORT",
    "MEDUSA_MAX_NEW_TOKENS",
    "MEDUSA_MAX_NEW_TOKENS_LIMIT",
    "MEDUSA_MAX_PROMPT_CHARS",
    "MEDUSA_MAX_PROMPT_TOKENS",
    "MEDUSA_MAX_RUN_SECONDS",
    "MEDUSA_MAX_QUEUE_PER_ADDRESS",
)


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("MEDUSA_PORT", "abc", "error: MEDUSA_PORT='abc' is not a whole number from 1 to 65535; fix it or unset it."),
        (
            "MEDUSA_PORT",
            "99999",
            "error: MEDUSA_PORT='99999' is not a whole number from 1 to 65535; fix it or unset it.",
        ),
        (
            "GRADIO_SERVER_PORT",
            "-5",
            "error: GRADIO_SERVER_PORT='-5' is not a whole number from 1 to 65535; fix it or unset it.",
        ),
        (
            "MEDUSA_MAX_NEW_TOKENS_LIMIT",
            "0",
            "error: MEDUSA_MAX_NEW_TOKENS_LIMIT='0' is not a whole number from 1 up; fix it or unset it.",
        ),
        (
            "MEDUSA_MAX_NEW_TOKENS",
            "ten",
            "error: MEDUSA_MAX_NEW_TOKENS='ten' is not a whole number from 1 up; fix it or unset it.",
        ),
        (
            "MEDUSA_MAX_PROMPT_CHARS",
            "1e5",
            "error: MEDUSA_MAX_PROMPT_CHARS='1e5' is not a whole number from 1 up; fix it or unset it.",
        ),
        (
            "MEDUSA_MAX_PROMPT_TOKENS",
            "abc",
            "error: MEDUSA_MAX_PROMPT_TOKENS='abc' is not a whole number from 1 up (or auto); fix it or unset it.",
        ),
        (
            "MEDUSA_MAX_RUN_SECONDS",
            "0",
            "error: MEDUSA_MAX_RUN_SECONDS='0' is not a finite number of at least 1; fix it or unset it.",
        ),
        (
            "MEDUSA_MAX_RUN_SECONDS",
            "inf",
            "error: MEDUSA_MAX_RUN_SECONDS='inf' is not a finite number of at least 1; fix it or unset it.",
        ),
        (
            "MEDUSA_MAX_RUN_SECONDS",
            "nan",
            "error: MEDUSA_MAX_RUN_SECONDS='nan' is not a finite number of at least 1; fix it or unset it.",
        ),
        (
            "MEDUSA_MAX_RUN_SECONDS",
            "1e999",
            "error: MEDUSA_MAX_RUN_SECONDS='1e999' is not a finite number of at least 1; fix it or unset it.",
        ),
        (
            "MEDUSA_MAX_QUEUE_PER_ADDRESS",
            "0",
            "error: MEDUSA_MAX_QUEUE_PER_ADDRESS='0' is not a whole number from 1 up; fix it or unset it.",
        ),
        ("MEDUSA_SHARE", "true", "error: MEDUSA_SHARE='true' must be 1 (on) or 0 (off); fix it or unset it."),
    ],
)
def test_a_bad_environment_override_is_one_sentence_naming_it(monkeypatch, name, value, message):
    for k in SERVING_ENV:
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(SystemExit) as err:
        load_app_module(monkeypatch, **{name: value})
    assert str(err.value.code) == message


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if app.py gets as far as loading a model: these flags must be refused before."""
    import medusa_lib.present.playground as playground

    def load_model(*a, **kw):
        raise AssertionError("the model was loaded before the bad flag was refused")

    monkeypatch.setattr(playground, "load_model", load_model)
    for k in SERVING_ENV + ("MEDUSA_DEVICE", "MEDUSA_CAPTURE", "MEDUSA_CACHE"):
        monkeypatch.delenv(k, raising=False)


def test_bad_serving_flags_are_refused_before_the_model_loads(monkeypatch, no_model_load):
    import socket

    assert start(monkeypatch, "--port", "99999") == "error: --port must be a port from 1 to 65535 (got 99999)."
    assert start(monkeypatch, "--port", "-5") == "error: --port must be a port from 1 to 65535 (got -5)."
    assert (
        start(monkeypatch, "--host", "8.8.8.8")
        == "error: --host '8.8.8.8' is not an address of this machine; use 127.0.0.1, or 0.0.0.0 to serve the network."
    )
    # GRADIO_SERVER_NAME (what a Space sets) is read like MEDUSA_HOST
    assert (
        start(monkeypatch, GRADIO_SERVER_NAME="8.8.8.8")
        == "error: GRADIO_SERVER_NAME '8.8.8.8' is not an address of this machine; "
        "use 127.0.0.1, or 0.0.0.0 to serve the network."
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert (
            start(monkeypatch, "--port", str(port))
            == f"error: --port {port} is in use on 127.0.0.1; stop what serves there or pick another --port."
        )
    assert (
        start(monkeypatch, "--capture", "cuda-graph", "--device", "cpu")
        == "error: CUDA-graph capture needs a GPU; use --capture none or compile on a CPU."
    )
    assert start(monkeypatch, "--device", "tpu9") == "error: Unknown device 'tpu9'; use cpu, cuda, cuda:0 or auto."
    assert (
        start(monkeypatch, "--dtype", "float8")
        == "error: Unknown dtype 'float8'; use one of float32, bfloat16, float16 or auto."
    )


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


# ------------------------------------------------------------------ start-up: damaged heads, trees, EAGLE heads, models
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


@pytest.mark.parametrize("name, value", [("MEDUSA_CACHE", "bogus"), ("MEDUSA_CAPTURE", "graphs")])
def test_a_bad_cache_or_capture_override_names_the_variable(monkeypatch, no_model_load, name, value):
    choices = "auto, dynamic, static" if name == "MEDUSA_CACHE" else "auto, none, compile, cuda-graph"
    assert start(monkeypatch, **{name: value}) == (
        f"error: {name}={value!r} must be one of {choices}; fix it or unset it."
    )


def test_a_bad_device_override_names_the_variable(monkeypatch, no_model_load):
    assert start(monkeypatch, MEDUSA_DEVICE="tpu9") == (
        "error: MEDUSA_DEVICE='tpu9': Unknown device 'tpu9'; use cpu, cuda, cuda:0 or auto."
    )


# ------------------------------------------------------------------ the pipeline's command lines: bench, page_check
@pytest.fixture
def cli_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text("{x\n")
    (tmp_path / "no-prompt.jsonl").write_text('{"id": 1}\n')
    (tmp_path / "nested.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    (tmp_path / "nested-prompt.jsonl").write_text('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    (tmp_path / "good.jsonl").write_text('{"id": "a", "category": "c", "prompt": "w5 w6"}\n')
    (tmp_path / "afile").write_text("x")
    return tmp_path


BAD_RUNS = [  # (arguments, the message's start; {t}: the tmp folder); refused before the model loads
    (["--prompts", "{t}/missing.jsonl"], "error: --prompts '{t}/missing.jsonl' is not a file; give a JSONL file"),
    (["--prompts", "{t}/empty.jsonl"], "error: --prompts '{t}/empty.jsonl' holds no prompts; give a JSONL file"),
    (["--prompts", "{t}/bad.jsonl"], "error: --prompts '{t}/bad.jsonl' cannot be read as JSONL (JSONDecodeError: "),
    (
        ["--prompts", "{t}/no-prompt.jsonl"],
        'error: --prompts \'{t}/no-prompt.jsonl\': its entry 1 is not an object with a "prompt" text ({{"id": 1}}).',
    ),
    (
        ["--prompts", "{t}/nested.jsonl"],
        "error: --prompts '{t}/nested.jsonl' cannot be read as JSONL (a line is nested too deeply); "
        "give one JSON object a line.",
    ),
    (
        ["--prompts", "{t}/nested-prompt.jsonl"],
        "error: --prompts '{t}/nested-prompt.jsonl' cannot be read as JSONL (a line is nested too deeply); ",
    ),
    (["--json", "{t}/afile/out.json"], "error: --json '{t}/afile/out.json' is under '{t}/afile', which is a file"),
    (["--json", "/proc/medusa.json"], "error: --json '/proc/medusa.json' cannot be written: '/proc' takes no files"),
    (["--heads", "{t}/no-heads"], "error: --heads '{t}/no-heads' does not exist; give the folder of trained heads"),
    (["--device", "tpu9"], "error: Unknown device 'tpu9'; use cpu, cuda, cuda:0 or auto."),
]
BENCH_ONLY = [
    (["--tree", "nosuch"], "error: --tree 'nosuch' is not a tree preset; choose one of: calibrated-3, "),
    (["--repeats", "0"], "argument --repeats: must be a whole number of at least 1 (got 0)"),
    (["--limit", "-1"], "argument --limit: must be a whole number of at least 0 (got -1)"),
    (["--lookup", "99"], "argument --lookup: must be a whole number from 0 to 8 (got 99)"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be a whole number of at least 1 (got 0)"),
]


def run_cli(main, argv, capsys) -> str:
    """A pipeline CLI's main() until it exits: its error sentence (argparse's on stderr)."""
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code != 0
    text = str(err.value.code) if isinstance(err.value.code, str) else capsys.readouterr().err.strip().splitlines()[-1]
    assert "Traceback" not in text
    return text


@pytest.mark.parametrize("argv, message", BAD_RUNS + BENCH_ONLY)
def test_bench_refuses_bad_arguments_before_the_model_loads(monkeypatch, capsys, cli_files, argv, message):
    from medusa_lib.pipeline import bench

    monkeypatch.setattr(bench, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    base = ["--prompts", str(cli_files / "good.jsonl"), "--methods", "baseline,medusa-greedy"]
    said = run_cli(bench.main, base + [a.format(t=cli_files) for a in argv], capsys)
    assert message.format(t=cli_files) in said, said


@pytest.mark.parametrize("argv, message", BAD_RUNS + BENCH_ONLY[-1:])
def test_page_check_refuses_bad_arguments_before_the_model_loads(monkeypatch, capsys, cli_files, argv, message):
    from medusa_lib.pipeline import page_check

    monkeypatch.setattr(page_check.Playground, "load", lambda *a, **k: pytest.fail("the model loaded"))
    base = ["--prompts", str(cli_files / "good.jsonl"), "--no-examples"]
    said = run_cli(page_check.main, base + [a.format(t=cli_files) for a in argv], capsys)
    assert message.format(t=cli_files) in said, said


@pytest.mark.parametrize("tool", ["bench", "page_check"])
def test_a_folder_without_a_model_or_heads_with_a_bad_config_is_one_sentence(capsys, cli_files, model_folder, tool):
    import importlib

    main = importlib.import_module(f"medusa_lib.pipeline.{tool}").main
    base = ["--prompts", str(cli_files / "good.jsonl"), "--device", "cpu", "--dtype", "float32"]
    base += ["--methods", "baseline,medusa-greedy"] if tool == "bench" else ["--no-examples", "--numerics", "float32"]
    assert run_cli(main, base + ["--model", "/etc"], capsys).startswith(
        "error: The folder '/etc' has no config.json, so it holds no model"
    )
    heads = cli_files / "heads"
    random_heads().save(heads)
    (heads / "config.json").write_text("[]")
    said = run_cli(main, base + ["--model", str(model_folder), "--heads", str(heads)], capsys)
    assert said == f"error: {heads}/config.json holds a list, not an object of settings; " + (
        "copy the heads again or train new ones."
    )


# ------------------------------------------------------------------ calibrate and profile_step
@pytest.mark.parametrize(
    "tool, argv, message",
    [
        ("calibrate", ["--prompts", "{t}/missing.jsonl"], "error: --prompts '{t}/missing.jsonl' is not a file; "),
        ("calibrate", ["--prompts", "{t}/nested.jsonl"], "error: --prompts '{t}/nested.jsonl' cannot be read as JSONL"),
        ("calibrate", ["--answers", "{t}/bad.jsonl"], "error: --answers '{t}/bad.jsonl' cannot be read as JSONL"),
        ("calibrate", ["--heads", "{t}/no-heads"], "error: --heads '{t}/no-heads' does not exist; give the folder"),
        ("calibrate", ["--device", "tpu9"], "error: Unknown device 'tpu9'; use cpu, cuda, cuda:0 or auto."),
        ("calibrate", ["--cache", "bogus"], "argument --cache: invalid choice: 'bogus'"),
        ("profile_step", ["--heads", "{t}/no-heads"], "error: --heads '{t}/no-heads' does not exist; give the folder"),
        ("profile_step", ["--device", "tpu9"], "error: Unknown device 'tpu9'; use cpu, cuda, cuda:0 or auto."),
        ("profile_step", ["--cache", "bogus"], "argument --cache: invalid choice: 'bogus'"),
        ("profile_step", ["--max-new-tokens", "0"], "argument --max-new-tokens: must be a whole number of at least 1"),
    ],
)
def test_calibrate_and_profile_step_refuse_bad_arguments_before_the_model_loads(
    monkeypatch, capsys, cli_files, tool, argv, message
):
    import importlib

    module = importlib.import_module(f"medusa_lib.pipeline.{tool}")
    monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    base = ["--prompts", str(cli_files / "good.jsonl")] if tool == "calibrate" else []
    said = run_cli(module.main, base + [a.format(t=cli_files) for a in argv], capsys)
    assert message.format(t=cli_files) in said, said


@pytest.mark.parametrize("tool", ["calibrate", "profile_step"])
def test_calibrate_and_profile_step_say_a_bad_model_or_heads_in_one_sentence(capsys, cli_files, model_folder, tool):
    import importlib

    main = importlib.import_module(f"medusa_lib.pipeline.{tool}").main
    base = (["--prompts", str(cli_files / "good.jsonl")] if tool == "calibrate" else []) + ["--device", "cpu"]
    assert run_cli(main, base + ["--model", "/etc"], capsys).startswith(
        "error: The folder '/etc' has no config.json, so it holds no model"
    )
    heads = cli_files / "heads"
    random_heads().save(heads)
    (heads / "config.json").write_text("[]")
    said = run_cli(main, base + ["--model", str(model_folder), "--heads", str(heads), "--dtype", "float32"], capsys)
    assert said == f"error: {heads}/config.json holds a list, not an object of settings; " + (
        "copy the heads again or train new ones."
    )
