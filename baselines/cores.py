"""CORES^2: a confidence-regularised loss and the sample sieve it implies.

Cheng, Zhu, Li, Gong, Sun, Liu. Learning with Instance-Dependent Label Noise: A Sample Sieve Approach. ICLR 2021.

With l(f(x), k) = -log softmax(h(x))_k the CE of label k, its floored form l~(f(x), k) = -log(softmax(h(x))_k + 1e-8)
(the paper's code: it bounds the regulariser's reward for confidence) and pi the class prior:

    l_CR(f(x), y~) = l(f(x), y~) - beta sum_k pi_k l~(f(x), k)                         (confidence regulariser, Eq. 3)
    v_i = 1[ l(f(x_i), y~_i) - (1/C) sum_k l~(f(x_i), k) <= 0 ]                       (the sieve, their Eq. 5 / code)
    loss = sum_i v_i l_CR(f(x_i), y~_i) / sum_i v_i

An example passes the sieve when its label costs no more than the average label: the model's prediction does not
contradict it. The regulariser rewards confident predictions, which is what makes the sieve separate clean from
corrupted examples (their Thm. 2). As in their code, pi is the noisy-label frequency over the training examples the
sieve kept in the previous epoch (at the start, over the whole training set: their `noise_prior`), and the learning
rate is divided by 1 + beta. Their schedule ramps beta from 0 to 2 over epochs 10-40 of a run from scratch and
sieves from epoch 31; the CE warm start plays those early epochs, so the method stage runs beta = 2 with the sieve
on throughout. The weights v_i are not differentiated. Selection uses the same sieved loss, with the current pi.
With two classes and a skewed prior the reward for confidence still dominates at beta = 2: on Fashion-MNIST bags vs
clothes (case3, r = 0.3, a 3-epoch warm start) the method stage collapsed to predicting "clothes" within 2 epochs,
and so did MR (to "negative"); beta is a parameter.

Reference: UCSC-REAL/cores (the authors' code), loss.py (`loss_cores`, `f_beta`) and phase1.py (`noise_prior_cur`,
`adjust_learning_rate`), commit cf0945e2d5. Differences (`CORES.differences`):
- Phase 2 (semi-supervised training on the sieved data, their phase2/) is not run: this is the sieve and the
  regularised loss, CORES² proper.
- beta = 2 and the sieve on from the first method epoch — the CE warm start stands for their first 40 epochs (beta
  ramped from 0, no sieve before epoch 31).
- An example that no training batch holds (the last partial batch is dropped) counts as kept in the next prior —
  theirs visits every example.
- Optimiser and schedule are the stage's, divided by 1 + beta — theirs: SGD without momentum, 0.1 then 0.01 from
  epoch 50 of 100, batch 64.
- Selection by the sieved loss on the noisy validation set — theirs keeps the checkpoint of best test accuracy.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from bench.methods import Batch, Method, StageContext, at_label, one_hot

FLOOR = 1e-8  # the paper's code: -log(softmax + 1e-8) in the regulariser, which bounds its reward for confidence


def floored_losses(logits: torch.Tensor) -> torch.Tensor:
    """-log(softmax + 1e-8) for every label (..., B, C)."""
    return -(torch.softmax(logits.float(), dim=-1) + FLOOR).log()


def sieve(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """v_i: 1 where the label's CE is at most the mean (floored) CE over all labels (float mask, not
    differentiated)."""
    own = -at_label(torch.log_softmax(logits.detach().float(), dim=-1), labels)
    return (own - floored_losses(logits.detach()).mean(dim=-1) <= 0).float()


def cores_loss(logits: torch.Tensor, labels: torch.Tensor, beta: float, prior: torch.Tensor,
               v: torch.Tensor) -> torch.Tensor:
    """The sieved, confidence-regularised loss of logits (..., B, C) with prior (..., C) and sieve v (..., B)."""
    own = -at_label(torch.log_softmax(logits.float(), dim=-1), labels)
    regularised = own - beta * (floored_losses(logits) * prior.unsqueeze(-2)).sum(dim=-1)
    return (v * regularised).sum(dim=-1) / v.sum(dim=-1).clamp_min(1.0)


class CORES(Method):
    """Confidence-regularised CE over the examples that pass the sieve."""

    name = "cores"
    title = "CORES² (confidence-regularised sample sieve)"
    paper = "Cheng, Zhu, Li, Gong, Sun, Liu. Learning with Instance-Dependent Label Noise: A Sample Sieve " \
        "Approach. ICLR 2021"
    reference = "UCSC-REAL/cores, loss.py (loss_cores, f_beta) and phase1.py (noise_prior_cur, " \
        "adjust_learning_rate), commit cf0945e2d5"
    differences = (
        "phase 2 (semi-supervised training on the sieved data, their phase2/) is not run — the sieve and the "
        "regularised loss, CORES² proper",
        "beta = 2 and the sieve on from the first method epoch — the CE warm start stands for their first 40 epochs "
        "(beta ramped from 0, no sieve before epoch 31)",
        "an example that no training batch holds (the last partial batch is dropped) counts as kept in the next "
        "prior — theirs visits every example",
        "optimiser and schedule are the stage's, divided by 1 + beta — theirs: SGD without momentum, 0.1 then 0.01 "
        "from epoch 50 of 100, batch 64",
        "selection by the sieved loss on the noisy validation set — theirs keeps the checkpoint of best test accuracy",
    )
    defaults: dict[str, Any] = {"beta": 2.0}
    ranges: ClassVar[dict[str, str]] = {"beta": "[0, inf)"}
    # The prior, and this epoch's sieved-out counts per noisy class that the steps move: each member's own in a pack.
    member_state = ("prior", "sieved_out")

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        self.class_counts = self.prior = self.sieved_out = torch.zeros(num_classes)

    def setup(self, stage: StageContext) -> None:
        self.class_counts = one_hot(stage.noisy_train, self.num_classes, torch.float32).sum(dim=0)
        self.prior = self.class_counts / self.class_counts.sum()
        self.sieved_out = torch.zeros_like(self.class_counts)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return cores_loss(logits, labels, self.beta, self.prior, sieve(logits, labels))

    def logits_loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        v = sieve(logits, batch.y)
        self.sieved_out = self.sieved_out + ((1.0 - v).unsqueeze(-1) * one_hot(batch.y, self.num_classes, v.dtype)
                                             ).sum(dim=-2)
        return cores_loss(logits, batch.y, self.beta, self.prior, v)

    def end_epoch(self, epoch: int) -> None:
        """The next epoch's prior: the noisy-label frequencies of the examples the sieve kept."""
        kept = self.class_counts - self.sieved_out
        self.prior = kept / kept.sum().clamp_min(1.0)
        self.sieved_out = torch.zeros_like(self.class_counts)

    def lr_factor(self, epoch: int) -> float:
        return 1.0 / (1.0 + self.beta)

    def state_dict(self) -> dict[str, Any]:
        return {"prior": self.prior.clone(), "sieved_out": self.sieved_out.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prior, self.sieved_out = state["prior"].clone(), state["sieved_out"].clone()

    def judged_noisy(self, logits: torch.Tensor, labels: torch.Tensor, epoch: int,
                     index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sieve: flagged where the label's CE exceeds the mean (floored) CE over all labels; score, that
        excess."""
        own = -at_label(torch.log_softmax(logits.float(), dim=-1), labels)
        excess = own - floored_losses(logits).mean(dim=-1)
        return excess, excess > 0
