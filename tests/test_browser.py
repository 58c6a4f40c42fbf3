"""The page in a real headless browser (Debian chromium driven by Playwright), on the real default model.

Loads the page, runs an example as a new user would (the first view: greedy mode, float32), waits for
the three outputs and the tree plot, checks the green badge, the speed-ups and the inspector, runs the
sampling mode, replays the race and stops it, picks the EAGLE drafter, and saves assets/screenshot.png.
Slow: the default model (SmolLM2-135M-Instruct) loads from the cache, or dequantises its GGUF on a cold
cache (docs/engine.md).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = ROOT / "assets" / "screenshot.png"
MAX_NEW_TOKENS = int(os.environ.get("BROWSER_TEST_MAX_NEW_TOKENS", "40"))


@pytest.fixture(scope="module")
def url():
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip(f"chromium is not installed ({CHROMIUM} missing; `apt-get install -y chromium`)")
    from medusa_lib.present import Playground, load_examples
    from ui import build_demo, serve

    heads = ROOT / "assets" / "heads" / "smollm2-135m-instruct"
    # bfloat16 (the CPU default where it is native) plus the float32 copy the page's Numerics choice runs:
    # the test picks float32, where Medusa exact sampling must equal plain sampling token for token
    pg = Playground.load(model="default", heads=heads, default_heads=heads, device="cpu", dtype="bfloat16")
    assert list(pg.variants) == ["bfloat16", "float32"]
    demo = build_demo(pg, examples=load_examples(ROOT / "assets" / "examples.json"), max_new_tokens=MAX_NEW_TOKENS)
    port = free_port()
    serve(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@pytest.fixture(scope="module")
def page(url):
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
            args=FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        pg = browser.new_page()
        pg.goto(url)
        pg.wait_for_selector("#run-btn", timeout=60_000)
        yield pg
        browser.close()


def test_the_first_view_is_the_greedy_trio_exact_with_speedups(page):
    """A new user picks an example and presses Run, changing nothing: plain greedy, Medusa greedy and
    Medusa typical, each Medusa column with its speed-up over plain greedy, a green badge (float32,
    the exact numerics, is the default), and the inspector on Medusa greedy's run."""
    assert page.is_checked("#lookup-branch input")  # the shipped heads were calibrated with the lookup branch on
    assert page.is_checked("#mode input[value='greedy']")  # the first view: the greedy comparison
    assert page.is_checked("#numerics input[value='float32']")  # exact by default; bfloat16 is one click away
    assert "float32 is exact" in page.inner_text(
        "#numerics-note"
    ) and "(plain decoding, measured at start-up)" in page.inner_text("#numerics-note")
    settings = page.eval_on_selector_all(
        "#settings *",
        "els => els.filter(e => e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== 'visible' && "
        "getComputedStyle(e).overflowX !== 'hidden').map(e => e.id || e.className)",
    )
    assert settings == [], settings  # no horizontal scroll bar in the settings panel
    page.get_by_role("button", name="Explanation").first.click()
    page.wait_for_function("document.querySelector('#prompt textarea').value.includes('sky is blue')", timeout=30_000)
    page.click("#run-btn")
    badge = page.wait_for_selector(
        "#greedy-badge [data-equal='true'], #greedy-badge [data-equal='false']", timeout=540_000
    )
    assert badge.get_attribute("data-sampled") == "false" and badge.get_attribute("data-equal") == "true", (
        badge.inner_text()
    )
    assert "Medusa greedy = plain greedy (float32)" in badge.inner_text()
    for col, name in (
        ("#out-plain", "Plain (greedy)"),
        ("#out-greedy", "Medusa greedy"),
        ("#out-typical", "Medusa typical"),
    ):
        assert page.get_attribute(f"{col} .method-col", "data-state") == "done"
        assert name in page.inner_text(f"{col} .method-name")
        assert len(page.inner_text(f"{col} .method-text").strip()) > 20
        assert "tokens/s" in page.inner_text(f"{col} .method-stats")
    for col in ("#out-greedy", "#out-typical"):  # each Medusa column leads with its speed-up over plain greedy
        assert float(page.get_attribute(f"{col} .speedup", "data-speedup")) > 0 and "plain" in page.inner_text(
            f"{col} .speedup"
        )
    assert "samples at T = 0.7" in page.inner_text(
        "#out-typical .method-note"
    )  # typical says that it samples: not the same output
    page.wait_for_selector("#tree-plot .js-plotly-plot .scatterlayer .trace", timeout=30_000)
    page.wait_for_selector("#mask-plot .js-plotly-plot .heatmaplayer, #mask-plot .js-plotly-plot image", timeout=30_000)
    assert page.text_content("#tree-plot .gtitle").startswith(
        "Medusa greedy, step"
    )  # the inspector is on Medusa greedy's run
    assert "Medusa typical" in page.inner_text("#summary")
    assert page.locator("#tree-plot .textpoint").count() >= 3  # node labels: decoded tokens
    page.wait_for_timeout(1000)  # let plotly finish its transitions
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert SCREENSHOT.stat().st_size > 50_000


