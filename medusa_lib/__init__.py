"""medusa_lib: Medusa decoding (multiple decoding heads + tree attention) on stock transformers.

Paper: Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
Heads", ICML 2024, arXiv 2401.10774. Reference code: github.com/FasterDecoding/Medusa.
This package never imports gradio; the app only renders the Step records it yields.

Three wings, imports pointing inward only:
  core/      the engine (tree, heads, decoding, the KV caches and their capture, model loading,
             attention, packing, lookup, messages);
             usable from a notebook, imports nothing outside core/
  present/   what the page shows, without gradio (settings, records, the runner, inspector data); uses core
  pipeline/  offline CLIs (prompts, distill, train, calibrate, bench, export):
             python -m medusa_lib.pipeline.<name>; uses core
"""

from .core.acceptance import typical_threshold
from .core.caches import compact_cache
from .core.compose import make_decoder, run_method
from .core.config import METHODS, DecodeConfig, DecodeError
from .core.decoding import Decoder
from .core.defaults import HeadsDefaults, heads_defaults
from .core.drafters import Drafter, EagleDrafter, LookupDrafter, MedusaDrafter
from .core.engine import Engine, EngineError, prepare_engine
from .core.heads import HeadsConfig, HeadsError, MedusaHeads, ResBlock
from .core.heads_load import load_heads
from .core.kv import StaticKV
from .core.model import DEFAULT_HUB_ID, DEFAULT_MODEL, ModelError, ModelInfo, check_supported, load_model
from .core.steps import RunResult, Step
from .core.tree import (
    TOPK,
    MedusaTree,
    TreeBuffers,
    TreeError,
    build_tree,
    cartesian_choices,
    chain_choices,
    expected_tokens_per_step,
    get_tree,
    greedy_choices,
    parse_choices,
    preset_choices,
    preset_names,
)

__all__ = [name for name in dir() if not name.startswith("_")]
