"""`bench run CONFIG`: fan an experiment grid out with Ray Tune. This module only drives Ray.

    experiment file --validate/expand--> TrialConfigs --skip those with a result row--> Ray Tune grid search
    (basic variant generator, no scheduler, no early stopping, reuse_actors)
    --each trial--> bench.exec.trainer.run_trial (or a pack: bench.exec.pack.run_pack)
    (writes its own parquet row; CE warm start from the shared cache) --driver callbacks--> progress line; MLflow
    (and, while it trains, its stage and epoch events through Ray Tune's results --> the driver's live status)

Trial identity is `TrialConfig.trial_id`, a hash of the trial's effective configuration (schedules and method
defaults filled in): a relaunch runs only the trials without
a result row (rows with status "failed" run again), so a killed grid resumes and a grid can grow. Ray retries a
unit only for faults that a retry can cure (`--retries`): a worker that died (a lost node, an out-of-memory kill, a
preempted worker), a fault of Ray's own (`retry_cures`); the method stage checkpoints after every epoch, so a retried
trial (or one re-run after the driver was killed) resumes from its last finished epoch, and its warm start comes from
the cache. Any other error in a worker is deterministic and would fail every retry alike: the unit ends at once, each
of its trials with a row `failed` and the reason, its traceback in the unit's log.
Locally Ray starts in-process (`ray.init(address="local")`, never attaching to another Ray on the machine), its
services listening on 127.0.0.1 only; `--address` joins a cluster (`bench.grid.cluster.connect`: one line within
seconds where nothing listens, what listens is not Ray, or the token is refused; checked before anything is written).
Once connected, the driver counts the GPUs Ray has and splits the packs over them
(`plan_on_cluster`); `--dry-run --address` connects too (`gpus_to_plan`).

Before Ray starts, the driver checks every trial (`bench.grid.validate`), the data files and the results folder, and
takes the folder's lock (one driver per folder). A `UserError` that only a worker meets is reported to the driver once,
not raised, so that Ray does not retry what retrying cannot fix.

The plan and `--dry-run` are `bench.grid.plan`'s; the progress lines and the closing summary `bench.grid.progress`'s;
the MLflow mirror's callback `bench.grid.mlflow_callback`'s;
every file in the results folder goes through `bench.store.folder`; the command's arguments are defined in
`bench.cli.main`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.config import EXIT_USAGE, UserError
from bench.exec.memory import memory_budget
from bench.exec.pack import run_pack
from bench.exec.trainer import failed_row, run_trial
from bench.exec.warmstart import WarmStartCache
from bench.grid.cluster import check_resources, cluster_gpus, probe, start_ray
from bench.grid.experiment import Experiment
from bench.grid.files import Overrides, load_experiment
from bench.grid.mlflow_callback import make_mlflow_callback
from bench.grid.plan import (
    Plan,
    describe_gpus,
    describe_units,
    parse_pack,
    plan_units,
    print_plan,
    print_size,
    unit_id,
)
from bench.grid.progress import REPORT_EVERY, StatusBoard, Tally, UnitReporter, make_callback, print_summary
from bench.grid.validate import check_data, check_grid_size, check_results
from bench.schema import GRID_LIMIT
from bench.store import folder
from bench.store.mirror import open_mirror
from bench.store.rows import write_trial
from bench.trial import TrialConfig

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no status table from Ray Tune


# -- the trial, in a Ray worker ---------------------------------------------------------------------------------
def ray_unit(config: dict[str, Any], units: dict[str, list[TrialConfig]], data_root: str, results: str,
             threads: int, report_every: float = REPORT_EVERY) -> None:
    """Run one unit of the grid in a Ray worker: a solo trial, or a pack of trials trained as one stacked model
    (`bench.exec.pack.run_pack`); report its status and warm-start cache use."""
    import torch
    from ray import tune

    torch.set_num_threads(threads)
    unit = config["unit"]
    trials = units[unit]
    log_path = folder.Store(results).log_path(unit)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # Progress for the driver's live status, through Ray Tune's results (bench.grid.progress).
    progress = UnitReporter(lambda record: tune.report({"unit": unit, **record}), every=report_every)
    progress.start()
    with open(log_path, "a") as log_file:
        def log(line: str) -> None:
            log_file.write(line + "\n")
            log_file.flush()

        cache = WarmStartCache(results, log=log)
        checkpoints = folder.Checkpoints(results, unit, log)
        try:
            check_cuda(trials[0].device)
            if len(trials) > 1:
                rows = run_pack(trials, data_root, results=results, log=log, warm_cache=cache,
                                checkpoints=checkpoints, events=progress.event)
            else:
                rows = [run_trial(trials[0], data_root, results=results, log=log, warm_cache=cache,
                                  checkpoints=checkpoints, events=progress.event)]
        except UserError as e:
            # Bad input that only the worker could see (a data file damaged after the driver's check, a row that
            # could not be written): retrying cannot help, so report it once to the driver instead of raising.
            log(f"bench: error: {e}")
            tune.report({"unit": unit, "status": "rejected", "error": str(e), **cache.stats(), **progress.final()})
            return
        except Exception as e:
            if retry_cures(e):
                raise  # Ray retries the unit (--retries), from its last epoch checkpoint
            # A deterministic error (a bug, a value the checks missed): it would fail the same way on every retry,
            # so the unit ends here, its trials' rows `failed` with the reason, the traceback in its log.
            error = one_line(e)
            log_file.write(traceback.format_exc())
            log(f"bench: trial failed: {error}")
            write_failed_rows(trials, results, error, log)
            tune.report({"unit": unit, "status": "failed", "error": error, **cache.stats(), **progress.final()})
            return
        checkpoints.clear()
    tune.report({"unit": unit, "status": ",".join(sorted({r["status"] for r in rows})), **cache.stats(),
                 **progress.final()})


def retry_cures(error: BaseException) -> bool:
    """Whether retrying a unit may cure `error`: a fault of Ray's own (a lost node, actor or object), a GPU whose
    memory other work took, a connection that dropped. A worker killed outright (a lost node, an out-of-memory
    kill, a preempted worker) raises nothing here: Ray sees it die and retries it (`--retries`)."""
    import ray.exceptions
    import torch

    return isinstance(error, (ray.exceptions.RayError, torch.OutOfMemoryError, ConnectionError))


def one_line(error: BaseException, limit: int = 400) -> str:
    """An exception as one line: its type and message, whitespace collapsed, at most `limit` characters."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def write_failed_rows(trials: list[TrialConfig], results: str, error: str, log: Callable[[str], None]) -> None:
    """A row with status failed and `error` for each trial of a unit that stopped on a deterministic error,
    unless it already has that row (a solo trial writes its own when training fails, `run_trial`). A row that
    cannot be written is logged: the driver hears of the error all the same, and the trial runs again next time."""
    store = folder.Store(results)
    for t in trials:
        try:
            row, _ = store.read_row(t.trial_id)
            if row is None or row.get("status") != "failed" or row.get("error") != error:
                write_trial(results, failed_row(t, error), [])
        except Exception as e:  # noqa: BLE001 - nothing here may turn the error into one that Ray retries
            log(f"bench: the failed row of trial {t.trial_id} could not be written ({one_line(e)})")


