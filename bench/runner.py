"""`bench run CONFIG`: fan an experiment grid out with Ray Tune; plus `bench results`, `bench sync-mlflow`, `bench ui`.

    experiment file --validate/expand--> TrialConfigs --skip those with a result row--> Ray Tune grid search
    (basic variant generator, no scheduler, no early stopping, reuse_actors) --each trial--> bench.trainer.run_trial
    (writes its own parquet row; CE warm start from the shared cache) --driver callback--> progress line + MLflow

Trial identity is `TrialConfig.trial_id`, a hash of the trial's own config: a relaunch runs only the trials without
a result row (rows with status "failed" run again), so a killed grid resumes and a grid can grow. Ray retries a
crashed trial (`--retries`); the method stage checkpoints after every epoch, so a retried trial (or one re-run
after the driver was killed) resumes from its last finished epoch, and its warm start comes from the cache.
Locally Ray starts in-process (`ray.init(address="local")`, never attaching to another Ray on the machine);
`--address` joins a cluster.

Before Ray starts, the driver checks every trial (`bench.validate`), the data files and the results folder, and takes
the folder's lock (one driver per folder). A `UserError` that only a worker meets is reported to the driver once,
not raised, so that Ray does not retry what retrying cannot fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.config import EXIT_USAGE, TrialConfig, UserError
from bench.experiment import Experiment, load_experiment
from bench.validate import GRID_LIMIT, check_data, check_grid_size, check_results, check_trials

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no status table from Ray Tune


# -- the plan ---------------------------------------------------------------------------------------------------
def absolute_results(results: str | os.PathLike[str]) -> str:
    """Results root as workers must see it: an absolute path (trials run in their own folder) or a URI."""
    results = str(results)
    return results if "://" in results else str(Path(results).expanduser().resolve())


def finished(results: str) -> dict[str, str]:
    """trial_id -> status of every result row under `results`."""
    from bench.results import read_table

    table = read_table(results)
    if table.is_empty():
        return {}
    return dict(zip(table["trial_id"].to_list(), table["status"].to_list(), strict=True))


@dataclass
class Plan:
    experiment: Experiment
    trials: list[TrialConfig]
    results: str
    done: dict[str, str] = field(default_factory=dict)  # trial_id -> status of rows that need no re-run

    @classmethod
    def make(cls, experiment: Experiment, results: str, device: str | None = None) -> Plan:
        trials = experiment.trials()
        if device is not None:
            trials = [dataclasses.replace(t, device=device) for t in trials]
        check_trials(trials)
        rows = finished(results)
        done = {t.trial_id: rows[t.trial_id] for t in trials if rows.get(t.trial_id, "failed") != "failed"}
        return cls(experiment, trials, results, done)

    @property
    def pending(self) -> list[TrialConfig]:
        return [t for t in self.trials if t.trial_id not in self.done]

    def work(self, trials: list[TrialConfig]) -> dict[str, int]:
        """Epochs the trials imply: method stages, and warm starts with and without the shared cache."""
        from bench.data import get_dataset
        from bench.methods import get_method
        from bench.packed import warm_cell

        method_epochs = warm_epochs = unshared = 0
        cells: set[tuple[Any, ...]] = set()
        for t in trials:
            ds = get_dataset(t.dataset)
            epochs = t.epochs if t.epochs is not None else ds.method_stage.epochs
            warm = t.epochs_warmup if t.epochs_warmup is not None else ds.warmup.epochs
            nets = get_method(t.method).networks
            method_epochs += epochs
            unshared += warm * nets
            for i in range(nets):
                cell = (*warm_cell(t), i)
                if cell not in cells:
                    cells.add(cell)
                    warm_epochs += warm
        return dict(method_epochs=method_epochs, warm_starts=len(cells), warm_epochs=warm_epochs,
                    warm_epochs_unshared=unshared)


def plan_units(trials: list[TrialConfig], pack: str | int) -> list[list[TrialConfig]]:
    """Solo trials and packs (`bench.packed.plan_units`); imported here so that `bench --help` stays light."""
    from bench.packed import plan_units as plan

    return plan(trials, pack)


def unit_id(unit: list[TrialConfig]) -> str:
    """A solo trial is named by its trial id, a pack by its members' (`pack-<hash>`)."""
    from bench.packed import pack_id

    return pack_id(unit) if len(unit) > 1 else unit[0].trial_id


