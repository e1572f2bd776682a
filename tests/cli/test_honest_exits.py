"""What a command says and leaves when it refuses (issue 44, "small lies"): a dry run with missing data exits as the
run does; a run refused before training writes nothing into its results folder; a YAML error names the file, line
and column in one line; `bench results --wide` shows every column of the rows."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench.cli import main as cli
from tests.report.test_report import GRID_ROWS, write

REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / "tune_configs" / "demo.yaml")


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def test_missing_data_ends_the_dry_run_as_it_ends_the_run_and_the_run_writes_nothing(tmp_path: Path,
                                                                                      capsys) -> None:
    empty = tmp_path / "no_data"
    empty.mkdir()
    results = tmp_path / "results"
    codes, errors = [], []
    for extra in (["--dry-run"], []):
        code = cli.main(["run", DEMO, "--data-root", str(empty), "--results", str(results), *extra])
        out, err = capsys.readouterr()
        codes.append(code)
        errors.append(_error_lines(err))
    assert codes == [2, 2]
    assert errors[0] == errors[1] and len(errors[0]) == 1 and errors[0][0].startswith("bench: error: ")
    assert "fashion_mnist" in errors[0][0]
    # Refused before training: no results folder at all (no mlflow.db, no .bench.lock, no Ray state).
    assert not results.exists(), sorted(p.name for p in results.rglob("*"))


@pytest.mark.parametrize("text, line, column", [
    ("name: bad\ndataset: mr\n  noise: pos_to_neg\n", 3, 8),  # an indented key under a scalar
    ("name: bad\nmethods:\n  ce: {}\n   dmi: {}\n", 4, 4),  # a key indented one space too far
    ("name: bad\nr: [0.1, 0.2\nseeds: [0]\n", 3, 6),  # an unclosed list
])
def test_a_yaml_error_names_the_file_line_and_column_in_one_line(tmp_path: Path, capsys, text: str, line: int,
                                                                 column: int) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text(text, encoding="utf-8")
    for extra in (["--dry-run"], []):
        assert cli.main(["run", str(path), "--results", str(tmp_path / "r"), *extra]) == 2
        (err,) = _error_lines(capsys.readouterr().err)
        # PyYAML counts from 0; an editor, and this line, from 1.
        assert err.startswith(f"bench: error: {path}, line {line}, column {column}: not valid YAML: "), err
        assert "<unicode string>" not in err and "^" not in err
    assert not (tmp_path / "r").exists()


def test_results_wide_shows_every_column(tmp_path: Path, capsys) -> None:
    results = write(tmp_path / "results", GRID_ROWS)
    files = sorted((results / "trials").glob("*.parquet"))
    columns = set().union(*(pq.read_schema(f).names for f in files))
    assert len(columns) > 30
    assert cli.main(["results", str(results), "--wide"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert set(lines[0].split()) == columns  # the header: every column the files hold, once
    assert len(lines) == 2 + len(files) + 1  # header, rule, one line per trial, the count
    assert lines[-1].startswith(f"{len(files)} rows, all {len(columns)} columns")
    for f in files:  # each trial's own values are on its line
        row = pq.read_table(f).to_pylist()[0]
        (mine,) = [ln for ln in lines if ln.startswith(row["trial_id"])]
        assert row["git_commit"] in mine and row["config_json"][:20] in mine
