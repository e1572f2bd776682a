"""T-revision: importance reweighting with an anchor-point T, then a learned slack Delta T that revises it.

Xia, Liu, Wang, Han, Gong, Niu, Sugiyama. Are Anchor Points Really Indispensable in Label-Noise Learning?
NeurIPS 2019.

With p = softmax(h(x)) the clean posterior and T^ the anchor estimate (rows = true class; the same estimator as
`fw`, 97th-percentile anchors from the warm-started model), the noisy posterior is p (T^ + Delta T), and the
risk is importance-reweighted towards the clean distribution:

    beta(x, y~) = p_{y~}(x) / [p(x) (T^ + Delta T)]_{y~}
    loss = mean_i beta(x_i, y~_i) CE(h(x_i), y~_i)                                      (their Eq. 5-7)

Delta T starts at 0 and is learned with the classifier (their stage 3); it enters only through beta. For the
classifier beta is an importance weight, a constant (their reweighting code detaches it); Delta T learns through
it. The paper's schedule (their code): reweighting with T^ fixed, then the
revision with Adam at lr 5e-7 and weight decay 1e-4; here the first `revision_start` fraction of the method
stage keeps Delta T = 0 and the rest revises it. The estimate recorded is T^ + Delta T.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from bench.baselines._own_optimizer import step_pending
from bench.baselines.fw import anchor_transition
from bench.methods import Batch, Method, StageContext


def reweighted_ce(logits: torch.Tensor, labels: torch.Tensor, transition: torch.Tensor) -> torch.Tensor:
    """Mean over the last batch dimension of beta CE, beta = p_{y~} / (p T)_{y~} (constant for the network,
    differentiable in T); logits (..., B, C)."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    p = log_p.detach().exp()
    clean = p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    noisy = (p @ transition.float()).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    beta = clean / noisy.clamp_min(torch.finfo(noisy.dtype).tiny)
    return (beta * -log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)).mean(dim=-1)


class TRevision(Method):
    """Importance reweighting by the anchor T, revised by a learned slack."""

    name = "trevision"
    title = "T-revision"
    paper = "Xia, Liu, Wang, Han, Gong, Niu, Sugiyama. Are Anchor Points Really Indispensable in Label-Noise " \
        "Learning? NeurIPS 2019"
    defaults: dict[str, Any] = {"quantile": 0.97, "lr_revision": 5e-7, "weight_decay_revision": 1e-4,
                                "revision_start": 0.5}
    ranges: ClassVar[dict[str, str]] = {"quantile": "(0, 1]", "lr_revision": "(0, inf)",
                                        "weight_decay_revision": "[0, inf)", "revision_start": "[0, 1]"}

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        self.anchor = torch.eye(num_classes, dtype=torch.float32)
        self.slack = torch.nn.Parameter(torch.zeros(num_classes, num_classes))
        self.optimizer: torch.optim.Optimizer | None = None
        self.start_epoch = 0

    def setup(self, stage: StageContext) -> None:
        self.anchor = anchor_transition(stage.predict_train(), self.quantile).float().to(stage.device)
        self.slack = torch.nn.Parameter(torch.zeros_like(self.anchor))
        self.optimizer = torch.optim.Adam([self.slack], lr=self.lr_revision, weight_decay=self.weight_decay_revision)
        self.start_epoch = int(round(self.revision_start * stage.epochs))

    def transition(self) -> torch.Tensor:
        return self.anchor + self.slack

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return reweighted_ce(logits, labels, self.transition().to(logits.device))

    def train_loss(self, nets: list[torch.nn.Module], batch: Batch) -> torch.Tensor:
        step_pending(self.optimizer)
        transition = self.transition() if batch.epoch >= self.start_epoch else self.anchor
        return reweighted_ce(nets[0](batch.x), batch.y, transition)

    def end_epoch(self, epoch: int) -> None:
        step_pending(self.optimizer)

    def state_dict(self) -> dict[str, Any]:
        return {"anchor": self.anchor.clone(), "slack": self.slack.detach().clone(),
                "optimizer": None if self.optimizer is None else self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.anchor = state["anchor"].clone()
        with torch.no_grad():
            self.slack.copy_(state["slack"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])

    def estimated_transition(self) -> np.ndarray | None:
        with torch.no_grad():
            return self.transition().double().cpu().numpy()