def check_cuda(device: str) -> None:
    """A CUDA trial where torch sees no CUDA device: `bench run`'s fix (`bench trial`'s is its --device flag)."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"the trials ask for device {device} but torch sees no CUDA device here; run them on the "
                        "CPU with --gpus-per-trial 0 (or device: cpu and resources.gpu: 0 in the experiment file)")


# -- the driver -------------------------------------------------------------------------------------------------
def gpus_to_plan(address: str | None) -> int:
    """For `--dry-run`, the GPUs a grid would run on. With `address` the cluster's: the dry run connects as
    `bench run` does (failing with its error) and leaves. Else this machine's, as the local Ray of `bench run`
    counts them (torch counts them without creating a CUDA context)."""
    if address is None:
        import torch

        return torch.cuda.device_count()
    import ray

    started = start_ray(address, None)
    try:
        return cluster_gpus()
    finally:
        if started:
            ray.shutdown()


def plan_on_cluster(pending: list[TrialConfig], s: Settings, gpu: float,
                    out: Callable[[str], None]) -> dict[str, list[TrialConfig]]:
    """The pending trials' units by unit id, split over the connected cluster's GPUs where trials ask for one;
    the plan's lines printed."""
    gpus = cluster_gpus() if gpu > 0 else None
    units = plan_units(pending, s.pack, s.data_root, gpus)
    if line := describe_units(units, s.pack, s.data_root):
        out(line)
    if gpus is not None:
        out(describe_gpus(units, gpus))
    return {unit_id(u): u for u in units}


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
    live: bool = False  # a live status table (a terminal); else a status line every `status_every` seconds
    status_every: float = 30.0
    report_every: float = REPORT_EVERY  # seconds between a unit's progress reports to the driver


