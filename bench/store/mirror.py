"""MLflow mirror of the parquet results: one experiment per config, one run per trial, all side by side.

Parquet is the source of truth; MLflow is a view of it. A row is logged once it has landed (the grid's writer
process), so a store that is down loses nothing: a warning says so, and `bench sync-mlflow RESULTS` (or the next
`bench run`) backfills. Logging is idempotent: a run carries the tag `bench.trial_id`, marked `bench.complete` once
fully logged; an incomplete or outdated run (a killed driver, a re-run trial) is deleted and logged again.

Store: `--mlflow-uri`, else `MLFLOW_TRACKING_URI`, else the embedded default `sqlite:///RESULTS/mlflow.db` (artifacts
in `RESULTS/mlartifacts`). MLflow 3.17 refuses its file store without MLFLOW_ALLOW_FILE_STORE, hence sqlite.
Runs are flat: no parent run per grid cell, so the runs table lists every trial at once and a comparison across
methods, cells and settings starts from it (MLflow folds child runs under their parent, and a parent holds no numbers).
The cell (dataset, noise, r) is a tag (`bench.cell`) and params, to filter or group by. What a run holds comes
from its result row alone: its name, its cell, its params (every input that changes its numbers, derived from the
trial's effective configuration, never listed by hand: `trial_params`) and its start and end times (the trial's own,
so that MLflow's Duration is the trial's time: `trial_times`).
Experiments are tagged as classic machine-learning ones (`EXPERIMENT_KIND`), and `bench ui` links each one's runs
table with the UI's machine-learning view (`runs_links`): MLflow 3 otherwise opens an experiment on its GenAI overview.

`bench ui` serves the UI (`serve`); `bench sync-mlflow` backfills in batches (`bench.store.mlflow_batches`).
"""

from __future__ import annotations

import calendar
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import declarations, protocol
from bench.config import UserError, lookup
from bench.schema import check_name
from bench.store import folder
from bench.store.columns import DIAGNOSTIC_COLUMNS, MLFLOW_METRICS, MLFLOW_PARAMS, ROW
from bench.store.folder import is_local, local_path

if TYPE_CHECKING:  # imported where used: a Ray worker imports this module, and polars costs it start-up
    import polars as pl

# MLflow's HTTP client retries for minutes by default; a team server that is down must not stall a grid.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")

TAG = "bench."
# MLflow 3's experiment kind: a classic ML experiment, whose page is its runs table (not the GenAI overview).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
ML_VIEW = "workflowType=machine_learning"  # the 3.17 UI's switch to the same view (it reads this before the tag)

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
    """A trial's MLflow run name: method, hyper-parameters, noise, r and seed (`mlflow runs list` tells cells apart)."""
    params = json.loads(row.get("method_params") or "{}")
    extra = "".join(f" {k}={v}" for k, v in sorted(params.items()))
    return (f"{row['method']} lr={row['lr']:g} bs={row['batch_size']}{extra} {row['noise']} r={float(row['r']):g} "
            f"seed={row['seed']}")


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    """A nested configuration as dotted keys (`warmup.lr`); a list of [key, value] pairs as a mapping."""
    if isinstance(value, list) and all(isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) for v in value) \
            and (value or not prefix):  # an empty list of pairs at the top (no method parameter): nothing
        value = dict(value)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out |= _flat(f"{prefix}.{k}" if prefix else str(k), v)
        return out
    return {prefix: json.dumps(value) if isinstance(value, list) else value}


def _selection(row: dict[str, Any]) -> dict[str, str]:
    """The checkpoint-selection rules the trial's protocol implies for its method (the method stage's and the warm
    start's), from the dataset's declared switches; nothing for a dataset or protocol not registered (any more)."""
    # The dataset's own switches read from its file (`Dataset.switches`, unrun: its module imports torch).
    declared = declarations.declared("dataset", "authors_protocol", own=True, default=())
    try:
        switches = {s.name: s for s in lookup(declared, "dataset", row["dataset"])}
        proto = protocol.resolve(row.get("protocol") or ROW["protocol"].default, switches, row["dataset"])
        # In words ("lowest loss on the whole validation set, strict"), as `bench trial` prints them: a reader of the
        # UI's compare page reads the rule, not a Python repr.
        return {"selection": proto.selection(row["method"]).words(),
                "warmup_selection": proto.warmup_selection().words()}
    except (UserError, KeyError, ValueError):
        return {}


