"""Co-teaching: two networks, each trained on the small-loss examples chosen by the other.

Han, Yao, Yu, Niu, Xu, Hu, Tsang, Sugiyama. Co-teaching: Robust Training of Deep Neural Networks with Extremely
Noisy Labels. NeurIPS 2018.

For a batch B and the keep rate R(e) of method-stage epoch e (0-based):

    B_f = the floor(R(e) |B|) examples of smallest CE under net f;   B_g likewise under net g
    loss = CE_f on B_g + CE_g on B_f                         (cross update: each learns from the other's pick)
    R(e) = 1 - tau^c (e + 1) / (T_k - 1)  while e + 1 < T_k,  then 1 - tau         (their code's rate_schedule)

The ramp is their code's: np.linspace(0, tau^c, T_k) indexed by the training epoch, which starts at 1 (epoch 0
evaluates the untrained networks); with c = 1, the default, it is the paper's R(T) = 1 - min(T tau / T_k, tau) up to
that index. tau, the forget rate, is the noise rate in their code (`forget_rate = noise_rate` unless given): by
default the fraction of training labels the trial's noise is expected to corrupt (`StageContext.noise_rate`), which
for their symmetric and pair-flip noise is their noise rate, and which JoCoR's code halves for its asymmetric noise
that flips half the classes. The L_DMI paper's r is not that fraction (on CIFAR-10 it flips 4 of 10 classes: 0.4 r).
Knowing it is privileged information, as the paper assumes. An explicit `forget_rate` replaces it. The two networks
are the trainer's two CE warm starts (different seeds); nets[0] is the one selected and evaluated.

Reference: bhanML/Co-teaching (the authors' code), main.py (`rate_schedule`, `forget_rate`) and loss.py
(`loss_coteaching`), commit 7c7fbe23e1. Differences (`CoTeaching.differences`):
- Each network's loss is the mean CE over the other's picks; theirs divides that mean once more by the number kept
  (`torch.sum(mean) / num_remember`) — a rescaling their Adam mostly absorbs; not copied.
- The networks start from two CE warm starts, not from scratch — bench's protocol; the ramp starts with the method
  stage.
- One optimiser, the stage's, over both networks (the summed loss gives each its own gradient) — theirs: two Adam,
  lr 1e-3 decayed linearly to 0 from epoch 80 with beta1 0.9 -> 0.1.
- Selection on nets[0] by CE over the (1 - tau) smallest-loss fraction of the noisy validation set — theirs selects
  none (test accuracy per epoch).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.baselines.mentornet import trimmed_mean
from bench.config import UserError
from bench.methods import Batch, FromTrial, Method, StageContext

NOISE_RATE = FromTrial(float, "the trial's noise rate")


def small_loss_mask(losses: torch.Tensor, keep: float) -> torch.Tensor:
    """Boolean mask of the floor(keep N) smallest losses (at least one)."""
    n = losses.numel()
    k = max(1, min(n, int(keep * n + 1e-9)))
    mask = torch.zeros(n, dtype=torch.bool, device=losses.device)
    mask[losses.detach().topk(k, largest=False).indices] = True
    return mask


class CoTeaching(Method):
    """Two networks exchange their small-loss examples; the forget rate ramps up over T_k epochs."""

    name = "coteaching"
    title = "Co-teaching"
    paper = "Han, Yao, Yu, Niu, Xu, Hu, Tsang, Sugiyama. Co-teaching: Robust Training of Deep Neural Networks " \
        "with Extremely Noisy Labels. NeurIPS 2018"
    reference = "bhanML/Co-teaching, main.py (rate_schedule, forget_rate) and loss.py (loss_coteaching), " \
        "commit 7c7fbe23e1"
    differences = (
        "each network's loss is the mean CE over the other's picks; theirs divides that mean once more by the number "
        "kept — a rescaling their Adam mostly absorbs; not copied",
        "the networks start from two CE warm starts, not from scratch — bench's protocol; the ramp starts with the "
        "method stage",
        "one optimiser, the stage's, over both networks (the summed loss gives each its own gradient) — theirs: two "
        "Adam, lr 1e-3 decayed linearly to 0 from epoch 80 with beta1 0.9 -> 0.1",
        "selection on nets[0] by CE over the (1 - tau) smallest-loss fraction of the noisy validation set — theirs "
        "selects none (test accuracy per epoch)",
    )
    defaults: dict[str, Any] = {"forget_rate": NOISE_RATE, "num_gradual": 10, "exponent": 1.0}
    # tau < 1 keeps some examples; T_k <= 1 forgets at the full rate from the start; c > 0 makes the ramp rise.
    ranges = {"forget_rate": "[0, 1)", "num_gradual": "[0, inf)", "exponent": "(0, inf)"}
    networks = 2

    def setup(self, stage: StageContext) -> None:
        if isinstance(self.forget_rate, FromTrial):
            if not math.isfinite(stage.noise_rate):
                raise UserError(f"{self.name}: this trial's noise rate is unknown (no clean labels for its noisy "
                                "training labels); give the forget rate, e.g. --param forget_rate=0.4")
            self.forget_rate = stage.noise_rate

    def keep_rate(self, epoch: int) -> float:
        """R(e) = 1 - rate_schedule[e + 1], rate_schedule = linspace(0, tau^c, T_k) and tau after."""
        step = epoch + 1
        if step >= self.num_gradual:
            return 1.0 - self.forget_rate
        return 1.0 - self.forget_rate ** self.exponent * step / (self.num_gradual - 1)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # Selection on nets[0] alone: CE over its small-loss (1 - tau) fraction of the validation set, a fixed
        # fraction so that epochs with different R(e) are comparable (a smaller kept share would always win).
        return trimmed_mean(F.cross_entropy(logits, labels, reduction="none"), 1.0 - self.forget_rate)

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        f, g = nets[0], nets[1]
        loss_f = F.cross_entropy(f(batch.x), batch.y, reduction="none")
        loss_g = F.cross_entropy(g(batch.x), batch.y, reduction="none")
        keep = self.keep_rate(batch.epoch)
        pick_f, pick_g = small_loss_mask(loss_f, keep), small_loss_mask(loss_g, keep)
        return loss_f[pick_g].mean() + loss_g[pick_f].mean()

    def judged_noisy(self, logits: torch.Tensor, labels: torch.Tensor, epoch: int,
                     index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """nets[0]'s small-loss selection at the keep rate of the coming epoch, over the examples given (the
        diagnostics' training sample; the training step selects within each batch): examples outside the
        floor(R(e) N) smallest CE are flagged."""
        losses = F.cross_entropy(logits.float(), labels, reduction="none")
        return losses, ~small_loss_mask(losses, self.keep_rate(epoch))
