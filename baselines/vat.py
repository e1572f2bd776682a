"""VAT: virtual adversarial training, a local distributional smoothness term added to CE.

Miyato, Maeda, Koyama, Ishii. Virtual Adversarial Training: A Regularization Method for Supervised and
Semi-Supervised Learning. IEEE TPAMI 2018. For text: Miyato, Dai, Goodfellow. Adversarial Training Methods for
Semi-Supervised Text Classification. ICLR 2017 (the perturbation acts on the word embeddings).

    p = softmax(h(x)) (held constant),  D(r) = KL(p || softmax(h(x + r)))
    d ~ N(0, I);  g = grad_r D(r) at r = xi d / ||d||          (one power iteration, their Eq. 12-13)
    r_adv = eps g / ||g||                                        (norm per example, over all input dims)
    loss = CE(h(x), y~) + alpha D(r_adv)

alpha = 1. eps per dataset, in the input's units: 8.0, the reference code's value for CIFAR-10 with flips and
translations (its inputs are whitened, unit variance per dimension, like our per-pixel standardised images: CIFAR-10,
CIFAR-10N, Dogs vs Cats, Clothing1M); 2.0 on Fashion-MNIST's [0, 1] pixels (the paper's supervised MNIST setting).
A model that offers `forward_embedded` (WordCNN, for MR) is perturbed in embedding space instead, with
eps_text = 5.0 (the ICLR 2017 setting) in units of the embedding table's standard deviation (they perturb
normalised embeddings), on the sentence's words only (not its padding: the reference masks by length).
The paper's xi = 1e-6 is a finite-difference step for the product H d of D's Hessian with d; in float32,
x + 1e-6 d is not resolved (measured: one gradient in ten comes out exactly zero), so the default xi = 0 computes
the limit xi -> 0 exactly (a Hessian-vector product); xi > 0 runs the paper's finite difference.
The L_DMI paper reports VAT as inapplicable to MR; this way it applies.

Only the clean pass moves BatchNorm's running statistics: the power iteration's and the perturbed passes normalise
by their batch's statistics without updating the running ones (the reference's `update_batch_stats=False`), and
they replay the clean pass's dropout masks (the reference's dropout ops share one seed).

Reference: takerum/vat_tf, vat.py, train_semisup.py and README.md (commit c5125d2); for text tensorflow/models,
research/adversarial_text/adversarial_losses.py (commit 6ddfb3f).

Differences (`VirtualAdversarialTraining.differences`):
- xi = 0: the power iteration's Hessian-vector product is computed exactly — the reference's finite difference with
  xi = 1e-6 is not resolved in float32 (one gradient in ten exactly zero); xi > 0 runs it.
- The CE and the VAT term use the same inputs and one clean pass — the reference is semi-supervised (CE on a
  labelled batch, VAT on an unlabelled one, with a second clean pass that does not move BatchNorm's statistics);
  here every training example is both.
- eps on Dogs vs Cats and Clothing1M is CIFAR-10's 8.0 (the same per-pixel standardisation) — the reference has no
  value for them; eps_text counts in standard deviations of the embedding table.
- The input is not ZCA-whitened as in the reference's CIFAR-10 — our images are standardised per pixel, which the
  eps refers to.
- Optimiser and schedule are the method stage's — the reference: Adam 0.001, momentum 0.9 then 0.5, decayed linearly
  from epoch 460 of 500 (CIFAR-10).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.methods import Batch, Method


def _unit(d: torch.Tensor) -> torch.Tensor:
    """d / ||d|| per example (norm over all non-batch dims); rescaled by its max first to avoid overflow."""
    flat = d.flatten(1)
    flat = flat / flat.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
    flat = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return flat.view_as(d)


def kl_from_logits(clean_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Batch mean of KL(softmax(clean) || softmax(logits)), with the clean side held constant."""
    log_p = torch.log_softmax(clean_logits.detach().float(), dim=1)
    log_q = torch.log_softmax(logits.float(), dim=1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=1).mean()


