"""Backward correction: the loss vector multiplied by the inverse of an anchor-point estimate of T.

Patrini, Rozza, Menon, Nock, Qu. Making Deep Neural Networks Robust to Label Noise: a Loss Correction Approach.
CVPR 2017.

With T[i, j] = p(y~ = j | y = i) (rows = true class) and l(h(x)) = (-log p_k)_k the vector of the losses of every
possible label, p = softmax(h(x)) clipped to [1e-7, 1 - 1e-7] as in the authors' code, the corrected loss of a noisy
label y~ is

    l_back(h(x), y~) = [T^-1 l(h(x))]_{y~} = sum_k (T^-1)[y~, k] (-log p_k)                 (their Thm. 1)

It is unbiased: E_{y~ | y}[l_back(h(x), y~)] = sum_j T[y, j] [T^-1 l]_j = l_y, the clean loss. With T = I it is
CE. T^-1 has negative entries, so without the clip a confident prediction makes the loss unbounded below (T =
[[0.6, 0.4], [0.3, 0.7]], logits (1000, 0) and label 0: -1333) and training can lower it by inflating the logits;
with the clip each -log p_k lies in [1e-7, 16.12], so the loss is bounded below by 16.12 times the sum of the
negative entries of the label's row of T^-1 (-21.49 there). T is estimated once, from the CE-warm-started model, by
the anchor-point estimator `fw` uses.

Reference: giorgiop/loss-correction (the authors' Keras code), loss.py (`robust('backward', P)`, lines 13-21),
models.py (`NoiseEstimator`, lines 413-477) and experiment.py (lines 58-62: `filter_outlier`, off on CIFAR-100 only),
commit 15a79de3c67c31907733392085c333547c2f2b16. `quantile` 0.97 is their filter; 1.0, the arg max, is their CIFAR-100
choice, declared in CIFAR-100's file. Differences (`Backward.differences`):
- T^-1 is the pseudo-inverse (theirs `np.linalg.inv`) — equal for an invertible T; a singular estimate gets the
  least-squares correction instead of stopping the trial.
- T comes from `fw.anchor_transition`, the estimator `fw` uses — fw's record compares its anchor rank with their
  `filter_outlier` rule (the 97th percentile).
- Training continues from the CE warm start; theirs builds a fresh network after estimating T — bench's protocol:
  every method starts from the same warm start.
- Optimiser and schedule are the stage's — theirs are per dataset in models.py (SGD for the CIFAR-10 ResNet).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from bench.baselines.fw import anchor_transition
from bench.methods import Method, StageContext

EPSILON = 1e-7  # Keras' K.epsilon(): their loss clips the predicted probabilities to [EPSILON, 1 - EPSILON]


def clipped_losses(logits: torch.Tensor) -> torch.Tensor:
    """-log p_k for every label k (..., B, C), p = softmax clipped to [1e-7, 1 - 1e-7]."""
    return -torch.softmax(logits.float(), dim=-1).clamp(EPSILON, 1.0 - EPSILON).log()


def backward_nll(logits: torch.Tensor, labels: torch.Tensor, transition: torch.Tensor) -> torch.Tensor:
    """Mean over the last batch dimension of [T^-1 (-log p)]_{y~}; logits (..., B, C)."""
    # The pseudo-inverse is the inverse for any invertible T; an estimate with det T = 0 (the warm start cannot
    # tell two classes apart) then gives the least-squares correction instead of stopping the trial.
    return corrected_nll(logits, labels, torch.linalg.pinv(transition.double()))


def corrected_nll(logits: torch.Tensor, labels: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """The backward-corrected loss given T^-1 ((..., C, C): one per leading index, as in a pack)."""
    losses = clipped_losses(logits)  # (..., B, C)
    index = labels.unsqueeze(-1).expand(*labels.shape, losses.shape[-1])  # (..., B, C)
    rows = torch.gather(inverse.to(logits.device, torch.float32).expand(*labels.shape[:-1], *inverse.shape[-2:]),
                        -2, index)  # (..., B, C): row y~_i of T^-1 for each example
    return (rows * losses).sum(dim=-1).mean(dim=-1)


class Backward(Method):
    """Backward correction with T estimated by anchor points from the warm-started model."""

    name = "backward"
    title = "Backward correction"
    paper = "Patrini, Rozza, Menon, Nock, Qu. Making Deep Neural Networks Robust to Label Noise: " \
        "a Loss Correction Approach. CVPR 2017"
    reference = "giorgiop/loss-correction, loss.py (robust 'backward', lines 13-21), models.py (NoiseEstimator, " \
        "lines 413-477) and experiment.py (filter_outlier, lines 58-62), commit 15a79de3c6"
    differences = (
        "T^-1 is the pseudo-inverse (theirs np.linalg.inv) — equal for an invertible T; a singular estimate gets "
        "the least-squares correction instead of stopping the trial",
        "T from fw.anchor_transition, the estimator fw uses — fw's record compares its anchor rank with their "
        "filter_outlier rule (the 97th percentile)",
        "training continues from the CE warm start; theirs builds a fresh network after estimating T — bench's "
        "protocol: every method starts from the same warm start",
        "optimiser and schedule are the stage's — theirs are per dataset in models.py (SGD for the CIFAR-10 ResNet)",
    )
    defaults: dict[str, Any] = {"quantile": 0.97}
    ranges: ClassVar[dict[str, str]] = {"quantile": "(0, 1]"}
    member_state = ("inverse",)

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        self.set_transition(torch.eye(num_classes, dtype=torch.float64))

    def set_transition(self, transition: torch.Tensor) -> None:
        """T and, once, its (pseudo-)inverse, kept where the logits are: no per-step SVD, no host sync."""
        self.transition = transition.cpu().double()
        self.inverse = torch.linalg.pinv(self.transition).float().to(transition.device)

    def setup(self, stage: StageContext) -> None:
        self.set_transition(anchor_transition(stage.predict_train(), self.quantile))

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return corrected_nll(logits, labels, self.inverse)

    def state_dict(self) -> dict[str, Any]:
        return {"transition": self.transition.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.set_transition(state["transition"].to(self.inverse.device))

    def estimated_transition(self) -> np.ndarray | None:
        return self.transition.numpy().copy()
