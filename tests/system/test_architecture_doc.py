"""docs/architecture.md names every module under bench/ with its one-line role, and no module that is not there
(issue #48 item 5): a module added, merged, moved or removed without the page following fails here, naming it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
# A row of the page's module tables: | `path/to/module.py` | its role |
ROW = re.compile(r"^\| `(?P<path>[\w/]+\.py)` \| (?P<role>.*) \|$")


def rows(text: str) -> list[tuple[str, str]]:
    """(module path, role) for each row of the page's module tables, in the page's order."""
    return [(m["path"], m["role"].strip()) for m in map(ROW.match, text.splitlines()) if m]


def bench_modules() -> set[str]:
    """Every module file under bench/ (the __init__.py files only mark packages)."""
    return {p.relative_to(REPO).as_posix() for p in (REPO / "bench").rglob("*.py") if p.name != "__init__.py"}


def missing(text: str) -> list[str]:
    """The modules under bench/ that the page has no row for."""
    return sorted(bench_modules() - {path for path, _ in rows(text)})


def gone(text: str) -> list[str]:
    """The modules the page has a row for that are not in the tree."""
    return sorted(path for path, _ in rows(text) if not (REPO / path).is_file())


def test_the_page_names_every_module_under_bench() -> None:
    assert not missing(DOC.read_text(encoding="utf-8")), "docs/architecture.md lacks a row for these modules"


def test_every_module_the_page_names_exists() -> None:
    assert not gone(DOC.read_text(encoding="utf-8")), "docs/architecture.md names modules that are not in the tree"


def test_each_module_has_one_row_and_a_role() -> None:
    paths = [path for path, _ in rows(DOC.read_text(encoding="utf-8"))]
    assert len(paths) == len(set(paths)), sorted({p for p in paths if paths.count(p) > 1})
    assert all(role for _, role in rows(DOC.read_text(encoding="utf-8")))


def test_the_checks_see_a_module_left_out_and_one_merged_away() -> None:
    """The checks can fail: the page without one row, and with a row for a module that is not there."""
    dropped, merged = "bench/exec/stage.py", "bench/exec/no_such_module.py"
    text = DOC.read_text(encoding="utf-8")
    assert dropped in bench_modules() and f"| `{dropped}` |" in text
    lines = [line for line in text.splitlines() if not line.startswith(f"| `{dropped}` |")]
    broken = "\n".join([*lines, f"| `{merged}` | a room that was merged away |"])
    assert missing(broken) == [dropped]
    assert gone(broken) == [merged]
