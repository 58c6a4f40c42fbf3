"""The GPU check's probes: one line of figures about the environment or the model, run as parts.

``gpu_check.py --probe env`` (the packages as imported, torch, CUDA and the GPU, the bench's method
list, whether gradio came in) and ``--probe model`` (the default model, from the cache or converted
from its GGUF, loaded on the CPU) each run in a part's own process, since they import torch and the
check does not; each prints its figures as one line of JSON after ``gpu_figures.MARK``. Standard
library only until a probe runs, like the check that imports it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

try:
    from . import gpu_figures
except ImportError:
    # run as a file: its folder is on sys.path
    import gpu_figures

PACKAGES = ("transformers", "tokenizers", "huggingface_hub", "safetensors", "gguf", "tqdm", "regex", "accelerate")


def probe(name: str, device: str) -> None:
    """Print one line of figures for the env and model parts (these import torch; the runner does not)."""
    t0 = time.perf_counter()
    here = str(Path(__file__).resolve().parent)
    # The pipeline's own file names (bench, export, ...) must not shadow packages.
    sys.path[:] = [p for p in sys.path if p != here]
    import importlib.metadata

    import torch

    if name == "env":
        import platform

        cuda = torch.cuda.is_available()
        fig = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
        fig |= {"gpu": torch.cuda.get_device_name(0) if cuda else None, "cpu_threads": torch.get_num_threads()}
        for mod in PACKAGES:
            try:
                # importable here, not only installed
                __import__(mod)
                fig[mod] = importlib.metadata.version(mod)
            except (ImportError, importlib.metadata.PackageNotFoundError) as e:
                fig[mod] = f"missing ({type(e).__name__}: {e})"
        found = sys.modules.get("transformers")
        fig["transformers_from"] = str(Path(found.__file__).parent) if found else None
        # what the parts import
        from medusa_lib.pipeline import bench, calibrate, page_check, profile_step  # noqa: F401

        fig |= {"methods": list(bench.ALL_METHODS), "gradio_imported": "gradio" in sys.modules}
        if device.startswith("cuda") and cuda:
            props = torch.cuda.get_device_properties(0)
            fig |= {"capability": f"{props.major}.{props.minor}", "memory_gib": round(props.total_memory / 2**30, 1)}
            fig["bf16"] = torch.cuda.is_bf16_supported()
        elif device.startswith("cuda"):
            print(gpu_figures.MARK + json.dumps(fig))
            raise SystemExit("CUDA was asked for but torch sees no GPU here.")
    elif name == "model":
        from medusa_lib.core.model import _default_cached_folder, default_gguf_path, load_model

        folder = _default_cached_folder()
        fig = {"gguf": str(default_gguf_path()), "folder": str(folder)}
        fig["source"] = "cached" if (folder / "config.json").exists() else "converted"
        load_model(
            "default",
            device="cpu",
            dtype="float32",
            allow_remote=False,
            prepack=False,
            packed_gqa=False,
            progress=lambda m: print(m, flush=True),
        )
        fig["cache_bytes"] = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    else:
        raise SystemExit(f"Unknown probe {name!r}.")
    fig["seconds"] = round(time.perf_counter() - t0, 2)
    print(gpu_figures.MARK + json.dumps(fig))
