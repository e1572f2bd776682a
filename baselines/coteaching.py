"""Co-teaching: two networks, each trained on the small-loss examples chosen by the other.

Han, Yao, Yu, Niu, Xu, Hu, Tsang, Sugiyama. Co-teaching: Robust Training of Deep Neural Networks with Extremely
Noisy Labels. NeurIPS 2018.

For a batch B and the epoch's keep rate R(T) (T the 0-based epoch of the method stage):

    B_f = the floor(R(T) |B|) examples of smallest CE under net f;   B_g likewise under net g
    loss = CE_f on B_g + CE_g on B_f                         (cross update: each learns from the other's pick)
    R(T) = 1 - tau min((T / T_k)^c, 1)                       (their Alg. 1: tau = forget rate, T_k = 10, c = 1)

The paper sets tau to the noise rate, assumed known; the default 0.2 is one of its settings (pass the
trial's r as forget_rate when it is known). The two networks are the trainer's two CE warm starts (different
seeds); nets[0] is the one selected and evaluated.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.baselines.mentornet import trimmed_mean
from bench.methods import Batch, Method


def small_loss_mask(losses: torch.Tensor, keep: float) -> torch.Tensor:
    """Boolean mask of the floor(keep N) smallest losses (at least one)."""
    n = losses.numel()
    k = max(1, min(n, int(keep * n + 1e-9)))
    mask = torch.zeros(n, dtype=torch.bool, device=losses.device)
    mask[losses.detach().topk(k, largest=False).indices] = True
    return mask


class CoTeaching(Method):
    """Two networks exchange their small-loss examples; the forget rate ramps up over T_k epochs."""

    name = "coteaching"
    title = "Co-teaching"
    paper = "Han, Yao, Yu, Niu, Xu, Hu, Tsang, Sugiyama. Co-teaching: Robust Training of Deep Neural Networks " \
        "with Extremely Noisy Labels. NeurIPS 2018"
    defaults: dict[str, Any] = {"forget_rate": 0.2, "num_gradual": 10, "exponent": 1.0}
    # tau < 1 keeps some examples; T_k = 0 forgets at the full rate from the start; c > 0 makes the ramp rise.
    ranges = {"forget_rate": "[0, 1)", "num_gradual": "[0, inf)", "exponent": "(0, inf)"}
    networks = 2

    def keep_rate(self, epoch: int) -> float:
        """R(T) = 1 - tau min((T / T_k)^c, 1)."""
        ramp = min((epoch / self.num_gradual) ** self.exponent, 1.0) if self.num_gradual > 0 else 1.0
        return 1.0 - self.forget_rate * ramp

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # Selection on nets[0] alone: CE over its small-loss (1 - tau) fraction of the validation set, a fixed
        # fraction so that epochs with different R(T) are comparable (a smaller kept share would always win).
        return trimmed_mean(F.cross_entropy(logits, labels, reduction="none"), 1.0 - self.forget_rate)

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        f, g = nets[0], nets[1]
        loss_f = F.cross_entropy(f(batch.x), batch.y, reduction="none")
        loss_g = F.cross_entropy(g(batch.x), batch.y, reduction="none")
        keep = self.keep_rate(batch.epoch)
        pick_f, pick_g = small_loss_mask(loss_f, keep), small_loss_mask(loss_g, keep)
        return loss_f[pick_g].mean() + loss_g[pick_f].mean()

    def judged_noisy(self, logits: torch.Tensor, labels: torch.Tensor, epoch: int,
                     index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """nets[0]'s small-loss selection at the keep rate of the coming epoch, over the examples given (the
        diagnostics' training sample; the training step selects within each batch): examples outside the
        floor(R(T) N) smallest CE are flagged."""
        losses = F.cross_entropy(logits.float(), labels, reduction="none")
        return losses, ~small_loss_mask(losses, self.keep_rate(epoch))
