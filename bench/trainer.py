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
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench import diagnostics, models, noise
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
    if name.startswith("cuda"):
        # TF32 on the matrix units for float32 convolutions (torch's default) and matrix products (not its default):
        # the protocol's numbers (accuracies, selection) do not need float32's last bits, and L_DMI's determinant
        # is computed in float64 anyway. BENCH_TF32=0 keeps full float32 (the exactness tests use it).
        tf32 = os.environ.get("BENCH_TF32", "1") != "0"
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    return torch.device(name)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on the training device without making the host wait (pinned memory, asynchronous copy)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


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
            order = to_device(torch.randperm(self.size, generator=generator), self.device)
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
    clean_train: torch.Tensor  # clean labels of the training split used (< 0: unknown), for the epoch diagnostics
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
    method_stage = dataset_cls.method_stage.with_overrides(
        lr=config.lr, batch_size=config.batch_size, epochs=config.epochs
    )
    warmup = dataset_cls.warmup.with_overrides(epochs=config.epochs_warmup)
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
    return Prepared(
        config=config, dataset=dataset, splits=splits, labels=labels, device=device,
        train=SplitLoader(train_split, noisy_train, dataset, device),
        train_eval=SplitLoader(train_split, noisy_train, dataset, device),
        val=SplitLoader(splits.val, labels.val, dataset, device),
        test=SplitLoader(splits.test, splits.test.y, dataset, device),
        warmup=warmup, method_stage=method_stage,
        clean_train=torch.as_tensor(train_split.y, dtype=torch.int64, device=device),
        epoch_eval=epoch_eval_enabled(dataset_cls),
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


def train_epoch(
    nets: list[nn.Module],
    step_loss: Callable[[list[nn.Module], Batch], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    loader: SplitLoader,
    batch_size: int,
    epoch: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """One pass over the training split; returns the mean training loss as a device tensor (NaN if it diverged).
    No value comes back to the host inside the loop."""
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
    return total / max(steps, 1)


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


WarmStartCache = Callable[[str, Callable[[], dict[str, torch.Tensor]]], dict[str, torch.Tensor]]


class Checkpoints(Protocol):
    """Per-epoch checkpoints of the method stage (the runner keeps them so that a retried trial resumes)."""

    def load(self) -> dict[str, Any] | None: ...

    def save(self, state: dict[str, Any]) -> None: ...


# -- the stage loop: one for the warm start and the method stage, solo or packed ---------------------------------
class Stage(Protocol):
    """K members trained side by side for one stage (a solo trial is K = 1; `bench.packed` stacks K trials).

    The loop in `run_stage` owns the protocol: epochs, divergence, selection on the whole noisy validation set,
    checkpoints and the epoch table. A stage owns the arithmetic: a training pass, the selection loss, keeping
    each member's best state, and its own state for checkpoints."""

    members: int

    def train_epoch(self, epoch: int) -> np.ndarray: ...  # (K,) mean training loss; NaN where diverged

    def validate(self) -> tuple[np.ndarray, np.ndarray]: ...  # (K,) selection losses, (K,) noisy-val accuracy %

    def keep_best(self, improved: np.ndarray) -> None: ...  # members whose current state is their new best

    def freeze(self, members: np.ndarray) -> None: ...  # diverged members: no further updates

    # Per member, the epoch's diagnostics (`bench.diagnostics.EPOCH_COLUMNS`; empty dicts where they are off).
    # `epoch` counts the method-stage epochs trained so far (0: the initial state).
    def diagnose(self, epoch: int) -> list[dict[str, float | None]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class StageResult:
    best_epoch: np.ndarray  # (K,) 0 = the initial state (a candidate only in the method stage)
    best_loss: np.ndarray  # (K,)
    status: list[str]  # "ok" or "diverged", per member
    errors: list[str]
    epochs: list[list[dict[str, Any]]]  # per member, one row per epoch
    seconds: float
    diagnose_seconds: float = 0.0  # spent on the per-epoch diagnostics (measuring, not part of the method's cost)


def run_stage(
    stage: Stage,
    name: str,
    epochs: int,
    log: Log,
    initial_is_candidate: bool,
    checkpoints: Checkpoints | None = None,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
) -> StageResult:
    """Train `epochs` epochs; after each, every member's selection loss on the whole noisy validation set, and
    each member keeps the state with the lowest. With `initial_is_candidate`, the state before the first epoch
    competes as epoch 0 (the method stage: the warm-started model, the paper's Algorithm 1). A member whose
    training loss stops being finite is frozen and recorded as diverged, keeping its best state so far; the
    others go on. With `checkpoints`, the whole loop state is saved after each epoch and resumed from."""
    k = stage.members
    rows: list[list[dict[str, Any]]] = [[] for _ in range(k)]
    active = np.ones(k, dtype=bool)
    status, errors = ["ok"] * k, [""] * k
    best_epoch = np.zeros(k, dtype=np.int64)
    best_loss = np.full(k, np.inf)
    first = 1
    diagnose_seconds = 0.0
    resume = checkpoints.load() if checkpoints else None
    if resume is not None and resume.get("members") == k and "stage" in resume:
        stage.load_state_dict(resume["stage"])
        best_epoch, best_loss = np.asarray(resume["best_epoch"]), np.asarray(resume["best_loss"])
        active, status, errors = np.asarray(resume["active"]), list(resume["status"]), list(resume["errors"])
        rows = resume["epochs"]
        first = resume["epoch"] + 1
        log(f"resumed from the checkpoint of epoch {resume['epoch']}")
    else:
        stage.keep_best(np.ones(k, dtype=bool))  # with no epoch trained (or none better), the initial state stands
        if initial_is_candidate:
            best_loss, _ = stage.validate()
            t0 = time.perf_counter()
            diagnosed = stage.diagnose(0)
            diagnose_seconds += time.perf_counter() - t0
            for m in range(k):
                rows[m].append(dict(stage=name, epoch=0, train_loss=None, val_loss=float(best_loss[m]),
                                    val_acc=None, seconds=0.0, **diagnosed[m]))
            log(f"{name}: epoch 0 (initial state) val loss "
                + " ".join(f"{v:.4f}" for v in best_loss[:8]) + (" ..." if k > 8 else ""))
    started = time.perf_counter()
    for epoch in range(first, epochs + 1):
        t0 = time.perf_counter()
        train_loss = stage.train_epoch(epoch - 1)
        diverged = active & ~np.isfinite(train_loss)
        for m in np.flatnonzero(diverged):
            status[m], errors[m] = "diverged", f"training loss became {train_loss[m]} in epoch {epoch}"
            log(f"{name} epoch {epoch}: member {m}: {errors[m]}; frozen, keeping its best checkpoint so far")
        if diverged.any():
            active &= ~diverged
            stage.freeze(diverged)
        if not active.any():
            break
        val_loss, val_acc = stage.validate()
        improved = active & (val_loss < best_loss)
        stage.keep_best(improved)
        best_loss = np.where(improved, val_loss, best_loss)
        best_epoch = np.where(improved, epoch, best_epoch)
        seconds = time.perf_counter() - t0
        diagnosed = stage.diagnose(epoch)
        diagnose_seconds += time.perf_counter() - t0 - seconds
        for m in np.flatnonzero(active):
            row = dict(stage=name, epoch=epoch, train_loss=float(train_loss[m]), val_loss=float(val_loss[m]),
                       val_acc=float(val_acc[m]), seconds=seconds, **diagnosed[m])
            rows[m].append(row)
            if on_epoch and k == 1:
                on_epoch(row)
        if checkpoints:
            checkpoints.save(dict(
                # Plain lists: checkpoints are read back with weights_only=True, which refuses numpy arrays.
                members=k, epoch=epoch, stage=stage.state_dict(), best_epoch=best_epoch.tolist(),
                best_loss=best_loss.tolist(), active=active.tolist(), status=status, errors=errors, epochs=rows,
            ))
        if k == 1:
            label = "epoch" if name == "method" else name
            log(f"{label} {epoch}/{epochs}  train {train_loss[0]:.4f}  val {val_loss[0]:.4f}  "
                f"noisy val acc {val_acc[0]:5.1f}%{'  *' if improved[0] else ''}  {seconds:.1f}s")
        else:
            log(f"{name} {epoch}/{epochs}  {int(active.sum())} of {k} members training, {int(improved.sum())} "
                f"improved; val loss min {np.nanmin(val_loss):.4f} max {np.nanmax(val_loss):.4f}  {seconds:.1f}s")
    return StageResult(best_epoch=best_epoch, best_loss=best_loss, status=status, errors=errors, epochs=rows,
                       seconds=time.perf_counter() - started, diagnose_seconds=diagnose_seconds)


class SoloStage:
    """One trial's networks with a torch optimizer: the `Stage` of a solo trial (K = 1)."""

    members = 1

    def __init__(
        self,
        p: Prepared,
        nets: list[nn.Module],
        schedule: Schedule,
        seed: int,
        step_loss: Callable[[list[nn.Module], Batch], torch.Tensor],
        selection_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        method: Method | None = None,
    ) -> None:
        self.p, self.nets, self.schedule = p, nets, schedule
        self.step_loss, self.selection_loss, self.method = step_loss, selection_loss, method
        self.generator = torch.Generator().manual_seed(seed)  # the data order
        self.optimizer = make_optimizer([q for net in nets for q in net.parameters()], schedule)
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(
            self.optimizer, list(schedule.milestones), schedule.gamma
        )
        self.best_state: dict[str, torch.Tensor] = {}

    def train_steps(self, epoch: int) -> torch.Tensor:
        return train_epoch(self.nets, self.step_loss, self.optimizer, self.p.train, self.schedule.batch_size,
                           epoch, self.generator)

    def train_epoch(self, epoch: int) -> np.ndarray:
        loss = self.train_steps(epoch)
        self.scheduler.step()
        if self.method is not None:
            self.method.end_epoch(epoch)
        return np.array([float(loss)])

    def validate(self) -> tuple[np.ndarray, np.ndarray]:
        logits = predict(self.nets[0], self.p.val)
        with torch.no_grad():
            loss = float(self.selection_loss(logits, self.p.val.labels))
        acc, _, _ = accuracy(logits, self.p.val.labels, self.p.dataset.num_classes)
        return np.array([loss]), np.array([acc])

    def keep_best(self, improved: np.ndarray) -> None:
        if improved[0]:
            self.best_state = copy.deepcopy(self.nets[0].state_dict())

    def freeze(self, members: np.ndarray) -> None:
        """A diverged solo trial ends its stage: nothing to freeze."""

    def diagnose(self, epoch: int) -> list[dict[str, float | None]]:
        if not self.p.epoch_eval:
            return [{}]
        train_logits, test_logits = predict(self.nets[0], self.p.train_eval), predict(self.nets[0], self.p.test)
        with torch.no_grad():
            judged = self.method.judged_noisy(train_logits, self.p.train.labels, epoch) if self.method else None
        return [diagnostics.epoch_numbers(train_logits, self.p.train.labels, self.p.clean_train, test_logits,
                                          self.p.test.labels, judged)]

    def state_dict(self) -> dict[str, Any]:
        return dict(
            nets=[net.state_dict() for net in self.nets], optimizer=self.optimizer.state_dict(),
            scheduler_epoch=self.scheduler.last_epoch, method=self.method.state_dict() if self.method else {},
            generator=self.generator.get_state(), torch_rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state_all() if self.p.device.type == "cuda" else None,
            best_state=self.best_state,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for net, net_state in zip(self.nets, state["nets"], strict=True):
            net.load_state_dict(net_state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.last_epoch = state["scheduler_epoch"]
        if self.method is not None:
            self.method.load_state_dict(state["method"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.best_state = state["best_state"]


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


def warm_start(p: Prepared, net_index: int, log: Log, epochs: list[dict[str, Any]],
               diagnose_seconds: list[float] | None = None) -> dict[str, torch.Tensor]:
    """Train one network with CE on the noisy labels; return the state with the lowest noisy-validation CE.
    Its epoch rows are appended to `epochs`, the seconds its diagnostics took to `diagnose_seconds`."""
    seed = warm_seed(p.config.seed, net_index)
    seed_everything(seed)
    net = build_model(p)
    stage = SoloStage(p, [net], p.warmup, seed, _ce_step, _ce)
    name = f"warmup{net_index}" if net_index else "warmup"
    result = run_stage(stage, name, p.warmup.epochs, log, initial_is_candidate=False)
    epochs.extend(result.epochs[0])
    if diagnose_seconds is not None:
        diagnose_seconds.append(result.diagnose_seconds)
    return stage.best_state


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
        def fresh(i: int = i) -> dict[str, torch.Tensor]:
            return warm_start(p, i, log, epochs, diagnose_seconds)

        state = warm_cache(warm_start_key(p, i), fresh) if warm_cache else fresh()
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
