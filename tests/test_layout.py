"""The package's shape: three wings whose imports point inward only, no cycles, no gradio.

core/ imports nothing outside core/; present/ (the page's data) uses core/ only; pipeline/ (the
offline CLIs) uses core/ only, except the CLIs that measure the page's own path (page_check over many
prompts, server_check against a live server, fit_check: the start-up fit against the bench); serving
(ui/, app.py) never reaches the pipeline. tools/ (staging the GPU check onto a machine reached by
copying files) may use the library; neither the library nor serving imports tools/.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "medusa_lib"
ALLOWED = {"core": {"core"}, "present": {"core", "present"}, "pipeline": {"core", "pipeline"}}
# these measure Playground.compare, the page's own path (server_check: against the live server's /compare)
PAGE_PATH = {
    "medusa_lib.pipeline.page_check": {"present"},
    "medusa_lib.pipeline.server_check": {"present"},
    "medusa_lib.pipeline.fit_check": {"present"},
}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def is_module(name: str) -> bool:
    """Whether a dotted medusa_lib name is a module or a package (else it is a name inside one)."""
    if not name.startswith("medusa_lib."):
        return False
    where = PACKAGE / Path(*name.split(".")[1:])
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def imports_of(path: Path) -> set[str]:
    """medusa_lib modules a file imports (relative imports resolved), at any depth in the file."""
    name = module_name(path)
    return imports_in(
        path.read_text(encoding="utf-8"), package=name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    )


def imports_in(source: str, *, package: str) -> set[str]:
    """medusa_lib modules (and gradio, ui, tools) that ``source``, a module of ``package``, imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    outside = ("gradio", "ui", "tools")
    return {m for m in found if m == "medusa_lib" or m.startswith("medusa_lib.") or m.split(".")[0] in outside}


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def test_each_wing_imports_only_inward_and_nothing_imports_gradio():
    g = graph()
    assert {m.split(".")[1] for m in g if m.count(".") >= 2} == set(ALLOWED)
    for module, deps in g.items():
        assert not any(d.split(".")[0] in ("gradio", "ui") for d in deps), module
        parts = module.split(".")
        if len(parts) < 3:
            continue
        assert "medusa_lib" not in deps, f"{module} imports the top-level package, which loads every wing"
        wings = {d.split(".")[1] for d in deps if d.count(".") >= 1 and d.split(".")[1] in ALLOWED}
        assert wings <= ALLOWED[parts[1]] | PAGE_PATH.get(module, set()), (
            f"{module} imports {sorted(wings - ALLOWED[parts[1]])}"
        )


def test_a_package_imported_by_name_counts_as_that_package():
    """`from medusa_lib import present` and `from .. import core` are imports of those packages."""
    source = (
        "from medusa_lib import present\nfrom .. import core\nfrom ..core import tree\n"
        "from medusa_lib import load_model\nimport gradio as gr\nfrom tools import gpu_pack\nimport tools.gpu_plan\n"
    )
    assert imports_in(source, package="medusa_lib.pipeline") == {
        "medusa_lib.present",
        "medusa_lib.core",
        "medusa_lib.core.tree",
        "medusa_lib",
        "gradio",
        "tools",
        "tools.gpu_plan",
    }


