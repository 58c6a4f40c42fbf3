"""The parts of the GPU check: what each one runs and under what time limit (figures: gpu_figures.py).

Each part is one or more commands of the pipeline CLIs (several run side by side) and a reader of their
logs and JSON files. The GPU plan measures; the tiny plan (a CPU dry run) runs the same commands on one
prompt, one repeat and a few tokens. Standard library only, like the check that imports it.
"""

from __future__ import annotations

import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

try:
    from . import gpu_figures as fig
except ImportError:
    # run as a file
    import gpu_figures as fig

BENCH_PROMPTS = "assets/data/bench_prompts.jsonl"
# The bench's timed methods (3 repeats) on the default engine, against the compile anchor (each step shape of
# ours is compiled first, so few rules: a compile per program); and the eager ones with each other drafter (1
# repeat: on a GPU an eager step is mostly kernel launches, so three repeats would take the check's whole budget).
TIMED = ("hf-compiled", "baseline", "medusa-greedy")
EAGER = ("hf-generate", "baseline", "medusa-greedy")


@dataclass
class Context:
    """What the parts share during one check."""

    python: str
    root: Path
    work: Path
    # cuda or cpu
    device: str
    tiny: bool
    # the check script's path (its probes)
    check: str
    # the check's --out: files that come back whole (the EAGLE heads' weights)
    out: Path | None = None
    # the time limit of the group about to run (a training sizes itself by it)
    limit_s: float = 0.0
    # the bench's own method list, read by the env part
    methods: list[str] = field(default_factory=list)
    # figures of the parts done, by name
    results: dict[str, dict] = field(default_factory=dict)

    def size(self, gpu, tiny):
        return tiny if self.tiny else gpu

    def cli(self, module: str, *args) -> list[str]:
        return [self.python, "-m", f"medusa_lib.pipeline.{module}", *map(str, args)]

    def dtype(self) -> str:
        """bfloat16 on the GPU; the dry run's CPU picks its own (bfloat16 forwards crawl without bf16 instructions)."""
        return self.size("bfloat16", "auto")

    def eager_methods(self) -> list[str]:
        return [*EAGER, *fig.other_drafters(self.methods)]

    @property
    def eagle_cache(self) -> Path:
        """The EAGLE feature cache, beside this stage's runs: a later call on the warm machine reuses it
        (train_eagle rebuilds it only when the model, the answers or the dtype differ)."""
        return self.work.parent / "eagle-cache"


@dataclass(frozen=True)
class Job:
    argv: list[str]
    log: Path
    env: dict = field(default_factory=dict)
    json: Path | None = None


@dataclass(frozen=True)
class Part:
    name: str
    title: str
    # its own time limit on the GPU
    limit_s: int
    # its own time limit in the CPU dry run
    tiny_limit_s: int
    jobs: Callable[[Context], list[Job]]
    read: Callable[[Context, list[Job]], dict]
    words: Callable[[dict], str]
    needs_model: bool = True
    # no timing in it: runs beside the side parts next to it
    side: bool = False


def probe_jobs(name: str) -> Callable[[Context], list[Job]]:
    def jobs(ctx: Context) -> list[Job]:
        return [Job([ctx.python, ctx.check, "--probe", name, "--device", ctx.device], ctx.work / f"{name}.log")]

    return jobs


def profile_jobs(ctx: Context) -> list[Job]:
    argv = ctx.cli("profile_step", "--device", ctx.device, "--max-new-tokens", ctx.size(64, 8))
    return [Job(argv, ctx.work / "profile.log")]


