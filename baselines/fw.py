"""FW: forward loss correction with a transition matrix estimated from anchor points.

Patrini, Rozza, Menon, Nock, Qu. Making Deep Neural Networks Robust to Label Noise: a Loss Correction Approach.
CVPR 2017.

With T[i, j] = p(y~ = j | y = i) (rows = true class), the model's clean posterior p(y | x) = softmax(h(x)) is
pushed through the noise before the loss is taken:

    l_FW(h(x), y~) = -log sum_i softmax(h(x))_i T[i, y~]                  (forward correction, their Thm. 2)

T is estimated once, from the CE-warm-started model on the noisy training set, which approximates
p(y~ | x). For each class i an anchor x^i is chosen, an example that belongs to class i almost surely; then
p(y~ = j | x^i) = T[i, j]. Like the paper's experiments we take as x^i the example at the 97th percentile of
p(y~ = i | x) (instead of the argmax, which is sensitive to outliers):

    x^i = the example at the alpha-quantile (alpha = 0.97) of {p(y~ = i | x)}_x,    T^[i, :] = p(y~ | x^i)

T^ is fixed for the whole method stage.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bench.methods import Method, StageContext, at_label


def anchor_transition(probs: torch.Tensor, quantile: float) -> torch.Tensor:
    """Patrini's estimator: row i of T is the prediction at the example whose p(i | x) is the `quantile`-th
    quantile of p(i | x) over all examples (`quantile` = 1.0: the argmax, the estimator's original form)."""
    n = probs.shape[0]
    order = probs.argsort(dim=0)  # (N, C): column i sorts the examples by p(i | x)
    rank = min(n - 1, int(np.floor(quantile * (n - 1) + 0.5)))
    anchors = order[rank]  # (C,): the anchor example of each class
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
    defaults: dict[str, Any] = {"quantile": 0.97}
    member_state = ("transition",)
    ranges = {"quantile": "(0, 1]"}  # 1.0: the argmax, Patrini's original anchor point

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
