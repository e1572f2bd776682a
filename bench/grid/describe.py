"""The plan in words: the lines `bench run` prints before it trains (`draw_units`: the units and why, the GPUs'
loads) and the `--dry-run` listing (`print_plan`), both from one drawing of the units (`bench.grid.plan`)."""

from __future__ import annotations

import heapq
import os
import statistics
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bench.config import Schedule
from bench.data import get_dataset
from bench.exec.executor import Unit, get_executor
from bench.grid import executor_table
from bench.grid.plan import Plan, plan_units, unit_epochs, unit_kind, unit_spec, warm_cell
from bench.schema import GRID_LIMIT
from bench.store.folder import Store
from bench.trial import TrialConfig

if TYPE_CHECKING:  # the listing takes an Experiment; it need not import the experiment files' YAML reader
    from bench.grid.experiment import Experiment


def table_lines(pending: list[TrialConfig], gpu_kind: str | None) -> list[str]:
    """The executor table's rows that chose the executors of `pending` under `--executor auto`, one line each; not the
    generic row that keeps any model's trials solo on a CPU (the dry run says why they run solo), but a model's own
    CPU row (`bench calibrate --device cpu` measured it)."""
    table = executor_table.read_table()
    chosen = dict.fromkeys(executor_table.choose(t.network(), t.device, gpu_kind, table) for t in pending)
    where = executor_table.table_path()
    return [f"executor table ({where.name if where == executor_table.DEFAULT else where}): {c.describe()}"
            for c in chosen if c is not None
            and (c.model, c.executor, c.device) != (executor_table.ANY_MODEL, "solo", executor_table.CPU)]


def draw_units(pending: list[TrialConfig], pack: str | int, data_root: str | os.PathLike[str] | None,
               gpus: int | None, gpu: float = 0.0, gpu_kind: str | None = None) -> tuple[list[Unit], list[str]]:
    """The units the pending trials run as (`plan_units`), and the lines that say so (the executor table's rows
    that chose them, the units and how they were sized, the load each GPU gets): the one drawing of the plan, for
    `--dry-run` and `bench run` alike. Trials that ask for more than one GPU each (`gpu`) run solo, each with its
    GPUs: the other executors run a unit on one device."""
    pack = "solo" if gpu > 1 else pack
    units = plan_units(pending, pack, data_root, gpus, gpu_kind)
    lines = table_lines(pending, gpu_kind) if unit_spec(pack)[0] == "auto" else []
    lines += [line] if (line := describe_units(units, pack, data_root)) else []
    if gpus is not None:
        lines.append(describe_gpus(units, gpus))
    return units, lines


def describe_units(units: list[Unit], pack: str | int,
                  data_root: str | os.PathLike[str] | None = None) -> str | None:
    """The units that train several trials, a line per kind in its executor's words ('packs (--executor auto): 300
    trials in 2 packs of 150, 150; 0 trials solo'), and, where no K was given, how its executor sized them (None
    when every trial runs solo)."""
    kinds = dict.fromkeys(u.kind for u in units if len(u) > 1)
    if not kinds:
        return None
    solo = sum(len(u) == 1 for u in units)
    spec = unit_spec(pack)
    lines = []
    for kind in kinds:
        executor = get_executor(kind)
        these = [list(u.trials) for u in units if u.kind == kind and len(u) > 1]
        sizes = ", ".join(str(len(u)) for u in these)
        lines.append(f"{executor.noun}s (--executor {spec[0]}{f':{spec[1]}' if spec[1] else ''}): "
                     f"{sum(map(len, these))} trials in {len(these)} {executor.noun}s of {sizes}; {solo} trials solo")
        lines += executor.sizing(these, data_root) if spec[1] is None else []
    return "\n".join(lines)


def solo_lines(units: list[Unit], pack: str | int, gpu_kind: str | None) -> list[str]:
    """Why the trials that run alone do, counted: the executor that would have taken them says why not
    (`Executor.why_not`), or the executor table's row for their model and device runs them solo."""
    chosen, _ = unit_spec(pack)
    if chosen == "solo":
        return []
    table = executor_table.read_table() if chosen == "auto" else ()
    reasons: Counter[str] = Counter()
    for t in (u.trials[0] for u in units if len(u) == 1):
        kind, _ = unit_kind(t, pack, gpu_kind, table)
        if kind != "solo":
            reasons[get_executor(kind).why_not(t) or ""] += 1
        elif (row := executor_table.choose(t.network(), t.device, gpu_kind, table)) is not None:
            reasons[f"the executor table runs {row.model} on {row.device} solo ({row.measured})"] += 1
        else:
            reasons[f"no executor-table row for {t.network()} on {t.device}"] += 1
    return [f"  solo: {n} trials: {reason}" for reason, n in sorted(reasons.items()) if reason]