def bench_jobs(ctx: Context, name: str, methods: list[str], *, repeats: int, engine: tuple = ()) -> list[Job]:
    """The bench on a prompt per category (``engine``: its --cache/--capture flags, else the default engine)."""
    out = ctx.work / f"{name}.json"
    sizes = ["--repeats", ctx.size(repeats, 1), "--max-new-tokens", ctx.size(128, 4), *ctx.size([], ["--limit", "1"])]
    argv = ctx.cli("bench", "--device", ctx.device, "--dtype", ctx.dtype(), "--per-category", 1, *sizes, *engine)
    # a CPU dry run's weights stock too: Inductor cannot lower packed ones
    if "hf-compiled" in methods:
        argv.append("--no-prepack")
    return [Job([*argv, "--methods", ",".join(methods), "--json", str(out)], ctx.work / f"{name}.log", json=out)]


def float32_jobs(ctx: Context) -> list[Job]:
    """Every bench prompt (tiny: two), in shards that run side by side: outputs only, nothing timed."""
    lines = [ln for ln in (ctx.root / BENCH_PROMPTS).read_text().splitlines() if ln.strip()][: ctx.size(None, 2)]
    jobs = []
    for k in range(ctx.size(4, 2)):
        prompts, out = ctx.work / f"float32-prompts-{k + 1}.jsonl", ctx.work / f"float32-{k + 1}.json"
        prompts.write_text("\n".join(lines[k :: ctx.size(4, 2)]) + "\n")
        argv = ctx.cli("bench", "--device", ctx.device, "--dtype", "float32", "--prompts", prompts, "--repeats", 1)
        # 4 shards compiling side by side would not fit
        argv += ctx.size(["--capture", "cuda-graph"], [])
        argv += [
            "--max-new-tokens",
            str(ctx.size(64, 4)),
            "--methods",
            ",".join(ctx.eager_methods()),
            "--json",
            str(out),
        ]
        jobs.append(Job(argv, ctx.work / f"float32-{k + 1}.log", json=out))
    return jobs


def float32_compiled_jobs(ctx: Context) -> list[Job]:
    """The default engine (Inductor's kernels in one graph a step) in float32 against model.generate, a
    prompt per category: outputs only."""
    out = ctx.work / "float32-compiled.json"
    argv = ctx.cli("bench", "--device", ctx.device, "--dtype", "float32", "--per-category", 1, "--repeats", 1)
    argv += ["--max-new-tokens", str(ctx.size(64, 4)), "--methods", "hf-generate,baseline,medusa-greedy"]
    argv += [*ctx.size([], ["--limit", "1"]), "--json", str(out)]
    return [Job(argv, ctx.work / "float32-compiled.log", json=out)]


def page_jobs(ctx: Context) -> list[Job]:
    # The page starts in float32 where the copy is loaded; bfloat16 is the bench's dtype on a GPU.
    out, numerics = ctx.work / "page.json", "float32,bfloat16" if ctx.device.startswith("cuda") else "float32"
    argv = ctx.cli(
        "page_check", "--device", ctx.device, "--per-category", 1, "--modes", "greedy", "--numerics", numerics
    )
    if ctx.tiny:
        one = ctx.work / "one-prompt.jsonl"
        one.write_text((ctx.root / BENCH_PROMPTS).read_text().splitlines()[0] + "\n")
        argv += ["--prompts", str(one), "--no-examples", "--max-new-tokens", "4"]
    return [Job([*argv, "--json", str(out)], ctx.work / "page.log", json=out)]


def calibrate_jobs(ctx: Context) -> list[Job]:
    heads = ctx.work / "heads"
    shutil.rmtree(heads, ignore_errors=True)
    # --write goes to this copy; its config.json comes back in raw.tar.gz
    shutil.copytree(ctx.root / fig.HEADS, heads)
    # --keep-trees: the trees the CPU records measured, timed here too (its record can join the shipped heads)
    argv = ctx.cli("calibrate", "--device", ctx.device, "--heads", heads, "--lookup", 4, "--keep-trees", "--write")
    argv += map(str, ["--acc-prompts", ctx.size(96, 2), "--speed-prompts", ctx.size(16, 1)])
    argv += ctx.size([], ["--sizes", "4", "--max-new-tokens", "8"])
    return [Job(argv, ctx.work / "calibrate.log", json=heads / "config.json")]


