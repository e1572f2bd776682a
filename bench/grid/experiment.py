"""An experiment file's schema, its names checked with "did you mean", each cell's `TrialConfig.check` worded with the
file's key, and its expansion into trials.

Experiment files (`tune_configs/*.yaml`): validation against the schema and the expansion into trials (reading
them, and the command line's overrides: `bench.grid.files`).

An experiment is one grid of the paper's protocol on one dataset:

    name: fashion_mnist_case3          # names the MLflow experiment and the default results folder
    dataset: fashion_mnist             # see `bench datasets`
    noise: case3                       # a pattern or a list of patterns (grid axis)
    r: [0.0, 0.1, 0.2]                 # noise levels in [0, 1] (grid axis)
    seeds: [0, 1, 2, 3, 4]             # a list of seeds, or N for seeds 0..N-1 (grid axis)
    epochs: 20                         # optional: method-stage epochs (default: the method's schedule there)
    epochs_warmup: 20                  # optional: CE warm-start epochs (default: the paper's)
    train_subset: 10000                # optional: train on the first N training examples only
    device: cpu                        # cpu or cuda
    precision: fp32                    # optional: fp32 (default; TF32 on CUDA) or bf16 autocast (grid axis)
    numerics: native                   # optional: native (default) or portable (the same bits on any x86-64 CPU)
    resources: {cpu: 1, gpu: 0}        # per trial (cpu: its intra-op threads too); fractional GPUs share a device
    max_concurrent: 4                  # optional: at most this many trials at once
    model: linear_probe                # optional: the network, where not the dataset's (`bench.models` registry)
    model_args: {backbone: resnet18, weights: /path/resnet18.pth}  # optional: its options
    methods:                           # method -> its settings; a list is a grid axis
      ce: {}
      dmi: {lr: [1.0e-4, 1.0e-5, 1.0e-6], batch_size: [128, 256]}

Per-method settings: `lr`, `batch_size`, `epochs` (method stage) and the method's own hyper-parameters
(`bench methods` lists them; an omitted one keeps its paper's default). A list is a grid axis; a value that is
itself a list is written as a one-element list of it (`[[a, b]]`).

`bench run` may change a file from the command line (`--set r=[0.2,0.4] --set methods.dmi.lr=1e-5`, `--methods
dmi,ce`, `--seeds 0,1`): `bench.grid.files.Overrides` applies them to the file's mapping before validation, so
that the schema checks them as it checks the file. A grid changed that way gets its own name (`<name>-<hash of the
changed grid>`, or `--set name=NAME`): its results folder, MLflow experiment and report stay apart from the file's
own grid, whose per-cell selection would otherwise count the variation's settings too.

Validation has two layers. `parse_experiment` checks the file against its schema (`bench.schema.EXPERIMENT`: keys,
types, defaults, ranges, declared there once for files and `bench trial` alike); `check_names` checks dataset, noise,
method and hyper-parameter names against the registries, then each trial of the grid by the one check of a trial's
values (`bench.trial.TrialConfig.check`: hyper-parameters, levels, matrices, protocol, network, refusals), whose
error it words with the key of the file.
`bench.grid.files.load_experiment` does both.
Every error names the file, the key and what is allowed, and is a `UserError` (one line, exit code 2).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bench.config import UserError, did_you_mean
from bench.data import registry as dataset_registry
from bench.methods import registry as method_registry
from bench.schema import (
    EXPERIMENT,
    GRID_LIMIT,
    METHOD_STAGE,
    PROBABILITY,
    RESOURCES,
    SEED,
    TEXT,
    WHOLE_EXPERIMENT,
    Interval,
    Key,
    Value,
)
from bench.trial import TrialConfig, TrialError, freeze_params, grid_threads


@dataclass(frozen=True)
class Resources:
    """Per trial (defaults: `bench.schema.RESOURCES`)."""

    cpu: float
    gpu: float


@dataclass(frozen=True)
class MethodGrid:
    """One method and its grid: each axis maps a setting to the values it takes."""

    name: str
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def combinations(self) -> list[dict[str, Any]]:
        keys = [k for k, _ in self.axes]
        return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(v for _, v in self.axes))]


@dataclass(frozen=True)
class Experiment:
    name: str
    dataset: str
    noise: tuple[str, ...]
    r: tuple[float, ...]
    seeds: tuple[int, ...] | range  # a range: `seeds: N` too large to list (`_seed_count`)
    methods: tuple[MethodGrid, ...]
    # Optional in the file (defaults: `bench.schema.EXPERIMENT`).
    epochs: int | None
    epochs_warmup: int | None
    train_subset: int | None
    device: str
    resources: Resources
    max_concurrent: int | None
    transition: tuple[tuple[float, ...], ...] | None
    description: str
    source: str  # the file it came from (and the command-line overrides)
    overrides: tuple[str, ...] = ()  # the flags that changed the file's grid, as typed
    base_name: str = ""  # the file's own name, where overrides renamed the grid
    text: str = ""  # the grid as an experiment file: the file's text, or the changed grid where overrides changed it
    protocol: tuple[str, ...] = ("bench",)  # `bench.protocol` specs (grid axis)
    precision: tuple[str, ...] = ("fp32",)  # `bench.trial.PRECISIONS` (grid axis)
    model: str | None = None  # the network, where not the dataset's
    model_args: tuple[tuple[str, Any], ...] = ()  # its options
    numerics: str = "native"  # `bench.numerics`: one for the grid (its pins are its workers' environment)

    def size(self) -> int:
        """The number of trials, counted without expanding the grid."""
        cells = len(self.seeds) * len(self.noise) * len(self.r) * len(self.protocol) * len(self.precision)
        return sum(math.prod(len(values) for _, values in m.axes) * cells for m in self.methods)

    def trials(self) -> list[TrialConfig]:
        """The grid, one `TrialConfig` per trial.

        Ordered method-combination first, then seed, noise and r: the first pass through the grid meets each
        warm-start cell once, so concurrent trials train different warm starts instead of waiting on one."""
        out: list[TrialConfig] = []
        seen: set[str] = set()
        for _, trial in self.each_trial(self.seeds):
            if trial.trial_id not in seen:
                seen.add(trial.trial_id)
                out.append(trial)
        return out

    def each_trial(self, seeds: Sequence[int]) -> Iterator[tuple[MethodGrid, TrialConfig]]:
        """Each trial of `seeds` with the method grid it comes from, in the order of `trials` (repeats included)."""
        for method in self.methods:
            for combo in method.combinations():
                stage = {k: combo[k] for k in METHOD_STAGE if k in combo}
                params = freeze_params({k: v for k, v in combo.items() if k not in METHOD_STAGE})
                for seed in seeds:
                    for pattern in self.noise:
                        for r, spec, precision in itertools.product(self.r, self.protocol, self.precision):
                            yield method, TrialConfig(
                                dataset=self.dataset, method=method.name, noise=pattern, r=float(r), seed=seed,
                                lr=stage.get("lr"), batch_size=stage.get("batch_size"),
                                epochs=stage.get("epochs", self.epochs), epochs_warmup=self.epochs_warmup,
                                method_params=params, transition=self.transition,
                                train_subset=self.train_subset, device=self.device, experiment=self.name,
                                protocol=spec, precision=precision, model=self.model, model_args=self.model_args,
                                numerics=self.numerics, threads=grid_threads(self.resources.cpu, spec),
                            )


class _Checker:
    """Checks values against their declaration (`bench.schema`); its errors name the file and the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, problem: str) -> UserError:
        where = f"{self.source}: {key}: " if key else f"{self.source}: "
        return UserError(where + problem)

    def unknown(self, key: str, name: str, allowed: list[str], what: str = "key") -> UserError:
        return self.fail(key, f"unknown {what} {name!r}{did_you_mean(name, allowed)}; allowed: {', '.join(allowed)}")

    def value(self, key: str, value: Value, raw: Any) -> Any:
        problem = value.problem(raw)
        if problem:
            raise self.fail(key, problem)
        return float(raw) if value.kind is float else raw

    def key(self, key: str, spec: Key, raw: Any) -> Any:
        """A key's value by its declaration: the default where it is absent, a tuple of values for a grid axis."""
        if raw is None and not spec.required:
            return spec.default
        if spec.axis:
            return tuple(self.value(key, spec.value, v) for v in self.axis(key, raw))
        return self.value(key, spec.value, raw)

    def axis(self, key: str, value: Any) -> list[Any]:
        """A grid axis: a scalar or a non-empty list of distinct scalars."""
        values = value if isinstance(value, list) else [value]
        if not values:
            raise self.fail(key, "an empty list leaves nothing to run; give at least one value")
        if len({repr(v) for v in values}) != len(values):
            raise self.fail(key, f"repeats a value: {values}")
        return values

    def mapping(self, key: str, raw: Any, declared: dict[str, Key]) -> dict[str, Any]:
        """A mapping of declared keys (`resources`): unknown ones are an error, absent ones get their default."""
        for name in raw:
            if name not in declared:
                raise self.unknown(f"{key}.{name}", str(name), list(declared))
        return {name: self.key(f"{key}.{name}", spec, raw.get(name)) for name, spec in declared.items()}