def trial_params(row: dict[str, Any]) -> dict[str, str]:
    """A trial's MLflow params: every input that changes its numbers. The row's configuration columns
    (`MLFLOW_PARAMS`, `protocol`, `switches`), then its effective configuration (`config_json`, whose hash is the
    trial id: the warm start's and the method stage's schedules as `warmup.*` and `method_stage.*`, every method
    parameter with its default filled in, by its own name as the method declares it, the train subset, the model,
    the switches' settings as `switches.*`, ...), and the selection rules its protocol implies. Derived from the row,
    never listed by hand, so a new input is a new param."""
    params: dict[str, Any] = {k: row.get(k) for k in MLFLOW_PARAMS}
    params |= {k: row.get(k) or ROW[k].default for k in ("protocol", "switches")}
    config = json.loads(row.get("config_json") or "{}")
    method_params = config.pop("method_params", None)
    if method_params is None:  # a row written before config_json: the parameters it recorded
        method_params = row.get("method_params")
    if isinstance(method_params, str):  # the row's column, or a configuration that recorded the column's JSON text
        method_params = json.loads(method_params or "{}")
    for key, value in _flat("", config).items():
        params.setdefault(key, value)  # the row's column (rounded, typed) where both have it
    for key, value in _flat("", method_params).items():
        params[key if key not in params else f"method.{key}"] = value
    params |= _selection(row)
    # An input left unset is a value too ("none": the whole training set, no explicit T): two runs that differ there
    # must not look equal.
    return {k: _param_value("none" if v is None else str(v)) for k, v in params.items()}


PARAM_LIMIT = 6000  # MLflow's longest param value (`mlflow.utils.validation.MAX_PARAM_VAL_LENGTH`)


def _param_value(text: str) -> str:
    """A param value MLflow takes: a longer one (a large matrix) cut, with the whole's hash (two never read equal)."""
    if len(text) <= PARAM_LIMIT:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return text[:PARAM_LIMIT - 40] + f"... (sha256 {digest})"


def trial_times(row: dict[str, Any]) -> tuple[int, int] | None:
    """The trial's start and end in ms since the epoch: it ended at its row's `finished_at` and ran `wall_s`
    seconds; None where the row lacks either."""
    if not row.get("finished_at") or row.get("wall_s") is None:
        return None
    try:
        end = calendar.timegm(time.strptime(row["finished_at"], "%Y-%m-%dT%H:%M:%SZ")) * 1000
    except ValueError:
        return None
    return end - round(float(row["wall_s"]) * 1000), end


@dataclass
class RunContent:
    """What a trial's run holds, from its row and curves alone: its name, tags (the complete tag aside: set last),
    params, metrics as (key, value, timestamp ms, step), files (name -> text), times in ms and final status."""

    name: str
    tags: dict[str, str]
    params: dict[str, str]
    metrics: list[tuple[str, float, int, int]]
    files: dict[str, str]
    start: int | None
    end: int | None
    status: str


def run_content(row: dict[str, Any], epochs: pl.DataFrame | None) -> RunContent:
    """A trial's run: what `Mirror` logs a call at a time and `bench.store.mlflow_batches` writes a batch at a time."""
    tags = {f"{TAG}kind": "trial", f"{TAG}trial_id": row["trial_id"], f"{TAG}cell": cell_of(row),
            f"{TAG}status": row["status"]} | {k: str(row[k]) for k in ("dataset", "method", "noise", "r", "seed")}
    # The protocol and its switches (`bench.protocol`); rows written before protocols existed were bench's.
    tags.update({f"{TAG}{k}": str(row.get(k) or ROW[k].default) for k in ("protocol", "switches")})
    if row.get("oracle"):  # selected on the clean test set (`bench.protocol.Selection.oracle`): no result
        tags[f"{TAG}oracle"] = "true"
    start, end = trial_times(row) or (None, None)  # the trial's own times: MLflow's Duration is its wall time
    now = int(time.time() * 1000) if end is None else end
    metrics = [(k, float(row[k]), now, 0) for k in MLFLOW_METRICS if row.get(k) is not None]
    if epochs is not None and epochs.height:
        for e in epochs.iter_rows(named=True):
            prefix = "" if e["stage"] == "method" else f"{e['stage']}_"
            for name in ("train_loss", "val_loss", "val_acc", "seconds", *DIAGNOSTIC_COLUMNS):
                if e.get(name) is not None:
                    metrics.append((f"{prefix}epoch_{name}", float(e[name]), now, int(e["epoch"])))
    files = {"result_row.json": json.dumps(row, indent=1, sort_keys=True, default=str)} | {  # the row, its matrices
        name: row[column] for column, name in (("confusion", "confusion_matrix.json"), ("estimated_transition",
        "estimated_transition.json"), ("transition", "true_transition.json"), ("empirical_transition",
        "empirical_transition.json"), ("error", "error.txt")) if row.get(column)}
    return RunContent(run_name(row), tags, trial_params(row), metrics, files, start, end,
                      "FINISHED" if row["status"] != "failed" else "FAILED")