def describe_units(units: list[list[TrialConfig]], pack: str | int) -> str | None:
    """The packs a grid runs as, in one line (None when every trial runs solo)."""
    packs = [u for u in units if len(u) > 1]
    if not packs:
        return None
    return (f"packs (--pack {pack}): {sum(map(len, packs))} trials in {len(packs)} packs of "
            f"{', '.join(str(len(u)) for u in packs)}; {len(units) - len(packs)} trials solo")


def parse_pack(value: str) -> str | int:
    """`--pack`: auto, off, or a number of members per pack."""
    if value in ("auto", "off"):
        return value
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise UserError(f"--pack must be auto, off or a number of trials per pack (>= 1), got {value!r}")


def describe_trial(t: TrialConfig) -> str:
    params = "".join(f" {k}={v}" for k, v in t.method_params)
    lr = f" lr={t.lr:g}" if t.lr is not None else ""
    bs = f" bs={t.batch_size}" if t.batch_size is not None else ""
    return f"{t.method}{lr}{bs}{params}  {t.noise} r={t.r:g} seed={t.seed}"


LIST_LIMIT = 1_000  # --dry-run lists the trials of a grid up to this size


def print_plan(plan: Plan, out: Callable[[str], None] = print, pack: str | int = "auto") -> None:
    exp, pending = plan.experiment, plan.pending
    total = len(plan.trials)
    out(f"experiment {exp.name} ({exp.source}): {exp.dataset}, noise {', '.join(exp.noise)}, "
        f"r {', '.join(f'{r:g}' for r in exp.r)}, seeds {', '.join(map(str, exp.seeds))}")
    per_method = Counter(t.method for t in plan.trials)
    out(f"grid: {total} trials = " + " + ".join(f"{n} {m}" for m, n in per_method.items())
        + f"; {len(plan.done)} already have a result row, {len(pending)} to run")
    w = plan.work(pending)
    saved = w["warm_epochs_unshared"] - w["warm_epochs"]
    out(f"work to run: {w['method_epochs']} method-stage epochs + {w['warm_epochs']} warm-start epochs "
        f"({w['warm_starts']} CE warm starts shared by {len(pending)} trials; {saved} epochs saved by sharing, "
        f"fewer if some are already cached)")
    res = exp.resources
    out(f"per trial: {res.cpu:g} CPU, {res.gpu:g} GPU, device {pending[0].device if pending else exp.device}; "
        f"at most {exp.max_concurrent or 'as many as fit'} at once")
    out(f"results: {plan.results}")
    units = plan_units(pending, pack)
    if line := describe_units(units, pack):
        out(line)
    if pack != "off":
        from bench.packed import why_solo

        reasons = Counter(why_solo(u[0]) for u in units if len(u) == 1)
        for reason, n in sorted(reasons.items(), key=lambda kv: str(kv[0])):
            if reason:
                out(f"  solo: {n} trials: {reason}")
        if pack == "auto" and pending and not pending[0].device.startswith("cuda"):
            out("  solo: --pack auto packs on CUDA only (on a CPU, packing measured slower than solo trials)")
    if total > LIST_LIMIT:
        out(f"trials: {total:,} (not listed: more than {LIST_LIMIT:,})")
        return
    out("trials:")
    width = len(str(total))
    for i, t in enumerate(plan.trials, 1):
        state = plan.done.get(t.trial_id, "pending")
        out(f"  {i:>{width}}. {t.trial_id}  {state:8s} {describe_trial(t)}")


