"""The shape of the code, checked: no import circle, no private name taken across modules, modules and functions
of a readable size, few imports inside functions (each with its reason), and plug-ins that import only the plug-in
interfaces. `lint-imports` (pyproject.toml) checks the layers and the bare-GPU-box rule over `bench`; the plug-in
folders are mapped into `bench` by setuptools' package-dir, which import-linter cannot see, so their rule is here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

from bench import config

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
PLUGIN_FOLDERS = {"baselines": REPO / "baselines", "datasets": REPO / "datasets"}
# What a plug-in may import from bench: the interfaces (docs/architecture.md) and its own folder's shared helpers.
PLUGIN_INTERFACES = set(config.PLUGIN_INTERFACES)
BARE_BOX_FORBIDDEN = {"ray", "mlflow", "yaml", "scipy", "matplotlib"}
# docs/architecture.md and issue #48: a module ends where its concept ends, at most 600 lines, a function at most 80;
# the caps are a ceiling against a module that does too much, never the reason to cut one.
MODULE_LINES = 600
FUNCTION_LINES = 80
LONG_FUNCTIONS_ALLOWED = 0
INNER_IMPORTS_ALLOWED = 22  # 20: the run summary imports bench.report late, so a Ray worker never loads it (#47);
# 22: the readers import the plug-in registries (torch) late, so `bench results` imports no torch (#56)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    if parts[0] in PLUGIN_FOLDERS:
        parts = ("bench", *parts)
    return ".".join(p for p in parts if p != "__init__")


def sources() -> list[Path]:
    files = sorted(BENCH.rglob("*.py"))
    for folder in PLUGIN_FOLDERS.values():
        files += sorted(folder.glob("*.py"))
    return files


def imports(path: Path) -> list[tuple[ast.ImportFrom | ast.Import, bool]]:
    """Every import statement of a file, with whether it sits inside a function."""
    tree = ast.parse(path.read_text())
    found: list[tuple[ast.ImportFrom | ast.Import, bool]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, in_function))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    walk(tree, False)
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the import circles are the components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [c for c in components if len(c) > 1]


def test_tarjan_finds_a_circle_and_only_a_circle() -> None:
    """The checker itself can fail: a -> b -> c -> a is one circle; d -> a is not part of it."""
    circles = strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert [sorted(c) for c in circles] == [["a", "b", "c"]]


def test_no_import_circle_counting_imports_in_functions_and_under_type_checking() -> None:
    graph = grimp.build_graph("bench", exclude_type_checking_imports=False)
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i.startswith("bench")}
             for m in graph.modules}
    # A package's __init__ is empty here; an import of a sub-module also names its package: not a circle.
    edges = {m: {i for i in targets if not m.startswith(i + ".")} for m, targets in edges.items()}
    assert strongly_connected(edges) == []


def test_no_module_takes_another_modules_private_name() -> None:
    offenders = []
    for path in sources():
        own = module_name(path)
        for node, _ in imports(path):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench"):
                shared_helper = node.module.rsplit(".", 1)[-1].startswith("_")  # e.g. baselines/_own_optimizer.py
                for alias in node.names:
                    dunder = alias.name.startswith("__") and alias.name.endswith("__")  # __version__ is public
                    if alias.name.startswith("_") and not dunder and node.module != own and not shared_helper:
                        offenders.append(f"{own} takes {node.module}.{alias.name}")
    assert offenders == []


def test_modules_and_functions_stay_readable() -> None:
    long_modules = {module_name(p): n for p in BENCH.rglob("*.py")
                    if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert long_modules == {}
    long_functions = []
    for path in BENCH.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES:
                    long_functions.append(f"{module_name(path)}.{node.name} ({length} lines)")
    assert len(long_functions) <= LONG_FUNCTIONS_ALLOWED, long_functions


def test_imports_inside_functions_are_few_and_say_why() -> None:
    """An import inside a function hides a dependency; each of the few left says why it waits (an optional
    package, a second of import time, a command's own module)."""
    inner = []
    for path in BENCH.rglob("*.py"):
        lines = path.read_text().splitlines()
        for node, in_function in imports(path):
            if in_function and isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench"):
                above = node.lineno - 2  # the comment may stand above a block of imports
                while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
                    above -= 1
                reason = "#" in lines[node.lineno - 1] or lines[above].strip().startswith("#")
                inner.append((f"{module_name(path)}:{node.lineno}", reason))
    assert len(inner) <= INNER_IMPORTS_ALLOWED, inner
    assert [where for where, reason in inner if not reason] == []


@pytest.mark.parametrize("folder", sorted(PLUGIN_FOLDERS))
def test_plugins_import_only_the_plugin_interfaces(folder: str) -> None:
    """A method or a dataset file sees the interfaces (methods, data, models, dmi, noise, schema, config), never the
    runner, the store or the report, and nothing a bare GPU box lacks (the interfaces are held to that by
    lint-imports)."""
    offenders = []
    for path in sorted(PLUGIN_FOLDERS[folder].glob("*.py")):
        preparing = {n.lineno for f in ast.walk(ast.parse(path.read_text()))
                     if isinstance(f, ast.FunctionDef) and f.name == "prepare" for n in ast.walk(f)
                     if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node, _ in imports(path):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                # `Dataset.prepare` (`bench datasets --prepare`) runs on the user's machine, where bench's own
                # dependencies are installed, never in a trial: it may read a file format with one of them
                if top in BARE_BOX_FORBIDDEN and node.lineno not in preparing:
                    offenders.append(f"{path.name} imports {name}")
                if top == "bench" and name != "bench" and not any(
                        name == i or name.startswith(i + ".") for i in PLUGIN_INTERFACES):
                    offenders.append(f"{path.name} imports {name}")
                if name == "bench" and isinstance(node, ast.ImportFrom):
                    offenders += [f"{path.name} imports bench.{a.name}" for a in node.names
                                  if f"bench.{a.name}" not in PLUGIN_INTERFACES]
    assert offenders == []


def test_every_sub_package_has_a_layers_contract() -> None:
    """`lint-imports` layers the modules inside each sub-package too (pyproject.toml): a new one gets its own, and
    a new module must be placed in a layer of its package's contract."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layered = {c for contract in contracts if contract["type"] == "layers" for c in contract.get("containers", [])}
    packages = {module_name(p.parent) for p in BENCH.glob("*/__init__.py")}
    assert {"bench.cli", "bench.exec", "bench.grid", "bench.report", "bench.store"} <= packages
    assert sorted(packages - layered) == []
    # Exhaustive: lint-imports fails on a module that no layer names, so a new file is inside its contract at once.
    loose = [c["name"] for c in contracts if c["type"] == "layers" and c.get("containers") and not c.get("exhaustive")]
    assert loose == []


def test_progress_travels_as_values_not_as_log_text() -> None:
    """The training core's progress reaches the driver as events (bench.exec.events); no module on that path reads a
    log line back with a regular expression."""
    path = ["exec/events.py", "exec/stage.py", "exec/trainer.py", "exec/pack.py", "grid/progress.py", "grid/runner.py",
            "grid/mlflow_callback.py"]
    readers = [p for p in path for node, _ in imports(BENCH / p)
               if (isinstance(node, ast.Import) and any(a.name == "re" for a in node.names))
               or (isinstance(node, ast.ImportFrom) and node.module == "re")]
    assert readers == []


def test_every_package_and_data_file_is_installed() -> None:
    """pyproject.toml names bench's packages one by one (baselines/ and datasets/ are mapped in): a package or a data
    file it does not name works in an editable install and is missing from a wheel."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {module_name(p.parent) for p in BENCH.rglob("__init__.py")}
    assert sorted(packages - set(setuptools["packages"])) == []
    data = {(module_name(p.parent), p.name) for p in BENCH.rglob("*") if p.suffix in {".csv", ".css", ".js", ".json"}}
    declared = {(package, name) for package, names in setuptools["package-data"].items() for name in names}
    assert sorted(data - declared) == []
