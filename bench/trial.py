"""The trial configuration: every axis of one trial, its defaults, and its identity.

A trial is a pure function of its resolved `TrialConfig`. `trial_id` hashes its effective configuration (the
dataset's schedules and the method's defaults filled in, each number as its declared type), so relaunching a grid
recognises finished trials, a grid can grow without re-running anything, writing a default out (or 1e-4 as 0.0001)
is the same trial, and a changed default is a new one.

A trial's precision (`PRECISIONS`), numerics and intra-op threads (`bench.numerics`: its float order) are part of its
identity only where they are not the defaults (fp32, native, one thread), so that every trial id from before they
existed stays what it was.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bench import models, protocol
from bench.config import Schedule, UserError
from bench.data import Dataset, Splits, get_dataset
from bench.download import weights_md5
from bench.methods import check_params, defaults_on, get_method
from bench.models import get_model
from bench.numerics import NATIVE, machine_problem
from bench.schema import TRIAL_FLAGS, check_name

# The arithmetic of a trial's forward passes (training and evaluation; `bench.exec.prepare.Prepared.autocast`):
# fp32, float32 (on CUDA with TF32 matrix units, `bench.exec.prepare.resolve_device`), or bf16, under bf16 autocast
# with the losses and the selection computed from float32 logits.
FP32 = "fp32"
PRECISIONS = (FP32, "bf16")
CHECKED_NETWORKS: set[tuple[Any, ...]] = set()  # (network, dataset, input shape, options) that `check_inputs` ran


class TrialError(UserError):
    """A value of a trial that `TrialConfig.check` refuses: the one line (as `bench trial`'s flags name it), the
    `TrialConfig` field it concerns (`field`; "method_params.KEY" for a hyper-parameter), and the `problem` in words
    that the field's own name introduces, so that an experiment file's error can name its key instead
    (`bench.grid.experiment.check_names`)."""

    def __init__(self, message: str, about: str, problem: str | None = None) -> None:
        super().__init__(message)
        self.field, self.problem = about, message if problem is None else problem


@contextlib.contextmanager
def _about(name: str, problem: Callable[[str], str] = str) -> Iterator[None]:
    """A `UserError` raised inside, as a `TrialError` about field `name` (`problem`: its words after the name)."""
    try:
        yield
    except TrialError:
        raise
    except UserError as e:
        raise TrialError(str(e), name, problem(str(e))) from None


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
    protocol: str = protocol.BENCH  # `bench.protocol`: bench, authors, or either with single switches changed
    precision: str = FP32  # `PRECISIONS`
    # The network, where not the dataset's (or its scripts', `script_model`): a registered model name, e.g.
    # linear_probe (`bench.features`), and its options (model_args, e.g. the probe's backbone and weights file).
    model: str | None = None
    model_args: tuple[tuple[str, Any], ...] = ()
    # Its float order (`bench.numerics`): the kernels (native, or portable's pins) and the intra-op threads it computes
    # with, set by the trial wherever it runs (a grid gives its trials their CPUs' worth; one under the authors').
    numerics: str = NATIVE
    threads: int = 1

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.method_params)

    def check(self, transitions: set[tuple[Any, ...]] | None = None) -> None:
        """Every rule a trial's values obey, checked here alone: by the driver before anything launches (`bench
        trial`, `bench labels`, each trial of a grid on loading and planning it, `--dry-run` included) and by the
        worker before it loads any data (`bench.exec.prepare.prepare`). A refused value is a `TrialError`: one line,
        exit code 2, naming the field. A new constrained field needs one rule here (or in `check_inputs`, where the
        rule needs the data loaded). `transitions` remembers the noise matrices already checked (a grid repeats
        them). The seed's rule reads the seed alone: a grid checks each setting once for all its seeds
        (`bench.grid.validate.check_trials`)."""
        with _about("experiment"):
            check_name("experiment", self.experiment)
        with _about("dataset"):
            dataset = get_dataset(self.dataset)
        with _about("method"):
            method = get_method(self.method)
        for key, value in self.method_params:
            with _about(f"method_params.{key}"):
                check_params(method, {key: value})
        with _about("noise"):
            dataset.check_noise(self.noise)
        with _about("r"):
            dataset.check_level(self.noise, self.r)
        with _about("protocol"):
            network = self.network()  # an unknown protocol spec or switch
        with _about("model"):
            models.check_args(network, dict(self.model_args))  # an unknown network or option
        if (method.uses_embeddings and hasattr(get_model(dataset.model), "forward_embedded")
                and not hasattr(get_model(network), "forward_embedded")):
            words = (f"cannot run on {self.dataset} under protocol {self.protocol}: it perturbs word embeddings "
                     f"(forward_embedded), which the scripts' model {network} does not offer; use --protocol bench, or "
                     "take script_model out (authors-script_model)")
            raise TrialError(f"method {self.method} {words}", "method", words)
        if refusal := method.refuses(dataset, self.noise):
            words = f"cannot run on noise {self.noise!r} of {self.dataset}: {refusal}"
            raise TrialError(f"method {self.method} {words}", "method", words)
        for name, (flag, value) in TRIAL_FLAGS.items():  # as the flags of `bench trial` name them
            given, most = getattr(self, name), dataset.split_sizes[0] if name == "train_subset" else None
            if given is not None and (problem := value.problem(given, most)):  # None: the dataset's paper default
                beyond = most is not None and value.problem(given) is None  # a subset larger than the training split
                words = f"{self.dataset} has {most:,} training examples, got {given:,}" if beyond else problem
                raise TrialError(f"{flag} {problem}", name, words)
        key = (self.dataset, self.noise, round(self.r, 10), self.transition)
        if dataset.has_transition(self.noise) and (transitions is None or key not in transitions):
            explicit = None if self.transition is None else _matrix(self.transition)
            with _about("r" if explicit is None else "transition", lambda e: e.removeprefix("--transition: ")):
                dataset.transition(self.noise, self.r, explicit)
            if transitions is not None:
                transitions.add(key)
        warmup, stage = self.schedules()  # the dataset's and the method's defaults, where the trial sets none
        for name, flag, number in (("lr", "--lr", stage.lr), ("batch_size", "--batch-size", stage.batch_size)):
            if number <= 0:
                raise TrialError(f"{flag} must be positive, got {number}", name, f"must be positive, got {number}")
        if stage.epochs < 0 or warmup.epochs < 0:
            raise TrialError("--epochs and --epochs-warmup must be >= 0", "epochs", "must be >= 0")
        if problem := machine_problem(self.numerics):
            raise TrialError(problem, "numerics", problem.removeprefix("numerics "))
        if self.threads != 1 and is_authors(self.protocol):
            words = (f"must be 1 under protocol {self.protocol}: the scripts' figures are one thread's float order "
                     f"(a grid's authors trials take one thread whatever their resources.cpu), got {self.threads}")
            raise TrialError(f"--threads {words}", "threads", words)

    def check_inputs(self, dataset: Dataset, splits: Splits, log: Callable[[str], None]) -> None:
        """The rule that needs the data loaded, which the worker asks once it has loaded them, before any label is
        drawn (`bench.exec.prepare.prepare`): a network other than the dataset's (`model`) takes the dataset's
        inputs: built on the CPU, one test input through the evaluation transform and the network, else one line.
        Where it takes `image_size` and the data does not set it (a VGG on another set's images), the inputs' size."""
        if self.model is None:
            return
        model, own = self.network(), dict(self.model_args)
        x = splits.test.x[:1] if isinstance(splits.test.x, torch.Tensor) else splits.test.x[0][None]
        x = dataset.eval_transform(x).cpu()
        cls = get_model(model)
        if "image_size" in cls.options() and "image_size" not in splits.model_args and x.dim() == 4:
            splits.model_args = {**splits.model_args, "image_size": int(x.shape[-1])}
        args = self.network_args(splits.model_args)
        for dropped in sorted(set(splits.model_args) - set(args) - set(own)):
            if dropped in type(dataset).weights_env:  # a weights file: say that this network does not start from it
                log(f"note: {dataset.name}'s {dropped} ({splits.model_args[dropped]}) are its own network's "
                    f"({dataset.model}), not {model}'s: {model} starts from random weights")
        key = (model, dataset.name, dataset.num_classes, tuple(x.shape), str(x.dtype), repr(sorted(args.items())))
        if key in CHECKED_NETWORKS:  # a pack's members: built and run once
            return
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                cls(num_classes=dataset.num_classes, **args).eval()(x)
            CHECKED_NETWORKS.add(key)
        except UserError:
            raise
        except Exception as e:  # a network for other inputs (a 1-channel CNN on colour images, a text CNN on pixels)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TrialError(f"--model {model} cannot take {dataset.name}'s inputs (shape {tuple(x.shape[1:])}, "
                             f"{x.dtype}): {first}; use a network made for them (its own is {dataset.model})",
                             "model") from None

    def network_args(self, data_args: dict[str, Any]) -> dict[str, Any]:
        """The options the trial's network is built with: those that the data sets (`Splits.model_args`) and it
        takes (a dataset's VGG image size or ResNet-50 weights mean nothing to another network), then the trial's own
        options (`model_args`) but those it reads when the data loads (`Model.data_options`)."""
        cls = get_model(self.network())
        taken = cls.options() - set(cls.data_options)
        own = dict(self.model_args)
        return {**{k: v for k, v in data_args.items() if k in taken}, **{k: v for k, v in own.items() if k in taken}}

    def describe(self) -> str:
        """The trial in words, as the dry run and the status lines name it: 'dmi lr=0.001  case3 r=0.4 seed=1'."""
        params = "".join(f" {k}={v}" for k, v in self.method_params)
        lr = f" lr={self.lr:g}" if self.lr is not None else ""
        bs = f" bs={self.batch_size}" if self.batch_size is not None else ""
        proto = "" if self.protocol == protocol.BENCH else f"  protocol {self.protocol}"
        precision = "" if self.precision == FP32 else f"  {self.precision}"
        order = "".join(("" if self.numerics == NATIVE else f"  {self.numerics}",
                         "" if self.threads == 1 else f"  {self.threads} threads"))
        return f"{self.method}{lr}{bs}{params}  {self.noise} r={self.r:g} seed={self.seed}{proto}{precision}{order}"

    def network(self) -> str:
        """The registered model this trial trains: its own (`model`), else its protocol's (the scripts' network,
        `script_model`), else its dataset's."""
        return self.model or self.resolved_protocol().setting("script_model", get_dataset(self.dataset).model)

    def model_label(self) -> str:
        """The network as the row's `model` column names it: with its options where it has any ("linear_probe(
        backbone=resnet18, weights=random)": random weights are marked there)."""
        args = ", ".join(f"{k}={v}" for k, v in self.model_args)
        return f"{self.network()}({args})" if args else self.network()

    def warm_start_cell(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """What of this configuration its CE warm start depends on, the one list of it: (the cell every warm start
        has: dataset, noise, r, seed, explicit T, training subset; what only a setting off bench's defaults adds: the
        warm-start switches of its protocol, its precision, its float order), so that the keys of the default
        settings stay those they always were. `bench.exec.prepare.warm_start_key` adds what preparing shows (the
        network, the labels' hash, the schedule), `bench.grid.plan.warm_cell` what the planner can see."""
        switches = self.resolved_protocol().warm_start_switches()  # the authors' warm start is not bench's
        extra = ((switches,) if switches else ()) + ((self.precision,) if self.precision != FP32 else ()) + \
            ((self.numerics,) if self.numerics != NATIVE else ()) + ((self.threads,) if self.threads != 1 else ())
        return (self.dataset, self.noise, round(self.r, 10), self.seed, self.transition, self.train_subset), extra

    def network_version(self) -> list[int]:
        """The network's `version` where a change has altered its numbers; none while it is 1 (the identity and warm
        start key every trial had before networks counted their changes)."""
        try:
            version = get_model(self.network()).version
        except UserError:  # an unknown network or dataset: refused before anything runs
            return []
        return [] if version == 1 else [version]

    def weights(self) -> dict[str, str]:
        """The md5 of each weights file the trial's network starts from, by option: the trial's own options that name
        one (`Model.weights_options`: the probe's backbone, ResNet-50's ImageNet weights), else the file its dataset
        hands the network from the environment (`Dataset.weights_env`: $BENCH_RESNET50_WEIGHTS for Food-101N's and
        Clothing1M's ResNet-50), where the network takes that option. Part of the identity and the row."""
        try:
            model, own, dataset = get_model(self.network()), dict(self.model_args), get_dataset(self.dataset)
        except UserError:  # an unknown network or dataset: refused before anything runs
            return {}
        files = {option: str(own[option]) for option in model.weights_options if option in own}
        for option, variable in dataset.weights_env.items():
            if option in model.weights_options and option not in model.data_options and option not in files \
                    and os.environ.get(variable):
                files[option] = os.environ[variable]
        return {option: "random" if path == "random" else weights_md5(path) for option, path in sorted(files.items())}

    def resolved_protocol(self) -> protocol.Protocol:
        """The switches this trial's protocol turns on, as its dataset declares them (`Dataset.authors_protocol`)."""
        return get_dataset(self.dataset).protocol(self.protocol)

    def schedules(self) -> tuple[Schedule, Schedule]:
        """The (warm start, method stage) schedules this trial trains with: its dataset's paper warm start, and its
        method's own method stage on that dataset (else the dataset's), with this config's lr, batch size and epochs
        where it sets them; the protocol's switches last (the script's warm-start batch; CE's row as the warm start
        alone: no CE method stage). Built once a trial: its check, its identity, the plan's work and the trainer ask
        them."""
        return self._schedules

    @functools.cached_property
    def _schedules(self) -> tuple[Schedule, Schedule]:
        ds, proto = get_dataset(self.dataset), self.resolved_protocol()
        warmup = ds.warmup.with_overrides(epochs=self.epochs_warmup,
                                          batch_size=proto.setting("warmup_batch_size"))
        stage = ds.stage_schedule(self.method, lr=self.lr, batch_size=self.batch_size, epochs=self.epochs)
        if proto.on("ce_is_warm_start") and self.method == "ce":
            stage = stage.with_overrides(epochs=0)
        return warmup, stage

    def effective_params(self) -> dict[str, Any]:
        """The method's hyper-parameters as it runs them: its defaults on this dataset (`bench.methods.defaults_on`:
        its own, its reference's for the dataset, the dataset file's for it), then this config's, each as its
        declared type (a float parameter given as 1 is 1.0). A default the trial supplies (`FromTrial`) is named by
        its words."""
        method = get_method(self.method)
        params = {**defaults_on(method, self.dataset), **self.params}
        return {key: _as_declared(method.defaults.get(key), value) for key, value in params.items()}

    def identity(self) -> dict[str, Any]:
        """What the trial's numbers depend on, in one canonical form: the effective configuration (`schedules`,
        `effective_params`, the dataset's model), and its precision, numerics and threads where they are not the
        defaults. A config naming an unknown
        dataset or method (refused before anything runs) is identified by its fields as given."""
        d: dict[str, Any] = dict(
            dataset=self.dataset, method=self.method, noise=self.noise, r=round(float(self.r), 10),
            seed=int(self.seed), train_subset=None if self.train_subset is None else int(self.train_subset),
            transition=[[float(x) for x in row] for row in self.transition] if self.transition else None,
            extra=sorted([list(p) for p in self.extra]),
        ) | ({} if self.precision == FP32 else dict(precision=self.precision)) \
            | ({} if self.numerics == NATIVE else dict(numerics=self.numerics)) \
            | ({} if self.threads == 1 else dict(threads=int(self.threads))) \
            | ({} if not self.model_args else dict(model_args=sorted([list(p) for p in self.model_args])))
        try:
            dataset, method = get_dataset(self.dataset), get_method(self.method)
            warmup, stage = self.schedules()
            params = self.effective_params()
        except UserError:
            given = sorted([list(p) for p in self.method_params])
            given_protocol = {} if self.protocol == protocol.BENCH else dict(protocol=self.protocol)
            return d | dict(lr=self.lr, batch_size=self.batch_size, epochs=self.epochs,
                            epochs_warmup=self.epochs_warmup, method_params=given) | given_protocol
        # A changed implementation is a new trial too: each plug-in's `version` counts its changes that alter numbers.
        proto = self.resolved_protocol()
        model = self.network()
        switches = {} if not proto.switches else \
            dict(switches={name: repr(switch.setting) for name, switch in sorted(proto.switches.items())})
        weights = self.weights()  # none: the identity every trial without a weights file always had
        d |= {} if not weights else dict(weights=weights)
        return d | dict(model=model, warmup=_canonical(warmup), method_stage=_canonical(stage),
                        method_params=sorted([key, value] for key, value in params.items()),
                        versions=[dataset.version, method.version, *self.network_version()]) | switches

    @functools.cached_property
    def trial_id(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def is_authors(spec: str) -> bool:
    """A protocol of the authors' scripts (`authors`, `authors-SWITCH`): their figures are one thread's float order."""
    return str(spec).strip().startswith(protocol.AUTHORS)


def grid_threads(cpus: float, spec: str) -> int:
    """The intra-op threads of a grid's trial: its CPUs' worth (resources.cpu, at least one), one under the authors'
    protocol."""
    return 1 if is_authors(spec) else max(1, int(cpus))


def _matrix(rows: tuple[tuple[float, ...], ...]) -> np.ndarray:
    return np.asarray(rows, dtype=np.float64)


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