def print_size(exp: Experiment, out: Callable[[str], None] = print) -> None:
    """A grid too large to expand: its size by method, counted, not listed."""
    cells = len(exp.seeds) * len(exp.noise) * len(exp.r)
    parts = " + ".join(f"{cells * len(m.combinations()):,} {m.name}" for m in exp.methods)
    out(f"experiment {exp.name} ({exp.source}): {exp.dataset}, noise {', '.join(exp.noise)}, {len(exp.r)} r values, "
        f"{len(exp.seeds):,} seeds")
    out(f"grid: {exp.size():,} trials = {parts}; more than {GRID_LIMIT:,}: not expanded, not listed "
        "(running it needs --yes)")


# -- the trial, in a Ray worker ---------------------------------------------------------------------------------
class TrialCheckpoints:
    """`RESULTS/checkpoints/<trial_id>.pt`: the method stage's state after its last finished epoch (written
    atomically), so that a trial retried by Ray, or re-run after the driver was killed, resumes where it stopped.
    Deleted once the trial's row is written. An unreadable checkpoint is ignored (the trial starts over)."""

    def __init__(self, results: str, trial_id: str, log: Callable[[str], None]) -> None:
        from bench.results import _filesystem

        self.fs, root = _filesystem(results)
        self.folder = f"{root}/checkpoints"
        self.path = f"{self.folder}/{trial_id}.pt"
        self.log = log

    def load(self) -> dict[str, Any] | None:
        import io

        import pyarrow.fs as pafs
        import torch

        if self.fs.get_file_info(self.path).type != pafs.FileType.File:
            return None
        try:
            with self.fs.open_input_stream(self.path) as f:
                return torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - a bad checkpoint costs a restart, never the trial
            self.log(f"ignoring the unreadable checkpoint {self.path}: {type(e).__name__}: {e}")
            return None

    def save(self, state: dict[str, Any]) -> None:
        import io
        import uuid

        import torch

        buffer = io.BytesIO()
        torch.save(state, buffer)
        self.fs.create_dir(self.folder, recursive=True)
        tmp = f"{self.path}.{uuid.uuid4().hex}.tmp"
        with self.fs.open_output_stream(tmp) as f:
            f.write(buffer.getvalue())
        self.fs.move(tmp, self.path)

    def clear(self) -> None:
        import pyarrow.fs as pafs

        if self.fs.get_file_info(self.path).type == pafs.FileType.File:
            self.fs.delete_file(self.path)


def ray_unit(config: dict[str, Any], units: dict[str, list[TrialConfig]], data_root: str, results: str,
             threads: int) -> None:
    """Run one unit of the grid in a Ray worker: a solo trial, or a pack of trials trained as one stacked model
    (`bench.packed`); report its status and warm-start cache use."""
    import torch
    from ray import tune

    from bench.packed import run_pack
    from bench.trainer import run_trial
    from bench.warmstart import WarmStartCache

    torch.set_num_threads(threads)
    unit_id = config["unit"]
    trials = units[unit_id]
    if "://" in results:
        log_path = Path("trial.log")  # the trial's own folder in Ray's storage
    else:
        log_path = Path(results) / "logs" / f"{unit_id}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log_file:
        def log(line: str) -> None:
            log_file.write(line + "\n")
            log_file.flush()

        cache = WarmStartCache(results, log=log)
        checkpoints = TrialCheckpoints(results, unit_id, log)
        try:
            if len(trials) > 1:
                rows = run_pack(trials, data_root, results=results, log=log, warm_cache=cache,
                                checkpoints=checkpoints)
            else:
                rows = [run_trial(trials[0], data_root, results=results, log=log, warm_cache=cache,
                                  checkpoints=checkpoints)]
        except UserError as e:
            # Bad input that only the worker could see (a data file damaged after the driver's check, a row that
            # could not be written): retrying cannot help, so report it once to the driver instead of raising.
            log(f"bench: error: {e}")
            tune.report({"unit": unit_id, "status": "rejected", "error": str(e), **cache.stats()})
            return
        checkpoints.clear()
    tune.report({"unit": unit_id, "status": ",".join(sorted({r["status"] for r in rows})), **cache.stats()})


