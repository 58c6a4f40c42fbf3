"""Offline command-line tools: prompts, distillation, head training, tree calibration, the benchmark.
Run as ``python -m medusa_lib.pipeline.<name>``. Use core/; never imported by serving."""
