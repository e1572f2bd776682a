"""f-divergence: maximise a variational lower bound of D_f between the joint distribution of (prediction, noisy
label) and the product of their marginals.

Wei, Liu. When Optimizing f-Divergence is Robust with Label Noise. ICLR 2021.

With the variational form D_f(P || Q) = sup_g E_P[g] - E_Q[f*(g)] (Nowozin et al. 2016), the classifier's
probability of a label v = softmax(h(x))_y plays the variational function through an output activation g:

    D_f(h) = E_{(x, y~) ~ joint}[ g(p_{y~}(x)) ] - E_{x ~ P_X, y~ ~ P_Y~ independently}[ f*(g(p_{y~}(x))) ]
    loss   = -D_f(h)                                                                 (their Eq. 4-5)

The paper estimates the second expectation on a peer batch (inputs and labels drawn independently); training
does the same with two independent in-batch permutations, while the selection criterion takes the exact
expectation sum_k P(y~ = k) f*(g(p_k(x))), P(y~) the labels' frequencies. Pairs (g, f* o g) of the paper's code:

    total_variation   g = tanh(v) / 2                f*(g) = g                  (the default)
    jensen_shannon    g = log 2 - log(1 + e^-v)      f*(g) = log(1 + e^v) - log 2
    pearson           g = v                          f*(g) = v^2 / 4 + v
    kl                g = v                          f*(g) = exp(v - 1)
    jeffrey           g = v                          f*(g) = v + v^2 / 4 + v^3 / 16

For total variation f*(g) = g, so a classifier whose prediction ignores x scores exactly D_f = 0; the paper's CE
warm-up is our warm start.

Reference: UCSC-REAL/Robust-f-divergence-measures (the authors' code), CIFAR-10/runner.py (`activation`,
`conjugate`, `train`, `f_calculate`), commit 93d9efe616. Differences (`FDivergence.differences`):
- Peer inputs and labels are two permutations of the batch, reusing its logits; theirs are two other batches of
  the training set with a second forward pass — one pass, the same expectation.
- The five divergences their README lists as used; the code also defines Reverse-KL, Squared-Hellinger and Neyman.
- Total variation by default — their runner takes the divergence as a required argument.
- Selection by -D_f on the noisy validation set with the exact product expectation — theirs maximises D_f on it
  with peer batches (the same criterion, estimated).
- Optimiser and schedule are the stage's — theirs: SGD (momentum 0.9, weight decay 5e-4) at 0.01, /10 at epochs 30,
  60 and 90 of 100, re-created every epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bench.config import UserError
from bench.methods import Batch, Method

Pair = tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]

DIVERGENCES: dict[str, Pair] = {
    "total_variation": (lambda v: 0.5 * torch.tanh(v), lambda v: 0.5 * torch.tanh(v)),
    "jensen_shannon": (lambda v: math.log(2.0) - F.softplus(-v), lambda v: F.softplus(v) - math.log(2.0)),
    "pearson": (lambda v: v, lambda v: v * v / 4.0 + v),
    "kl": (lambda v: v, lambda v: torch.exp(v - 1.0)),
    "jeffrey": (lambda v: v, lambda v: v + v * v / 4.0 + v**3 / 16.0),
}


class FDivergence(Method):
    """-D_f between the joint (x, y~) and the product of marginals, on the label's predicted probability."""

    name = "fdiv"
    title = "f-divergence (variational)"
    paper = "Wei, Liu. When Optimizing f-Divergence is Robust with Label Noise. ICLR 2021"
    reference = "UCSC-REAL/Robust-f-divergence-measures, CIFAR-10/runner.py (activation, conjugate, train, " \
        "f_calculate), commit 93d9efe616"
    differences = (
        "peer inputs and labels are two permutations of the batch, reusing its logits; theirs are two other batches "
        "of the training set with a second forward pass — one pass, the same expectation",
        "the five divergences their README lists as used — the code also defines Reverse-KL, Squared-Hellinger and "
        "Neyman",
        "total variation by default — their runner takes the divergence as a required argument",
        "selection by -D_f on the noisy validation set with the exact product expectation — theirs maximises D_f on "
        "it with peer batches (the same criterion, estimated)",
        "optimiser and schedule are the stage's — theirs: SGD (momentum 0.9, weight decay 5e-4) at 0.01, /10 at "
        "epochs 30, 60 and 90 of 100, re-created every epoch",
    )
    defaults: dict[str, Any] = {"divergence": "total_variation"}
    choices: ClassVar[dict[str, tuple]] = {"divergence": tuple(DIVERGENCES)}

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        if self.divergence not in DIVERGENCES:
            raise UserError(f"fdiv: divergence must be one of {', '.join(DIVERGENCES)}, got {self.divergence!r}")
        self.g, self.conjugate = DIVERGENCES[self.divergence]

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(logits.float(), dim=-1)  # (..., B, C)
        joint = self.g(p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)).mean(dim=-1)
        prior = F.one_hot(labels, self.num_classes).float().mean(dim=-2)  # (..., C): P(y~)
        product = (self.conjugate(p).mean(dim=-2) * prior).sum(dim=-1)
        return product - joint

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        p = torch.softmax(nets[0](batch.x).float(), dim=1)
        n = batch.y.numel()
        joint = self.g(p.gather(1, batch.y.unsqueeze(1)).squeeze(1)).mean()
        inputs, labels = torch.randperm(n, device=p.device), torch.randperm(n, device=p.device)
        product = self.conjugate(p[inputs].gather(1, batch.y[labels].unsqueeze(1)).squeeze(1)).mean()
        return product - joint
