"""CE: the plain cross-entropy loss, the paper's first baseline and the warm-start objective of every method."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.methods import Method


class CrossEntropy(Method):
    """Cross entropy on the noisy labels."""

    name = "ce"
    title = "CE"
    paper = "Cross entropy (the standard loss; the paper's CE baseline)"

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels)
