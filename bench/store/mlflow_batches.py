"""MLflow runs logged a batch at a time: `bench sync-mlflow`'s backfill (`backfill`) and a grid's writer process
(`bench.store.mirror_writer`, which decides when a batch is written: this module writes it).

MLflow's client logs a run in four calls (create it, its files, its params, metrics and tags, its end), each a
transaction of its SQLAlchemy store with its own queries: 60-75 ms of CPU a run, 75 s for 1,000 rows. Into the
embedded sqlite store (`sqlite:///...`, the folder's own or another file) with its artifacts in local folders, the
runs are written here instead: each one's files into its artifact folder, then `BATCH` runs at a time in one
transaction into MLflow's own tables (its ORM models' tables: runs, tags, params, metrics and latest metrics), each
value as MLflow's store writes it (a NaN metric as 0 flagged, an infinite one clipped; the latest metric of a key the
largest (step, timestamp, value)). What a run holds is `bench.store.mirror.run_content`'s, as when MLflow's client
logs it; tests/store/test_mlflow_batches.py holds the two ways' runs equal, table by table. A batch is whole or
absent: a run is never left without its complete tag. Any other store (an MLflow server, a remote artifact root) is
logged run by run through the client (`Mirror.log_row`).
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.store import folder
from bench.store.mirror import TAG, Mirror, open_mirror, run_content

BATCH = 200  # runs a transaction: a stop loses at most one batch's work, never half a run


def backfill(results: str, uri: str | None) -> tuple[str, int] | None:
    """Log every row under the local or remote folder `results` that the store lacks, holding the folder (not while
    a `bench run` logs into the same store); (the store's URI, how many runs were logged), or None where the store
    could not be opened or failed on the way (a warning has said so)."""
    with folder.Store(results).hold():
        mirror = open_mirror(results, uri)
        if mirror is None:
            return None
        count = sync(mirror, results)
    return (mirror.uri, count) if mirror.ok else None


def sync(mirror: Mirror, results: str, trial_ids: set[str] | None = None) -> int:
    """Log the rows under `results` (or those of `trial_ids`) that the store lacks (`Mirror.missing`): in batches where
    the store takes them (`batched`), else run by run; how many were logged."""
    if not batched(mirror):
        return mirror.sync(results, trial_ids)
    with contextlib.closing(Runs(mirror)) as runs:
        return runs.write(mirror.missing(results, trial_ids))


def batched(mirror: Any) -> bool:
    """Whether runs go into `mirror`'s store a batch a transaction: an sqlite store (a server's stay run by run)."""
    return isinstance(mirror, Mirror) and mirror.uri.startswith("sqlite:///")


class Runs:
    """Logs rows into one mirror's store, a batch of runs a transaction where it takes them (`batched`), else run by
    run through MLflow's client; its database engine is opened once, at the first batch (`close` ends it)."""

    def __init__(self, mirror: Any) -> None:
        self.mirror = mirror
        self._engine: Any = None
        self._locations: dict[str, str] = {}  # experiment -> its artifact root: one query a writer, not one a batch

    def log(self, rows: Iterable[tuple[dict[str, Any], Any]]) -> int:
        """Log these rows (row, curves) where MLflow lacks them (a run with the row's status); how many were written
        (run by run through the client: how many are in MLflow now, `Mirror.log_row`'s count)."""
        if not batched(self.mirror):
            return sum(1 for row, curve in rows if self.mirror.log_row(row, curve))
        return self.write(self.mirror.unlogged(rows))

    def write(self, todo: Iterable[tuple[str, dict[str, Any], Any]]) -> int:
        """The runs of `todo` (experiment, row, curves), `BATCH` a transaction (a batch written before the store
        failed stays written); how many."""
        pending: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        for experiment, row, curve in todo:
            pending.setdefault(experiment, []).append((row, curve))
        if not self.mirror.ok:  # the store failed while listing its runs: nothing is written into it
            return 0
        count, guard = 0, self.mirror.guard
        for experiment, rows in pending.items():
            location = guard("logging runs in batches", self._artifacts, experiment)
            if location is None:
                break
            if not location.startswith("file:"):  # artifacts elsewhere: MLflow's client writes them
                count += sum(1 for row, curve in rows if self.mirror.log_row(row, curve))
                continue
            for start in range(0, len(rows), BATCH):
                count += guard("logging runs in batches", _write, self.mirror, self._engine, experiment, location,
                               rows[start:start + BATCH]) or 0
        return count

    def _artifacts(self, experiment: str) -> str:
        """Where the experiment's artifacts go (the database engine opened first, once)."""
        if self._engine is None:
            import sqlalchemy as sa

            self._engine = sa.create_engine(self.mirror.uri)
        if experiment not in self._locations:
            exp_id = self.mirror.experiment_id(experiment)
            self._locations[experiment] = self.mirror.client.get_experiment(exp_id).artifact_location
        return self._locations[experiment]

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None


