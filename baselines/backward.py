"""Backward correction: the loss vector multiplied by the inverse of an anchor-point estimate of T.

Patrini, Rozza, Menon, Nock, Qu. Making Deep Neural Networks Robust to Label Noise: a Loss Correction Approach.
CVPR 2017.

With T[i, j] = p(y~ = j | y = i) (rows = true class) and l(h(x)) = (-log softmax(h(x))_k)_k the vector of the
losses of every possible label, the corrected loss of a noisy label y~ is

    l_back(h(x), y~) = [T^-1 l(h(x))]_{y~} = sum_k (T^-1)[y~, k] (-log softmax(h(x))_k)      (their Thm. 1)

It is unbiased: E_{y~ | y}[l_back(h(x), y~)] = sum_j T[y, j] [T^-1 l]_j = l_y, the clean loss. With T = I it is
CE. T is estimated once, from the CE-warm-started model, exactly as in `fw` (the anchor example of each class at
the 97th percentile of p(y~ = i | x), the paper's experiments); T^-1 has negative entries, so the loss is not
bounded below (the paper's own remark: backward correction trains worse than forward in practice).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from bench.baselines.fw import anchor_transition
from bench.methods import Method, StageContext


def backward_nll(logits: torch.Tensor, labels: torch.Tensor, transition: torch.Tensor) -> torch.Tensor:
    """Mean over the last batch dimension of [T^-1 (-log softmax(logits))]_{y~}; logits (..., B, C)."""
    # The pseudo-inverse is the inverse for any invertible T; an estimate with det T = 0 (the warm start cannot
    # tell two classes apart) then gives the least-squares correction instead of stopping the trial.
    return corrected_nll(logits, labels, torch.linalg.pinv(transition.double()))


def corrected_nll(logits: torch.Tensor, labels: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """The backward-corrected loss given T^-1 ((..., C, C): one per leading index, as in a pack)."""
    losses = -torch.log_softmax(logits.float(), dim=-1)  # (..., B, C)
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
