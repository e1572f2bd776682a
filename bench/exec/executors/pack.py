"""Several trials trained as one stacked model on one device (`bench.exec.pack`): the executor of the planner's
packs (`bench.grid.plan.plan_units`)."""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

from bench.exec.executor import Bundle, Executor, UnitContext
from bench.exec.pack import run_pack
from bench.exec.packed import pack_key, why_solo
from bench.trial import TrialConfig


class Pack(Executor):
    name = "pack"

    def run(self, trials: list[TrialConfig], ctx: UnitContext) -> list[dict[str, Any]]:
        return run_pack(trials, ctx.data_root, results=ctx.results, log=ctx.log, warm_cache=ctx.warm_cache,
                        checkpoints=ctx.checkpoints, events=ctx.events)

    def resources(self, trials: list[TrialConfig], cpu: float, gpu: float) -> list[Bundle]:
        """One trial's CPUs, and its members' GPU shares together, at most one whole GPU: a pack runs on one
        device (the planner packs only trials that ask for at most one)."""
        return [{"CPU": cpu, "GPU": min(1.0, gpu * len(trials)) if gpu else 0.0}]

    def unit_id(self, trials: list[TrialConfig]) -> str:
        return pack_id(trials)

    def why_not(self, trial: TrialConfig) -> str | None:
        return why_solo(trial)

    def group_key(self, trial: TrialConfig) -> tuple[Any, ...]:
        return pack_key(trial)

    def describe(self, trials: list[TrialConfig]) -> str:
        methods = Counter(t.method for t in trials)
        return f"pack of {len(trials)} ({', '.join(f'{n} {m}' for m, n in sorted(methods.items()))})"


def pack_id(trials: list[TrialConfig]) -> str:
    """Identity of a pack: its members' trial ids (a relaunch with other members is another pack)."""
    return "pack-" + hashlib.sha256(" ".join(sorted(t.trial_id for t in trials)).encode()).hexdigest()[:16]