def _resources(ck: _Checker, v: dict[str, Any]) -> Resources:
    """Per-trial resources, consistent with the device."""
    resources = Resources(**ck.mapping("resources", v["resources"], RESOURCES))
    device = v["device"]
    if resources.gpu > 1 and resources.gpu != int(resources.gpu):
        raise ck.fail("resources.gpu", f"a share above 1 must be a whole number of GPUs, got {resources.gpu}")
    if resources.gpu > 0 and not device.startswith("cuda"):
        raise ck.fail("resources.gpu", f"asks for a GPU share but device is {device!r}; set device: cuda")
    if device.startswith("cuda") and resources.gpu == 0:
        raise ck.fail("device", "cuda needs a GPU share per trial: set resources.gpu (e.g. 0.25 or 1)")
    return resources


def _transition(ck: _Checker, v: dict[str, Any]) -> tuple[tuple[float, ...], ...] | None:
    """An explicit T: square, each entry a probability, only with noise: transition."""
    noise, transition = v["noise"], None
    if v["transition"] is not None:
        rows = v["transition"]
        if not (rows and all(isinstance(row, list) for row in rows)):
            raise ck.fail("transition", f"expected {EXPERIMENT['transition'].value.words}")
        transition = tuple(tuple(ck.value(f"transition[{i}][{j}]", PROBABILITY, x) for j, x in enumerate(row))
                           for i, row in enumerate(rows))
        if any(len(row) != len(transition) for row in transition):
            raise ck.fail("transition", f"must be square, got {len(transition)} rows of lengths "
                          f"{sorted({len(row) for row in transition})}")
        if noise != ("transition",):
            raise ck.fail("transition", "an explicit matrix needs noise: transition (and only that pattern)")
    elif "transition" in noise:
        raise ck.fail("noise", "the pattern 'transition' needs a transition: matrix in the file")
    return transition


