"""NCE+RCE: an active-passive loss pairing normalized cross entropy with reverse cross entropy.

Ma, Huang, Wang, Romano, Erfani, Bailey. Normalized Loss Functions for Deep Learning with Noisy Labels.
ICML 2020.

With p = softmax(h(x)):

    l_nce = -log p_y / (-sum_k log p_k)                    (normalized CE, their Eq. 3: robust, but underfits)
    l_rce = -A sum_{k != y} max(p_k, 1e-7),  A = log 1e-4  (reverse CE with the one-hot clamped at 1e-4, as in SCE)
    l = alpha l_nce + beta l_rce                            (CIFAR-10: alpha = beta = 1, their configs)

and, as every config of theirs sets (`grad_bound: 5.0`), the norm of the network's gradient is clipped to 5 before
each step.

Reference: HanxunH/Active-Passive-Losses (the authors' code), loss.py (`NormalizedCrossEntropy`,
`ReverseCrossEntropy`, `NCEandRCE`), trainer.py (`clip_grad_norm_`) and configs/cifar10/*/nce+rce.yaml, commit
04bce53440. Differences (`NormalizedCEReverseCE.differences`):
- alpha and beta are CIFAR-10's on every dataset — their configs change them per dataset (MNIST beta = 10;
  CIFAR-100 alpha = 10, beta = 0.1).
- Optimiser and schedule are the stage's — theirs: SGD 0.01, momentum 0.9, weight decay 1e-4, cosine annealing over
  120 epochs on CIFAR-10.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bench.baselines.sce import LOG_ZERO, reverse_ce
from bench.methods import Method, at_label

P_FLOOR = 1e-7  # their ReverseCrossEntropy clamps p to [1e-7, 1]


def normalized_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-example -log p_y / sum_k (-log p_k)."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return at_label(log_p, labels) / log_p.sum(dim=-1)


class NormalizedCEReverseCE(Method):
    """alpha NCE + beta RCE (the APL pairing the paper recommends), with the gradient norm clipped."""

    name = "nce_rce"
    title = "NCE+RCE (active-passive loss)"
    paper = "Ma, Huang, Wang, Romano, Erfani, Bailey. Normalized Loss Functions for Deep Learning with Noisy " \
        "Labels. ICML 2020"
    reference = "HanxunH/Active-Passive-Losses, loss.py (NCEandRCE), trainer.py (clip_grad_norm_) and " \
        "configs/cifar10/*/nce+rce.yaml, commit 04bce53440"
    differences = (
        "alpha and beta are CIFAR-10's on every dataset — their configs change them per dataset (MNIST beta = 10; "
        "CIFAR-100 alpha = 10, beta = 0.1)",
        "optimiser and schedule are the stage's — theirs: SGD 0.01, momentum 0.9, weight decay 1e-4, cosine "
        "annealing over 120 epochs on CIFAR-10",
    )
    defaults: dict[str, Any] = {"alpha": 1.0, "beta": 1.0, "log_zero": LOG_ZERO, "grad_bound": 5.0}
    # log 0 := a negative number; grad_bound inf: no clip
    ranges = {"alpha": "[0, inf)", "beta": "[0, inf)", "log_zero": "(-inf, 0)", "grad_bound": "(0, inf]"}

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        nce = normalized_ce(logits, labels)
        return (self.alpha * nce + self.beta * reverse_ce(logits, labels, self.log_zero, P_FLOOR)).mean(-1)

    def max_grad_norm(self) -> float | None:
        return self.grad_bound if math.isfinite(self.grad_bound) else None
