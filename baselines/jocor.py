"""JoCoR: two networks trained jointly on one loss, CE plus co-regularisation, over the small-loss examples.

Wei, Feng, Chen, An. Combating Noisy Labels by Agreement: A Joint Training Method with Co-Regularization.
CVPR 2020.

With p_1, p_2 the two networks' softmax outputs and the epoch's keep rate R(T) (as in Co-teaching):

    l_i = (1 - lambda) (CE(p_1, y~_i) + CE(p_2, y~_i)) + lambda (KL(p_1 || p_2) + KL(p_2 || p_1))   (their Eq. 3-5)
    loss = mean of l_i over the floor(R(T) |B|) examples with the smallest l_i          (one loss, both networks)

Unlike Co-teaching there is no exchange: both networks are updated by the same selected loss, and the symmetric
KL pulls them toward agreement. The KL is differentiated through both networks (the paper's code). lambda = 0.9
and tau = 0.2, T_k = 10 with c = 1 (the paper's CIFAR-10 settings; tau = the noise rate). Selection (nets[0]
alone): CE over its (1 - tau) small-loss fraction of the validation set, as for Co-teaching. Both networks see
the same input (no augmentation of JoCoR's own), so the method runs unchanged on images and on text.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bench.baselines.coteaching import CoTeaching, small_loss_mask
from bench.methods import Batch


def symmetric_kl(logits_1: torch.Tensor, logits_2: torch.Tensor) -> torch.Tensor:
    """Per-example KL(p_1 || p_2) + KL(p_2 || p_1)."""
    log_1, log_2 = torch.log_softmax(logits_1.float(), dim=-1), torch.log_softmax(logits_2.float(), dim=-1)
    return ((log_1.exp() - log_2.exp()) * (log_1 - log_2)).sum(dim=-1)


def jocor_losses(logits_1: torch.Tensor, logits_2: torch.Tensor, labels: torch.Tensor, co_lambda: float
                 ) -> torch.Tensor:
    """Per-example joint loss l_i."""
    ce = F.cross_entropy(logits_1.float(), labels, reduction="none") + \
        F.cross_entropy(logits_2.float(), labels, reduction="none")
    return (1.0 - co_lambda) * ce + co_lambda * symmetric_kl(logits_1, logits_2)


class JoCoR(CoTeaching):
    """One small-loss-selected loss, CE + symmetric KL, trains both networks."""

    name = "jocor"
    title = "JoCoR"
    paper = "Wei, Feng, Chen, An. Combating Noisy Labels by Agreement: A Joint Training Method with " \
        "Co-Regularization. CVPR 2020"
    defaults: dict[str, Any] = {**CoTeaching.defaults, "co_lambda": 0.9}
    ranges: ClassVar[dict[str, str]] = {**CoTeaching.ranges, "co_lambda": "[0, 1]"}

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        losses = jocor_losses(nets[0](batch.x), nets[1](batch.x), batch.y, self.co_lambda)
        return losses[small_loss_mask(losses, self.keep_rate(batch.epoch))].mean()