def test_the_sampling_mode_is_exact_too(page):
    page.locator("#mode input[value='sampling']").check()
    page.click("#run-btn")
    page.wait_for_selector("#greedy-badge [data-sampled='true']", timeout=540_000)
    badge = page.query_selector("#greedy-badge [data-sampled='true']")
    # T = 0.7, float32: Medusa exact sampling == plain sampling from the same seed
    assert badge.get_attribute("data-equal") == "true", badge.inner_text()
    assert "Medusa exact sampling = plain sampling, same seed (float32)" in badge.inner_text()
    assert page.get_attribute("#sampling-panel .sampling-panel", "data-rows") == "3"
    assert "Plain (sampling)" in page.inner_text(
        "#out-plain .method-name"
    ) and "Medusa exact sampling" in page.inner_text("#out-greedy .method-name")
    page.locator("#mode input[value='greedy']").check()  # back to the first view for the tests after this one


def test_race_replay_then_stop(page):
    # the slowest replay (about 4x the runs' ~4 s), so Stop lands before it ends on a slow machine too
    page.get_by_label("0.25x").check()
    page.click("#replay-btn")
    page.wait_for_function(
        "document.querySelector('#status').innerText.includes('Race replay at 0.25x')", timeout=30_000
    )
    page.click("#stop-btn")
    page.wait_for_function("document.querySelector('#status').innerText.includes('Stopped')", timeout=30_000)
    page.wait_for_timeout(500)
    states = [
        page.get_attribute(f"{c} .method-col", "data-state") for c in ("#out-plain", "#out-greedy", "#out-typical")
    ]
    assert set(states) <= {"stopped", "done"} and "stopped" in states, (
        states
    )  # a stopped replay no longer says it is replaying


def test_stop_cancels_a_live_run(page):
    page.check("#run-live input")  # the same request ran before: without Run live its record answers at once
    page.click("#run-btn")
    page.wait_for_selector("#out-plain .method-col[data-state='running']", timeout=60_000)
    page.click("#stop-btn")
    page.wait_for_function("document.querySelector('#status').innerText.includes('Stopped')", timeout=30_000)
    page.wait_for_timeout(500)
    texts = [page.inner_text(f"{c} .method-text") for c in ("#out-plain", "#out-greedy", "#out-typical")]
    page.wait_for_timeout(3000)  # a cancelled run writes nothing more
    assert [page.inner_text(f"{c} .method-text") for c in ("#out-plain", "#out-greedy", "#out-typical")] == texts
    assert page.get_attribute("#out-typical .method-col", "data-state") == "waiting"
    assert page.get_attribute("#out-plain .method-col", "data-state") == "stopped"  # not "running..." forever
    assert "stopped" in page.inner_text("#out-plain .method-state").lower()
    page.uncheck("#run-live input")


LAB_SCREENSHOT = ROOT / "assets" / "tree-lab.png"


