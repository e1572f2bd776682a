"""NCE+RCE: an active-passive loss pairing normalized cross entropy with reverse cross entropy.

Ma, Huang, Wang, Romano, Erfani, Bailey. Normalized Loss Functions for Deep Learning with Noisy Labels.
ICML 2020.

With p = softmax(h(x)):

    l_nce = -log p_y / (-sum_k log p_k)                    (normalized CE, their Eq. 3: robust, but underfits)
    l_rce = -A (1 - p_y),  A = -4                           (reverse CE, as in SCE)
    l = alpha l_nce + beta l_rce                            (CIFAR-10: alpha = beta = 1, their Sec. 5)
"""

from __future__ import annotations

from typing import Any

import torch

from bench.baselines.sce import reverse_ce
from bench.methods import Method, at_label


def normalized_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-example -log p_y / sum_k (-log p_k)."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return at_label(log_p, labels) / log_p.sum(dim=-1)


class NormalizedCEReverseCE(Method):
    """alpha NCE + beta RCE (the APL pairing the paper recommends)."""

    name = "nce_rce"
    title = "NCE+RCE (active-passive loss)"
    paper = "Ma, Huang, Wang, Romano, Erfani, Bailey. Normalized Loss Functions for Deep Learning with Noisy " \
        "Labels. ICML 2020"
    defaults: dict[str, Any] = {"alpha": 1.0, "beta": 1.0, "log_zero": -4.0}
    ranges = {"alpha": "[0, inf)", "beta": "[0, inf)", "log_zero": "(-inf, 0)"}  # log 0 := a negative number

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        nce = normalized_ce(logits, labels)
        return (self.alpha * nce + self.beta * reverse_ce(logits, labels, self.log_zero)).mean(-1)
