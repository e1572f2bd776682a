"""LCCN: the latent class-conditional noise model trained by safeguarded dynamic label regression.

Yao, Wu, Zhang, Tsang, Sun. Safeguarded Dynamic Label Regression for Noisy Supervision. AAAI 2019.

Generative model: x -> latent clean label z ~ p(z | x) = softmax(h(x)) -> noisy label y~ ~ phi[z, :], with each
row of the transition phi under a Dirichlet(alpha) prior. Each training step Gibbs-samples the latent labels
of the batch from their conditional posterior, trains the classifier on them with CE, and moves the counts:

    z_i ~ p(z | x_i, y~_i, phi)  proportional to  softmax(h(x_i))_z * phi[z, y~_i]
    loss = CE(h(x_i), z_i)
    n[k, j] = #{i : z_i = k, y~_i = j}        over the whole training set
    phi[k, j] = (n[k, j] + alpha) / (sum_j' n[k, j'] + C alpha)                    (Dirichlet posterior mean)

Initialisation from the warm-started classifier: z_i = argmax p(z | x_i), so n starts as the confusion matrix
of its predictions against the noisy labels. The paper's schedule: during a warm-up (20k of its ~47k steps,
`warmup_fraction` of the stage here) latent labels are sampled with phi fixed at its initial value while the
counts already move; afterwards phi is recomputed from the counts every `update_every` = 200 steps ("safeguarded":
phi moves by at most the batch's share of the counts, never from a single mini-batch gradient). The counts are a
histogram of the current latent labels, so they can never go negative.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from bench.baselines.fw import forward_nll
from bench.methods import Batch, Method, StageContext


def latent_posterior(probs: torch.Tensor, noisy: torch.Tensor, transition: torch.Tensor) -> torch.Tensor:
    """p(z | x, y~) proportional to p(z | x) T[z, y~]; rows sum to 1 (N x C)."""
    joint = probs * transition.to(probs.dtype)[:, noisy].t()
    return joint / joint.sum(dim=1, keepdim=True).clamp_min(torch.finfo(joint.dtype).tiny)


def sample_latent(
    probs: torch.Tensor, noisy: torch.Tensor, transition: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One Gibbs draw of the latent clean labels of a batch, all rows at once."""
    return torch.multinomial(latent_posterior(probs, noisy, transition), 1, generator=generator).squeeze(1)


class LCCN(Method):
    """Latent class-conditional noise: Gibbs-sampled clean labels and a Dirichlet-smoothed transition."""

    name = "lccn"
    title = "LCCN (safeguarded dynamic label regression)"
    paper = "Yao, Wu, Zhang, Tsang, Sun. Safeguarded Dynamic Label Regression for Noisy Supervision. AAAI 2019"
    # alpha, 200 steps and 20k-of-46.9k warm-up steps (120 epochs of 50k at batch size 128): the paper's code.
    defaults: dict[str, Any] = {"alpha": 1.0, "update_every": 200, "warmup_fraction": 0.43}
    # alpha > 0: the Dirichlet prior keeps every row of phi a distribution even where a class has no count.
    ranges = {"alpha": "(0, inf)", "update_every": "[1, inf)", "warmup_fraction": "[0, 1]"}

    def __init__(self, num_classes: int, **params: Any) -> None:
        super().__init__(num_classes, **params)
        self.latent: torch.Tensor | None = None  # z_i over the training set
        self.noisy: torch.Tensor | None = None
        self.transition = torch.eye(num_classes, dtype=torch.float64)  # phi used for sampling
        self.step = 0
        self.warmup_epochs = 0.0

    def counts(self) -> torch.Tensor:
        """n[k, j] = #{i : z_i = k, y~_i = j}: a histogram, hence never negative."""
        c = self.num_classes
        return torch.bincount(self.latent * c + self.noisy, minlength=c * c).reshape(c, c).double()

    def posterior_mean(self) -> torch.Tensor:
        n = self.counts() + self.alpha
        return n / n.sum(dim=1, keepdim=True)

    def setup(self, stage: StageContext) -> None:
        self.noisy = stage.noisy_train
        self.latent = stage.predict_train().argmax(dim=1)
        self.transition = self.posterior_mean()
        self.step = 0
        self.warmup_epochs = self.warmup_fraction * stage.epochs

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # Model selection uses the model's marginal likelihood of the noisy labels, -log sum_z p(z|x) phi[z, y~]:
        # a deterministic function of the prediction, unlike the training loss on freshly sampled latent labels.
        return forward_nll(logits, labels, self.posterior_mean() if self.latent is not None else self.transition)

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        if batch.epoch >= self.warmup_epochs and self.step % self.update_every == 0:
            self.transition = self.posterior_mean()
        logits = nets[0](batch.x)
        with torch.no_grad():
            z = sample_latent(torch.softmax(logits.float(), dim=1), batch.y, self.transition)
        self.latent[batch.index] = z
        self.step += 1
        return nn.functional.cross_entropy(logits, z)

    def judged_noisy(self, logits: torch.Tensor, labels: torch.Tensor, epoch: int,
                     index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Flagged: the latent label last drawn differs from the noisy one. Score: 1 - p(z = y~ | x, y~, phi)."""
        if self.latent is None:
            return None
        posterior = latent_posterior(torch.softmax(logits.float(), dim=1), labels, self.transition)
        return 1.0 - posterior.gather(1, labels.unsqueeze(1)).squeeze(1), self.latent[index] != labels

    def state_dict(self) -> dict[str, Any]:
        return {"latent": None if self.latent is None else self.latent.clone(),
                "transition": self.transition.clone(), "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.latent = None if state["latent"] is None else state["latent"].clone()
        self.transition = state["transition"].clone()
        self.step = state["step"]

    def estimated_transition(self) -> np.ndarray | None:
        return self.posterior_mean().cpu().numpy() if self.latent is not None else None
