"""The executor of packs (several trials as one stacked model), and how many members fit a GPU.

Several trials trained as one stacked model on one device (`bench.exec.pack`): the executor of the planner's
packs (`bench.grid.plan.plan_units`), and how many members fit a GPU's memory (`bench.exec.memory`)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.config import UserError
from bench.exec import memory
from bench.exec.executor import Arm, Bundle, Executor, UnitContext, half_each
from bench.exec.pack import run_pack
from bench.exec.packed import EVAL_IMAGES, PackedStage, device_generator
from bench.exec.packing import pack_key, why_solo
from bench.exec.prepare import Prepared, build_model, method_seed, prepare, seed_everything
from bench.methods import get_method
from bench.trial import TrialConfig


class Pack(Executor):
    name = "pack"
    unit_noun = "pack"
    most = 256  # members per pack at most: beyond this the GPU is already full for our models

    def run(self, trials: list[TrialConfig], ctx: UnitContext) -> list[dict[str, Any]]:
        return run_pack(trials, ctx.data_root, results=ctx.results, log=ctx.log, warm_cache=ctx.warm_cache,
                        checkpoints=ctx.checkpoints, events=ctx.events, executor=self.name)

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

    def fit(self, trial: TrialConfig, most: int,
            data_root: str | os.PathLike[str] | None) -> tuple[int, str | None]:
        """At most `most` (and `Pack.most`), or fewer where a pack that large would not fit in
        $BENCH_PACK_MEMORY_GB by `bench.exec.memory.pack_memory` (estimated here, on the CPU, from the data); and
        that estimate in words. The driver opens no GPU (a CUDA context there would hold memory on a GPU the trials
        need, and a cluster's driver sees none of its workers' GPUs): without that bound, or without the data,
        packs hold `most` and each pack checks its own GPU before it trains (`bench.exec.memory.check`)."""
        most = min(most, self.most)
        capacity = memory.memory_budget() if trial.device.startswith("cuda") else None
        if capacity is None or data_root is None:
            return most, None
        # What the estimate depends on (data, model, stage shapes) and nothing else, so that groups share it; the
        # batch size is the method's (its own schedule's, where the dataset gives it one); the experiment's name is the
        # default, a valid one (`TrialConfig.check`).
        like = dataclasses.replace(trial, device="cpu", method="ce", method_params=(), r=0.0, seed=0, lr=None,
                                   batch_size=trial.schedules()[1].batch_size, experiment="adhoc", extra=())
        return members_that_fit(like, str(data_root), capacity, most)

    def calibration_arms(self, members: list[Prepared], ks: list[int], extras: bool = False,
                         compile: str | None = None) -> list[Arm]:
        """`pack K fp32` for each K > 1, where the members' model packs; with `extras` on CUDA `pack K bf16` (a
        grid's `precision: bf16`), and with `compile` too `pack K bf16 + compile`."""
        if why_solo(members[0].config) is not None:
            return []
        bf16 = extras and members[0].device.type == "cuda"
        arms = []
        for k in (k for k in ks if k > 1):
            mix = half_each(members, k)
            arms.append(Arm(f"pack {k} fp32", self.name, k, True, pack_epoch(mix, False)))
            if bf16:
                arms.append(Arm(f"pack {k} bf16", self.name, k, False, pack_epoch(mix, True)))
            if bf16 and compile:
                arms.append(Arm(f"pack {k} bf16 + compile", self.name, k, False, pack_epoch(mix, True, compile)))
        return arms

    def sizing(self, units: list[list[TrialConfig]], data_root: str | os.PathLike[str] | None) -> list[str]:
        """The memory estimate per kind of pack, where the driver could make one."""
        sizes = {pack_key(u[0]): self.fit(u[0], self.most, data_root) for u in units}
        notes = [text for _, text in sizes.values() if text]
        lines = [f"  memory: {text}" for text in dict.fromkeys(notes)]
        if len(notes) < len(sizes):
            lines.append(f"  memory: not estimated here (the driver opens no GPU; BENCH_PACK_MEMORY_GB sizes packs "
                         f"here): at most {self.most} a pack, each pack checks its GPU before it trains")
        return lines


def pack_epoch(ps: list[Prepared], bf16: bool, compile: str | None = None) -> Callable[[], object]:
    """An epoch of the trials `ps` as one pack (`PackedStage`), float32 or under bf16 autocast, compiled with
    `compile` (a mode); a further epoch at each call."""
    nets, generators = [], []
    for p in ps:
        seed_everything(method_seed(p))
        nets.append(build_model(p))
        generators.append(device_generator(p.device, method_seed(p)))
    methods = [get_method(p.config.method)(p.dataset.num_classes) for p in ps]
    stage = PackedStage(ps, nets, generators, ps[0].method_stage, [p.method_stage.lr for p in ps],
                        [method_seed(p) for p in ps], methods, precision="bf16" if bf16 else "fp32",
                        compile=compile)
    return lambda: stage.train_steps(0)


def pack_id(trials: list[TrialConfig]) -> str:
    """Identity of a pack: its members' trial ids (a relaunch with other members is another pack)."""
    return "pack-" + hashlib.sha256(" ".join(sorted(t.trial_id for t in trials)).encode()).hexdigest()[:16]


@functools.cache
def members_that_fit(t: TrialConfig, data_root: str, capacity: int, most: int) -> tuple[int, str | None]:
    """`Pack.fit` for a trial reduced to what the estimate depends on (cached: groups share it)."""
    try:
        p = prepare(t, data_root, log=lambda line: None)
    except UserError:  # missing or damaged data: `bench run` names it before anything runs
        return most, None
    # Measured on the CPU, for a pack that evaluates in CUDA-sized chunks.
    estimate = dataclasses.replace(memory.pack_memory(p), chunk=EVAL_IMAGES["cuda"])
    size = max(1, min(most, estimate.members(capacity)))
    return size, (f"{t.dataset}, batch {p.method_stage.batch_size}: {estimate.describe(capacity)}; "
                  f"at most {size} a pack")
