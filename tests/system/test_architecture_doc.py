"""The code's map is drawn once: docs/architecture.md's module tables and the panels' layer that docs/extending.md
quotes are what docs/make_tables.py writes from the layers of `pyproject.toml` (and each module's docstring), and the
page names every module under bench/ and no module that is not there. A module added, merged, moved or removed
without its name in its package's layers and the command fails here (or in lint-imports), naming it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("tomllib")  # docs/make_tables.py reads pyproject.toml with it (Python 3.11+)

from tests.system.test_readme_tables import make_tables  # noqa: E402 - after the skip

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
# A row of the page's module tables: | `path/to/module.py` | its role |
ROW = re.compile(r"^\| `(?P<path>[\w/]+\.py)` \| (?P<role>.*) \|$")


def rows(text: str) -> list[tuple[str, str]]:
    """(module path, role) for each row of the page's module tables, in the page's order."""
    return [(m["path"], m["role"].strip()) for m in map(ROW.match, text.splitlines()) if m]


def test_the_pages_tables_are_what_the_generator_writes() -> None:
    assert make_tables().stale() == [], "stale tables: run `python docs/make_tables.py`"


def test_the_page_names_every_module_under_bench_once_with_a_role() -> None:
    named = rows(DOC.read_text(encoding="utf-8"))
    paths = [path for path, _ in named if path.startswith("bench/")]
    on_disk = {p.relative_to(REPO).as_posix() for p in (REPO / "bench").rglob("*.py") if p.name != "__init__.py"}
    assert len(paths) == len(set(paths)) and set(paths) == on_disk, sorted(set(paths) ^ on_disk)
    assert all(role.endswith(".") and len(role) > 10 for _, role in named)


def test_a_module_no_layer_names_is_refused_by_the_generator(tmp_path) -> None:
    """The layers are the map: the generator draws what they name, and a module's row is its docstring's first
    sentence, or it stops with the one line that says to write one."""
    module = make_tables()
    assert module.summary(REPO / "bench" / "exec" / "stage.py").startswith("The stage loop and what a stage trains")
    bare = tmp_path / "bare.py"
    bare.write_text("x = 1\n")
    module.REPO = tmp_path  # the line names the file relative to the checkout
    with pytest.raises(SystemExit, match=r"bare\.py has no docstring whose first sentence says what it holds"):
        module.summary(bare)
