"""MLflow mirror of the parquet results: one experiment per config, one run per trial, a parent run per grid cell.

Parquet is the source of truth; MLflow is a view of it. The runner logs from the driver after a trial's row has
landed, so an MLflow store that is down or failing loses nothing: the trial still finishes and writes parquet, a
warning says so, and `bench sync-mlflow RESULTS` (or the next `bench run`) backfills the missing runs. Logging is
idempotent: a trial's run carries the tag `bench.trial_id` and is marked `bench.complete` only once fully logged;
an incomplete or outdated run (a killed driver, a trial re-run after failing) is deleted and logged again.

Store: `--mlflow-uri`, else `MLFLOW_TRACKING_URI`, else the embedded default `sqlite:///RESULTS/mlflow.db` (artifacts
in `RESULTS/mlartifacts`). MLflow 3.17 refuses its file store without MLFLOW_ALLOW_FILE_STORE, hence sqlite.
A grid cell is (dataset, noise, r): the runs of every method, hyper-parameter and seed at that noise level are
nested under one parent run named after the cell, so the UI compares methods cell by cell.

`bench sync-mlflow RESULTS` backfills (`backfill`) and `bench ui RESULTS` serves the MLflow UI on 127.0.0.1 (`serve`);
their commands are `bench.cli.mlflow`'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import polars as pl

from bench.config import UserError
from bench.schema import check_name
from bench.store import folder
from bench.store.columns import DIAGNOSTIC_COLUMNS, MLFLOW_METRICS, MLFLOW_PARAMS, ROW
from bench.store.folder import is_local, local_path

# MLflow's HTTP client retries for minutes by default; a team server that is down must not stall a grid.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")

TAG = "bench."

def _quiet_sqlalchemy() -> None:
    try:
        from sqlalchemy.exc import SADeprecationWarning
    except ImportError:  # pragma: no cover - sqlalchemy comes with mlflow
        return
    warnings.filterwarnings("ignore", category=SADeprecationWarning)


def tracking_uri(results: str | os.PathLike[str], uri: str | None = None) -> str | None:
    """The store to use: the flag, else MLFLOW_TRACKING_URI, else sqlite inside a local results folder.
    None when the results live in an object store and no MLflow store was named."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    if not is_local(results):
        return None
    where = local_path(results)
    if odd := sorted(set(URI_SPECIAL) & set(str(where))):
        # MLflow and SQLAlchemy read the path as a URL (`%20` is a space, `?` starts a query, `#` a fragment): the
        # store would land elsewhere, or be retried for minutes; escaped, MLflow still makes a folder of the escaped
        # name beside it. Refused before anything is written.
        raise UserError(f"results folder {where}: its path holds {' '.join(map(repr, odd))}, which the MLflow "
                        "store's URI (sqlite:///RESULTS/mlflow.db) cannot carry; use a folder name without '%', '?' "
                        "and '#', or name the store with --mlflow-uri (e.g. sqlite:////tmp/mlflow.db), or run with "
                        "--no-mlflow")
    return f"sqlite:///{where / 'mlflow.db'}"


URI_SPECIAL = "%?#"  # characters a URL path does not carry as themselves


def cell_of(row: dict[str, Any]) -> str:
    return f"{row['dataset']}/{row['noise']}/r={float(row['r']):g}"


def run_name(row: dict[str, Any]) -> str:
    """A trial's MLflow run name: its method, hyper-parameters, noise, r and seed, so that `mlflow runs list` tells
    the trials of two cells apart."""
    params = json.loads(row.get("method_params") or "{}")
    extra = "".join(f" {k}={v}" for k, v in sorted(params.items()))
    return (f"{row['method']} lr={row['lr']:g} bs={row['batch_size']}{extra} {row['noise']} r={float(row['r']):g} "
            f"seed={row['seed']}")