def _write(mirror: Mirror, engine: Any, experiment: str, location: str,
           todo: list[tuple[dict[str, Any], Any]]) -> int:
    """One transaction: the runs of `todo` (rows and their curves) in `experiment`, each complete and ended."""
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric, SqlParam, SqlRun, SqlTag
    from mlflow.utils.file_utils import local_file_uri_to_path
    from mlflow.utils.uri import append_to_uri_path

    exp_id = mirror.experiment_id(experiment)
    runs, tags, params, metrics, latest = [], [], [], [], []
    for row, curve in todo:
        mirror.drop_outdated(experiment, row["trial_id"])
        run, run_id = run_content(row, curve), uuid.uuid4().hex
        artifacts = append_to_uri_path(location, run_id, "artifacts")  # where MLflow's store puts them
        where = Path(local_file_uri_to_path(artifacts))
        where.mkdir(parents=True)
        for name, text in run.files.items():
            (where / name).write_text(text, encoding="utf-8")
        start = run.start if run.start is not None else _now()
        runs.append(dict(run_uuid=run_id, name=run.name, source_type="UNKNOWN", source_name="", entry_point_name="",
                         user_id="unknown", status=run.status, start_time=start,
                         end_time=run.end if run.end is not None else _now(), deleted_time=None, source_version="",
                         lifecycle_stage="active", artifact_uri=artifacts, experiment_id=int(exp_id)))
        every = {**run.tags, "mlflow.runName": run.name, f"{TAG}complete": "true"}
        tags += [dict(key=k, value=v, run_uuid=run_id) for k, v in every.items()]
        params += [dict(key=k, value=v, run_uuid=run_id) for k, v in run.params.items()]
        newest: dict[str, dict[str, Any]] = {}
        for entry in dict.fromkeys(run.metrics):  # as MLflow's store: a value logged twice is one
            key, value, timestamp, step = entry
            is_nan, value = _sanitized(value)
            metric = dict(key=key, value=value, timestamp=timestamp, step=step, is_nan=is_nan, run_uuid=run_id)
            metrics.append(metric)
            old = newest.get(key)
            if old is None or (step, timestamp, value) > (old["step"], old["timestamp"], old["value"]):
                newest[key] = metric
        latest += newest.values()
    with warnings.catch_warnings(), engine.begin() as connection:
        warnings.simplefilter("ignore", sa.exc.SAWarning)
        for model, values in ((SqlRun, runs), (SqlTag, tags), (SqlParam, params), (SqlMetric, metrics),
                              (SqlLatestMetric, latest)):
            if values:
                connection.execute(sa.insert(model.__table__), values)
    known = mirror.logged(experiment)
    for (row, _), run in zip(todo, runs, strict=True):
        known[row["trial_id"]] = (run["run_uuid"], row["status"])
    return len(runs)


def _sanitized(value: float) -> tuple[bool, float]:
    """(is NaN, the value stored), as MLflow's SQL store stores a metric (`SqlAlchemyStore.sanitize_metric_value`)."""
    if math.isnan(value):
        return True, 0.0
    if math.isinf(value):
        return False, math.copysign(1.7976931348623157e308, value)
    return False, value


def _now() -> int:
    return int(time.time() * 1000)

