"""Start-up: `bench trial` and a grid's Ray worker import only what their path uses (issue #47 item 2). Each check
runs in a fresh interpreter, so that the modules other tests loaded do not count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Loaded by the report, the results tables, MLflow and Ray: none of them trains a trial.
NOT_FOR_TRAINING = ("mlflow", "polars", "ray", "scipy", "bench.report")


def _loaded_after(code: str, cwd: Path) -> list[str]:
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {NOT_FOR_TRAINING!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 - our own probe's printed list


def test_the_cli_loads_nothing_heavy(tmp_path: Path) -> None:
    assert _loaded_after("import bench.cli.main", tmp_path) == []


def test_a_trial_trains_and_writes_its_row_without_the_report_mlflow_polars_or_ray(tmp_path: Path) -> None:
    code = ("from bench.cli.main import main\n"
            "assert main(['trial', '--dataset', 'synthetic', '--method', 'dmi', '--noise', 'case3', '--r', '0.3', "
            f"'--epochs', '1', '--epochs-warmup', '1', '--train-subset', '500', '--results', {str(tmp_path)!r}]) == 0")
    assert _loaded_after(code, tmp_path) == []
    assert len(list((tmp_path / "trials").glob("*.parquet"))) == 1  # it did run


def test_a_grid_worker_loads_neither_the_report_nor_polars(tmp_path: Path) -> None:
    """A Ray worker imports bench.grid.runner to run `ray_unit`: Ray it needs (lazily, in the function), the summary's
    polars and SciPy (bench.report) and MLflow it does not."""
    assert _loaded_after("import bench.grid.runner", tmp_path) == []
