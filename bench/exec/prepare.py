"""What a trial needs before it trains: its data on the device, its noisy labels, its loaders, its seeds.

`prepare` checks a `TrialConfig`, loads the dataset's splits (tensor inputs moved to the training device once, so a
pack's members share them), draws the noisy training and validation labels (`draw_labels`, which `bench labels`
exports too) and builds the loaders that batch by index on the device. The seeds of the warm start and of the method
stage, the identity of a cached warm start, and the arithmetic of the forward passes (the trial's precision:
`autocast`, `forward_precision`) are decided here, once, for solo and packed trials alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn
from torch.utils.data import Subset

from bench import models, noise, numerics, protocol
from bench.config import Schedule, UserError
from bench.data import Dataset, Split, Splits, check_splits, get_dataset, worker_message
from bench.exec import diagnostics
from bench.trial import FP32, TrialConfig

Log = Callable[[str], None]


def resolve_device(name: str, full_float32: bool = False) -> torch.device:
    """The training device. On CUDA this is where precision fp32 is decided: float32 storage and accumulation, with
    TF32 matrix units for convolutions and matrix products (10 bits of mantissa in the products) unless BENCH_TF32=0
    or `full_float32` (the `full_float32` switch: the authors' GPUs had no TF32); on a CPU fp32 is plain float32."""
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA device is available here; use --device cpu")
    if name not in {"cpu", "cuda"} and not name.startswith("cuda:"):
        raise UserError(f"--device must be cpu or cuda (or cuda:N), got {name!r}")
    if name.startswith("cuda"):
        # TF32 on the matrix units for float32 convolutions (torch's default) and matrix products (not its default):
        # the protocol's numbers (accuracies, selection) do not need float32's last bits, and L_DMI's determinant
        # is computed in float64 anyway. BENCH_TF32=0 keeps full float32 (the exactness tests use it).
        # Set for every trial, so that a trial after a `full_float32` one in the same process gets TF32 back.
        tf32 = os.environ.get("BENCH_TF32", "1") != "0" and not full_float32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    return torch.device(name)


def trial_device(config: TrialConfig) -> torch.device:
    """A trial's training device, its float32 arithmetic as its protocol and its numerics have it (`resolve_device`:
    portable numerics compute in full float32 on CUDA, `bench.numerics`)."""
    full = config.resolved_protocol().on("full_float32") or config.numerics == numerics.PORTABLE
    return resolve_device(config.device, full)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on the training device without making the host wait (pinned memory, asynchronous copy)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class SplitLoader:
    """Batches of one split on the training device: index slicing for tensors, a DataLoader for streams."""

    def __init__(self, split: Split, labels: np.ndarray, dataset: Dataset, device: torch.device,
                 precision: str = FP32) -> None:
        self.dataset, self.device, self.precision = dataset, device, precision
        self.workers = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        self.size = len(labels)
        self.labels = torch.as_tensor(labels, dtype=torch.int64, device=device)
        self.tensor = isinstance(split.x, torch.Tensor)
        self.x = split.x.to(device) if self.tensor else split.x

    def forward_precision(self, nets: Iterable[nn.Module]) -> contextlib.AbstractContextManager[None]:
        """The trial's precision over the forward passes of `nets` on these batches (`forward_precision`): the
        training pass and `bench.exec.stage.predict` take it from their loader."""
        return forward_precision(nets, self.device, self.precision)

    def batches(
        self, batch_size: int, train: bool, generator: torch.Generator | None = None,
        order: torch.Tensor | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(inputs, labels, indices). Training batches are shuffled (from `generator`, or in the given `order`) and
        the last partial batch is dropped, so that no step sees a tiny batch (a small batch misses classes, which
        makes L_DMI's U singular)."""
        if train:
            order = to_device(torch.randperm(self.size, generator=generator) if order is None else order, self.device)
            stop = self.size - self.size % batch_size if self.size >= batch_size else self.size
        else:
            order = torch.arange(self.size, device=self.device)
            stop = self.size
        transform = self.dataset.train_transform if train else self.dataset.eval_transform
        if self.tensor:
            for start in range(0, stop, batch_size):
                idx = order[start : start + batch_size]
                yield transform(self.x[idx]), self.labels[idx], idx
            return
        loader = torch.utils.data.DataLoader(
            self.x, batch_size=batch_size, sampler=order[:stop].cpu().tolist(), num_workers=self.workers,
            pin_memory=self.device.type == "cuda", persistent_workers=False,
        )
        try:
            for start, xb in zip(range(0, stop, batch_size), loader, strict=True):
                idx = order[start : start + batch_size]
                yield transform(xb.to(self.device, non_blocking=True)), self.labels[idx], idx
        except UserError as e:
            raise UserError(worker_message(e)) from None


def script_loader_order(n: int) -> torch.Tensor:
    """The order in which a script's shuffled DataLoader (`shuffle=True`, no generator of its own) gives n examples,
    taking exactly the draws that loader takes from torch's global generator: its iterator's base seed, then, at the
    first batch, its RandomSampler's seed for a randperm (torch/utils/data/dataloader.py, sampler.py). Torch's own
    DataLoader takes them (the `script_stream` switch)."""
    return next(iter(torch.utils.data.DataLoader(range(n), batch_size=max(n, 1), shuffle=True)))


def script_loader_draw() -> None:
    """The one draw a script's unshuffled DataLoader takes from torch's global generator when iterated (its
    iterator's base seed): each validation and test pass of the script takes it (`script_stream`)."""
    iter(torch.utils.data.DataLoader(range(1)))


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[None]:
    """A block's arithmetic at `precision` (`bench.trial.PRECISIONS`): bf16, `torch.autocast` in bfloat16 on the
    device's type (convolutions and matrix products in bf16, float32 accumulation; CPU and CUDA alike); fp32, nothing
    (float32, on CUDA with TF32 matrix units: `resolve_device`)."""
    if precision == FP32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


@contextlib.contextmanager
def forward_precision(nets: Iterable[nn.Module], device: torch.device, precision: str) -> Iterator[None]:
    """Each forward pass of `nets` in the block at `precision` (`autocast`), its output handed on as float32: a
    method's loss, the selection and the accuracies are computed from float32 logits outside autocast, as in a pack
    (`bench.exec.packed`), however the method calls its networks. fp32 changes nothing (no hook is set)."""
    if precision == FP32:
        yield
        return
    entered: list[contextlib.AbstractContextManager[None]] = []

    def enter(_module: nn.Module, _args: object) -> None:
        entered.append(autocast(device, precision))
        entered[-1].__enter__()

    def leave(_module: nn.Module, _args: object, output: object) -> object:
        entered.pop().__exit__(None, None, None)  # also when the forward pass raised (`always_call`)
        return output.float() if isinstance(output, torch.Tensor) else output

    handles = [handle for net in nets for handle in (net.register_forward_pre_hook(enter),
                                                      net.register_forward_hook(leave, always_call=True))]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class Prepared:
    """Everything a trial needs before training: data, noisy labels, loaders."""

    config: TrialConfig
    dataset: Dataset
    splits: Splits
    labels: noise.NoisyLabels
    device: torch.device
    train: SplitLoader
    train_eval: SplitLoader  # the same training split, unaugmented, for FW's estimator
    val: SplitLoader
    test: SplitLoader
    warmup: Schedule
    method_stage: Schedule
    protocol: protocol.Protocol  # the switches of the authors' scripts this trial turns on (none: bench)
    model: str  # the network: the dataset's, or the one its scripts built (`script_model`)
    # The per-epoch diagnostics' training examples (`diagnostics.train_sample`): indices into the training split on
    # the device, those examples (unaugmented, noisy labels) and their clean labels (< 0: unknown).
    diag_index: torch.Tensor
    diag_train: SplitLoader
    diag_clean: torch.Tensor
    epoch_eval: bool  # record test accuracy, memorisation and detection every epoch (`epoch_eval_enabled`)

    @property
    def precision(self) -> str:
        """The arithmetic of the trial's forward passes (`bench.trial.PRECISIONS`); its loaders carry it too."""
        return self.config.precision

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The trial's precision over a block (`autocast`): a pack's stacked forward passes run under it."""
        return autocast(self.device, self.precision)


def epoch_eval_enabled(dataset: type[Dataset]) -> bool:
    """Whether trials evaluate the test and training sets after every epoch: the dataset's `epoch_eval` (on for
    the small sets, off for Clothing1M), overridden by BENCH_EPOCH_EVAL=1 or 0 where the trials run (`full`: on,
    over the whole training set, `epoch_eval_whole`)."""
    flag = os.environ.get("BENCH_EPOCH_EVAL", "")
    return dataset.epoch_eval if flag == "" else flag != "0"


def epoch_eval_whole() -> bool:
    """BENCH_EPOCH_EVAL=full: the diagnostics evaluate the whole training set, not `diagnostics.train_sample`'s."""
    return os.environ.get("BENCH_EPOCH_EVAL", "") == diagnostics.WHOLE


def load_data(config: TrialConfig, data_root: str | os.PathLike[str]) -> tuple[Dataset, Splits]:
    """The dataset's splits, with tensor inputs moved to the training device once (a pack's members share them)."""
    dataset = get_dataset(config.dataset)(data_root, trial_protocol=config.resolved_protocol())
    splits = check_splits(dataset, dataset.load())
    device = trial_device(config)
    # A model may change what it trains on (`bench.features`: a frozen backbone's cached features).
    splits = models.get_model(config.network()).prepare_data(dataset, splits, dict(config.model_args), device)
    for split in (splits.train, splits.val, splits.test):
        if isinstance(split.x, torch.Tensor):
            split.x = split.x.to(device)
    return dataset, splits


def prepare(
    config: TrialConfig, data_root: str | os.PathLike[str], data: tuple[Dataset, Splits] | None = None,
    log: Log = print,
) -> Prepared:
    """Validate the config, load the data (unless `data` gives it, from `load_data`) and draw the noisy labels
    (train and validation only)."""
    config.check()  # every value, before any data is loaded or anything written: the driver's own check
    # Its float order (threads; portable's pins checked in force), here where every executor's trials start.
    numerics.enter(config.numerics, config.threads, config.device)
    dataset_cls = get_dataset(config.dataset)
    device = trial_device(config)
    proto = config.resolved_protocol()
    warmup, method_stage = config.schedules()

    dataset, splits = data if data is not None else load_data(config, data_root)
    splits = check_splits(dataset, splits.for_noise(config.noise, config.r))
    for note in splits.notes:
        log(f"note: {note}")
    config.check_inputs(dataset, splits, log)  # the one rule that needs the data: before any label is drawn
    labels = draw_labels(config, dataset, splits)

    train_split, noisy_train = splits.train, labels.train
    if config.train_subset:
        train_split, noisy_train = train_split.subset(config.train_subset), noisy_train[: config.train_subset]
    epoch_eval = epoch_eval_enabled(dataset_cls)
    # Without the per-epoch diagnostics the sample is empty: it would otherwise hold its inputs on the device.
    sample = (diagnostics.train_sample(len(noisy_train), config.dataset, epoch_eval_whole()) if epoch_eval
              else np.arange(0))
    diag_split = splits.samples.get((len(noisy_train), len(sample))) if len(sample) else None
    if diag_split is None:
        diag_split = (Split(train_split.x[torch.from_numpy(sample)], train_split.y[sample])
                      if isinstance(train_split.x, torch.Tensor) else Split(Subset(train_split.x, sample.tolist()),
                                                                             train_split.y[sample]))
        if len(sample):
            splits.samples[(len(noisy_train), len(sample))] = diag_split
    return Prepared(
        config=config, dataset=dataset, splits=splits, labels=labels, device=device,
        train=SplitLoader(train_split, noisy_train, dataset, device, config.precision),
        train_eval=SplitLoader(train_split, noisy_train, dataset, device, config.precision),
        val=SplitLoader(splits.val, labels.val, dataset, device, config.precision),
        test=SplitLoader(splits.test, splits.test.y, dataset, device, config.precision),
        warmup=warmup, method_stage=method_stage, protocol=proto,
        model=config.network(),
        diag_index=torch.as_tensor(sample, device=device),
        diag_train=SplitLoader(diag_split, noisy_train[sample], dataset, device, config.precision),
        diag_clean=torch.as_tensor(diag_split.y, dtype=torch.int64, device=device),
        epoch_eval=epoch_eval,
    )


def draw_labels(config: TrialConfig, dataset: Dataset, splits: Splits) -> noise.NoisyLabels:
    """The noisy training and validation labels of a trial's (dataset, noise, r, seed): seeded synthetic noise (from
    T, or from each example's features for instance-dependent noise, which `dataset`, the loaded instance, gives),
    or a dataset's human labels. `bench labels` exports exactly these (same hash as the result row). Drawn once per
    label cell of `splits`; each caller gets its own arrays, since loaders may share their memory."""
    transition = None if config.transition is None else tuple(map(tuple, np.asarray(config.transition).tolist()))
    script = config.resolved_protocol().setting("script_noise")
    key = (config.noise, config.r, config.seed, transition) + ((tuple(sorted(script.items())),) if script else ())
    if key not in splits.noisy_labels:
        splits.noisy_labels[key] = _draw_labels(config, dataset, splits)
    drawn = splits.noisy_labels[key]
    return replace(drawn, train=drawn.train.copy(), val=drawn.val.copy())


def _draw_labels(config: TrialConfig, dataset: Dataset, splits: Splits) -> noise.NoisyLabels:
    dataset_cls = get_dataset(config.dataset)
    c = dataset_cls.num_classes
    if noise.is_instance_dependent(config.noise):
        parts = [(dataset.noise_features(split), split.y) for split in (splits.train, splits.val)]
        return noise.inject_instance_dependent(config.dataset, config.noise, config.r, config.seed, *parts, c)
    if dataset_cls.is_real_noise(config.noise):
        # Real human noise: the labels come from the dataset's own files.
        if config.noise not in splits.human_labels:
            raise UserError(f"{config.dataset}: no human labels named {config.noise!r}")
        noisy_train, noisy_val = splits.human_labels[config.noise]
        return noise.summarise(splits.train.y, noisy_train, noisy_val, c, None)
    explicit = np.asarray(config.transition) if config.transition is not None else None
    t = dataset_cls.transition(config.noise, config.r, explicit)
    script = config.resolved_protocol().setting("script_noise")
    if script:
        return noise.inject_as_script(config.seed, splits.train.y, splits.val.y, t, **script)
    return noise.inject(config.dataset, config.noise, config.r, config.seed, splits.train.y, splits.val.y, t)


def warm_start_key(p: Prepared, net_index: int) -> str:
    """Identity of a CE warm start: shared by every method and hyper-parameter of its (data, noise, seed) cell at
    one precision and float order."""
    c = p.config
    (dataset, *cell), extra = c.warm_start_cell()
    key = [dataset, c.model_label(), *cell, p.labels.noise_hash, repr(p.warmup), net_index, type(p.dataset).version]
    weights = c.weights()  # the files the network starts from, by content (none: the keys it always had)
    version = c.network_version()  # none while the network is at version 1: the keys it always had
    blob = json.dumps(key + list(extra) + ([weights] if weights else []) + version, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def warm_seed(p: Prepared, net_index: int) -> int:
    """The seed of a warm start (initial weights, data order, dropout) of network `net_index`: from the trial's
    seed, or the scripts' fixed torch seed (`fixed_torch_seed`). Under `script_stream` the first network's is the
    torch seed itself, the script's `torch.manual_seed(seed)` (declared where the script seeds nothing)."""
    if net_index == 0 and p.protocol.on("script_stream"):
        return p.protocol.torch_seed(p.config.seed)
    return p.protocol.torch_seed(p.config.seed) * 1000 + net_index


def method_seed(p: Prepared) -> int:
    """The method stage's own seed: a cached warm start must not change what follows it."""
    return p.protocol.torch_seed(p.config.seed) * 1000 + 999


def build_model(p: Prepared) -> nn.Module:
    """The trial's network, with its options (`TrialConfig.network_args`)."""
    return models.create(p.model, p.dataset.num_classes, p.device, **p.config.network_args(p.splits.model_args))