def describe_gpus(units: list[Unit], gpus: int) -> str:
    """How many GPUs the plan saw, and the load each gets when the units start in plan order, each on the GPU
    that has the least work so far (as Ray starts the next unit wherever one ends)."""
    if not gpus:
        return "GPUs: none seen here (with --address, the cluster's count): units are not split by GPU"
    loads = [(0, 0, g) for g in range(gpus)]  # (epochs, trials, which GPU): a heap, least work first
    for unit in units:
        epochs, trials, g = heapq.heappop(loads)
        heapq.heappush(loads, (epochs + unit_epochs(list(unit.trials)), trials + len(unit), g))
    together = Counter(get_executor(u.kind).noun for u in units if len(u) > 1)
    kinds = "".join(f"{n} {noun}s, then " for noun, n in together.items())

    def spread(values: list[int]) -> str:
        return f"{min(values):,}" + (f"-{max(values):,}" if max(values) > min(values) else "")

    return (f"GPUs: {gpus} seen; expected load per GPU: {spread([t for _, t, _ in loads])} trials, "
            f"{spread([e for e, _, _ in loads])} epochs ({kinds}{sum(len(u) == 1 for u in units)} solo trials)")


def describe_protocols(trials: list[TrialConfig]) -> list[str]:
    """Each protocol of a grid other than bench: the switches of the authors' scripts it turns on, each with what
    it does there and where (`bench.protocol`, the dataset's `authors_protocol`)."""
    lines = []
    for spec in dict.fromkeys(t.protocol for t in trials if t.protocol != "bench"):
        proto = next(t for t in trials if t.protocol == spec).resolved_protocol()
        n = len(proto.switches)
        lines.append(f"protocol {spec}: {n} switch{'es' if n != 1 else ''} of the authors' scripts")
        lines += [f"  {name}: {switch.what} ({switch.cite})" for name, switch in sorted(proto.switches.items())]
    return lines


def describe_schedules(schedules: list[Schedule]) -> str:
    """Method-stage schedules in words, the values where they differ joined by | (a grid's lr, batch size)."""
    def values(field: str, show: Callable[[Any], str] = "{:g}".format) -> str:
        return " | ".join(map(show, dict.fromkeys(getattr(s, field) for s in schedules)))

    text = f"{values('optimizer', str)} lr {values('lr')}"
    if any(s.milestones for s in schedules):
        at = "epochs" if any(len(s.milestones) > 1 for s in schedules) else "epoch"
        text += f" (x{values('gamma')} at {at} {values('milestones', lambda m: ', '.join(map(str, m)))})"
    text += f", {values('epochs', str)} epochs, batch {values('batch_size', str)}"
    if any(s.optimizer == "sgd" for s in schedules):
        text += f", momentum {values('momentum')}"
    return text + f", weight decay {values('weight_decay')}"


def describe_stages(trials: list[TrialConfig]) -> list[str]:
    """One line per method: the method-stage schedule its trials train with and whose it is (the method's own on the
    dataset, or the dataset's), with what the experiment sets itself."""
    stages: dict[str, dict[Schedule, None]] = {}
    given: dict[str, dict[str, None]] = {}
    for t in trials:
        stages.setdefault(t.method, {})[t.schedules()[1]] = None
        explicit = {"lr": t.lr, "batch size": t.batch_size, "epochs": t.epochs}
        given.setdefault(t.method, {}).update((k, None) for k, v in explicit.items() if v is not None)
    lines = []
    for method, schedules in stages.items():
        dataset = get_dataset(next(t.dataset for t in trials if t.method == method))
        whose = f"its own on {dataset.name}" if method in dataset.method_stages else f"{dataset.name}'s default"
        if given[method]:
            whose += f"; {', '.join(given[method])} from the experiment"
        lines.append(f"method stage of {method}: {describe_schedules(list(schedules))} ({whose})")
    networks = {t.model_label(): None for t in trials if t.model is not None}
    return lines + [f"network: {label} (the experiment's; the dataset's is {get_dataset(trials[0].dataset).model})"
                    for label in networks]


LIST_LIMIT = 1_000  # --dry-run lists the trials of a grid up to this size