def same_dropout(forward: Callable[[torch.Tensor], torch.Tensor], device: torch.device
                 ) -> Callable[[torch.Tensor], torch.Tensor]:
    """`forward` replaying the random state of this moment: every call draws the dropout masks that the next
    forward pass would draw, so that D(r) compares the same sub-network at x and x + r (D(0) = 0 exactly,
    and the power iteration sees the KL's curvature, not dropout noise). The caller's random stream goes on
    as if the replays had not happened."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def replay(x: torch.Tensor) -> torch.Tensor:
        with torch.random.fork_rng(devices=[device] if cuda is not None else []):
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state(cuda, device)
            return forward(x)

    return replay


@contextmanager
def running_stats_frozen(net: nn.Module) -> Iterator[None]:
    """Inside: BatchNorm layers in training mode normalise by the batch's statistics as usual, but leave their running
    statistics as they are (momentum 0 makes the in-place update r <- (1 - 0) r + 0 * batch keep r exactly)."""
    norms = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    saved = [(m.momentum, m.num_batches_tracked.clone()) for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, (momentum, tracked) in zip(norms, saved, strict=True):
            m.momentum = momentum
            m.num_batches_tracked.copy_(tracked)


def hessian_vector(
    forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, d: torch.Tensor
) -> torch.Tensor:
    """H d for H = the Hessian of r -> D(r) at r = 0, exactly: H = J^T (diag p - p p^T) J with J the Jacobian
    of the logits at x (D's own gradient and the other curvature term vanish there, since q = p). J d comes
    from the double-vjp trick, J^T v from one more backward pass."""
    x = x.detach().requires_grad_(True)
    out = forward(x).float()
    u = torch.zeros_like(out, requires_grad=True)
    (jt_u,) = torch.autograd.grad(out, x, u, create_graph=True)
    (jd,) = torch.autograd.grad(jt_u, u, d, retain_graph=True)  # J d
    p = torch.softmax(out.detach(), dim=1)
    fisher_jd = p * jd - p * (p * jd).sum(dim=1, keepdim=True)
    return torch.autograd.grad(out, x, fisher_jd)[0]


def adversarial_perturbation(
    forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, clean_logits: torch.Tensor,
    xi: float, eps: float, power_iterations: int = 1, mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """r_adv of norm eps per example, from `power_iterations` steps of the power method on D's Hessian: with
    xi > 0 by the paper's finite difference grad_r D(xi d), with xi = 0 by its limit, the exact product H d.
    `mask` (broadcastable to x; a sentence's words, not its padding) confines the perturbation."""
    x = x.detach()

    def unit(d: torch.Tensor) -> torch.Tensor:
        return _unit(d if mask is None else d * mask)

    d = unit(torch.randn_like(x))
    for _ in range(power_iterations):
        if xi > 0:
            r = (xi * d).requires_grad_(True)
            grad = torch.autograd.grad(kl_from_logits(clean_logits, forward(x + r)), r)[0]
        else:
            grad = hessian_vector(forward, x, d)
        d = unit(grad.detach())
    return eps * d


class VirtualAdversarialTraining(Method):
    """CE plus the KL between predictions at x and at x + r_adv (embeddings for text models)."""

    name = "vat"
    title = "VAT"
    uses_embeddings = True
    paper = "Miyato, Maeda, Koyama, Ishii. Virtual Adversarial Training: A Regularization Method for Supervised " \
        "and Semi-Supervised Learning. IEEE TPAMI 2018"
    defaults: dict[str, Any] = {"eps": 8.0, "eps_text": 5.0, "xi": 0.0, "alpha": 1.0, "power_iterations": 1}
    # [0, 1] pixels (Fashion-MNIST) and the generated set's unit-scale features take the supervised MNIST value.
    dataset_defaults = {"fashion_mnist": {"eps": 2.0}, "synthetic": {"eps": 2.0}}
    # xi = 0: the exact Hessian-vector product; xi > 0: the paper's finite difference.
    ranges = {"eps": "[0, inf)", "eps_text": "[0, inf)", "xi": "[0, inf)", "alpha": "[0, inf)",
              "power_iterations": "[1, inf)"}
    reference = "takerum/vat_tf, vat.py, train_semisup.py and README.md, commit c5125d2; " \
        "tensorflow/models, research/adversarial_text/adversarial_losses.py, commit 6ddfb3f"
    differences = (
        "xi = 0: the power iteration's Hessian-vector product is computed exactly — the reference's finite "
        "difference with xi = 1e-6 is not resolved in float32 (one gradient in ten exactly zero); xi > 0 runs it.",
        "The CE and the VAT term use the same inputs and one clean pass — the reference is semi-supervised (CE on a "
        "labelled batch, VAT on an unlabelled one, with a second clean pass that does not move BatchNorm's "
        "statistics); here every training example is both.",
        "eps on Dogs vs Cats and Clothing1M is CIFAR-10's 8.0 (the same per-pixel standardisation) — the reference "
        "has no value for them; eps_text counts in standard deviations of the embedding table.",
        "The input is not ZCA-whitened as in the reference's CIFAR-10 — our images are standardised per pixel, "
        "which the eps refers to.",
        "Optimiser and schedule are the method stage's — the reference: Adam 0.001, momentum 0.9 then 0.5, decayed "
        "linearly from epoch 460 of 500 (CIFAR-10).",
    )

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # Selection uses the CE part only: the smoothness term needs the network and a random start, and it
        # does not involve the labels (the trainer hands this hook validation logits).
        return F.cross_entropy(logits, labels)

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        net = nets[0]
        if hasattr(net, "forward_embedded"):
            # Miyato et al. (2017) perturb normalised embeddings (unit variance per dimension): eps_text counts in
            # standard deviations of the embedding table, whatever scale the model's embeddings have.
            x, forward = net.embedding(batch.x), net.forward_embedded
            eps = self.eps_text * net.embedding.weight.detach().std()
            words = (batch.x != 0).unsqueeze(-1).to(x.dtype)  # token 0 is padding: only words are perturbed
        else:
            x, forward, eps, words = batch.x, net, self.eps, None
        forward = same_dropout(forward, x.device)
        logits = forward(x)
        with running_stats_frozen(net):
            r_adv = adversarial_perturbation(forward, x, logits, self.xi, eps, self.power_iterations, words)
            perturbed = forward(x + r_adv)
        return F.cross_entropy(logits, batch.y) + self.alpha * kl_from_logits(logits, perturbed)
