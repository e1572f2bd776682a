"""What the driver of `bench run` prints while and after a grid runs: one line per finished trial (n/N, its
accuracy, elapsed time and ETA) from a Ray Tune callback that also mirrors each new result row to MLflow, and the
closing summary with the grid's accuracy table.

The summary's table applies the protocol of `bench report` (`bench.report.analysis`: per cell, the hyper-parameters with
the lowest mean noisy-validation loss over seeds), so the two never disagree.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.config import TrialConfig, UserError
from bench.grid.experiment import Experiment
from bench.grid.plan import Plan, describe_trial
from bench.report import analysis
from bench.store.folder import Store


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

    store = Store(results)

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
            row, epochs = store.read_row(trial_id)
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
            note = f"  see {store.log_path(unit)}" if status == "failed" and store.local else ""
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


def print_summary(exp: Experiment, plan: Plan, tally: Tally, mirror: Any, out: Callable[[str], None]) -> None:
    import polars as pl

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
        out(f"{failed_rows} failed trials keep a row with status failed and the error (logs: "
            f"{Store(plan.results).logs_hint()}); the next `bench run` re-runs them")
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
        table = analysis.load_trials(plan.results)
    except UserError:
        return
    ids = [t.trial_id for t in plan.trials]
    grid = table.filter(pl.col("trial_id").is_in(ids))
    if grid.is_empty() or not grid["usable"].any():
        return
    # The one selection rule (bench.report.analysis.select_settings, behind `bench report` and `bench leaderboard`).
    cells = analysis.aggregate(grid).filter(pl.col("acc_mean").is_not_null())
    wide = (cells.with_columns(pl.col("acc_mean").round(2))
            .pivot(on="method", index=["dataset", "noise", "r"], values="acc_mean").sort(["dataset", "noise", "r"]))
    out("clean test accuracy (%), mean over seeds; per cell the hyper-parameters with the lowest mean "
        "noisy-validation loss:")
    # Wide enough for a column per method: polars otherwise wraps every cell to the terminal it guesses.
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True,
                   tbl_width_chars=40 + 10 * wide.width):
        out(str(wide))
