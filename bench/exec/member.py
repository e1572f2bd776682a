"""What every executor does for each member: its method set up, its outcome measured, its row.

What every executor does for each member of its unit (a trial, trained solo or in a pack), written once: its
method set up on its warm-started networks with the whole `StageContext`, its outcome measured from its selected
and its last model, and its result row made and written. An executor (`bench.exec.executors`) decides only how
the members train together.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bench.data import Dataset
from bench.exec.prepare import Prepared
from bench.exec.stage import StageResult, accuracy
from bench.methods import Method, StageContext, get_method
from bench.store.columns import Outcome
from bench.store.rows import make_row, write_trial


def new_method(p: Prepared) -> Method:
    """The trial's method with its parameters (not yet set up: that needs its networks)."""
    return get_method(p.config.method)(p.dataset.num_classes, dataset=p.config.dataset, **p.config.params)


def set_up_method(method: Method, p: Prepared, nets: list[nn.Module],
                  predict_train_of: Callable[[int], torch.Tensor]) -> None:
    """Set `method` up on its warm-started `nets`; `predict_train_of(i)`: network i's softmax on the training split
    (in evaluation mode), computed when the method asks."""
    method_cls = type(method)
    method.setup(StageContext(
        nets=nets, num_classes=p.dataset.num_classes, noisy_train=p.train.labels,
        predict_train=lambda: predict_train_of(0),
        true_transition=p.labels.transition if method_cls.uses_true_transition else None,
        device=p.device, epochs=p.method_stage.epochs, predict_train_of=predict_train_of,
        augment_train=augmenter(p), schedule=p.method_stage, noise_rate=p.labels.expected_rate,
        protocol=p.protocol,
    ))


def augmenter(p: Prepared) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """A fresh augmented view of training examples by index (`StageContext.augment_train`), where the dataset
    augments (overrides `train_transform`) and its training inputs are a tensor on the device."""
    if not p.train.tensor or type(p.dataset).train_transform is Dataset.train_transform:
        return None
    return lambda index: p.dataset.train_transform(p.train.x[index])


def measure(p: Prepared, method: Method, result: StageResult, member: int, best_logits: torch.Tensor,
            last_logits: torch.Tensor, warmup_test_acc: float, epochs: list[dict[str, Any]], warmup_s: float,
            method_s: float, diagnostics_s: float, pack_size: int, executor: str) -> Outcome:
    """A member's outcome: its method stage's selection and status (`result`, member `member`), the clean test
    accuracy of its selected model (`best_logits`) and of its last (`last_logits`), its epoch rows and costs, and
    the kind of unit that trained it (`executor`)."""
    classes = p.dataset.num_classes
    test_acc, test_bal, confusion = accuracy(best_logits, p.test.labels, classes)
    last_acc, last_bal, _ = accuracy(last_logits, p.test.labels, classes)
    return Outcome(
        status=result.status[member], best_epoch=int(result.best_epoch[member]),
        val_loss=float(result.best_loss[member]), warmup_test_acc=float(warmup_test_acc), test_acc=test_acc,
        test_bal_acc=test_bal, last_test_acc=last_acc, last_test_bal_acc=last_bal, confusion=confusion,
        estimated_transition=method.estimated_transition(), epochs=epochs, warmup_s=warmup_s, method_s=method_s,
        error=result.errors[member], pack_size=pack_size, executor=executor, networks=type(method).networks,
        diagnostics_s=diagnostics_s,
    )


def row_args(p: Prepared) -> dict[str, Any]:
    """The half of a result row (`bench.store.rows.make_row`) that the prepared trial gives."""
    c = p.config
    return dict(config=c, model=c.model_label(), labels=p.labels, lr=p.method_stage.lr,
                batch_size=p.method_stage.batch_size, epochs=p.method_stage.epochs, epochs_warmup=p.warmup.epochs,
                privileged=get_method(c.method).uses_true_transition)


def finish(p: Prepared, outcome: Outcome | None, wall_s: float, results: str | os.PathLike[str] | None,
           error: str = "", pack_wall_s: float | None = None) -> dict[str, Any]:
    """The member's result row (`outcome` None: it failed with `error`), written with its curves under `results`
    (None: not written)."""
    row = make_row(outcome=outcome, wall_s=wall_s, error=error, pack_wall_s=pack_wall_s, **row_args(p))
    if results is not None:
        write_trial(results, row, outcome.epochs if outcome is not None else [])
    return row
