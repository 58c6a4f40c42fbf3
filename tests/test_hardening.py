"""Hardening (issue #6): bad input, several users at once, Stop, memory over many runs, safe loading.

Everything runs around tiny random models made here (no network); one in-process server for the module.
"""

from __future__ import annotations

import gc
import html
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import call_api, free_port, make_model, random_heads, tiny_tokenizer
from test_playground import PROMPT, tiny_playground

from medusa_lib.present import Detokenizer, Piece, Playground, Settings, untrained_heads

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 512  # the app's max-new-tokens limit (app.py MAX_NEW_TOKENS_LIMIT)

# (case, prompt, /compare arguments that differ from API_DEFAULTS, exact message); docs/bad-input.md shows this list (test below).
TOO_DEEP = "[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]"
TOO_BIG = json.dumps([[a] for a in range(10)] + [[a, b] for a in range(10) for b in range(10)] + [[0, b, c] for b in range(10) for c in range(10)])
CASES = [
    ("empty prompt", "", {}, "The prompt is empty; type a question or pick an example."),
    ("whitespace prompt", " \n\t ", {}, "The prompt is empty; type a question or pick an example."),
    ("1 MB paste", "x" * 1_000_000, {}, "The prompt has 1,000,000 characters; the limit is 32,000: shorten it."),
    ("prompt longer than the context", " ".join(["w10"] * 600), {}, "The prompt has 602 tokens but the model's context holds 512; shorten the prompt."),
    ("max new tokens 0", PROMPT, {"max_new_tokens": 0}, f"Max new tokens must be a whole number from 1 to {LIMIT} (got 0)."),
    ("max new tokens too large", PROMPT, {"max_new_tokens": 5000}, f"Max new tokens must be a whole number from 1 to {LIMIT} (got 5000)."),
    ("max new tokens not whole", PROMPT, {"max_new_tokens": 2.5}, f"Max new tokens must be a whole number from 1 to {LIMIT} (got 2.5)."),
    ("negative temperature", PROMPT, {"temperature": -0.5}, "Temperature must be between 0 and 2 (got -0.5)."),
    ("epsilon out of range", PROMPT, {"epsilon": 1.5}, "Epsilon must be between 0 and 1 (got 1.5)."),
    ("delta out of range", PROMPT, {"delta": -0.1}, "Delta must be between 0 and 1 (got -0.1)."),
    ("tree: not JSON", PROMPT, {"custom_tree": "[[0], [0, 1"}, "The tree text is not valid JSON (Expecting ',' delimiter); write it like [[0], [0, 0], [1]]."),
    ("tree: not a list", PROMPT, {"custom_tree": '{"a": 1}'}, "The tree text must be a JSON list of nodes, like [[0], [0, 0], [1]]."),
    ("tree deeper than the heads", PROMPT, {"custom_tree": TOO_DEEP}, "The tree is 5 levels deep but the heads only predict 4 tokens ahead; use a tree of depth <= 4."),
    ("tree rank >= 10", PROMPT, {"custom_tree": "[[0], [10]]"}, "Tree node [10] uses rank 10, but ranks must be between 0 and 9 (top-10 per head)."),
    ("tree node without parent", PROMPT, {"custom_tree": "[[1], [0, 0]]"}, "Tree node [0, 0] has no parent: add [0] to the tree."),
    ("tree too large", PROMPT, {"custom_tree": TOO_BIG}, "The custom tree has 210 nodes; the limit is 128: remove some nodes."),
    ("tree nested 1,000 deep", PROMPT, {"custom_tree": "[" * 1000 + "]" * 1000}, "The tree text is nested too deeply; write it as a flat list of paths like [[0], [0, 0], [1]]."),
    ("tree nested 900 deep", PROMPT, {"custom_tree": "[" * 900 + "0" + "]" * 900}, "The tree text is nested too deeply; write it as a flat list of paths like [[0], [0, 0], [1]]."),
    ("tree nested 3 deep", PROMPT, {"custom_tree": "[[[0]]]"}, "Tree node [[0]] must contain whole-number ranks only."),
    ("lone surrogate in the prompt", "abc \ud800 def", {}, "The prompt has an invalid character at position 5 (U+D800, half of a UTF-16 pair); delete it or paste the text again."),
    ("max new tokens true", PROMPT, {"max_new_tokens": True}, f"Max new tokens must be a whole number from 1 to {LIMIT}: send a number, not true/false (got true)."),
    ("max new tokens as text", PROMPT, {"max_new_tokens": "8"}, f"Max new tokens must be a whole number from 1 to {LIMIT}: send a number, not text (got '8')."),
    ("max new tokens 1e308", PROMPT, {"max_new_tokens": 1e308}, f"Max new tokens must be a whole number from 1 to {LIMIT} (got 1e+308)."),
    ("temperature as text", PROMPT, {"temperature": "0.7"}, "Temperature must be between 0 and 2: send a number, not text (got '0.7')."),
    ("chat template as text", PROMPT, {"chat_template": "false"}, "The chat template switch (chat_template) must be true or false, not text (got 'false')."),
    ("lookup branch as a number", PROMPT, {"lookup_branch": 1}, "The lookup branch switch (lookup_branch) must be true or false, not a number (got 1)."),
    ("tree preset not text", PROMPT, {"tree": 5}, "The tree preset must be the name of a preset, not a number (got 5)."),
    ("preset name of 5,000 characters", PROMPT, {"tree": "t" * 5000}, "Unknown tree preset 'ttttttttttttttttt...tttttttttttttttttt'; choose one of: {presets}."),
]
API_ORDER = ["max_new_tokens", "temperature", "epsilon", "delta", "tree", "custom_tree", "chat_template", "lookup_branch"]
API_DEFAULTS = {"max_new_tokens": 8, "temperature": 0.7, "epsilon": 0.09, "delta": 0.3, "tree": "chain-2", "custom_tree": "", "chat_template": True, "lookup_branch": True}