class Mirror:
    """Logs result rows to one MLflow store. After the first failure it stops trying and says how to backfill."""

    def __init__(self, uri: str, results: str | os.PathLike[str], warn=None) -> None:
        _quiet_sqlalchemy()
        # "Creating initial tables...", and a traceback logged for each database error, which `guard` and
        # `open_mirror` say in one line
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
        from mlflow import MlflowClient

        self.uri, self.results = uri, str(results)
        self.embedded = uri.startswith("sqlite:///") and is_local(results)
        self.client = MlflowClient(tracking_uri=uri)
        self.failed: str | None = None
        self.warn = warn or (lambda msg: print(f"bench: warning: {msg}", file=sys.stderr, flush=True))
        self._experiments: dict[str, str] = {}
        self._logged: dict[str, dict[str, tuple[str, str]]] = {}
        self._runs: dict[str, dict[str, list[str]]] = {}  # experiment -> trial_id -> its runs, complete or not

    # -- failure handling -------------------------------------------------------------------------------------
    def guard(self, what: str, fn, *args):
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
        self._logged.clear()
        self._runs.clear()

    # -- store layout -----------------------------------------------------------------------------------------
    def experiment_id(self, name: str) -> str:
        if name not in self._experiments:
            found = self.client.get_experiment_by_name(name)
            if found is not None:
                self._experiments[name] = found.experiment_id
                for key, value in EXPERIMENT_KIND.items():  # made by an older bench, or by hand
                    if found.tags.get(key) != value:
                        self.client.set_experiment_tag(found.experiment_id, key, value)
            else:
                location = (local_path(self.results) / "mlartifacts" / name).as_uri() if self.embedded else None
                self._experiments[name] = self.client.create_experiment(name, artifact_location=location,
                                                                        tags=EXPERIMENT_KIND)
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
        """trial_id -> (run_id, status logged) of the complete trial runs in an experiment. Listed once a mirror (with
        every trial run, complete or not: those `_log_row` replaces), then kept up to date as it logs: the folder's
        lock makes it the store's one writer of the experiment's trial runs."""
        if experiment not in self._logged:
            exp_id = self.experiment_id(experiment)
            done: dict[str, tuple[str, str]] = {}
            runs: dict[str, list[str]] = {}
            for run in self._search(exp_id, f"tags.`{TAG}kind` = 'trial'"):
                tags = run.data.tags
                runs.setdefault(tags.get(f"{TAG}trial_id", ""), []).append(run.info.run_id)
                if tags.get(f"{TAG}complete") == "true":
                    done[tags[f"{TAG}trial_id"]] = (run.info.run_id, tags.get(f"{TAG}status", ""))
            self._logged[experiment], self._runs[experiment] = done, runs
        return self._logged[experiment]

    # -- logging ----------------------------------------------------------------------------------------------
    def log_row(self, row: dict[str, Any], epochs: pl.DataFrame | None = None) -> bool:
        """Log one trial (skipped if already logged with the same status). True if it is in MLflow now."""
        return self.loggable(row) and bool(self.guard(f"logging trial {row['trial_id']}", self._log_row, row, epochs))

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
        from mlflow.entities import Metric, Param, RunTag

        experiment = row.get("experiment") or "adhoc"
        exp_id = self.experiment_id(experiment)
        logged = self.logged(experiment)
        trial_id = row["trial_id"]
        if trial_id in logged and logged[trial_id][1] == row["status"]:
            return True
        self.drop_outdated(experiment, trial_id)
        run = run_content(row, epochs)
        created = self.client.create_run(exp_id, start_time=run.start, run_name=run.name, tags=run.tags)
        run_id = created.info.run_id
        self._runs[experiment][trial_id] = [run_id]
        metrics = [Metric(*m) for m in run.metrics]
        params = [Param(k, v) for k, v in run.params.items()]
        with tempfile.TemporaryDirectory(prefix="bench-mlflow-") as where:  # the row's files, in one call
            for name, text in run.files.items():
                Path(where, name).write_text(text, encoding="utf-8")
            self.client.log_artifacts(run_id, where)
        # Params, metrics and, last, the tag that marks the run complete, in as few of MLflow's batches as its limits
        # allow (1,000 values a call, 100 of them params): one transaction each, where a call a value was one each.
        while params or metrics:
            some, params = params[:100], params[100:]
            more, metrics = metrics[:1000 - len(some)], metrics[1000 - len(some):]
            done = [] if params or metrics else [RunTag(f"{TAG}complete", "true")]
            self.client.log_batch(run_id, metrics=more, params=some, tags=done)
        self.client.set_terminated(run_id, run.status, end_time=run.end)
        logged[trial_id] = (run_id, row["status"])
        return True

    def drop_outdated(self, experiment: str, trial_id: str) -> None:
        """Delete the trial's runs that are outdated or partial (a failed attempt, a driver killed mid-log): a trial
        about to be logged again has one run. (`logged(experiment)` first: it lists them.)"""
        for old in self._runs[experiment].pop(trial_id, []):
            self.client.delete_run(old)
        self._logged[experiment].pop(trial_id, None)

    def missing(self, results: str | os.PathLike[str],
                trial_ids: set[str] | None = None) -> Iterator[tuple[str, dict[str, Any], Any]]:
        """The rows under `results` (or in `trial_ids`) MLflow lacks, as (experiment, row, curves), until it fails."""
        rows = folder.read_table(results)
        if rows.is_empty() or self.failed:
            return
        epochs = folder.read_table(results, "epochs")
        curves = epochs.partition_by("trial_id", as_dict=True) if epochs.height else {}  # one pass, not one a row
        yield from self.unlogged((row, curves.get((row["trial_id"],))) for row in rows.iter_rows(named=True)
                                 if trial_ids is None or row["trial_id"] in trial_ids)

    def unlogged(self, rows: Iterable[tuple[dict[str, Any], Any]]) -> Iterator[tuple[str, dict[str, Any], Any]]:
        """Those of `rows` (row, curves) that MLflow lacks, as (experiment, row, curves), until the store fails."""
        for row, curve in rows:
            if not self.loggable(row):
                continue
            experiment = row.get("experiment") or "adhoc"
            if (known := self.guard("listing runs", self.logged, experiment)) is None:
                return
            if row["trial_id"] not in known or known[row["trial_id"]][1] != row["status"]:
                yield experiment, row, curve

    def sync(self, results: str | os.PathLike[str], trial_ids: set[str] | None = None) -> int:
        """Log every row under `results` (or those in `trial_ids`) that MLflow lacks, run by run; return how many."""
        count = 0
        for _, row, curve in self.missing(results, trial_ids):
            if not self.log_row(row, curve):
                break
            count += 1
        return count


