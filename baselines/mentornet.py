"""MentorNet-PD: sample weighting by a pre-defined curriculum on the loss, with a moving-average threshold.

Jiang, Zhou, Leung, Li, Fei-Fei. MentorNet: Learning Data-Driven Curriculum for Very Deep Neural Networks on
Corrupted Labels. ICML 2018.

MentorNet-PD is the mentor that computes a pre-defined curriculum instead of learning one; this one is the
self-paced curriculum, in closed form: an example takes part in the step only if its loss is at most a threshold
lambda, the moving average of the p-th percentile of the mini-batch losses (the "loss moving average" input of the
reference's mentor):

    l_i = CE(h(x_i), y~_i)
    lambda_t = d * lambda_{t-1} + (1 - d) * percentile_p({l_i} of the batch)        (d = 0.5, p = 0.7)
    v_i = 1[l_i <= lambda_t]                                             (self-paced: argmin_v v l - lambda v)
    loss = (1/B) sum_i v_i l_i                                                     (weights are not differentiated)

The percentile is the batch's value nearest to rank p (B - 1), as TensorFlow's `percentile` takes it; d = 0.5 is
the reference's `--loss_moving_average_decay` flag, which its commands keep (0.9, the default of its `mentornet`
function, is what the scripts override); p = 0.7 is its self-paced command's `--loss_p_percentile`, with no
example dropout and no burn-in. lambda_0 is the p-th percentile of the warm-started model's losses on the training
set (the warm start plays the role of the burn-in epochs, during which every weight is 1).

Reference: google/mentornet, code/utils.py, code/cifar_train_mentornet.py and
code/training_mentornet/models.py (commit 76d6be2).

Differences (`MentorNetPD.differences`):
- The mentor is the self-paced curriculum's closed form, v = 1[l <= lambda] — the reference runs a trained MentorNet
  network that approximates such a curriculum (its weights are a separate download); its 'MentorNet PD' commands use
  another curriculum (weight 1 for the first 18% of training, self-paced until 90%, then linear) with p = 0.75 (0.5
  at 80% noise) and example dropout (half the batch for the first 17% of training).
- lambda starts at the warm-started model's p-th loss percentile over the training set — the reference starts the
  moving average at 0, so its first steps drop more than 1 - p of a batch (at d = 0.5, lambda reaches 97% of the
  batch percentile after 5 steps).
- Weight decay is the stage optimiser's — the reference scales its decay term by the fraction of the batch selected
  (sum(v) / B).
- The student trains with the stage's optimiser and schedule, after the CE warm start — the reference trains its
  ResNet from scratch with its own MomentumOptimizer (momentum 0.9) at lr 0.1, x 0.1 at steps 19,531, 25,000 and
  30,000 of 39,000 (batch 128), weight decay 2e-4 (code/cifar_train_mentornet.py lines 164-173, 238-251); bench's
  protocol: every method's stage is the dataset's (the paper's section 5.2).
- Selection: CE over the p fraction of noisy-validation examples with the smallest loss — the reference evaluates
  its last checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from bench.methods import Batch, Method, StageContext, per_example_ce


def trimmed_mean(per_example: torch.Tensor, keep: float) -> torch.Tensor:
    """Mean of the smallest `keep` fraction of the values (at least one), over the last dimension."""
    k = max(1, int(round(keep * per_example.shape[-1])))
    return per_example.topk(k, largest=False).values.mean(-1)


class MentorNetPD(Method):
    """Self-paced sample weights: drop the examples whose loss exceeds a moving loss percentile."""

    name = "mentornet"
    title = "MentorNet-PD"
    paper = "Jiang, Zhou, Leung, Li, Fei-Fei. MentorNet: Learning Data-Driven Curriculum for Very Deep Neural " \
        "Networks on Corrupted Labels. ICML 2018"
    defaults: dict[str, Any] = {"percentile": 0.7, "decay": 0.5}
    ranges = {"percentile": "(0, 1]", "decay": "[0, 1)"}  # decay 1 would freeze lambda at its first value
    member_state = ("threshold",)  # in a pack, each member's own lambda
    reference = "google/mentornet, code/utils.py, code/cifar_train_mentornet.py (the student's optimiser, lines " \
        "164-173 and 238-251) and code/training_mentornet/models.py, commit 76d6be2"
    differences = (
        "The mentor is the self-paced curriculum's closed form, v = 1[l <= lambda] — the reference runs a trained "
        "MentorNet network that approximates such a curriculum (its weights are a separate download); its "
        "'MentorNet PD' commands use another curriculum (weight 1 for the first 18% of training, self-paced until "
        "90%, then linear) with p = 0.75 (0.5 at 80% noise) and example dropout (half the batch for the first 17% "
        "of training).",
        "lambda starts at the warm-started model's p-th loss percentile over the training set — the reference starts "
        "the moving average at 0, so its first steps drop more than 1 - p of a batch (at d = 0.5, lambda reaches "
        "97% of the batch percentile after 5 steps).",
        "Weight decay is the stage optimiser's — the reference scales its decay term by the fraction of the batch "
        "selected (sum(v) / B).",
        "The student trains with the stage's optimiser and schedule, after the CE warm start — the reference trains "
        "its ResNet from scratch with its own MomentumOptimizer (momentum 0.9) at lr 0.1, x 0.1 at steps 19,531, "
        "25,000 and 30,000 of 39,000 (batch 128), weight decay 2e-4 (code/cifar_train_mentornet.py lines 164-173, "
        "238-251); bench's protocol: every method's stage is the dataset's (the paper's section 5.2).",
        "Selection: CE over the p fraction of noisy-validation examples with the smallest loss — the reference "
        "evaluates its last checkpoint.",
    )

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        # lambda, the moving average of the loss percentile: a tensor on the training device, so that a step never
        # waits for a value to come back to the host.
        self.threshold: torch.Tensor | None = None

    def setup(self, stage: StageContext) -> None:
        probs = stage.predict_train()
        losses = -probs.gather(1, stage.noisy_train.unsqueeze(1)).squeeze(1).clamp_min(1e-12).log()
        self.threshold = torch.quantile(losses.float(), self.percentile, interpolation="nearest")

    def weights(self, losses: torch.Tensor) -> torch.Tensor:
        """Move lambda with this batch's percentile, then v_i = 1[l_i <= lambda]. Losses (..., B): a pack's
        members (leading dimensions) each move their own lambda."""
        percentile = torch.quantile(losses.detach().float(), self.percentile, dim=-1, interpolation="nearest")
        self.threshold = percentile if self.threshold is None else \
            self.decay * self.threshold + (1 - self.decay) * percentile
        return (losses.detach() <= self.threshold.unsqueeze(-1)).to(losses.dtype)

    def logits_loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        losses = per_example_ce(logits, batch.y)
        return (self.weights(losses) * losses).mean(-1)

    def judged_noisy(self, logits: torch.Tensor, labels: torch.Tensor, epoch: int,
                     index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Weight 0 at the current threshold lambda: the examples whose loss is above it."""
        if self.threshold is None:
            return None
        losses = F.cross_entropy(logits.float(), labels, reduction="none")
        return losses, losses > self.threshold

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # Selection: CE over the `percentile` fraction of validation examples with the smallest loss. A fixed
        # fraction of the set, not the training threshold: with a fixed threshold a model could lower the
        # criterion by pushing examples above it, and the threshold moves between epochs.
        return trimmed_mean(per_example_ce(logits, labels), self.percentile)

    def state_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.threshold = state["threshold"]