def api_args(prompt: str, overrides: dict) -> list:
    return [prompt, *({**API_DEFAULTS, **overrides}[k] for k in API_ORDER)]


DOCS = ROOT / "docs" / "bad-input.md"
TABLE_START, TABLE_END = "<!-- table from tests/test_hardening.py CASES: start -->", "<!-- table from tests/test_hardening.py CASES: end -->"


def cases_table() -> str:
    rows = ["| Input | Message (page: status line + warning; `/compare`: the error) |", "|---|---|"]
    rows += [f"| {case} | {msg.format(presets='(the presets)').replace('|', '&#124;')} |" for case, _, _, msg in CASES]
    return "\n".join(rows)


def test_the_docs_table_of_bad_inputs_is_the_tests_table():
    """docs/bad-input.md shows exactly the cases tested below; UPDATE_DOCS=1 rewrites it from them."""
    assert len({c for c, *_ in CASES}) == len(CASES)
    text = DOCS.read_text(encoding="utf-8")
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    want = f"{head}{TABLE_START}\n{cases_table()}\n{TABLE_END}{tail}"
    if os.environ.get("UPDATE_DOCS") == "1":
        DOCS.write_text(want, encoding="utf-8")
    assert text == want, "docs/bad-input.md is out of date: run UPDATE_DOCS=1 pytest tests/test_hardening.py -k docs_table"


def column_text(col_html: str) -> str:
    """The visible text of a method column: the token spans' contents, unescaped."""
    return "".join(html.unescape(t) for t in re.findall(r'<span class="tok[^"]*" title="[^"]*">(.*?)</span>', col_html))


def launch(pg: Playground):
    from ui import build_demo, launch_options

    demo = build_demo(pg, max_new_tokens=16)
    port = free_port()
    demo.queue(default_concurrency_limit=1).launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **launch_options())
    return demo, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def served():
    from gradio_client import Client

    pg = tiny_playground()
    pg.max_new_tokens_limit = LIMIT
    demo, url = launch(pg)
    try:
        yield pg, url, Client(url, verbose=False)
    finally:
        demo.close()


# ------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("case, prompt, overrides, message", CASES, ids=[c[0] for c in CASES])
def test_api_bad_input_gets_its_sentence_and_the_server_keeps_serving(served, case, prompt, overrides, message):
    pg, url, client = served
    assert call_api(url, "compare", api_args(prompt, overrides)) == ("error", message.format(presets=", ".join(pg.tree_names())))
    assert client.predict(PROMPT, 2, api_name="/compare")["methods"]["plain"]["tokens"] == 2


def test_api_odd_types_get_a_sentence(served):
    from gradio_client.exceptions import AppError

    pg, _, client = served
    for args, message in [((42,), "The prompt must be text, not a number."),
                          (([PROMPT],), "The prompt must be text, not a list."),
                          ((PROMPT, 8, 0.7, 0.09, 0.3, "no-such-tree"), f"Unknown tree preset 'no-such-tree'; choose one of: {', '.join(pg.tree_names())}.")]:
        with pytest.raises(AppError) as err:
            client.predict(*args, api_name="/compare")
        assert str(err.value) == message
    out = client.predict(PROMPT, 4, 0.7, 0.09, 0.3, "chain-2", [[0], [0, 0]], api_name="/compare")  # the paths as JSON, not text: accepted
    assert out["tree"] == "custom"