def complete_trial_runs(uri: str) -> set[str] | None:
    """The trial ids with a complete run in the sqlite store `uri`, read with sqlite3 from MLflow's tables (`runs`,
    `tags`), read-only and without importing MLflow: a reader asks it in milliseconds. None for a store of another
    kind, a store that is not there, or one that does not read as MLflow's."""
    path = Path(uri.removeprefix("sqlite:///"))
    if not uri.startswith("sqlite:///") or not path.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            found = db.execute(
                "SELECT t.value FROM tags t JOIN runs r ON r.run_uuid = t.run_uuid JOIN tags c ON c.run_uuid = "
                "t.run_uuid AND c.key = ? AND c.value = 'true' WHERE t.key = ? AND r.lifecycle_stage = 'active'",
                (f"{TAG}complete", f"{TAG}trial_id")).fetchall()
    except sqlite3.Error:
        return None
    return {value for (value,) in found}


def runs_links(uri: str, address: str) -> list[str]:
    """'name: link' to the runs table of each experiment in the store, in the UI's machine-learning view (`ML_VIEW`).
    MLflow 3's UI opens an experiment on its GenAI overview, where a grid's trials do not show."""
    _quiet_sqlalchemy()
    from mlflow.tracking import MlflowClient

    try:
        experiments = MlflowClient(tracking_uri=uri).search_experiments()
    except Exception as e:  # noqa: BLE001 - the server can still start; the links are a convenience
        return [f"(could not list the experiments: {type(e).__name__})"]
    return [f"{e.name}: {address}/#/experiments/{e.experiment_id}/runs?{ML_VIEW}" for e in experiments
            if e.name != "Default"]


