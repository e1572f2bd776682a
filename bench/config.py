"""The trial configuration: every axis of one trial, its defaults, and its identity.

A trial is a pure function of its resolved `TrialConfig`. `trial_id` hashes its effective configuration (the
dataset's schedules and the method's defaults filled in, each number as its declared type), so relaunching a grid
recognises finished trials, a grid can grow without re-running anything, writing a default out (or 1e-4 as 0.0001)
is the same trial, and a changed default is a new one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class UserError(Exception):
    """Bad input (unknown name, impossible value, missing data): shown as one line, exit code 2."""


EXIT_USAGE = 2


def discover(base: type, places: tuple[str, ...]) -> dict[str, Any]:
    """The one plug-in mechanism (methods, datasets, models): every subclass of `base` with a `name`, defined in
    one of `places` (a module, or a package: each of its modules) or in a plug-in file, by name. Adding a method,
    a dataset or a model is adding one file: under `baselines/` or `datasets/`, or in a folder named by
    `$BENCH_PLUGINS` (folders separated by the path separator, every `*.py` in them is read)."""
    import importlib
    import pkgutil

    modules = []
    for place in places:
        module = importlib.import_module(place)
        modules.append(module)
        if hasattr(module, "__path__"):  # a package: its modules
            modules += [importlib.import_module(f"{place}.{m.name}") for m in pkgutil.iter_modules(module.__path__)]
    modules += plugin_modules()
    found: dict[str, Any] = {}
    for module in modules:
        for obj in vars(module).values():
            # Defined here, not imported (CIFAR-10N imports CIFAR-10's class, fw_oracle FW's).
            if isinstance(obj, type) and issubclass(obj, base) and obj.name and obj.__module__ == module.__name__:
                if obj.name in found and found[obj.name] is not obj:
                    raise UserError(f"two plug-ins are named {obj.name!r}: {found[obj.name].__module__} and "
                                    f"{module.__name__}; rename one")
                found[obj.name] = obj
    return dict(sorted(found.items()))


PLUGINS_ENV = "BENCH_PLUGINS"


def plugin_modules() -> list[Any]:
    """The modules of the plug-in folders in `$BENCH_PLUGINS`, each file imported once (under a name derived from its
    path, so that two folders may hold files of the same name)."""
    import importlib.util
    import sys

    modules = []
    for folder in filter(None, os.environ.get(PLUGINS_ENV, "").split(os.pathsep)):
        path = Path(folder).expanduser().absolute()
        if not path.is_dir():
            raise UserError(f"${PLUGINS_ENV}: {path} is not a folder of plug-in files")
        for file in sorted(path.glob("*.py")):
            name = f"bench_plugin_{hashlib.sha256(str(file).encode()).hexdigest()[:8]}_{file.stem}"
            if name not in sys.modules:
                spec = importlib.util.spec_from_file_location(name, file)
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module  # before running it: dataclasses and pickling look the module up
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
            modules.append(sys.modules[name])
    return modules


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


@dataclass(frozen=True)
class TrialConfig:
    """Everything that defines one trial. `None` means "the dataset's paper default" (`schedules`). The device and
    the experiment's name do not change a trial's numbers: they stay out of its identity."""

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

    def schedules(self) -> tuple[Schedule, Schedule]:
        """The (warm start, method stage) schedules this trial trains with: its dataset's paper schedules with this
        config's lr, batch size and epochs where it sets them."""
        from bench.data import get_dataset

        ds = get_dataset(self.dataset)
        return (ds.warmup.with_overrides(epochs=self.epochs_warmup),
                ds.method_stage.with_overrides(lr=self.lr, batch_size=self.batch_size, epochs=self.epochs))

    def effective_params(self) -> dict[str, Any]:
        """The method's hyper-parameters as it runs them: its declared defaults, overridden by this config's, each
        as its declared type (a float parameter given as 1 is 1.0)."""
        from bench.methods import get_method

        defaults = get_method(self.method).defaults
        return {key: _as_declared(defaults.get(key), value) for key, value in {**defaults, **self.params}.items()}

    def identity(self) -> dict[str, Any]:
        """What the trial's numbers depend on, in one canonical form: the effective configuration (`schedules`,
        `effective_params`, the dataset's model). A config naming an unknown dataset or method (refused before
        anything runs) is identified by its fields as given."""
        d: dict[str, Any] = dict(
            dataset=self.dataset, method=self.method, noise=self.noise, r=round(float(self.r), 10),
            seed=int(self.seed), train_subset=None if self.train_subset is None else int(self.train_subset),
            transition=[[float(x) for x in row] for row in self.transition] if self.transition else None,
            extra=sorted([list(p) for p in self.extra]),
        )
        try:
            from bench.data import get_dataset

            model = get_dataset(self.dataset).model
            warmup, stage = self.schedules()
            params = self.effective_params()
        except UserError:
            given = sorted([list(p) for p in self.method_params])
            return d | dict(lr=self.lr, batch_size=self.batch_size, epochs=self.epochs,
                            epochs_warmup=self.epochs_warmup, method_params=given)
        return d | dict(model=model, warmup=_canonical(warmup), method_stage=_canonical(stage),
                        method_params=sorted([key, value] for key, value in params.items()))

    @functools.cached_property
    def trial_id(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _as_declared(default: Any, value: Any) -> Any:
    """`value` as the type of its declared `default` (a float parameter given as an int), else as it is."""
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _canonical(schedule: Schedule) -> dict[str, Any]:
    """A schedule with every number as its declared type, so that equal schedules hash equal."""
    return dict(optimizer=schedule.optimizer, lr=float(schedule.lr), epochs=int(schedule.epochs),
                batch_size=int(schedule.batch_size), momentum=float(schedule.momentum),
                weight_decay=float(schedule.weight_decay), milestones=[int(m) for m in schedule.milestones],
                gamma=float(schedule.gamma))


def freeze_params(params: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((params or {}).items()))
