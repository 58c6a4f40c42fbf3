"""The pipeline's command lines (bench, page_check, calibrate, profile_step): bad arguments refused before the
model loads, a folder without a model or heads with a bad config, each in one sentence."""

from __future__ import annotations

import pytest
from conftest import random_heads


# ------------------------------------------------------------------ the pipeline's command lines: bench, page_check
@pytest.fixture
def cli_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text("{x\n")
    (tmp_path / "no-prompt.jsonl").write_text('{"id": 1}\n')
    (tmp_path / "nested.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    (tmp_path / "nested-prompt.jsonl").write_text('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    (tmp_path / "good.jsonl").write_text('{"id": "a", "category": "c", "prompt": "w5 w6"}\n')
    (tmp_path / "afile").write_text("x")
    return tmp_path


# (arguments, the message's start; {t}: the tmp folder); refused before the model loads
BAD_RUNS = [
    (["--prompts", "{t}/missing.jsonl"], "error: --prompts '{t}/missing.jsonl' is not a file; give a JSONL file"),
    (["--prompts", "{t}/empty.jsonl"], "error: --prompts '{t}/empty.jsonl' holds no prompts; give a JSONL file"),
    (["--prompts", "{t}/bad.jsonl"], "error: --prompts '{t}/bad.jsonl' cannot be read as JSONL (JSONDecodeError: "),
    (
        ["--prompts", "{t}/no-prompt.jsonl"],
        'error: --prompts \'{t}/no-prompt.jsonl\': its entry 1 is not an object with a "prompt" text ({{"id": 1}}).',
    ),
    (
        ["--prompts", "{t}/nested.jsonl"],
        "error: --prompts '{t}/nested.jsonl' cannot be read as JSONL (a line is nested too deeply); "
        "give one JSON object a line.",
    ),
    (
        ["--prompts", "{t}/nested-prompt.jsonl"],
        "error: --prompts '{t}/nested-prompt.jsonl' cannot be read as JSONL (a line is nested too deeply); ",
    ),
    (["--json", "{t}/afile/out.json"], "error: --json '{t}/afile/out.json' is under '{t}/afile', which is a file"),
    (["--json", "/proc/medusa.json"], "error: --json '/proc/medusa.json' cannot be written: '/proc' takes no files"),
    (["--heads", "{t}/no-heads"], "error: --heads '{t}/no-heads' does not exist; give the folder of trained heads"),
    (["--device", "tpu9"], "error: Unknown device 'tpu9'; use cpu, cuda, cuda:0 or auto."),
]
BENCH_ONLY = [
    (["--tree", "nosuch"], "error: --tree 'nosuch' is not a tree preset; choose one of: calibrated-3, "),
    (["--repeats", "0"], "argument --repeats: must be a whole number of at least 1 (got 0)"),
    (["--limit", "-1"], "argument --limit: must be a whole number of at least 0 (got -1)"),
    (["--lookup", "99"], "argument --lookup: must be a whole number from 0 to 8 (got 99)"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be a whole number of at least 1 (got 0)"),
]


def run_cli(main, argv, capsys) -> str:
    """A pipeline CLI's main() until it exits: its error sentence (argparse's on stderr)."""
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code != 0
    text = str(err.value.code) if isinstance(err.value.code, str) else capsys.readouterr().err.strip().splitlines()[-1]
    assert "Traceback" not in text
    return text


@pytest.mark.parametrize("argv, message", BAD_RUNS + BENCH_ONLY)
def test_bench_refuses_bad_arguments_before_the_model_loads(monkeypatch, capsys, cli_files, argv, message):
    from medusa_lib.pipeline import bench

    monkeypatch.setattr(bench, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    base = ["--prompts", str(cli_files / "good.jsonl"), "--methods", "baseline,medusa-greedy"]
    said = run_cli(bench.main, base + [a.format(t=cli_files) for a in argv], capsys)
    assert message.format(t=cli_files) in said, said


@pytest.mark.parametrize("argv, message", BAD_RUNS + BENCH_ONLY[-1:])
def test_page_check_refuses_bad_arguments_before_the_model_loads(monkeypatch, capsys, cli_files, argv, message):
    from medusa_lib.pipeline import page_check

    monkeypatch.setattr(page_check.Playground, "load", lambda *a, **k: pytest.fail("the model loaded"))
    base = ["--prompts", str(cli_files / "good.jsonl"), "--no-examples"]
    said = run_cli(page_check.main, base + [a.format(t=cli_files) for a in argv], capsys)
    assert message.format(t=cli_files) in said, said


@pytest.mark.parametrize("tool", ["bench", "page_check"])
def test_a_folder_without_a_model_or_heads_with_a_bad_config_is_one_sentence(capsys, cli_files, model_folder, tool):
    import importlib

    main = importlib.import_module(f"medusa_lib.pipeline.{tool}").main
    base = ["--prompts", str(cli_files / "good.jsonl"), "--device", "cpu", "--dtype", "float32"]
    base += ["--methods", "baseline,medusa-greedy"] if tool == "bench" else ["--no-examples", "--numerics", "float32"]
    assert run_cli(main, base + ["--model", "/etc"], capsys).startswith(
        "error: The folder '/etc' has no config.json, so it holds no model"
    )
    heads = cli_files / "heads"
    random_heads().save(heads)
    (heads / "config.json").write_text("[]")
    said = run_cli(main, base + ["--model", str(model_folder), "--heads", str(heads)], capsys)
    assert said == f"error: {heads}/config.json holds a list, not an object of settings; " + (
        "copy the heads again or train new ones."
    )


# ------------------------------------------------------------------ calibrate and profile_step
@pytest.mark.parametrize(
    "tool, argv, message",
    [
        ("calibrate", ["--prompts", "{t}/missing.jsonl"], "error: --prompts '{t}/missing.jsonl' is not a file; "),
        ("calibrate", ["--prompts", "{t}/nested.jsonl"], "error: --prompts '{t}/nested.jsonl' cannot be read as JSONL"),
        ("calibrate", ["--answers", "{t}/bad.jsonl"], "error: --answers '{t}/bad.jsonl' cannot be read as JSONL"),
        ("calibrate", ["--heads", "{t}/no-heads"], "error: --heads '{t}/no-heads' does not exist; give the folder"),
        ("calibrate", ["--device", "tpu9"], "error: Unknown device 'tpu9'; use cpu, cuda, cuda:0 or auto."),
        ("calibrate", ["--cache", "bogus"], "argument --cache: invalid choice: 'bogus'"),
        ("profile_step", ["--heads", "{t}/no-heads"], "error: --heads '{t}/no-heads' does not exist; give the folder"),
        ("profile_step", ["--device", "tpu9"], "error: Unknown device 'tpu9'; use cpu, cuda, cuda:0 or auto."),
        ("profile_step", ["--cache", "bogus"], "argument --cache: invalid choice: 'bogus'"),
        ("profile_step", ["--max-new-tokens", "0"], "argument --max-new-tokens: must be a whole number of at least 1"),
    ],
)
def test_calibrate_and_profile_step_refuse_bad_arguments_before_the_model_loads(
    monkeypatch, capsys, cli_files, tool, argv, message
):
    import importlib

    module = importlib.import_module(f"medusa_lib.pipeline.{tool}")
    monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    base = ["--prompts", str(cli_files / "good.jsonl")] if tool == "calibrate" else []
    said = run_cli(module.main, base + [a.format(t=cli_files) for a in argv], capsys)
    assert message.format(t=cli_files) in said, said


@pytest.mark.parametrize("tool", ["calibrate", "profile_step"])
def test_calibrate_and_profile_step_say_a_bad_model_or_heads_in_one_sentence(capsys, cli_files, model_folder, tool):
    import importlib

    main = importlib.import_module(f"medusa_lib.pipeline.{tool}").main
    base = (["--prompts", str(cli_files / "good.jsonl")] if tool == "calibrate" else []) + ["--device", "cpu"]
    assert run_cli(main, base + ["--model", "/etc"], capsys).startswith(
        "error: The folder '/etc' has no config.json, so it holds no model"
    )
    heads = cli_files / "heads"
    random_heads().save(heads)
    (heads / "config.json").write_text("[]")
    said = run_cli(main, base + ["--model", str(model_folder), "--heads", str(heads), "--dtype", "float32"], capsys)
    assert said == f"error: {heads}/config.json holds a list, not an object of settings; " + (
        "copy the heads again or train new ones."
    )
