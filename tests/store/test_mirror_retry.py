"""The grid's MLflow mirror tries a store that failed during the grid once more when the grid ends (issue 46, item
4): the runs it missed are backfilled then, one per trial, a partial run replaced. tests/grid/test_multinode.py does the
same against a real `mlflow server` stopped and started again mid-grid, where timing decides which path runs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from bench.grid.mlflow_callback import MlflowMirroring
from bench.grid.progress import Tally
from bench.store.mirror import TAG, Mirror
from bench.store.mirror_writer import MirrorWriter
from tests.report.test_report import make_row, write


def trial_runs(uri: str, experiment: str = "test") -> Counter:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], f"tags.`{TAG}kind` = 'trial'", max_results=100)
    return Counter(r.data.tags[f"{TAG}trial_id"] for r in runs)


def test_a_store_that_failed_mid_grid_is_backfilled_when_the_grid_ends(tmp_path: Path) -> None:
    rows = [make_row("ce", 0.2, seed, 0.5, 70.0) for seed in range(3)]
    results = write(tmp_path / "results", rows)
    store = tmp_path / "store" / "mlflow.db"
    uri = f"sqlite:///{store}"
    warnings: list[str] = []
    tally = Tally(total=3)
    writer = MirrorWriter(tally, str(results), lambda: Mirror(uri, results, warn=warnings.append),
                          [r["trial_id"] for r in rows])
    callback = MlflowMirroring(writer, {"u1": [rows[0]["trial_id"]], "u2": [rows[1]["trial_id"], rows[2]["trial_id"]]})
    assert writer.flush(60) and writer.mirror.ok  # opened while the store was up
    header = store.read_bytes()[:100]
    with open(store, "r+b") as f:  # the store down: its file's header overwritten in place ("not a database")
        f.write(b"x" * 100)
    callback.log_trial_end(SimpleNamespace(config={"unit": "u1"}))
    assert writer.flush(60)
    assert not writer.mirror.ok and tally.mlflow_logged == 0 and len(warnings) == 1
    callback.log_trial_end(SimpleNamespace(config={"unit": "u2"}))  # the mirror no longer tries during the grid
    assert writer.flush(60)
    assert tally.mlflow_logged == 0 and len(warnings) == 1
    with open(store, "r+b") as f:  # and up again
        f.write(header)
    assert writer.close(60)  # the grid's end
    assert writer.mirror.ok and tally.mlflow_backfilled == 3, warnings
    assert trial_runs(uri) == Counter({r["trial_id"]: 1 for r in rows})
    again = MirrorWriter(Tally(total=3), str(results), lambda: Mirror(uri, results, warn=warnings.append),
                         [r["trial_id"] for r in rows])
    assert again.close(60)  # a store that did not fail: nothing more
    assert trial_runs(uri) == Counter({r["trial_id"]: 1 for r in rows})
