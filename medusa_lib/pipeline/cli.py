"""What every pipeline command line shares."""

from __future__ import annotations

import argparse


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    """--model, --dtype and --device, with the same defaults in every CLI (core.model.load_model takes them)."""
    ap.add_argument(
        "--model", default="default", help="'default' (SmolLM2-135M-Instruct, offline), a local folder or a Hub id"
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        help="auto, float32, bfloat16 or float16 (auto: bfloat16 where the device runs it natively)",
    )
    ap.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1 ...")