# -- the driver -------------------------------------------------------------------------------------------------
def fmt_seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@dataclass
class Tally:
    total: int
    started: float = field(default_factory=time.monotonic)
    done: int = 0
    statuses: Counter = field(default_factory=Counter)
    warm_hits: int = 0
    warm_misses: int = 0
    warm_saved_s: float = 0.0
    compute_s: float = 0.0
    mlflow_logged: int = 0
    rejected: dict[str, str] = field(default_factory=dict)  # trial_id -> the error a worker's check raised


def make_callback(tally: Tally, results: str, trials: dict[str, TrialConfig], units: dict[str, list[str]],
                  mirror: Any, out: Callable[[str], None]):
    from ray import tune

    from bench.results import read_row

    class Progress(tune.Callback):
        """One line per finished trial (n/N, ETA), also for each member of a finished pack; mirrors each new result
        row to MLflow."""

        def _finish(self, trial: Any, errored: bool) -> None:
            unit = trial.config["unit"]
            result = trial.last_result or {}
            tally.warm_hits += int(result.get("warm_hits", 0))
            tally.warm_misses += int(result.get("warm_misses", 0))
            tally.warm_saved_s += float(result.get("warm_saved_s", 0.0))
            for trial_id in units[unit]:
                self._finish_trial(trial_id, result, errored, len(units[unit]), unit)

        def _finish_trial(self, trial_id: str, result: dict[str, Any], errored: bool, size: int, unit: str) -> None:
            tally.done += 1
            row, epochs = read_row(results, trial_id)
            rejected = result.get("status") == "rejected" and not errored
            if rejected:
                tally.rejected[trial_id] = result.get("error", "")
                row = epochs = None
            status = "rejected" if rejected else "failed" if errored or row is None else row["status"]
            tally.statuses[status] += 1
            if row is not None:
                tally.compute_s += float(row["wall_s"] or 0.0)
            elapsed = time.monotonic() - tally.started
            eta = elapsed / tally.done * (tally.total - tally.done)
            acc = f"test {row['test_acc']:6.2f}%" if row is not None and row["test_acc"] is not None else "-"
            warm = " (warm start reused)" if result.get("warm_hits") and size == 1 else ""
            warm += f" (pack of {size})" if size > 1 else ""
            wall = f"{row['wall_s']:.0f}s" if row is not None and size == 1 else ""
            width = len(str(tally.total))
            note = f"  see {results}/logs/{unit}.log" if status == "failed" and "://" not in results else ""
            if rejected:
                note = f"\n      bench: error: {tally.rejected[trial_id]}"
            out(f"[{tally.done:>{width}}/{tally.total}] {status:8s} {describe_trial(trials[trial_id])}  {acc} "
                f"{wall}{warm}  elapsed {fmt_seconds(elapsed)}  ETA {fmt_seconds(eta)}{note}")
            if mirror is not None and row is not None and mirror.log_row(row, epochs):
                tally.mlflow_logged += 1

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._finish(trial, errored=False)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._finish(trial, errored=True)

        def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            out(f"      {trial.config['unit']} crashed; Ray retries it from its last epoch checkpoint")

    return Progress()


