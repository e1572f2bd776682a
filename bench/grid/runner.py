"""`bench run CONFIG`: fan an experiment grid out with Ray Tune. This module only drives Ray.

    experiment file --validate/expand--> TrialConfigs --skip those with a result row--> Ray Tune grid search
    (basic variant generator, no scheduler, no early stopping, reuse_actors)
    --each unit--> its kind's executor (bench.exec.executor: a solo trial, a pack, ...)
    (writes its own parquet rows; CE warm starts from the shared cache) --driver callbacks--> progress line; MLflow
    (and, while it trains, its stage and epoch events through Ray Tune's results --> the driver's live status)

Trial identity is `TrialConfig.trial_id`, a hash of the trial's effective configuration (schedules and method defaults
filled in): a relaunch runs only the trials without a result row (rows with status "failed" run again), so a killed grid
resumes and a grid can grow. Ray retries a unit only for faults that a retry can cure (`--retries`): a worker that died
(a lost node, an out-of-memory kill, a preempted worker), a fault of Ray's own (`bench.exec.executor.retry_may_cure`,
every executor's rule too); the method stage checkpoints after every epoch, so a retried trial (or one re-run after the
driver was killed) resumes from its last finished epoch, and its warm start comes from the cache. Any other error in a
worker is deterministic and would fail every retry alike: the unit ends at once, each of its trials with a row `failed`
and the reason, its traceback in the unit's log. Locally Ray starts in-process (`ray.init(address="local")`, never
attaching to another Ray on the machine), its services listening on 127.0.0.1 only; `--address` joins a cluster
(`bench.grid.cluster.connect`: one line within seconds where nothing listens, what listens is not Ray, or the token is
refused; checked before anything is written). Once connected, the driver counts the GPUs Ray has and splits the packs
over them (`plan_on_cluster`); `--dry-run --address` connects too (`gpus_to_plan`).

Before Ray starts, the driver checks every trial (`bench.trial.TrialConfig.check`), the data files and the results
folder (`bench.grid.validate`), and takes the folder's lock (one driver per folder). A `UserError` that only a worker
meets is reported to the driver once, not raised, so that Ray does not retry what retrying cannot fix.

The plan is `bench.grid.plan`'s, in words `bench.grid.describe`'s; the progress lines and the closing summary
`bench.grid.progress`'s; the MLflow mirror's callback `bench.grid.mlflow_callback`'s; Ray's connection and checks
`bench.grid.cluster`'s;
every file in the results folder goes through `bench.store.folder`; the command's arguments are defined in
`bench.cli.main`.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import numerics
from bench.config import FolderFull, UserError, disk_full
from bench.exec.executor import Bundle, Unit, UnitContext, get_executor, retry_may_cure
from bench.exec.trainer import failed_row
from bench.exec.warmstart import WarmStartCache
from bench.grid.cluster import (
    HeadWatch,
    check_resources,
    cluster_gpu_kind,
    cluster_gpus,
    retry_units_lost_in_reset,
    start_ray,
)
from bench.grid.describe import draw_units
from bench.grid.estimate import time_estimate
from bench.grid.experiment import Experiment
from bench.grid.mlflow_callback import MirrorOutcome, MirrorProcess, make_mlflow_callback
from bench.grid.plan import Plan
from bench.grid.progress import (
    REPORT_EVERY,
    StatusBoard,
    Tally,
    UnitReporter,
    make_callback,
    print_summary,
)
from bench.grid.stop import GridStop, end_processes
from bench.grid.validate import check_data, check_results
from bench.store import folder, grids
from bench.store.mirror_writer import opened
from bench.store.rows import write_trial
from bench.trial import TrialConfig

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no status table from Ray Tune
# Ray Tune's own per-trial result files (JSON, CSV, TensorBoard: a write per report, about 5% of the driver's CPU):
# a trial's record is its parquet row. TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=0 in the environment brings them back.
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")


# -- the trial, in a Ray worker ---------------------------------------------------------------------------------
def ray_unit(config: dict[str, Any], units: dict[str, Unit], data_root: str, results: str,
             report_every: float = REPORT_EVERY) -> None:
    """Run one unit of the grid in a Ray worker with its kind's executor (`bench.exec.executor`: a solo trial, a
    pack of trials trained as one stacked model, ...); report its status and warm-start cache use. Each trial sets
    its own float order (threads, numerics) as it starts (`bench.exec.prepare.prepare`), as under `bench trial`."""
    from ray import tune

    unit = config["unit"]
    trials = list(units[unit].trials)
    log = UnitLog(folder.Store(results).log_path(unit))
    # Progress for the driver's live status, through Ray Tune's results (bench.grid.progress).
    progress = UnitReporter(lambda record: tune.report({"unit": unit, **record}), every=report_every)
    progress.start()
    with log:
        cache = WarmStartCache(results, log=log)
        progress.stats = cache.stats
        checkpoints = folder.Checkpoints(results, unit, log)

        def closing(**report: Any) -> dict[str, Any]:
            """The unit's last report: its outcome, cache use, work done, and the warnings of its optional writes."""
            warnings = {k: w for k, w in (("log", log.warning), ("warm-start cache", cache.warning),
                                          ("checkpoint", checkpoints.warning)) if w}
            return {"unit": unit, **report, **cache.stats(), **progress.final(), "warnings": warnings}

        try:
            check_cuda(trials[0].device)
            rows = get_executor(units[unit].kind).run(trials, UnitContext(
                data_root, results, log=log, warm_cache=cache, checkpoints=checkpoints, events=progress.event))
        except UserError as e:
            # Bad input that only the worker could see (a data file damaged after the driver's check, a row that
            # could not be written): retrying cannot help, so report it once to the driver instead of raising.
            # A full disk ends the grid (`halt`): every unit would meet it.
            log(f"bench: error: {e}")
            tune.report(closing(status="rejected", error=str(e), halt=isinstance(e, FolderFull)))
            return
        except Exception as e:
            if retry_may_cure(e):
                raise  # Ray retries the unit (--retries), from its last epoch checkpoint
            # A deterministic error (a bug, a value the checks missed): it would fail the same way on every retry,
            # so the unit ends here, its trials' rows `failed` with the reason, the traceback in its log.
            error = one_line(e)
            log(traceback.format_exc().rstrip())
            log(f"bench: trial failed: {error}")
            write_failed_rows(trials, results, error, log)
            tune.report(closing(status="failed", error=error))
            return
        checkpoints.clear()
        tune.report(closing(status=",".join(sorted({r["status"] for r in rows}))))