def print_plan(plan: Plan, out: Callable[[str], None] = print, pack: str | int = "auto",
               data_root: str | os.PathLike[str] | None = None, gpus: int | None = None, gpu: float = 0.0,
               gpu_kind: str | None = None, at_once: int | None = None) -> None:
    """The `--dry-run` listing; `gpus`: the GPUs the trials would run on (None: they ask for none) and their kind;
    `gpu`: each trial's GPU share; `at_once`: the trials that would run together, where known (`time_estimate`)."""
    exp, pending = plan.experiment, plan.pending
    total = len(plan.trials)
    out(f"experiment {exp.name} ({exp.source}): {exp.dataset}, noise {', '.join(exp.noise)}, "
        f"r {', '.join(f'{r:g}' for r in exp.r)}, seeds {', '.join(map(str, exp.seeds))}")
    per_method = Counter(t.method for t in plan.trials)
    out(f"grid: {total} trials = " + " + ".join(f"{n} {m}" for m, n in per_method.items())
        + f"; {len(plan.done)} already have a result row, {len(pending)} to run")
    for line in describe_stages(plan.trials) + describe_protocols(plan.trials):
        out(line)
    w = plan.work(pending)
    saved = w["warm_epochs_unshared"] - w["warm_epochs"]
    out(f"work to run: {w['method_epochs']} method-stage epochs + {w['warm_epochs']} warm-start epochs "
        f"({w['warm_starts']} CE warm starts shared by {len(pending)} trials; {saved} epochs saved by sharing, "
        f"fewer if some are already cached)")
    if estimate := time_estimate(plan, at_once):
        out(estimate)
    res = exp.resources
    out(f"per trial: {res.cpu:g} CPU, {res.gpu:g} GPU, device {pending[0].device if pending else exp.device}; "
        f"at most {exp.max_concurrent or 'as many as fit'} at once")
    out(f"results: {plan.results}")
    if note := plan.unmatched_note():
        out(note)
    units, lines = draw_units(pending, pack, data_root, gpus, gpu, gpu_kind)
    for line in lines:
        out(line)
    for line in solo_lines(units, "solo" if gpu > 1 else pack, gpu_kind):
        out(line)
    if total > LIST_LIMIT:
        out(f"trials: {total:,} (not listed: more than {LIST_LIMIT:,})")
        return
    out("trials:")
    width = len(str(total))
    for i, t in enumerate(plan.trials, 1):
        state = plan.done.get(t.trial_id, "pending")
        out(f"  {i:>{width}}. {t.trial_id}  {state:8s} {t.describe()}")


# The columns of earlier rows `time_estimate` reads.
ESTIMATE_COLUMNS = ("status", "method_s", "epochs", "warmup_s", "epochs_warmup", "dataset", "model", "device",
                    "train_subset", "method", "noise", "r", "seed")


def time_estimate(plan: Plan, at_once: int | None) -> str:
    """The `--dry-run`'s estimate of the pending trials' time, from the earlier rows of the results folder: per trial,
    the median seconds an epoch of the method stage in the rows of its dataset, model, method, device kind and
    training subset, times its epochs; per warm-start cell, the median over earlier cells of the seconds an epoch
    of the warm start (the row that trained it: a cell's longest), times its epochs. Trials no earlier row matches are
    counted apart. `at_once`: the trials that run together (None: not known, as on GPUs or a cluster)."""
    pending = plan.pending
    rows = [r for r in Store(plan.results).read_table(columns=ESTIMATE_COLUMNS).iter_rows(named=True)
            if r.get("status") in ("ok", "diverged") and r.get("method_s") is not None and r.get("epochs")]
    if not pending or not rows:
        return "time: no estimate (no earlier row in the results folder to measure from)" if pending else ""
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
    seconds, unknown, started = 0.0, 0, set()
    for t in pending:
        where = (t.dataset, t.network(), device_kind(t.device), t.train_subset)
        warmup, stage = t.schedules()
        if (*where, t.method) not in method or where not in warm:
            unknown += 1
            continue
        seconds += statistics.median(method[(*where, t.method)]) * stage.epochs
        if warm_cell(t) not in started:  # the cache trains each warm start once
            started.add(warm_cell(t))
            seconds += statistics.median(warm[where]) * warmup.epochs
    measured = len(pending) - unknown
    if not measured:
        return (f"time: no estimate (none of the {len(rows)} earlier rows in the results folder has the dataset, "
                "model, method and device of a pending trial)")
    wall = f"; about {seconds / at_once / 60:.0f} min of wall time at {at_once} trials at once" if at_once else ""
    missing = f"; {unknown} trials not counted (no earlier row like them)" if unknown else ""
    return (f"time: about {seconds / 60:.0f} min of trial compute for {measured} trials{wall} (estimated from "
            f"{len(rows)} earlier rows in the results folder: seconds an epoch of the same dataset, model, method and "
            f"device, median; fewer where warm starts are cached){missing}")


def device_kind(device: str) -> str:
    """A row's device ("cuda:0 (NVIDIA H100 ...)", "cpu (x86_64)") or a trial's ("cuda:1") as its kind: cuda, cpu."""
    return str(device).split(" ")[0].split(":")[0]


def print_size(exp: Experiment, out: Callable[[str], None] = print) -> None:
    """A grid too large to expand: its size by method, counted, not listed."""
    cells = len(exp.seeds) * len(exp.noise) * len(exp.r)
    parts = " + ".join(f"{cells * len(m.combinations()):,} {m.name}" for m in exp.methods)
    out(f"experiment {exp.name} ({exp.source}): {exp.dataset}, noise {', '.join(exp.noise)}, {len(exp.r)} r values, "
        f"{len(exp.seeds):,} seeds")
    out(f"grid: {exp.size():,} trials = {parts}; more than {GRID_LIMIT:,}: not expanded, not listed "
        "(running it needs --yes)")
