"""CORES^2: a confidence-regularised loss and the sample sieve it implies.

Cheng, Zhu, Li, Gong, Sun, Liu. Learning with Instance-Dependent Label Noise: A Sample Sieve Approach. ICLR 2021.

With l(f(x), k) = -log softmax(h(x))_k the CE of label k and P(y~) the noisy labels' frequencies:

    l_CR(f(x), y~) = l(f(x), y~) - beta sum_k P(y~ = k) l(f(x), k)                   (confidence regulariser, Eq. 3)
    v_i = 1[ l(f(x_i), y~_i) - (1/C) sum_k l(f(x_i), k) <= 0 ]                        (the sieve, their Eq. 5 / code)
    loss = sum_i v_i l_CR(f(x_i), y~_i) / sum_i v_i

An example passes the sieve when its label costs no more than the average label: the model's prediction does not
contradict it. The regulariser rewards confident predictions, which is what makes the sieve separate clean from
corrupted examples (their Thm. 2). The paper's schedule ramps beta from 0 to 2 over epochs 10-40 of a run from
scratch and sieves from epoch 30; the CE warm start plays those early epochs, so the method stage runs beta = 2
with the sieve on throughout. The weights v_i are not differentiated. Selection uses the same sieved loss. As in
the paper's code the regulariser's CE is floored, -log(p_k + 1e-8), so its reward for confidence is bounded.
With two classes and a skewed prior that reward still dominates at beta = 2: on Fashion-MNIST bags vs clothes
(case3, r = 0.3, a 3-epoch warm start) the method stage collapsed to predicting "clothes" within 2 epochs, and so
did MR (to "negative"); beta is a parameter.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from bench.methods import Method

FLOOR = 1e-8  # the paper's code: -log(softmax + 1e-8) in the regulariser, which bounds its reward for confidence


def floored_losses(logits: torch.Tensor) -> torch.Tensor:
    """-log(softmax + 1e-8) for every label (..., B, C)."""
    return -(torch.softmax(logits.float(), dim=-1) + FLOOR).log()


def sieve(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """v_i: 1 where the label's CE is at most the mean (floored) CE over all labels (float mask, not
    differentiated)."""
    own = -torch.log_softmax(logits.detach().float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return (own - floored_losses(logits.detach()).mean(dim=-1) <= 0).float()


def cores_loss(logits: torch.Tensor, labels: torch.Tensor, beta: float, num_classes: int) -> torch.Tensor:
    own = -torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    prior = F.one_hot(labels, num_classes).float().mean(dim=-2, keepdim=True)  # (..., 1, C)
    regularised = own - beta * (floored_losses(logits) * prior).sum(dim=-1)
    v = sieve(logits, labels)
    return (v * regularised).sum(dim=-1) / v.sum(dim=-1).clamp_min(1.0)


class CORES(Method):
    """Confidence-regularised CE over the examples that pass the sieve."""

    name = "cores"
    title = "CORES² (confidence-regularised sample sieve)"
    paper = "Cheng, Zhu, Li, Gong, Sun, Liu. Learning with Instance-Dependent Label Noise: A Sample Sieve " \
        "Approach. ICLR 2021"
    defaults: dict[str, Any] = {"beta": 2.0}
    ranges: ClassVar[dict[str, str]] = {"beta": "[0, inf)"}

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return cores_loss(logits, labels, self.beta, self.num_classes)

    def judged_noisy(self, logits: torch.Tensor, labels: torch.Tensor, epoch: int,
                     index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sieve: flagged where the label's CE exceeds the mean (floored) CE over all labels; score, that
        excess."""
        own = -torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        excess = own - floored_losses(logits).mean(dim=-1)
        return excess, excess > 0
