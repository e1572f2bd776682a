"""DivideMix: two networks, each dividing the data for the other by a Gaussian mixture on the per-example losses,
then semi-supervised MixMatch on the division.

Li, Socher, Hoi. DivideMix: Learning with Noisy Labels as Semi-supervised Learning. ICLR 2020.

Each epoch, for each network k (co-divide, their Alg. 1):

    l_i = CE(f_k(x_i), y~_i) on the training split, min-max normalised to [0, 1]
    fit a two-component 1-D Gaussian mixture to {l_i} by EM;  w_i^k = posterior of the low-mean component
    the other network trains with x_i as labelled if w_i^k > tau, unlabelled otherwise

A training step of network k (with j the other network, w = w^j, V = 2 views, T = 0.5):

    p_k, p_j = the networks' softmax outputs averaged over the V views            (no gradient; j in eval mode)
    labelled:   t_i = sharpen(w_i onehot(y~_i) + (1 - w_i) p_k,i, T)               (label co-refinement)
    unlabelled: t_i = sharpen((p_k,i + p_j,i) / 2, T)                            (label co-guessing)
    MixMatch over the V views (each with its target):
                lambda ~ Beta(alpha, alpha), lambda' = max(lambda, 1 - lambda), pi a random permutation,
                x'_i = lambda' x_i + (1 - lambda') x_pi(i),   t'_i = lambda' t_i + (1 - lambda') t_pi(i)
    loss_k = L_x + lambda_u r L_u + lambda_r L_reg
    L_x = -mean over labelled rows of sum_c t'_ic log softmax(f_k(x'_i))_c
    L_u = mean over unlabelled rows of mean_c (softmax(f_k(x'_i))_c - t'_ic)^2
    L_reg = sum_c (1/C) log((1/C) / mean_i softmax(f_k(x'_i))_c)                  (uniform-prior penalty)

r = clip((e + s / S) / 16, 0, 1) ramps the unlabelled weight linearly over 16 epochs from the end of the warm-up
(epoch e of the stage, step s of its S steps), as the reference's `linear_rampup`; the step trains both networks,
each on the other's division (their losses share no parameters). Our CE warm start is the paper's warm-up; both
warm starts are the trainer's two (different seeds).

The views. On image data that the dataset augments on the device (CIFAR-10, CIFAR-10N, Dogs vs Cats) the V views
are V independent draws of the dataset's training augmentation (random crop of the zero-padded image and a
horizontal flip, as the reference's `transform_train`), the batch's own and fresh ones from the raw images, all
vectorised; MixMatch mixes all V views, as the reference mixes both. Where the inputs are not augmented on the
device (MR's sentences, Fashion-MNIST, streamed Clothing1M), the V "views" are V forward passes of the one input,
which differ by dropout only, and MixMatch mixes that input once. Text (a model with `forward_embedded`, WordCNN)
is mixed in embedding space (the two sentences' word embeddings, padded to the batch's common length), as VAT
perturbs embeddings. Labelled and unlabelled rows are kept as masks over the batch (one permutation mixes all
rows, as MixMatch mixes the concatenated labelled and unlabelled batches), so the step has fixed shapes.

The division: per-example CE of each network in evaluation mode on the unaugmented training split, min-max
normalised, and a two-component Gaussian mixture fitted as scikit-learn's `GaussianMixture(n_components=2,
max_iter=10, tol=1e-2, reg_covar=5e-4)` fits it (the reference's call): responsibilities from 2-means, then EM
until the mean log-likelihood moves by less than tol, posteriors from the final parameters. With loss_history = h
the fit is on each example's normalised loss averaged over the last h epochs (the reference's h = 5 at r = 0.9).

The paper's CIFAR-10 settings: tau = 0.5, T = 0.5, alpha = 4, lambda_u = 25 (their value for 50% symmetric
noise; 0 at 20%, 50 at 90%), lambda_r = 1. Selection: CE of nets[0] on the noisy validation set (the division
exists only for the training split).

Reference: LiJunnan1992/DivideMix, Train_cifar.py and dataloader_cifar.py (commit d9d3058).

Differences (`DivideMix.differences`):
- Both networks train in every step, each on the other's division — the reference trains net 1 for a whole epoch,
  then net 2 (whose co-guessing then sees the updated net 1); one step for both keeps the trainer's one-optimiser
  stage.
- One batch of the trainer's size with labelled and unlabelled rows as masks — the reference draws a labelled and an
  unlabelled batch of 64 each and runs len(labelled) / 64 steps an epoch; masks keep the step's shapes fixed and
  every example seen once an epoch.
- Fashion-MNIST, MR and streamed Clothing1M: the views are dropout passes of one input, mixed once — their inputs
  are not augmented on the device (Clothing1M's are augmented once, by the loader); on a model without dropout the
  two views are then the same.
- Text: MixMatch mixes word embeddings — the reference is image-only; mixing token ids is meaningless.
- The mixture starts from 2-means from the two extreme losses — scikit-learn's k-means++ start is random.
- At r = 0.9 the reference averages each example's normalised loss over the last 5 epochs before the fit, by itself
  — here loss_history=5 does it, set in the experiment (default 1, the reference at r < 0.9).
- The warm-up is the shared CE warm start — the reference warms each network up with CE for 10 epochs and, under
  asymmetric noise, adds a confidence penalty.
- Test accuracy and selection are those of nets[0], at the checkpoint with the lowest noisy-validation CE — the
  reference reports the two networks' summed logits at the last epoch; the protocol evaluates one network and
  selects on validation.
- Optimiser, learning rate and epochs are the method stage's — the reference: SGD 0.02, momentum 0.9, weight decay
  5e-4, lr / 10 from epoch 150, 300 epochs, PreAct ResNet-18.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bench.methods import Batch, Method, StageContext

REG_COVAR = 5e-4  # the reference's GaussianMixture(reg_covar=5e-4, max_iter=10, tol=1e-2)
MAX_ITER, TOL = 10, 1e-2


def two_means(x: torch.Tensor, iterations: int = 100) -> torch.Tensor:
    """Lloyd's 2-means on 1-D values, from the two extremes: True where a value belongs to the upper cluster."""
    centres = torch.stack([x.min(), x.max()])
    upper = torch.zeros_like(x, dtype=torch.bool)
    for _ in range(iterations):
        upper = (x - centres[1]).abs() < (x - centres[0]).abs()
        new = torch.stack([x[~upper].sum() / (~upper).sum().clamp_min(1), x[upper].sum() / upper.sum().clamp_min(1)])
        if torch.equal(new, centres):
            break
        centres = new
    return upper