class UnitLog:
    """A unit's log file (`logs/<unit>.log`), called with each line. The log is optional: where it cannot be
    written (a full disk, a link in its place), the unit goes on without it, and `warning` says why (the driver
    prints it once)."""

    def __init__(self, path: Path) -> None:
        self.path, self.file, self.warning = path, None, None

    def __enter__(self) -> UnitLog:
        try:
            self.file = folder.open_append(self.path)  # never through a link planted in its place
        except OSError as e:
            self._off(e)
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def __call__(self, line: str) -> None:
        if self.file is None:
            return
        try:
            self.file.write(line + "\n")
            self.file.flush()
        except OSError as e:
            self._off(e)

    def _off(self, error: OSError) -> None:
        self.warning = (f"could not write the log {self.path} ({type(error).__name__}: {error.strerror or error}); "
                        "the trials go on without their per-epoch logs")
        self._close()

    def _close(self) -> None:
        file, self.file = self.file, None
        if file is not None:
            try:
                file.close()
            except OSError:  # its last lines are lost with the log
                pass


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
            row, _ = store.read_row(t.trial_id, curves=False)
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
def plan_on_cluster(pending: list[TrialConfig], s: Settings, gpu: float,
                    out: Callable[[str], None]) -> dict[str, Unit]:
    """The pending trials' units by unit id, split over the connected cluster's GPUs where trials ask for one;
    the plan's lines printed; refused at once where no node can hold a unit (`check_resources`)."""
    gpus, kind = (cluster_gpus(), cluster_gpu_kind()) if gpu > 0 else (None, None)
    units, lines = draw_units(pending, s.pack, s.data_root, gpus, gpu, kind)
    for line in lines:
        out(line)
    return {u.id: u for u in units}


