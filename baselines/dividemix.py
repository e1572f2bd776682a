"""DivideMix: two networks, each dividing the data for the other by a Gaussian mixture on the per-example losses,
then semi-supervised MixMatch on the division.

Li, Socher, Hoi. DivideMix: Learning with Noisy Labels as Semi-supervised Learning. ICLR 2020.

Each epoch, for each network k (co-divide, their Alg. 1):

    l_i = CE(f_k(x_i), y~_i) on the training split, min-max normalised to [0, 1]
    fit a two-component 1-D Gaussian mixture to {l_i} by EM;  w_i^k = posterior of the low-mean component
    the other network trains with x_i as labelled if w_i^k > tau, unlabelled otherwise

A training step of network k (with j the other network, w = w^j, M = 2 "augmentations", T = 0.5):

    p_k, p_j = the networks' softmax outputs averaged over M passes              (no gradient)
    labelled:   t_i = sharpen(w_i onehot(y~_i) + (1 - w_i) p_k,i, T)               (label co-refinement)
    unlabelled: t_i = sharpen((p_k,i + p_j,i) / 2, T)                            (label co-guessing)
    MixMatch:   lambda ~ Beta(alpha, alpha), lambda' = max(lambda, 1 - lambda), pi a random permutation,
                x'_i = lambda' x_i + (1 - lambda') x_pi(i),   t'_i = lambda' t_i + (1 - lambda') t_pi(i)
    loss_k = L_x + lambda_u r(e) L_u + lambda_r L_reg
    L_x = -mean over labelled rows of sum_c t'_ic log softmax(f_k(x'_i))_c
    L_u = mean over unlabelled rows of mean_c (softmax(f_k(x'_i))_c - t'_ic)^2
    L_reg = sum_c (1/C) log((1/C) / mean_i softmax(f_k(x'_i))_c)                  (uniform-prior penalty)

r(e) = min(1, (e + 1) / 16) ramps the unlabelled weight over 16 epochs (the paper's linear ramp-up after
warm-up); the step trains both networks, each on the other's division (their losses share no parameters). Our CE
warm start is the paper's warm-up; both warm starts are the trainer's two (different seeds).

How the inputs are augmented and mixed here: the loader hands one transformed view of each example, so the M = 2
"augmentations" that co-refinement and co-guessing average over are two stochastic forward passes (dropout),
which works for every model. MixMatch mixes raw inputs for images and, for text (a model with
`forward_embedded`, WordCNN), the word embeddings of the two sentences (padded to the batch's common length), as
VAT perturbs embeddings. Labelled and unlabelled rows are kept as masks over the batch (one permutation mixes
all rows, as MixMatch mixes the concatenated labelled and unlabelled batches), so the step has fixed shapes.

The paper's CIFAR-10 settings: tau = 0.5, T = 0.5, alpha = 4, lambda_u = 25 (their value for 50% symmetric
noise; 0 at 20%, 50 at 90%), lambda_r = 1; the mixture with reg_covar 5e-4, 10 EM iterations. Selection: CE of
nets[0] on the noisy validation set (the division exists only for the training split).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bench.methods import Batch, Method, StageContext

REG_COVAR = 5e-4  # the paper's GaussianMixture(reg_covar=5e-4)


def clean_probability(losses: torch.Tensor, iterations: int = 10) -> torch.Tensor:
    """Posterior of the low-mean component of a two-component 1-D Gaussian mixture fitted by EM to the
    min-max-normalised losses. Started from the split at the median."""
    x = losses.double()
    x = (x - x.min()) / (x.max() - x.min()).clamp_min(1e-12)
    low = (x <= x.median()).double()
    resp = torch.stack([low, 1.0 - low], dim=1)  # (N, 2)
    for _ in range(iterations):
        weight = resp.sum(dim=0).clamp_min(1e-12)  # M step
        mean = (resp * x.unsqueeze(1)).sum(dim=0) / weight
        var = (resp * (x.unsqueeze(1) - mean) ** 2).sum(dim=0) / weight + REG_COVAR
        log_joint = (weight / len(x)).log() - 0.5 * (2 * torch.pi * var).log() \
            - 0.5 * (x.unsqueeze(1) - mean) ** 2 / var  # E step
        resp = torch.softmax(log_joint, dim=1)
    return resp[:, int(mean.argmin())].float()


def sharpen(p: torch.Tensor, temperature: float) -> torch.Tensor:
    q = p ** (1.0 / temperature)
    return q / q.sum(dim=-1, keepdim=True)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = mask.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp_min(1.0)


class DivideMix(Method):
    """Co-divided labelled / unlabelled sets from per-epoch loss mixtures, label co-refinement and co-guessing,
    and MixMatch."""

    name = "dividemix"
    title = "DivideMix"
    paper = "Li, Socher, Hoi. DivideMix: Learning with Noisy Labels as Semi-supervised Learning. ICLR 2020"
    defaults: dict[str, Any] = {"p_threshold": 0.5, "temperature": 0.5, "alpha": 4.0, "lambda_u": 25.0,
                                "lambda_r": 1.0, "rampup_epochs": 16, "passes": 2}
    ranges: ClassVar[dict[str, str]] = {"p_threshold": "[0, 1]", "temperature": "(0, inf)", "alpha": "(0, inf)",
                                        "lambda_u": "[0, inf)", "lambda_r": "[0, inf)", "rampup_epochs": "[1, inf)",
                                        "passes": "[1, inf)"}
    networks = 2

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        self.clean: list[torch.Tensor] = []  # w^k over the training split, one per network
        self._predict: Callable[[int], torch.Tensor] | None = None
        self._noisy: torch.Tensor | None = None

    def setup(self, stage: StageContext) -> None:
        if stage.predict_train_of is None:
            raise RuntimeError("dividemix needs the trainer's predictions of both networks (predict_train_of)")
        self._predict, self._noisy = stage.predict_train_of, stage.noisy_train
        self.divide()

    def divide(self) -> None:
        """w^k for both networks from their per-example CE on the (unaugmented) training split."""
        self.clean = []
        for k in range(2):
            probs = self._predict(k)
            losses = -probs.gather(1, self._noisy.unsqueeze(1)).squeeze(1).clamp_min(1e-12).log()
            self.clean.append(clean_probability(losses))

    def end_epoch(self, epoch: int) -> None:
        self.divide()

    def judged_noisy(self, logits: torch.Tensor, labels: torch.Tensor, epoch: int,
                     index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """nets[0]'s division (the one that trains nets[1]): unlabelled where w^0 <= tau; score 1 - w^0."""
        if not self.clean:
            return None
        clean = self.clean[0][index]
        return 1.0 - clean, ~(clean > self.p_threshold)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return -torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1).mean(dim=-1)

    @torch.no_grad()
    def targets(self, own: nn.Module, other: nn.Module, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                labelled: torch.Tensor) -> torch.Tensor:
        """Co-refined targets for the labelled rows, co-guessed ones for the others (sharpened)."""
        p_own = torch.stack([torch.softmax(own(x).float(), dim=1) for _ in range(self.passes)]).mean(0)
        p_other = torch.stack([torch.softmax(other(x).float(), dim=1) for _ in range(self.passes)]).mean(0)
        w = w.unsqueeze(1)
        refined = w * F.one_hot(y, self.num_classes).float() + (1.0 - w) * p_own
        guessed = (p_own + p_other) / 2.0
        return sharpen(torch.where(labelled.unsqueeze(1), refined, guessed), self.temperature)

    def mixmatch_loss(self, net: nn.Module, x: torch.Tensor, targets: torch.Tensor, labelled: torch.Tensor,
                      epoch: int) -> torch.Tensor:
        lam = float(torch.distributions.Beta(self.alpha, self.alpha).sample())
        lam = max(lam, 1.0 - lam)
        perm = torch.randperm(len(x), device=x.device)
        if hasattr(net, "forward_embedded"):
            embedded = net.embedding(x)
            logits = net.forward_embedded(lam * embedded + (1.0 - lam) * embedded[perm])
        else:
            logits = net(lam * x + (1.0 - lam) * x[perm])
        mixed = lam * targets + (1.0 - lam) * targets[perm]
        log_p = torch.log_softmax(logits.float(), dim=1)
        p = log_p.exp()
        supervised = masked_mean(-(mixed * log_p).sum(dim=1), labelled)
        unsupervised = masked_mean(((p - mixed) ** 2).mean(dim=1), ~labelled)
        prior = torch.full((self.num_classes,), 1.0 / self.num_classes, device=p.device)
        penalty = (prior * (prior / p.mean(dim=0)).log()).sum()
        ramp = min(1.0, (epoch + 1) / self.rampup_epochs)
        return supervised + self.lambda_u * ramp * unsupervised + self.lambda_r * penalty

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        total = torch.zeros((), device=batch.y.device)
        for k in range(2):
            own, other = nets[k], nets[1 - k]
            w = self.clean[1 - k][batch.index]  # co-divide: k learns from the other network's division
            labelled = w > self.p_threshold
            targets = self.targets(own, other, batch.x, batch.y, w, labelled)
            total = total + self.mixmatch_loss(own, batch.x, targets, labelled, batch.epoch)
        return total

    def state_dict(self) -> dict[str, Any]:
        return {"clean": [w.clone() for w in self.clean]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clean = [w.clone() for w in state["clean"]]
