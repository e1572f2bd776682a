"""How long the pending trials of a plan will take, before they run: the `--dry-run`'s time lines and the ETA that
`bench run` shows before its own pace is known (`bench.grid.progress.Tally.estimate_s`).

Two sources, per pending trial, the first that knows it:

- **earlier rows** of the results folder: the median seconds an epoch of the method stage in the rows of the trial's
  dataset, model, method, device kind and training subset, times its epochs; per warm-start cell, the median over
  earlier cells of the seconds an epoch of the warm start (the row that trained it: a cell's longest), times its
  epochs. Rows hold everything a trial's epoch costs on this machine (evaluation, data handling), so they come first.
  A row's seconds are one trial's: trials side by side (`at_once`) divide them.
- **the executor table's images/s** (`bench.grid.executor_table`: the row `bench calibrate` wrote for the trial's
  model on its kind of device, or a benchmark's): an epoch is its training images at that rate plus its evaluated
  images (validation, test, the diagnostics' sample) at three times it, a forward pass being about a third of a
  training step's work (forward, then backward at about twice the forward's). The rate is the whole device's
  (calibration trains with all of a CPU's threads, or a GPU to itself), which trials side by side share, so its
  seconds are wall time on one device; GPUs (`devices`) divide them. Start-up and data loading are not counted.

Each cached warm start counts once (the cache trains it once for the trials of its cell).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from bench.data import get_dataset
from bench.exec.diagnostics import TRAIN_SAMPLE
from bench.grid import executor_table
from bench.grid.plan import Plan, warm_cell
from bench.store.folder import Store
from bench.trial import TrialConfig

EVAL_COST = 1 / 3  # an evaluated image's work, in training images' (a forward pass of forward + backward's three)


@dataclass
class Part:
    """The trials one source counted and their seconds (a row's: one trial's compute; the table's: device time)."""

    trials: int = 0
    seconds: float = 0.0
    sources: dict[Any, None] = field(default_factory=dict)  # the table rows used, in order


@dataclass
class Estimate:
    """The `--dry-run`'s time lines (`lines`) and, where every pending trial was counted and the wall time is known,
    that wall time in seconds (`wall_s`): the ETA `bench run` shows until its own pace is known."""

    lines: list[str]
    wall_s: float | None


def epoch_images(t: TrialConfig) -> tuple[int, int]:
    """(training images, evaluated images) of an epoch of `t`, from its dataset's split sizes and training subset
    ((0, 0) where the dataset declares no sizes)."""
    dataset = get_dataset(t.dataset)
    train, val, test = dataset.split_sizes
    if t.train_subset:
        train = min(train, t.train_subset)
    return train, val + (test + min(TRAIN_SAMPLE, train) if dataset.epoch_eval else 0)


# The columns of earlier rows `rates_from_rows` reads.
ESTIMATE_COLUMNS = ("status", "method_s", "epochs", "warmup_s", "epochs_warmup", "dataset", "model", "device",
                    "train_subset", "method", "noise", "r", "seed")


def rates_from_rows(results: str) -> tuple[int, dict[tuple[Any, ...], list[float]], dict[tuple[Any, ...], list[float]]]:
    """(rows read, method-stage seconds an epoch by (dataset, model, device kind, subset, method), warm-start seconds
    an epoch by (dataset, model, device kind, subset)) of the folder's finished rows."""
    rows = [r for r in Store(results).read_table(columns=ESTIMATE_COLUMNS).iter_rows(named=True)
            if r.get("status") in ("ok", "diverged") and r.get("method_s") is not None and r.get("epochs")]
    method: dict[tuple[Any, ...], list[float]] = {}
    cells: dict[tuple[Any, ...], float] = {}
    for r in rows:
        where = (r["dataset"], r["model"], device_kind(r["device"]), r["train_subset"])
        method.setdefault((*where, r["method"]), []).append(r["method_s"] / r["epochs"])
        if r.get("warmup_s") is not None and r.get("epochs_warmup"):
            cell = (*where, r["noise"], r["r"], r["seed"], r["epochs_warmup"])
            cells[cell] = max(cells.get(cell, 0.0), r["warmup_s"] / r["epochs_warmup"])
    warm: dict[tuple[Any, ...], list[float]] = {}
    for cell, rate in cells.items():
        warm.setdefault(cell[:4], []).append(rate)
    return len(rows), method, warm


def time_estimate(plan: Plan, at_once: int | None, devices: int | None = None,
                  gpu_kind: str | None = None) -> Estimate:
    """The estimate of the plan's pending trials. `at_once`: the trials that run together on a CPU (None: not known,
    as on GPUs or a cluster); `devices`: the GPUs they share (None or 0: one device); `gpu_kind`: their kind, for the
    executor table's rows."""
    pending = plan.pending
    if not pending:
        return Estimate([], 0.0)
    n_rows, method, warm = rates_from_rows(plan.results)
    table = executor_table.read_table()
    rows, rated, started = Part(), Part(), set()
    unknown: dict[tuple[str, str], int] = {}  # (model, device kind) -> trials not counted
    for t in pending:
        where = (t.dataset, t.network(), device_kind(t.device), t.train_subset)
        warmup, stage = t.schedules()
        cached = warm_cell(t) in started  # the cache trains each warm start once
        if (*where, t.method) in method and where in warm:
            rows.trials += 1
            rows.seconds += statistics.median(method[(*where, t.method)]) * stage.epochs
            rows.seconds += 0 if cached else statistics.median(warm[where]) * warmup.epochs
        elif (row := rated_row(t, gpu_kind, table)) is not None and (images := epoch_images(t))[0]:
            epoch = (images[0] + EVAL_COST * images[1]) / float(row.images_per_s)
            rated.trials += 1
            rated.seconds += epoch * (stage.epochs + (0 if cached else warmup.epochs))
            rated.sources[row] = None
        else:
            what = (t.network(), device_kind(t.device))
            unknown[what] = unknown.get(what, 0) + 1
            continue
        started.add(warm_cell(t))
    return Estimate(*_lines(rows, rated, unknown, n_rows, at_once, devices))


def rated_row(t: TrialConfig, gpu_kind: str | None,
              table: tuple[executor_table.Choice, ...]) -> executor_table.Choice | None:
    """The executor table's row for `t`'s model on its device, where it holds a measured rate: the model's own (a
    row for any model cites one model's rate: the shipped GPU row, Fashion-MNIST's CNN's)."""
    row = executor_table.choose(t.network(), t.device, gpu_kind, table)
    return row if row is not None and row.model == t.network() and row.images_per_s else None


def _lines(rows: Part, rated: Part, unknown: dict[tuple[str, str], int], n_rows: int, at_once: int | None,
           devices: int | None) -> tuple[list[str], float | None]:
    lines, walls = [], []
    if rows.trials:
        wall = rows.seconds / at_once if at_once else None
        walls.append(wall)
        at = f"; about {minutes(wall)} of wall time at {at_once} trials at once" if wall is not None else ""
        lines.append(f"time: about {minutes(rows.seconds)} of trial compute for {rows.trials} trials{at} "
                     f"(estimated from {n_rows} earlier rows in the results folder: seconds an epoch of the same "
                     "dataset, model, method and device, median; fewer where warm starts are cached)")
    if rated.trials:
        wall = rated.seconds / (devices or 1)
        walls.append(wall)
        on = f"on {devices} GPUs" if devices and devices > 1 else "on one device"
        which = "; ".join(f"{r.model} on {r.device}: {float(r.images_per_s):,.0f} images/s, measured {r.measured} "
                          f"by {r.source.split(':')[0]}" for r in rated.sources)  # the source up to its figures
        where = executor_table.table_path()
        lines.append(f"time: about {minutes(wall)} of wall time {on} for {rated.trials} trials (estimated from "
                     f"the executor table {where.name if where == executor_table.DEFAULT else where}, {which}: "
                     "training images at that rate, evaluated ones at three times it; start-up and data loading "
                     "not counted)")
    if unknown:
        models = ", ".join(f"{model} on {kind}" for model, kind in unknown)
        why = (f"no earlier row like them in the results folder, no images/s for {models} in the executor table "
               f"(`bench calibrate --device {next(iter(unknown))[1]} --models "
               f"{','.join(dict.fromkeys(model for model, _ in unknown))} --out FILE` measures it; "
               "BENCH_EXECUTOR_TABLE=FILE plans by it)")
        counted = rows.trials + rated.trials
        lines.append(f"time: {sum(unknown.values())} trials not counted ({why})" if counted
                     else f"time: no estimate ({why})")
    if unknown or None in walls:
        return lines, None
    if len(walls) > 1:
        lines.append(f"time: about {minutes(sum(walls))} of wall time in all")
    return lines, sum(walls)


def minutes(seconds: float) -> str:
    """`seconds` in minutes, to a tenth below ten (a short grid's estimate is not 0 or 2 min)."""
    return f"{seconds / 60:.1f} min" if seconds < 600 else f"{seconds / 60:.0f} min"


def device_kind(device: str) -> str:
    """A row's device ("cuda:0 (NVIDIA H100 ...)", "cpu (x86_64)") or a trial's ("cuda:1") as its kind: cuda, cpu."""
    return str(device).split(" ")[0].split(":")[0]
