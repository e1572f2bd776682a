"""T-revision: importance reweighting with an anchor-point T, then a learned slack Delta T that revises it.

Xia, Liu, Wang, Han, Gong, Niu, Sugiyama. Are Anchor Points Really Indispensable in Label-Noise Learning?
NeurIPS 2019.

With p = softmax(h(x)) the clean posterior and T^ the anchor estimate (rows = true class; the same estimator as
`fw`, with the reference's 97th-percentile anchors, from the warm-started model), the noisy posterior is
p (T^ + Delta T), and the risk is importance-reweighted towards the clean distribution:

    beta(x, y~) = p_{y~}(x) / [p(x) (T^ + Delta T)]_{y~}
    loss = mean_i beta(x_i, y~_i) CE(h(x_i), y~_i)                                      (their Eq. 5-7)

Two phases, as the reference's `main.py` runs them:

* reweighting (the first `revision_start` fraction of the method stage): Delta T = 0 and beta is a constant
  weight (their `reweight_loss` wraps it in a new leaf Variable, which detaches it); the network trains with the
  stage's optimiser (theirs: SGD lr 0.01, momentum 0.9, weight decay 1e-4, x 0.1 at epochs 40 and 80, main.py lines
  84, 86, 240: a difference below);
* revision (the rest): Delta T starts at 0 and is learned with the network. beta is differentiable in both (their
  `reweighting_revision_loss`): it is the only place Delta T enters, and the network also learns through it. Both
  train with one Adam of their own, lr 5e-7, weight decay 1e-4 (their `optimizer_revision` over
  `model.parameters()`, which hold the network and Delta T), in place of the stage's optimiser
  (`network_optimizer`).

The estimate recorded is T^ + Delta T.

T^'s anchors: the 97th-percentile filter, the arg max on CIFAR-100 (declared in its file; main.py line 78,
estimate_state = False, passed to tools.fit as filter_outlier).

Reference: xiaoboxia/T-Revision, main.py, loss.py and tools.py (commit b598cf2800b9909ba3b461f9f19b2847e941e1db).

Differences (`TRevision.differences`):
- T^ comes from the CE warm start, on the unaugmented training split — the reference trains 20 CE epochs, keeps the
  one with the best noisy-validation accuracy and predicts on the augmented training loader.
- The phases are fractions of one method stage (revision_start = 0.5: the reference's 200 + 200 epochs), and the
  revision goes on from the last reweighting epoch — the reference restarts it from the reweighting epoch with the
  best noisy-validation accuracy; a stage keeps one line of training.
- The revision loss adds Delta T once to T^ for the batch (the paper, and the repository's own
  reweighting_revision_loss_v2) — the per-example loop that main.py calls adds it once per example, so the i-th
  example of a batch sees T^ + (i + 1) Delta T, a bug.
- Selection: the lowest reweighted loss on the noisy validation set over both phases — the reference keeps the
  reweighting epoch with the best noisy-validation accuracy and reports the revision's epochs.
- The reweighting phase trains with the stage's optimiser and schedule (CIFAR-10: SGD 1e-5, momentum 0.9, weight
  decay 1e-4) — the reference's `optimizer`: SGD at lr 0.01, momentum 0.9, weight decay 1e-4, x 0.1 from its epoch
  40 and 80 of 200 (MultiStepLR [40, 80] stepped at each epoch's start; main.py lines 84, 86, 240); bench's protocol:
  every method's stage is the dataset's, and the warm start has already trained the network (the reference's lr
  0.01 starts from its 20 CE epochs).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from bench.baselines.fw import anchor_transition
from bench.methods import Batch, Method, StageContext


def reweighted_ce(logits: torch.Tensor, labels: torch.Tensor, transition: torch.Tensor,
                  constant_weights: bool = True) -> torch.Tensor:
    """Mean over the last batch dimension of beta CE, beta = p_{y~} / (p T)_{y~}; logits (..., B, C). With
    `constant_weights` beta is a constant (the reweighting phase); otherwise it is differentiable in the logits and
    in T (the revision phase)."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    p = log_p.exp()
    clean = p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    noisy = (p @ transition.float()).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    beta = clean / noisy.clamp_min(torch.finfo(noisy.dtype).tiny)
    if constant_weights:
        beta = beta.detach()
    return (beta * -log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)).mean(dim=-1)


