"""One trial of the paper's protocol, in-process: a pure function of its `TrialConfig`.

    load the dataset -> inject seeded noise into train and validation -> CE warm start (selected on the noisy
    validation CE; cacheable) -> the method stage (the method's own loss; optimiser state kept across epochs)
    -> select the epoch with the lowest method loss on the whole noisy validation set (the warm-started model
    counts as epoch 0, as in the paper's Algorithm 1) -> clean test accuracy at the selected and the last epoch.

Small datasets live as tensors on the training device and are batched by index (no DataLoader workers);
a dataset that gives a `torch.utils.data.Dataset` is streamed through a DataLoader. Python, numpy and torch are
seeded from the trial seed; the method stage is re-seeded on its own, so a cached warm start gives the same
numbers as a fresh one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Subset

from bench import diagnostics, models, noise
from bench.config import Schedule, TrialConfig, UserError
from bench.data import Dataset, Split, Splits, get_dataset
from bench.methods import Batch, Method, StageContext, get_method
from bench.stage import (
    Checkpoints,
    Log,
    SoloStage,
    SplitLoader,
    accuracy,
    predict,
    resolve_device,
    run_stage,
)


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
    # The per-epoch diagnostics' training examples (`diagnostics.train_sample`): indices into the training split on
    # the device, those examples (unaugmented, noisy labels) and their clean labels (< 0: unknown).
    diag_index: torch.Tensor
    diag_train: SplitLoader
    diag_clean: torch.Tensor
    epoch_eval: bool  # record test accuracy, memorisation and detection every epoch (`epoch_eval_enabled`)


def epoch_eval_enabled(dataset: type[Dataset]) -> bool:
    """Whether trials evaluate the test and training sets after every epoch: the dataset's `epoch_eval` (on for
    the small sets, off for Clothing1M), overridden by BENCH_EPOCH_EVAL=1 or 0 where the trials run."""
    flag = os.environ.get("BENCH_EPOCH_EVAL", "")
    return dataset.epoch_eval if flag == "" else flag != "0"


def load_data(config: TrialConfig, data_root: str | os.PathLike[str]) -> tuple[Dataset, Splits]:
    """The dataset's splits, with tensor inputs moved to the training device once (a pack's members share them)."""
    dataset = get_dataset(config.dataset)(data_root)
    splits = dataset.load()
    device = resolve_device(config.device)
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
    dataset_cls = get_dataset(config.dataset)
    # Unknown methods and hyper-parameters fail here, before any data is loaded or anything written.
    get_method(config.method)(dataset_cls.num_classes, **config.params)
    if config.noise not in dataset_cls.accepted_noise():
        raise UserError(
            f"unknown noise {config.noise!r} for {config.dataset}; choose from "
            f"{', '.join(dataset_cls.accepted_noise())}"
        )
    if not 0.0 <= config.r <= 1.0:
        raise UserError(f"--r must lie in [0, 1], got {config.r}")
    device = resolve_device(config.device)
    warmup, method_stage = config.schedules()
    for label, value in (("--lr", method_stage.lr), ("--batch-size", method_stage.batch_size)):
        if value <= 0:
            raise UserError(f"{label} must be positive, got {value}")
    if method_stage.epochs < 0 or warmup.epochs < 0:
        raise UserError("--epochs and --epochs-warmup must be >= 0")

    dataset, splits = data if data is not None else load_data(config, data_root)
    for note in splits.notes:
        log(f"note: {note}")
    labels = draw_labels(config, splits)

    train_split, noisy_train = splits.train, labels.train
    if config.train_subset:
        train_split, noisy_train = train_split.subset(config.train_subset), noisy_train[: config.train_subset]
    epoch_eval = epoch_eval_enabled(dataset_cls)
    # Without the per-epoch diagnostics the sample is empty: it would otherwise hold up to 10,000 inputs on the device.
    sample = diagnostics.train_sample(len(noisy_train), config.dataset) if epoch_eval else np.arange(0)
    diag_split = splits.samples.get(len(noisy_train)) if len(sample) else None
    if diag_split is None:
        diag_split = (Split(train_split.x[torch.from_numpy(sample)], train_split.y[sample])
                      if isinstance(train_split.x, torch.Tensor) else Split(Subset(train_split.x, sample.tolist()),
                                                                             train_split.y[sample]))
        if len(sample):
            splits.samples[len(noisy_train)] = diag_split
    return Prepared(
        config=config, dataset=dataset, splits=splits, labels=labels, device=device,
        train=SplitLoader(train_split, noisy_train, dataset, device),
        train_eval=SplitLoader(train_split, noisy_train, dataset, device),
        val=SplitLoader(splits.val, labels.val, dataset, device),
        test=SplitLoader(splits.test, splits.test.y, dataset, device),
        warmup=warmup, method_stage=method_stage,
        diag_index=torch.as_tensor(sample, device=device),
        diag_train=SplitLoader(diag_split, noisy_train[sample], dataset, device),
        diag_clean=torch.as_tensor(diag_split.y, dtype=torch.int64, device=device),
        epoch_eval=epoch_eval,
    )


def draw_labels(config: TrialConfig, splits: Splits) -> noise.NoisyLabels:
    """The noisy training and validation labels of a trial's (dataset, noise, r, seed): seeded synthetic noise,
    or a dataset's human labels. `bench labels` exports exactly these (same hash as the result row)."""
    dataset_cls = get_dataset(config.dataset)
    c = dataset_cls.num_classes
    if dataset_cls.is_real_noise(config.noise):
        # Real human noise: the labels come from the dataset's own files.
        if config.noise not in splits.human_labels:
            raise UserError(f"{config.dataset}: no human labels named {config.noise!r}")
        noisy_train, noisy_val = splits.human_labels[config.noise]
        return noise.summarise(splits.train.y, noisy_train, noisy_val, c, None)
    explicit = np.asarray(config.transition) if config.transition is not None else None
    t = dataset_cls.transition(config.noise, config.r, explicit)
    return noise.inject(config.dataset, config.noise, config.r, config.seed, splits.train.y, splits.val.y, t)