def start_ray(address: str | None, num_cpus: int | None) -> bool:
    """Connect to (or start) Ray; return True if this call started it (so the caller shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    # Ray Tune's own warnings on Ctrl-C suggest Tuner.restore; `bench run` resumes by trial identity instead.
    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    if address:
        try:
            ray.init(address=address, **kwargs)
        except Exception as e:  # noqa: BLE001 - name the usual causes
            text = " ".join(str(e).split())
            # A token mismatch shows only in Ray's own log lines (InvalidAuthToken); the exception is a plain
            # ConnectionError, so name that cause whenever the connection fails.
            mode = os.environ.get("RAY_AUTH_MODE", "unset")
            hint = (f" Check the address and port; and token authentication (RAY_AUTH_MODE is {mode} here): a "
                    "cluster started with `ray start` expects RAY_AUTH_MODE=token and the cluster's token "
                    "(RAY_AUTH_TOKEN or ~/.ray/auth_token) on the client, unless it was started with "
                    "RAY_AUTH_MODE=disabled (see docs/cluster.md).")
            raise UserError(f"cannot connect to the Ray cluster at {address}: {type(e).__name__}: {text[:400]}"
                            f"{hint}") from None
    else:
        ray.init(address="local", num_cpus=num_cpus, **kwargs)
    return True


def check_resources(cpu: float, gpu: float) -> None:
    """Fail at once when no node of the cluster can ever hold one trial (Ray would wait for ever)."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if any(res.get("CPU", 0) >= cpu and res.get("GPU", 0) >= gpu for res in nodes):
        return
    have = ", ".join(f"{res.get('CPU', 0):g} CPU / {res.get('GPU', 0):g} GPU" for res in nodes) or "no nodes"
    what = f"{cpu:g} CPU" + (f" and {gpu:g} GPU" if gpu else "")
    fix = ("run on a cluster with GPUs, or set device: cpu and resources.gpu: 0 (--gpus-per-trial 0)"
           if gpu and not any(res.get("GPU", 0) for res in nodes) else "lower resources.cpu (--cpus-per-trial)")
    raise UserError(f"each trial asks for {what} but no node of this Ray cluster can ever provide it "
                    f"(nodes: {have}); {fix}")


@dataclass
class Settings:
    results: str
    data_root: Path
    address: str | None = None
    max_concurrent: int | None = None
    mlflow_uri: str | None = None
    mlflow: bool = True
    cpus_per_trial: float | None = None
    gpus_per_trial: float | None = None
    retries: int = 2
    num_cpus: int | None = None
    pack: str | int = "auto"  # "auto" (packs on CUDA), "off", or members per pack


def run_experiment(exp: Experiment, s: Settings, out: Callable[[str], None] = print) -> Tally:
    """Run the pending trials of an experiment; return the tally. Raises UserError on an impossible request, and
    when another driver holds the results folder."""
    from bench.results import hold

    results = absolute_results(s.results)
    check_results(results)
    with hold(results):
        return _run_experiment(exp, s, out)


