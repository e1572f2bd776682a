"""CE: the plain cross-entropy loss, the paper's first baseline and the warm-start objective of every method."""

from __future__ import annotations

import torch

from bench.methods import Method, per_example_ce


class CrossEntropy(Method):
    """Cross entropy on the noisy labels."""

    name = "ce"
    title = "CE"
    paper = "Cross entropy (the standard loss; the paper's CE baseline)"

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return per_example_ce(logits, labels).mean(-1)
