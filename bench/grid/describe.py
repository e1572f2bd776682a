"""The plan in words: the lines `bench run` prints before it trains, and the `--dry-run` listing.

The plan in words: the lines `bench run` prints before it trains (`draw_units`: the units and why, the GPUs'
loads) and the `--dry-run` listing (`print_plan`), both from one drawing of the units (`bench.grid.plan`)."""

from __future__ import annotations

import heapq
import os
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bench.config import Schedule
from bench.data import get_dataset
from bench.exec.executor import Unit, get_executor
from bench.grid import executor_table
from bench.grid.estimate import time_estimate
from bench.grid.plan import Plan, plan_units, unit_epochs, unit_kind, unit_spec
from bench.schema import GRID_LIMIT
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
    `gpu`: each trial's GPU share; `at_once`: the trials that would run together, where known."""
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
    for line in time_estimate(plan, at_once, gpus, gpu_kind).lines:
        out(line)
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


def print_size(exp: Experiment, out: Callable[[str], None] = print) -> None:
    """A grid too large to expand: its size by method, counted, not listed."""
    cells = len(exp.seeds) * len(exp.noise) * len(exp.r)
    parts = " + ".join(f"{cells * len(m.combinations()):,} {m.name}" for m in exp.methods)
    out(f"experiment {exp.name} ({exp.source}): {exp.dataset}, noise {', '.join(exp.noise)}, {len(exp.r)} r values, "
        f"{len(exp.seeds):,} seeds")
    out(f"grid: {exp.size():,} trials = {parts}; more than {GRID_LIMIT:,}: not expanded, not listed "
        "(running it needs --yes)")