def costs_jobs(ctx: Context) -> list[Job]:
    argv = ctx.cli(
        "bench", "--device", ctx.device, "--dtype", ctx.dtype(), "--forward-costs", "--repeats", ctx.size(2, 1)
    )
    return [Job(argv, ctx.work / "costs.log")]


def graph_jobs(ctx: Context) -> list[Job]:
    """The fallback engine, the eager kernels in one CUDA graph a step (--capture cuda-graph), on the bench's
    prompts: what Inductor's kernels gain over it (the dry run, with no CUDA, runs its static steps eager)."""
    engine = ("--cache", "static", "--capture", ctx.size("cuda-graph", "none"))
    return bench_jobs(ctx, "graph", ["baseline", "medusa-greedy"], repeats=1, engine=engine)


def fold_jobs(ctx: Context) -> list[Job]:
    """The bench's baseline and Medusa on the default engine with grouped-query heads folded onto the KV heads
    (``--fold-gqa``: no copy of the KV heads in any step), 3 repeats: read against the bench part's figures
    (the same prompts, sizes and engine, in another process)."""
    return bench_jobs(ctx, "fold", ["baseline", "medusa-greedy"], repeats=3, engine=("--fold-gqa",))


# The EAGLE recipes trained on the GPU: name -> train_eagle flags. All read one feature cache.
EAGLE_RECIPES = {"eagle1": [], "eagle3": ["--fuse", "--ttt-steps", "3"]}
# Then from a recipe's kept head: recipe -> (name, flags, its share of the recipe's time). On a CPU
# training-time test paid from a trained EAGLE-1 head (more tokens/step than plain EAGLE-1 trained as long),
# where from scratch it had lost (docs/performance.md).
EAGLE_FOLLOW_UPS = {"eagle1": ("eagle1-ttt2", ["--ttt-steps", "2"], 0.4)}
# the last held-out evaluation and the save, within the part's limit
EAGLE_LAST_EVAL_S = 60


def eagle_jobs(ctx: Context) -> list[Job]:
    """Every answer's features cached once on this device, then each EAGLE recipe trained on them side by
    side for the time left (untimed: the figures are held-out tokens/step, simulated), a follow-up taking
    over from its recipe's kept head for the last share of that time. One shell line, so the features come
    first; each training logs to <name>.log and keeps its head in eagle/<name>/. The feature cache sits
    beside the runs (``Context.eagle_cache``), so a later call on the warm machine reuses it."""
    cache, heads = ctx.eagle_cache, ctx.work / "eagle"
    common = ["--device", ctx.device, "--dtype", ctx.size("bfloat16", "float32"), "--work", str(cache)]
    # six training answers and three held-out ones
    if ctx.tiny:
        import gzip

        held = ctx.work / "heldout-tiny.jsonl"
        with gzip.open(ctx.root / "assets/data/distill/heldout_answers.jsonl.gz", "rt") as f:
            held.write_text("".join(next(f) for _ in range(3)))
        common += ["--train-records", "6", "--heldout-answers", str(held)]
    # training ends by the part's limit less the last evaluation and the save, however long the features took
    stop_at = round(time.time() + (ctx.limit_s or ctx.size(300, 60)) - ctx.size(EAGLE_LAST_EVAL_S, 45))
    train = [
        "--no-eval", "--restart", "--max-minutes", str(ctx.size(60, 0.2)), "--threads", "4",
        "--epochs", str(ctx.size(40, 1)), "--eval-every", str(ctx.size(10**6, 2)),
        "--sim-prompts", str(ctx.size(32, 2)), "--eval-minutes", str(ctx.size(0.75, 0)),
    ]  # fmt: skip

    def one(name: str, flags: list, stop: str) -> str:
        argv = ctx.cli("train_eagle", *common, *train, *flags, "--out", heads / name)
        return f"{sh(argv)} --stop-at {stop} > {ctx.work / name}.log 2>&1"

    runs = []
    for name, flags in EAGLE_RECIPES.items():
        if name not in EAGLE_FOLLOW_UPS:
            runs.append(one(name, flags, str(stop_at)))
            continue
        then, then_flags, share = EAGLE_FOLLOW_UPS[name]
        # the recipe's own stop, reckoned when it starts (after the features): its share of the time left
        mid = f'"$(( $(date +%s) + ({stop_at} - $(date +%s)) * {round(100 * (1 - share))} / 100 ))"'
        runs.append(f"( {one(name, flags, mid)} && {one(then, [*then_flags, '--init', heads / name], str(stop_at))} )")
    names = [*EAGLE_RECIPES, *(then for then, _, _ in EAGLE_FOLLOW_UPS.values())]
    done = " && ".join(f"test -f {heads / name}/training.json" for name in names)
    line = f"{sh(ctx.cli('train_eagle', *common, '--features-only'))} && ( {' & '.join(runs)} & wait ) && {done}"
    return [Job(["sh", "-c", line], ctx.work / "eagle-features.log")]