def open_mirror(results: str | os.PathLike[str], uri: str | None, warn=None) -> Mirror | None:
    """A mirror on the chosen store (a server that cannot be reached now: a mirror marked failed, which the grid
    tries again when it ends), or None (with a warning) when there is no store to use. A sqlite file that is
    not a database (damaged, or something else under that name), or one that MLflow cannot open (half-made: a disk
    that filled while MLflow created its tables), is set aside under a name that says so and a fresh store started:
    parquet holds every result, so nothing is lost, and the caller logs the rows the new store lacks."""
    chosen = tracking_uri(results, uri)
    say = warn or (lambda msg: print(f"bench: warning: {msg}", file=sys.stderr, flush=True))
    if chosen is None:
        say(f"results in {results} are not a local folder and no MLflow store was named: MLflow logging is off "
            "(pass --mlflow-uri or set MLFLOW_TRACKING_URI; `bench sync-mlflow` backfills later)")
        return None
    backfill = f"`bench sync-mlflow {results}{'' if uri is None else ' --mlflow-uri ' + uri}`"
    path = Path(chosen.removeprefix("sqlite:///")) if chosen.startswith("sqlite:///") else None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if problem := _not_a_database(path):
            say(f"{path} is not a usable MLflow database ({problem}); set it aside as {_set_aside(path).name} and "
                f"started a fresh one: the parquet rows hold every result, and {backfill} logs those it lacks")
        if not path.exists() or path.stat().st_size == 0:
            _new_store(path)
    try:
        return _opened(chosen, results, say)
    except Exception as e:  # noqa: BLE001 - a store that cannot open must not stop the grid: parquet is the truth
        problem = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        error = e
    if path is not None and path.is_file() and path.stat().st_size and not _busy(error):
        # A database that sqlite reads but MLflow cannot use (tables half-made): the same remedy as a damaged one.
        say(f"{path} cannot be opened as an MLflow store ({problem}); set it aside as {_set_aside(path).name} (an "
            f"older MLflow's store comes back with `mlflow db upgrade`) and started a fresh one: the parquet rows "
            f"hold every result, and {backfill} logs those it lacks")
        try:
            return _opened(chosen, results, say)
        except Exception as e:  # noqa: BLE001 - as above
            problem = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    if path is None:  # a server: down now, perhaps up when the grid ends, when the grid's mirror tries it again
        mirror = Mirror(chosen, results, warn=say)
        mirror.failed = problem  # the summary names it and the backfill (`bench.grid.progress.print_summary`)
        say(f"MLflow store {chosen} cannot be opened ({problem}); no result is lost: a grid tries it again when it "
            f"ends, and {backfill} backfills it later")
        return mirror
    say(f"MLflow store {chosen} cannot be opened ({problem}); MLflow logging is off for this run, no result is "
        f"lost, and {backfill} backfills it later")
    return None


def _new_store(path: Path) -> None:
    """A new embedded store at `path`, copied from an empty one MLflow built once per version and user (in
    ~/.cache/bench/mlflow-stores): MLflow runs each of its schema migrations to build one, 2 s of CPU beside a new
    folder's grid. Its Default experiment gets the location and times MLflow would give it here and now (its one value
    that depends on them). Where no template can be made, MLflow builds the store itself."""
    import mlflow

    template = Path.home() / ".cache" / "bench" / "mlflow-stores" / f"empty-{mlflow.__version__}.db"
    building, copy = (p.with_name(f".{p.name}.{os.getpid()}.new") for p in (template, path))
    try:
        if not template.is_file():  # whole or not at all: another process may build it at the same time
            template.parent.mkdir(parents=True, exist_ok=True)
            Mirror(f"sqlite:///{building}", path.parent).client.search_experiments(max_results=1)
            _forget(f"sqlite:///{building}")
            building.replace(template)
        shutil.copyfile(template, copy)
        with contextlib.closing(sqlite3.connect(copy)) as db, db:  # MLflow's artifact root: ./mlruns, made absolute
            db.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? WHERE "
                       "experiment_id = 0", (str(Path("mlruns").absolute() / "0"), *[int(time.time() * 1000)] * 2))
        copy.replace(path)
    except Exception:  # noqa: BLE001 - no template (a home that cannot be written, another schema): MLflow builds it
        for leftover in (building, copy):
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)


