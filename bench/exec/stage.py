"""The stage loop and what a stage trains with: a training pass, predictions and accuracy, a solo stage's optimiser, the
turns the loop takes after each step (a streams unit's members).

The stage loop of the paper's protocol and the pieces a stage trains with: a training pass, predictions,
accuracy and a solo stage's optimiser (torch.optim's Adam or SGD, `make_optimizer`; a pack's stacked step is
`bench.exec.packed.StackedOptimizer`); the device and the loaders are `bench.exec.prepare`'s.

`run_stage` trains K members side by side for one stage (the CE warm start or the method stage) and owns the
protocol's per-epoch decisions: divergence, selection on the whole noisy validation set, checkpoints and the epoch
table; it tells its progress as events (`bench.exec.events`), for K = 1 as for a pack, so that no one reads the log
back. A `Stage` owns the arithmetic: `SoloStage` here (one trial, K = 1), `bench.exec.packed.PackedStage` (K trials
stacked into one model). `bench.exec.trainer` runs a trial through it.

Turns: what the loop calls after each optimiser step, handed down from the unit's executor through `run_trial` (never
found by the loop on its own). A trial alone takes no turns (`ALONE`); the members of a streams unit
(`bench.exec.executors.streams`) hand the thread on to the next member there, so that it launches its step while this
one's runs on the GPU. A member may learn at its turn that its unit has ended (another member met an error a retry may
cure): `after_step` then raises `Stopped`, an ordinary exception that `run_trial` lets through as it lets `UserError`
through, writing no failed row, since the member did not fail: it resumes from its checkpoint when the unit is retried.
"""

from __future__ import annotations

import copy
import functools
import importlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from bench.config import Schedule, UserError
from bench.exec import diagnostics
from bench.exec.events import EpochRecord, Event, Events, Resumed, StageEnd, StageStart, floats, log_line
from bench.exec.prepare import Log, Prepared, SplitLoader, script_loader_draw, script_loader_order
from bench.methods import Batch, Method
from bench.protocol import BENCH_SELECTION, Selection


class Turns:
    """The hook of a trial that trains alone: after each step, nothing."""

    def after_step(self) -> None:
        return None


ALONE = Turns()


class Stopped(Exception):  # noqa: N818 - not the trial's error: its unit ended it at its turn
    """Raised at a trial's turn once its unit has ended; the trial writes no row (`run_trial`) and resumes from its
    checkpoint when the unit is retried."""