def test_ui_handler_shows_each_sentence_keeps_the_previous_results_and_the_next_run_works():
    import gradio as gr

    from ui.handlers import RUN_OUTPUTS, Handlers

    pg = tiny_playground(oracle=False)
    pg.max_new_tokens_limit = LIMIT
    h = Handlers(pg)
    status = RUN_OUTPUTS.index("status")
    first = list(h.run(PROMPT, 4, 0.7, 0.09, 0.3, "chain-2", "", True, True, "Medusa greedy"))
    assert first[-1][status].startswith("Done")
    for case, prompt, overrides, message in CASES:
        message = message.format(presets=", ".join(pg.tree_names()))
        a = {**API_DEFAULTS, **overrides}
        with pytest.warns(UserWarning) as warned:  # gr.Warning outside a request is a Python warning
            outs = list(h.run(prompt, *(a[k] for k in API_ORDER), "Medusa greedy"))
        assert html.unescape(outs[-1][status]) == f"**Cannot run:** {message}", case  # escaped for the Markdown: shows as typed
        assert str(warned[-1].message) == message, case
        for out in outs:  # only the status line changes: the previous run's columns, summary and replay stay
            assert all(v == gr.skip() for i, v in enumerate(out) if i != status), case
    outs = list(h.run(PROMPT, 4, 0.7, 0.09, 0.3, "chain-2", "", True, True, "Medusa greedy"))
    assert outs[1][RUN_OUTPUTS.index("session")] is None  # a run that starts clears the session: no half-run is kept for replay
    assert outs[-1][status].startswith("Done") and set(outs[-1][RUN_OUTPUTS.index("session")]) == {"plain", "medusa-greedy", "medusa-typical"}


def test_huge_prompt_is_refused_before_tokenising(monkeypatch):
    import medusa_lib.present.playground as playground

    pg = tiny_playground(oracle=False)
    monkeypatch.setattr(playground, "chat_prompt_ids", lambda *a, **k: pytest.fail("tokenised a 1 MB prompt"))
    with pytest.raises(ValueError, match="The prompt has 1,000,000 characters; the limit is 32,000: shorten it."):
        pg.prepare("\U0001f40d" * 1_000_000, Settings())
    small = Playground(pg.model, pg.tokenizer, pg.heads, max_prompt_chars=10)  # the limit is the operator's (MEDUSA_MAX_PROMPT_CHARS)
    with pytest.raises(ValueError, match="The prompt has 11 characters; the limit is 10: shorten it."):
        small.prepare("w1 w2 w3 w4", Settings())


def test_sliding_window_model_refuses_prompts_beyond_the_window():
    from ui.handlers import RUN_OUTPUTS, Handlers

    model = make_model("mistral", sliding_window=16)
    model.generation_config.eos_token_id = model.config.eos_token_id = None
    pg = Playground(model, tiny_tokenizer(), untrained_heads(model))
    message = "The prompt has 22 tokens but the model's context holds 16 (its sliding-window attention of 16 tokens limits tree attention); shorten the prompt."
    long = " ".join(f"w{i}" for i in range(10, 30))
    with pytest.raises(ValueError) as err:
        pg.compare(long, Settings(max_new_tokens=4, tree="chain-2"))
    assert str(err.value) == message
    with pytest.warns(UserWarning):
        outs = list(Handlers(pg).run(long, 4, 0.7, 0.09, 0.3, "chain-2", "", True, True, "Medusa greedy"))
    assert html.unescape(outs[-1][RUN_OUTPUTS.index("status")]) == f"**Cannot run:** {message}"
    assert pg.compare("w10 w11", Settings(max_new_tokens=4, tree="chain-2"))["methods"]["plain"]["tokens"] >= 1  # inside the window: runs


