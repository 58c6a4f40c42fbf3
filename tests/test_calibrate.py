"""The calibration CLI end to end on a tiny saved model: trees, the pick and what it writes."""

import json

from conftest import make_model, random_heads, tiny_tokenizer

from medusa_lib import load_heads
from medusa_lib.pipeline import calibrate


def test_calibrate_writes_trees_the_default_and_the_lookup_length(tmp_path, capsys):
    model = make_model("llama")
    model.generation_config.eos_token_id = None  # random models hit EOS at random: full-length answers
    model.save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    random_heads(3, shared=True).save(tmp_path / "heads")
    prompts = [{"id": f"p-{i}", "category": "c", "prompt": f"w{10 + i} w{11 + i} w{12 + i} w{10 + i} w{11 + i}"} for i in range(8)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    calibrate.main(["--heads", str(tmp_path / "heads"), "--model", str(tmp_path / "model"), "--prompts", str(tmp_path / "prompts.jsonl"),
                    "--dtype", "float32", "--device", "cpu", "--acc-prompts", "5", "--speed-prompts", "2", "--max-new-tokens", "24",
                    "--sizes", "2,4", "--lookup", "3", "--write"])
    printed = capsys.readouterr().out
    trees = json.loads((tmp_path / "heads" / "trees.json").read_text())
    cfg = json.loads((tmp_path / "heads" / "config.json").read_text())
    assert set(trees) == {"calibrated-2", "calibrated-4"} and [len(trees[n]) for n in ("calibrated-2", "calibrated-4")] == [2, 4]
    assert cfg["default_tree"] in trees and cfg["lookup"] == 3 == cfg["calibration"]["lookup"]
    rows = cfg["calibration"]["trees"]
    for name in trees:
        r = rows[name]
        assert r["simulated_tokens_per_step"] > r["heads_only_simulated_tokens_per_step"] >= 1.0  # the branch is one more path, and these answers repeat
        assert r["measured_tokens_per_step"] >= 1.0 and r["speedup"] > 0
    assert "trees + lookup-3" in printed and f"default_tree={cfg['default_tree']} and lookup=3" in printed
    heads = load_heads(tmp_path / "heads", model=model)
    assert heads.lookup == 3 and heads.default_tree == cfg["default_tree"] and heads.tree_presets == trees
