"""Executors: how one unit of a grid trains. The planner (`bench.grid.plan`) cuts the pending trials into named
units, each of one kind; the runner looks the kind up here and hands the unit and a `UnitContext` to its `run`,
after asking its `resources` of Ray. A kind is one file in `bench.exec.executors` with one `Executor` subclass
(found by `bench.config.discover`, as methods and datasets are): `solo` (one trial, `bench.exec.trainer`) and
`pack` (several trials as one stacked model, `bench.exec.pack`). What every kind does for a member (its method
set up, its outcome, its row) is `bench.exec.member`'s.

Everything the driver says or decides about a unit of a kind comes from its executor, never from its name: what a
unit is called (`noun`), the words on each member's line as it finishes (`member_words`), how many trials a unit
holds by the memory the driver can estimate (`fit`) and those estimates in words (`sizing`), and the row's
`executor` column (`run_trial` passes the kind's name down to the trial). So is how `bench calibrate` times the kind
(`calibration_arms`: an epoch of training as its unit trains, `bench.exec.calibrate` times whatever kinds are
registered); `solo_epoch`, a solo trial's epoch, is the piece the built-in arms share.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.config import discover, disk_full, lookup
from bench.exec.events import Events
from bench.exec.prepare import Prepared, build_model, method_seed, seed_everything
from bench.exec.stage import ALONE, Checkpoints, Log, SoloStage, Turns
from bench.exec.trainer import run_trial
from bench.exec.warmstart import WarmStarts
from bench.methods import Batch, get_method
from bench.trial import TrialConfig

Bundle = dict[str, float]  # one Ray placement-group bundle: {"CPU": 2, "GPU": 0.5}


@dataclass
class UnitContext:
    """What a unit runs with, whatever its kind: where the data and the results are, the unit's log, the shared
    warm-start cache, its epoch checkpoints (a retried unit resumes from them), and who hears its progress (the
    training core's events, `bench.exec.events`)."""

    data_root: str | os.PathLike[str]
    results: str | os.PathLike[str] | None = None
    log: Log = print
    warm_cache: WarmStarts | None = None
    checkpoints: Checkpoints | None = None
    events: Events | None = None


@dataclass(frozen=True)
class Arm:
    """One way a kind trains `members` trials at once, for `bench calibrate` to time: `run` trains one epoch of each
    (`bench.exec.calibrate.timed` calls it, once untimed, then once a round); `executor` names the kind; `as_run`:
    timed as a grid runs it (fp32), so that it may become an executor-table row."""

    name: str
    executor: str
    members: int
    as_run: bool
    run: Callable[[], object] = field(compare=False, repr=False)


class Executor:
    """One kind of unit. `run` trains the unit's trials and returns their rows in the order given (each written
    under `ctx.results` as its solo trial's would be); `resources` is what the unit asks of Ray, per trial's CPU and
    GPU share, as placement-group bundles; `unit_id` names the unit (its checkpoints and log are kept under it)."""

    name: str = ""
    unit_noun: str = ""  # what one unit of this kind is called ("pack"); "" : "<name> unit"
    most: int = 8  # trials a unit holds at most where nothing else says (`--executor NAME` without K)

    @property
    def noun(self) -> str:
        return self.unit_noun or f"{self.name} unit"

    def run(self, trials: list[TrialConfig], ctx: UnitContext) -> list[dict[str, Any]]:
        raise NotImplementedError

    def resources(self, trials: list[TrialConfig], cpu: float, gpu: float) -> list[Bundle]:
        raise NotImplementedError

    def unit_id(self, trials: list[TrialConfig]) -> str:
        raise NotImplementedError

    def describe(self, trials: list[TrialConfig]) -> str:
        """The unit in a few words, for the live status."""
        raise NotImplementedError

    def member_words(self, trials: list[TrialConfig]) -> str:
        """The unit in a few words on each of its trials' lines as they finish ('pack of 3'; none for a trial
        alone)."""
        return f"{self.noun} of {len(trials)}" if len(trials) > 1 else ""

    def fit(self, trial: TrialConfig, most: int,
            data_root: str | os.PathLike[str] | None) -> tuple[int, str | None]:
        """How many trials like `trial` a unit of this kind holds, at most `most`, by the memory the driver can
        estimate without opening a GPU; and that estimate in words (None: none made). Only where no K was given
        (`--executor auto` or `NAME`): an explicit K is the user's. The base: `most`, no estimate."""
        return most, None

    def sizing(self, units: list[list[TrialConfig]], data_root: str | os.PathLike[str] | None) -> list[str]:
        """How `fit` sized these units, in lines for the plan (none: nothing to say)."""
        return []

    def run_trial(self, trial: TrialConfig, ctx: UnitContext, **given: Any) -> dict[str, Any]:
        """One trial of the unit as its solo trial trains it (`bench.exec.trainer.run_trial`) with the unit's
        context, its row saying this kind trained it; `given` overrides what the context gives (a member's log,
        its checkpoints, its turns)."""
        args: dict[str, Any] = dict(results=ctx.results, log=ctx.log, warm_cache=ctx.warm_cache, events=ctx.events,
                                    checkpoints=ctx.checkpoints)
        return run_trial(trial, ctx.data_root, **{**args, **given, "executor": self.name})

    def calibration_arms(self, members: list[Prepared], ks: list[int], extras: bool = False,
                         compile: str | None = None) -> list[Arm]:
        """The arms `bench calibrate` times for this kind: for each K of `ks` (or once, for a kind of one trial) an
        epoch of a unit of K of `members` (prepared trials of one dataset, CE and L_DMI alternating, sorted by method;
        `half_each` picks K of them) trained as this kind trains it. `extras`: also the arms a grid runs only under
        `precision: bf16` or that only explain others (never table rows); `compile`: a `torch.compile` mode for
        those that compile. The base offers none: a kind that says nothing here is not timed."""
        return []

    def why_not(self, trial: TrialConfig) -> str | None:
        """Why `trial` cannot train in a unit of this kind with others (None: it can); it then runs solo."""
        return None

    def group_key(self, trial: TrialConfig) -> tuple[Any, ...]:
        """What trials in one unit of this kind must share: a unit is one process, so one float order too."""
        return (trial.dataset, trial.device, trial.numerics, trial.threads)


def half_each(ps: list[Prepared], k: int) -> list[Prepared]:
    """K of the members (sorted by method), CE and L_DMI half each."""
    return ps[: k // 2] + ps[len(ps) // 2 : len(ps) // 2 + k - k // 2]


def solo_epoch(p: Prepared, fast: bool = False) -> Callable[..., object]:
    """An epoch of the trial `p` as its solo trial trains (`SoloStage`, its network built from its method stage's
    seed), a further epoch at each call, taking the turns it is given (a streams unit's member: `Turns`).
    `fast`: in channels-last, under bf16 autocast on CUDA."""
    seed_everything(method_seed(p))
    net = build_model(p)
    method = get_method(p.config.method)(p.dataset.num_classes)
    step_loss = method.train_loss
    if fast:
        net = net.to(memory_format=torch.channels_last)

        def step_loss(nets: list[torch.nn.Module], batch: Batch) -> torch.Tensor:
            cuda = p.device.type == "cuda"
            with torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext():
                return method.train_loss(nets, batch)

    stage = SoloStage(p, [net], p.method_stage, method_seed(p), step_loss, method.validation_loss, method)

    def epoch(turns: Turns = ALONE) -> object:
        stage.turns = turns
        return stage.train_steps(0)

    return epoch


@functools.cache
def executors() -> dict[str, type[Executor]]:
    return discover(Executor, ("bench.exec.executors",))


def get_executor(kind: str) -> Executor:
    return lookup(executors(), "executor", kind)()


@dataclass(frozen=True)
class Unit:
    """Trials that train together, and the kind of executor that trains them."""

    kind: str
    trials: tuple[TrialConfig, ...]

    @property
    def id(self) -> str:
        return get_executor(self.kind).unit_id(list(self.trials))

    def describe(self) -> str:
        return get_executor(self.kind).describe(list(self.trials))

    def member_words(self) -> str:
        return get_executor(self.kind).member_words(list(self.trials))

    def __len__(self) -> int:
        return len(self.trials)

    def __iter__(self) -> Iterator[TrialConfig]:
        return iter(self.trials)


def retry_may_cure(error: BaseException) -> bool:
    """The one rule of what a retry may cure, for the runner and every executor: a fault of Ray's own (a lost node,
    actor or object: an error whose class comes from Ray's modules, told by module so that the training core need
    not import Ray), a GPU whose memory other work took, a connection that dropped; never a full disk (the next write
    fails the same way). A worker killed outright raises nothing: Ray sees it die and retries it (`--retries`)."""
    if disk_full(error):
        return False
    return isinstance(error, (torch.OutOfMemoryError, ConnectionError)) or any(
        cls.__module__.split(".")[0] == "ray" for cls in type(error).__mro__)
