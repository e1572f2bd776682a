"""GLS: generalised label smoothing, with negative smoothing rates.

Wei, Liu, Liu, Cheng, Zhu, Jin, Zhu, Liu. To Smooth or Not? When Label Smoothing Meets Noisy Labels. ICML 2022.

With the smooth rate r (any r <= 1, negative allowed) the target of a noisy label y~ is

    y_GLS = (1 - r) onehot(y~) + (r / C) 1                                              (their Eq. 2)
    l_GLS = -sum_k y_GLS,k log p_k = (1 - r) CE(p, y~) + r mean_k (-log p_k)

r = 0 is CE, r > 0 is ordinary label smoothing, r < 0 (negative label smoothing, NLS) gives targets outside the
probability simplex (the label's entry above 1, the others below 0): it rewards confidence, which the paper finds
better at high noise rates. Their recipe is a CE warm-up (our warm start) and then GLS; the default r = -0.2 is
the rate of their released code (the paper's CIFAR-10 grid spans r in [-1, 0.8]).
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
    defaults: dict[str, Any] = {"smooth_rate": -0.2}
    ranges: ClassVar[dict[str, str]] = {"smooth_rate": "(-inf, 1]"}

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        log_p = torch.log_softmax(logits.float(), dim=-1)
        targets = gls_targets(labels, self.num_classes, self.smooth_rate)
        return -(targets * log_p).sum(dim=-1).mean(dim=-1)
