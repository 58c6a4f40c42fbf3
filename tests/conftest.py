"""Shared fixtures: tiny random causal LMs of each supported family, made in the test (no network)."""

from __future__ import annotations

import html
import os
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# the app's start-up timing of trees (present/fit.py) writes to the user cache: tests that want it ask for it
os.environ.setdefault("MEDUSA_MACHINE_FIT", "off")
# one thread per worker when pytest-xdist runs the suite in several processes (make test: one per core), else two
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1))

from medusa_lib import DecodeConfig, HeadsConfig, MedusaHeads  # noqa: E402
from medusa_lib.core.compose import make_decoder
from medusa_lib.present import Playground, untrained_heads  # noqa: E402

VOCAB = 320
HIDDEN = 64


def make_model(arch: str, *, attn: str = "sdpa", seed: int = 0, **overrides):
    """A 2-layer random model of family ``arch`` (llama with GQA, qwen2, gpt2, mistral)."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, attn_implementation=attn, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    # the Llama-like families: one size, their own grouped-query attention
    decoder = dict(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=512,
        initializer_range=0.1,
        **common,
    )
    if arch == "llama":
        cfg, cls = LlamaConfig(num_key_value_heads=2, **decoder), LlamaForCausalLM
    elif arch == "qwen2":
        cfg, cls = Qwen2Config(num_key_value_heads=1, **decoder), Qwen2ForCausalLM
    elif arch == "gpt2":
        cfg = GPT2Config(n_embd=HIDDEN, n_layer=2, n_head=4, n_positions=512, initializer_range=0.1, **common)
        cls = GPT2LMHeadModel
    elif arch == "mistral":
        cfg, cls = MistralConfig(num_key_value_heads=2, **decoder), MistralForCausalLM
    else:
        raise ValueError(arch)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cls(cfg).eval()


def random_heads(
    num_heads: int = 4,
    *,
    shared: bool = False,
    seed: int = 1,
    hidden: int = HIDDEN,
    vocab: int = VOCAB,
    root: bool = False,
    path: bool = False,
) -> MedusaHeads:
    """Heads with random weights everywhere: their proposals are mostly wrong. ``path`` implies ``root``."""
    torch.manual_seed(seed)
    heads = MedusaHeads(
        HeadsConfig(
            hidden_size=hidden,
            vocab_size=vocab,
            num_heads=num_heads,
            shared_lm_head=shared,
            root_conditioned=root or path,
            path_conditioned=path,
        )
    )
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return heads.eval()


class OracleHeads(MedusaHeads):
    """Heads rigged to propose the model's own future greedy tokens, so long paths get accepted.

    They recognise the position t of the hidden state they are given (nearest recorded final
    hidden state of the greedy sequence) and put token t+k+1 among head k's top-k, at rank 1
    when (t + k) % 4 == 0 and rank 0 otherwise, so that non-top-1 branches are exercised too.
    """

    def __init__(self, model, sequence: list[int], num_heads: int = 4):
        super().__init__(
            HeadsConfig(
                hidden_size=model.config.hidden_size,
                vocab_size=model.get_output_embeddings().weight.shape[0],
                num_heads=num_heads,
            )
        )
        with torch.no_grad():
            self.recorded = model.base_model(input_ids=torch.tensor([sequence])).last_hidden_state[0]
        self.sequence = sequence
        self.vocab = model.get_output_embeddings().weight.shape[0]

    @torch.no_grad()
    def propose(self, h, lm_head, *, topk, num_heads=None, root_emb=None, path_emb=None):
        if h.dim() > 1:  # a batch of hidden states (calibration)
            return torch.stack([self.propose(x, lm_head, topk=topk, num_heads=num_heads) for x in h])
        n = self.num_heads if num_heads is None else num_heads
        t = int((self.recorded - h.float()).norm(dim=-1).argmin())
        out = torch.empty(n, topk, dtype=torch.long)
        for k in range(1, n + 1):
            true = self.sequence[t + k + 1] if t + k + 1 < len(self.sequence) else 0
            fillers = [(true + 1 + j) % self.vocab for j in range(topk)]
            rank = 1 if (t + k) % 4 == 0 else 0
            row = fillers[: topk - 1]
            row.insert(rank, true)
            out[k - 1] = torch.tensor(row[:topk])
        return out


TRICKY = ["<script>", "</script>", "a&b", '"quote"', "<br>", "\u00e9t\u00e9"]  # tokens the page must show as text


def pairwise(*axes: list) -> list[tuple]:
    """Rows of the product of ``axes`` that hold every pair of values of every two axes at least once
    (a covering array, built greedily in product order, so always the same rows): the whole product
    where a test's cost is in its rows, when the faults it guards depend on two settings at a time."""
    from itertools import combinations, product

    rows = list(product(*axes))
    todo = {(a, b, row[a], row[b]) for row in rows for a, b in combinations(range(len(axes)), 2)}
    chosen = []
    while todo:
        best = max(rows, key=lambda r: sum((a, b, r[a], r[b]) in todo for a, b in combinations(range(len(r)), 2)))
        chosen.append(best)
        todo -= {(a, b, best[a], best[b]) for a, b in combinations(range(len(best)), 2)}
    return chosen


