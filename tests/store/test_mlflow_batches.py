"""`bench sync-mlflow` a batch of runs at a time (`bench.store.mlflow_batches`, issue #56 item 2): the store it writes
holds, table by table, what MLflow's client writes when the same rows are logged one run at a time (`Mirror.sync`):
the runs, their tags, params, metrics with their steps, latest metrics and files, over real trials and a failed one,
across several batches; each run holds its row (the grid writer's check, `assert_runs_hold_rows`); a second sync
logs nothing; a trial whose row changed status has its old run deleted and one new run; and MLflow's client then reads
and writes the store as its own."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from bench.exec.trainer import failed_row, run_trial
from bench.store import mlflow_batches
from bench.store.mirror import open_mirror
from bench.store.rows import write_trial
from bench.trial import TrialConfig
from tests.grid.test_runner import assert_runs_hold_rows

TABLES = {"tags": ("key", "value"), "params": ("key", "value"),
          "metrics": ("key", "value", "timestamp", "step", "is_nan"),
          "latest_metrics": ("key", "value", "timestamp", "step", "is_nan")}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"ok": two real trials' rows (CE and L_DMI), "with_failed": the same and a failed trial's row}."""
    ok = tmp_path_factory.mktemp("rows") / "ok"
    for method in ("ce", "dmi"):
        run_trial(TrialConfig("synthetic", method, "case3", 0.3, seed=1, epochs=2, epochs_warmup=1), "unused",
                  results=ok, log=lambda s: None)
    with_failed = ok.parent / "with_failed"
    shutil.copytree(ok, with_failed)
    write_trial(with_failed, failed_row(TrialConfig("synthetic", "gce", "case3", 0.3, seed=2), "RuntimeError: boom"),
                [])
    return {"ok": ok, "with_failed": with_failed}


def store_content(store: Path) -> dict[str, object]:
    """The store's trial runs keyed by trial id, each run's every column (its id replaced by the trial's), rows of
    the tables above and files; and its experiments with their tags."""
    db = sqlite3.connect(store)
    ids = dict(db.execute("select run_uuid, value from tags where key = 'bench.trial_id'").fetchall())
    columns = [c[1] for c in db.execute("pragma table_info(runs)")]
    runs = {}
    for values in db.execute("select * from runs").fetchall():
        run = dict(zip(columns, values, strict=True))
        uuid = run.pop("run_uuid")
        run["artifact_uri"] = run["artifact_uri"].replace(uuid, "RUN")
        folder = Path(run["artifact_uri"].replace("RUN", uuid).removeprefix("file://"))
        run["files"] = {f.name: f.read_text() for f in sorted(folder.iterdir())}
        for table, kept in TABLES.items():
            run[table] = sorted(db.execute(f"select {', '.join(kept)} from {table} where run_uuid = ?",  # noqa: S608
                                           (uuid,)).fetchall())
        runs[ids[uuid]] = run
    experiments = sorted(db.execute("select name, artifact_location, lifecycle_stage from experiments").fetchall())
    tags = sorted(db.execute("select key, value from experiment_tags").fetchall())
    return {"runs": runs, "experiments": [e for e in experiments], "experiment_tags": tags}


def test_batches_write_what_the_client_writes_run_by_run(folders, tmp_path, monkeypatch) -> None:
    results = folders["with_failed"]
    by_client, in_batches = tmp_path / "client.db", tmp_path / "batches.db"
    mirror = open_mirror(results, f"sqlite:///{by_client}")
    assert mirror.sync(results) == 3 and mirror.ok
    monkeypatch.setattr(mlflow_batches, "BATCH", 2)  # 3 runs: two transactions
    assert mlflow_batches.backfill(str(results), f"sqlite:///{in_batches}") == (f"sqlite:///{in_batches}", 3)
    expected, written = store_content(by_client), store_content(in_batches)
    assert sorted(written["runs"]) == sorted(expected["runs"]) and len(written["runs"]) == 3
    for trial_id, run in expected["runs"].items():
        for key, value in run.items():
            assert written["runs"][trial_id][key] == value, (trial_id, key)
    assert (written["experiments"], written["experiment_tags"]) == (expected["experiments"],
                                                                     expected["experiment_tags"])
    statuses = {run["status"] for run in written["runs"].values()}
    assert statuses == {"FINISHED", "FAILED"}


def test_each_run_holds_its_row_and_a_second_sync_logs_nothing(folders, tmp_path) -> None:
    results, store = folders["ok"], tmp_path / "mlflow.db"
    assert mlflow_batches.backfill(str(results), f"sqlite:///{store}") == (f"sqlite:///{store}", 2)
    assert_runs_hold_rows(store, "adhoc", results, tmp_path)
    assert mlflow_batches.backfill(str(results), f"sqlite:///{store}") == (f"sqlite:///{store}", 0)
    # MLflow's own client takes the runs as its own: it finds them, and logs onto one.
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    (run, _) = client.search_runs([client.get_experiment_by_name("adhoc").experiment_id], order_by=["tags.method"])
    client.log_metric(run.info.run_id, "test_acc_again", run.data.metrics["test_acc"], step=1)
    assert client.get_run(run.info.run_id).data.metrics["test_acc_again"] == run.data.metrics["test_acc"]


def test_a_row_whose_status_changed_replaces_its_run(folders, tmp_path) -> None:
    """A trial re-run after failing: its failed run is deleted and its new row logged, in the batch, as one run."""
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    from bench.store.folder import read_table

    results = tmp_path / "rows"
    shutil.copytree(folders["with_failed"], results)
    store = tmp_path / "mlflow.db"
    assert mlflow_batches.backfill(str(results), f"sqlite:///{store}")[1] == 3
    failed = read_table(results).filter(status="failed").row(0, named=True)
    write_trial(results, failed | {"status": "diverged", "error": None}, [])
    assert mlflow_batches.backfill(str(results), f"sqlite:///{store}")[1] == 1
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("adhoc").experiment_id
    query = f"tags.`bench.trial_id` = '{failed['trial_id']}'"
    (active,) = client.search_runs([experiment], query)
    (deleted,) = client.search_runs([experiment], query, run_view_type=ViewType.DELETED_ONLY)
    assert (active.data.tags["bench.status"], active.data.tags["bench.complete"], active.info.status) == (
        "diverged", "true", "FINISHED")
    assert deleted.data.tags["bench.status"] == "failed"
