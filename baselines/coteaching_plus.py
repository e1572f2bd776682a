"""Co-teaching+: Co-teaching restricted to the examples on which the two networks disagree.

Yu, Han, Yao, Niu, Tsang, Sugiyama. How does Disagreement Help Generalization against Label Corruption?
ICML 2019.

For a batch B, the epoch's keep rate R(T) (as in Co-teaching) and the two networks f, g:

    D   = {i in B : argmax f(x_i) != argmax g(x_i)}                       (disagreement)
    D_f = the floor(R(T) |D|) examples of D with the smallest CE under f;  D_g likewise under g
    loss = CE_f on D_g + CE_g on D_f                                      (cross update, their Alg. 1)

Where the networks agree on the whole batch the step trains both on all of it with CE (the paper's code). The
paper's first "init_epoch" epochs run plain Co-teaching; our CE warm start plays that part, so the disagreement
step runs from the first method epoch. tau (forget rate) = 0.2 is its setting for 20% noise (the paper sets
tau = the noise rate), T_k = 10 with c = 1 as in Co-teaching; the two networks are the trainer's two warm
starts (different seeds). Nothing is augmented or mixed, so it runs unchanged on images and on text.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.baselines.coteaching import CoTeaching
from bench.methods import Batch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask`, without indexing by a data-dependent shape (no host sync)."""
    weights = mask.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp_min(1.0)


def disagreement_mask(
    loss_f: torch.Tensor, loss_g: torch.Tensor, disagree: torch.Tensor, keep: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pick_f, pick_g): the floor(keep |D|) smallest-loss examples of D under f and under g."""
    k = (keep * disagree.sum()).floor().clamp_min(1.0)
    big = torch.finfo(loss_f.dtype).max
    ranks_f = torch.where(disagree, loss_f.detach(), big).argsort().argsort()
    ranks_g = torch.where(disagree, loss_g.detach(), big).argsort().argsort()
    return disagree & (ranks_f < k), disagree & (ranks_g < k)


class CoTeachingPlus(CoTeaching):
    """Two networks exchange their small-loss examples among those they disagree on."""

    name = "coteaching_plus"
    title = "Co-teaching+"
    paper = "Yu, Han, Yao, Niu, Tsang, Sugiyama. How does Disagreement Help Generalization against Label " \
        "Corruption? ICML 2019"
    # Hyper-parameters: Co-teaching's (forget rate and its ramp), inherited.

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        logits_f, logits_g = nets[0](batch.x), nets[1](batch.x)
        loss_f = F.cross_entropy(logits_f, batch.y, reduction="none")
        loss_g = F.cross_entropy(logits_g, batch.y, reduction="none")
        disagree = logits_f.argmax(dim=1) != logits_g.argmax(dim=1)
        pick_f, pick_g = disagreement_mask(loss_f, loss_g, disagree, self.keep_rate(batch.epoch))
        exchanged = masked_mean(loss_f, pick_g) + masked_mean(loss_g, pick_f)
        agreed = loss_f.mean() + loss_g.mean()
        return torch.where(disagree.any(), exchanged, agreed)