def byte_level_tokenizer():
    """A GPT-2-style byte-level BPE (ids < 320, like the tiny models): an emoji it never saw is 4 byte tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, the cat sat on the mat. caf\u00e9 na\u00efve"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


NON_ASCII = "h\u00e9llo \U0001f980 w\u00f6rld \u2728 \u65e5\u672c\u8a9e \u0645\u0631\u062d\u0628\u0627"


def test_non_ascii_and_emoji_prompts_work_and_show_correctly():
    from ui.render import column_html

    tok = byte_level_tokenizer()
    ids = tok(NON_ASCII, add_special_tokens=False)["input_ids"]
    detok = Detokenizer(tok)
    pieces = [detok.push(i) for i in ids]
    assert "".join(pieces) == NON_ASCII and not any("\ufffd" in p for p in pieces)
    assert "" in pieces  # partial UTF-8 bytes wait for the rest of their character
    shown = column_html("plain", None, pieces=[Piece(i, p, "base", 1) for i, p in zip(ids, pieces)])
    assert column_text(shown) == NON_ASCII
    model = make_model("llama")
    pg = Playground(model, tok, untrained_heads(model))
    out = pg.compare(NON_ASCII, Settings(max_new_tokens=6, tree="chain-2", chat_template=False))
    assert out["prompt"] == NON_ASCII and all(m["tokens"] >= 1 for m in out["methods"].values())


def test_api_round_trips_non_ascii_prompts(served):
    _, _, client = served
    out = client.predict(NON_ASCII, 4, api_name="/compare")
    assert out["prompt"] == NON_ASCII and out["methods"]["plain"]["tokens"] == 4


# ------------------------------------------------------------------------------------------- startup (CLI)
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


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A tiny Llama and its tokenizer saved as a local model folder (what --model takes)."""
    folder = tmp_path_factory.mktemp("tiny-model")
    model = make_model("llama")
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


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


# ------------------------------------------------------------------------------------------- safety of the page and API
def test_api_offers_no_model_or_heads_choice(served):
    _, _, client = served
    api = client.view_api(print_info=False, return_format="dict")
    assert list(api["named_endpoints"]) == ["/compare"] and not api["unnamed_endpoints"]
    params = [p["parameter_name"] for p in api["named_endpoints"]["/compare"]["parameters"]]
    assert params == ["prompt", *API_ORDER]
    components = {c["id"]: c for c in client.config["components"]}
    for dep in client.config["dependencies"]:  # every event of the page, documented or not
        for i in dep["inputs"]:
            label = str(components[i].get("props", {}).get("label") or "").lower()
            assert not re.search(r"\b(model|heads|checkpoint|folder|file|url)\b", label), label


def script_playground() -> Playground:
    """A tiny Llama whose lm_head bias makes it write the token '<script>' every time."""
    model = make_model("llama")
    model.generation_config.eos_token_id = model.config.eos_token_id = None
    tok = tiny_tokenizer()
    old = model.lm_head
    model.lm_head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        model.lm_head.weight.copy_(old.weight)
        model.lm_head.bias.zero_()
        model.lm_head.bias[tok.convert_tokens_to_ids("<script>")] = 100.0
    return Playground(model, tok, untrained_heads(model))


def test_generated_html_shows_as_text_on_the_page_and_in_the_api():
    from gradio_client import Client

    demo, url = launch(script_playground())
    try:
        client = Client(url, verbose=False)
        out = client.predict(PROMPT, 4, api_name="/compare")
        assert out["methods"]["plain"]["text"].split() == ["<script>"] * 4  # the API returns the text itself (JSON), the caller decides how to show it
        job = client.submit(PROMPT, 4, 0.7, 0.09, 0.3, "chain-2", "", True, True, "Medusa greedy", api_name="/run")
        cols = [u[1] for u in job if isinstance(u[1], str) and 'data-state="done"' in u[1]]
    finally:
        demo.close()
    assert cols and "<script>" not in cols[-1] and cols[-1].count("&lt;script&gt;") == 4
    assert column_text(cols[-1]).split() == ["<script>"] * 4


# ------------------------------------------------------------------------------------------- several users
def count_runs(monkeypatch, pg: Playground) -> dict:
    """Wrap pg.run (the page and /compare both run through it): how many runs overlap, steps decoded,
    and whether each run's generator was closed."""
    orig, lock = Playground.run, threading.Lock()
    stats = {"active": 0, "peak": 0, "steps": 0, "closed": 0}

    def run(ids, decoders):
        with lock:
            stats["active"] += 1
            stats["peak"] = max(stats["peak"], stats["active"])
        try:
            for ev in orig(pg, ids, decoders):
                stats["steps"] += ev.kind == "step"
                yield ev
        finally:
            with lock:
                stats["active"] -= 1
                stats["closed"] += 1

    monkeypatch.setattr(pg, "run", run)
    return stats


