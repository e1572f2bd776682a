"""What the driver prints: the live status of the units in flight, a line per finished trial, the summary.

What the driver of `bench run` prints while and after a grid runs: a live status of the units in flight, one
line per finished trial (n/N, its accuracy, elapsed time and ETA) from a Ray Tune callback, and the closing summary
with the grid's accuracy table. Mirroring the rows to MLflow is another callback's (`bench.grid.mlflow_callback`):
one sink per callback: the lines need no MLflow, and the mirror prints nothing.

Live status: each unit (a solo trial or a pack) reports its stage, epoch and latest noisy-validation figures to the
driver through Ray Tune's own results (`tune.report`, at most every `REPORT_EVERY` seconds), taken from the events
the training core emits (`bench.exec.events`, read by `UnitReporter`), not from its log. The driver shows them
(`StatusBoard`): on a terminal a compact table under the finished lines, redrawn every `REDRAW_EVERY` seconds;
elsewhere (a pipe, a file, `ray job submit`'s log) one status line every `Settings.status_every` seconds. The ETA
counts work in trial-epochs (`bench.grid.plan.Plan.work`: method-stage epochs, and warm-start epochs once per cached
cell), so the units in flight count with the epochs they have done; from the first finished trial, or before it
from the plan's estimate (`bench.grid.estimate`, marked "(estimate)"), so that it is not "--" while the first units
warm up.

The summary's table applies the protocol of `bench report` (`bench.report.analysis`: per cell, the hyper-parameters
with the lowest mean noisy-validation loss over seeds) and its rounding (`bench.report.analysis.fmt`), so the two never
disagree.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

from bench.config import UserError
from bench.exec.events import EpochRecord, Event, Resumed, StageStart
from bench.exec.executor import Unit
from bench.grid.cluster import node_lost
from bench.grid.experiment import Experiment
from bench.grid.plan import Plan
from bench.grid.stop import signal_name
from bench.store.folder import Store
from bench.store.rows import ray_node_id

if TYPE_CHECKING:
    import polars as pl

REPORT_EVERY = 2.0  # seconds between a unit's progress reports (each is a round trip to the driver)
REDRAW_EVERY = 1.0  # seconds between redraws of the live table on a terminal
FIRST_STATUS_AFTER = 10.0  # seconds before the first status line (off a terminal)
ETA_AFTER = 0.02  # the share of the work done before the pace gives an ETA (the first epochs carry start-up costs)


def fmt_seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# -- in the worker: a unit's progress, from the training core's events ---------------------------------------------
class UnitReporter:
    """Turns a unit's training events (`bench.exec.events`) into progress records for the driver: stage, epoch,
    epochs, the latest noisy-validation loss (a solo stage's, with its accuracy; a pack's lowest) and `work`, the
    trial-epochs done so far: an epoch counts once per member of its stage (a pack's method stage: its trials; a
    packed warm start: the cells it trains), as `bench.grid.plan.Plan.work` counts them."""

    def __init__(self, report: Callable[[dict[str, Any]], None], every: float = REPORT_EVERY) -> None:
        self.report, self.every = report, every
        self.members = 1  # trained side by side in the current stage
        self.state: dict[str, Any] = dict(progress=1, stage="loading data", epoch=None, epochs=None, val_loss=None,
                                          val_acc=None, work=0, node=ray_node_id())  # where it runs: a lost node
        self.last = -float("inf")
        # The unit's warm-start cache use so far (`WarmStartCache.stats`), on every record: a unit a signal stops
        # sends no closing report, and its warm starts, trained or reused, still count in the stop's summary.
        self.stats: Callable[[], dict[str, Any]] = dict

    def start(self) -> None:
        self._send(force=True)

    def event(self, event: Event) -> None:
        s = self.state
        if isinstance(event, StageStart):
            self.members = event.members
            s.update(stage=event.stage, epoch=0, epochs=event.epochs, val_loss=None, val_acc=None)
            self._send(force=True)
        elif isinstance(event, Resumed):
            s["work"] += event.epoch * self.members
            s.update(epoch=event.epoch)
            self._send(force=True)
        elif isinstance(event, EpochRecord):
            s["work"] += self.members if event.epoch > 0 else 0
            solo = event.members == 1
            s.update(epoch=event.epoch, val_loss=event.val_loss[0] if solo else event.lowest_val_loss(),
                     val_acc=event.val_acc[0] if solo else None)
            self._send()

    def final(self) -> dict[str, Any]:
        """What the unit's closing report carries: its work done."""
        return {"work": self.state["work"]}

    def _send(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.every:
            self.last = now
            self.report({**self.state, **self.stats()})


# -- in the driver: the tally, the live status, the finished lines ---------------------------------------------------
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
    mlflow_backfilled: int = 0  # runs logged when the grid ended, after the store had failed during it
    rejected: dict[str, str] = field(default_factory=dict)  # trial_id -> the error a worker's check raised
    rowless: int = 0  # finished trials (failed) that wrote no result row
    work_total: int = 0  # trial-epochs the pending trials imply (Plan.work)
    work_finished: int = 0  # trial-epochs of the finished units
    running: dict[str, dict[str, Any]] = field(default_factory=dict)  # unit -> its latest progress record
    working_since: float | None = None  # when the first unit reported (Ray's start-up is not the grid's pace)
    estimate_s: float | None = None  # the plan's estimated wall time (`bench.grid.estimate`): the ETA until a pace
    seen: set[str] = field(default_factory=set)  # trials whose end the callbacks saw
    interrupted: int | None = None  # the signal that stopped the grid (bench.grid.stop)
    halt: str | None = None  # why the grid ends early without a signal: a full disk
    warned: set[str] = field(default_factory=set)  # the kinds of worker warnings printed (once each)
    ray_left: bool = False  # Ray did not stop in time after the signal: the command exits without waiting on it
    head_lost: str | None = None  # the line that says the cluster's head was lost (`bench.grid.cluster.HeadWatch`)
    # Trials whose unit Ray retried (`--retries`), by why: "node" (the node it ran on was lost) or "worker" (its
    # worker died, or a fault of Ray's own); a trial retried for both counts under "node".
    retried: dict[str, str] = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def count_unfinished(self) -> None:
        """Add the warm starts of the units that never finished (a signal stopped them) by their latest progress
        record: the callbacks count a unit's when it finishes (`RunProgress._finish`)."""
        for record in self.running.values():
            self.warm_hits += int(record.get("warm_hits", 0))
            self.warm_misses += int(record.get("warm_misses", 0))
            self.warm_saved_s += float(record.get("warm_saved_s", 0.0))
        self.running.clear()

    def progress(self, unit: str, record: dict[str, Any]) -> None:
        self.running[unit] = record
        if self.working_since is None:
            self.working_since = time.monotonic()

    def work_done(self) -> int:
        """Trial-epochs done: the finished units', and the in-flight units' by their latest progress record."""
        return self.work_finished + sum(p.get("work", 0) for p in self.running.values())

    def eta(self) -> float | None:
        """Seconds left: the work not done at the pace of the work done since the first unit started, in-flight
        units counted with the epochs they have trained; from the first finished trial on, where less than
        `ETA_AFTER` of the work is done (or the grid trains no epochs), the pace of the finished trials; before
        either, the plan's estimate less the time elapsed (`estimate_s`; None where there is none, or once the
        time elapsed has passed it)."""
        if self.done >= self.total:
            return 0.0
        done = self.work_done()
        if self.work_total > 0 and done >= max(1.0, ETA_AFTER * self.work_total):
            working = time.monotonic() - (self.working_since or self.started)
            return max(self.work_total - done, 0) / done * working
        if self.done:
            return self.elapsed() / self.done * (self.total - self.done)
        if self.estimate_s is not None and self.estimate_s > self.elapsed():
            return self.estimate_s - self.elapsed()
        return None

    def paced(self) -> bool:
        """Whether the ETA comes from the grid's own pace (`eta`), not from the plan's estimate."""
        return bool(self.done) or (self.work_total > 0 and self.work_done() >= max(1.0, ETA_AFTER * self.work_total))


def _eta_text(tally: Tally) -> str:
    eta = tally.eta()
    if eta is None:
        return "--"
    return fmt_seconds(eta) + ("" if tally.paced() else " (estimate)")


def describe_progress(p: dict[str, Any] | None) -> str:
    """A unit's latest progress in words: 'warmup 3/5  val loss 0.4123 (acc 88.1%)' (a solo trial), 'method 2/8
    best val loss 0.2000' (a pack: its members' lowest), 'method 0', 'loading data', 'starting' (none yet)."""
    if not p:
        return "starting"
    stage = p["stage"]
    if p.get("epoch") is not None:
        stage += f" {p['epoch']}/{p['epochs']}" if p.get("epochs") else f" {p['epoch']}"
    if p.get("val_loss") is not None:
        best = "" if p.get("val_acc") is not None else "best "
        stage += f"  {best}val loss {p['val_loss']:.4f}"
        if p.get("val_acc") is not None:
            stage += f" (acc {p['val_acc']:.1f}%)"
    return stage


class StatusBoard:
    """The driver's output: permanent lines (`line`) and the live status (`tick`). `live`: a table redrawn in
    place under the permanent lines (a terminal); else one status line through `out` every `every` seconds."""

    def __init__(self, out: Callable[[str], None], live: bool = False, every: float = 30.0,
                 stream: TextIO | None = None) -> None:
        self.out, self.live, self.every = out, live, every
        self._stream = stream  # None: sys.stdout when written to (Ray Tune pickles its callbacks, not a terminal)
        self.shown = 0  # lines of the live table on screen
        self.last = time.monotonic() - max(every - FIRST_STATUS_AFTER, 0.0)  # the first status comes early

    def line(self, text: str) -> None:
        if not self.live:
            self.out(text)
            return
        self._erase()
        self.stream.write(text + "\n")
        self.stream.flush()
        self.last = 0.0  # redraw the table at the next tick

    def tick(self, tally: Tally, units: dict[str, Unit], trials: list[Any]) -> None:
        now = time.monotonic()
        if now - self.last < (REDRAW_EVERY if self.live else self.every):
            return
        self.last = now
        states = {t.config["unit"]: t.status for t in trials}
        running = [u for u, state in states.items() if state == "RUNNING"]
        in_flight = sum(len(units[u]) for u in running)
        head = (f"{tally.done}/{tally.total} trials done, {in_flight} running, "
                f"{max(tally.total - tally.done - in_flight, 0)} waiting; elapsed {fmt_seconds(tally.elapsed())}, "
                f"ETA {_eta_text(tally)}")
        rows = [(units[u].describe(), describe_progress(tally.running.get(u))) for u in running]
        if self.live:
            width = max(20, shutil.get_terminal_size().columns - 1)
            left = max((len(a) for a, _ in rows), default=0)
            shown = rows[:12]
            text = [head] + [f"  {a:<{left}}  {b}" for a, b in shown]
            if len(rows) > len(shown):
                text.append(f"  ... and {len(rows) - len(shown)} more")
            self._erase()
            self.stream.write("".join(t[:width] + "\n" for t in text))
            self.stream.flush()
            self.shown = len(text)
        else:
            listed = "; ".join(f"{a}: {b}" for a, b in rows[:4]) + (f"; +{len(rows) - 4} more" if len(rows) > 4 else "")
            self.out(f"status: {head}" + (f" | {listed}" if listed else ""))

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout

    def close(self) -> None:
        if self.live:
            self._erase()

    def _erase(self) -> None:
        if self.shown:
            self.stream.write(f"\x1b[{self.shown}F\x1b[J")  # to the first line of the table, clear to the end
            self.shown = 0


class RunProgress:
    """The live status from each unit's progress reports; one line per finished trial (n/N, ETA), also for each
    member of a finished pack, and one line for a unit that stopped on an error retrying cannot fix. Ray Tune calls
    it as a `tune.Callback` (`make_callback`)."""

    def __init__(self, tally: Tally, results: str, units: dict[str, Unit], board: StatusBoard) -> None:
        self.tally, self.board, self.store = tally, board, Store(results)
        self.configs = units
        self.units = {unit: [t.trial_id for t in u.trials] for unit, u in units.items()}
        self.trials = {t.trial_id: t for u in units.values() for t in u.trials}
        self.since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # rows' finished_at from here on are this run's

    def _finish(self, trial: Any, errored: bool) -> None:
        unit = trial.config["unit"]
        result = trial.last_result or {}
        self.tally.warm_hits += int(result.get("warm_hits", 0))
        self.tally.warm_misses += int(result.get("warm_misses", 0))
        self.tally.warm_saved_s += float(result.get("warm_saved_s", 0.0))
        seen = self.tally.running.pop(unit, {})
        self.tally.work_finished += int(result.get("work", seen.get("work", 0)))
        for kind, warning in (result.get("warnings") or {}).items():
            if kind not in self.tally.warned:  # one warning a kind for the grid: a full disk fails every unit alike
                self.tally.warned.add(kind)
                print(f"bench: warning: {warning}", file=sys.stderr, flush=True)
        if result.get("status") == "rejected" and not errored:
            if result.get("halt") and self.tally.halt is None:
                self.tally.halt = result.get("error", "")
            self._reject(unit, result.get("error", ""), result)
            return
        for trial_id in self.units[unit]:
            self._finish_trial(trial_id, result, errored, len(self.units[unit]), unit)

    def _reject(self, unit: str, error: str, result: dict[str, Any]) -> None:
        """A worker's check refused the unit: one line for the members without a row (a pack's share the error);
        a member that wrote its row before (the streams executor's) is finished with it."""
        members = [t for t in self.units[unit] if not self._written_now(t)]
        for trial_id in self.units[unit]:
            if trial_id not in members:
                self._finish_trial(trial_id, result, False, len(self.units[unit]), unit)
        if not members:
            return
        self.tally.done += len(members)
        self.tally.seen.update(members)
        self.tally.statuses["rejected"] += len(members)
        for trial_id in members:
            self.tally.rejected[trial_id] = error
        width = len(str(self.tally.total))
        which = (self.configs[unit].describe() if len(members) == len(self.units[unit])
                 else "; ".join(self.trials[t].describe() for t in members))
        self.board.line(f"[{self.tally.done:>{width}}/{self.tally.total}] rejected {which}\n"
                        f"      bench: error: {error}")

    def _written_now(self, trial_id: str) -> bool:
        """Whether the trial has a row written during this run (not a `failed` row of an earlier one)."""
        row, _ = self.store.read_row(trial_id, curves=False)
        return row is not None and (row.get("finished_at") or "") >= self.since

    def _finish_trial(self, trial_id: str, result: dict[str, Any], errored: bool, size: int, unit: str) -> None:
        self.tally.done += 1
        self.tally.seen.add(trial_id)
        row, _ = self.store.read_row(trial_id, curves=False)
        status = "failed" if errored or row is None else row["status"]
        self.tally.rowless += row is None
        self.tally.statuses[status] += 1
        if row is not None:
            self.tally.compute_s += float(row["wall_s"] or 0.0)
        acc = f"test {row['test_acc']:6.2f}%" if row is not None and row["test_acc"] is not None else "-"
        warm = " (warm start reused)" if result.get("warm_hits") and size == 1 else ""
        warm += f" ({words})" if (words := self.configs[unit].member_words()) else ""
        wall = f"{row['wall_s']:.0f}s" if row is not None and size == 1 else ""
        width = len(str(self.tally.total))
        note = f"  see {self.store.log_path(unit)}" if status == "failed" and self.store.local else ""
        # A trial that stopped on an error: its reason, one line (its row's, or the one its worker reported).
        error = ((row or {}).get("error") or result.get("error") or "") if status == "failed" else ""
        self.board.line(f"[{self.tally.done:>{width}}/{self.tally.total}] {status:8s} "
                        f"{self.trials[trial_id].describe()}  {acc} {wall}{warm}  "
                        f"elapsed {fmt_seconds(self.tally.elapsed())}  ETA {_eta_text(self.tally)}{note}"
                        + (f"\n      error: {error}" if error else ""))

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if result.get("progress"):
            self.tally.progress(trial.config["unit"], result)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self.board.tick(self.tally, self.configs, trials)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finish(trial, errored=False)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finish(trial, errored=True)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        unit = trial.config["unit"]
        self.tally.running.pop(unit, None)
        node = (trial.last_result or {}).get("node")  # the node of the attempt that died, from its reports
        cause = "node" if node_lost(node or None) else "worker"
        for trial_id in self.units[unit]:
            if self.tally.retried.get(trial_id) != "node":
                self.tally.retried[trial_id] = cause
        why = "its node was lost" if cause == "node" else "its worker died"
        self.board.line(f"      {unit} crashed ({why}); Ray retries it from its last epoch checkpoint")


def make_callback(tally: Tally, results: str, units: dict[str, Unit], board: StatusBoard) -> Any:
    from ray import tune  # Ray is the run's, not the module's: the summary and the status board work without it

    class Progress(RunProgress, tune.Callback):
        pass

    return Progress(tally, results, units, board)


def summary_modules() -> tuple[ModuleType, ModuleType]:
    """polars and bench.report.analysis, the summary's alone. Imported here, not at the top: a Ray worker imports this
    module for its reporter (`UnitReporter`), and polars and bench.report (SciPy) would cost it seconds of start-up for
    nothing. The driver writes the summary in a thread while Ray stops (`bench.grid.runner.summary_lines`): beside
    the units' start, the import took CPU from theirs."""
    import polars as pl

    from bench.report import analysis  # as polars above

    return pl, analysis


def print_summary(exp: Experiment, plan: Plan, tally: Tally, mirror: Any, out: Callable[[str], None]) -> None:
    elapsed = tally.elapsed()
    states = ", ".join(f"{n} {k}" for k, n in sorted(tally.statuses.items()))
    out("")
    out(f"{exp.name}: {tally.done} of {tally.total} trials finished in {fmt_seconds(elapsed)} ({states or 'none'}); "
        f"trial compute {fmt_seconds(tally.compute_s)}, {tally.compute_s / max(elapsed, 1e-9):.1f}x wall")
    out(f"warm-start cache: {tally.warm_misses} trained, {tally.warm_hits} reused, "
        f"saving {fmt_seconds(tally.warm_saved_s)} of compute")
    if tally.retried:
        causes = Counter(tally.retried.values())
        node, worker = causes["node"], causes["worker"]
        out(f"Ray retried {len(tally.retried)} trials from their last epoch checkpoint (--retries): "
            f"{node} trial{'s' * (node != 1)} retried because {'its' if node == 1 else 'their'} node was lost, "
            f"{worker} because {'its' if worker == 1 else 'their'} worker died")
    if tally.interrupted is not None and tally.done >= tally.total:  # the last rows landed while it stopped
        out(f"stopped by {signal_name(tally.interrupted)}: all {tally.total} trials have their row; nothing is left "
            "to run")
    elif tally.interrupted is not None:
        out(f"stopped by {signal_name(tally.interrupted)}: {tally.done} of {tally.total} trials have their row, "
            f"{tally.total - tally.done} did not finish (cut at their last epoch checkpoint, or not started): run "
            "the same command again to finish them from there")
    elif tally.halt is not None:
        landed = tally.done - len(tally.rejected)
        out(f"stopped: the results folder's disk is full: {landed} of {tally.total} trials have their row, "
            f"{tally.total - landed} did not finish: free space there and run the same command again to finish them")
    elif tally.done < tally.total:
        out(f"{tally.total - tally.done} trials did not finish: run the same command again to run only those")
    if tally.rejected and tally.halt is None:
        first = next(iter(tally.rejected.values()))
        out(f"{len(tally.rejected)} trials stopped on an error that retrying cannot fix and wrote no row (the first: "
            f"{first}); fix it and run the same command again")
    # Only what was written: a failed trial keeps a row unless it died before writing one.
    failed_rows = tally.statuses.get("failed", 0) - tally.rowless
    if failed_rows:
        out(f"{failed_rows} failed trials keep a row with status failed and the error (logs: "
            f"{Store(plan.results).logs_hint()}); the next `bench run` re-runs them")
    if tally.rowless:
        out(f"{tally.rowless} trials ended without writing a row (logs: {Store(plan.results).logs_hint()}); "
            "the next `bench run` runs them again")
    if mirror is not None:
        where = f"MLflow: {tally.mlflow_logged} runs logged to {mirror.uri} (experiment {exp.name})"
        if tally.mlflow_backfilled:
            where += f", {tally.mlflow_backfilled} more when the grid ended, once the store answered again"
        if not mirror.ok:
            target = "" if mirror.embedded else f" --mlflow-uri {mirror.uri}"
            where += (f"; store FAILED ({mirror.failed}): run `bench sync-mlflow {plan.results}{target}` to "
                      "backfill")
        elif mirror.embedded:
            where += f"; view with `bench ui {plan.results}`"
        out(where)
    out(f"results: {plan.results}/trials (`bench results {plan.results}`)")
    pl, analysis = summary_modules()
    try:
        table = analysis.load_trials(plan.results)
    except UserError:
        return
    ids = [t.trial_id for t in plan.trials]
    grid = table.filter(pl.col("trial_id").is_in(ids))
    if grid.is_empty() or not grid["usable"].any():
        return
    specs = sorted(grid["protocol"].unique().to_list())
    for spec in specs:  # each protocol selects its own settings (`bench.protocol`)
        _accuracy_table(analysis, grid.filter(pl.col("protocol") == spec), out,
                        f" under protocol {spec}" if len(specs) > 1 else "")


def _accuracy_table(analysis: ModuleType, grid: pl.DataFrame, out: Callable[[str], None], which: str) -> None:
    """Mean clean test accuracy per cell and method, by the one selection rule (bench.report.analysis.select_settings,
    behind `bench report` and `bench leaderboard`) and the one rounding (bench.report.analysis.fmt); `analysis` is
    that module, which the summary imports late (`print_summary`)."""
    import polars as pl

    cells = analysis.aggregate(grid).filter(pl.col("acc_mean").is_not_null())
    if cells.is_empty():
        return
    wide = (cells.with_columns(pl.col("acc_mean").map_elements(analysis.fmt, return_dtype=pl.String),
                               pl.col("method").map_elements(analysis.label, return_dtype=pl.String))  # as tables say
            .pivot(on="method", index=["dataset", "noise", "r"], values="acc_mean").sort(["dataset", "noise", "r"]))
    out(f"clean test accuracy (%){which}, mean over seeds; per cell the hyper-parameters with the lowest mean "
        "noisy-validation loss:")
    # Wide enough for a column per method: polars otherwise wraps every cell to the terminal it guesses.
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True,
                   tbl_width_chars=40 + 10 * wide.width):
        out(str(wide))
