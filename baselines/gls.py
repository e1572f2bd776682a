"""GLS: generalised label smoothing, with negative smoothing rates.

Wei, Liu, Liu, Cheng, Zhu, Jin, Zhu, Liu. To Smooth or Not? When Label Smoothing Meets Noisy Labels. ICML 2022.

With the smooth rate r (any r <= 1, negative allowed) the target of a noisy label y~ is

    y_GLS = (1 - r) onehot(y~) + (r / C) 1                                              (their Eq. 2)
    l_GLS = -sum_k y_GLS,k log p_k = (1 - r) CE(p, y~) + r mean_k (-log p_k)

r = 0 is CE, r > 0 is ordinary label smoothing, r < 0 (negative label smoothing, NLS) gives targets outside the
probability simplex (the label's entry above 1, the others below 0): it rewards confidence, which the paper finds
better at high noise rates. Their recipe for high noise is a CE warm-up (our warm start) and then GLS.

Reference: UCSC-REAL/negative-label-smoothing (the authors' code), loss.py (`loss_gls`) and main_GLS_load.py,
commit 05078f675b. Differences (`GeneralizedLabelSmoothing.differences`):
- The default rate is -0.2, a negative rate of the paper's grid ([-8, 0.8]), where it finds GLS best at high noise
  — the scripts' default is 0.1 (positive smoothing, what their README's commands run at 20% symmetric noise).
- Their `wa` CE term (default weight 0) is left out.
- Optimiser and schedule are the stage's — theirs after the warm-up: SGD (Nesterov, momentum 0.9, weight decay
  1e-4) at 1e-6 for 100 epochs on CIFAR-10.
- Selection by the GLS loss on the noisy validation set — theirs keeps the checkpoint of best test accuracy.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from bench.methods import Method


def gls_targets(labels: torch.Tensor, num_classes: int, smooth_rate: float) -> torch.Tensor:
    """(1 - r) onehot(y~) + r / C: rows sum to 1 but leave [0, 1] when r < 0."""
    onehot = F.one_hot(labels, num_classes).float()
    return (1.0 - smooth_rate) * onehot + smooth_rate / num_classes


class GeneralizedLabelSmoothing(Method):
    """CE against the smoothed (or, for r < 0, sharpened beyond one-hot) target."""

    name = "gls"
    title = "GLS (generalised label smoothing)"
    paper = "Wei, Liu, Liu, Cheng, Zhu, Jin, Zhu, Liu. To Smooth or Not? When Label Smoothing Meets Noisy " \
        "Labels. ICML 2022"
    reference = "UCSC-REAL/negative-label-smoothing, loss.py (loss_gls) and main_GLS_load.py, commit 05078f675b"
    differences = (
        "the default rate is -0.2, a negative rate of the paper's grid ([-8, 0.8]), where it finds GLS best at high "
        "noise — the scripts' default is 0.1 (positive smoothing, what their README's commands run at 20% "
        "symmetric noise)",
        "their wa CE term is left out — its default weight is 0",
        "optimiser and schedule are the stage's — theirs after the warm-up: SGD (Nesterov, momentum 0.9, weight "
        "decay 1e-4) at 1e-6 for 100 epochs on CIFAR-10",
        "selection by the GLS loss on the noisy validation set — theirs keeps the checkpoint of best test accuracy",
    )
    defaults: dict[str, Any] = {"smooth_rate": -0.2}
    ranges: ClassVar[dict[str, str]] = {"smooth_rate": "(-inf, 1]"}

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        log_p = torch.log_softmax(logits.float(), dim=-1)
        targets = gls_targets(labels, self.num_classes, self.smooth_rate)
        return -(targets * log_p).sum(dim=-1).mean(dim=-1)
