"""The codebase stays one a newcomer can carry on (issue 44): small modules,
functions and classes, a one-way import graph, and a root that holds only
what a reader looks for.  Each limit is checked over the package, the tests
and the benchmark scripts, so a growing file fails here, not in review."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "blackbox_spec"
SOURCES = [PACKAGE, REPO / "tests", REPO / "benchmarks", REPO / "examples"]
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_CLASS_LINES = 600, 60, 300
ROOT_ENTRIES = {".ci", ".gitignore", "LICENSE", "README.md", "pyproject.toml", "blackbox_spec", "tests", "examples", "docs", "benchmarks"}


def python_files() -> list[Path]:
    return sorted(path for folder in SOURCES if folder.exists() for path in folder.rglob("*.py") if ".venv" not in path.parts)


def oversized(path: Path) -> list[str]:
    """What in ``path`` is over the limits, as "path:line what (n lines)"."""
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(REPO)
    found = [f"{where}: module ({text.count(chr(10))} lines)"] if text.count("\n") > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(text)):
        limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            size = node.end_lineno - node.lineno + 1
            if size > limit:
                found.append(f"{where}:{node.lineno} {node.name} ({size} lines)")
    return found


def test_no_module_function_or_class_is_over_its_limit():
    found = [problem for path in python_files() for problem in oversized(path)]
    assert not found, "over the limits (600 / 60 / 300 lines):\n" + "\n".join(found)


def test_the_size_check_catches_a_long_function(tmp_path):
    """Control: the check above sees a function one line over the limit."""
    long = tmp_path / "long.py"
    long.write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    original = globals()["REPO"]
    globals()["REPO"] = tmp_path
    try:
        assert oversized(long) == [f"long.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
    finally:
        globals()["REPO"] = original


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports when it is loaded, including
    under ``if TYPE_CHECKING:`` (a cycle there is still a cycle to a
    reader); imports inside functions are deliberate lazy ones and count not."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body + getattr(node, "orelse", []))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(kept + ([node.module] if node.module else []))
                for alias in node.names:
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return (found & modules) - {name}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def test_the_package_has_no_import_cycle():
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    graph = {module_name(path): imports_of(path, modules) for path in paths}
    assert import_cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_root_holds_only_what_a_reader_looks_for():
    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the root's tracked files are unknown")
    assert {name.split("/")[0] for name in tracked} <= ROOT_ENTRIES