def test_tree_lab_edit_measure_and_use(page):
    if not page.input_value("#prompt textarea").strip():  # run alone: the other tests filled it from an example
        page.fill("#prompt textarea", "Why is the sky blue? Answer in two sentences.")
    page.get_by_role("tab", name="Tree lab").click()
    for plot in ("#lab-cost", "#lab-gain", "#lab-speedup", "#lab-tree", "#lab-mask"):
        page.wait_for_selector(f"{plot} .js-plotly-plot .main-svg", timeout=30_000)
    assert (
        page.locator("#lab-speedup .legendtext", has_text="optimum").count() >= 1
    )  # the shipped heads' calibration is a CPU one
    # ... and they carry an H200's too: its step costs, dashed beside this CPU's
    assert page.locator("#lab-cost .legendtext", has_text="NVIDIA H200 (its calibration)").count() == 1
    assert "this EAGLE head exports to vLLM's EAGLE drafter" in page.inner_text("#eagle-lab-export")
    before = page.input_value("#lab-paths textarea")
    nodes = page.locator("#lab-tree .textpoint").count()
    page.click("#lab-add")
    page.wait_for_function(f"document.querySelector('#lab-paths textarea').value !== {before!r}", timeout=30_000)
    page.wait_for_function(f"document.querySelectorAll('#lab-tree .textpoint').length === {nodes + 1}", timeout=30_000)
    assert "This tree:" in page.inner_text("#lab-status")
    page.click("#lab-measure")
    page.wait_for_function(
        "document.querySelector('#lab-status').innerText.includes('Measured on this prompt')", timeout=300_000
    )
    for plot in ("#lab-gain", "#lab-speedup"):
        assert page.locator(f"{plot} .legendtext", has_text="measured run").count() == 1
    page.wait_for_selector(
        "#lab-acceptance .js-plotly-plot .heatmaplayer, #lab-acceptance .js-plotly-plot image", timeout=30_000
    )
    assert "the Measure run" in page.inner_text("#lab-acceptance")
    page.wait_for_timeout(1000)  # let plotly finish its transitions
    page.screenshot(path=str(LAB_SCREENSHOT), full_page=True)
    assert LAB_SCREENSHOT.stat().st_size > 50_000
    edited = page.input_value("#lab-paths textarea")
    page.click("#lab-use")
    page.wait_for_function("document.querySelector('#lab-status').innerText.includes('Custom tree')", timeout=30_000)
    page.get_by_role("tab", name="Playground").click()
    assert page.input_value("#custom-tree textarea") == edited


def first_drafter() -> str:
    """The drafter the page starts on with the shipped heads: the faster in the EAGLE head's recorded bench
    run, each drafter with the lookup branch beside its tree, as the page runs them."""
    rec = json.loads((ROOT / "assets/heads/smollm2-135m-instruct-eagle/config.json").read_text())["calibration"]
    return "eagle" if rec["lookup_speedup"] > rec["medusa_speedup"] else "medusa"


def back_to_the_default_drafter(page) -> None:
    """For the tests after this one: the default drafter again, and the tree controls as it leaves them (the
    Medusa heads' own, the others' off)."""
    first = first_drafter()
    page.locator(f"#drafter input[value='{first}']").check()
    enabled = "!" if first == "medusa" else ""
    page.wait_for_function(f"{enabled}document.querySelector('#tree-preset input').disabled", timeout=30_000)