def sh(argv: list) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)


# In order of what matters most: a check stopped by its budget keeps the first ones.
PARTS = (
    Part("env", "the environment: GPU, torch, CUDA, transformers; the pipeline imports no gradio", 60, 120,
         probe_jobs("env"), fig.env_read, fig.env_words, needs_model=False),
    Part("model", "the default model: the reassembled GGUF converted once into the float32 cache", 120, 400,
         probe_jobs("model"), fig.model_read, fig.model_words),
    Part("profile", "profile_step: graph launches, D2H copies, syncs and eager kernels per steady step", 180, 300,
         profile_jobs, fig.profile_read, fig.profile_words),
    Part("bench", "the bench, bfloat16, 128 new tokens, a prompt per category, 3 repeats, and hf-compiled", 360, 500,
         lambda ctx: bench_jobs(ctx, "bench", list(TIMED), repeats=3), fig.bench_read, fig.bench_words),
    Part("page", "the page's own path (page_check, greedy) against the bench's Medusa/plain ratio", 120, 300,
         page_jobs, fig.page_read, fig.page_words),
    Part("float32", "float32 greedy against model.generate, every bench prompt, each drafter (4 shards side by side)",
         180, 400, float32_jobs, fig.float32_read, fig.float32_words, side=True),
    Part("float32-compiled", "the default engine in float32 against model.generate, a prompt per category",
         240, 300, float32_compiled_jobs, fig.bench_read, fig.bench_words),
    Part("graph", "--capture cuda-graph: the eager kernels in one graph a step (the fallback), 1 repeat", 150, 300,
         graph_jobs, fig.graph_read, fig.graph_words),
    Part("fold", "the bench's baseline and Medusa with GQA folded (no KV-head copies), 3 repeats", 240, 400,
         fold_jobs, fig.fold_read, fig.graph_words),
    Part("eagle", "EAGLE heads trained here on every answer (EAGLE-1; EAGLE-3 fused + training-time test)", 300, 600,
         eagle_jobs, fig.eagle_read, fig.eagle_words, side=True),
    Part("bench-eager", "hf-generate and each other drafter (EAGLE in its step's graph); 1 repeat", 150, 300,
         lambda ctx: bench_jobs(ctx, "bench-eager", ctx.eager_methods(), repeats=1), fig.bench_read, fig.bench_words),
    Part("calibrate", "calibrate on this device (into a copy of the heads); a tree step's cost by tree size", 180, 400,
         calibrate_jobs, fig.calibrate_read, fig.calibrate_words),
    Part("costs", "one eager forward of 1..33 tokens after a 256-token prefix (bench --forward-costs)", 60, 400,
         costs_jobs, fig.costs_read, fig.costs_words),
)  # fmt: skip
