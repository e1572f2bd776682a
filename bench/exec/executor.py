"""Executors: how one unit of a grid trains. The planner (`bench.grid.plan`) cuts the pending trials into named
units, each of one kind; the runner looks the kind up here and hands the unit and a `UnitContext` to its `run`,
after asking its `resources` of Ray. A kind is one file in `bench.exec.executors` with one `Executor` subclass
(found by `bench.config.discover`, as methods and datasets are): `solo` (one trial, `bench.exec.trainer`) and
`pack` (several trials as one stacked model, `bench.exec.pack`). What every kind does for a member (its method
set up, its outcome, its row) is `bench.exec.member`'s.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.config import discover, lookup
from bench.exec.events import Events
from bench.exec.stage import Checkpoints, Log
from bench.exec.warmstart import WarmStarts
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


class Executor:
    """One kind of unit. `run` trains the unit's trials and returns their rows in the order given (each written
    under `ctx.results` as its solo trial's would be); `resources` is what the unit asks of Ray, per trial's CPU and
    GPU share, as placement-group bundles; `unit_id` names the unit (its checkpoints and log are kept under it)."""

    name: str = ""

    def run(self, trials: list[TrialConfig], ctx: UnitContext) -> list[dict[str, Any]]:
        raise NotImplementedError

    def resources(self, trials: list[TrialConfig], cpu: float, gpu: float) -> list[Bundle]:
        raise NotImplementedError

    def unit_id(self, trials: list[TrialConfig]) -> str:
        raise NotImplementedError

    def describe(self, trials: list[TrialConfig]) -> str:
        """The unit in a few words, for the live status."""
        raise NotImplementedError

    def why_not(self, trial: TrialConfig) -> str | None:
        """Why `trial` cannot train in a unit of this kind with others (None: it can); it then runs solo."""
        return None

    def group_key(self, trial: TrialConfig) -> tuple[Any, ...]:
        """What trials in one unit of this kind must share."""
        return (trial.dataset, trial.device)


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

    def __len__(self) -> int:
        return len(self.trials)

    def __iter__(self) -> Iterator[TrialConfig]:
        return iter(self.trials)