def _run_experiment(exp: Experiment, s: Settings, out: Callable[[str], None]) -> Tally:
    from ray import tune

    from bench import tracking
    from bench.results import set_aside_damaged

    cpu = s.cpus_per_trial if s.cpus_per_trial is not None else exp.resources.cpu
    gpu = s.gpus_per_trial if s.gpus_per_trial is not None else exp.resources.gpu
    device = None if s.gpus_per_trial is None else ("cuda" if gpu > 0 else "cpu")
    if device == "cpu" and exp.device.startswith("cuda"):
        out("note: --gpus-per-trial 0 runs this grid on the CPU")
    results = absolute_results(s.results)
    for moved in set_aside_damaged(results):
        out(f"set aside the unreadable result file {moved}: its trial runs again")
    plan = Plan.make(exp, results, device=device)
    pending = plan.pending
    by_id = {t.trial_id: t for t in plan.trials}

    mirror = tracking.open_mirror(results, s.mlflow_uri) if s.mlflow else None
    if mirror is not None and plan.done:
        backfilled = mirror.sync(results, trial_ids=set(plan.done))
        if backfilled:
            out(f"MLflow: backfilled {backfilled} runs of finished trials")

    tally = Tally(total=len(pending))
    if not pending:
        out(f"{exp.name}: all {len(plan.trials)} trials already have a result row in {results}; nothing to run")
        return tally
    if s.address is None:
        check_data({t.dataset for t in pending}, s.data_root)
    w = plan.work(pending)
    out(f"{exp.name}: running {len(pending)} of {len(plan.trials)} trials ({len(plan.done)} already done); "
        f"{w['method_epochs']} method-stage epochs + {w['warm_epochs']} warm-start epochs "
        f"({w['warm_starts']} warm starts)")

    units = {unit_id(u): u for u in plan_units(pending, s.pack)}
    if line := describe_units(list(units.values()), s.pack):
        out(line)
    started_here = start_ray(s.address, s.num_cpus)
    try:
        check_resources(cpu, gpu)
        trainable = tune.with_parameters(
            ray_unit, units=units,
            data_root=str(Path(s.data_root).expanduser().resolve()), results=results,
            threads=max(1, int(cpu)),
        )
        # A pack takes its members' GPU shares together, at most one whole GPU (it runs on one device).
        trainable = tune.with_resources(
            trainable, lambda spec: {"cpu": cpu, "gpu": min(1.0, gpu * len(units[spec["unit"]])) if gpu else 0})
        storage = f"{results}/ray"
        if "://" not in results:
            Path(storage).mkdir(parents=True, exist_ok=True)
        tuner = tune.Tuner(
            trainable,
            param_space={"unit": tune.grid_search(list(units))},
            tune_config=tune.TuneConfig(
                reuse_actors=True, max_concurrent_trials=s.max_concurrent or exp.max_concurrent
            ),
            run_config=tune.RunConfig(
                name=f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}", storage_path=storage, verbose=0,
                failure_config=tune.FailureConfig(max_failures=s.retries),
                callbacks=[make_callback(tally, results, by_id, {k: [t.trial_id for t in u] for k, u in units.items()},
                                         mirror, out)],
            ),
        )
        tally.started = time.monotonic()  # progress and ETA count from the first trial, not Ray's start-up
        tuner.fit()
    finally:
        if started_here:
            import ray

            ray.shutdown()
    print_summary(exp, plan, tally, mirror, out)
    return tally


def print_summary(exp: Experiment, plan: Plan, tally: Tally, mirror: Any, out: Callable[[str], None]) -> None:
    import polars as pl

    from bench import report

    elapsed = time.monotonic() - tally.started
    states = ", ".join(f"{n} {k}" for k, n in sorted(tally.statuses.items()))
    out("")
    out(f"{exp.name}: {tally.done} of {tally.total} trials finished in {fmt_seconds(elapsed)} ({states or 'none'}); "
        f"trial compute {fmt_seconds(tally.compute_s)}, {tally.compute_s / max(elapsed, 1e-9):.1f}x wall")
    out(f"warm-start cache: {tally.warm_misses} trained, {tally.warm_hits} reused, "
        f"saving {fmt_seconds(tally.warm_saved_s)} of compute")
    if tally.done < tally.total:
        out(f"{tally.total - tally.done} trials did not finish: run the same command again to run only those")
    if tally.rejected:
        first = next(iter(tally.rejected.values()))
        out(f"{len(tally.rejected)} trials stopped on an error that retrying cannot fix and wrote no row (the first: "
            f"{first}); fix it and run the same command again")
    failed_rows = tally.statuses.get("failed", 0)
    if failed_rows:
        logs = f"{plan.results}/logs" if "://" not in plan.results else "each trial's folder under results/ray"
        out(f"{failed_rows} failed trials keep a row with status failed and the error (logs: {logs}); "
            "the next `bench run` re-runs them")
    if mirror is not None:
        where = f"MLflow: {tally.mlflow_logged} runs logged to {mirror.uri} (experiment {exp.name})"
        if not mirror.ok:
            target = "" if mirror.embedded else f" --mlflow-uri {mirror.uri}"
            where += (f"; store FAILED ({mirror.failed}): run `bench sync-mlflow {plan.results}{target}` to "
                      "backfill")
        elif mirror.embedded:
            where += f"; view with `bench ui {plan.results}`"
        out(where)
    out(f"results: {plan.results}/trials (`bench results {plan.results}`)")
    try:
        table = report.load_trials(plan.results)
    except UserError:
        return
    ids = [t.trial_id for t in plan.trials]
    grid = table.filter(pl.col("trial_id").is_in(ids))
    if grid.is_empty() or not grid["usable"].any():
        return
    # The one selection rule (bench.report.select_settings, also behind `bench report` and `bench leaderboard`):
    # per cell, the hyper-parameters with the lowest mean noisy-validation loss over seeds.
    cells = report.aggregate(grid).filter(pl.col("acc_mean").is_not_null())
    wide = (cells.with_columns(pl.col("acc_mean").round(2))
            .pivot(on="method", index=["dataset", "noise", "r"], values="acc_mean").sort(["dataset", "noise", "r"]))
    out("clean test accuracy (%), mean over seeds; per cell the hyper-parameters with the lowest mean "
        "noisy-validation loss:")
    # Wide enough for a column per method: polars otherwise wraps every cell to the terminal it guesses.
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True,
                   tbl_width_chars=40 + 10 * wide.width):
        out(str(wide))


