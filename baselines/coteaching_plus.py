"""Co-teaching+: Co-teaching restricted to the examples on which the two networks disagree.

Yu, Han, Yao, Niu, Tsang, Sugiyama. How does Disagreement Help Generalization against Label Corruption?
ICML 2019.

For a batch B, the epoch's keep rate R(e) (Co-teaching's, forget rate and ramp included) and the two networks f, g:

    D   = {i in B : argmax f(x_i) != argmax g(x_i)}                       (disagreement)
    D_f = the floor(R(e) |D|) examples of D with the smallest CE under f (all of D where that is 0); D_g likewise
    loss = CE_f on D_g + CE_g on D_f                                      (cross update, their Alg. 1)

A batch on which the networks agree everywhere trains neither (loss 0), as the paper's code does once its step
count (epoch x batch index) passes 5000. The paper's first `init_epoch` epochs (20 on CIFAR-10, 5 on CIFAR-100, 0 on
MNIST) run plain Co-teaching; our CE warm start plays that part, so the disagreement step runs from the first method
epoch, at the forget rate the reference has reached by then: their `rate_schedule` (Co-teaching's, np.linspace(0,
tau, num_gradual) then tau) is indexed by their epoch, whose disagreement epochs are max(init_epoch, 1), ... (their
epoch 0 only evaluates), so method-stage epoch e forgets rate_schedule[max(init_epoch, 1) + e]: the full rate tau
from the start on CIFAR-10 (20 >= num_gradual = 10), 5/9 of it on CIFAR-100 (main.py lines 71-75, 92-96, 180-192,
251-255). `init_epoch` defaults to CIFAR-10's 20; CIFAR-100's file declares its 5. The two networks are the trainer's
two warm starts (different seeds). Nothing is augmented or mixed, so it runs unchanged on images and on text.

Reference: xingruiyu/coteaching_plus (the authors' code), main.py (`gen_forget_rate`, `init_epoch`) and loss.py
(`loss_coteaching_plus`), commit a68ed61288. Differences (`CoTeachingPlus.differences`):
- CE of the logits; theirs applies CE to the softmax outputs in the disagreement step (softmax taken twice) and
  divides each mean once more by the number kept — bugs of the released code, not copied.
- An all-agree batch in the first 5000 of their steps trains both networks on all of it — not reproduced: the warm
  start stands for those early steps.
- Warm start by CE, not by their init_epoch epochs of Co-teaching — bench's protocol.
- One optimiser, the stage's, over both networks — theirs: two Adam at lr 1e-3, decayed linearly from epoch 80.
- Selection as Co-teaching's (theirs selects none).
- init_epoch is CIFAR-10's 20 on the datasets the reference does not run — it has no setting there.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bench.baselines.coteaching import CoTeaching
from bench.methods import Batch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` (0 where none), without indexing by a data-dependent shape (no host sync)."""
    weights = mask.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp_min(1.0)


def disagreement_mask(
    loss_f: torch.Tensor, loss_g: torch.Tensor, disagree: torch.Tensor, keep: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pick_f, pick_g): the floor(keep |D|) smallest-loss examples of D under f and under g, all of D where that
    floor is 0 (their `loss_coteaching`)."""
    size = disagree.sum()
    k = (keep * size).floor()
    k = torch.where(k == 0, size.to(k.dtype), k)
    big = torch.finfo(loss_f.dtype).max
    ranks_f = torch.where(disagree, loss_f.detach(), big).argsort().argsort()
    ranks_g = torch.where(disagree, loss_g.detach(), big).argsort().argsort()
    return disagree & (ranks_f < k), disagree & (ranks_g < k)


class CoTeachingPlus(CoTeaching):
    """Two networks exchange their small-loss examples among those they disagree on."""

    name = "coteaching_plus"
    title = "Co-teaching+"
    paper = "Yu, Han, Yao, Niu, Tsang, Sugiyama. How does Disagreement Help Generalization against Label " \
        "Corruption? ICML 2019"
    reference = "xingruiyu/coteaching_plus, main.py (gen_forget_rate, init_epoch) and loss.py " \
        "(loss_coteaching_plus), commit a68ed61288"
    differences = (
        "CE of the logits; theirs applies CE to the softmax outputs in the disagreement step (softmax taken twice) "
        "and divides each mean once more by the number kept — bugs of the released code, not copied",
        "an all-agree batch in the first 5000 of their steps (epoch x batch index) trains both networks on all of "
        "it — not reproduced: the warm start stands for those early steps",
        "warm start by CE, not by their init_epoch epochs of Co-teaching — bench's protocol",
        "one optimiser, the stage's, over both networks — theirs: two Adam at lr 1e-3, decayed linearly from "
        "epoch 80",
        "selection as Co-teaching's: CE over the (1 - tau) smallest-loss fraction of the noisy validation set "
        "— theirs selects none",
        "init_epoch is CIFAR-10's 20 (the full forget rate from the first method epoch) on the datasets the "
        "reference does not run (Fashion-MNIST, Dogs vs Cats, MR, Clothing1M) — it has no setting there, and the "
        "CE warm start, a whole training, stands for more than any ramp",
    )
    # Hyper-parameters: Co-teaching's (forget rate and its ramp), and the reference's init_epoch, the epochs of plain
    # Co-teaching the warm start stands for (where the ramp is when the disagreement step starts).
    defaults: dict[str, Any] = {**CoTeaching.defaults, "init_epoch": 20}
    ranges: ClassVar[dict[str, str]] = {**CoTeaching.ranges, "init_epoch": "[0, inf)"}
    version = 2  # 2: the ramp goes on from the reference's init_epoch (was restarted at the method stage)

    def keep_rate(self, epoch: int) -> float:
        """R(e) = 1 - rate_schedule[max(init_epoch, 1) + e]: the reference's rate in its disagreement epoch e."""
        return super().keep_rate(max(self.init_epoch, 1) + epoch - 1)

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        logits_f, logits_g = nets[0](batch.x), nets[1](batch.x)
        loss_f = F.cross_entropy(logits_f, batch.y, reduction="none")
        loss_g = F.cross_entropy(logits_g, batch.y, reduction="none")
        disagree = logits_f.argmax(dim=1) != logits_g.argmax(dim=1)
        pick_f, pick_g = disagreement_mask(loss_f, loss_g, disagree, self.keep_rate(batch.epoch))
        return masked_mean(loss_f, pick_g) + masked_mean(loss_g, pick_f)