def _method_grids(ck: _Checker, v: dict[str, Any]) -> tuple[MethodGrid, ...]:
    """Each method's settings: stage keys checked here, its own hyper-parameters by `check_names`."""
    if not v["methods"]:
        raise ck.fail("methods", f"expected {EXPERIMENT['methods'].value.words}")
    methods = []
    for method, settings in v["methods"].items():
        method = ck.value("methods", TEXT, method)
        settings = {} if settings is None else settings
        if not isinstance(settings, dict):
            raise ck.fail(f"methods.{method}", f"expected a mapping of settings, got {type(settings).__name__}")
        axes = []
        for key, value in settings.items():
            path = f"methods.{method}.{key}"
            if key in WHOLE_EXPERIMENT:
                raise ck.fail(path, "is set for the whole experiment (it defines the shared warm-start cell), "
                              "not per method")
            if key in METHOD_STAGE:
                values = ck.key(path, METHOD_STAGE[key], value)
            else:  # the method's own hyper-parameters: checked against its declaration by `check_names`
                values = ck.axis(path, value)
                for x in values:
                    if isinstance(x, dict):
                        raise ck.fail(path, f"expected a scalar or a list, got a mapping {x!r}")
                values = tuple(tuple(x) if isinstance(x, list) else x for x in values)
            axes.append((str(key), values))
        methods.append(MethodGrid(method, tuple(axes)))
    return tuple(methods)


SEED_MAX = int(Interval.parse(SEED.range).high)


def _seed_count(ck: _Checker, count: int) -> tuple[int, ...] | range:
    """`seeds: N`, the seeds 0..N-1, checked before any list is built: a count that the grid-size guard refuses
    (`GRID_LIMIT`, without --yes) stays a range, so that its size is counted, not built (30,000,000 seeds took 115 s
    and 5 GB before the guard)."""
    if problem := Value(int, "[1, inf)").problem(count):
        raise ck.fail("seeds", problem)
    if count > SEED_MAX + 1:
        raise ck.fail("seeds", f"a count of seeds (0..N-1) must be at most {SEED_MAX + 1:,} (the largest seed + 1), "
                      f"got {count}; give a smaller count, or a list of seeds")
    return tuple(range(count)) if count <= GRID_LIMIT else range(count)


