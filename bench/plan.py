"""What a grid will run, before Ray starts: the plan (trials, those already done, the units they run as) and the
`--dry-run` listing.

A trial whose result row exists (and did not fail) is done; the others are pending. Pending trials run as units: a
solo trial, or a pack of trials trained as one stacked model (`plan_units`, `--pack`; `bench.packed` trains it).
The work a plan implies counts the CE warm starts once per cell (the cache shares them). Light to import (the
training core's modules are imported where used): `bench --help` and a bare GPU box load it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.config import Schedule, TrialConfig, UserError
from bench.store import Store
from bench.validate import GRID_LIMIT, check_trials

if TYPE_CHECKING:  # experiment files need pyyaml; the planner also runs on a bare GPU box (bench.packed uses it)
    from bench.experiment import Experiment

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

    def work(self, trials: list[TrialConfig]) -> dict[str, int]:
        """Epochs the trials imply: method stages, and warm starts with and without the shared cache."""
        from bench.data import get_dataset
        from bench.methods import get_method

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


# -- which trials can pack, and with whom ------------------------------------------------------------------------------
def why_solo(c: TrialConfig) -> str | None:
    """Why this trial cannot train in a pack (None: it can)."""
    from bench import models
    from bench.data import Dataset, get_dataset
    from bench.methods import get_method

    ds = get_dataset(c.dataset)
    if not models.get_model(ds.model).packable:
        return f"model {ds.model} (BatchNorm statistics are not stacked)"
    if ds.train_transform is not Dataset.train_transform:
        return f"{c.dataset} augments its inputs at random"
    if not get_method(c.method)(ds.num_classes, **c.params).packable():
        return f"method {c.method} (extra passes, two networks or per-example state)"
    return None


def _shape(s: Schedule) -> tuple[Any, ...]:
    return (s.optimizer, s.epochs, s.batch_size, s.momentum, s.weight_decay, s.milestones, s.gamma)


def pack_key(c: TrialConfig) -> tuple[Any, ...]:
    """What members of one pack must share: data, model, device and the shape of both stages (not the lr)."""
    from bench.data import get_dataset

    ds = get_dataset(c.dataset)
    method_stage = ds.method_stage.with_overrides(batch_size=c.batch_size, epochs=c.epochs)
    warmup = ds.warmup.with_overrides(epochs=c.epochs_warmup)
    return (c.dataset, ds.model, c.train_subset, c.device, _shape(warmup), _shape(method_stage))


def warm_cell(c: TrialConfig) -> tuple[Any, ...]:
    """A trial's CE warm-start cell: what `bench.trainer.warm_start_key` depends on that a config shows (the noise
    hash follows from these). The runner counts warm starts by it, and packs hold whole cells."""
    return (c.dataset, c.noise, round(c.r, 10), c.seed, c.transition, c.train_subset, c.epochs_warmup)


def auto_pack_size(t: TrialConfig, data_root: str | os.PathLike[str] | None) -> tuple[int, str | None]:
    """Members per pack under `--pack auto` for trials like `t`: `PACK_MAX`, or fewer where a pack that large
    would not fit in the GPU's memory by `bench.memory.pack_memory` (estimated here, on the CPU, from the data);
    and that estimate in words. Sized by the GPU this machine sees (or $BENCH_PACK_MEMORY_GB): where it sees none
    (a cluster's head node) or lacks the data, packs hold `PACK_MAX` and each pack checks its own GPU before it
    trains (`bench.memory.check`)."""
    from bench import memory

    capacity = memory.device_memory(t.device) if t.device.startswith("cuda") else None
    if capacity is None or data_root is None:
        return PACK_MAX, None
    # What the estimate depends on (data, model, stage shapes) and nothing else, so that groups share it.
    like = dataclasses.replace(t, device="cpu", method="ce", method_params=(), r=0.0, seed=0, lr=None,
                               experiment="", extra=())
    return _auto_pack_size(like, str(data_root), capacity)


@functools.cache
def _auto_pack_size(t: TrialConfig, data_root: str, capacity: int) -> tuple[int, str | None]:
    from bench import memory
    from bench.packed import EVAL_IMAGES
    from bench.trainer import prepare

    try:
        p = prepare(t, data_root, log=lambda line: None)
    except UserError:  # missing or damaged data: `bench run` names it before anything runs
        return PACK_MAX, None
    # Measured on the CPU, for a pack that evaluates in CUDA-sized chunks.
    estimate = dataclasses.replace(memory.pack_memory(p), chunk=EVAL_IMAGES["cuda"])
    size = max(1, min(PACK_MAX, estimate.members(capacity)))
    return size, (f"{t.dataset}, batch {p.method_stage.batch_size}: {estimate.describe(capacity)}; "
                  f"at most {size} a pack")


def plan_units(trials: list[TrialConfig], pack: str | int,
               data_root: str | os.PathLike[str] | None = None) -> list[list[TrialConfig]]:
    """Units of work for the runner: lists of trials trained together (a list of one is a solo trial).

    `pack` is "off", "auto" (packs on CUDA, solo on a CPU, where packing measured slower; as many members as fit
    in the GPU's memory, `auto_pack_size`, at most `PACK_MAX`) or a member count. Packs hold whole warm-start
    cells, so no cell's warm start is trained by two packs. The packs of a group are balanced (300 trials at 256
    a pack: 150 + 150, not 256 + 44), so that on several GPUs none waits for a big one."""
    if pack == "off" or pack == 1:
        return [[t] for t in trials]
    units: list[list[TrialConfig]] = []
    groups: dict[tuple[Any, ...], dict[tuple[Any, ...], list[TrialConfig]]] = {}
    for t in trials:
        if (pack == "auto" and not t.device.startswith("cuda")) or why_solo(t):
            units.append([t])
        else:
            groups.setdefault(pack_key(t), {}).setdefault(warm_cell(t), []).append(t)
    for cells in groups.values():
        first = next(iter(cells.values()))[0]
        size = auto_pack_size(first, data_root)[0] if pack == "auto" else int(pack)
        units += balanced_packs(list(cells.values()), size)
    return units


def balanced_packs(cells: list[list[TrialConfig]], size: int) -> list[list[TrialConfig]]:
    """Whole cells into as few packs of at most `size` as the least-loaded-first assignment manages, which
    also evens them out (20 trials in cells of 2 at 7 a pack: 6 + 6 + 4 + 4, not 6 + 6 + 6 + 2). A cell larger
    than `size` is a pack of its own size."""
    size = max([size, *map(len, cells)])
    count = math.ceil(sum(map(len, cells)) / size)
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
            line += (f"\n  memory: not estimated here (no GPU seen, or no data): at most {PACK_MAX} a pack, each "
                     "pack checks its GPU before it trains")
    return line


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


def print_plan(plan: Plan, out: Callable[[str], None] = print, pack: str | int = "auto",
               data_root: str | os.PathLike[str] | None = None) -> None:
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
    if note := plan.unmatched_note():
        out(note)
    units = plan_units(pending, pack, data_root)
    if line := describe_units(units, pack, data_root):
        out(line)
    if pack != "off":
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
