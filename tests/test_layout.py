"""The package's shape: three wings whose imports point inward only, no cycles, no gradio.

core/ imports nothing outside core/; present/ (the page's data) uses core/ only; pipeline/ (the
offline CLIs) uses core/ only; serving (ui/, app.py) never reaches the pipeline.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "medusa_lib"
ALLOWED = {"core": {"core"}, "present": {"core", "present"}, "pipeline": {"core", "pipeline"}}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imports_of(path: Path) -> set[str]:
    """medusa_lib modules a file imports (relative imports resolved), at any depth in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{a.name}" if (PACKAGE / Path(*f"{base}.{a.name}".split(".")[1:])).with_suffix(".py").exists() else base for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m == "medusa_lib" or m.startswith("medusa_lib.") or m.split(".")[0] in ("gradio", "ui")}


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
        wings = {d.split(".")[1] for d in deps if d.count(".") >= 1 and d.split(".")[1] in ALLOWED}
        assert wings <= ALLOWED[parts[1]], f"{module} imports {sorted(wings - ALLOWED[parts[1]])}"


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
