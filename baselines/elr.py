"""ELR: early-learning regularisation with per-example temporal-ensemble targets.

Liu, Niles-Weed, Razavian, Fernandez-Granda. Early-Learning Regularization Prevents Memorization of Noisy Labels.
NeurIPS 2020.

Early in training a network fits the clean labels; ELR keeps it near its own early predictions. With
p_i = softmax(h(x_i)) clamped to [1e-4, 1 - 1e-4] (as in the paper's code; renormalised only inside the targets)
and a target t_i per training example,

    t_i <- beta t_i + (1 - beta) p_i / sum_k p_ik     (temporal ensembling, updated when x_i is in the batch; detached)
    l_i = CE(h(x_i), y~_i) + lambda log(1 - <p_i, t_i>)                                 (their Eq. 6)

The regulariser's gradient with respect to the logits pushes p_i toward t_i (their Lemma 4.3): it counters the
CE gradient on examples whose label the early model disagrees with. The paper's CIFAR-10 values (symmetric noise):
beta = 0.7, lambda = 3; CIFAR-100's config (ELR/config_cifar100.json lines 36-41): beta = 0.9, lambda = 7, declared in
CIFAR-100's file. The targets start at the warm-started model's predictions on the training set (the warm
start is the early-learning phase the targets are meant to remember). Selection uses CE: the validation set has no
targets.

Reference: shengliu66/ELR (the authors' code), ELR/model/loss.py (`elr_loss`), ELR/config_cifar10.json and
ELR/config_cifar100.json, commit 934af53434. Differences (`EarlyLearningRegularization.differences`):
- The targets start at the warm-started model's (clamped, renormalised) predictions — theirs at zero, in a run from
  scratch, where the moving average has forgotten that start by the end of early learning.
- beta and lambda are the symmetric-noise config's on every noise (CIFAR-10's, CIFAR-100's on CIFAR-100) — their
  CIFAR-10 asymmetric config has beta = 0.9, lambda = 1; one setting per dataset, as the grid's noise varies.
- Optimiser and schedule are the stage's — theirs: SGD 0.02 (momentum 0.9, weight decay 1e-3), cosine annealing
  with warm restarts every 10 epochs, 150 epochs on CIFAR-10.
- Selection by CE on the noisy validation set — their trainer monitors accuracy (`monitor: max val_my_metric`).
- ELR+ (two networks, weight averaging, mixup: their ELR_plus/) is not this method — it is another training recipe.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bench.methods import Batch, Method, StageContext


def clamped_softmax(logits: torch.Tensor) -> torch.Tensor:
    """softmax clamped to [1e-4, 1 - 1e-4] (not renormalised): the p of the regulariser."""
    return torch.softmax(logits.float(), dim=-1).clamp(1e-4, 1.0 - 1e-4)


def renormalised(p: torch.Tensor) -> torch.Tensor:
    """p / sum_k p_k: what enters the targets."""
    return p / p.sum(dim=-1, keepdim=True)


def elr_regulariser(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example log(1 - <p, t>), p the clamped softmax."""
    return torch.log(1.0 - (clamped_softmax(logits) * targets).sum(dim=-1))


class EarlyLearningRegularization(Method):
    """CE plus lambda log(1 - <p, t>) with moving-average targets t per training example."""

    name = "elr"
    title = "ELR (early-learning regularisation)"
    paper = "Liu, Niles-Weed, Razavian, Fernandez-Granda. Early-Learning Regularization Prevents Memorization " \
        "of Noisy Labels. NeurIPS 2020"
    reference = "shengliu66/ELR, ELR/model/loss.py (elr_loss), ELR/config_cifar10.json and " \
        "ELR/config_cifar100.json (lines 36-41), commit 934af53434"
    differences = (
        "the targets start at the warm-started model's (clamped, renormalised) predictions — theirs at zero, in a "
        "run from scratch, where the moving average has forgotten that start by the end of early learning",
        "beta and lambda are the symmetric-noise config's on every noise (CIFAR-10's, CIFAR-100's on CIFAR-100) — "
        "their CIFAR-10 asymmetric config has beta = 0.9, lambda = 1; one setting per dataset, as the grid's noise "
        "varies",
        "optimiser and schedule are the stage's — theirs: SGD 0.02 (momentum 0.9, weight decay 1e-3), cosine "
        "annealing with warm restarts every 10 epochs, 150 epochs on CIFAR-10",
        "selection by CE on the noisy validation set — their trainer monitors accuracy (monitor: max val_my_metric)",
        "ELR+ (two networks, weight averaging, mixup: their ELR_plus/) is not this method — it is another recipe",
    )
    defaults: dict[str, Any] = {"beta": 0.7, "lambda_": 3.0}
    ranges: ClassVar[dict[str, str]] = {"beta": "[0, 1)", "lambda_": "[0, inf)"}

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        self.targets: torch.Tensor | None = None  # t_i over the training set

    def setup(self, stage: StageContext) -> None:
        self.targets = renormalised(stage.predict_train().float().clamp(1e-4, 1.0 - 1e-4))

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().flatten(0, -2), labels.flatten(), reduction="none") \
            .view(labels.shape).mean(dim=-1)

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        logits = nets[0](batch.x)
        with torch.no_grad():
            t = self.beta * self.targets[batch.index] + (1.0 - self.beta) * renormalised(clamped_softmax(logits))
            self.targets[batch.index] = t
        ce = F.cross_entropy(logits.float(), batch.y)
        return ce + self.lambda_ * elr_regulariser(logits, t).mean()

    def state_dict(self) -> dict[str, Any]:
        return {"targets": None if self.targets is None else self.targets.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.targets = None if state["targets"] is None else state["targets"].clone()
