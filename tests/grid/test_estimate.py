"""The time a grid will take, before it runs (#55): `--dry-run`'s estimate from the executor table's images/s (what
`bench calibrate` writes) where no earlier row knows the trials, which source it used, and the ETA that `bench run`
shows from it before its own pace is known."""

from __future__ import annotations

import io
import re
import time

from bench.cli.main import main
from bench.data import get_dataset
from bench.exec.diagnostics import TRAIN_SAMPLE
from bench.grid.executor_table import Choice, read_table, write_rows
from bench.grid.files import load_experiment
from bench.grid.plan import Plan
from bench.grid.progress import ETA_AFTER, StatusBoard, Tally, _eta_text
from tests.grid.test_runner import write_config
from tests.report.test_report import make_row, write

EPOCH_S = 30.0  # the seconds an epoch of a synthetic trial takes at the rate the tests write into the table


def table_with_rate(tmp_path, model: str, seconds_an_epoch: float):
    """An executor table: the shipped rows, and a CPU row for `model` at the images/s that makes an epoch of a
    synthetic trial last `seconds_an_epoch` by the documented cost (training images, evaluated ones at a third)."""
    data = get_dataset("synthetic")
    train, val, test = data.split_sizes
    evaluated = val + (test + min(TRAIN_SAMPLE, train) if data.epoch_eval else 0)
    rate = (train + evaluated / 3) / seconds_an_epoch
    path = tmp_path / "table.csv"
    write_rows([Choice(model, "cpu", "solo", 1, f"{rate:.9f}", "2026-12-07 cpu", "bench calibrate --device cpu")],
               path, base=None)
    return path


def dry_run(config, results, capsys) -> list[str]:
    assert main(["run", str(config), "--dry-run", "--results", str(results), "--num-cpus", "2"]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("time:")]


def test_dry_run_estimates_from_the_executor_tables_rate_and_says_so(tmp_path, monkeypatch, capsys):
    """No earlier row: the synthetic grid's 8 trials of 2 method-stage epochs and its 4 warm starts of 2 epochs (one
    a cell, shared by CE and L_DMI) are 24 trial-epochs; at the row's rate an epoch is 30 s: 12 min of wall time on
    the one CPU, whatever the trials at once (they share the device the rate was measured on)."""
    config = write_config(tmp_path)
    exp = load_experiment(config)
    epochs = sum(t.schedules()[1].epochs for t in exp.trials())
    cells = {(t.noise, t.r, t.seed) for t in exp.trials()}
    warm = sum(exp.trials()[0].schedules()[0].epochs for _ in cells)
    assert (epochs, warm) == (16, 8)  # the grid the docstring counts
    monkeypatch.setenv("BENCH_EXECUTOR_TABLE", str(table_with_rate(tmp_path, "mlp", EPOCH_S)))
    lines = dry_run(config, tmp_path / "results", capsys)
    assert len(lines) == 1, lines
    assert (epochs + warm) * EPOCH_S / 60 == 12
    assert lines[0].startswith(f"time: about 12 min of wall time on one device for 8 trials (estimated "
                               f"from the executor table {tmp_path / 'table.csv'}, mlp on cpu: ")
    assert "measured 2026-12-07 cpu by bench calibrate --device cpu" in lines[0]
    assert "start-up and data loading not counted" in lines[0]


def test_earlier_rows_come_before_the_table(tmp_path, monkeypatch, capsys):
    """Seed 0 has rows (CE 60 s an epoch, L_DMI 120, the warm start 90 s an epoch): the pending seed 1 is estimated
    from them (18 min of compute, 9 at 2 at once: tests/grid/test_runner.py), not from the table's 30 s."""
    config = write_config(tmp_path)
    results = tmp_path / "results"
    rows = [make_row(t.method, t.r, t.seed, 0.5, 80.0, dataset=t.dataset, noise=t.noise) | dict(
        trial_id=t.trial_id, model=t.network(), device="cpu (x86_64)", train_subset=None, epochs=2,
        epochs_warmup=2, method_s=120.0 if t.method == "ce" else 240.0, warmup_s=180.0 if t.method == "ce" else 0.5)
        for t in load_experiment(config).trials() if t.seed == 0]
    write(results, rows)
    monkeypatch.setenv("BENCH_EXECUTOR_TABLE", str(table_with_rate(tmp_path, "mlp", EPOCH_S)))
    lines = dry_run(config, results, capsys)
    assert len(lines) == 1 and lines[0].startswith("time: about 18 min of trial compute for 4 trials; about 9.0 min "
                                                   "of wall time at 2 trials at once (estimated from 4 earlier rows")


def test_a_rate_of_another_model_is_not_taken(tmp_path, monkeypatch, capsys):
    """A row for any model (`*`) cites one model's rate (the shipped GPU row: Fashion-MNIST's CNN): no estimate, and
    the line names the command that measures one."""
    config = write_config(tmp_path)
    monkeypatch.setenv("BENCH_EXECUTOR_TABLE", str(table_with_rate(tmp_path, "*", EPOCH_S)))
    assert read_table()[0].model == "*"
    lines = dry_run(config, tmp_path / "results", capsys)
    assert lines == ["time: no estimate (no earlier row like them in the results folder, no images/s for mlp on cpu "
                     "in the executor table (`bench calibrate --device cpu --models mlp --out FILE` measures it; "
                     "BENCH_EXECUTOR_TABLE=FILE plans by it))"]


def test_the_eta_comes_from_the_estimate_before_the_grids_pace(tmp_path):
    """On main the ETA stayed '--' until 2 % of the work was done (4 minutes of a loaded demo): with an estimate it
    is the estimate less the time elapsed from the start, marked as such, until a trial lands."""
    plan = Plan.make(load_experiment(write_config(tmp_path)), str(tmp_path / "results"))
    work = plan.work(plan.pending)
    tally = Tally(total=len(plan.pending), estimate_s=600.0)
    tally.work_total = work["method_epochs"] + work["warm_epochs"]
    tally.started = time.monotonic() - 60.0  # a minute in, no epoch reported yet
    eta = tally.eta()
    assert eta is not None and 540.0 - 5.0 <= eta <= 540.0  # the seconds this test itself took, at most 5
    assert _eta_text(tally).endswith(" (estimate)")
    out = io.StringIO()
    StatusBoard(lambda line: out.write(line + "\n"), every=0.0).tick(tally, {}, [])
    assert re.search(r"8 waiting; elapsed 1m0\ds, ETA (8m5\ds|9m00s) \(estimate\)", out.getvalue()), out.getvalue()
    # Past the estimate, no pace yet: no ETA rather than 0 s.
    tally.started = time.monotonic() - 700.0
    assert tally.eta() is None and _eta_text(tally) == "--"


def test_the_eta_comes_from_the_first_row(tmp_path):
    """From the first finished trial on, the grid's own pace gives the ETA (its trials' rate), even where less than
    ETA_AFTER of the work has been reported, and with no estimate at all."""
    tally = Tally(total=16)
    tally.work_total = 10_000
    tally.started = time.monotonic() - 120.0
    assert tally.eta() is None
    tally.done = 1
    tally.work_finished = int(ETA_AFTER * tally.work_total) - 1
    eta = tally.eta()
    assert eta is not None and 15 * 120.0 <= eta <= 15 * 125.0  # 15 trials at the first one's 2 minutes
    assert not _eta_text(tally).endswith("(estimate)")