class TRevision(Method):
    """Importance reweighting by the anchor T, then a learned slack that revises it, trained with the network."""

    name = "trevision"
    title = "T-revision"
    paper = "Xia, Liu, Wang, Han, Gong, Niu, Sugiyama. Are Anchor Points Really Indispensable in Label-Noise " \
        "Learning? NeurIPS 2019"
    defaults: dict[str, Any] = {"quantile": 0.97, "lr_revision": 5e-7, "weight_decay_revision": 1e-4,
                                "revision_start": 0.5}
    ranges: ClassVar[dict[str, str]] = {"quantile": "(0, 1]", "lr_revision": "(0, inf)",
                                        "weight_decay_revision": "[0, inf)", "revision_start": "[0, 1]"}
    reference = "xiaoboxia/T-Revision, main.py (the reweighting optimiser, lines 84 and 86, the revision's, line " \
        "85), loss.py and tools.py, commit b598cf2"
    differences = (
        "T^ comes from the CE warm start, on the unaugmented training split — the reference trains 20 CE epochs, "
        "keeps the one with the best noisy-validation accuracy and predicts on the augmented training loader.",
        "The phases are fractions of one method stage (revision_start = 0.5: the reference's 200 + 200 epochs), and "
        "the revision goes on from the last reweighting epoch — the reference restarts it from the reweighting "
        "epoch with the best noisy-validation accuracy; a stage keeps one line of training.",
        "The revision loss adds Delta T once to T^ for the batch (the paper, and the repository's own "
        "reweighting_revision_loss_v2) — the per-example loop that main.py calls adds it once per example, so the "
        "i-th example of a batch sees T^ + (i + 1) Delta T, a bug.",
        "Selection: the lowest reweighted loss on the noisy validation set over both phases — the reference keeps "
        "the reweighting epoch with the best noisy-validation accuracy and reports the revision's epochs.",
        "The reweighting phase trains with the stage's optimiser and schedule (CIFAR-10: SGD 1e-5, momentum 0.9, "
        "weight decay 1e-4) — the reference's optimizer: SGD at lr 0.01, momentum 0.9, weight decay 1e-4, x 0.1 from "
        "its epoch 40 and 80 of 200 (MultiStepLR [40, 80] stepped at each epoch's start, main.py lines 84, 86, 240); "
        "bench's protocol: every method's stage is the dataset's, and the warm start has already trained the network "
        "(the reference's lr 0.01 starts from its 20 CE epochs).",
    )

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        self.anchor = torch.eye(num_classes, dtype=torch.float32)
        self.slack = torch.nn.Parameter(torch.zeros(num_classes, num_classes))
        self.optimizer: torch.optim.Optimizer | None = None
        self.start_epoch = 0

    def setup(self, stage: StageContext) -> None:
        self.anchor = anchor_transition(stage.predict_train(), self.quantile).float().to(stage.device)
        self.slack = torch.nn.Parameter(torch.zeros_like(self.anchor))
        self.optimizer = torch.optim.Adam([*stage.nets[0].parameters(), self.slack], lr=self.lr_revision,
                                          weight_decay=self.weight_decay_revision)
        self.start_epoch = int(round(self.revision_start * stage.epochs))

    def transition(self) -> torch.Tensor:
        return self.anchor + self.slack

    def network_optimizer(self, epoch: int) -> torch.optim.Optimizer | None:
        return self.optimizer if epoch >= self.start_epoch else None

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return reweighted_ce(logits, labels, self.transition().to(logits.device))

    def train_loss(self, nets: list[torch.nn.Module], batch: Batch) -> torch.Tensor:
        logits = nets[0](batch.x)
        if batch.epoch < self.start_epoch:
            return reweighted_ce(logits, batch.y, self.anchor)
        return reweighted_ce(logits, batch.y, self.transition(), constant_weights=False)

    def state_dict(self) -> dict[str, Any]:
        return {"anchor": self.anchor.clone(), "slack": self.slack.detach().clone(),
                "optimizer": None if self.optimizer is None else self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.anchor = state["anchor"].clone()
        with torch.no_grad():
            self.slack.copy_(state["slack"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])

    def estimated_transition(self) -> np.ndarray | None:
        with torch.no_grad():
            return self.transition().double().cpu().numpy()
