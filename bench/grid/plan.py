"""What a grid will run, before Ray starts: the plan (trials, those already done, the units they run as) and the
`--dry-run` listing.

A trial whose result row exists (and did not fail) is done; the others are pending. Pending trials run as units: a
solo trial, or a pack of trials trained as one stacked model (`plan_units`, `--executor`; `bench.exec.pack` trains it),
split so that every GPU the trials run on gets work. The plan opens no GPU (`bench.exec.executor.Executor.fit`).
The work a plan implies counts the CE warm starts once per cell (the cache shares them). It imports the training
core but no Ray, MLflow or YAML.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.config import UserError, integer
from bench.exec.executor import Unit, executors, get_executor
from bench.grid import executor_table
from bench.grid.validate import check_trials
from bench.methods import get_method
from bench.store.folder import Store
from bench.trial import TrialConfig

UNIT_MOST = executor_table.TRIALS_MOST  # trials a unit at most, as a table row may say

if TYPE_CHECKING:  # the planner takes an Experiment; it need not import the experiment files' YAML reader
    from bench.grid.experiment import Experiment


@dataclass
class Plan:
    experiment: Experiment
    trials: list[TrialConfig]
    results: str
    done: dict[str, str] = field(default_factory=dict)  # trial_id -> status of rows that need no re-run
    unmatched: int = 0  # rows in the folder that are no trial of this grid (another grid's, other settings)

    @classmethod
    def make(cls, experiment: Experiment, results: str, device: str | None = None) -> Plan:
        """The grid's trials (on `device` where given: the device is no part of a trial's identity), each checked,
        and which of them the folder's rows mark done. A run makes it once (`bench.grid.runner.run_experiment`)."""
        on_device = experiment if device is None else dataclasses.replace(experiment, device=device)
        trials = on_device.trials()  # each trial's id hashed here, once
        check_trials(trials)
        return cls(experiment, trials, results).reread()

    def reread(self) -> Plan:
        """The plan with the folder's rows read again (its trials as they were expanded and checked): after damaged
        files were set aside, whose trials run again."""
        rows = Store(self.results).statuses()
        done = {t.trial_id: rows[t.trial_id] for t in self.trials if rows.get(t.trial_id, "failed") != "failed"}
        unmatched = len(set(rows) - {t.trial_id for t in self.trials})
        return dataclasses.replace(self, done=done, unmatched=unmatched)

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
    """A trial's CE warm-start cell: what `bench.exec.prepare.warm_start_key` depends on that a config shows
    (`TrialConfig.warm_start_cell`, and the warm start's epochs; the noise hash follows from these). The runner
    counts warm starts by it, and packs hold whole cells where they fit."""
    cell, extra = c.warm_start_cell()
    return cell + (c.epochs_warmup,) + tuple(tuple(e) if isinstance(e, list) else e for e in extra)


def plan_units(trials: list[TrialConfig], pack: str | int, data_root: str | os.PathLike[str] | None = None,
               gpus: int | None = None, gpu_kind: str | None = None) -> list[Unit]:
    """Units of work for the runner (`bench.exec.executor.Unit`): trials trained together (packs, or units of
    another executor), largest first, then solo trials, so that these fill the GPUs the others leave.

    `pack` is an `--executor` spec (`unit_spec`): a kind and how many trials its units hold at most, or "auto": per
    trial, the executor and the trials a unit holds that the executor table gives for its model on its device
    (`bench.grid.executor_table`, on GPUs named `gpu_kind`: packs on CUDA, solo on a CPU, where packing measured
    slower). Where no count was given, a unit holds no more than its executor's `fit` says the memory allows.
    Units hold whole warm-start cells where they fit (no cell's warm start trained by two units); a cell larger than
    a unit may hold is split (`balanced_packs`). With
    `gpus` (the GPUs the trials run on, as Ray counts them) the groups share the GPUs by their work (`share_gpus`)
    and each splits into at least its share of units, so that every GPU gets one: N trials on G GPUs are G packs of
    about N / G, more only where that many would not fit. The units of a group are balanced (300 trials at 256 a
    pack: 150 + 150, not 256 + 44), so that they finish together."""
    chosen, count = unit_spec(pack)
    if chosen == "solo" or count == 1:
        return [Unit("solo", (t,)) for t in trials]
    solo: list[list[TrialConfig]] = []
    groups: dict[tuple[Any, ...], dict[tuple[Any, ...], list[TrialConfig]]] = {}
    table = executor_table.read_table() if chosen == "auto" else ()  # read once, not once a trial
    for t in trials:
        kind, most = unit_kind(t, pack, gpu_kind, table)
        executor = get_executor(kind)
        if kind == "solo" or executor.why_not(t):
            solo.append([t])
        else:
            groups.setdefault((kind, most, executor.group_key(t)), {}).setdefault(warm_cell(t), []).append(t)
    cells = [list(group.values()) for group in groups.values()]
    work = [unit_epochs([t for cell in group for t in cell]) for group in cells]
    shares = share_gpus(work, gpus) if gpus else [1] * len(cells)
    together: list[tuple[str, list[TrialConfig]]] = []
    for (kind, most, _), group, share in zip(groups, cells, shares, strict=True):
        size = get_executor(kind).fit(group[0][0], most, data_root)[0] if count is None else most
        if size == 1:  # one member fits (or none): solo, not units of whole cells
            solo += [[t] for cell in group for t in cell]
            continue
        together += [(kind, unit) for unit in balanced_packs(group, size, share)]
    together.sort(key=lambda ku: unit_epochs(ku[1]), reverse=True)
    return [Unit(kind if len(u) > 1 else "solo", tuple(u)) for kind, u in together + [("solo", u) for u in solo]]


