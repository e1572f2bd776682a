"""Peer loss: the loss on an example minus alpha times the loss on a "peer" pairing of an independent input and label.

Liu, Guo. Peer Loss Functions: Learning from Noisy Labels without Knowing Noise Rates. ICML 2020. Like L_DMI,
it comes from peer prediction.

With l(h(x), y) = -log(softmax(h(x))_y + 1e-5), the floored CE of the authors' code (which keeps the peer term, and
with it the loss, bounded below: at most alpha log(1e5) = 11.5 alpha is subtracted),

    l_peer(x_i, y~_i) = l(h(x_i), y~_i) - alpha_e l(h(x_{p1}), y~_{p2})                (their Eq. 3)

with p1, p2 drawn independently and uniformly from the batch. alpha_e follows the authors' schedule for epoch e, and
the learning rate of epoch e is divided by 1 + alpha_e, as their training loop does. Their schedules start with
alpha = 0 epochs (plain CE: 20 on CIFAR-10, 120 on Fashion-MNIST), which the CE warm start plays; the method stage
starts where they end. `alpha_schedule` picks the runner:

    cifar10_sparse    alpha 0 -> 1 over 20 epochs, 1 -> 2 over 50, 2 -> 5 over 50, 5 -> 10 over 100, 10 -> 20 over 100
    cifar10_uniform   alpha 0 -> 0.1 over 20 epochs, 1 -> 2 over 50, 2 -> 2.5 over 50, 2.5 -> 3.3 over 100, 3.3 -> 5
    cifar100_sparse   alpha 0 -> 2 over 20 epochs, 2 -> 10 over 70, 10 -> 20 over 50 (after 110 CE epochs)
    cifar100_uniform  alpha 0.95 for 150 epochs (after 100 CE epochs)
    fashion_mnist     alpha 0 -> 1 over 180 epochs (their Fashion-MNIST and MNIST runners)
    constant          alpha = `alpha` every epoch

(each piece np.linspace(start, stop, epochs); the last value holds after the end; `f_alpha` in CIFAR-10/runner.py
lines 94-113, CIFAR-100/runner.py lines 98-114, Fashion_MNIST/runner.py lines 95-110). Each dataset runs its
reference's schedule: Fashion-MNIST its runner's own (`dataset_defaults`), CIFAR-100 its sparse one (declared in
CIFAR-100's file), every other dataset CIFAR-10's sparse setting, the default, whatever its noise: the paper's
CIFAR-10 and CIFAR-100 patterns flip a class to one other class (a sparse T, the case the sparse schedule is for), but
uniform and symmetric noise (a uniform T) and CIFAR-10N's human labels (no T) get it too; set `alpha_schedule` for
them. Expected over the peer draws, the second term is

    E[l(h(x_{p1}), y~_{p2})] = (1/N) sum_i sum_k P(y~ = k) l(h(x_i), k)

with P(y~) the empirical label frequencies; the selection criterion is this exact expectation at the fixed weight
`alpha` (1: the peer loss of their theory), so that epochs with different alpha_e are compared on one scale.

Reference: weijiaheng/Multi-class-Peer-Loss-functions (the authors' multi-class code), CIFAR-10/runner.py
(`CrossEntropyLossStable`, `f_alpha`, `adjust_learning_rate`), CIFAR-100/runner.py and Fashion_MNIST/runner.py, commit
fba9eb6d2b (gohsyi/PeerLoss holds only the binary UCI experiments). Differences (`PeerLoss.differences`):
- Peer inputs and labels are drawn, with replacement, from the batch and reuse its logits; theirs are two other
  batches of the training set with a second forward pass — one pass, and the same expectation.
- The schedule is the dataset's (a parameter), whatever the noise — their CIFAR runners pick sparse or uniform by the
  noise file's r (sparse at r = 0.1 and 0.2); the sparse one fits the paper's CIFAR patterns (one class to one other),
  not uniform or symmetric noise nor CIFAR-10N's human labels, which run it too unless `alpha_schedule` is set.
- On MR, Dogs vs Cats and Clothing1M the schedule is CIFAR-10's sparse one — the reference runs none of them.
- Selection by the peer loss at a fixed alpha on the noisy validation set — theirs by noisy validation accuracy
  (bench's protocol: the method's own loss).
- Optimiser and schedule are the stage's, divided by 1 + alpha_e — theirs: SGD 0.1 (/10 every 40 epochs) on CIFAR-10,
  Adam 1e-4 on Fashion-MNIST, re-created every epoch (a flaw not copied).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from bench.methods import Batch, Method, at_label, one_hot

FLOOR = 1e-5  # their CrossEntropyLossStable: the NLL of log(softmax + 1e-5)

# (start, stop, epochs) pieces of np.linspace, after each runner's leading alpha = 0 epochs.
SCHEDULES: dict[str, tuple[tuple[float, float, int], ...]] = {
    "cifar10_sparse": ((0.0, 1.0, 20), (1.0, 2.0, 50), (2.0, 5.0, 50), (5.0, 10.0, 100), (10.0, 20.0, 100)),
    "cifar10_uniform": ((0.0, 0.1, 20), (1.0, 2.0, 50), (2.0, 2.5, 50), (2.5, 3.3, 100), (3.3, 5.0, 100)),
    "cifar100_sparse": ((0.0, 2.0, 20), (2.0, 10.0, 70), (10.0, 20.0, 50)),
    "cifar100_uniform": ((0.95, 0.95, 150),),
    "fashion_mnist": ((0.0, 1.0, 180),),
}


def floored_losses(logits: torch.Tensor) -> torch.Tensor:
    """-log(softmax + 1e-5) for every label (..., B, C)."""
    return -(torch.softmax(logits.float(), dim=-1) + FLOOR).log()


class PeerLoss(Method):
    """Floored CE on the batch minus alpha_e times floored CE on randomly re-paired inputs and labels."""

    name = "peer"
    title = "Peer loss"
    paper = "Liu, Guo. Peer Loss Functions: Learning from Noisy Labels without Knowing Noise Rates. ICML 2020"
    reference = "weijiaheng/Multi-class-Peer-Loss-functions, CIFAR-10/runner.py (f_alpha, lines 94-113), " \
        "CIFAR-100/runner.py (f_alpha, lines 98-114) and Fashion_MNIST/runner.py (f_alpha, lines 95-110), " \
        "commit fba9eb6d2b"
    differences = (
        "peer inputs and labels drawn with replacement from the batch, reusing its logits; theirs are two other "
        "batches of the training set with a second forward pass — one pass, the same expectation",
        "the schedule is the dataset's (alpha_schedule: Fashion-MNIST's own, CIFAR-100's sparse one, CIFAR-10's "
        "sparse one elsewhere) — their CIFAR runners pick sparse or uniform by the noise file's r (sparse at r = 0.1 "
        "and 0.2); the sparse one fits the paper's CIFAR patterns, which flip a class to one other class (a sparse "
        "T), not uniform or symmetric noise (a uniform T) nor CIFAR-10N's human labels (no T), which run it too "
        "unless alpha_schedule is set (cifar10_uniform is their uniform-noise schedule)",
        "on MR, Dogs vs Cats and Clothing1M the schedule is CIFAR-10's sparse one — the reference runs none of them",
        "selection by the peer loss at the fixed alpha on the noisy validation set; theirs by noisy validation "
        "accuracy — bench's protocol: the method's own loss",
        "optimiser and schedule are the stage's, divided by 1 + alpha_e — theirs: SGD 0.1 (/10 every 40 epochs) on "
        "CIFAR-10, Adam 1e-4 on Fashion-MNIST, re-created every epoch (a flaw not copied)",
    )
    defaults: dict[str, Any] = {"alpha_schedule": "cifar10_sparse", "alpha": 1.0}
    # Fashion_MNIST/runner.py's own f_alpha (CIFAR-100's is declared in its dataset file).
    dataset_defaults: ClassVar[dict[str, dict[str, Any]]] = {"fashion_mnist": {"alpha_schedule": "fashion_mnist"}}
    ranges: ClassVar[dict[str, str]] = {"alpha": "[0, inf)"}
    choices: ClassVar[dict[str, tuple[Any, ...]]] = {"alpha_schedule": (*SCHEDULES, "constant")}

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        pieces = SCHEDULES.get(self.alpha_schedule, ((self.alpha, self.alpha, 1),))
        self.schedule = np.concatenate([np.linspace(a, b, n) for a, b, n in pieces]).tolist()

    def alpha_at(self, epoch: int) -> float:
        """alpha_e, the weight of the peer term in method-stage epoch `epoch` (0-based)."""
        return self.schedule[min(epoch, len(self.schedule) - 1)]

    def lr_factor(self, epoch: int) -> float:
        return 1.0 / (1.0 + self.alpha_at(epoch))

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # Deterministic: the peer term in expectation over the peer draws, not one random draw, so that two
        # checkpoints are compared without sampling noise.
        losses = floored_losses(logits)
        prior = one_hot(labels, self.num_classes, losses.dtype).mean(dim=-2)  # (..., C), no host sync
        return at_label(losses, labels).mean(-1) - self.alpha * (losses.mean(dim=-2) * prior).sum(-1)

    def logits_loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        n = batch.y.shape[-1]
        p1, p2 = batch.randint(n), batch.randint(n)
        losses = floored_losses(logits)
        peer = at_label(losses.gather(-2, p1.unsqueeze(-1).expand(*p1.shape, losses.shape[-1])), batch.y.gather(-1, p2))
        return at_label(losses, batch.y).mean(-1) - self.alpha_at(batch.epoch) * peer.mean(-1)

