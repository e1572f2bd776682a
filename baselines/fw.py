"""FW: forward loss correction with a transition matrix estimated from anchor points.

Patrini, Rozza, Menon, Nock, Qu. Making Deep Neural Networks Robust to Label Noise: a Loss Correction Approach.
CVPR 2017.

With T[i, j] = p(y~ = j | y = i) (rows = true class), the model's clean posterior p(y | x) = softmax(h(x)) is
pushed through the noise before the loss is taken:

    l_FW(h(x), y~) = -log sum_i softmax(h(x))_i T[i, y~]                  (forward correction, their Thm. 2)

T is estimated once, from the CE-warm-started model on the noisy training set, which approximates
p(y~ | x). For each class i an anchor x^i is chosen, an example that belongs to class i almost surely; then
p(y~ = j | x^i) = T[i, j]:

    x^i = argmax_x p(y~ = i | x),    T^[i, :] = p(y~ | x^i)

as the L_DMI paper's own FW scripts estimate it (the reference for the numbers the paper reports). Patrini et al.
filter outliers instead on all but CIFAR-100 (`quantile` = 0.97): x^i is the example with the largest p(y~ = i | x)
strictly below the 97th percentile of those values (numpy's 'higher' percentile). T^ is fixed for the whole method
stage. The loss is computed in log space, without the reference's clipping: -log (p T)[y~] is bounded below by 0.

Reference: Newbeeer/L_DMI, CIFAR-10/FW.py (and dogcat/FW.py, MR/main.py) (commit 7d5e4bc); Patrini et al.'s
giorgiop/loss-correction, models.py (NoiseEstimator) and loss.py (commit 15a79de).

Differences (`Forward.differences`):
- The anchors are taken over the unaugmented training split in evaluation mode — the L_DMI scripts predict on the
  augmented training loader (one random crop and flip per image).
- The loss -log (p T)[y~] in log space without clipping p — Patrini's Keras loss clips p to [1e-7, 1 - 1e-7] first;
  the L_DMI scripts, like us, do not (the loss is bounded below by 0 either way).
- With the outlier filter, Patrini's code zeroes in place the predictions at or above each earlier class's threshold
  before it copies an anchor's row, then row-normalises — an anchor of class i among the top 3% of p(y~ = j | x) for
  an earlier class j would get T^[i, j] = 0; we copy the prediction as it is.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from bench.methods import Method, StageContext, at_label


def anchor_transition(probs: torch.Tensor, quantile: float) -> torch.Tensor:
    """The anchor-point estimator: row i of T is the prediction at the anchor of class i, the example with the
    largest p(i | x) (`quantile` = 1.0), or with `quantile` < 1 Patrini's outlier filter: the largest p(i | x)
    strictly below the `quantile`-th quantile of the p(i | x) taken with numpy's 'higher' interpolation."""
    if quantile >= 1.0:
        return probs[probs.argmax(dim=0)].double()
    rank = math.ceil(quantile * (probs.shape[0] - 1))  # numpy.percentile(..., interpolation="higher")
    threshold = probs.sort(dim=0).values[rank]  # (C,)
    anchors = torch.where(probs < threshold, probs, torch.zeros_like(probs)).argmax(dim=0)  # (C,)
    return probs[anchors].double()


def forward_nll(logits: torch.Tensor, labels: torch.Tensor, transition: torch.Tensor) -> torch.Tensor:
    """Mean of -log (softmax(logits) @ T)[y~], computed as a log-sum-exp in log space (no underflow for
    confident predictions; entries T = 0 contribute exp(-inf) = 0)."""
    log_t = transition.to(logits.device, torch.float32).log()  # (..., C, C): one T per leading index
    log_p = torch.log_softmax(logits.float(), dim=-1)  # (..., N, C)
    log_noisy = torch.logsumexp(log_p.unsqueeze(-1) + log_t.unsqueeze(-3), dim=-2)  # (..., N, C): log p(y~ | x)
    return -at_label(log_noisy, labels).mean(-1)


class Forward(Method):
    """Forward correction with T estimated by anchor points from the warm-started model."""

    name = "fw"
    title = "FW (forward correction)"
    paper = "Patrini, Rozza, Menon, Nock, Qu. Making Deep Neural Networks Robust to Label Noise: " \
        "a Loss Correction Approach. CVPR 2017"
    defaults: dict[str, Any] = {"quantile": 1.0}
    member_state = ("transition",)
    ranges = {"quantile": "(0, 1]"}  # 1.0: the argmax (the L_DMI code); 0.97: Patrini's outlier filter
    reference = "Newbeeer/L_DMI, CIFAR-10/FW.py, commit 7d5e4bc; giorgiop/loss-correction, models.py and " \
        "loss.py, commit 15a79de"
    differences = (
        "The anchors are taken over the unaugmented training split in evaluation mode — the L_DMI scripts predict "
        "on the augmented training loader (one random crop and flip per image).",
        "The loss -log (p T)[y~] in log space without clipping p — Patrini's Keras loss clips p to [1e-7, 1 - 1e-7] "
        "first; "
        "the L_DMI scripts, like us, do not (the loss is bounded below by 0 either way).",
        "With the outlier filter, Patrini's code zeroes in place the predictions at or above each earlier class's "
        "threshold before it copies an anchor's row, then row-normalises — an anchor of class i among the top 3% "
        "of p(y~ = j | x) for an earlier class j would get T^[i, j] = 0; we copy the prediction as it is.",
    )

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        self.transition = torch.eye(num_classes, dtype=torch.float64)

    def setup(self, stage: StageContext) -> None:
        # Kept on the training device: the loss reads it every step.
        self.transition = anchor_transition(stage.predict_train(), self.quantile)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return forward_nll(logits, labels, self.transition)

    def state_dict(self) -> dict[str, Any]:
        return {"transition": self.transition.cpu().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.transition = state["transition"].to(self.transition.device).clone()

    def estimated_transition(self) -> np.ndarray | None:
        return self.transition.cpu().numpy().copy()