def unit_kind(t: TrialConfig, pack: str | int, gpu_kind: str | None,
              table: tuple[executor_table.Choice, ...]) -> tuple[str, int]:
    """The executor that trains `t` with others, and how many trials its units hold at most: the spec's kind and K
    (no K: the kind's `most`), or under `auto` the executor table's row for its model and device (none: solo)."""
    kind, count = unit_spec(pack)
    if kind != "auto":
        return kind, count or get_executor(kind).most
    choice = executor_table.choose(t.network(), t.device, gpu_kind, table)
    if choice is None:
        return "solo", 1
    if choice.executor not in executors():
        raise UserError(f"the executor table {executor_table.table_path()} names the executor {choice.executor!r} "
                        f"for {choice.model} on {choice.device}; there are {', '.join(executors())}")
    return choice.executor, choice.trials


def share_gpus(work: list[int], gpus: int) -> list[int]:
    """GPUs for each packable group, in proportion to its work (largest remainders round up), at least one each:
    packs of groups that take longer a member are smaller, so that all finish together."""
    exact = [gpus * w / max(1, sum(work)) for w in work]
    shares = [max(1, math.floor(e)) for e in exact]
    by_remainder = sorted(range(len(work)), key=lambda i: exact[i] - math.floor(exact[i]), reverse=True)
    for i in by_remainder[:max(0, gpus - sum(shares))]:
        shares[i] += 1
    return shares


def unit_epochs(trials: list[TrialConfig]) -> int:
    """The epochs `trials` train (method stages and their cells' warm starts): their work, as a GPU sees it."""
    w = Plan.work(trials)
    return w["method_epochs"] + w["warm_epochs"]


def balanced_packs(cells: list[list[TrialConfig]], size: int, count: int = 1) -> list[list[TrialConfig]]:
    """Whole cells into at least `count` packs of at most `size`, as few as the least-loaded-first assignment
    manages, which also evens them out (20 trials in cells of 2 at 7 a pack: 6 + 6 + 4 + 4, not 6 + 6 + 6 + 2).
    A cell larger than `size` is split into near-equal parts (its warm start is then trained once a part, or taken
    from the cache by the later ones): `--pack K` and the executor table's limit hold, so a pack size that fits is
    a pack size the plan keeps. There are no more packs than cells (parts counted)."""
    size = max(1, size)
    cells = [part for cell in cells for part in split_cell(cell, size)]
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


def split_cell(cell: list[TrialConfig], size: int) -> list[list[TrialConfig]]:
    """A cell as parts of at most `size` members, as equal as they come (5 at 3: 3 + 2)."""
    parts = math.ceil(len(cell) / size)
    small, extra = divmod(len(cell), parts)
    bounds = [i * small + min(i, extra) for i in range(parts + 1)]
    return [cell[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def unit_spec(spec: str | int) -> tuple[str, int | None]:
    """An `--executor` spec as (kind, trials a unit at most; None: not given): `auto`, `solo`, `NAME` or `NAME:K`;
    also `--pack`'s words as the planner was once called with them (`off`: solo; a number N: packs of N)."""
    if spec == "off" or spec == 1:
        return "solo", 1
    if isinstance(spec, int):
        return "pack", spec
    name, colon, count = str(spec).partition(":")
    if name == "auto" and not colon:
        return "auto", None
    try:  # `pack:` (no K) and `pack:²` are typos, not "as many as fit"
        k = integer(count) if colon else None
    except ValueError:
        k = 0
    if name not in executors() or (k is not None and not 1 <= k <= UNIT_MOST):
        raise UserError(f"--executor must be auto or an executor's name with at most K trials a unit "
                        f"(NAME or NAME:K, K from 1 to {UNIT_MOST:,} in ASCII digits), got {spec!r}; executors: "
                        f"{', '.join(executors())}")
    if name == "solo" and k not in (None, 1):
        raise UserError(f"--executor solo trains one trial a unit, got {spec!r}; give solo, or pack:{k} or "
                        f"streams:{k} for {k} trials a unit")
    return name, k if k is not None else (1 if name == "solo" else None)


def parse_executor(executor: str | None, pack: str | None = None) -> str:
    """The spec `bench run` plans by: `--executor`'s value (checked, `unit_spec`), or `--pack`'s, its alias (auto,
    off, N: packs of at most N trials), or auto."""
    if executor is not None and pack is not None:
        raise UserError(f"--pack is --executor's older name: give one of them, not both (--executor {executor}, "
                        f"--pack {pack})")
    if pack is None:
        spec = "auto" if executor is None else executor.strip()
        unit_spec(spec)
        return spec
    if pack in ("auto", "off"):
        return "auto" if pack == "auto" else "solo"
    try:
        k = integer(pack)
    except ValueError:
        k = 0
    if 1 <= k <= UNIT_MOST:
        return f"pack:{k}"
    raise UserError(f"--pack must be auto, off or a number of trials per pack (1 to {UNIT_MOST:,} in ASCII digits), "
                    f"got {pack!r}")