class Mirror:
    """Logs result rows to one MLflow store. After the first failure it stops trying and says how to backfill."""

    def __init__(self, uri: str, results: str | os.PathLike[str], warn=None) -> None:
        _quiet_sqlalchemy()
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating initial tables..."
        from mlflow import MlflowClient

        self.uri, self.results = uri, str(results)
        self.embedded = uri.startswith("sqlite:///") and is_local(results)
        self.client = MlflowClient(tracking_uri=uri)
        self.failed: str | None = None
        self.warn = warn or (lambda msg: print(f"bench: warning: {msg}", file=sys.stderr, flush=True))
        self._experiments: dict[str, str] = {}
        self._parents: dict[tuple[str, str], str] = {}
        self._logged: dict[str, dict[str, tuple[str, str]]] = {}

    # -- failure handling -------------------------------------------------------------------------------------
    def _guard(self, what: str, fn, *args):
        if self.failed:
            return None
        try:
            with warnings.catch_warnings():
                _quiet_sqlalchemy()
                return fn(*args)
        except Exception as e:  # noqa: BLE001 - any store failure must leave the grid running
            self.failed = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
            self.warn(f"MLflow store {self.uri} failed while {what} ({self.failed}); no result is lost: the "
                      f"parquet rows are complete; later run `bench sync-mlflow {self.results}"
                      f"{'' if self.embedded else ' --mlflow-uri ' + self.uri}` to backfill MLflow")
            return None

    @property
    def ok(self) -> bool:
        return self.failed is None

    def retry(self) -> None:
        """Try the store again after a failure (a server up again): what the failed attempt had cached is
        forgotten, so that the next calls ask the store itself."""
        self.failed = None
        self._experiments.clear()
        self._parents.clear()
        self._logged.clear()

    # -- store layout -----------------------------------------------------------------------------------------
    def experiment_id(self, name: str) -> str:
        if name not in self._experiments:
            found = self.client.get_experiment_by_name(name)
            if found is not None:
                self._experiments[name] = found.experiment_id
            else:
                location = (local_path(self.results) / "mlartifacts" / name).as_uri() if self.embedded else None
                self._experiments[name] = self.client.create_experiment(name, artifact_location=location)
        return self._experiments[name]

    def _search(self, experiment_id: str, filter_string: str) -> list[Any]:
        runs, token = [], None
        while True:
            page = self.client.search_runs([experiment_id], filter_string, max_results=1000, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def logged(self, experiment: str) -> dict[str, tuple[str, str]]:
        """trial_id -> (run_id, status logged) of the complete trial runs in an experiment."""
        if experiment not in self._logged:
            exp_id = self.experiment_id(experiment)
            done: dict[str, tuple[str, str]] = {}
            for run in self._search(exp_id, f"tags.`{TAG}kind` = 'trial'"):
                tags = run.data.tags
                if tags.get(f"{TAG}complete") == "true":
                    done[tags[f"{TAG}trial_id"]] = (run.info.run_id, tags.get(f"{TAG}status", ""))
            self._logged[experiment] = done
        return self._logged[experiment]

    def _parent(self, exp_id: str, cell: str) -> str:
        key = (exp_id, cell)
        if key not in self._parents:
            found = self._search(exp_id, f"tags.`{TAG}kind` = 'cell' and tags.`{TAG}cell` = '{cell}'")
            if found:
                self._parents[key] = found[0].info.run_id
            else:
                run = self.client.create_run(exp_id, run_name=cell, tags={f"{TAG}kind": "cell", f"{TAG}cell": cell})
                self.client.set_terminated(run.info.run_id, "FINISHED")
                self._parents[key] = run.info.run_id
        return self._parents[key]

    # -- logging ----------------------------------------------------------------------------------------------
    def log_row(self, row: dict[str, Any], epochs: pl.DataFrame | None = None) -> bool:
        """Log one trial (skipped if already logged with the same status). True if it is in MLflow now."""
        if not self.loggable(row):
            return False
        return bool(self._guard(f"logging trial {row['trial_id']}", self._log_row, row, epochs))

    def loggable(self, row: dict[str, Any]) -> bool:
        """A row whose experiment name could not be a folder name (a path, '..') is not logged: the embedded
        store keeps each experiment's artifacts in a folder of that name."""

        try:
            check_name("experiment", row.get("experiment") or "adhoc")
        except UserError as e:
            self.warn(f"not logging trial {row['trial_id']} to MLflow: {e}")
            return False
        return True

    def _log_row(self, row: dict[str, Any], epochs: pl.DataFrame | None) -> bool:
        from mlflow.entities import Metric, Param
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        experiment = row.get("experiment") or "adhoc"
        exp_id = self.experiment_id(experiment)
        logged = self.logged(experiment)
        trial_id = row["trial_id"]
        if trial_id in logged and logged[trial_id][1] == row["status"]:
            return True
        # Outdated or partial runs of this trial (a failed attempt, a driver killed mid-log) go first.
        for run in self._search(exp_id, f"tags.`{TAG}trial_id` = '{trial_id}'"):
            self.client.delete_run(run.info.run_id)
        logged.pop(trial_id, None)

        cell = cell_of(row)
        tags = {f"{TAG}kind": "trial", f"{TAG}trial_id": trial_id, f"{TAG}cell": cell,
                f"{TAG}status": row["status"], MLFLOW_PARENT_RUN_ID: self._parent(exp_id, cell)}
        tags.update({k: str(row[k]) for k in ("dataset", "method", "noise", "r", "seed")})
        # The protocol and its switches (`bench.protocol`); rows written before protocols existed were bench's.
        tags.update({f"{TAG}{k}": str(row.get(k) or ROW[k].default) for k in ("protocol", "switches")})
        if row.get("oracle"):  # selected on the clean test set (`bench.protocol.Selection.oracle`): no result
            tags[f"{TAG}oracle"] = "true"
        run = self.client.create_run(exp_id, run_name=run_name(row), tags=tags)
        run_id = run.info.run_id

        params = {k: row.get(k) for k in MLFLOW_PARAMS}
        params.update(json.loads(row.get("method_params") or "{}"))
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(row[k]), now, 0) for k in MLFLOW_METRICS if row.get(k) is not None]
        if epochs is not None and epochs.height:
            for e in epochs.iter_rows(named=True):
                prefix = "" if e["stage"] == "method" else f"{e['stage']}_"
                for name in ("train_loss", "val_loss", "val_acc", "seconds", *DIAGNOSTIC_COLUMNS):
                    if e.get(name) is not None:
                        metrics.append(Metric(f"{prefix}epoch_{name}", float(e[name]), now, int(e["epoch"])))
        param_list = [Param(k, str(v)) for k, v in params.items() if v is not None]
        for start in range(0, len(param_list), 100):  # MLflow's per-call limits: 100 params, 1000 metrics
            self.client.log_batch(run_id, params=param_list[start:start + 100])
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[start:start + 1000])

        self.client.log_text(run_id, json.dumps(row, indent=1, sort_keys=True, default=str), "result_row.json")
        for column, name in (("confusion", "confusion_matrix.json"),
                             ("estimated_transition", "estimated_transition.json"),
                             ("transition", "true_transition.json"),
                             ("empirical_transition", "empirical_transition.json")):
            if row.get(column):
                self.client.log_text(run_id, row[column], name)
        if row.get("error"):
            self.client.log_text(run_id, row["error"], "error.txt")
        self.client.set_tag(run_id, f"{TAG}complete", "true")
        self.client.set_terminated(run_id, "FINISHED" if row["status"] != "failed" else "FAILED")
        logged[trial_id] = (run_id, row["status"])
        return True

    def sync(self, results: str | os.PathLike[str], trial_ids: set[str] | None = None) -> int:
        """Log every row under `results` (or those in `trial_ids`) that MLflow lacks; return how many."""
        rows = folder.read_table(results)
        if rows.is_empty() or self.failed:
            return 0
        epochs = folder.read_table(results, "epochs")
        count = 0
        for row in rows.iter_rows(named=True):
            if trial_ids is not None and row["trial_id"] not in trial_ids or not self.loggable(row):
                continue
            experiment = row.get("experiment") or "adhoc"
            known = self._guard("listing runs", self.logged, experiment)
            if known is None:
                break
            if row["trial_id"] in known and known[row["trial_id"]][1] == row["status"]:
                continue
            curve = epochs.filter(pl.col("trial_id") == row["trial_id"]) if epochs.height else None
            if not self.log_row(row, curve):
                break
            count += 1
        return count