# -- commands ---------------------------------------------------------------------------------------------------
def default_results(exp: Experiment) -> str:
    return str(Path("results") / exp.name)


def cmd_run(args: argparse.Namespace) -> int:
    exp = load_experiment(args.config)
    results = args.results or default_results(exp)
    for flag, value in (("--max-concurrent", args.max_concurrent), ("--retries", args.retries)):
        if value is not None and value < (1 if flag == "--max-concurrent" else 0):
            raise UserError(f"{flag} must be {'>= 1' if flag == '--max-concurrent' else '>= 0'}, got {value}")
    if args.cpus_per_trial is not None and args.cpus_per_trial <= 0:
        raise UserError(f"--cpus-per-trial must be > 0, got {args.cpus_per_trial}")
    if args.gpus_per_trial is not None and args.gpus_per_trial < 0:
        raise UserError(f"--gpus-per-trial must be >= 0, got {args.gpus_per_trial}")
    if args.num_cpus is not None and args.num_cpus < 1:
        raise UserError(f"--num-cpus must be >= 1, got {args.num_cpus}")
    check_results(absolute_results(results))
    if args.dry_run:
        if exp.size() > GRID_LIMIT:
            print_size(exp)
            return 0
        device = None if args.gpus_per_trial is None else ("cuda" if args.gpus_per_trial > 0 else "cpu")
        print_plan(Plan.make(exp, absolute_results(results), device=device), pack=parse_pack(args.pack))
        if args.address is None:  # on a cluster the data lives on the nodes
            try:
                check_data([exp.dataset], args.data_root)
                print(f"data: {exp.dataset} present and intact under {args.data_root}")
            except UserError as e:
                print(f"data: {e} (`bench run` stops here)")
        return 0
    check_grid_size(exp.size(), args.yes)
    settings = Settings(
        results=results, data_root=args.data_root, address=args.address, max_concurrent=args.max_concurrent,
        mlflow_uri=args.mlflow_uri, mlflow=not args.no_mlflow, cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=args.gpus_per_trial, retries=2 if args.retries is None else args.retries,
        num_cpus=args.num_cpus, pack=parse_pack(args.pack),
    )
    tally = run_experiment(exp, settings, out=lambda line: print(line, flush=True))
    if tally.rejected:
        return EXIT_USAGE
    return 0 if tally.done == tally.total and not tally.statuses.get("failed") else 1


def cmd_results(args: argparse.Namespace) -> int:
    import polars as pl

    from bench.results import read_table

    table = read_table(args.results)
    if table.is_empty():
        raise UserError(f"no result rows under {args.results}/trials")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix == ".csv":
            table.select(pl.col(c) for c, t in table.schema.items() if t != pl.Null).write_csv(out)
        else:
            table.write_parquet(out)
        print(f"{table.height} rows -> {out}")
        return 0
    from bench.results import CORE_COLUMNS

    columns = [c for c in CORE_COLUMNS if c in table.columns and c not in ("git_commit", "torch_version", "device")]
    shown = table.select(columns).sort([c for c in ("experiment", "dataset", "noise", "r", "method", "seed")
                                        if c in columns])
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=250, tbl_hide_column_data_types=True,
                   float_precision=4):
        print(shown)
    return 0