def run_experiment(exp: Experiment, s: Settings, out: Callable[[str], None] = print) -> Tally:
    """Run the pending trials of an experiment; return the tally. Raises UserError on an impossible request, and
    when another driver holds the results folder."""
    results = folder.absolute(s.results)
    check_results(results)
    with folder.Store(results).hold():
        return _run_experiment(exp, s, out)


def _tuner(exp: Experiment, s: Settings, units: dict[str, list[TrialConfig]], results: str, cpu: float,
           gpu: float, callbacks: list[Any]) -> Any:
    """Ray Tune's grid over the units: one Ray trial per unit (a trial or a pack), reusing actors, no scheduler."""
    from ray import tune

    trainable = tune.with_parameters(
        ray_unit, units=units,
        data_root=str(Path(s.data_root).expanduser().resolve()), results=results,
        threads=max(1, int(cpu)), report_every=s.report_every,
    )
    # A pack takes its members' GPU shares together, at most one whole GPU (it runs on one device).
    trainable = tune.with_resources(
        trainable, lambda spec: {"cpu": cpu, "gpu": min(1.0, gpu * len(units[spec["unit"]])) if gpu else 0})
    return tune.Tuner(
        trainable,
        param_space={"unit": tune.grid_search(list(units))},
        tune_config=tune.TuneConfig(
            reuse_actors=True, max_concurrent_trials=s.max_concurrent or exp.max_concurrent
        ),
        run_config=tune.RunConfig(
            name=f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}", storage_path=folder.Store(results).ray_storage(),
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=s.retries),
            callbacks=callbacks,
        ),
    )


def trial_device(exp: Experiment, gpus_per_trial: float | None) -> tuple[float, str | None]:
    """The GPU share of each trial, and the device `--gpus-per-trial` imposes on the grid (None: the file's)."""
    gpu = gpus_per_trial if gpus_per_trial is not None else exp.resources.gpu
    return gpu, None if gpus_per_trial is None else ("cuda" if gpu > 0 else "cpu")


def _run_experiment(exp: Experiment, s: Settings, out: Callable[[str], None]) -> Tally:

    cpu = s.cpus_per_trial if s.cpus_per_trial is not None else exp.resources.cpu
    gpu, device = trial_device(exp, s.gpus_per_trial)
    if device == "cpu" and exp.device.startswith("cuda"):
        out("note: --gpus-per-trial 0 runs this grid on the CPU")
    results = folder.absolute(s.results)
    for moved, problem in folder.Store(results).set_aside_damaged():
        out(f"set aside the result file {moved} ({problem}): its trial runs again")
    plan = Plan.make(exp, results, device=device)
    if note := plan.unmatched_note():
        out(note)
    pending = plan.pending
    by_id = {t.trial_id: t for t in plan.trials}

    mirror = open_mirror(results, s.mlflow_uri) if s.mlflow else None
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
    if exp.text:  # a grid changed on the command line: the folder keeps it as a file `bench run` can take
        where = folder.Store(results)
        where.write_bytes(where.path(f"{exp.name}.yaml"), exp.text.encode())
    w = plan.work(pending)
    tally.work_total = w["method_epochs"] + w["warm_epochs"]
    out(f"{exp.name}: running {len(pending)} of {len(plan.trials)} trials ({len(plan.done)} already done); "
        f"{w['method_epochs']} method-stage epochs + {w['warm_epochs']} warm-start epochs "
        f"({w['warm_starts']} warm starts); per-epoch logs in {folder.Store(results).logs_hint()}")

    started_here = start_ray(s.address, s.num_cpus)
    board = StatusBoard(out, live=s.live, every=s.status_every)
    try:
        check_resources(cpu, gpu)
        if s.address is None:  # the trials run here (on a cluster each worker checks its own)
            check_cuda(pending[0].device)
        units = plan_on_cluster(pending, s, gpu, out)
        members = {k: [t.trial_id for t in u] for k, u in units.items()}
        callbacks = [make_callback(tally, results, by_id, members, board)]
        if mirror is not None:
            callbacks.append(make_mlflow_callback(tally, results, members, mirror))
        tuner = _tuner(exp, s, units, results, cpu, gpu, callbacks)
        tally.started = time.monotonic()  # progress and ETA count from the first trial, not Ray's start-up
        tuner.fit()
    finally:
        board.close()
        if started_here:
            import ray

            ray.shutdown()
    print_summary(exp, plan, tally, mirror, out)
    return tally


