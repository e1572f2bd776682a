"""One trial in a process of its own (`bench.exec.trainer`): the executor of every trial that is not packed."""

from __future__ import annotations

from typing import Any

from bench.exec.executor import Arm, Bundle, Executor, UnitContext, solo_epoch
from bench.exec.prepare import Prepared
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

    def calibration_arms(self, members: list[Prepared], ks: list[int], extras: bool = False,
                         compile: str | None = None) -> list[Arm]:
        """`solo fp32`, one trial as a grid trains it (the first arm: the others are read against it); with
        `extras`, `solo bf16 + CL` (channels-last, under bf16 autocast; on a CPU `solo fp32 + CL`)."""
        arms = [Arm("solo fp32", self.name, 1, True, solo_epoch(members[0]))]
        if extras:
            bf16 = members[0].device.type == "cuda"
            arms.append(Arm(f"solo {'bf16' if bf16 else 'fp32'} + CL", self.name, 1, False,
                            solo_epoch(members[0], fast=True)))
        return arms
