"""What the start-up tests of app.py share: app.py as a fresh module, its main() run until it exits, and the
environment variables of its serving limits."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import ROOT, free_port


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