def _shortened(net: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    return getattr(net, "shortened", lambda x: x)  # `bench.models.Model.shortened`; a bare module reads it all


@torch.no_grad()
def predict(net: nn.Module, loader: SplitLoader, batch_size: int = 1024, rows: int | None = None) -> torch.Tensor:
    """Logits for a whole split (or its first `rows`), in evaluation mode (no dropout, BN running statistics), as
    float32, computed at the trial's precision (the loader's). A network that reads each `eval_group` rows as one
    batch gets one such group at a time, cut to what it reads (`Model.shortened`)."""
    was_training = net.training
    net.eval()
    shortened, out, done = _shortened(net), [], 0
    batch_size = getattr(net, "eval_group", None) or batch_size
    with loader.forward_precision([net]):
        for x, _, _ in loader.batches(batch_size, train=False):
            out.append(net(shortened(x)).float())
            done += len(x)
            if rows is not None and done >= rows:  # the chunks up to that row are those of the whole split
                break
    net.train(was_training)
    return torch.cat(out)[:rows]


def accuracy(logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[float, float, np.ndarray]:
    """(accuracy %, balanced accuracy %, confusion matrix with rows = true class)."""
    pred = logits.argmax(dim=1)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=labels.device)
    confusion.index_put_((labels, pred), torch.ones_like(labels), accumulate=True)
    confusion = confusion.cpu().numpy()
    support = confusion.sum(axis=1)
    recalls = np.diag(confusion)[support > 0] / support[support > 0]
    # Counted exactly (not a float32 mean), so that it equals the per-epoch test accuracy of the diagnostics.
    return 100.0 * float(np.trace(confusion)) / max(int(support.sum()), 1), 100.0 * float(recalls.mean()), confusion


def train_epoch(
    nets: list[nn.Module],
    step_loss: Callable[[list[nn.Module], Batch], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    loader: SplitLoader,
    batch_size: int,
    epoch: int,
    generator: torch.Generator,
    max_grad_norm: float | None = None,
    order: torch.Tensor | None = None,
    turns: Turns = ALONE,
) -> torch.Tensor:
    """One pass over the training split (shuffled from `generator`, or in `order`); returns the mean training loss as
    a device tensor (NaN if it diverged).
    With `max_grad_norm`, the gradient of the optimiser's parameters is clipped to that norm before each step.
    The networks' forward passes run at the trial's precision (the loader's), the loss from float32 logits.
    No value comes back to the host inside the loop. `turns.after_step()` follows each step (`Turns`)."""
    for net in nets:
        net.train()
    total = torch.zeros((), dtype=torch.float64, device=loader.device)
    steps = 0
    params = [q for group in optimizer.param_groups for q in group["params"]]
    shortened = _shortened(nets[0])
    # The precision's hooks are on the networks' forward passes only, so one set serves the whole epoch.
    with loader.forward_precision(nets):
        for x, y, idx in loader.batches(batch_size, train=True, generator=generator, order=order):
            loss = step_loss(nets, Batch(x=shortened(x), y=y, index=idx, epoch=epoch))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if max_grad_norm is not None:
                nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            total += loss.detach()
            steps += 1
            turns.after_step()
    return total / max(steps, 1)


class Checkpoints(Protocol):
    """Per-epoch checkpoints of the method stage (the runner keeps them so that a retried trial resumes)."""

    def load(self) -> dict[str, Any] | None: ...
    def save(self, state: dict[str, Any]) -> None: ...


# -- the stage loop: one for the warm start and the method stage, solo or packed ---------------------------------
class Stage(Protocol):
    """K members trained side by side for one stage (a solo trial is K = 1; `bench.exec.packed` stacks K trials).

    The loop in `run_stage` owns the protocol: epochs, divergence, selection on the whole noisy validation set,
    checkpoints and the epoch table. A stage owns the arithmetic: a training pass, the selection loss, keeping
    each member's best state, and its own state for checkpoints."""

    members: int

    def train_epoch(self, epoch: int) -> np.ndarray: ...  # (K,) mean training loss; NaN where diverged

    # (K,) selection losses, (K,) noisy-val accuracy %, on the rule's first validation examples (None: all), and (K,)
    # scores by the rule, lower is better (`Selection.own_pass`: from a pass of its own, the test set's or the CE's).
    def validate(self, selection: Selection = BENCH_SELECTION) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def keep_best(self, improved: np.ndarray) -> None: ...  # members whose current state is their new best
    def freeze(self, members: np.ndarray) -> None: ...  # diverged members: no further updates

    # Per member, the epoch's diagnostics (`bench.store.columns.DIAGNOSTIC_COLUMNS`; empty dicts where they are off).
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


@dataclass
class StageLoop:
    """What the stage loop carries from one epoch to the next (and a checkpoint keeps): which members still train,
    each member's best so far and its epoch table."""

    rows: list[list[dict[str, Any]]]
    active: np.ndarray
    status: list[str]
    errors: list[str]
    best_epoch: np.ndarray
    best_loss: np.ndarray
    best_score: np.ndarray
    epoch: int = 0  # the last epoch trained
    diagnose_seconds: float = 0.0

    @classmethod
    def fresh(cls, k: int) -> StageLoop:
        return cls(rows=[[] for _ in range(k)], active=np.ones(k, dtype=bool), status=["ok"] * k, errors=[""] * k,
                   best_epoch=np.zeros(k, dtype=np.int64), best_loss=np.full(k, np.inf),
                   best_score=np.full(k, np.inf))

    @classmethod
    def resumed(cls, saved: dict[str, Any]) -> StageLoop:
        return cls(rows=saved["epochs"], active=np.asarray(saved["active"]), status=list(saved["status"]),
                   errors=list(saved["errors"]), best_epoch=np.asarray(saved["best_epoch"]),
                   best_loss=np.asarray(saved["best_loss"]),
                   best_score=np.asarray(saved.get("best_score", saved["best_loss"])), epoch=saved["epoch"])

    def checkpoint(self, stage: Stage) -> dict[str, Any]:
        # Plain lists: checkpoints are read back with weights_only=True, which refuses numpy arrays.
        return dict(members=stage.members, epoch=self.epoch, stage=stage.state_dict(),
                    best_epoch=self.best_epoch.tolist(), best_loss=self.best_loss.tolist(),
                    best_score=self.best_score.tolist(), active=self.active.tolist(), status=self.status,
                    errors=self.errors, epochs=self.rows)

    def initial(self, stage: Stage, name: str, epochs: int, selection: Selection) -> EpochRecord:
        """The state before the first epoch as every member's best so far, recorded as epoch 0."""
        k = stage.members
        self.best_loss, _, self.best_score = stage.validate(selection)
        t0 = time.perf_counter()
        diagnosed = stage.diagnose(0)
        self.diagnose_seconds += time.perf_counter() - t0
        record = EpochRecord(stage=name, epoch=0, epochs=epochs, train_loss=(None,) * k,
                             val_loss=floats(self.best_loss), val_acc=(None,) * k, improved=(True,) * k,
                             active=(True,) * k, seconds=0.0)
        for m in range(k):
            self.rows[m].append({**record.member_row(m), **diagnosed[m]})
        return record

    def train(self, stage: Stage, name: str, epoch: int, epochs: int, selection: Selection,
              log: Log) -> EpochRecord | None:
        """One epoch: train, freeze the members that diverged, validate, keep each member's best; None where no
        member is left to train."""
        t0 = time.perf_counter()
        train_loss = stage.train_epoch(epoch - 1)
        diverged = self.active & ~np.isfinite(train_loss)
        for m in np.flatnonzero(diverged):
            self.status[m], self.errors[m] = "diverged", f"training loss became {train_loss[m]} in epoch {epoch}"
            log(f"{name} epoch {epoch}: member {m}: {self.errors[m]}; frozen, keeping its best checkpoint so far")
        if diverged.any():
            self.active &= ~diverged
            stage.freeze(diverged)
        if not self.active.any():
            return None
        val_loss, val_acc, score = stage.validate(selection)
        improved = self.active & selection.improves(score, self.best_score)
        stage.keep_best(improved)
        self.best_loss = np.where(improved, val_loss, self.best_loss)
        self.best_score = np.where(improved, score, self.best_score)
        self.best_epoch = np.where(improved, epoch, self.best_epoch)
        seconds = time.perf_counter() - t0
        diagnosed = stage.diagnose(epoch)
        self.diagnose_seconds += time.perf_counter() - t0 - seconds
        self.epoch = epoch
        record = EpochRecord(stage=name, epoch=epoch, epochs=epochs, train_loss=floats(train_loss),
                             val_loss=floats(val_loss), val_acc=floats(val_acc),
                             improved=tuple(bool(i) for i in improved), active=tuple(bool(a) for a in self.active),
                             seconds=seconds, test_acc=tuple(d.get("test_acc") for d in diagnosed))
        for m in np.flatnonzero(self.active):
            self.rows[m].append({**record.member_row(m), **diagnosed[m]})
        return record


def run_stage(
    stage: Stage,
    name: str,
    epochs: int,
    log: Log,
    initial_is_candidate: bool,
    checkpoints: Checkpoints | None = None,
    events: Events | None = None,
    selection: Selection = BENCH_SELECTION,
) -> StageResult:
    """Train `epochs` epochs; after each, every member's selection loss on the whole noisy validation set, and
    each member keeps the state with the lowest (or by another `selection` rule: the `authors` protocol's). With
    `initial_is_candidate`, the state before the first epoch competes as epoch 0 (the method stage: the
    warm-started model, the paper's Algorithm 1). A member whose training loss stops being finite is frozen and
    recorded as diverged, keeping its best state so far; the others go on. With `checkpoints`, the whole loop
    state is saved after each epoch and resumed from. The stage's progress goes to `events`
    (`bench.exec.events`), and each event's line to `log`."""

    def emit(event: Event) -> None:
        if (line := log_line(event)) is not None:
            log(line)
        if events is not None:
            events(event)

    k = stage.members
    emit(StageStart(stage=name, epochs=epochs, members=k))
    saved = checkpoints.load() if checkpoints else None
    if saved is not None and saved.get("members") == k and "stage" in saved:
        stage.load_state_dict(saved["stage"])
        loop = StageLoop.resumed(saved)
        emit(Resumed(stage=name, epoch=loop.epoch))
    else:
        loop = StageLoop.fresh(k)
        stage.keep_best(np.ones(k, dtype=bool))  # with no epoch trained (or none better), the initial state stands
        if initial_is_candidate and selection.initial:
            emit(loop.initial(stage, name, epochs, selection))
    started = time.perf_counter()
    for epoch in range(loop.epoch + 1, epochs + 1):
        record = loop.train(stage, name, epoch, epochs, selection, log)
        if record is None:
            break
        if checkpoints:
            checkpoints.save(loop.checkpoint(stage))
        emit(record)
    seconds = time.perf_counter() - started
    emit(StageEnd(stage=name, epoch=loop.epoch, seconds=seconds))
    return StageResult(best_epoch=loop.best_epoch, best_loss=loop.best_loss, status=loop.status, errors=loop.errors,
                       epochs=loop.rows, seconds=seconds, diagnose_seconds=loop.diagnose_seconds)


@functools.cache
def import_dynamo_apart() -> None:
    """torch.optim imports torch._dynamo on its first use, and that import keeps every frame then on the stack
    alive for the life of the process (seen with torch 2.14): a worker's first trial (its model, optimiser state
    and data, on the GPU) would never be freed. Imported from a thread of its own, no frame of ours is kept.
    Called before the first torch.optim optimiser and before torch.compile, the two that import it."""
    thread = threading.Thread(target=importlib.import_module, args=("torch._dynamo",))
    thread.start()
    thread.join()


def make_optimizer(params: list[nn.Parameter], schedule: Schedule) -> torch.optim.Optimizer:
    import_dynamo_apart()
    if schedule.optimizer == "adam":
        return torch.optim.Adam(params, lr=schedule.lr, weight_decay=schedule.weight_decay)
    if schedule.optimizer == "sgd":
        return torch.optim.SGD(params, lr=schedule.lr, momentum=schedule.momentum, weight_decay=schedule.weight_decay)
    raise UserError(f"unknown optimizer {schedule.optimizer!r}; use adam or sgd")


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
        turns: Turns = ALONE,
        script_passes: int = 0,
    ) -> None:
        self.p, self.nets, self.schedule, self.turns = p, nets, schedule, turns
        self.step_loss, self.selection_loss, self.method = step_loss, selection_loss, method
        self.script_passes = script_passes  # `script_stream`: the script's loader passes after each validation
        self.generator = torch.Generator().manual_seed(seed)  # the data order
        self.optimizer = make_optimizer([q for net in nets for q in net.parameters()], schedule)
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(
            self.optimizer, list(schedule.milestones), schedule.gamma
        )
        self.best_state: dict[str, torch.Tensor] = {}

    def train_steps(self, epoch: int) -> torch.Tensor:
        """One epoch's steps: with the method's own optimiser where it brings one for this epoch
        (`network_optimizer`), else with the stage's at the scheduled learning rate times the method's `lr_factor`
        (the scheduler and the checkpoints keep the scheduled rate); with the method's gradient clip."""
        method = self.method
        own = method.network_optimizer(epoch) if method is not None else None
        optimizer = own if own is not None else self.optimizer
        factor = method.lr_factor(epoch) if method is not None and own is None else 1.0
        scheduled = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] *= factor
        order = script_loader_order(self.p.train.size) if self.p.protocol.on("script_stream") else None
        try:
            return train_epoch(self.nets, self.step_loss, optimizer, self.p.train, self.schedule.batch_size, epoch,
                               self.generator, method.max_grad_norm() if method else None, order, self.turns)
        finally:
            for group, lr in zip(optimizer.param_groups, scheduled, strict=True):
                group["lr"] = lr

    def train_epoch(self, epoch: int) -> np.ndarray:
        if self.p.protocol.on("optimizer_per_epoch"):
            self.optimizer.state.clear()  # as a new optimiser: Adam's moments and step count, SGD's momentum gone
        loss = self.train_steps(epoch)
        self.scheduler.step()
        if self.method is not None:
            self.method.end_epoch(epoch)
        return np.array([float(loss)])

    def validate(self, selection: Selection = BENCH_SELECTION) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.p.protocol.on("script_stream"):
            for _ in range(1 + self.script_passes):  # the script's validation loader, then its test passes, draw as
                script_loader_draw()                 # they are iterated
        # The rule's first examples in split order (as the scripts' unshuffled loader gives its first batch), or all.
        first = selection.first if not selection.own_pass else None
        logits, labels = predict(self.nets[0], self.p.val, rows=first), self.p.val.labels[:first]
        with torch.no_grad():
            loss = np.array([float(self.selection_loss(logits, labels))])
        acc = np.array([accuracy(logits, labels, self.p.dataset.num_classes)[0]])
        if not selection.own_pass:
            return loss, acc, selection.score(loss, acc)
        own = (predict(self.nets[0], self.p.test), self.p.test.labels) if selection.oracle else (logits, labels)
        return loss, acc, np.array([selection.logit_score(*own)])

    def keep_best(self, improved: np.ndarray) -> None:
        if improved[0]:
            self.best_state = copy.deepcopy(self.nets[0].state_dict())

    def freeze(self, members: np.ndarray) -> None:
        """A diverged solo trial ends its stage: nothing to freeze."""

    def diagnose(self, epoch: int) -> list[dict[str, float | None]]:
        p = self.p
        if not p.epoch_eval:
            return [{}]
        train_logits, test_logits = predict(self.nets[0], p.diag_train), predict(self.nets[0], p.test)
        noisy = p.diag_train.labels
        with torch.no_grad():
            judged = self.method.judged_noisy(train_logits, noisy, epoch, p.diag_index) if self.method else None
        return [diagnostics.epoch_numbers(train_logits, noisy, p.diag_clean, test_logits, p.test.labels, judged)]

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
