"""What a grid will run, before Ray starts: the plan (trials, those already done, the units they run as) and the
`--dry-run` listing.

A trial whose result row exists (and did not fail) is done; the others are pending. Pending trials run as units: a
solo trial, or a pack of trials trained as one stacked model (`bench.packed.plan_units`, `--pack`). The work a plan
implies counts the CE warm starts once per cell (the cache shares them).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.config import TrialConfig, UserError
from bench.experiment import Experiment
from bench.store import Store
from bench.validate import GRID_LIMIT, check_trials


@dataclass
class Plan:
    experiment: Experiment
    trials: list[TrialConfig]
    results: str
    done: dict[str, str] = field(default_factory=dict)  # trial_id -> status of rows that need no re-run

    @classmethod
    def make(cls, experiment: Experiment, results: str, device: str | None = None) -> Plan:
        trials = experiment.trials()
        if device is not None:
            trials = [dataclasses.replace(t, device=device) for t in trials]
        check_trials(trials)
        rows = Store(results).statuses()
        done = {t.trial_id: rows[t.trial_id] for t in trials if rows.get(t.trial_id, "failed") != "failed"}
        return cls(experiment, trials, results, done)

    @property
    def pending(self) -> list[TrialConfig]:
        return [t for t in self.trials if t.trial_id not in self.done]

    def work(self, trials: list[TrialConfig]) -> dict[str, int]:
        """Epochs the trials imply: method stages, and warm starts with and without the shared cache."""
        from bench.data import get_dataset
        from bench.methods import get_method
        from bench.packed import warm_cell

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


def plan_units(trials: list[TrialConfig], pack: str | int) -> list[list[TrialConfig]]:
    """Solo trials and packs (`bench.packed.plan_units`); imported here so that `bench --help` stays light."""
    from bench.packed import plan_units as plan

    return plan(trials, pack)


def unit_id(unit: list[TrialConfig]) -> str:
    """A solo trial is named by its trial id, a pack by its members' (`pack-<hash>`)."""
    from bench.packed import pack_id

    return pack_id(unit) if len(unit) > 1 else unit[0].trial_id


def describe_units(units: list[list[TrialConfig]], pack: str | int) -> str | None:
    """The packs a grid runs as, in one line (None when every trial runs solo)."""
    packs = [u for u in units if len(u) > 1]
    if not packs:
        return None
    return (f"packs (--pack {pack}): {sum(map(len, packs))} trials in {len(packs)} packs of "
            f"{', '.join(str(len(u)) for u in packs)}; {len(units) - len(packs)} trials solo")


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


def print_plan(plan: Plan, out: Callable[[str], None] = print, pack: str | int = "auto") -> None:
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
    units = plan_units(pending, pack)
    if line := describe_units(units, pack):
        out(line)
    if pack != "off":
        from bench.packed import why_solo

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
