"""A report that knows its grid (#55): the grids `bench run` recorded in a results folder (`bench.store.grids`)
against its rows, in `bench report`, `bench leaderboard` and `bench results` (`bench.report.completeness`)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest

from bench.cli import main as cli
from bench.grid.files import load_experiment
from bench.store import grids
from tests.report.test_report import make_row, write

DEMO = Path(__file__).resolve().parents[2] / "tune_configs" / "demo.yaml"


@pytest.fixture()
def stopped_demo(tmp_path: Path) -> Path:
    """The demo's grid recorded as `bench run` records it, stopped after its first 2 trials (CE, seed 0, r 0 and
    0.3): real rows under the demo's own trial ids."""
    exp = load_experiment(DEMO)
    trials = exp.trials()
    results = tmp_path / "results"
    grids.record(results, exp.name, exp.text, trials)
    rows = []
    for t, acc in zip(trials[:2], (90.0, 70.0), strict=True):
        rows.append(make_row(t.method, t.r, t.seed, 0.3, acc, dataset=t.dataset, noise=t.noise)
                    | dict(trial_id=t.trial_id))
    return write(results, rows)


def test_a_grid_stopped_part_way_says_which_trials_and_cells_are_missing(stopped_demo: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """Before #55 the stopped demo read "2 of 2 cells measured (0 missing)" with a CE-only table."""
    assert (stopped_demo / "grids" / "demo.yaml").read_text() == DEMO.read_text()  # the grid, runnable again
    assert cli.main(["leaderboard", str(stopped_demo)]) == 0
    board = capsys.readouterr().out
    assert "2 of 8 cells measured (6 missing)" in board
    assert "Grid demo: 14 of 16 trials missing (no row): CE 6 of 8, L_DMI 8 of 8; in 8 cells:" in board
    assert "fashion_mnist case3 r=0.0 CE (seed 1)" in board and "r=0.6 L_DMI (seeds 0, 1)" in board
    header = next(line for line in board.splitlines() if line.lstrip().startswith("r "))
    assert header.split() == ["r", "CE", "L_DMI"]  # the method without a row is a column of missing cells
    first = next(line for line in board.splitlines() if line.startswith("0.0 "))
    assert "90.00 [1/2 missing]" in first and "— [2/2 missing]" in first
    assert "[k/m missing]: k of the m trials" in board

    assert cli.main(["report", str(stopped_demo), "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    grid = pl.read_csv(tmp_path / "report" / "cells.csv")
    assert grid.filter(method="dmi")[["planned", "unmeasured"]].rows() == [(2, 2)] * 4
    assert grid.filter(method="ce").sort("r")["unmeasured"].to_list() == [1, 1, 2, 2]
    assert "14 of 16 trials missing" in (tmp_path / "report" / "leaderboard.md").read_text()

    assert cli.main(["results", str(stopped_demo)]) == 0
    assert "Grid demo: 14 of 16 trials missing" in capsys.readouterr().out


def test_a_failed_row_counts_as_missing_and_a_complete_grid_says_so(stopped_demo: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    exp = load_experiment(DEMO)
    third = exp.trials()[2]
    write(stopped_demo, [make_row(third.method, third.r, third.seed, None, None, status="failed",
                                  dataset=third.dataset, noise=third.noise) | dict(trial_id=third.trial_id)])
    assert cli.main(["results", str(stopped_demo)]) == 0
    assert "Grid demo: 14 of 16 trials missing (1 failed or without numbers, 13 without a row)" in \
        capsys.readouterr().out

    grids.record(stopped_demo, "two", "", exp.trials()[:2])
    assert cli.main(["results", str(stopped_demo)]) == 0
    assert "Grid two: all 2 trials have a usable row." in capsys.readouterr().out.splitlines()


def test_status_shows_a_running_grids_progress_and_eta_from_its_files(stopped_demo: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """#55: following a grid from a second shell meant reading the driver's log. `bench status` reads the grid's
    record, the rows and the folder's lock file: 2 rows landed in the 100 s since the run started, 14 to go: ETA
    about 700 s; the lock file names a live process (this one), then a gone one."""
    record = stopped_demo / "grids" / "demo.json"
    data = json.loads(record.read_text())
    start = time.time() - 100
    record.write_text(json.dumps(data | {"started_at": time.strftime(grids.STAMP, time.gmtime(start))}))
    for path in (stopped_demo / "trials").glob("*.parquet"):  # both rows landed after the start
        pl.read_parquet(path).with_columns(finished_at=pl.lit(time.strftime(grids.STAMP, time.gmtime(start + 50)))) \
            .write_parquet(path)
    holder = f"`bench` pid {os.getpid()} on {socket.gethostname()} since 2026-01-01 00:00:00"
    (stopped_demo / ".bench.lock").write_text(holder)
    assert cli.main(["status", str(stopped_demo)]) == 0
    first, second = capsys.readouterr().out.splitlines()
    found = re.fullmatch(r"demo: 2 of 16 trials have a usable row, 0 failed, 14 to go; started 1m4\ds ago, 2 rows "
                         r"since: ETA about (\d+)m(\d\d)s", first)
    assert found and 690 <= int(found[1]) * 60 + int(found[2]) <= 730, first
    assert second == f"running: {holder}"

    dead = subprocess.Popen(["true"])  # a process of this host that has ended
    dead.wait()
    (stopped_demo / ".bench.lock").write_text(f"`bench` pid {dead.pid} on {socket.gethostname()} since 2026-01-01")
    assert cli.main(["status", str(stopped_demo)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "demo: 2 of 16 trials have a usable row, 0 failed, 14 to go",
        "no `bench run` holds the folder now: run its grid again to finish it"]


def test_the_readers_say_when_mlflow_holds_fewer_trials_than_rows(stopped_demo: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    """#55: a folder whose MLflow store was partly synced read as whole. A real embedded store, synced with the two
    rows (`bench sync-mlflow`), then a third row lands: the readers say MLflow holds 2 of the 3."""
    assert cli.main(["sync-mlflow", str(stopped_demo)]) == 0
    capsys.readouterr()
    assert cli.main(["results", str(stopped_demo)]) == 0
    assert "MLflow" not in capsys.readouterr().out  # it holds every row's trial
    third = load_experiment(DEMO).trials()[2]
    write(stopped_demo, [make_row(third.method, third.r, third.seed, 0.4, 60.0, dataset=third.dataset,
                                  noise=third.noise) | dict(trial_id=third.trial_id)])
    line = (f"MLflow (sqlite:///{stopped_demo / 'mlflow.db'}) holds 2 of the 3 rows' trials: `bench sync-mlflow "
            f"{stopped_demo}` logs the other 1.")
    for command in ("results", "leaderboard"):
        assert cli.main([command, str(stopped_demo)]) == 0
        assert line in capsys.readouterr().out


def test_one_report_over_two_folders_counts_a_shared_trial_once_and_refuses_two_rows_of_one(
        stopped_demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """#55: `bench report` took one folder. Folder B holds the demo's next two trials and a copy of A's first row:
    one report over both counts 4 trials; a B row of A's trial with other numbers is refused in one line."""
    trials = load_experiment(DEMO).trials()
    first = pl.read_parquet(stopped_demo / "trials" / f"{trials[0].trial_id}.parquet").to_dicts()[0]
    other = tmp_path / "b"
    write(other, [first] + [make_row(t.method, t.r, t.seed, 0.4, 60.0, dataset=t.dataset, noise=t.noise)
                            | dict(trial_id=t.trial_id) for t in trials[2:4]])
    out = tmp_path / "both"
    assert cli.main(["report", str(stopped_demo), str(other)]) == 2
    assert "needs --out DIR" in capsys.readouterr().err
    assert cli.main(["report", str(stopped_demo), str(other), "--out", str(out)]) == 0
    capsys.readouterr()
    md = (out / "leaderboard.md").read_text()
    assert f"4 trials under {stopped_demo}, {other}: 4 ok" in md
    assert "Grid demo: 12 of 16 trials missing" in md  # A's grid, completed in part by B's rows
    assert pl.read_csv(out / "cells.csv").filter(method="ce").sort("r")["n"].to_list() == [1, 1, 1, 1]  # A's + B's

    write(other, [first | dict(test_acc=91.5)])
    assert cli.main(["report", str(stopped_demo), str(other), "--out", str(out)]) == 2
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("bench: ")] == [
        f"bench: error: trial {trials[0].trial_id} has two different rows, in {stopped_demo} and {other} (test_acc "
        "90.0 vs 91.5): report the folders apart, or remove one of the rows"]
