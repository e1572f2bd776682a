"""docs/extending.md's panel recipe is true (issue 48): a panel in a `$BENCH_PLUGINS` folder is its file alone; one in
`bench/report/` also needs its module in the panels' layer of the report contract, the very line the recipe quotes,
which holds exactly the built-in panels, and with that line (and only with it) `lint-imports` passes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report.panel import panels

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def recipe() -> str:
    text = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
    return text[text.index("## A new panel"):][len("## A new panel"):].split("\n## ")[0]


def report_layers() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c.get("containers") == ["bench.report"]]
    assert contract["exhaustive"] is True  # what makes the line necessary
    return contract["layers"]


def quoted_layer() -> str:
    (layer,) = re.findall(r'`"([a-z_ |]+)"`', " ".join(recipe().split()))
    return layer


def test_the_recipe_quotes_the_layer_of_exactly_the_built_in_panels() -> None:
    layer = quoted_layer()
    assert layer in report_layers()
    built_in = {type(p).__module__.removeprefix("bench.report.") for p in panels()}
    assert set(layer.split(" | ")) == built_in
    # ... and their declared orders are the ones the recipe gives.
    for p in panels():
        assert f"{p.name} {p.order:g}" in " ".join(recipe().split())


def test_a_panel_in_bench_report_passes_lint_imports_with_the_recipes_line_only(tmp_path: Path) -> None:
    shutil.copytree(REPO / "bench", tmp_path / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", recipe(), flags=re.S)]
    (tmp_path / "bench" / "report" / "seeds.py").write_text(block, encoding="utf-8")
    config = (REPO / "pyproject.toml").read_text(encoding="utf-8")

    def lint(text: str) -> subprocess.CompletedProcess:
        (tmp_path / "pyproject.toml").write_text(text, encoding="utf-8")
        return subprocess.run([str(LINT), "--no-cache", "--config", "pyproject.toml"], cwd=tmp_path, text=True,
                              capture_output=True, timeout=300, env={"PYTHONPATH": str(tmp_path), "PATH": ""})

    alone = lint(config)
    assert alone.returncode != 0 and "bench.report.seeds" in alone.stdout, alone.stdout[-2000:] + alone.stderr
    layer = quoted_layer()
    assert config.count(f'"{layer}"') == 1
    added = lint(config.replace(f'"{layer}"', f'"{layer} | seeds"'))
    assert added.returncode == 0, added.stdout[-2000:] + added.stderr