def parse_experiment(data: Any, source: str = "<config>") -> Experiment:
    """Check the schema (`bench.schema.EXPERIMENT`: keys, types, ranges) without looking at the registries."""
    ck = _Checker(source)
    required = [k for k, spec in EXPERIMENT.items() if spec.required]
    if not isinstance(data, dict):
        raise ck.fail("", f"expected a mapping of keys ({', '.join(required)}, ...), got {type(data).__name__}")
    for key in data:
        if key not in EXPERIMENT:
            raise ck.unknown(str(key), str(key), list(EXPERIMENT))
    missing = [k for k in required if k not in data]
    if missing:
        raise ck.fail(missing[0], f"missing required key; every experiment sets {', '.join(required)}")
    count = data["seeds"] if isinstance(data["seeds"], int) and not isinstance(data["seeds"], bool) else None
    if count is not None:  # N: seeds 0..N-1
        data = {**data, "seeds": 0}
    v = {key: ck.key(key, spec, data.get(key)) for key, spec in EXPERIMENT.items()}
    if count is not None:
        v["seeds"] = _seed_count(ck, count)

    resources = _resources(ck, v)
    transition = _transition(ck, v)
    methods = _method_grids(ck, v)
    return Experiment(
        name=v["name"], dataset=v["dataset"], noise=v["noise"], r=v["r"], seeds=v["seeds"], methods=methods,
        epochs=v["epochs"], epochs_warmup=v["epochs_warmup"], train_subset=v["train_subset"], device=v["device"],
        resources=resources, max_concurrent=v["max_concurrent"], transition=transition,
        description=v["description"], source=source, protocol=v["protocol"], precision=v["precision"],
        model=v["model"], model_args=freeze_params(v["model_args"]), numerics=v["numerics"],
    )


def _check_trials(ck: _Checker, exp: Experiment) -> None:
    """Each trial of the grid but its other seeds, by the one check of a trial's values (`TrialConfig.check`), a
    refusal worded with the key of the file that set the value (`_key`). `bench.grid.plan.Plan.make` checks every
    seed of the grid too, once its size was allowed."""
    transitions: set[tuple[Any, ...]] = set()
    for method, trial in exp.each_trial(exp.seeds[:1]):
        try:
            trial.check(transitions)
        except TrialError as e:
            raise ck.fail(_key(e.field, method), e.problem) from None


def _key(field: str, method: MethodGrid) -> str:
    """The key of an experiment file that sets a `TrialConfig` field (`TrialError.field`) of `method`'s trials."""
    if field == "method":
        return f"methods.{method.name}"
    if field.startswith("method_params.") or field in dict(method.axes):
        return f"methods.{method.name}.{field.removeprefix('method_params.')}"
    return {"experiment": "name", "seed": "seeds"}.get(field, field)


def check_names(exp: Experiment) -> None:
    """Check dataset, noise, method and hyper-parameter names against the registries, then the grid's trials by the
    one check of a trial's values (`_check_trials`) where the grid is within `GRID_LIMIT`."""
    ck = _Checker(exp.source)
    known = dataset_registry()
    if exp.dataset not in known:
        raise ck.unknown("dataset", exp.dataset, list(known), "dataset")
    dataset = known[exp.dataset]
    for pattern in exp.noise:
        if pattern not in dataset.accepted_noise():
            raise ck.unknown("noise", pattern, list(dataset.accepted_noise()), f"noise for {exp.dataset}:")
    if exp.model is None and exp.model_args:
        raise ck.fail("model_args", f"options of which network? set model too (the dataset's is {dataset.model})")
    known_methods = method_registry()
    for grid in exp.methods:
        if grid.name not in known_methods:
            raise ck.unknown("methods", grid.name, list(known_methods), "method")
        allowed = sorted(known_methods[grid.name].defaults)
        for key, _ in grid.axes:
            if key not in METHOD_STAGE and key not in allowed:
                raise ck.unknown(f"methods.{grid.name}.{key}", key, list(METHOD_STAGE) + allowed,
                                 f"setting of {grid.name}:")
    if exp.size() <= GRID_LIMIT:  # a larger grid is refused before any per-trial work (200,000 r values: 82 s of
        _check_trials(ck, exp)  # checks first), or run with --yes, when `Plan.make` checks every trial anyway