def test_four_sessions_at_once_each_get_their_own_tokens_and_queue(served, monkeypatch):
    from gradio_client import Client
    from gradio_client.utils import Status

    pg, url, client = served
    prompts = [f"w{10 + i} w{40 + i} w{70 + i}" for i in range(4)]
    alone = [client.predict(p, 24, api_name="/compare") for p in prompts]
    stats = count_runs(monkeypatch, pg)
    clients = [Client(url, verbose=False) for _ in prompts]
    jobs = [c.submit(p, 24, api_name="/compare") for c, p in zip(clients, prompts)]
    ranks = set()
    while not all(j.done() for j in jobs):
        for j in jobs:
            s = j.status()
            if s.code == Status.IN_QUEUE and s.rank is not None:
                ranks.add(s.rank)
        time.sleep(0.005)
    together = [j.result() for j in jobs]
    for a, b in zip(alone, together):
        for m in ("plain", "medusa-greedy", "medusa-typical"):
            assert b["methods"][m]["token_ids"] == a["methods"][m]["token_ids"]
    assert len({tuple(r["methods"]["plain"]["token_ids"]) for r in together}) == 4  # four prompts, four answers
    assert stats["peak"] == 1  # concurrency_limit=1: the runs took turns on the device
    assert ranks and max(ranks) >= 1, ranks  # a waiting job was told its place in the queue


def test_four_page_sessions_at_once_see_only_their_own_text(served):
    from gradio_client import Client

    _, url, client = served
    prompts = [f"w{100 + i} w{130 + i}" for i in range(4)]
    alone = [client.predict(p, 12, 0.7, 0.09, 0.3, "chain-2", "", True, api_name="/compare")["methods"] for p in prompts]
    jobs = [Client(url, verbose=False).submit(p, 12, 0.7, 0.09, 0.3, "chain-2", "", True, True, "Medusa greedy", api_name="/run") for p in prompts]
    for job, ref in zip(jobs, alone):
        updates = list(job)
        assert job.result()[0].startswith("Done")
        for k, m in enumerate(["plain", "medusa-greedy", "medusa-typical"], start=1):
            done = [u[k] for u in updates if isinstance(u[k], str) and 'data-state="done"' in u[k]]
            assert column_text(done[-1]) == ref[m]["text"]


# ------------------------------------------------------------------------------------------- Stop
def test_stop_through_the_server_ends_the_run_and_the_next_run_works(served, monkeypatch):
    pg, _, client = served
    dep = next(d for d in client.config["dependencies"] if d.get("api_name") == "run")
    stop = [d for d in client.config["dependencies"] if d.get("cancels")]
    assert stop and dep["id"] in stop[0]["cancels"]  # the Stop button cancels the Run event
    stats = count_runs(monkeypatch, pg)
    job = client.submit(PROMPT, LIMIT, 0.7, 0.09, 0.3, "chain-2", "", True, True, "Medusa greedy", api_name="/run")
    for out in job:
        if "Running" in str(out[0]):
            break
    job.cancel()
    deadline = time.time() + 10
    while not stats["closed"] and time.time() < deadline:
        time.sleep(0.02)
    assert stats["closed"] == 1  # gradio closed the handler, which closed the decoders (their caches go with them)
    steps = stats["steps"]
    time.sleep(0.5)
    assert stats["steps"] == steps  # nothing decodes after Stop
    assert steps < 500  # stopped inside the first method: plain alone runs ~505 steps to the 512-token context
    assert client.predict(PROMPT, 4, api_name="/compare")["methods"]["plain"]["tokens"] == 4


def test_closing_the_run_handler_stops_the_decoder_at_once(monkeypatch):
    from ui.handlers import Handlers

    pg = tiny_playground(oracle=False)
    stats = count_runs(monkeypatch, pg)
    gen = Handlers(pg).run(PROMPT, 200, 0.7, 0.09, 0.3, "chain-2", "", True, True, "Medusa greedy")
    for out in gen:
        if stats["steps"] >= 3:
            break
    steps = stats["steps"]
    gen.close()  # what gradio does on Stop
    assert stats["closed"] == 1 and stats["active"] == 0 and stats["steps"] == steps
    outs = list(Handlers(pg).run(PROMPT, 4, 0.7, 0.09, 0.3, "chain-2", "", True, True, "Medusa greedy"))
    assert outs[-1][0].startswith("Done")


# ------------------------------------------------------------------------------------------- memory
def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def test_fifty_runs_do_not_grow_resident_memory():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: steady on a shared CPU
    try:
        _fifty_runs()
    finally:
        torch.set_num_threads(threads)


def _fifty_runs():
    pg = tiny_playground(oracle=False)
    settings = Settings(max_new_tokens=16, tree="topk-3x2x1")
    for _ in range(5):  # warm-up: allocator pools, lazy imports, tokenizer caches
        pg.compare(PROMPT, settings)
    gc.collect()
    before = rss_mb()
    t0 = time.perf_counter()
    for i in range(50):
        pg.compare(f"w{10 + i} w{20 + i}", settings)
    gc.collect()
    after = rss_mb()
    print(f"\nRSS before {before:.1f} MB, after 50 runs {after:.1f} MB, growth {after - before:+.1f} MB ({time.perf_counter() - t0:.1f} s)")
    assert after - before < 30