def cpu_slots(exp: Experiment, num_cpus: int | None, cpus_per_trial: float | None,
              max_concurrent: int | None) -> int:
    """The trials a local Ray runs at once on CPUs: its CPUs (--num-cpus, else all) over each trial's share, at most
    --max-concurrent (or the file's max_concurrent)."""
    cpus = num_cpus or os.cpu_count() or 1
    share = cpus_per_trial if cpus_per_trial is not None else exp.resources.cpu
    limit = max_concurrent or exp.max_concurrent or cpus
    return max(1, min(limit, int(cpus // share)))


def estimate_time(exp: Experiment, s: Settings, plan: Plan, gpu: float, tally: Tally,
                  out: Callable[[str], None]) -> None:
    """The dry run's time lines (`bench.grid.estimate`), printed before the grid trains, and their wall time as the
    ETA until the grid's own pace gives one (`Tally.eta`); after Ray started, which counts the GPUs."""
    local_cpus = s.address is None and gpu == 0
    at_once = cpu_slots(exp, s.num_cpus, s.cpus_per_trial, s.max_concurrent) if local_cpus else None
    gpus, kind = (cluster_gpus(), cluster_gpu_kind()) if gpu > 0 else (None, None)
    estimate = time_estimate(plan, at_once, gpus, kind)
    for line in estimate.lines:
        out(line)
    tally.estimate_s = estimate.wall_s


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
    pack: str | int = "auto"  # an --executor spec (`bench.grid.plan.unit_spec`): auto, solo, NAME or NAME:K
    live: bool = False  # a live status table (a terminal); else a status line every `status_every` seconds
    status_every: float = 30.0
    report_every: float = REPORT_EVERY  # seconds between a unit's progress reports to the driver


def run_experiment(exp: Experiment, s: Settings, out: Callable[[str], None] = print) -> Tally:
    """Run the pending trials of an experiment; return the tally. Raises UserError on an impossible request, and
    when another driver holds the results folder."""
    results = folder.absolute(s.results)
    check_results(results)
    plan = None  # made once a run: here where the trials run locally, else once connected (`_run_experiment`)
    if s.address is None:  # before the folder's lock and the MLflow store: a run refused here writes nothing
        plan = Plan.make(exp, results, device=trial_device(exp, s.gpus_per_trial)[1])
        check_data({t.dataset for t in plan.pending}, s.data_root, plan.pending)
    with GridStop() as stop, folder.Store(results).hold(), warnings.catch_warnings():
        # Ray Tune leaves the logs of units a signal stopped to the garbage collector: not the user's concern.
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            return _run_experiment(exp, s, out, stop, plan)
        except Exception as e:
            if disk_full(e):  # a write of the driver's own (Ray Tune's state, the grid's file): one line
                raise FolderFull(f"the disk of the results folder {results} is full ({' '.join(str(e).split())[:200]});"
                                 " free space there and run the same command again") from None
            raise


def describe_size(unit: Unit, gpu: float) -> str:
    """Who asks for a unit's resources, in its executor's words: 'each trial', 'a pack of 8 trials (each 0.5
    GPU)'."""
    if not (words := unit.member_words()):
        return "each trial"
    return f"a {words} trials" + (f" (each {gpu:g} GPU)" if gpu else "")


def unit_bundles(unit: Unit, cpu: float, gpu: float) -> list[Bundle]:
    """What a unit asks of Ray: its executor's bundles for its trials' CPU and GPU shares."""
    return get_executor(unit.kind).resources(list(unit.trials), cpu, gpu)


def unit_resources(units: dict[str, Unit], cpu: float, gpu: float) -> Any:
    """Ray Tune's resources for the units: one placement group where every unit asks the same (the usual grid), else
    a function of the unit's id. It travels pickled with the trainable, which Ray Tune reads back from Ray's store
    several times a trial (`Trial.get_trainable_cls`): a function holding the units themselves made each read cost
    the whole grid (a driver's CPU per trial grew with the grid, 5x plain Ray Tune's at 1,024 trials), so it holds
    only the distinct bundles and each unit's index among them."""
    from ray import tune

    distinct: list[list[Bundle]] = []
    which: dict[str, int] = {}
    for unit_id, unit in units.items():
        bundles = unit_bundles(unit, cpu, gpu)
        if bundles not in distinct:
            distinct.append(bundles)
        which[unit_id] = distinct.index(bundles)
    if len(distinct) <= 1:
        return tune.PlacementGroupFactory(distinct[0] if distinct else [{"CPU": cpu}])
    return lambda spec: tune.PlacementGroupFactory(distinct[which[spec["unit"]]])


# Ray Tune gives every trial actor these variables as its runtime environment (`DEFAULT_ENV_VARS` in
# `ray.tune.execution.class_cache`, for PyTorch Lightning; Ray 2.x): `plain_trial_workers` sets them in the driver.
TUNE_ACTOR_ENV = {"PL_DISABLE_FORK": "1"}


def plain_trial_workers() -> None:
    """Let a local grid's units run in the workers Ray starts idle with it (one per CPU), called before Ray starts.
    An actor with a runtime environment cannot use those workers: each unit's actor was a fresh process started
    through Ray's `setup_worker.py` (two interpreters' start-up), while the idle ones had started for nothing (seconds
    before the first unit trains on the 2-core machine, benchmarks/README.md). Locally every Ray process inherits the
    driver's environment, so Ray Tune's variables (`TUNE_ACTOR_ENV`) are set here, without importing Ray Tune (a
    second, on the grid's path: it is imported while Ray starts, `importing_ray_tune`), and `inherited_tune_env`
    takes them out of Ray Tune's table before its first actor."""
    for name, value in TUNE_ACTOR_ENV.items():
        os.environ.setdefault(name, value)


def inherited_tune_env() -> None:
    """Take out of Ray Tune's actor environment each variable every local Ray process already has with its value
    (`plain_trial_workers`). It stays so for the process (a later grid of it on a cluster gives its actors no
    PL_DISABLE_FORK: bench uses no PyTorch Lightning). A variable of another Ray's table, or one this environment
    sets otherwise, stays in it: its actors get fresh workers, as before."""
    try:
        from ray.tune.execution.class_cache import DEFAULT_ENV_VARS
    except ImportError:
        return
    for name in [n for n, value in DEFAULT_ENV_VARS.items() if os.environ.get(n) == value]:
        del DEFAULT_ENV_VARS[name]


def no_callback_census() -> None:
    """Skip Ray Tune's count of the grid's callbacks by class (`ray.air._internal.usage.tag_callbacks`, for its usage
    telemetry) where Ray's usage stats are off (bench's default, RAY_USAGE_STATS_ENABLED=0: the count goes nowhere).
    To know its built-in callbacks the count imports their modules, MLflow's integration among them and so MLflow
    itself: about a second of the driver's CPU, in a driver that otherwise never imports MLflow (its writer is a
    process of its own). Plain Ray Tune without callbacks skips the count too."""
    try:
        from ray._common.usage.usage_lib import usage_stats_enabled
        from ray.air._internal import usage
    except ImportError:  # another Ray's layout: the count runs
        return
    if not usage_stats_enabled():
        usage.tag_callbacks = lambda callbacks: False


def importing_ray_tune() -> Future[Any]:
    """Ray Tune's import (pandas among it: about a second, more under load) in a thread, while `ray.init` waits for
    Ray's processes in the main thread."""
    import importlib

    return in_background(importlib.import_module, "ray.tune")


def _tuner(exp: Experiment, s: Settings, units: dict[str, Unit], results: str, cpu: float,
           gpu: float, callbacks: list[Any], stop: GridStop, tally: Tally) -> Any:
    """Ray Tune's grid over the units: one Ray trial per unit, with the resources its executor asks, reusing
    actors, no scheduler; it ends early on a signal (`stop`) or a full disk (`tally.halt`)."""
    from ray import tune

    retry_units_lost_in_reset()
    trainable = tune.with_parameters(
        ray_unit, units=units,
        data_root=str(Path(s.data_root).expanduser().resolve()), results=results, report_every=s.report_every,
    )
    trainable = tune.with_resources(trainable, unit_resources(units, cpu, gpu))
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
            stop=stop.stopper(lambda: tally.halt is not None),
        ),
    )


def count_landed(tally: Tally, results: str, trials: list[Any]) -> set[str]:
    """Count the rows on disk that the callbacks did not see: a grid stopped by a signal ends its units while
    some still write their rows. A `failed` row counts as failed; a trial without a row is not finished. Also the
    warm starts of the units stopped on the way (`Tally.count_unfinished`). Returns the trials of those rows."""
    store = folder.Store(results)
    landed = set()
    for t in trials:
        if t.trial_id in tally.seen:
            continue
        row, _ = store.read_row(t.trial_id, curves=False)
        if row is not None:
            landed.add(t.trial_id)
            tally.seen.add(t.trial_id)
            tally.done += 1
            tally.statuses[row["status"]] += 1
            tally.compute_s += float(row["wall_s"] or 0.0)
    tally.count_unfinished()
    return landed


def trial_device(exp: Experiment, gpus_per_trial: float | None) -> tuple[float, str | None]:
    """The GPU share of each trial, and the device `--gpus-per-trial` imposes on the grid (None: the file's)."""
    gpu = gpus_per_trial if gpus_per_trial is not None else exp.resources.gpu
    return gpu, None if gpus_per_trial is None else ("cuda" if gpu > 0 else "cpu")


def in_background(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """`fn(*args)` in a thread of its own; its result (or its exception) from the future."""
    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)  # the thread ends with its one task


def planned(exp: Experiment, results: str, device: str | None, plan: Plan | None, out: Callable[[str], None]) -> Plan:
    """The run's plan once the folder's damaged files are set aside: the one made before the folder's lock (`plan`),
    its rows read again where files were set aside, else made here (a run on a cluster)."""
    set_aside = folder.Store(results).set_aside_damaged()
    for moved, problem in set_aside:
        out(f"set aside the result file {moved} ({problem}): its trial runs again")
    if plan is None:
        plan = Plan.make(exp, results, device=device)
    elif set_aside:  # the trials of those files are pending again: the rows read anew, the grid not planned again
        plan = plan.reread()
    if note := plan.unmatched_note():
        out(note)
    return plan


def after_grid(tally: Tally, stop: GridStop, results: str, pending: list[TrialConfig], writer: MirrorProcess | None,
               out: Callable[[str], None]) -> MirrorOutcome | None:
    """How the grid ended, in the tally; the rows that landed while it stopped (a signal, a full disk, a lost head)
    counted and handed to MLflow's writer: Ray Tune never reported the end of the units that wrote them, so their runs
    were not logged either; the mirror once the writer is done (`closed_mirror`)."""
    tally.interrupted, tally.ray_left = stop.signum, stop.abandoned
    if stop.signum is not None or tally.halt is not None or tally.head_lost is not None:  # unseen rows
        landed = count_landed(tally, results, pending)
        if writer is not None:  # in MLflow before the driver exits, not at the next run's backfill
            writer.put(sorted(landed))
    return closed_mirror(writer, out)


MIRROR_WAIT = 120.0  # seconds the driver waits, after the grid, for MLflow's writer to log the rows it was given


def closed_mirror(writer: MirrorProcess | None, out: Callable[[str], None]) -> MirrorOutcome | None:
    """The mirror once its writer has logged every row it was given (waiting at most `MIRROR_WAIT`: a store that
    hangs must not hold the driver; those rows are in parquet, for `bench sync-mlflow`)."""
    if writer is None:
        return None
    if not writer.close(MIRROR_WAIT):
        out(f"MLflow: still logging after {MIRROR_WAIT:g} s; the rows it has not logged are in parquet, and "
            "`bench sync-mlflow` backfills them")
    return writer.mirror


def announce(exp: Experiment, plan: Plan, tally: Tally, results: str, out: Callable[[str], None]) -> None:
    """The grid's opening line (what runs, what is done, its work in epochs), once a grid changed on the command line
    is kept in the folder as a file `bench run` can take."""
    if exp.overrides:
        where = folder.Store(results)
        where.write_bytes(where.path(f"{exp.name}.yaml"), exp.text.encode())
    pending = plan.pending
    w = plan.work(pending)
    tally.work_total = w["method_epochs"] + w["warm_epochs"]
    out(f"{exp.name}: running {len(pending)} of {len(plan.trials)} trials ({len(plan.done)} already done); "
        f"{w['method_epochs']} method-stage epochs + {w['warm_epochs']} warm-start epochs "
        f"({w['warm_starts']} warm starts); per-epoch logs in {folder.Store(results).logs_hint()}")


def _run_experiment(exp: Experiment, s: Settings, out: Callable[[str], None], stop: GridStop,
                    plan: Plan | None) -> Tally:
    cpu = s.cpus_per_trial if s.cpus_per_trial is not None else exp.resources.cpu
    gpu, device = trial_device(exp, s.gpus_per_trial)
    if device == "cpu" and exp.device.startswith("cuda"):
        out("note: --gpus-per-trial 0 runs this grid on the CPU")
    results = folder.absolute(s.results)
    plan = planned(exp, results, device, plan, out)
    pending = plan.pending

    tally = Tally(total=len(pending))
    if not pending:
        record_grid(exp, plan)
        if s.mlflow:  # the finished trials MLflow lacks: no grid to keep it off
            opened(results, s.mlflow_uri, plan.done, warn=lambda text: print(f"bench: warning: {text}",
                                                                              file=sys.stderr, flush=True), say=out)
        out(f"{exp.name}: all {len(plan.trials)} trials already have a result row in {results}; nothing to run")
        return tally
    announce(exp, plan, tally, results, out)
    # From here on a signal is noted and the run stops at its next `stop.check()` (bench.grid.stop says why).
    stop.beside_threads()

    if s.address is None:
        plain_trial_workers()  # before Ray starts: its processes inherit the environment
    # The grid's float-order pins (`bench.numerics`), before Ray starts its workers: a local Ray's inherit this
    # environment, a cluster's get them as the job's runtime environment.
    pinned = numerics.pins(exp.numerics, exp.device)
    unpinned = numerics.set_pins(exp.numerics, exp.device) if s.address is None else {}
    tune_imported = importing_ray_tune()
    # MLflow's writer, a process of its own, started now: its import and the store's opening (seconds) go on while
    # Ray and the first units start; Ray Tune's loop only hands it trial ids (`MirrorProcess`).
    writer = MirrorProcess(tally, results, s.mlflow_uri, plan.done, [t.trial_id for t in pending], out) \
        if s.mlflow else None
    started_here = ray_started(stop, s, pinned, writer)
    board = StatusBoard(out, live=s.live, every=s.status_every)
    try:
        units = plan_on_cluster(pending, s, gpu, out)
        estimate_time(exp, s, plan, gpu, tally, out)
        check_resources({describe_size(u, gpu): unit_bundles(u, cpu, gpu) for u in units.values()})
        if s.address is None:  # the trials run here (on a cluster each worker checks its own)
            check_cuda(pending[0].device)
        callbacks = [make_callback(tally, results, units, board)]
        if writer is not None:
            members = {k: [t.trial_id for t in u.trials] for k, u in units.items()}
            callbacks.append(make_mlflow_callback(writer, members))
        tune_imported.result()
        no_callback_census()
        if s.address is None:
            inherited_tune_env()
        tuner = _tuner(exp, s, units, results, cpu, gpu, callbacks, stop, tally)
        stop.check()  # a signal since Ray started: the grid stops before it starts
        record_grid(exp, plan)  # once every check passed: a grid refused writes nothing
        tally.started = time.monotonic()  # progress and ETA count from the first trial, not Ray's start-up
        with HeadWatch(s.address) as head:
            stop.run(tuner.fit, lost=lambda: head.lost is not None)
        if head.lost:  # Ray Tune is left waiting on the dead head: the driver ends with what landed (bench.cli.run)
            print(head.lost, file=sys.stderr, flush=True)
        tally.head_lost = head.lost
        mirror, writer = after_grid(tally, stop, results, pending, writer, out), None
        # The summary (polars and bench.report imported, the rows read) is written while Ray stops: its processes'
        # ends are mostly waiting, where the summary's imports beside the units took CPU from their start.
        summary = in_background(summary_lines, exp, plan, tally, mirror)
    finally:
        if writer is not None:  # the grid failed: the writer ends with what it has logged
            writer.close(0)
        board.close()
        if started_here and not stop.abandoned:
            stop.end_ray()  # its agents too
            stop.hold()  # Ray's shutdown leaves SIGTERM to its default action
        elif started_here:  # Ray did not stop in time: its processes end here, and the driver exits (bench.cli.run)
            end_processes(stop.ray_processes())
        numerics.restore(unpinned)
    for line in summary.result():
        out(line)
    if tally.interrupted is None and stop.signum is not None:  # noted after the grid had ended: its stop all the same
        tally.interrupted = stop.signum
    return tally


def ray_started(stop: GridStop, s: Settings, pinned: dict[str, str], writer: MirrorProcess | None) -> bool:
    """Start Ray (or connect to it) through `GridStop.start`, which then takes the signals back; whether this driver
    started it. A stop on the way ends MLflow's writer too: it was owed nothing yet."""
    try:
        return stop.start(lambda: start_ray(s.address, s.num_cpus, env=pinned))
    except BaseException:
        if writer is not None:
            writer.close(0)
        raise


def record_grid(exp: Experiment, plan: Plan) -> None:
    """Keep the grid in its results folder (`bench.store.grids`): the readers compare the rows with it, so that a grid
    stopped part-way reads as incomplete, not as a smaller complete grid."""
    grids.record(plan.results, exp.name, exp.text, plan.trials)


def summary_lines(exp: Experiment, plan: Plan, tally: Tally, mirror: MirrorOutcome | None) -> list[str]:
    lines: list[str] = []
    print_summary(exp, plan, tally, mirror, lines.append)
    return lines