def test_the_eagle_drafter_runs_the_medusa_columns_and_the_inspector_marks_it(page):
    """Pick the EAGLE head: the tree controls say they are the Medusa heads' (disabled), the run stays exact
    (float32), and the columns, the summary and the inspector name the EAGLE head as the drafter."""
    page.get_by_role("tab", name="Playground").click()
    if not page.input_value("#prompt textarea").strip():
        page.fill("#prompt textarea", "Why is the sky blue? Answer in two sentences.")
    cfg = json.loads((ROOT / "assets/heads/smollm2-135m-instruct-eagle/config.json").read_text())
    rec, first = cfg["calibration"], first_drafter()
    assert page.is_checked(f"#drafter input[value='{first}']")  # the faster by the recorded run starts selected
    said = {"eagle": "The EAGLE head starts selected", "medusa": "The Medusa heads start selected"}[first]
    assert said in page.inner_text("#drafter-note")
    assert f"EAGLE head {rec['lookup_speedup']:.2f}x plain" in page.inner_text("#drafter-note")
    page.locator("#drafter input[value='eagle']").check()
    page.wait_for_selector("#eagle-tree-note .eagle-tree-note", timeout=30_000)
    assert page.locator("#tree-preset input").is_disabled() and page.locator("#custom-tree textarea").is_disabled()
    tree = f"top-k {cfg['top_k']}, depth {cfg['depth']}, {cfg['num_nodes']} nodes"
    assert tree in page.inner_text("#eagle-tree-note")  # the shipped head's tree (config.json)
    page.click("#run-btn")
    page.wait_for_function(
        "document.querySelector('#status').innerText.includes('Medusa columns drafted by the EAGLE head')",
        timeout=540_000,
    )
    badge = page.query_selector("#greedy-badge [data-equal]")
    assert badge.get_attribute("data-equal") == "true", badge.inner_text()
    for col in ("#out-greedy", "#out-typical"):
        assert page.get_attribute(f"{col} .method-drafter", "data-drafter") == "eagle"
    assert page.locator("#out-plain .method-drafter").count() == 0
    page.wait_for_function(
        "document.querySelector('#tree-plot .gtitle') && document.querySelector('#tree-plot "
        ".gtitle').textContent.includes('drafted by the EAGLE head')",
        timeout=30_000,
    )
    assert "EAGLE head" in page.inner_text("#summary") and "EAGLE head" in page.inner_text("#path-table")
    back_to_the_default_drafter(page)


def test_prompt_lookup_drafts_the_medusa_columns_with_the_tree_controls_off(page):
    """Pick prompt lookup: the tree controls are off with a line saying what it copies, the run stays exact
    (float32), and the columns name prompt lookup as the drafter."""
    page.get_by_role("tab", name="Playground").click()
    page.fill("#prompt textarea", "List the colours red, green, blue, then list the colours red, green, blue again.")
    page.locator("#drafter input[value='lookup']").check()
    page.wait_for_selector("#eagle-tree-note .eagle-tree-note", timeout=30_000)
    assert "Prompt lookup copies" in page.inner_text("#eagle-tree-note")
    assert page.locator("#tree-preset input").is_disabled() and page.locator("#custom-tree textarea").is_disabled()
    page.click("#run-btn")
    page.wait_for_function(
        "document.querySelector('#status').innerText.includes('Medusa columns drafted by prompt lookup')",
        timeout=540_000,
    )
    badge = page.query_selector("#greedy-badge [data-equal]")
    assert badge.get_attribute("data-equal") == "true", badge.inner_text()
    assert page.get_attribute("#out-greedy .method-drafter", "data-drafter") == "lookup"
    back_to_the_default_drafter(page)


def test_a_warning_quoting_a_bad_value_shows_it_as_text(page):
    """gr.Warning renders its message as HTML: a custom tree quoted back in the pop-up must show as typed (issue #26),
    and in the status line, which is Markdown (issue #35). A server of its own (a tiny model), opened in a second
    tab of the module's browser."""
    from conftest import launch, tiny_playground

    demo, url = launch(tiny_playground(oracle=False))
    tab = page.context.new_page()
    try:
        tab.goto(url)
        tab.wait_for_selector("#run-btn", timeout=60_000)
        tab.fill("#prompt textarea", "w10 w11")
        tab.fill("#custom-tree textarea", '[[0], [0, "<b id=injected>x</b> *b* `c`"]]')
        tab.click("#run-btn")
        toast = tab.wait_for_selector("[data-testid='toast-body']", timeout=60_000)
        tab.wait_for_function(
            "document.querySelector(\"[data-testid='toast-body']\").innerText.includes('must contain')", timeout=30_000
        )
        text = toast.inner_text()
        typed = '[0, "<b id=injected>x</b> *b* `c`"]'
        assert typed in text, text  # the value as typed, tags and all
        tab.wait_for_function("document.querySelector('#status').innerText.includes('must contain')", timeout=30_000)
        status = tab.inner_text("#status")
        assert typed in status, status  # the status line's Markdown shows its marks as typed too (issue #35)
        assert not tab.query_selector_all("#status em, #status code, #status a, #status b")
        assert tab.query_selector("#injected") is None  # nothing of it became markup
    finally:
        tab.close()
        demo.close()