# ------------------------------------------------------------------------------------------- round 2 (issue #17)
def assert_refused_on_the_api_and_the_page(pg: Playground, client, prompt: str, message: str) -> None:
    """``/compare`` answers with ``message`` as its error, and the page's Run shows it in the status line."""
    from ui.handlers import RUN_OUTPUTS, Handlers
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as err:
        client.predict(prompt, 4, api_name="/compare")
    assert str(err.value) == message
    with pytest.warns(UserWarning):
        outs = list(Handlers(pg).run(prompt, 4, 0.7, 0.09, 0.3, "chain-2", "", True, True, "Medusa greedy"))
    assert html.unescape(outs[-1][RUN_OUTPUTS.index("status")]) == f"**Cannot run:** {message}"


def test_an_unexpected_error_is_one_sentence_on_the_page_and_in_the_api(served, monkeypatch):
    """A bug (not a bad input) still ends as one sentence; its traceback goes to the log only."""
    from ui.handlers import UNEXPECTED

    pg, _, client = served
    message = UNEXPECTED.format(name="KeyError")

    def broken(*a, **k):
        raise KeyError("a bug")

    with monkeypatch.context() as m:
        m.setattr(pg, "prepare", broken)
        assert_refused_on_the_api_and_the_page(pg, client, PROMPT, message)
    assert client.predict(PROMPT, 2, api_name="/compare")["methods"]["plain"]["tokens"] == 2  # still serving


def test_a_run_that_fails_midway_marks_its_column_stopped_and_keeps_its_tokens(monkeypatch):
    from ui.handlers import RUN_OUTPUTS, UNEXPECTED, Handlers

    pg = tiny_playground(oracle=False)
    orig = Playground.run_method

    def failing(self, decoder, ids):
        for i, ev in enumerate(orig(self, decoder, ids)):
            if decoder.method == "medusa-greedy" and i == 4:
                raise RuntimeError("boom")
            yield ev

    monkeypatch.setattr(Playground, "run_method", failing)
    monkeypatch.setattr("ui.handlers.STREAM_EVERY", 0.0)  # every step reaches the page
    with pytest.warns(UserWarning):
        outs = list(Handlers(pg).run(PROMPT, 8, 0.7, 0.09, 0.3, "chain-2", "", True, True, "Medusa greedy"))
    last = outs[-1]
    assert html.unescape(last[RUN_OUTPUTS.index("status")]) == f"**Cannot run:** {UNEXPECTED.format(name='RuntimeError')}"
    greedy = last[RUN_OUTPUTS.index("col_greedy")]
    assert 'data-state="stopped"' in greedy and column_text(greedy)  # its tokens so far stay, it no longer says running
    assert 'data-state="done"' in [o for o in outs if isinstance(o[RUN_OUTPUTS.index("col_plain")], str)][-1][RUN_OUTPUTS.index("col_plain")]


def test_stop_turns_running_and_replaying_columns_into_stopped(served):
    from ui.handlers import Handlers
    from ui.render import column_html

    pg, _, _ = served
    rec = next(e.record for e in pg.stream(PROMPT, Settings(max_new_tokens=6, tree="chain-2")) if e.kind == "step" and len(e.record.views) > 2)
    running, replay, done = (column_html("plain", rec, state=s) for s in ("running", "replay", "done"))
    waiting = column_html("medusa-typical", None)
    status, *cols = Handlers(pg).stop(running, replay, done)
    assert status.startswith("Stopped")
    for col, before in zip(cols, (running, replay)):
        assert 'data-state="stopped"' in col and "running" not in col and "cursor" not in col
        stats = lambda c: re.search(r'<div class="method-stats">(.*?)</div>', c).group(1)  # noqa: E731
        assert column_text(col) == column_text(before) and stats(col) == stats(before)  # tokens and statistics stay
    assert cols[2] == done
    assert Handlers(pg).stop(waiting, None, "")[1:] == (waiting, None, "")  # nothing running: nothing changes
    trick = column_html("plain", None, state="done", pieces=[Piece(5, '" data-state="running"><span class="method-state">running&hellip;</span>', "base", 1)])
    assert Handlers(pg).stop(trick, "", "")[1] == trick  # generated text is escaped: only the column's own state marker is read