def cmd_sync_mlflow(args: argparse.Namespace) -> int:
    from bench import tracking
    from bench.results import hold, read_table

    if read_table(args.results).is_empty():
        raise UserError(f"no result rows under {args.results}/trials")
    with hold(absolute_results(args.results)):  # not while a `bench run` logs into the same store
        mirror = tracking.open_mirror(absolute_results(args.results), args.mlflow_uri)
        if mirror is None:
            return 1
        count = mirror.sync(absolute_results(args.results))
    if not mirror.ok:
        return 1
    print(f"MLflow {mirror.uri}: logged {count} missing runs (the others were already there)")
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from bench import tracking

    uri = tracking.tracking_uri(absolute_results(args.results), args.mlflow_uri)
    if uri is None:
        raise UserError(f"{args.results} is not a local folder: name the MLflow store with --mlflow-uri")
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise UserError(f"no MLflow store at {uri}; run `bench run` (or `bench sync-mlflow {args.results}`) first")
    mlflow_bin = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or shutil.which("mlflow")
    command = [mlflow_bin or "mlflow", "server", "--host", "127.0.0.1", "--port", str(args.port), "--workers", "1",
               "--backend-store-uri", uri]
    address = f"http://127.0.0.1:{args.port}"
    print(f"MLflow UI for {uri} on {address} (Ctrl-C stops it)", flush=True)
    for line in tracking.runs_links(uri, address):
        print(f"  {line}", flush=True)
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


def add_commands(sub: argparse._SubParsersAction, add_data_root: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("run", help="run an experiment grid (tune_configs/*.yaml) with Ray Tune",
                       description="Run the trials of an experiment file that have no result row yet.")
    p.add_argument("config", help="experiment file, e.g. tune_configs/demo.yaml")
    p.add_argument("--results", default=None, help="results folder or pyarrow URI (default: results/<name>)")
    p.add_argument("--address", default=None, help="Ray cluster address (default: start Ray locally)")
    p.add_argument("--dry-run", action="store_true", help="print the grid, the trials and the work; run nothing")
    p.add_argument("--max-concurrent", type=int, default=None, help="at most N trials at once")
    p.add_argument("--mlflow-uri", default=None,
                   help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite inside the results folder)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow (parquet only)")
    p.add_argument("--cpus-per-trial", type=float, default=None, help="override resources.cpu")
    p.add_argument("--gpus-per-trial", type=float, default=None,
                   help="override resources.gpu (> 0 runs on cuda, 0 on the CPU); fractions share a GPU")
    p.add_argument("--retries", type=int, default=None, help="retries of a crashed trial (default 2)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    p.add_argument("--pack", default="auto",
                   help="train trials that share data, model and schedule as one stacked model on one device: "
                        "auto (on CUDA, up to 256 a pack; solo on a CPU), off, or N trials a pack")
    p.add_argument("--yes", action="store_true",
                   help=f"run a grid of more than {GRID_LIMIT:,} trials (without it such a grid is refused)")
    add_data_root(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("results", help="print the merged result table, or write it to one parquet file")
    p.add_argument("results", help="results folder")
    p.add_argument("--out", default=None, help="write all rows to this .parquet (or .csv) file")
    add_data_root(p)
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("sync-mlflow", help="log the result rows that MLflow lacks (idempotent)")
    p.add_argument("results", help="results folder")
    p.add_argument("--mlflow-uri", default=None, help="MLflow store (default as for `bench run`)")
    add_data_root(p)
    p.set_defaults(func=cmd_sync_mlflow)

    p = sub.add_parser("ui", help="serve the MLflow UI of a results folder on 127.0.0.1")
    p.add_argument("results", help="results folder")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--mlflow-uri", default=None, help="MLflow store (default as for `bench run`)")
    add_data_root(p)
    p.set_defaults(func=cmd_ui)

