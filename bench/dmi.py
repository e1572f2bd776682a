"""L_DMI (Xu, Cao, Kong, Wang, NeurIPS 2019): the determinant-based mutual information loss.

    U = (1/N) softmax(logits)^T onehot(noisy labels)      (C x C, an estimate of the joint Q_{h(X), Y~})
    L_DMI = -log |det U|

By the multiplicativity of the determinant, det(Q T) = det(Q) det(T): the loss on noisy labels is the loss on
clean labels plus the constant -log|det T| (the paper's Theorem 4.1), whatever the noise pattern.

Numerics. log|det U| is computed with `torch.linalg.slogdet` in float64, outside any autocast region.
A batch in which some noisy class is absent has a zero column in U, so det U = 0 and the loss is -log 0.
The guard adds eps * I with eps = `DMI_EPS` / C. U always sums to 1, so its entries are of order 1/C^2 and its
eigenvalues of order 1/C; eps is eight orders of magnitude below that scale, which moves the loss of a
well-conditioned U by about eps * tr(U^-1), a relative 1e-8. For a zero column k, U + eps I has e_k as an
eigenvector, and the gradient with respect to every present label's column equals the gradient of the reduced
(C-1)-class problem: finite, with the loss shifted by the constant -log eps. Unlike the absolute 1e-3 that the
paper's code adds to det U (which swamps det U ~ 1e-10 at C = 10), this guard does not bias the loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.methods import Method

DMI_EPS = 1e-8


def joint_matrix(logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """U = (1/N) softmax(logits)^T onehot(labels), in float64 (C x C: rows predicted, columns noisy class)."""
    probs = torch.softmax(logits.double(), dim=1)
    onehot = F.one_hot(labels, num_classes).to(probs.dtype)
    return probs.t() @ onehot / labels.shape[0]


def dmi_loss(logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """-log|det U| for a batch, in float64; finite even when a class is missing from the batch."""
    with torch.autocast(device_type=logits.device.type, enabled=False):
        u = joint_matrix(logits, labels, num_classes)
        eps = DMI_EPS / num_classes
        u = u + eps * torch.eye(num_classes, dtype=u.dtype, device=u.device)
        return -torch.linalg.slogdet(u).logabsdet


class DMI(Method):
    """L_DMI, the paper's method: -log|det| of the empirical joint of predictions and noisy labels."""

    name = "dmi"
    title = "L_DMI"
    paper = "Xu, Cao, Kong, Wang. L_DMI: A Novel Information-theoretic Loss Function for Training Deep Nets " \
        "Robust to Label Noise. NeurIPS 2019"

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return dmi_loss(logits, labels, self.num_classes)
