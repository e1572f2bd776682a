"""SCE: symmetric cross entropy, CE plus the reverse cross entropy.

Wang, Ma, Chen, Luo, Yi, Bailey. Symmetric Cross Entropy for Robust Learning with Noisy Labels. ICCV 2019.

With p = softmax(h(x)) and q = onehot(y~), whose zeros are clamped to 1e-4 before the log in the reverse term
(log 0 := A = log 1e-4 = -9.21, as both released codes do; the paper's text writes A = -4), and p clipped below at
1e-7 in the forward term (their Keras code):

    l_ce  = -sum_k q_k log max(p_k, 1e-7) = min(-log p_y, -log 1e-7)
    l_rce = -sum_k p_k log q_k = -A sum_{k != y} p_k = -A (1 - p_y)                  (their Eq. 5)
    l_sce = alpha l_ce + beta l_rce                        (CIFAR-10: alpha = 0.1, beta = 1.0, their Sec. 4.1)

CIFAR-100 takes alpha = 6.0, beta = 0.1, the released code's CIFAR-100 command (train_models.py lines 222-224),
declared in CIFAR-100's file.

`log_zero` is A: -4 gives the paper text's loss.

Reference: YisenWang/symmetric_cross_entropy_for_noisy_labels (the authors' Keras code), loss.py
(`symmetric_cross_entropy`) and train_models.py (lines 213-225, CIFAR-10's and CIFAR-100's commands), commit
ec778df4a1; its PyTorch reimplementation, HanxunH/SCELoss-Reproduce, loss.py, commit c81fb33638, clamps the one-hot
the same way. Differences (`SymmetricCrossEntropy.differences`):
- No gradient-norm clip: the Keras code has none (the PyTorch reimplementation clips at 5, as NCE+RCE's configs do).
- Optimiser and schedule are the stage's — theirs: SGD 0.1 with momentum 0.9 and Keras' per-step decay, divided by 10
  at epochs 40 and 80 of 120 on CIFAR-10.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bench.methods import Method, one_hot, per_example_ce

LOG_ZERO = math.log(1e-4)  # the released codes: the one-hot clamped to [1e-4, 1] before its log
CE_CAP = -math.log(1e-7)  # their Keras code clips p to [1e-7, 1] before the forward term's log


def reverse_ce(logits: torch.Tensor, labels: torch.Tensor, log_zero: float, p_floor: float = 0.0) -> torch.Tensor:
    """Per-example RCE = -sum_k p_k log q_k with log q_k := `log_zero` off the label (and log 1 = 0 on it), p clamped
    below at `p_floor`: -log_zero sum_{k != y} max(p_k, p_floor)."""
    p = torch.softmax(logits.float(), dim=-1).clamp_min(p_floor)
    off_label = 1.0 - one_hot(labels, p.shape[-1], p.dtype)
    return -log_zero * (p * off_label).sum(dim=-1)


class SymmetricCrossEntropy(Method):
    """alpha CE + beta reverse CE."""

    name = "sce"
    title = "SCE (symmetric cross entropy)"
    paper = "Wang, Ma, Chen, Luo, Yi, Bailey. Symmetric Cross Entropy for Robust Learning with Noisy Labels. " \
        "ICCV 2019"
    reference = "YisenWang/symmetric_cross_entropy_for_noisy_labels, loss.py (symmetric_cross_entropy) and " \
        "train_models.py (lines 213-225), commit ec778df4a1"
    differences = (
        "no gradient-norm clip — the Keras code has none (its PyTorch reimplementation HanxunH/SCELoss-Reproduce "
        "clips at 5, as NCE+RCE's configs do)",
        "optimiser and schedule are the stage's — theirs: SGD 0.1 with momentum 0.9 and Keras' per-step decay, "
        "divided by 10 at epochs 40 and 80 of 120 on CIFAR-10",
    )
    defaults: dict[str, Any] = {"alpha": 0.1, "beta": 1.0, "log_zero": LOG_ZERO}
    ranges = {"alpha": "[0, inf)", "beta": "[0, inf)", "log_zero": "(-inf, 0)"}  # log 0 := a negative number

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        ce = per_example_ce(logits, labels).clamp_max(CE_CAP)
        return (self.alpha * ce + self.beta * reverse_ce(logits, labels, self.log_zero)).mean(-1)