def test_max_new_tokens_one_shows_dashes_and_says_why(served):
    from ui.handlers import RUN_OUTPUTS, Handlers

    pg, _, client = served
    out = client.predict(PROMPT, 1, api_name="/compare")
    for m in out["methods"].values():
        assert m["tokens"] == 1 and m["steps"] == 0 and m["tokens_per_second"] is None and m["tokens_per_step"] is None
    assert all(r["tokens/s"] is None and r["tokens/step"] is None and r["speedup"] is None for r in out["summary"])  # JSON null
    outs = list(Handlers(pg).run(PROMPT, 1, 0.7, 0.09, 0.3, "chain-2", "", True, True, "Medusa greedy"))
    status = outs[-1][RUN_OUTPUTS.index("status")]
    assert status == ("Done. Plain (greedy), Medusa greedy, Medusa typical made only the prefill's token (Max new tokens is 1), so there is no "
                      "decode step to time: tokens/s, tokens/step and speedup show \u2014. Raise Max new tokens to 2 or more to measure them.")
    summary = outs[-1][RUN_OUTPUTS.index("summary")]
    assert summary["tokens/s"].tolist() == ["\u2014"] * 3
    tree = outs[-1][RUN_OUTPUTS.index("tree_plot")]
    shown = html.unescape(" ".join(a.text for a in tree.layout.annotations)).replace("<br>", " ")
    assert "ended after the prefill's first token (Max new tokens is 1)" in shown and "Run the playground" not in shown


def test_race_replay_takes_turns_with_runs_in_the_device_queue():
    """A replay renders frames while it plays: in the device's queue it never runs beside a timed run."""
    from ui import build_demo

    fns = {f.api_name: f for f in build_demo(tiny_playground(oracle=False)).fns.values()}
    device = {name: (fns[name].concurrency_id, fns[name].concurrency_limit) for name in ("run", "run_1", "compare", "replay")}
    assert len(set(device.values())) == 1 and device["run"][1] == 1, device


def test_a_tiny_temperature_through_the_api_accepts_like_greedy(served):
    _, _, client = served
    out = client.predict(PROMPT, 24, 1e-40, api_name="/compare")["methods"]
    assert out["medusa-typical"]["token_ids"] == out["medusa-greedy"]["token_ids"] == out["plain"]["token_ids"]
    assert out["medusa-typical"]["tokens_per_step"] > 1.5  # was 1.0: NaN probabilities accepted nothing


def test_the_prompt_token_limit_is_measured_and_its_message_says_where_it_comes_from(served):
    from medusa_lib.present import measured_limit_why, prompt_token_limit

    pg, _, client = served
    assert prompt_token_limit(pg.model, seconds=3.0, context_limit=512) is None  # the tiny model prefills its whole context at once: the context decides
    assert prompt_token_limit(pg.model, seconds=1e-6, context_limit=512) == 256  # never below 256 tokens
    long = " ".join(["w10"] * 298)
    over_context = " ".join(["w10"] * 600)
    try:
        pg.max_prompt_tokens, pg.prompt_limit_why = 64, measured_limit_why(pg.model)
        assert_refused_on_the_api_and_the_page(pg, client, long, "The prompt has 300 tokens; this server takes at most 64 (about what its CPU prefills in 3 s; "
                                                                 "a run prefills it three times): shorten it.")
        assert_refused_on_the_api_and_the_page(pg, client, over_context, "The prompt has 602 tokens but the model's context holds 512; shorten the prompt.")
        pg.prompt_limit_why = "the limit its operator set"  # MEDUSA_MAX_PROMPT_TOKENS
        assert_refused_on_the_api_and_the_page(pg, client, long, "The prompt has 300 tokens; this server takes at most 64 (the limit its operator set): shorten it.")
    finally:
        pg.max_prompt_tokens = None
    assert client.predict(long, 2, api_name="/compare")["methods"]["plain"]["tokens"] == 2


class QuadraticPrefill(torch.nn.Module):
    """A stand-in model whose prefill of n tokens takes a*n + b*n^2 seconds on a fake clock."""

    def __init__(self, a: float, b: float):
        super().__init__()
        self.embed, self.a, self.b, self.clock = torch.nn.Embedding(320, 4), a, b, 0.0

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, logits_to_keep=1):
        n = input_ids.shape[1]
        self.clock += self.a * n + self.b * n * n


