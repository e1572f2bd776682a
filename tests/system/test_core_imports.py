"""The training core imports no plug-in by name (issue #48): no dataset (`bench.datasets.*`), no method
(`bench.baselines.*`), no executor kind (`bench.exec.executors.*`); it reaches them through their registries
(`bench.config.discover`), so that a built-in is a plug-in like any other. lint-imports cannot see the first two: the
plug-in folders are mapped into `bench` by setuptools' package-dir. The training core is what pyproject.toml's
bare-GPU-box contract names, `bench.exec` less its plug-in folder `executors/`."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = ("bench.datasets", "bench.baselines", "bench.exec.executors")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")


def core_modules() -> list[str]:
    """The bare-GPU-box contract's source modules (pyproject.toml): the training core."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (core,) = [c for c in contracts if c["name"].startswith("The training core")]
    return core["source_modules"]


def core_files() -> list[Path]:
    """Each core module's file; a package's own modules, not its sub-packages (exec's `executors/` is plug-ins)."""
    files = []
    for module in core_modules():
        path = REPO.joinpath(*module.split("."))
        files += sorted(path.glob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
    return files


def imported(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`, inside functions and under TYPE_CHECKING too; `from A import b`
    counts as A and as A.b (b may be a module: `from bench.exec import executors`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def plugin_imports(source: str) -> list[tuple[int, str]]:
    return [(line, name) for line, name in imported(source)
            if any(name == p or name.startswith(p + ".") for p in PLUGINS)]


def test_the_core_is_what_the_contract_says() -> None:
    files = {p.relative_to(REPO).as_posix() for p in core_files()}
    assert {"bench/exec/calibrate.py", "bench/exec/executor.py", "bench/data.py", "bench/methods.py"} <= files
    assert not any(f.startswith("bench/exec/executors/") for f in files)
    assert all((REPO / f).is_file() for f in files)


def test_the_check_sees_every_form_of_import() -> None:
    """The check itself: each way of naming a plug-in is caught, the interfaces are not."""
    caught = plugin_imports("""
from bench.datasets.cifar10 import BATCHES
import bench.baselines.ce
from bench.exec import executors
def late():
    from bench.exec.executors.streams import Baton
from bench import datasets
from bench.data import Dataset
from bench.exec.executor import executors as registry
import bench.exec.packed
""")
    assert sorted({line for line, _ in caught}) == [2, 3, 4, 6, 7]


@pytest.mark.parametrize("path", core_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_the_training_core_imports_no_plugin_by_name(path: Path) -> None:
    found = plugin_imports(path.read_text())
    assert not found, (f"{path.relative_to(REPO)} imports plug-ins by name: "
                       + ", ".join(f"{name} (line {line})" for line, name in found)
                       + "; reach them through their registry (bench.config.discover)")
