"""SOP: sparse over-parameterisation of the label noise, per-example u and v with their own optimiser.

Liu, Zhu, Qu, You. Robust Training under Label Noise by Over-parameterization. ICML 2022.

The label noise is modelled as a sparse term s_i = u_i^2 onehot(y~_i) - v_i^2 (1 - onehot(y~_i)) per training
example (u_i a scalar, v_i in R^C, both started near 0), learned by plain gradient descent whose implicit bias
keeps s sparse:

    q_i  = normalise(clamp(softmax(h(x_i)) + u_i^2 e_{y~} - sg(v_i^2 (1 - e_{y~})), eps))       (sg: stop-gradient)
    loss = CE(q_i, y~_i) + || onehot(argmax h(x_i)) + u_i^2 e_{y~} - v_i^2 (1 - e_{y~}) - e_{y~} ||^2   (their Eq. 5-7)

with u_i^2 and v_i^2 clamped to [0, 1] as in the paper's code. The network learns from the CE only; u from both
terms; v from the second (it is stopped in the first). u, v ~ N(0, 1e-8^2), SGD without momentum or weight decay at
lr_u = lr_v = 10 (CIFAR-10, see below). Selection uses CE: validation examples have no u, v.

Reference: shengliu66/SOP (the authors' code), model/loss.py (`overparametrization_loss`), train.py and
trainer/trainer.py, commit 4d991cedf1. Differences (`SparseOverParameterization.differences`):
- Plain SOP: their config runs SOP+ (ratio_consistency 0.9 and ratio_balance 0.1, on two augmented views of each
  image); those terms are left out, as for text they have no second view.
- lr_u = lr_v = 10 as attributed to the paper's Table A.1 for CIFAR-10, not re-checked — the repository ships only
  CIFAR-100's config (lr_u 1, lr_v 10).
- u and v are drawn from a generator of their own (seed 0) — theirs from the global one; at std 1e-8 the start is
  the same in effect.
- Optimiser and schedule of the network are the stage's — theirs: SGD 0.02 (momentum 0.9, weight decay 1e-3) with
  cosine annealing over 300 epochs.
- Selection by CE on the noisy validation set — their trainer monitors accuracy (`monitor: max val_my_metric`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from bench.baselines._own_optimizer import step_pending
from bench.methods import Batch, Method, StageContext

EPS = 1e-4  # the paper's code's floor on the corrected probabilities


def sop_loss(logits: torch.Tensor, labels: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The batch's SOP loss from its logits (B, C), labels (B,), u (B, 1) and v (B, C)."""
    onehot = F.one_hot(labels, logits.shape[-1]).float()
    u2 = (u * u * onehot).clamp(0.0, 1.0)
    v2 = (v * v * (1.0 - onehot)).clamp(0.0, 1.0)
    q = (torch.softmax(logits.float(), dim=-1) + u2 - v2.detach()).clamp_min(EPS)
    q = (q / q.sum(dim=-1, keepdim=True)).clamp(EPS, 1.0)
    ce = -(onehot * q.log()).sum(dim=-1).mean()
    hard = F.one_hot(logits.detach().argmax(dim=-1), logits.shape[-1]).float()
    mse = ((hard + u2 - v2 - onehot) ** 2).sum(dim=-1).mean()
    return ce + mse


class SparseOverParameterization(Method):
    """CE through the prediction plus a learned sparse noise term per example."""

    name = "sop"
    title = "SOP (sparse over-parameterisation)"
    paper = "Liu, Zhu, Qu, You. Robust Training under Label Noise by Over-parameterization. ICML 2022"
    reference = "shengliu66/SOP, model/loss.py (overparametrization_loss), train.py and trainer/trainer.py, " \
        "commit 4d991cedf1"
    differences = (
        "plain SOP: their config runs SOP+ (ratio_consistency 0.9 and ratio_balance 0.1, on two augmented views of "
        "each image) — those terms are left out, as for text they have no second view",
        "lr_u = lr_v = 10 for CIFAR-10 as attributed to the paper's Table A.1, not re-checked — the repository ships "
        "only CIFAR-100's config (lr_u 1, lr_v 10)",
        "u and v drawn from a generator of their own (seed 0) — theirs from the global one; at std 1e-8 the start "
        "is the same in effect",
        "optimiser and schedule of the network are the stage's — theirs: SGD 0.02 (momentum 0.9, weight decay 1e-3) "
        "with cosine annealing over 300 epochs",
        "selection by CE on the noisy validation set — their trainer monitors accuracy (monitor: max val_my_metric)",
    )
    defaults: dict[str, Any] = {"lr_u": 10.0, "lr_v": 10.0, "init_std": 1e-8}
    ranges: ClassVar[dict[str, str]] = {"lr_u": "(0, inf)", "lr_v": "(0, inf)", "init_std": "[0, inf)"}

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        self.u: torch.nn.Parameter | None = None
        self.v: torch.nn.Parameter | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    def setup(self, stage: StageContext) -> None:
        n = len(stage.noisy_train)
        generator = torch.Generator().manual_seed(0)
        self.u = torch.nn.Parameter((torch.randn(n, 1, generator=generator) * self.init_std).to(stage.device))
        self.v = torch.nn.Parameter((torch.randn(n, self.num_classes, generator=generator) * self.init_std)
                                    .to(stage.device))
        self.optimizer = torch.optim.SGD([{"params": [self.u], "lr": self.lr_u},
                                          {"params": [self.v], "lr": self.lr_v}], lr=self.lr_u, momentum=0.0)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return -torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1).mean(dim=-1)

    def train_loss(self, nets: list[torch.nn.Module], batch: Batch) -> torch.Tensor:
        step_pending(self.optimizer)
        return sop_loss(nets[0](batch.x), batch.y, self.u[batch.index], self.v[batch.index])

    def end_epoch(self, epoch: int) -> None:
        step_pending(self.optimizer)

    def state_dict(self) -> dict[str, Any]:
        if self.u is None:
            return {}
        return {"u": self.u.detach().clone(), "v": self.v.detach().clone(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state and self.u is not None:
            with torch.no_grad():
                self.u.copy_(state["u"])
                self.v.copy_(state["v"])
            self.optimizer.load_state_dict(state["optimizer"])