def test_the_prompt_token_limit_solves_the_measured_prefill_cost(monkeypatch):
    import medusa_lib.present.playground as playground

    for a, b, seconds in [(1e-3, 1.6e-7, 3.0), (1e-3, 0.0, 3.0), (2e-4, 5e-8, 2.0)]:
        model = QuadraticPrefill(a, b)
        monkeypatch.setattr(playground, "_sync", lambda device, m=model: m.clock)
        n = (-a + (a * a + 4 * b * seconds) ** 0.5) / (2 * b) if b else seconds / a  # a*n + b*n^2 = seconds
        want = int(n // 256 * 256)
        assert playground.prompt_token_limit(model, seconds=seconds, context_limit=32768) == want, (a, b)
        assert playground.prompt_token_limit(model, seconds=seconds, context_limit=want + 1) is None  # the context decides


def test_a_long_run_gives_memory_back_and_a_short_one_does_not(monkeypatch):
    import medusa_lib.present.playground as playground

    trims = []
    monkeypatch.setattr(playground, "_malloc_trim", lambda pad: trims.append(pad))
    pg = tiny_playground(oracle=False)
    pg.compare(PROMPT, Settings(max_new_tokens=8, tree="chain-2"))
    assert trims == []
    pg.compare(" ".join(["w10"] * 400), Settings(max_new_tokens=playground.LONG_RUN_TOKENS, tree="chain-2"))
    assert trims == [0]
    gen = pg.stream(PROMPT, Settings(max_new_tokens=playground.LONG_RUN_TOKENS, tree="chain-2"))
    next(gen), next(gen)
    gen.close()  # Stop: the memory goes back too
    assert trims == [0, 0]


def test_stop_waits_for_the_cancelled_run_and_shows_the_columns_it_last_sent(monkeypatch):
    """Stop's update and the cancelled run's last frames travel separately: Stop must not answer before
    the run has ended, and must show the run's last columns (not the older ones the click carried)."""
    from types import SimpleNamespace

    from ui.handlers import RUN_OUTPUTS, Handlers
    from ui.render import stopped_column

    monkeypatch.setattr("ui.handlers.STREAM_EVERY", 0.0)  # every step is a frame
    h = Handlers(tiny_playground(oracle=False))
    me, other = SimpleNamespace(session_hash="me"), SimpleNamespace(session_hash="other")
    theirs = list(h.run(PROMPT, 3, 0.7, 0.09, 0.3, "chain-2", "", True, True, "Medusa greedy", request=other))  # another user's finished run
    gen = h.run(PROMPT, 200, 0.7, 0.09, 0.3, "chain-2", "", True, True, "Medusa greedy", request=me)
    plain = RUN_OUTPUTS.index("col_plain")
    frames = [next(gen) for _ in range(6)]
    at_click = [[f[RUN_OUTPUTS.index(c)] for f in frames if isinstance(f[RUN_OUTPUTS.index(c)], str)][-1] for c in ("col_plain", "col_greedy", "col_typical")]  # what the page holds
    answer = {}
    stopper = threading.Thread(target=lambda: answer.update(out=h.stop(*at_click, request=me)))
    stopper.start()
    time.sleep(0.3)
    assert stopper.is_alive()  # waiting for the run to end
    last = next(gen)  # a frame the run sends after the click
    assert last[plain] != at_click[0]
    gen.close()  # what gradio's cancel does
    stopper.join(5)
    status, *cols = answer["out"]
    assert status.startswith("Stopped") and cols[0] == stopped_column(last[plain]) and 'data-state="stopped"' in cols[0]
    assert cols[1:] == at_click[1:]  # not started yet: still waiting
    their_page = [[f[RUN_OUTPUTS.index(c)] for f in theirs if isinstance(f[RUN_OUTPUTS.index(c)], str)][-1] for c in ("col_plain", "col_greedy", "col_typical")]
    t0 = time.perf_counter()
    assert list(h.stop(*their_page, request=other)[1:]) == their_page  # nothing running there: done columns stay, at once
    assert time.perf_counter() - t0 < 1 and all('data-state="done"' in c for c in their_page)


def test_out_of_memory_on_cpu_or_gpu_gets_the_memory_sentence_and_a_bug_the_unexpected_one(caplog):
    from ui.handlers import OUT_OF_MEMORY, UNEXPECTED, cannot_run, no_step_message

    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate 9663676416 bytes.")
    for e in (cpu, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), MemoryError()):
        assert cannot_run(e) == OUT_OF_MEMORY
    assert cannot_run(RuntimeError("shape mismatch")) == UNEXPECTED.format(name="RuntimeError")
    assert "shape mismatch" in caplog.text  # the bug's details go to the log
    pg = tiny_playground(oracle=False)
    rec = next(e.record for e in pg.stream(PROMPT, Settings(max_new_tokens=1, tree="chain-2")) if e.kind == "end")
    assert no_step_message(rec).endswith("no Medusa step to inspect. Raise Max new tokens and run again.")
    eos_rec = replace(rec, views=(replace(rec.views[0], step=replace(rec.views[0].step, finish_reason="eos")),))
    assert no_step_message(eos_rec).endswith("(the model ended its answer at once): no Medusa step to inspect.")  # no advice that would not help
