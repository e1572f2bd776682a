"""JoCoR: two networks trained jointly on one loss, CE plus co-regularisation, over the small-loss examples.

Wei, Feng, Chen, An. Combating Noisy Labels by Agreement: A Joint Training Method with Co-Regularization.
CVPR 2020.

With p_1, p_2 the two networks' softmax outputs and the epoch's keep rate R(e) (as in Co-teaching):

    l_i = (1 - lambda) (CE(p_1, y~_i) + CE(p_2, y~_i)) + lambda (KL(p_1 || p_2) + KL(p_2 || p_1))   (their Eq. 3-5)
    loss = mean of l_i over the floor(R(e) |B|) examples with the smallest l_i          (one loss, both networks)

Unlike Co-teaching there is no exchange: both networks are updated by the same selected loss, and the symmetric
KL pulls them toward agreement. The KL is differentiated through both networks (the paper's code). tau, its ramp
and the default forget rate are Co-teaching's: the fraction of labels the trial's noise is expected to corrupt,
which is their rule too (`forget_rate = noise_rate`, halved for their asymmetric noise, which flips half the
classes). lambda = 0.9, the README's best for CIFAR-10 at 20% and 50% symmetric and 40% asymmetric noise (0.65 at
80%; the script's default is 0.1); 0.85 on CIFAR-100, its best there (README.md line 31), declared in CIFAR-100's
file. Selection (nets[0] alone): CE over its (1 - tau) small-loss fraction of the validation set, as for Co-teaching.
Both networks see the same input (no augmentation of JoCoR's own), so the method runs unchanged on images and on text.

Reference: hongxin001/JoCoR (the authors' code), algorithm/jocor.py (forget rate, `rate_schedule`), algorithm/loss.py
(`loss_jocor`) and README.md (lambda, lines 20-33), commit 86db3597ff. Differences (`JoCoR.differences`):
- The networks start from two CE warm starts, not from scratch — bench's protocol; the ramp starts with the method
  stage.
- The optimiser is the stage's — theirs: Adam at lr 1e-3 over both networks, decayed linearly to 0 from epoch 80
  with beta1 0.9 -> 0.1.
- Selection on nets[0] by CE over the (1 - tau) smallest-loss fraction of the noisy validation set — theirs
  selects none (the mean test accuracy of the last 10 epochs).
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
    reference = "hongxin001/JoCoR, algorithm/jocor.py (forget rate, rate_schedule), algorithm/loss.py " \
        "(loss_jocor) and README.md (lambda, lines 20-33), commit 86db3597ff"
    differences = (
        "the networks start from two CE warm starts, not from scratch — bench's protocol; the ramp starts with the "
        "method stage",
        "the optimiser is the stage's — theirs: Adam at lr 1e-3 over both networks, decayed linearly to 0 from "
        "epoch 80 with beta1 0.9 -> 0.1",
        "selection on nets[0] by CE over the (1 - tau) smallest-loss fraction of the noisy validation set — theirs "
        "selects none (the mean test accuracy of the last 10 epochs)",
    )
    defaults: dict[str, Any] = {**CoTeaching.defaults, "co_lambda": 0.9}
    ranges: ClassVar[dict[str, str]] = {**CoTeaching.ranges, "co_lambda": "[0, 1]"}

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        losses = jocor_losses(nets[0](batch.x), nets[1](batch.x), batch.y, self.co_lambda)
        return losses[small_loss_mask(losses, self.keep_rate(batch.epoch))].mean()