def _gaussians(x: torch.Tensor, resp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """M step: mixture weights, means and variances (+ reg_covar) from the responsibilities (N, 2)."""
    count = resp.sum(dim=0).clamp_min(1e-12)
    mean = (resp * x.unsqueeze(1)).sum(dim=0) / count
    var = (resp * (x.unsqueeze(1) - mean) ** 2).sum(dim=0) / count + REG_COVAR
    return count / len(x), mean, var


def _posterior(x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, var: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """E step: the mean log-likelihood of the values and the responsibilities (N, 2)."""
    log_joint = weight.log() - 0.5 * (2 * torch.pi * var).log() - 0.5 * (x.unsqueeze(1) - mean) ** 2 / var
    log_norm = torch.logsumexp(log_joint, dim=1, keepdim=True)
    return log_norm.mean(), (log_joint - log_norm).exp()


def normalised(losses: torch.Tensor) -> torch.Tensor:
    """Min-max normalised to [0, 1], in float64."""
    x = losses.double()
    return (x - x.min()) / (x.max() - x.min()).clamp_min(1e-12)


def clean_probability(losses: torch.Tensor) -> torch.Tensor:
    """`fit_mixture` on the min-max-normalised losses."""
    return fit_mixture(normalised(losses))


def fit_mixture(x: torch.Tensor) -> torch.Tensor:
    """Posterior of the low-mean component of a two-component 1-D Gaussian mixture fitted to the values x (float64),
    as scikit-learn's GaussianMixture(2, max_iter=10, tol=1e-2, reg_covar=5e-4) fits it: parameters from the 2-means
    responsibilities, then EM steps until the mean log-likelihood changes by less than tol."""
    upper = two_means(x).double()
    weight, mean, var = _gaussians(x, torch.stack([1.0 - upper, upper], dim=1))
    previous = -float("inf")
    for _ in range(MAX_ITER):
        log_likelihood, resp = _posterior(x, weight, mean, var)
        weight, mean, var = _gaussians(x, resp)
        if abs(float(log_likelihood) - previous) < TOL:
            break
        previous = float(log_likelihood)
    _, resp = _posterior(x, weight, mean, var)
    return resp[:, int(mean.argmin())].float()


def sharpen(p: torch.Tensor, temperature: float) -> torch.Tensor:
    q = p ** (1.0 / temperature)
    return q / q.sum(dim=-1, keepdim=True)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = mask.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp_min(1.0)


def mean_softmax(net: nn.Module, views: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([torch.softmax(net(x).float(), dim=1) for x in views]).mean(0)


class DivideMix(Method):
    """Co-divided labelled / unlabelled sets from per-epoch loss mixtures, label co-refinement and co-guessing
    over two augmented views, and MixMatch."""

    name = "dividemix"
    title = "DivideMix"
    uses_embeddings = True
    paper = "Li, Socher, Hoi. DivideMix: Learning with Noisy Labels as Semi-supervised Learning. ICLR 2020"
    defaults: dict[str, Any] = {"p_threshold": 0.5, "temperature": 0.5, "alpha": 4.0, "lambda_u": 25.0,
                                "lambda_r": 1.0, "rampup_epochs": 16, "views": 2, "loss_history": 1}
    ranges: ClassVar[dict[str, str]] = {"p_threshold": "[0, 1]", "temperature": "(0, inf)", "alpha": "(0, inf)",
                                        "lambda_u": "[0, inf)", "lambda_r": "[0, inf)", "rampup_epochs": "[1, inf)",
                                        "views": "[1, inf)", "loss_history": "[1, inf)"}
    networks = 2
    reference = "LiJunnan1992/DivideMix, Train_cifar.py and dataloader_cifar.py, commit d9d3058"
    differences = (
        "Both networks train in every step, each on the other's division — the reference trains net 1 for a whole "
        "epoch, then net 2 (whose co-guessing then sees the updated net 1); one step for both keeps the trainer's "
        "one-optimiser stage.",
        "One batch of the trainer's size with labelled and unlabelled rows as masks — the reference draws a "
        "labelled and an unlabelled batch of 64 each and runs len(labelled) / 64 steps an epoch; masks keep the "
        "step's shapes fixed and every example seen once an epoch.",
        "Fashion-MNIST, MR and streamed Clothing1M: the views are dropout passes of one input, mixed once — their "
        "inputs are not augmented on the device (Clothing1M's are augmented once, by the loader); on a model "
        "without dropout the two views are then the same.",
        "Text: MixMatch mixes word embeddings — the reference is image-only; mixing token ids is meaningless.",
        "The mixture starts from 2-means from the two extreme losses — scikit-learn's k-means++ start is random.",
        "At r = 0.9 the reference averages each example's normalised loss over the last 5 epochs before the fit, "
        "by itself — here loss_history=5 does it, set in the experiment (default 1, the reference at r < 0.9).",
        "The warm-up is the shared CE warm start — the reference warms each network up with CE for 10 epochs and, "
        "under asymmetric noise, adds a confidence penalty.",
        "Test accuracy and selection are those of nets[0], at the checkpoint with the lowest noisy-validation CE — "
        "the reference reports the two networks' summed logits at the last epoch; the protocol evaluates one "
        "network and selects on validation.",
        "Optimiser, learning rate and epochs are the method stage's — the reference: SGD 0.02, momentum 0.9, "
        "weight decay 5e-4, lr / 10 from epoch 150, 300 epochs, PreAct ResNet-18.",
    )

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        self.clean: list[torch.Tensor] = []  # w^k over the training split, one per network
        self.history: list[list[torch.Tensor]] = [[], []]  # each network's last normalised losses
        self._predict: Callable[[int], torch.Tensor] | None = None
        self._noisy: torch.Tensor | None = None
        self._augment: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._epoch, self._step = -1, 0  # the ramp's position within the stage

    def setup(self, stage: StageContext) -> None:
        if stage.predict_train_of is None:
            raise RuntimeError("dividemix needs the trainer's predictions of both networks (predict_train_of)")
        self._predict, self._noisy, self._augment = stage.predict_train_of, stage.noisy_train, stage.augment_train
        self.divide()

    def divide(self) -> None:
        """w^k for both networks from their per-example CE on the (unaugmented) training split."""
        self.clean = []
        for k in range(2):
            probs = self._predict(k)
            losses = -probs.gather(1, self._noisy.unsqueeze(1)).squeeze(1).clamp_min(1e-12).log()
            self.history[k] = [*self.history[k], normalised(losses)][-self.loss_history :]
            self.clean.append(fit_mixture(torch.stack(self.history[k]).mean(dim=0)))

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

    def views_of(self, batch: Batch) -> tuple[list[torch.Tensor], bool]:
        """The V views of the batch's examples, and whether they are distinct augmentations (else V copies of the
        input, whose forward passes differ by dropout only)."""
        if self._augment is None:
            return [batch.x] * self.views, False
        return [batch.x] + [self._augment(batch.index) for _ in range(self.views - 1)], True

    @torch.no_grad()
    def targets(self, own: nn.Module, other: nn.Module, views: list[torch.Tensor], y: torch.Tensor,
                w: torch.Tensor, labelled: torch.Tensor) -> torch.Tensor:
        """Co-refined targets for the labelled rows, co-guessed ones for the others (sharpened). The network that
        trains guesses in training mode, the other in evaluation mode (the reference's `net2.eval()`)."""
        p_own = mean_softmax(own, views)
        was_training = other.training
        other.eval()
        p_other = mean_softmax(other, views)
        other.train(was_training)
        w = w.unsqueeze(1)
        refined = w * F.one_hot(y, self.num_classes).float() + (1.0 - w) * p_own
        guessed = (p_own + p_other) / 2.0
        return sharpen(torch.where(labelled.unsqueeze(1), refined, guessed), self.temperature)

    def rampup(self, epoch: int, batch_size: int) -> float:
        """r: 0 at the stage's first step, rising linearly by 1 / rampup_epochs an epoch, then 1."""
        if epoch != self._epoch:
            self._epoch, self._step = epoch, 0
        steps = max(1, len(self._noisy) // batch_size)  # the trainer drops the last partial batch
        ramp = min(1.0, (epoch + self._step / steps) / self.rampup_epochs)
        self._step += 1
        return ramp

    def mixmatch_loss(self, net: nn.Module, x: torch.Tensor, targets: torch.Tensor, labelled: torch.Tensor,
                      ramp: float) -> torch.Tensor:
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
        return supervised + self.lambda_u * ramp * unsupervised + self.lambda_r * penalty

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        views, distinct = self.views_of(batch)
        mixed = views if distinct else views[:1]  # MixMatch mixes every distinct view, each with its targets
        ramp = self.rampup(batch.epoch, len(batch.y))
        total = torch.zeros((), device=batch.y.device)
        for k in range(2):
            own, other = nets[k], nets[1 - k]
            w = self.clean[1 - k][batch.index]  # co-divide: k learns from the other network's division
            labelled = w > self.p_threshold
            targets = self.targets(own, other, views, batch.y, w, labelled)
            total = total + self.mixmatch_loss(own, torch.cat(mixed), targets.repeat(len(mixed), 1),
                                               labelled.repeat(len(mixed)), ramp)
        return total

    def state_dict(self) -> dict[str, Any]:
        return {"clean": [w.clone() for w in self.clean], "history": [[x.clone() for x in h] for h in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clean = [w.clone() for w in state["clean"]]
        self.history = [[x.clone() for x in h] for h in state["history"]]
