"""CE: the plain cross-entropy loss, the paper's first baseline and the warm-start objective of every method.

Reference: Newbeeer/L_DMI, CIFAR-10/CE.py (and dogcat/CE.py, MR/main.py, fashion/main.py) (commit 7d5e4bc).

Differences (`CrossEntropy.differences`):
- The CE row (bench) is the warm start followed by a CE method stage, selected by the lowest noisy-validation CE —
  the paper's CE is its warm-start run alone, selected by noisy-validation accuracy; bench keeps CE's row the same
  protocol as every other method's, and `--protocol authors` (ce_is_warm_start, warmup_by_accuracy) runs theirs.
"""

from __future__ import annotations

import torch

from bench.methods import Method, per_example_ce


class CrossEntropy(Method):
    """Cross entropy on the noisy labels."""

    name = "ce"
    title = "CE"
    paper = "Cross entropy (the standard loss; the paper's CE baseline)"
    reference = "Newbeeer/L_DMI, CIFAR-10/CE.py, commit 7d5e4bc"
    differences = (
        "The CE row (bench) is the warm start followed by a CE method stage, selected by the lowest noisy-validation "
        "CE — the paper's CE is its warm-start run alone (CIFAR-10: SGD 0.1, 120 epochs), selected by "
        "noisy-validation accuracy; bench keeps CE's row the same protocol as every other method's, and "
        "--protocol authors (ce_is_warm_start, warmup_by_accuracy) runs theirs.",
    )

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return per_example_ce(logits, labels).mean(-1)