def runs_links(uri: str, address: str) -> list[str]:
    """'name: link' to the runs table of each experiment in the store. MLflow 3's UI opens an experiment on its
    GenAI overview, where a grid's trials do not show; the runs table is where they are."""
    _quiet_sqlalchemy()
    from mlflow.tracking import MlflowClient

    try:
        experiments = MlflowClient(tracking_uri=uri).search_experiments()
    except Exception as e:  # noqa: BLE001 - the server can still start; the links are a convenience
        return [f"(could not list the experiments: {type(e).__name__})"]
    return [f"{e.name}: {address}/#/experiments/{e.experiment_id}/runs" for e in experiments if e.name != "Default"]


def open_mirror(results: str | os.PathLike[str], uri: str | None, warn=None) -> Mirror | None:
    """A mirror on the chosen store, or None (with a warning) when there is no store to use. A sqlite file that is
    not a database (damaged, or something else under that name) is set aside and a fresh store started: parquet
    holds every result, so nothing is lost and `bench sync-mlflow` refills it."""
    chosen = tracking_uri(results, uri)
    say = warn or (lambda msg: print(f"bench: warning: {msg}", file=sys.stderr, flush=True))
    if chosen is None:
        say(f"results in {results} are not a local folder and no MLflow store was named: MLflow logging is off "
            "(pass --mlflow-uri or set MLFLOW_TRACKING_URI; `bench sync-mlflow` backfills later)")
        return None
    backfill = f"`bench sync-mlflow {results}{'' if uri is None else ' --mlflow-uri ' + uri}`"
    if chosen.startswith("sqlite:///"):
        path = Path(chosen.removeprefix("sqlite:///"))
        path.parent.mkdir(parents=True, exist_ok=True)
        if problem := _not_a_database(path):
            aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
            path.rename(aside)
            say(f"{path} is not a usable MLflow database ({problem}); set it aside as {aside.name} and started a "
                f"fresh one: the parquet rows hold every result, and {backfill} logs those it lacks")
    try:
        return Mirror(chosen, results, warn=say)
    except Exception as e:  # noqa: BLE001 - a store that cannot open must not stop the grid: parquet is the truth
        say(f"MLflow store {chosen} cannot be opened ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
            f"MLflow logging is off for this run, no result is lost, and {backfill} backfills it later")
        return None