def _opened(uri: str, results: str | os.PathLike[str], say) -> Mirror:
    """A mirror on `uri` that has answered a first query (MLflow opens a store lazily, table by table)."""
    mirror = Mirror(uri, results, warn=say)
    with warnings.catch_warnings():
        _quiet_sqlalchemy()
        mirror.client.search_experiments(max_results=1)
    return mirror


def _forget(uri: str) -> None:
    """Drop what this process's MLflow keeps open on `uri` (its store, its database engine), so that the next client
    opens the file now under that name, not the one set aside. MLflow's own caches: where a release renames them,
    the retry meets the old file again and says so."""
    _quiet_sqlalchemy()  # importing MLflow's store warns about SQLAlchemy's deprecations
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        engine = SqlAlchemyStore._engine_map.pop(uri, None)
        if engine is not None:
            engine.dispose()
        _tracking_store_registry._get_store_with_resolved_uri.cache_clear()
    except (ImportError, AttributeError):  # pragma: no cover - another MLflow's internals
        pass


def _busy(error: BaseException) -> bool:
    """Whether a store failed because another process holds it (an MLflow UI writing): in use, not damaged."""
    return any(word in str(error).lower() for word in ("database is locked", "database is busy"))


def _set_aside(path: Path) -> Path:
    """Move the sqlite file `path` (and the journal sqlite keeps beside it) to `<name>.damaged-<time>`."""
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    _forget(f"sqlite:///{path}")
    path.rename(aside)
    for suffix in ("-journal", "-wal", "-shm"):
        if (beside := path.with_name(path.name + suffix)).is_file():
            beside.rename(aside.with_name(aside.name + suffix))
    return aside


def _not_a_database(path: Path) -> str | None:
    """What is wrong with the sqlite file at `path` (None: nothing, or no file yet): not a database, or corrupt."""
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


# -- what `bench ui` does (its command: `bench.cli.mlflow`) ------------------------------------------------------
JOB_RUNNER = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def serve(uri: str, port: int, answered: Callable[[], None]) -> int:
    """Run `mlflow server` on 127.0.0.1:`port` over the store `uri` until it exits (its exit code; 1 at least where it
    never answered), or until Ctrl-C or SIGTERM, which stop it too; `answered()` once it answers (its `/health`): a
    link printed before that was dead for up to two minutes on a loaded machine. MLflow 3's GenAI job runner stays
    off (its own workers, which the runs table never needs; docs/cluster.md) unless $MLFLOW_SERVER_ENABLE_JOB_EXECUTION
    says otherwise."""
    mlflow_bin = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or shutil.which("mlflow")
    command = [mlflow_bin or "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
               "--backend-store-uri", uri]
    env = {**os.environ, JOB_RUNNER: os.environ.get(JOB_RUNNER, "false")}
    server: subprocess.Popen | None = None
    signalled: list[int] = []

    def terminated(signum: int, frame: Any) -> None:
        signalled.append(signum)
        if server is not None:  # raised inside Popen, the exit would lose the child it is starting
            raise SystemExit(128 + signum)

    # SIGTERM (kill, a service manager) must stop the server too, as Ctrl-C does, not orphan it.
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        server = subprocess.Popen(command, env=env)
        if signalled:
            raise SystemExit(128 + signalled[0])
        while server.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            except OSError:  # not listening yet (refused, reset, or a timeout)
                time.sleep(0.5)
                continue
            answered()
            return server.wait()
        print(f"bench: MLflow's server ended (exit code {server.returncode}) before it answered on 127.0.0.1:{port}; "
              "its own lines above say why", file=sys.stderr, flush=True)  # a port taken: exit 0 in some versions
        return server.returncode or 1
    finally:  # Ctrl-C, SIGTERM or an error here: stop the server this command started
        signal.signal(signal.SIGTERM, previous)
        if server is not None and server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