def tiny_tokenizer():
    """A word-level tokenizer whose 320 ids match the tiny models (ids 0-2: pad, bos, eos), with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>", *TRICKY]
    words += [f"w{i}" for i in range(VOCAB - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.chat_template = (
        "{% for m in messages %}<s> {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w1 {% endif %}"
    )
    return fast


def free_port() -> int:
    """A free TCP port on the loopback interface, for an in-process server."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def llama():
    return make_model("llama")


def call_api(url: str, api_name: str, args: list, *, timeout: float = 120) -> tuple[str, object]:
    """One call of a named endpoint over plain HTTP, as any client may make it: ("complete", the
    result) or ("error", the message). The JSON is ASCII-escaped, so text gradio_client cannot send
    (a lone UTF-16 surrogate, which httpx refuses to encode) still reaches the server."""
    import json
    import urllib.request

    body = json.dumps({"data": args}).encode()
    req = urllib.request.Request(
        f"{url}gradio_api/call/{api_name}", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        event_id = json.load(resp)["event_id"]
    with urllib.request.urlopen(f"{url}gradio_api/call/{api_name}/{event_id}", timeout=timeout) as resp:
        stream = resp.read().decode()
    event, data = None, None
    for line in stream.splitlines():  # server-sent events: the last "event:" with its "data:" line
        if line.startswith("event: "):
            event = line[7:].strip()
        elif line.startswith("data: ") and event in ("complete", "error"):
            data = json.loads(line[6:])
    if event == "error":
        return "error", (data or {}).get("error")
    return event, data[0] if isinstance(data, list) and data else data


def answer_records(n=6, seed=0) -> list[dict]:
    """Tiny prompt/answer records (token ids) whose answers repeat a pattern the heads can learn."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(3, 300, (5 + i,), generator=g).tolist()
        # a repetitive answer: learnable structure for the heads
        answer = [(10 + i + j % 4) for j in range(20 + i)]
        out.append({"id": str(i), "prompt_ids": prompt, "answer_ids": answer})
    return out


# ------------------------------------------------------------------ the playground and its server
PROMPT = "w10 w11 w12 w13"


def tiny_playground(*, oracle: bool = True, max_new_tokens: int = 96, static: bool = False) -> Playground:
    """Tiny Llama + tiny tokenizer + heads rigged to guess the model's own greedy continuation (so
    multi-token steps happen), or untrained identity heads. ``static``: runs use the static cache,
    sharing one StaticKV (eager: the capture is tested in test_static.py) one run at a time."""
    torch.manual_seed(0)
    model = make_model("llama")
    model.generation_config.eos_token_id = None  # random models hit EOS at random; runs go to the length limit
    model.config.eos_token_id = None
    tok = tiny_tokenizer()
    if oracle:
        ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        out = (
            make_decoder(model, method="plain", config=DecodeConfig(max_new_tokens=max_new_tokens + 8)).run(ids).tokens
        )
        heads = OracleHeads(model, ids + out)
    else:
        heads = untrained_heads(model)
    if static:
        from medusa_lib.core.kv import StaticKV

        return Playground(
            model, tok, heads, heads_note="test heads", cache="static", static_kv=StaticKV(model, max_len=256)
        )
    return Playground(model, tok, heads, heads_note="test heads")


def two_numerics_playground() -> Playground:
    """The tiny float32 playground plus a bfloat16 copy of its model and heads as a second variant."""
    import copy

    base = tiny_playground(oracle=False)
    m16 = copy.deepcopy(base.model).to(torch.bfloat16)
    return Playground(
        base.model,
        base.tokenizer,
        base.heads,
        heads_note="test heads",
        variants={"bfloat16": (m16, copy.deepcopy(base.heads).to(torch.bfloat16))},
    )


CUDA_CALIBRATION = {
    "device": "NVIDIA H100 80GB HBM3",
    "device_kind": "cuda",
    "dtype": "torch.bfloat16",
    "lookup": 0,
    "trees": {"calibrated-3": {"nodes": 4, "measured_tokens_per_step": 2.5, "speedup": 2.25}},
}


def cuda_calibrated_playground() -> Playground:
    """The tiny CPU playground with heads calibrated on a GPU only (what load_heads sets from config.json)."""
    pg = tiny_playground(oracle=False)
    heads = untrained_heads(pg.model, num_heads=3)
    heads.tree_presets, heads.default_tree, heads.lookup, heads.calibration = (
        {"calibrated-3": [[0], [0, 0], [1]]},
        "calibrated-3",
        0,
        CUDA_CALIBRATION,
    )
    return Playground(pg.model, pg.tokenizer, heads)


LIMIT = 512  # the app's max-new-tokens limit (app.py MAX_NEW_TOKENS_LIMIT)


API_ORDER = [
    "max_new_tokens",
    "temperature",
    "epsilon",
    "delta",
    "tree",
    "custom_tree",
    "chat_template",
    "lookup_branch",
    "sample",
    "seed",
    "numerics",
    "drafter",
]


API_DEFAULTS = {
    "max_new_tokens": 8,
    "temperature": 0.7,
    "epsilon": 0.09,
    "delta": 0.3,
    "tree": "chain-2",
    "custom_tree": "",
    "chat_template": True,
    "lookup_branch": True,
    "sample": False,
    "seed": 0,
    "numerics": "float32",
    "drafter": "",
}


def api_args(prompt: str, overrides: dict, *, live: bool = False) -> list:
    """A raw /compare body: the prompt, the settings in their order, then run_live (``live``: a fresh run, never
    one shared with an identical request)."""
    return [prompt, *({**API_DEFAULTS, **overrides}[k] for k in API_ORDER), live]


# the page's inputs as a visitor finds them (ui.outputs.PAGE_INPUTS's order), on the tiny playground's tree
PAGE_START = dict(
    prompt=PROMPT,
    max_new_tokens=12,
    temperature=0.7,
    epsilon=0.09,
    delta=0.3,
    tree="chain-2",
    custom_tree="",
    chat_template=True,
    lookup_branch=True,
    seed=0,
    numerics="float32",
    insp_label="Medusa greedy / exact sampling",
    mode="greedy",
    drafter="medusa",
    run_live=True,
)


def page_values(**changes) -> list:
    """Every page input in ``PAGE_INPUTS``'s order, as the page's /run takes them: the page as it starts,
    ``changes`` by name."""
    from ui.outputs import PAGE_INPUTS

    values = {**PAGE_START, **changes}
    return [values[name] for name in PAGE_INPUTS]


def page_start(**changes) -> list:
    """The page's inputs from the prompt to the inspector's choice (``page_values``' first 12): a handler call
    that leaves the mode, the drafter and Run live to their defaults."""
    return page_values(**changes)[:12]


def column_text(col_html: str) -> str:
    """The visible text of a method column: the token spans' contents, unescaped."""
    return "".join(html.unescape(t) for t in re.findall(r'<span class="tok[^"]*" title="[^"]*">(.*?)</span>', col_html))


def launch(pg: Playground):
    from ui import build_demo, serve

    demo = build_demo(pg, max_new_tokens=16)
    port = free_port()
    serve(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    return demo, f"http://127.0.0.1:{port}/"


def serving(pg: Playground):
    """(playground, url, client) of an in-process server around ``pg``, for a fixture to yield; closed after."""
    from gradio_client import Client

    pg.max_new_tokens_limit = LIMIT
    demo, url = launch(pg)
    try:
        yield pg, url, Client(url, verbose=False)
    finally:
        demo.close()


@pytest.fixture(scope="session")
def served():
    """One in-process server around tiny_playground() for the whole test session: (playground, url, client)."""
    yield from serving(tiny_playground())


def status_text(status: str) -> str:
    """A status line's text as the page's Markdown shows it, formatting marks aside: backslash escapes
    (``\\*`` shows ``*``) and HTML entities resolved."""
    return html.unescape(re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", status))


def assert_refused_on_the_api_and_the_page(pg: Playground, client, prompt: str, message: str) -> None:
    """``/compare`` answers with ``message`` as its error, and the page's Run shows it in the status line."""
    from gradio_client.exceptions import AppError

    from ui.handlers import RUN_OUTPUTS, Handlers

    with pytest.raises(AppError) as err:
        client.predict(prompt, 4, run_live=True, api_name="/compare")
    assert str(err.value) == message
    with pytest.warns(UserWarning):
        outs = list(
            Handlers(pg).run(
                prompt, 4, 0.7, 0.09, 0.3, "chain-2", "", True, True, 0, None, "Medusa greedy / exact sampling"
            )
        )
    assert status_text(outs[-1][RUN_OUTPUTS.index("status")]) == f"**Cannot run:** {message}"


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A tiny Llama and its tokenizer saved as a local model folder (what --model takes)."""
    folder = tmp_path_factory.mktemp("tiny-model")
    model = make_model("llama")
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


# ------------------------------------------------------------------ fixtures of the split test modules
@pytest.fixture(scope="module")
def models():
    """The tiny models the decoding tests run on (decoding_helpers.ARCHS), by family."""
    from decoding_helpers import ARCHS, model_for

    return {arch: model_for(arch) for arch in ARCHS}


@pytest.fixture(scope="module")
def heads():
    """Three path-conditioned heads sharing the LM head, for the static engine's tests (beside ``llama``)."""
    return random_heads(3, shared=True, path=True)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Llama, its tokenizer, heads and the bench prompts (bench_helpers.PROMPTS) saved for the bench tests."""
    import json

    from bench_helpers import PROMPTS

    folder = tmp_path_factory.mktemp("bench")
    model = make_model("llama")
    model.save_pretrained(folder / "model")
    tiny_tokenizer().save_pretrained(folder / "model")
    heads = random_heads(3, shared=True)
    heads.save(folder / "heads", base_model="tiny-llama", default_tree="chain-3")
    (folder / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return folder


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if app.py gets as far as loading a model: these flags must be refused before."""
    from cli_helpers import SERVING_ENV

    import medusa_lib.present.startup as startup

    def load_model(*a, **kw):
        raise AssertionError("the model was loaded before the bad flag was refused")

    monkeypatch.setattr(startup, "load_model", load_model)
    for k in SERVING_ENV + ("MEDUSA_DEVICE", "MEDUSA_CAPTURE", "MEDUSA_CACHE"):
        monkeypatch.delenv(k, raising=False)


# make test-slow runs one test file per worker: its longest files start first (seconds on 2 cores of the AMD EPYC
# in one run: the vLLM tests ~240, the GPU check's dry run ~207, the default model ~135), so the workers end together
LONGEST_FIRST = ("test_vllm.py", "test_gpu_check.py", "test_default_model.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
