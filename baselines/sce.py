"""SCE: symmetric cross entropy, CE plus the reverse cross entropy.

Wang, Ma, Chen, Luo, Yi, Bailey. Symmetric Cross Entropy for Robust Learning with Noisy Labels. ICCV 2019.

With p = softmax(h(x)) and q = onehot(y~), where log 0 is clipped to A = -4 in the reverse term:

    l_ce  = -sum_k q_k log p_k = -log p_y
    l_rce = -sum_k p_k log q_k = -A (1 - p_y)                                      (their Eq. 5, A = -4)
    l_sce = alpha l_ce + beta l_rce                        (CIFAR-10: alpha = 0.1, beta = 1.0, their Sec. 4.1)
"""

from __future__ import annotations

from typing import Any

import torch

from bench.methods import Method, at_label, per_example_ce


def reverse_ce(logits: torch.Tensor, labels: torch.Tensor, log_zero: float) -> torch.Tensor:
    """Per-example RCE = -sum_k p_k log q_k with log 0 := `log_zero`, i.e. -log_zero (1 - p_y)."""
    p_y = at_label(torch.softmax(logits.float(), dim=-1), labels)
    return -log_zero * (1.0 - p_y)


class SymmetricCrossEntropy(Method):
    """alpha CE + beta reverse CE."""

    name = "sce"
    title = "SCE (symmetric cross entropy)"
    paper = "Wang, Ma, Chen, Luo, Yi, Bailey. Symmetric Cross Entropy for Robust Learning with Noisy Labels. " \
        "ICCV 2019"
    defaults: dict[str, Any] = {"alpha": 0.1, "beta": 1.0, "log_zero": -4.0}
    ranges = {"alpha": "[0, inf)", "beta": "[0, inf)", "log_zero": "(-inf, 0)"}  # log 0 := a negative number

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        ce = per_example_ce(logits, labels)
        return (self.alpha * ce + self.beta * reverse_ce(logits, labels, self.log_zero)).mean(-1)