def _not_a_database(path: Path) -> str | None:
    """What is wrong with the sqlite file at `path` (None: nothing, or no file yet): not a database, or one that
    fails sqlite's own integrity check."""
    import sqlite3

    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            verdict = db.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.OperationalError:  # locked or busy (an MLflow UI writing): in use, not damaged
        return None
    except sqlite3.DatabaseError as e:
        return f"{type(e).__name__}: {e}"
    return None if verdict == "ok" else f"integrity check: {verdict[:120]}"


# -- what `bench sync-mlflow` and `bench ui` do (their commands: `bench.cli.mlflow`) -----------------------------
def backfill(results: str, uri: str | None) -> tuple[str, int] | None:
    """Log every row under the local or remote folder `results` that the store lacks, holding the folder (not while
    a `bench run` logs into the same store); (the store's URI, how many runs were logged), or None where the store
    could not be opened or failed on the way (a warning has said so)."""
    with folder.Store(results).hold():
        mirror = open_mirror(results, uri)
        if mirror is None:
            return None
        count = mirror.sync(results)
    return (mirror.uri, count) if mirror.ok else None


def serve(uri: str, port: int) -> int:
    """Run `mlflow server` on 127.0.0.1:`port` over the store `uri` until it exits (its exit code), or until Ctrl-C
    or SIGTERM, which stop it too."""
    mlflow_bin = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or shutil.which("mlflow")
    command = [mlflow_bin or "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
               "--backend-store-uri", uri]
    server: subprocess.Popen | None = None
    signalled: list[int] = []

    def terminated(signum: int, frame: Any) -> None:
        signalled.append(signum)
        if server is not None:  # raised inside Popen, the exit would lose the child it is starting
            raise SystemExit(128 + signum)

    # SIGTERM (kill, a service manager) must stop the server too, as Ctrl-C does, not orphan it.
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        server = subprocess.Popen(command)
        if signalled:
            raise SystemExit(128 + signalled[0])
        return server.wait()
    finally:  # Ctrl-C, SIGTERM or an error here: stop the server this command started
        signal.signal(signal.SIGTERM, previous)
        if server is not None and server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
