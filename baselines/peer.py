"""Peer loss: the loss on an example minus the loss on a "peer" pairing of an independent input and label.

Liu, Guo. Peer Loss Functions: Learning from Noisy Labels without Knowing Noise Rates. ICML 2020. Like L_DMI,
it comes from peer prediction.

    l_peer(x_i, y~_i) = l(h(x_i), y~_i) - alpha l(h(x_{p1}), y~_{p2})                (their Eq. 3, l = CE)

with p1, p2 drawn independently and uniformly from the batch (their mini-batch implementation); alpha = 1 is
the form their theory is stated for. Expected over the peer draws, the second term is

    E[l(h(x_{p1}), y~_{p2})] = (1/N) sum_i sum_k P(y~ = k) (-log softmax(h(x_i))_k)

with P(y~) the empirical label frequencies; the selection criterion uses this exact expectation.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.methods import Batch, Method


class PeerLoss(Method):
    """CE on the batch minus alpha times CE on randomly re-paired inputs and labels."""

    name = "peer"
    title = "Peer loss"
    paper = "Liu, Guo. Peer Loss Functions: Learning from Noisy Labels without Knowing Noise Rates. ICML 2020"
    defaults: dict[str, Any] = {"alpha": 1.0}
    ranges = {"alpha": "[0, inf)"}

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # Deterministic: the peer term in expectation over the peer draws, not one random draw, so that two
        # checkpoints are compared without sampling noise.
        log_p = torch.log_softmax(logits.float(), dim=1)
        prior = torch.bincount(labels, minlength=self.num_classes).to(log_p.dtype) / labels.numel()
        ce = -log_p.gather(1, labels.unsqueeze(1)).mean()
        return ce - self.alpha * -(log_p.mean(dim=0) * prior).sum()

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        logits = nets[0](batch.x)
        n = batch.y.numel()
        p1 = torch.randint(n, (n,), device=logits.device)
        p2 = torch.randint(n, (n,), device=logits.device)
        return F.cross_entropy(logits, batch.y) - self.alpha * F.cross_entropy(logits[p1], batch.y[p2])