def _ce_step(nets: list[nn.Module], batch: Batch) -> torch.Tensor:
    return F.cross_entropy(nets[0](batch.x), batch.y)


def warm_start_key(p: Prepared, net_index: int) -> str:
    """Identity of a CE warm start: shared by every method and hyper-parameter of its (data, noise, seed) cell."""
    c = p.config
    blob = json.dumps(
        [c.dataset, p.dataset.model, c.noise, round(c.r, 10), c.seed, c.transition, c.train_subset,
         p.labels.noise_hash, repr(p.warmup), net_index],
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def warm_seed(seed: int, net_index: int) -> int:
    """The seed of a warm start (initial weights, data order, dropout) of network `net_index`."""
    return seed * 1000 + net_index


def method_seed(seed: int) -> int:
    """The method stage's own seed: a cached warm start must not change what follows it."""
    return seed * 1000 + 999


def build_model(p: Prepared) -> nn.Module:
    return models.create(p.dataset.model, p.dataset.num_classes, p.device, **p.splits.model_args)


# A warm start: the network's state and its stage's epoch rows; the cache maps (key, train it) to one.
WarmStart = tuple[dict[str, torch.Tensor], list[dict[str, Any]]]
WarmStartCache = Callable[[str, Callable[[], WarmStart]], WarmStart]


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


def warm_start(p: Prepared, net_index: int, log: Log,
               diagnose_seconds: list[float] | None = None) -> WarmStart:
    """Train one network with CE on the noisy labels; return the state with the lowest noisy-validation CE and the
    stage's epoch rows (the cache keeps both, so that a trial's record does not depend on who trained its warm
    start). The seconds its diagnostics took go to `diagnose_seconds`."""
    seed = warm_seed(p.config.seed, net_index)
    seed_everything(seed)
    net = build_model(p)
    stage = SoloStage(p, [net], p.warmup, seed, _ce_step, _ce)
    name = f"warmup{net_index}" if net_index else "warmup"
    result = run_stage(stage, name, p.warmup.epochs, log, initial_is_candidate=False)
    if diagnose_seconds is not None:
        diagnose_seconds.append(result.diagnose_seconds)
    return stage.best_state, result.epochs[0]


@dataclass
class Outcome:
    """What a trial measured (the trainer's half of the result row)."""

    status: str
    best_epoch: int
    val_loss: float
    warmup_test_acc: float
    test_acc: float
    test_bal_acc: float
    last_test_acc: float
    last_test_bal_acc: float
    confusion: np.ndarray
    estimated_transition: np.ndarray | None
    epochs: list[dict[str, Any]]
    warmup_s: float
    method_s: float
    error: str = ""
    pack_size: int = 1
    networks: int = 1  # networks the method stage trains (Co-teaching, DivideMix: 2)
    diagnostics_s: float = 0.0  # seconds spent on the per-epoch diagnostics (measuring, not the method's cost)


def train(
    p: Prepared,
    log: Log = print,
    warm_cache: WarmStartCache | None = None,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    checkpoints: Checkpoints | None = None,
) -> Outcome:
    """Warm start, method stage, selection on the noisy validation set, clean test accuracy.

    With `checkpoints`, the method stage saves its whole state after each epoch (networks, optimiser, scheduler
    position, method state, random generators, selection so far) and resumes from the last one it finds, with the
    same numbers as an uninterrupted run."""
    c, ds = p.config, p.dataset
    method_cls = get_method(c.method)
    method: Method = method_cls(ds.num_classes, **c.params)
    epochs: list[dict[str, Any]] = []
    diagnose_seconds: list[float] = []

    started = time.perf_counter()
    nets = []
    for i in range(method_cls.networks):
        def fresh(i: int = i) -> WarmStart:
            return warm_start(p, i, log, diagnose_seconds)

        state, rows = warm_cache(warm_start_key(p, i), fresh) if warm_cache else fresh()
        epochs.extend(rows)
        net = build_model(p)
        net.load_state_dict(state)
        nets.append(net)
    warmup_s = time.perf_counter() - started
    warmup_test_acc, _, _ = accuracy(predict(nets[0], p.test), p.test.labels, ds.num_classes)
    log(f"warm start done: clean test acc {warmup_test_acc:.2f}%  ({warmup_s:.1f}s)")

    seed_everything(method_seed(c.seed))
    method.setup(StageContext(
        nets=nets, num_classes=ds.num_classes, noisy_train=p.train.labels,
        predict_train=lambda: torch.softmax(predict(nets[0], p.train_eval), dim=1),
        true_transition=p.labels.transition if method_cls.uses_true_transition else None,
        device=p.device, epochs=p.method_stage.epochs,
        predict_train_of=lambda i: torch.softmax(predict(nets[i], p.train_eval), dim=1),
    ))
    stage = SoloStage(p, nets, p.method_stage, method_seed(c.seed), method.train_loss, method.validation_loss,
                      method)
    result = run_stage(stage, "method", p.method_stage.epochs, log, initial_is_candidate=True,
                       checkpoints=checkpoints, on_epoch=on_epoch)
    epochs.extend(result.epochs[0])

    last_acc, last_bal, _ = accuracy(predict(nets[0], p.test), p.test.labels, ds.num_classes)
    nets[0].load_state_dict(stage.best_state)
    test_acc, test_bal, confusion = accuracy(predict(nets[0], p.test), p.test.labels, ds.num_classes)
    return Outcome(
        status=result.status[0], best_epoch=int(result.best_epoch[0]), val_loss=float(result.best_loss[0]),
        warmup_test_acc=warmup_test_acc, test_acc=test_acc, test_bal_acc=test_bal, last_test_acc=last_acc,
        last_test_bal_acc=last_bal, confusion=confusion, estimated_transition=method.estimated_transition(),
        epochs=epochs, warmup_s=warmup_s, method_s=result.seconds, error=result.errors[0],
        networks=method_cls.networks, diagnostics_s=sum(diagnose_seconds) + result.diagnose_seconds,
    )


def row_args(p: Prepared) -> dict[str, Any]:
    """The half of a result row (`bench.results.make_row`) that the prepared trial gives, solo or packed."""
    c = p.config
    return dict(config=c, model=p.dataset.model, labels=p.labels, lr=p.method_stage.lr,
                batch_size=p.method_stage.batch_size, epochs=p.method_stage.epochs, epochs_warmup=p.warmup.epochs,
                privileged=get_method(c.method).uses_true_transition)


def run_trial(
    config: TrialConfig,
    data_root: str | os.PathLike[str],
    results: str | os.PathLike[str] | None = None,
    log: Log = print,
    warm_cache: WarmStartCache | None = None,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    checkpoints: Checkpoints | None = None,
) -> dict[str, Any]:
    """Run one trial and return its result row; with `results`, also write it there.

    Bad input raises `UserError` before anything is written. A crash during training writes a row with
    status "failed" and the error, then re-raises.
    """
    from bench import results as results_mod

    started = time.perf_counter()
    p = prepare(config, data_root, log=log)
    args = row_args(p)
    log(f"trial {config.trial_id}: {config.dataset} / {config.method} / {config.noise} r={config.r} "
        f"seed={config.seed}  realised noise rate {100 * p.labels.noise_rate:.1f}%  on {p.device}")
    try:
        outcome = train(p, log=log, warm_cache=warm_cache, on_epoch=on_epoch, checkpoints=checkpoints)
    except UserError:
        raise
    except Exception as e:
        if results is not None:
            row = results_mod.make_row(outcome=None, wall_s=time.perf_counter() - started,
                                       error=f"{type(e).__name__}: {e}", **args)
            results_mod.write_trial(results, row, [])
        raise
    row = results_mod.make_row(outcome=outcome, wall_s=time.perf_counter() - started, **args)
    if results is not None:
        results_mod.write_trial(results, row, outcome.epochs)
    return row
