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

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.config import UserError
from bench.data import Dataset, get_dataset
from bench.exec.events import Events
from bench.exec.prepare import (
    Prepared,
    build_model,
    method_seed,
    prepare,
    seed_everything,
    warm_seed,
    warm_start_key,
)
from bench.exec.stage import (
    Checkpoints,
    Log,
    SoloStage,
    accuracy,
    predict,
    run_stage,
)
from bench.exec.warmstart import WarmStart
from bench.methods import Batch, Method, StageContext, get_method
from bench.store.rows import make_row, write_trial
from bench.trial import TrialConfig


def _ce_step(nets: list[nn.Module], batch: Batch) -> torch.Tensor:
    return F.cross_entropy(nets[0](batch.x), batch.y)


# What a trial needs of a warm-start cache (`bench.exec.warmstart.WarmStartCache` is one): (key, train it) -> one.
WarmStartCache = Callable[[str, Callable[[], WarmStart]], WarmStart]


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


def warm_start(p: Prepared, net_index: int, log: Log,
               diagnose_seconds: list[float] | None = None, events: Events | None = None) -> WarmStart:
    """Train one network with CE on the noisy labels; return the state with the lowest noisy-validation CE and the
    stage's epoch rows (the cache keeps both, so that a trial's record does not depend on who trained its warm
    start). The seconds its diagnostics took go to `diagnose_seconds`."""
    seed = warm_seed(p, net_index)
    seed_everything(seed)
    net = build_model(p)
    stage = SoloStage(p, [net], p.warmup, seed, _ce_step, _ce)
    name = f"warmup{net_index}" if net_index else "warmup"
    result = run_stage(stage, name, p.warmup.epochs, log, initial_is_candidate=False, events=events,
                       selection=p.protocol.warmup_selection())
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
    events: Events | None = None,
    checkpoints: Checkpoints | None = None,
) -> Outcome:
    """Warm start, method stage, selection on the noisy validation set, clean test accuracy.

    With `checkpoints`, the method stage saves its whole state after each epoch (networks, optimiser, scheduler
    position, method state, random generators, selection so far) and resumes from the last one it finds, with the
    same numbers as an uninterrupted run."""
    c, ds = p.config, p.dataset
    method_cls = get_method(c.method)
    method: Method = method_cls(ds.num_classes, dataset=c.dataset, **c.params)
    epochs: list[dict[str, Any]] = []
    diagnose_seconds: list[float] = []

    started = time.perf_counter()
    nets = []
    for i in range(method_cls.networks):
        def fresh(i: int = i) -> WarmStart:
            return warm_start(p, i, log, diagnose_seconds, events)

        state, rows = warm_cache(warm_start_key(p, i), fresh) if warm_cache else fresh()
        epochs.extend(rows)
        net = build_model(p)
        net.load_state_dict(state)
        nets.append(net)
    warmup_s = time.perf_counter() - started
    warmup_test_acc, _, _ = accuracy(predict(nets[0], p.test), p.test.labels, ds.num_classes)
    log(f"warm start done: clean test acc {warmup_test_acc:.2f}%  ({warmup_s:.1f}s)")

    seed_everything(method_seed(p))
    method.setup(StageContext(
        nets=nets, num_classes=ds.num_classes, noisy_train=p.train.labels,
        predict_train=lambda: torch.softmax(predict(nets[0], p.train_eval), dim=1),
        true_transition=p.labels.transition if method_cls.uses_true_transition else None,
        device=p.device, epochs=p.method_stage.epochs,
        predict_train_of=lambda i: torch.softmax(predict(nets[i], p.train_eval), dim=1),
        augment_train=augmenter(p), schedule=p.method_stage, noise_rate=p.labels.expected_rate,
        protocol=p.protocol,
    ))
    stage = SoloStage(p, nets, p.method_stage, method_seed(p), method.train_loss, method.validation_loss,
                      method)
    result = run_stage(stage, "method", p.method_stage.epochs, log, initial_is_candidate=True,
                       checkpoints=checkpoints, events=events, selection=p.protocol.selection(c.method))
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


def augmenter(p: Prepared) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """A fresh augmented view of training examples by index (`StageContext.augment_train`), where the dataset
    augments (overrides `train_transform`) and its training inputs are a tensor on the device."""
    if not p.train.tensor or type(p.dataset).train_transform is Dataset.train_transform:
        return None
    return lambda index: p.dataset.train_transform(p.train.x[index])


def row_args(p: Prepared) -> dict[str, Any]:
    """The half of a result row (`bench.store.rows.make_row`) that the prepared trial gives, solo or packed."""
    c = p.config
    return dict(config=c, model=p.model, labels=p.labels, lr=p.method_stage.lr,
                batch_size=p.method_stage.batch_size, epochs=p.method_stage.epochs, epochs_warmup=p.warmup.epochs,
                privileged=get_method(c.method).uses_true_transition)


def run_trial(
    config: TrialConfig,
    data_root: str | os.PathLike[str],
    results: str | os.PathLike[str] | None = None,
    log: Log = print,
    warm_cache: WarmStartCache | None = None,
    events: Events | None = None,
    checkpoints: Checkpoints | None = None,
) -> dict[str, Any]:
    """Run one trial and return its result row; with `results`, also write it there.

    Bad input raises `UserError` before anything is written. A crash during training writes a row with
    status "failed" and the error, then re-raises.
    """
    started = time.perf_counter()
    p = prepare(config, data_root, log=log)
    args = row_args(p)
    log(f"trial {config.trial_id}: {config.dataset} / {config.method} / {config.noise} r={config.r} "
        f"seed={config.seed}  realised noise rate {100 * p.labels.noise_rate:.1f}%  on {p.device}")
    try:
        outcome = train(p, log=log, warm_cache=warm_cache, events=events, checkpoints=checkpoints)
    except UserError:
        raise
    except Exception as e:
        if results is not None:
            row = make_row(outcome=None, wall_s=time.perf_counter() - started,
                                       error=f"{type(e).__name__}: {e}", **args)
            write_trial(results, row, [])
        raise
    row = make_row(outcome=outcome, wall_s=time.perf_counter() - started, **args)
    if results is not None:
        write_trial(results, row, outcome.epochs)
    return row


def failed_row(config: TrialConfig, error: str, wall_s: float = 0.0) -> dict[str, Any]:
    """The row of a trial that stopped on `error` wherever it was (even before its data loaded): its configuration,
    status failed and the error."""
    warm, stage = config.schedules()
    return make_row(config=config, model=get_dataset(config.dataset).model, labels=None, outcome=None,
                    wall_s=wall_s, lr=stage.lr, batch_size=stage.batch_size, epochs=stage.epochs,
                    epochs_warmup=warm.epochs, privileged=get_method(config.method).uses_true_transition, error=error)
