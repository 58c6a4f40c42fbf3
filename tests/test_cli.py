"""Start-up from the command line: one sentence and exit code 1 for bad flags, overrides, models or heads,
safe defaults. Damaged model, heads and EAGLE files are in test_cli_damaged.py, the pipeline's command lines
(bench, page_check, calibrate, profile_step) in test_cli_pipeline.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import SERVING_ENV, load_app_module, start
from conftest import ROOT, free_port, random_heads


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
    import medusa_lib.present.startup as startup
    from medusa_lib.core.model import ModelError

    seen = []

    def fake_load_model(name, **kw):
        seen.append(kw["trust_remote_code"])
        raise ModelError("stop here.")

    monkeypatch.setattr(startup, "load_model", fake_load_model)
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