def test_no_import_cycles():
    full = graph()
    g = {m: {d for d in deps if d in full} for m, deps in full.items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in g[m]:
            assert state.get(d) != 1, " -> ".join(path + [m, d])
            if d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in g:
        if m not in state:
            visit(m, [])


def test_serving_never_imports_the_pipeline():
    for path in [ROOT / "app.py", *(ROOT / "ui").rglob("*.py"), *(PACKAGE / "present").rglob("*.py")]:
        assert not any(".pipeline" in d for d in imports_of(path) if d.startswith("medusa_lib")), path


def test_neither_the_library_nor_serving_imports_tools():
    """tools/ serves one case (a GPU machine reached by copying files) and may import medusa_lib, never the reverse."""
    assert (ROOT / "tools" / "gpu_pack.py").exists(), "the staging lives in tools/"
    for path in [ROOT / "app.py", *(ROOT / "ui").rglob("*.py"), *PACKAGE.rglob("*.py")]:
        found = sorted(d for d in imports_of(path) if d.split(".")[0] == "tools")
        assert not found, f"{path.relative_to(ROOT)} imports {found}"


# The core's floors: the foundations (settings, trees, defaults, messages) import neither the rules
# nor the engines nor any drafter, so those build on them and never the other way round.
FOUNDATIONS = ("caches", "config", "defaults", "draft", "messages", "tree")
ABOVE = (
    "acceptance",
    "rules",
    "lookup",
    "decoding",
    "plain",
    "fused",
    "static_run",
    "kv",
    "engine",
    "prefill",
    "drafters",
    "compose",
)


def test_the_cores_foundations_import_no_rule_engine_or_drafter():
    g = graph()
    # the tree is a package: every file of it
    assert {"medusa_lib.core.tree.shape", "medusa_lib.core.tree.masks"} <= set(g)
    for name in FOUNDATIONS:
        for module in [m for m in g if m == f"medusa_lib.core.{name}" or m.startswith(f"medusa_lib.core.{name}.")]:
            deps = {d.split(".")[2] for d in g[module] if d.count(".") >= 2}
            assert not deps & set(ABOVE), f"{module} imports {sorted(deps & set(ABOVE))}"


# The verifier and the drafters meet only through core/draft.py (the contract) and core/compose.py (above both).
VERIFIER = ("decoding", "plain", "fused", "static_run", "steps", "kv", "engine", "prefill")


def is_drafters(module: str) -> bool:
    """Whether a core module is a drafter's: the drafters package, an EAGLE head's modules, the dynamic tree,
    the lookup chain, the Medusa heads."""
    name = module.removeprefix("medusa_lib.core.")
    first = name.split(".")[0]
    return first in ("drafters", "dynamic_tree", "lookup") or first.startswith(("eagle", "heads"))


def is_verifier(module: str) -> bool:
    return module.removeprefix("medusa_lib.core.") in VERIFIER


def crossings(g: dict[str, set[str]]) -> list[str]:
    """Every import from the verifier to a drafter's module, or from a drafter's module to the verifier."""
    out = []
    for module, deps in g.items():
        if not module.startswith("medusa_lib.core."):
            continue
        for d in sorted(deps):
            if (is_verifier(module) and is_drafters(d)) or (is_drafters(module) and is_verifier(d)):
                out.append(f"{module} imports {d}")
    return out


def test_the_verifier_and_the_drafters_never_import_each_other():
    g = graph()
    assert {f"medusa_lib.core.{n}" for n in VERIFIER} <= set(g)
    assert {"medusa_lib.core.drafters.base", "medusa_lib.core.eagle_static", "medusa_lib.core.lookup"} <= set(g)
    assert crossings(g) == []
    # both sides use the contract, and the composition sits above both
    assert "medusa_lib.core.draft" in g["medusa_lib.core.decoding"] | g["medusa_lib.core.steps"]
    assert "medusa_lib.core.draft" in g["medusa_lib.core.drafters.base"]
    assert {"medusa_lib.core.decoding", "medusa_lib.core.drafters"} <= g["medusa_lib.core.compose"]


def test_a_crossing_either_way_is_found():
    """The check above reads imports the way a newcomer might write them: relative, from a package, nested."""
    g = graph()
    verifier_side = imports_in("from .drafters import make_drafter\n", package="medusa_lib.core")
    assert crossings({**g, "medusa_lib.core.decoding": verifier_side}) == [
        "medusa_lib.core.decoding imports medusa_lib.core.drafters"
    ]
    nested = imports_in("def f():\n    from ..kv import ALIGN\n", package="medusa_lib.core.drafters")
    assert crossings({**g, "medusa_lib.core.drafters.rest": nested}) == [
        "medusa_lib.core.drafters.rest imports medusa_lib.core.kv"
    ]
    eagle = imports_in("from .fused import WIDTH\n", package="medusa_lib.core")
    assert crossings({**g, "medusa_lib.core.eagle_static": eagle}) == [
        "medusa_lib.core.eagle_static imports medusa_lib.core.fused"
    ]
