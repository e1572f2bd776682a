"""One trial in a process of its own (`bench.exec.trainer`): the executor of every trial that is not packed."""

from __future__ import annotations

from typing import Any

from bench.exec.executor import Bundle, Executor, UnitContext
from bench.trial import TrialConfig


class Solo(Executor):
    name = "solo"

    def run(self, trials: list[TrialConfig], ctx: UnitContext) -> list[dict[str, Any]]:
        (trial,) = trials
        return [self.run_trial(trial, ctx)]

    def resources(self, trials: list[TrialConfig], cpu: float, gpu: float) -> list[Bundle]:
        """The trial's CPUs and GPUs as written: a trial asking for 2 GPUs is given 2 (or refused by
        `bench.grid.cluster.check_resources` where no node has them)."""
        return [{"CPU": cpu, "GPU": gpu}]

    def unit_id(self, trials: list[TrialConfig]) -> str:
        return trials[0].trial_id

    def describe(self, trials: list[TrialConfig]) -> str:
        return trials[0].describe()
