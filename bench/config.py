"""The trial configuration: every axis of one trial, its defaults, and its identity.

A trial is a pure function of its resolved `TrialConfig`. `trial_id` hashes exactly the fields that change the
numbers, so relaunching a grid recognises finished trials and a grid can grow without re-running anything.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class UserError(Exception):
    """Bad input (unknown name, impossible value, missing data): shown as one line, exit code 2."""


EXIT_USAGE = 2


def discover(package: str, base: type, also: tuple[str, ...] = ()) -> dict[str, Any]:
    """The one plug-in mechanism (methods, datasets): every subclass of `base` with a `name`, defined in a module
    of `package` (or in a module named in `also`), by name. Adding a method or a dataset is adding one file."""
    import importlib
    import pkgutil

    modules = [importlib.import_module(name) for name in also]
    pkg = importlib.import_module(package)
    modules += [importlib.import_module(f"{package}.{info.name}") for info in pkgutil.iter_modules(pkg.__path__)]
    found = {obj.name: obj for module in modules for obj in vars(module).values()
             if isinstance(obj, type) and issubclass(obj, base) and obj.name and obj.__module__ == module.__name__}
    return dict(sorted(found.items()))


def default_data_root() -> Path:
    """`$BENCH_DATA`, else `~/.cache/bench/data`."""
    env = os.environ.get("BENCH_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "bench" / "data"


@dataclass(frozen=True)
class Schedule:
    """One training stage's optimiser and learning-rate schedule (the paper's per-dataset settings)."""

    optimizer: str  # "adam" or "sgd"
    lr: float
    epochs: int
    batch_size: int
    momentum: float = 0.0
    weight_decay: float = 0.0
    milestones: tuple[int, ...] = ()  # epochs (0-based) at which lr is multiplied by gamma
    gamma: float = 0.1

    def with_overrides(self, **overrides: Any) -> Schedule:
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})


# Fields that do not change a trial's numbers, so they stay out of its identity.
_NOT_IDENTITY = {"device", "experiment"}


@dataclass(frozen=True)
class TrialConfig:
    """Everything that defines one trial. `None` means "the dataset's paper default" until `resolve`."""

    dataset: str
    method: str
    noise: str
    r: float
    seed: int = 0
    lr: float | None = None
    batch_size: int | None = None
    epochs: int | None = None
    epochs_warmup: int | None = None
    method_params: tuple[tuple[str, Any], ...] = ()
    transition: tuple[tuple[float, ...], ...] | None = None  # explicit T, with noise="transition"
    train_subset: int | None = None  # use only the first N training examples (quick runs, tests)
    device: str = "cpu"
    experiment: str = "adhoc"
    extra: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.method_params)

    def identity(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in _NOT_IDENTITY:
            d.pop(k)
        d["r"] = round(float(d["r"]), 10)
        d["method_params"] = sorted([list(p) for p in self.method_params])
        d["transition"] = [list(row) for row in self.transition] if self.transition else None
        d["extra"] = sorted([list(p) for p in self.extra])
        return d

    @property
    def trial_id(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def freeze_params(params: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((params or {}).items()))
