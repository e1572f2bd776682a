"""The plan in words: the lines `bench run` prints before it trains (`draw_units`: the units and why, the GPUs'
loads) and the `--dry-run` listing (`print_plan`), both from one drawing of the units (`bench.grid.plan`)."""

from __future__ import annotations

import heapq
import os
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bench.config import Schedule
from bench.data import get_dataset
from bench.exec.executor import Unit
from bench.exec.packed import pack_key, why_solo
from bench.grid import executor_table
from bench.grid.plan import PACK_MAX, Plan, auto_pack_size, plan_units, unit_epochs
from bench.schema import GRID_LIMIT
from bench.trial import TrialConfig

if TYPE_CHECKING:  # the listing takes an Experiment; it need not import the experiment files' YAML reader
    from bench.grid.experiment import Experiment


def table_lines(pending: list[TrialConfig], gpu_kind: str | None) -> list[str]:
    """The executor table's rows that chose the executors of `pending` under `--pack auto`, one line each; not the
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
    pack = "off" if gpu > 1 else pack
    units = plan_units(pending, pack, data_root, gpus, gpu_kind)
    lines = table_lines(pending, gpu_kind) if pack == "auto" else []
    lines += [line] if (line := describe_units(units, pack, data_root)) else []
    if gpus is not None:
        lines.append(describe_gpus(units, gpus))
    return units, lines


def describe_units(units: list[Unit], pack: str | int,
                   data_root: str | os.PathLike[str] | None = None) -> str | None:
    """The units that train several trials, a line per kind ('packs (--pack auto): 300 trials in 2 packs of 150,
    150; 0 trials solo'), and under `--pack auto` how the packs were sized (None when every trial runs solo)."""
    kinds = dict.fromkeys(u.kind for u in units if u.kind != "solo")
    if not kinds:
        return None
    solo = sum(u.kind == "solo" for u in units)
    lines = []
    for kind in kinds:
        these = [u for u in units if u.kind == kind]
        sizes = ", ".join(str(len(u)) for u in these)
        if kind == "pack":
            lines.append(f"packs (--pack {pack}): {sum(map(len, these))} trials in {len(these)} packs of {sizes}; "
                         f"{solo} trials solo")
            lines += pack_sizing(these, data_root) if pack == "auto" else []
        else:
            lines.append(f"{kind} units: {sum(map(len, these))} trials in {len(these)} units of {sizes}")
    return "\n".join(lines)


def pack_sizing(packs: list[Unit], data_root: str | os.PathLike[str] | None) -> list[str]:
    """How `--pack auto` sized the packs: the memory estimate per kind of pack, where the driver could make one."""
    sizes = {pack_key(u.trials[0]): auto_pack_size(u.trials[0], data_root) for u in packs}
    notes = [text for _, text in sizes.values() if text]
    lines = [f"  memory: {text}" for text in dict.fromkeys(notes)]
    if len(notes) < len(sizes):
        lines.append(f"  memory: not estimated here (the driver opens no GPU; BENCH_PACK_MEMORY_GB sizes packs "
                     f"here): at most {PACK_MAX} a pack, each pack checks its GPU before it trains")
    return lines


def describe_gpus(units: list[Unit], gpus: int) -> str:
    """How many GPUs the plan saw, and the load each gets when the units start in plan order, each on the GPU
    that has the least work so far (as Ray starts the next unit wherever one ends)."""
    if not gpus:
        return "GPUs: none seen here (with --address, the cluster's count): packs are not split by GPU"
    loads = [(0, 0, g) for g in range(gpus)]  # (epochs, trials, which GPU): a heap, least work first
    for unit in units:
        epochs, trials, g = heapq.heappop(loads)
        heapq.heappush(loads, (epochs + unit_epochs(list(unit.trials)), trials + len(unit), g))
    packs = sum(u.kind == "pack" for u in units)

    def spread(values: list[int]) -> str:
        return f"{min(values):,}" + (f"-{max(values):,}" if max(values) > min(values) else "")

    return (f"GPUs: {gpus} seen; expected load per GPU: {spread([t for _, t, _ in loads])} trials, "
            f"{spread([e for e, _, _ in loads])} epochs ({packs} packs, then {len(units) - packs} solo trials)")


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
               gpu_kind: str | None = None) -> None:
    """The `--dry-run` listing; `gpus`: the GPUs the trials would run on (None: they ask for none) and their kind;
    `gpu`: each trial's GPU share."""
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
    res = exp.resources
    out(f"per trial: {res.cpu:g} CPU, {res.gpu:g} GPU, device {pending[0].device if pending else exp.device}; "
        f"at most {exp.max_concurrent or 'as many as fit'} at once")
    out(f"results: {plan.results}")
    if note := plan.unmatched_note():
        out(note)
    units, lines = draw_units(pending, pack, data_root, gpus, gpu, gpu_kind)
    for line in lines:
        out(line)
    if pack != "off":
        reasons = Counter(why_solo(u.trials[0]) for u in units if u.kind == "solo")
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
        out(f"  {i:>{width}}. {t.trial_id}  {state:8s} {t.describe()}")


def print_size(exp: Experiment, out: Callable[[str], None] = print) -> None:
    """A grid too large to expand: its size by method, counted, not listed."""
    cells = len(exp.seeds) * len(exp.noise) * len(exp.r)
    parts = " + ".join(f"{cells * len(m.combinations()):,} {m.name}" for m in exp.methods)
    out(f"experiment {exp.name} ({exp.source}): {exp.dataset}, noise {', '.join(exp.noise)}, {len(exp.r)} r values, "
        f"{len(exp.seeds):,} seeds")
    out(f"grid: {exp.size():,} trials = {parts}; more than {GRID_LIMIT:,}: not expanded, not listed "
        "(running it needs --yes)")
