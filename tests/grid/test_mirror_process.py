"""MLflow's writer as a process of its own (issue #56, item 2): the runs it logs, a batch a transaction into an sqlite
store, are those the in-process mirror logs run by run through MLflow's client (table by table), and are in the store
before the writer is told to end; a batch is the rows that arrive within `GATHER_S` of its first, at most
`GATHER_ROWS`; a writer that dies is the summary's one MLflow line and `bench sync-mlflow` repairs what it missed, and a
grid's driver never imports MLflow (the store's CPU is the writer's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from bench.cli.main import main
from bench.grid.mlflow_callback import MirrorProcess
from bench.grid.plan import Plan
from bench.grid.progress import Tally, print_summary
from bench.store import mirror_writer
from bench.store.mirror import TAG, complete_trial_runs, open_mirror
from tests.grid.test_runner import subprocess_env, write_config
from tests.report.test_report import make_row, write
from tests.store.test_mlflow_batches import store_content


def runs_by_trial(uri: str, experiment: str = "test") -> dict[str, list[dict]]:
    """Each trial's runs in the store: params, latest metrics, tags (MLflow's own left out), artifact names."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    found: dict[str, list[dict]] = {}
    for run in client.search_runs([exp.experiment_id], f"tags.`{TAG}kind` = 'trial'", max_results=1000):
        found.setdefault(run.data.tags[f"{TAG}trial_id"], []).append(dict(
            params=run.data.params, metrics=run.data.metrics, name=run.info.run_name,
            tags={k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")},
            artifacts=sorted(a.path for a in client.list_artifacts(run.info.run_id))))
    return found


def timed_rows(count: int, r: float) -> list[dict]:
    """Rows that say when their trial ran (`finished_at`, `wall_s`): their runs' times are the trials', not the moment
    they were logged, so that two stores logged apart hold equal runs."""
    return [make_row("ce", r, seed, 0.5, 70.0 + seed) | {"finished_at": f"2026-12-07T10:0{seed}:00Z"}
            for seed in range(count)]


def test_the_writer_process_logs_what_the_mirror_logs_in_process(tmp_path: Path) -> None:
    rows = timed_rows(4, 0.2)
    results = write(tmp_path / "results", rows)
    ids = [r["trial_id"] for r in rows]
    tally, lines = Tally(total=3), []
    writer = MirrorProcess(tally, str(results), None, done=ids[:1], grid=ids[1:], out=lines.append)
    writer.put(ids[1:3])
    writer.put(ids[3:])
    waited = time.monotonic() + 120
    while tally.mlflow_logged < 3 and time.monotonic() < waited:  # logged while the writer is still running
        time.sleep(0.1)
    assert complete_trial_runs(f"sqlite:///{results / 'mlflow.db'}") == set(ids)
    assert writer.close(120)
    assert writer.mirror.ok and writer.mirror.embedded and tally.mlflow_logged == 3
    assert lines == ["MLflow: backfilled 1 runs of finished trials"]
    by_process = runs_by_trial(writer.mirror.uri)
    in_process = open_mirror(results, f"sqlite:///{tmp_path / 'other.db'}")
    assert in_process.sync(results) == 4  # MLflow's client, run by run
    assert sorted(by_process) == sorted(ids) and all(len(runs) == 1 for runs in by_process.values())
    assert by_process == runs_by_trial(in_process.uri)
    expected, written = store_content(tmp_path / "other.db"), store_content(results / "mlflow.db")
    assert sorted(written["runs"]) == sorted(ids)
    for trial_id, run in expected["runs"].items():
        for key, value in run.items():
            assert written["runs"][trial_id][key] == value, (trial_id, key)
    assert (written["experiments"], written["experiment_tags"]) == (expected["experiments"],
                                                                     expected["experiment_tags"])


def test_the_writer_imports_the_drivers_bench_whatever_folder_it_runs_in(tmp_path: Path, monkeypatch) -> None:
    """A grid launched from a folder that holds another `bench` (a checkout of another version; here one that cannot
    be imported): started with `python -m`, the writer imported that folder's bench first and died."""
    rows = timed_rows(2, 0.3)
    results = write(tmp_path / "results", rows)
    ids = [r["trial_id"] for r in rows]
    (tmp_path / "another_checkout" / "bench").mkdir(parents=True)
    (tmp_path / "another_checkout" / "bench" / "__init__.py").write_text('raise ImportError("not this bench")\n')
    monkeypatch.chdir(tmp_path / "another_checkout")
    tally = Tally(total=2)
    writer = MirrorProcess(tally, str(results), None, done=[], grid=ids, out=print)
    writer.put(ids)
    assert writer.close(120)
    assert writer.mirror.ok, writer.mirror.failed
    assert tally.mlflow_logged == 2 and complete_trial_runs(writer.mirror.uri) == set(ids)


def test_a_batch_is_the_rows_that_arrive_within_its_bounds(tmp_path: Path, monkeypatch) -> None:
    """Three ids handed over one at a time, at most two rows a batch: two batches (2 and 1 runs), the second written
    `GATHER_S` after its row came, not at the end; then a row that comes alone is written within the bound too."""
    monkeypatch.setattr(mirror_writer, "GATHER_ROWS", 2)
    rows = timed_rows(4, 0.3)
    results = write(tmp_path / "results", rows)
    ids = [r["trial_id"] for r in rows]
    batches: list[int] = []
    arrived = threading.Semaphore(0)

    def logged(count: int) -> None:
        batches.append(count)
        arrived.release()

    writer = mirror_writer.MirrorWriter(Tally(total=4), str(results), lambda: open_mirror(results, None), ids,
                                        logged=logged)
    assert writer.flush(120) and writer.mirror.ok  # the store open: what follows is gathered
    for trial_id in ids[:3]:
        writer.put([trial_id])
    assert arrived.acquire(timeout=120) and arrived.acquire(timeout=120)
    assert batches == [2, 1] and complete_trial_runs(writer.mirror.uri) == set(ids[:3])
    started = time.monotonic()
    writer.put(ids[3:])
    assert arrived.acquire(timeout=120)
    assert time.monotonic() - started >= mirror_writer.GATHER_S  # it waited for others to share the transaction
    assert batches == [2, 1, 1] and complete_trial_runs(writer.mirror.uri) == set(ids)
    assert writer.close(60)
    assert {t: len(runs) for t, runs in runs_by_trial(writer.mirror.uri).items()} == dict.fromkeys(ids, 1)


def test_a_writer_that_dies_is_one_summary_line_and_sync_mlflow_repairs_it(tmp_path: Path, capsys) -> None:
    rows = [make_row("ce", 0.4, seed, 0.5, 60.0) for seed in range(2)]
    results = write(tmp_path / "results", rows)
    ids = [r["trial_id"] for r in rows]
    tally = Tally(total=2)
    writer = MirrorProcess(tally, str(results), None, done=[], grid=ids, out=print)
    os.kill(writer.process.pid, signal.SIGKILL)
    writer.put(ids)  # into a pipe nobody reads: no error here
    assert writer.close(60)
    assert not writer.mirror.ok and "exit code -9" in writer.mirror.failed and tally.mlflow_logged == 0
    lines: list[str] = []
    print_summary(SimpleNamespace(name="test"), Plan(experiment=None, trials=[], results=str(results)), tally,
                  writer.mirror, lines.append)
    said = [line for line in lines if "MLflow" in line]
    assert len(said) == 1 and "store FAILED" in said[0] and f"bench sync-mlflow {results}" in said[0], lines
    assert main(["sync-mlflow", str(results)]) == 0
    assert "logged 2 missing runs" in capsys.readouterr().out
    assert {t: len(runs) for t, runs in runs_by_trial(writer.mirror.uri).items()} == dict.fromkeys(ids, 1)


def test_a_grid_driver_never_imports_mlflow_and_its_runs_are_logged(tmp_path: Path) -> None:
    """The driver's CPU with MLflow on: MLflow's import alone was a second or two of it (and Ray Tune's callback
    census imported it again for telemetry); now every MLflow call is the writer process's."""
    config = write_config(tmp_path, name="quiet", r=[0.2], seeds=[0, 1], methods={"ce": {}}, epochs=1,
                          epochs_warmup=1)
    results = tmp_path / "results"
    script = ("import sys; from bench.cli.main import main; code = main(sys.argv[1:]); "
              "print('mlflow imported:', 'mlflow' in sys.modules); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", script, "run", str(config), "--results", str(results),
                           "--num-cpus", "1", "--data-root", str(tmp_path), "--yes"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MLflow: 2 runs logged to " in done.stdout and "mlflow imported: False" in done.stdout, done.stdout
    assert len(runs_by_trial(f"sqlite:///{results / 'mlflow.db'}", "quiet")) == 2
