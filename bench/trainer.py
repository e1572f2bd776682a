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

import copy
import hashlib
import json
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench import models, noise
from bench.config import Schedule, TrialConfig, UserError
from bench.data import Dataset, Split, Splits, get_dataset
from bench.methods import Batch, Method, StageContext, get_method

Log = Callable[[str], None]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA device is available here; use --device cpu")
    if name not in {"cpu", "cuda"} and not name.startswith("cuda:"):
        raise UserError(f"--device must be cpu or cuda (or cuda:N), got {name!r}")
    return torch.device(name)


class SplitLoader:
    """Batches of one split on the training device: index slicing for tensors, a DataLoader for streams."""

    def __init__(self, split: Split, labels: np.ndarray, dataset: Dataset, device: torch.device) -> None:
        self.dataset, self.device = dataset, device
        self.workers = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        self.size = len(labels)
        self.labels = torch.as_tensor(labels, dtype=torch.int64, device=device)
        self.tensor = isinstance(split.x, torch.Tensor)
        self.x = split.x.to(device) if self.tensor else split.x

    def batches(
        self, batch_size: int, train: bool, generator: torch.Generator | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(inputs, labels, indices). Training batches are shuffled and the last partial batch is dropped,
        so that no step sees a tiny batch (a small batch misses classes, which makes L_DMI's U singular)."""
        if train:
            order = torch.randperm(self.size, generator=generator).to(self.device)
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
        for start, xb in zip(range(0, stop, batch_size), loader, strict=True):
            idx = order[start : start + batch_size]
            yield transform(xb.to(self.device, non_blocking=True)), self.labels[idx], idx


@torch.no_grad()
def predict(net: nn.Module, loader: SplitLoader, batch_size: int = 1024) -> torch.Tensor:
    """Logits for a whole split, in evaluation mode (no dropout, BN running statistics)."""
    was_training = net.training
    net.eval()
    out = torch.cat([net(x).float() for x, _, _ in loader.batches(batch_size, train=False)])
    net.train(was_training)
    return out


def accuracy(logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[float, float, np.ndarray]:
    """(accuracy %, balanced accuracy %, confusion matrix with rows = true class)."""
    pred = logits.argmax(dim=1)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=labels.device)
    confusion.index_put_((labels, pred), torch.ones_like(labels), accumulate=True)
    confusion = confusion.cpu().numpy()
    support = confusion.sum(axis=1)
    recalls = np.diag(confusion)[support > 0] / support[support > 0]
    return 100.0 * float((pred == labels).float().mean()), 100.0 * float(recalls.mean()), confusion


def make_optimizer(params: list[nn.Parameter], schedule: Schedule) -> torch.optim.Optimizer:
    if schedule.optimizer == "adam":
        return torch.optim.Adam(params, lr=schedule.lr, weight_decay=schedule.weight_decay)
    if schedule.optimizer == "sgd":
        return torch.optim.SGD(params, lr=schedule.lr, momentum=schedule.momentum, weight_decay=schedule.weight_decay)
    raise UserError(f"unknown optimizer {schedule.optimizer!r}; use adam or sgd")


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


def prepare(config: TrialConfig, data_root: str | os.PathLike[str]) -> Prepared:
    """Validate the config, load the data and draw the noisy labels (train and validation only)."""
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
    method_stage = dataset_cls.method_stage.with_overrides(
        lr=config.lr, batch_size=config.batch_size, epochs=config.epochs
    )
    warmup = dataset_cls.warmup.with_overrides(epochs=config.epochs_warmup)
    for label, value in (("--lr", method_stage.lr), ("--batch-size", method_stage.batch_size)):
        if value <= 0:
            raise UserError(f"{label} must be positive, got {value}")
    if method_stage.epochs < 0 or warmup.epochs < 0:
        raise UserError("--epochs and --epochs-warmup must be >= 0")

    dataset = dataset_cls(data_root)
    splits = dataset.load()
    for note in splits.notes:
        print(f"note: {note}")
    c = dataset_cls.num_classes
    if config.noise in dataset_cls.noise_patterns and noise.PATTERNS.get(config.noise) is None:
        # Real human noise: the labels come from the dataset's own files.
        if config.noise not in splits.human_labels:
            raise UserError(f"{config.dataset}: no human labels named {config.noise!r}")
        noisy_train, noisy_val = splits.human_labels[config.noise]
        labels = noise.summarise(splits.train.y, noisy_train, noisy_val, c, None)
    else:
        explicit = np.asarray(config.transition) if config.transition is not None else None
        t = noise.transition_matrix(config.noise, config.r, c, dataset_cls.accepted_noise(), explicit)
        labels = noise.inject(config.dataset, config.noise, config.r, config.seed, splits.train.y, splits.val.y, t)

    train_split, noisy_train = splits.train, labels.train
    if config.train_subset:
        train_split, noisy_train = train_split.subset(config.train_subset), noisy_train[: config.train_subset]
    return Prepared(
        config=config, dataset=dataset, splits=splits, labels=labels, device=device,
        train=SplitLoader(train_split, noisy_train, dataset, device),
        train_eval=SplitLoader(train_split, noisy_train, dataset, device),
        val=SplitLoader(splits.val, labels.val, dataset, device),
        test=SplitLoader(splits.test, splits.test.y, dataset, device),
        warmup=warmup, method_stage=method_stage,
    )


@dataclass
class EpochLog:
    rows: list[dict[str, Any]] = field(default_factory=list)


def train_epoch(
    nets: list[nn.Module],
    step_loss: Callable[[list[nn.Module], Batch], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    loader: SplitLoader,
    batch_size: int,
    epoch: int,
    generator: torch.Generator,
) -> float:
    """One pass over the training split; returns the mean training loss (NaN if it diverged)."""
    for net in nets:
        net.train()
    total = torch.zeros((), dtype=torch.float64, device=loader.device)
    steps = 0
    for x, y, idx in loader.batches(batch_size, train=True, generator=generator):
        loss = step_loss(nets, Batch(x=x, y=y, index=idx, epoch=epoch))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += loss.detach()
        steps += 1
    return float(total) / max(steps, 1)


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


def warm_start(p: Prepared, net_index: int, log: Log, epoch_log: EpochLog) -> dict[str, torch.Tensor]:
    """Train one network with CE on the noisy labels; return the state with the lowest noisy-validation CE."""
    c = p.config
    seed_everything(c.seed * 1000 + net_index)
    net = build_model(p)
    optimizer = make_optimizer(list(net.parameters()), p.warmup)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, list(p.warmup.milestones), p.warmup.gamma)
    generator = torch.Generator().manual_seed(c.seed * 1000 + net_index)
    best_state, best_loss = copy.deepcopy(net.state_dict()), float("inf")
    for epoch in range(1, p.warmup.epochs + 1):
        started = time.perf_counter()
        train_loss = train_epoch([net], _ce_step, optimizer, p.train, p.warmup.batch_size, epoch - 1, generator)
        scheduler.step()
        logits = predict(net, p.val)
        val_loss = float(F.cross_entropy(logits, p.val.labels))
        val_acc, _, _ = accuracy(logits, p.val.labels, p.dataset.num_classes)
        improved = val_loss < best_loss
        if improved:
            best_loss, best_state = val_loss, copy.deepcopy(net.state_dict())
        seconds = time.perf_counter() - started
        epoch_log.rows.append(dict(stage=f"warmup{net_index}" if net_index else "warmup", epoch=epoch,
                                   train_loss=train_loss, val_loss=val_loss, val_acc=val_acc, seconds=seconds))
        log(f"warm-up {epoch}/{p.warmup.epochs}  train CE {train_loss:.4f}  val CE {val_loss:.4f}  "
            f"val acc {val_acc:5.1f}%{'  *' if improved else ''}  {seconds:.1f}s")
    return best_state


def build_model(p: Prepared) -> nn.Module:
    return models.create(p.dataset.model, p.dataset.num_classes, **p.splits.model_args).to(p.device)


WarmStartCache = Callable[[str, Callable[[], dict[str, torch.Tensor]]], dict[str, torch.Tensor]]


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


class Checkpoints(Protocol):
    """Per-epoch checkpoints of the method stage (the runner keeps them so that a retried trial resumes)."""

    def load(self) -> dict[str, Any] | None: ...

    def save(self, state: dict[str, Any]) -> None: ...


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
    epoch_log = EpochLog()

    started = time.perf_counter()
    nets = []
    for i in range(method_cls.networks):
        def fresh(i: int = i) -> dict[str, torch.Tensor]:
            return warm_start(p, i, log, epoch_log)

        state = warm_cache(warm_start_key(p, i), fresh) if warm_cache else fresh()
        net = build_model(p)
        net.load_state_dict(state)
        nets.append(net)
    warmup_s = time.perf_counter() - started
    warmup_test_acc, _, _ = accuracy(predict(nets[0], p.test), p.test.labels, ds.num_classes)
    log(f"warm start done: clean test acc {warmup_test_acc:.2f}%  ({warmup_s:.1f}s)")

    # The method stage is seeded on its own: a cached warm start must not change what follows.
    seed_everything(c.seed * 1000 + 999)
    generator = torch.Generator().manual_seed(c.seed * 1000 + 999)
    method.setup(StageContext(
        nets=nets, num_classes=ds.num_classes, noisy_train=p.train.labels,
        predict_train=lambda: torch.softmax(predict(nets[0], p.train_eval), dim=1),
        true_transition=p.labels.transition if method_cls.uses_true_transition else None,
        device=p.device, epochs=p.method_stage.epochs,
        predict_train_of=lambda i: torch.softmax(predict(nets[i], p.train_eval), dim=1),
    ))
    params = [q for net in nets for q in net.parameters()]
    optimizer = make_optimizer(params, p.method_stage)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(
        optimizer, list(p.method_stage.milestones), p.method_stage.gamma
    )

    def validation_loss() -> float:
        with torch.no_grad():
            return float(method.validation_loss(predict(nets[0], p.val), p.val.labels))

    best_loss, best_epoch = validation_loss(), 0
    best_state = copy.deepcopy(nets[0].state_dict())
    epoch_log.rows.append(dict(stage="method", epoch=0, train_loss=None, val_loss=best_loss, val_acc=None,
                               seconds=0.0))
    log(f"method {c.method}: epoch 0 (warm start) val loss {best_loss:.4f}")
    status, error = "ok", ""
    first_epoch = 1
    resume = checkpoints.load() if checkpoints else None
    if resume is not None:
        for net, state in zip(nets, resume["nets"], strict=True):
            net.load_state_dict(state)
        optimizer.load_state_dict(resume["optimizer"])
        scheduler.last_epoch = resume["scheduler_epoch"]
        method.load_state_dict(resume["method"])
        generator.set_state(resume["generator"])
        torch.set_rng_state(resume["torch_rng"])
        if resume.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(resume["cuda_rng"])
        best_loss, best_epoch, best_state = resume["best_loss"], resume["best_epoch"], resume["best_state"]
        epoch_log.rows[:] = resume["epochs"]
        first_epoch = resume["epoch"] + 1
        log(f"resumed from the checkpoint of epoch {resume['epoch']}")
    method_started = time.perf_counter()
    for epoch in range(first_epoch, p.method_stage.epochs + 1):
        t0 = time.perf_counter()
        train_loss = train_epoch(
            nets, method.train_loss, optimizer, p.train, p.method_stage.batch_size, epoch - 1, generator
        )
        scheduler.step()
        method.end_epoch(epoch - 1)
        if not np.isfinite(train_loss):
            status, error = "diverged", f"training loss became {train_loss} in epoch {epoch}"
            log(f"epoch {epoch}: {error}; keeping the best checkpoint so far")
            break
        val_logits = predict(nets[0], p.val)
        with torch.no_grad():
            val_loss = float(method.validation_loss(val_logits, p.val.labels))
        val_acc, _, _ = accuracy(val_logits, p.val.labels, ds.num_classes)
        improved = val_loss < best_loss
        if improved:
            best_loss, best_epoch, best_state = val_loss, epoch, copy.deepcopy(nets[0].state_dict())
        seconds = time.perf_counter() - t0
        row = dict(stage="method", epoch=epoch, train_loss=train_loss, val_loss=val_loss, val_acc=val_acc,
                   seconds=seconds)
        epoch_log.rows.append(row)
        if on_epoch:
            on_epoch(row)
        if checkpoints:
            checkpoints.save(dict(
                epoch=epoch, nets=[net.state_dict() for net in nets], optimizer=optimizer.state_dict(),
                scheduler_epoch=scheduler.last_epoch, method=method.state_dict(), generator=generator.get_state(),
                torch_rng=torch.get_rng_state(),
                cuda_rng=torch.cuda.get_rng_state_all() if p.device.type == "cuda" else None,
                best_loss=best_loss, best_epoch=best_epoch, best_state=best_state, epochs=epoch_log.rows,
            ))
        log(f"epoch {epoch}/{p.method_stage.epochs}  train {train_loss:.4f}  val {val_loss:.4f}  "
            f"noisy val acc {val_acc:5.1f}%{'  *' if improved else ''}  {seconds:.1f}s")
    method_s = time.perf_counter() - method_started

    last_acc, last_bal, _ = accuracy(predict(nets[0], p.test), p.test.labels, ds.num_classes)
    nets[0].load_state_dict(best_state)
    test_acc, test_bal, confusion = accuracy(predict(nets[0], p.test), p.test.labels, ds.num_classes)
    return Outcome(
        status=status, best_epoch=best_epoch, val_loss=best_loss, warmup_test_acc=warmup_test_acc,
        test_acc=test_acc, test_bal_acc=test_bal, last_test_acc=last_acc, last_test_bal_acc=last_bal,
        confusion=confusion, estimated_transition=method.estimated_transition(), epochs=epoch_log.rows,
        warmup_s=warmup_s, method_s=method_s, error=error,
    )


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
    p = prepare(config, data_root)
    privileged = get_method(config.method).uses_true_transition
    row_args = dict(
        config=config, model=p.dataset.model, labels=p.labels, lr=p.method_stage.lr,
        batch_size=p.method_stage.batch_size, epochs=p.method_stage.epochs, epochs_warmup=p.warmup.epochs,
        privileged=privileged,
    )
    log(f"trial {config.trial_id}: {config.dataset} / {config.method} / {config.noise} r={config.r} "
        f"seed={config.seed}  realised noise rate {100 * p.labels.noise_rate:.1f}%  on {p.device}")
    try:
        outcome = train(p, log=log, warm_cache=warm_cache, on_epoch=on_epoch, checkpoints=checkpoints)
    except UserError:
        raise
    except Exception as e:
        if results is not None:
            row = results_mod.make_row(outcome=None, wall_s=time.perf_counter() - started,
                                       error=f"{type(e).__name__}: {e}", **row_args)
            results_mod.write_trial(results, row, [])
        raise
    row = results_mod.make_row(outcome=outcome, wall_s=time.perf_counter() - started, **row_args)
    if results is not None:
        results_mod.write_trial(results, row, outcome.epochs)
    return row
