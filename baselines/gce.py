"""GCE: the generalized cross entropy L_q, and its truncated variant with periodic pruning.

Zhang, Sabuncu. Generalized Cross Entropy Loss for Training Deep Neural Networks with Noisy Labels.
NeurIPS 2018.

With f_y(x) the softmax probability of the (noisy) label,

    L_q(f(x), y) = (1 - f_y(x)^q) / q,        q in (0, 1]                          (their Eq. 6)

L_q tends to CE (-log f_y) as q -> 0 and equals the MAE-type loss 1 - f_y (= MAE / 2) at q = 1. The paper
uses q = 0.7. The truncated loss ignores examples whose label probability falls below k:

    L_trunc(f(x), y) = L_q(k)      if f_y(x) <= k
                       L_q(f(x), y) otherwise                                      (their Eq. 9)

optimised by alternating (their Alg. 1) between the network and per-example weights w_i in {0, 1}:

    min_theta  sum_i w_i L_q(f(x_i), y_i) - L_q(k) sum_i w_i
    pruning step: w_i = 1 if f_{y_i}(x_i) > k else 0   (over the whole training set)

with k = 0.5, pruning first at epoch `prune_start` and then every `prune_every` epochs (the paper: from epoch
40, every 10 epochs, on a 120-epoch run from scratch; lower them for the short method stage after a warm
start). The weights are one tensor over the training set, indexed by `batch.index`.

The L_DMI paper's GCE is L_q with q = 0.7 and no truncation (its scripts set `set_pruning = False`), our default.
Zhang and Sabuncu released no code; the truncated variant follows the paper, checked against AlanChou's
reimplementation.

Reference: Newbeeer/L_DMI, CIFAR-10/GCE.py (and dogcat/GCE.py, MR/main.py) (commit 7d5e4bc); for the truncated
variant AlanChou/Truncated-Loss, TruncatedLoss.py and main.py (commit fef5908), unofficial.

Differences (`GeneralizedCrossEntropy.differences`):
- L_q is computed as -expm1(q log f_y) / q from log-softmax — the same function as the scripts' (1 - f_y^q) / q,
  without their per-example loop.
- Truncated variant: pruning reads the current model on the unaugmented training split after epochs prune_start,
  prune_start + prune_every, ... (the L_DMI script's timing) — AlanChou's reimplementation reads the checkpoint with
  the best test accuracy on the augmented loader, one epoch earlier; the L_DMI script's disabled pruning would have
  read only its last batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bench.methods import Batch, Method, StageContext, at_label


def lq_loss(logits: torch.Tensor, labels: torch.Tensor, q: float) -> torch.Tensor:
    """Per-example L_q = (1 - f_y^q) / q, with f_y^q = exp(q log f_y) (stable for tiny f_y)."""
    log_fy = at_label(torch.log_softmax(logits.float(), dim=-1), labels)
    return -torch.expm1(q * log_fy) / q


class GeneralizedCrossEntropy(Method):
    """L_q loss (q = 0.7); `truncated=true` switches on the truncated L_q with pruning."""

    name = "gce"
    title = "GCE (L_q)"
    paper = "Zhang, Sabuncu. Generalized Cross Entropy Loss for Training Deep Neural Networks with Noisy " \
        "Labels. NeurIPS 2018"
    defaults: dict[str, Any] = {"q": 0.7, "truncated": False, "k": 0.5, "prune_start": 40, "prune_every": 10}
    # L_q is defined for q in (0, 1] (q -> 0 is CE); the truncation threshold k is a probability in (0, 1).
    ranges = {"q": "(0, 1]", "k": "(0, 1)", "prune_start": "[0, inf)", "prune_every": "[1, inf)"}
    reference = "Newbeeer/L_DMI, CIFAR-10/GCE.py, commit 7d5e4bc; AlanChou/Truncated-Loss, TruncatedLoss.py and " \
        "main.py, commit fef5908"
    differences = (
        "L_q is computed as -expm1(q log f_y) / q from log-softmax — the same function as the scripts' "
        "(1 - f_y^q) / q, without their per-example loop.",
        "Truncated variant: pruning reads the current model on the unaugmented training split after epochs "
        "prune_start, prune_start + prune_every, ... (the L_DMI script's timing) — AlanChou's reimplementation "
        "reads the checkpoint with the best test accuracy on the augmented loader, one epoch earlier; the L_DMI "
        "script's disabled pruning would have read only its last batch.",
    )

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        self.weights: torch.Tensor | None = None  # w_i over the training set (truncated variant only)
        self._labels: torch.Tensor | None = None
        self._predict_train: Callable[[], torch.Tensor] | None = None

    def setup(self, stage: StageContext) -> None:
        if self.truncated:
            self.weights = torch.ones(len(stage.noisy_train), device=stage.device)
            self._labels = stage.noisy_train
            self._predict_train = stage.predict_train

    def _lq_k(self) -> float:
        return (1.0 - self.k**self.q) / self.q

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        per_example = lq_loss(logits, labels, self.q)
        if self.truncated:
            # The truncated loss itself, min(L_q(f_y), L_q(k)): a function of the prediction alone, so it is
            # also what selects the checkpoint on the validation set (which has no pruning weights).
            per_example = per_example.clamp(max=self._lq_k())
        return per_example.mean(-1)

    def packable(self) -> bool:
        return not self.truncated  # the pruning weights are per-example state

    def logits_loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        per_example = lq_loss(logits, batch.y, self.q)
        if not self.truncated:
            return per_example.mean(-1)
        w = self.weights[batch.index]
        return (w * (per_example - self._lq_k())).mean()

    def prune(self, probs: torch.Tensor) -> None:
        """The pruning step: w_i = 1 where the label probability f_{y_i}(x_i) exceeds k, else 0."""
        fy = probs.gather(1, self._labels.unsqueeze(1)).squeeze(1)
        self.weights = (fy > self.k).to(self.weights.dtype)

    def end_epoch(self, epoch: int) -> None:
        done = epoch + 1  # epochs completed in the method stage
        if self.truncated and done >= self.prune_start and (done - self.prune_start) % self.prune_every == 0:
            self.prune(self._predict_train())

    def state_dict(self) -> dict[str, Any]:
        return {"weights": None if self.weights is None else self.weights.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights = None if state["weights"] is None else state["weights"].clone()
