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

from bench.methods import Batch, Method, at_label, one_hot, per_example_ce


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
        log_p = torch.log_softmax(logits.float(), dim=-1)
        prior = one_hot(labels, self.num_classes, log_p.dtype).mean(dim=-2)  # (..., C), no host sync
        ce = -at_label(log_p, labels).mean(-1)
        return ce - self.alpha * -(log_p.mean(dim=-2) * prior).sum(-1)

    def logits_loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        n = batch.y.shape[-1]
        p1, p2 = batch.randint(n), batch.randint(n)
        peer_logits = logits.gather(-2, p1.unsqueeze(-1).expand(*p1.shape, logits.shape[-1]))
        peer_ce = per_example_ce(peer_logits, batch.y.gather(-1, p2))
        return per_example_ce(logits, batch.y).mean(-1) - self.alpha * peer_ce.mean(-1)
