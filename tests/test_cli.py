"""Start-up from the command line: one sentence and exit code 1 for bad models or heads, safe defaults."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import random_heads

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


def start(monkeypatch, *argv: str) -> str:
    """Run app.py's main() in-process until it exits; return the exit message."""
    app_cli = load_app_module(monkeypatch)
    with pytest.raises(SystemExit) as err:
        app_cli.main(list(argv))
    return str(err.value.code)


def test_cli_mismatched_heads_exit_with_one_sentence(model_folder, tmp_path):
    heads = random_heads(hidden=32)
    heads.save(tmp_path / "heads")
    out = subprocess.run([sys.executable, str(ROOT / "app.py"), "--model", str(model_folder), "--heads", str(tmp_path / "heads"), "--device", "cpu", "--dtype", "float32"],
                         capture_output=True, text=True, timeout=180, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == "error: These Medusa heads were made for hidden size 32, but the model has hidden size 64; load heads trained for this model."


def test_cli_unknown_model_or_heads_exit_with_one_sentence(monkeypatch, model_folder, tmp_path):
    assert start(monkeypatch, "--model", "nobody/no-such-model", "--device", "cpu") == (
        "error: Model 'nobody/no-such-model' is neither a local folder nor in the Hugging Face cache, and the Hub cannot be reached; "
        "give a local folder, or check the id and the connection.")
    missing = str(tmp_path / "no-such-folder")
    assert start(monkeypatch, "--model", missing, "--device", "cpu") == (
        f"error: No model folder at {missing!r}; give a folder with config.json and the weights, or a Hub id such as HuggingFaceTB/SmolLM2-135M-Instruct.")
    assert start(monkeypatch, "--model", str(model_folder), "--heads", missing, "--device", "cpu").startswith(f"error: No Medusa heads found at {missing!r}")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "config.json").write_text("{not json")
    (damaged / "medusa_lm_head.safetensors").write_bytes(b"garbage")
    assert start(monkeypatch, "--model", str(model_folder), "--heads", str(damaged), "--device", "cpu").startswith(f"error: Could not read the Medusa heads at {damaged}")


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
    assert message == ("error: medusa_lm_head.pt is not a plain tensor checkpoint and is not loaded, for safety (UnpicklingError); "
                       "save the heads as a state dict of tensors.")
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
    """One set of limits: app.py spells its defaults out (so --help imports nothing heavy); they must be the presenter's."""
    from medusa_lib.present import MAX_NEW_TOKENS_LIMIT, MAX_PROMPT_CHARS, Settings

    app_cli = load_app_module(monkeypatch)
    for k in ("MEDUSA_MAX_NEW_TOKENS", "MEDUSA_MAX_NEW_TOKENS_LIMIT", "MEDUSA_MAX_PROMPT_CHARS", "MEDUSA_MAX_PROMPT_TOKENS"):
        assert k not in os.environ
    assert (app_cli.MAX_NEW_TOKENS, app_cli.MAX_NEW_TOKENS_LIMIT, app_cli.MAX_PROMPT_CHARS) == (Settings().max_new_tokens, MAX_NEW_TOKENS_LIMIT, MAX_PROMPT_CHARS)
    assert app_cli.MAX_PROMPT_TOKENS == "auto"
