"""What a grid will run, before Ray starts: the plan (trials, those already done, the units they run as) and the
`--dry-run` listing.

A trial whose result row exists (and did not fail) is done; the others are pending. Pending trials run as units: a
solo trial, or a pack of trials trained as one stacked model (`plan_units`, `--pack`; `bench.exec.pack` trains it),
split so that every GPU the trials run on gets work. The plan opens no GPU (`auto_pack_size`).
The work a plan implies counts the CE warm starts once per cell (the cache shares them). It imports the training
core but no Ray, MLflow or YAML.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.config import Schedule, UserError
from bench.data import get_dataset
from bench.exec import memory
from bench.exec.packed import EVAL_IMAGES, pack_key, why_solo
from bench.exec.prepare import prepare
from bench.grid.validate import check_trials
from bench.methods import get_method
from bench.schema import GRID_LIMIT
from bench.store.folder import Store
from bench.trial import FP32, TrialConfig

if TYPE_CHECKING:  # the planner takes an Experiment; it need not import the experiment files' YAML reader
    from bench.grid.experiment import Experiment

PACK_MAX = 256  # members per pack at most (`--pack auto`); beyond this the GPU is already full for our models


@dataclass
class Plan:
    experiment: Experiment
    trials: list[TrialConfig]
    results: str
    done: dict[str, str] = field(default_factory=dict)  # trial_id -> status of rows that need no re-run
    unmatched: int = 0  # rows in the folder that are no trial of this grid (another grid's, other settings)

    @classmethod
    def make(cls, experiment: Experiment, results: str, device: str | None = None) -> Plan:
        trials = experiment.trials()
        if device is not None:
            trials = [dataclasses.replace(t, device=device) for t in trials]
        check_trials(trials)
        rows = Store(results).statuses()
        done = {t.trial_id: rows[t.trial_id] for t in trials if rows.get(t.trial_id, "failed") != "failed"}
        return cls(experiment, trials, results, done, len(set(rows) - {t.trial_id for t in trials}))

    def unmatched_note(self) -> str | None:
        """One line on the rows of the folder that match no trial of this grid, if any."""
        if not self.unmatched:
            return None
        return (f"note: {self.unmatched} result rows in {self.results} match no trial of this grid (another grid's, "
                "or trained with other settings or defaults): left as they are; reports count each (cell, setting, "
                "seed) once, from its newest row")

    @property
    def pending(self) -> list[TrialConfig]:
        return [t for t in self.trials if t.trial_id not in self.done]

    @staticmethod
    def work(trials: list[TrialConfig]) -> dict[str, int]:
        """Epochs the trials imply: method stages, and warm starts with and without the shared cache."""

        method_epochs = warm_epochs = unshared = 0
        cells: set[tuple[Any, ...]] = set()
        for t in trials:
            warmup, method_stage = t.schedules()
            epochs, warm = method_stage.epochs, warmup.epochs
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


def warm_cell(c: TrialConfig) -> tuple[Any, ...]:
    """A trial's CE warm-start cell: what `bench.exec.prepare.warm_start_key` depends on that a config shows (the noise
    hash follows from these). The runner counts warm starts by it, and packs hold whole cells."""
    switches = c.resolved_protocol().warm_start_switches()  # the authors' warm start is not bench's
    return (c.dataset, c.noise, round(c.r, 10), c.seed, c.transition, c.train_subset, c.epochs_warmup) + \
        ((tuple(switches),) if switches else ()) + ((c.precision,) if c.precision != FP32 else ())


def auto_pack_size(t: TrialConfig, data_root: str | os.PathLike[str] | None) -> tuple[int, str | None]:
    """Members per pack under `--pack auto` for trials like `t`: `PACK_MAX`, or fewer where a pack that large
    would not fit in $BENCH_PACK_MEMORY_GB by `bench.exec.memory.pack_memory` (estimated here, on the CPU, from the
    data); and that estimate in words. The driver opens no GPU (a CUDA context there would hold memory on a GPU
    the trials need, and a cluster's driver sees none of its workers' GPUs): without that bound, or without the
    data, packs hold `PACK_MAX` and each pack checks its own GPU before it trains (`bench.exec.memory.check`)."""
    capacity = memory.memory_budget() if t.device.startswith("cuda") else None
    if capacity is None or data_root is None:
        return PACK_MAX, None
    # What the estimate depends on (data, model, stage shapes) and nothing else, so that groups share it; the batch
    # size is the method's (its own schedule's, where the dataset gives it one).
    like = dataclasses.replace(t, device="cpu", method="ce", method_params=(), r=0.0, seed=0, lr=None,
                               batch_size=t.schedules()[1].batch_size, experiment="",
                               extra=())
    return _auto_pack_size(like, str(data_root), capacity)


@functools.cache
def _auto_pack_size(t: TrialConfig, data_root: str, capacity: int) -> tuple[int, str | None]:

    try:
        p = prepare(t, data_root, log=lambda line: None)
    except UserError:  # missing or damaged data: `bench run` names it before anything runs
        return PACK_MAX, None
    # Measured on the CPU, for a pack that evaluates in CUDA-sized chunks.
    estimate = dataclasses.replace(memory.pack_memory(p), chunk=EVAL_IMAGES["cuda"])
    size = max(1, min(PACK_MAX, estimate.members(capacity)))
    return size, (f"{t.dataset}, batch {p.method_stage.batch_size}: {estimate.describe(capacity)}; "
                  f"at most {size} a pack")


def plan_units(trials: list[TrialConfig], pack: str | int, data_root: str | os.PathLike[str] | None = None,
               gpus: int | None = None) -> list[list[TrialConfig]]:
    """Units of work for the runner: lists of trials trained together (a list of one is a solo trial), the packs
    first, largest first, then the solo trials, so that these fill the GPUs the packs leave.

    `pack` is "off", "auto" (packs on CUDA, solo on a CPU, where packing measured slower; at most `PACK_MAX`
    members, or as many as `auto_pack_size` fits) or a member count at most. Packs hold whole warm-start cells,
    so no cell's warm start is trained by two packs. With `gpus` (the GPUs the trials run on, as Ray counts them)
    the packable groups share the GPUs by their work (`share_gpus`) and each splits into at least its share of
    packs, so that every GPU gets one: N trials on G GPUs are G packs of about N / G, more only where that many
    would not fit (the size above). The packs of a group are balanced (300 trials at 256 a pack: 150 + 150, not
    256 + 44), so that they finish together."""
    if pack == "off" or pack == 1:
        return [[t] for t in trials]
    solo: list[list[TrialConfig]] = []
    groups: dict[tuple[Any, ...], dict[tuple[Any, ...], list[TrialConfig]]] = {}
    for t in trials:
        if (pack == "auto" and not t.device.startswith("cuda")) or why_solo(t):
            solo.append([t])
        else:
            groups.setdefault(pack_key(t), {}).setdefault(warm_cell(t), []).append(t)
    cells = [list(group.values()) for group in groups.values()]
    work = [_epochs([t for cell in group for t in cell]) for group in cells]
    shares = share_gpus(work, gpus) if gpus else [1] * len(cells)
    packs: list[list[TrialConfig]] = []
    for group, share in zip(cells, shares, strict=True):
        size = auto_pack_size(group[0][0], data_root)[0] if pack == "auto" else int(pack)
        if pack == "auto" and size == 1:  # one member fits (or none): solo, not packs of whole cells
            solo += [[t] for cell in group for t in cell]
            continue
        packs += balanced_packs(group, size, share)
    return sorted(packs, key=_epochs, reverse=True) + solo


def share_gpus(work: list[int], gpus: int) -> list[int]:
    """GPUs for each packable group, in proportion to its work (largest remainders round up), at least one each:
    packs of groups that take longer a member are smaller, so that all finish together."""
    exact = [gpus * w / max(1, sum(work)) for w in work]
    shares = [max(1, math.floor(e)) for e in exact]
    by_remainder = sorted(range(len(work)), key=lambda i: exact[i] - math.floor(exact[i]), reverse=True)
    for i in by_remainder[:max(0, gpus - sum(shares))]:
        shares[i] += 1
    return shares


def _epochs(trials: list[TrialConfig]) -> int:
    """The epochs `trials` train (method stages and their cells' warm starts): their work, as a GPU sees it."""
    w = Plan.work(trials)
    return w["method_epochs"] + w["warm_epochs"]


def balanced_packs(cells: list[list[TrialConfig]], size: int, count: int = 1) -> list[list[TrialConfig]]:
    """Whole cells into at least `count` packs of at most `size`, as few as the least-loaded-first assignment
    manages, which also evens them out (20 trials in cells of 2 at 7 a pack: 6 + 6 + 4 + 4, not 6 + 6 + 6 + 2).
    A cell larger than `size` is a pack of its own size; there are no more packs than cells."""
    size = max([size, *map(len, cells)])
    count = min(len(cells), max(count, math.ceil(sum(map(len, cells)) / size)))
    while True:
        packs: list[list[TrialConfig]] = [[] for _ in range(count)]
        for members in cells:
            pack = min(packs, key=len)
            if len(pack) + len(members) > size:
                break
            pack += members
        else:
            return [p for p in packs if p]
        count += 1


def pack_id(trials: list[TrialConfig]) -> str:
    """Identity of a pack: its members' trial ids (a relaunch with other members is another pack)."""
    import hashlib

    return "pack-" + hashlib.sha256(" ".join(sorted(t.trial_id for t in trials)).encode()).hexdigest()[:16]


def unit_id(unit: list[TrialConfig]) -> str:
    """A solo trial is named by its trial id, a pack by its members' (`pack-<hash>`)."""
    return pack_id(unit) if len(unit) > 1 else unit[0].trial_id


def describe_units(units: list[list[TrialConfig]], pack: str | int,
                   data_root: str | os.PathLike[str] | None = None) -> str | None:
    """The packs a grid runs as, in one line, and under `--pack auto` how they were sized (None when every trial
    runs solo)."""
    packs = [u for u in units if len(u) > 1]
    if not packs:
        return None
    line = (f"packs (--pack {pack}): {sum(map(len, packs))} trials in {len(packs)} packs of "
            f"{', '.join(str(len(u)) for u in packs)}; {len(units) - len(packs)} trials solo")
    if pack == "auto":
        sizes = {pack_key(u[0]): auto_pack_size(u[0], data_root) for u in packs}
        notes = [text for _, text in sizes.values() if text]
        line += "".join(f"\n  memory: {text}" for text in dict.fromkeys(notes))
        if len(notes) < len(sizes):
            line += (f"\n  memory: not estimated here (the driver opens no GPU; BENCH_PACK_MEMORY_GB sizes packs "
                     f"here): at most {PACK_MAX} a pack, each pack checks its GPU before it trains")
    return line


def describe_gpus(units: list[list[TrialConfig]], gpus: int) -> str:
    """How many GPUs the plan saw, and the load each gets when the units start in plan order, each on the GPU
    that has the least work so far (as Ray starts the next unit wherever one ends)."""
    if not gpus:
        return "GPUs: none seen here (with --address, the cluster's count): packs are not split by GPU"
    loads = [(0, 0, g) for g in range(gpus)]  # (epochs, trials, which GPU): a heap, least work first
    for unit in units:
        epochs, trials, g = heapq.heappop(loads)
        heapq.heappush(loads, (epochs + _epochs(unit), trials + len(unit), g))
    packs = sum(len(u) > 1 for u in units)

    def spread(values: list[int]) -> str:
        return f"{min(values):,}" + (f"-{max(values):,}" if max(values) > min(values) else "")

    return (f"GPUs: {gpus} seen; expected load per GPU: {spread([t for _, t, _ in loads])} trials, "
            f"{spread([e for e, _, _ in loads])} epochs ({packs} packs, then {len(units) - packs} solo trials)")


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
    proto = "" if t.protocol == "bench" else f"  protocol {t.protocol}"
    precision = "" if t.precision == FP32 else f"  {t.precision}"
    return f"{t.method}{lr}{bs}{params}  {t.noise} r={t.r:g} seed={t.seed}{proto}{precision}"


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
    return lines


LIST_LIMIT = 1_000  # --dry-run lists the trials of a grid up to this size


def print_plan(plan: Plan, out: Callable[[str], None] = print, pack: str | int = "auto",
               data_root: str | os.PathLike[str] | None = None, gpus: int | None = None) -> None:
    """The `--dry-run` listing; `gpus`: the GPUs the trials would run on (None: they ask for none)."""
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
    units = plan_units(pending, pack, data_root, gpus)
    if line := describe_units(units, pack, data_root):
        out(line)
    if pack != "off":
        reasons = Counter(why_solo(u[0]) for u in units if len(u) == 1)
        for reason, n in sorted(reasons.items(), key=lambda kv: str(kv[0])):
            if reason:
                out(f"  solo: {n} trials: {reason}")
        if pack == "auto" and pending and not pending[0].device.startswith("cuda"):
            out("  solo: --pack auto packs on CUDA only (on a CPU, packing measured slower than solo trials)")
    if gpus is not None:
        out(describe_gpus(units, gpus))
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