# -- commands ---------------------------------------------------------------------------------------------------
def default_results(exp: Experiment) -> str:
    return str(Path("results") / exp.name)


class Lines:
    """`bench run`'s lines on stdout. Where the reader leaves (`bench run GRID | head -1`), the grid goes on with its
    lines discarded and its rows written, and one warning on stderr says so (it used to stop at the next line and
    exit 0 without a row)."""

    def __init__(self) -> None:
        self.reader_left = False

    def __call__(self, line: str) -> None:
        if self.reader_left:
            return
        try:
            print(line, flush=True)
        except BrokenPipeError:
            self.reader_left = True
            try:  # everything still bound for stdout (Python's buffer, Ray's, the live status) goes nowhere
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError, io.UnsupportedOperation):
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stdout from here on
            with contextlib.suppress(OSError):
                print("bench: warning: the reader of this command's output left; the grid goes on without printing, "
                      "writing every row (see them with `bench results`)", file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    overrides = Overrides(tuple(args.sets), args.methods, args.seeds)
    exp = load_experiment(args.config, overrides=overrides)
    results = args.results or default_results(exp)
    out = Lines()
    if exp.overrides:
        out(f"{' '.join(exp.overrides)} changed the grid of {exp.base_name}: it runs as experiment {exp.name}"
              f"{'' if overrides.names() else ' (--set name=NAME names it)'}, results in {results}, which keeps it "
              f"as {exp.name}.yaml")
    for flag, value in (("--max-concurrent", args.max_concurrent), ("--retries", args.retries)):
        if value is not None and value < (1 if flag == "--max-concurrent" else 0):
            raise UserError(f"{flag} must be {'>= 1' if flag == '--max-concurrent' else '>= 0'}, got {value}")
    if args.cpus_per_trial is not None and not (math.isfinite(args.cpus_per_trial) and args.cpus_per_trial > 0):
        raise UserError(f"--cpus-per-trial must be a finite number > 0, got {args.cpus_per_trial}")
    if args.gpus_per_trial is not None and not (math.isfinite(args.gpus_per_trial) and args.gpus_per_trial >= 0):
        raise UserError(f"--gpus-per-trial must be a finite number >= 0, got {args.gpus_per_trial}")
    if args.num_cpus is not None and args.num_cpus < 1:
        raise UserError(f"--num-cpus must be >= 1, got {args.num_cpus}")
    memory_budget()  # a bad $BENCH_PACK_MEMORY_GB is one line here, before Ray, not an error in every pack
    check_results(folder.absolute(results))
    if args.address:  # before anything is written: a wrong address is one line in seconds
        probe(args.address)
    if args.dry_run:
        gpus = gpus_to_plan(args.address)
        if exp.size() > GRID_LIMIT:
            print_size(exp)
            return 0
        gpu, device = trial_device(exp, args.gpus_per_trial)
        print_plan(Plan.make(exp, folder.absolute(results), device=device), pack=parse_pack(args.pack),
                   data_root=args.data_root, gpus=gpus if gpu > 0 else None)
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
        live=sys.stdout.isatty() and os.environ.get("TERM") != "dumb",
    )
    tally = run_experiment(exp, settings, out=out)
    if tally.rejected:
        return EXIT_USAGE
    return 0 if tally.done == tally.total and not tally.statuses.get("failed") else 1
