"""L_DMI (Xu, Cao, Kong, Wang, NeurIPS 2019): the determinant-based mutual information loss.

    U = (1/N) softmax(logits)^T onehot(noisy labels)      (C x C, an estimate of the joint Q_{h(X), Y~})
    L_DMI = -log |det U|

By the multiplicativity of the determinant, det(Q T) = det(Q) det(T): the loss on noisy labels is the loss on
clean labels plus the constant -log|det T| (the paper's Theorem 4.1), whatever the noise pattern.

Numerics. log|det U| is computed with `torch.linalg.slogdet` in float64, outside any autocast region.
A batch in which some noisy class k is absent has a zero column k in U, so det U = 0 and the loss is -log 0.
The guard puts eps = `DMI_EPS` / C on the diagonal of exactly those columns. U always sums to 1 (entries of
order 1/C^2), so eps sits eight orders of magnitude below U's scale. A batch with every class is left exact.
For a guarded column, e_k becomes an eigenvector of U, and the gradient with respect to every present class
equals the gradient of the reduced (C-1)-class problem: finite, with the loss shifted by the constant -log eps.
The trainer makes such batches rare: it drops the last partial batch, and batch size >> C.

The paper's code takes the determinant of the unnormalised matrix N U^T (in float32) and adds 1e-3:
-log(|det(N U^T)| + 1e-3) = -log(N^C |det U| + 1e-3), which is -log|det U| - C log N up to the 1e-3, small beside
N^C |det U| unless U is almost singular (CIFAR-10, N = 128: N^C ~ 1e21). The two losses differ by a constant per
batch size, and their gradients by the factor d / (d + 1e-3), d = N^C |det U|.

Reference: Newbeeer/L_DMI, CIFAR-10/DMI.py (and dogcat/DMI.py, MR/main.py, fashion/main.py, clothing/main.py)
(commit 7d5e4bc).

Differences (`DMI.differences`):
- The loss -log|det U| with U = (1/N) softmax^T onehot — the scripts compute -log(|det(N U^T)| + 1e-3): C log N
  lower at a given batch size, and the 1e-3 scales the gradient by d / (d + 1e-3), d = N^C |det U|, a factor within
  1e-3 / d of 1.
- slogdet in float64 — the scripts take torch.det of N U^T in float32 (on Clothing1M N^C = 256^14 ~ 5e33, within 1e5
  of float32's largest value).
- A batch that misses a noisy class gets eps = 1e-8 / C on that column's diagonal, and the gradient of the reduced
  problem — in the scripts det = 0 there, the loss is -log 1e-3 and the gradient through |det| is 0.
- Selection (bench): the lowest L_DMI on the whole noisy validation set — the paper's Algorithm 1 and its scripts
  select on one validation batch; `--protocol authors` (first_batch_selection) runs theirs.
- One optimiser for the whole stage (bench) — the scripts re-create it every epoch; `--protocol authors`
  (optimizer_per_epoch) runs theirs.
"""

from __future__ import annotations

import torch

from bench.methods import Method, StageContext, one_hot

DMI_EPS = 1e-8


def joint_matrix(logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """U = (1/N) softmax(logits)^T onehot(labels), in float64 (C x C: rows predicted, columns noisy class).
    Logits (..., N, C) and labels (..., N) give one U per leading index (..., C, C)."""
    probs = torch.softmax(logits.double(), dim=-1)
    onehot = one_hot(labels, num_classes, probs.dtype)
    return probs.transpose(-1, -2) @ onehot / labels.shape[-1]


def neg_log_abs_det(u: torch.Tensor) -> torch.Tensor:
    """-log|det U| in float64 via slogdet (U given exactly: no guard)."""
    return -torch.linalg.slogdet(u.double()).logabsdet


def dmi_loss(logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """-log|det U| for a batch, in float64; finite even when a class is missing from the batch. Leading
    dimensions (a pack's members) give one loss each. No value leaves the device (no host sync)."""
    with torch.autocast(device_type=logits.device.type, enabled=False):
        u = joint_matrix(logits, labels, num_classes)
        missing = one_hot(labels, num_classes, u.dtype).sum(dim=-2) == 0  # (..., C): a zero column of U
        u = u + torch.diag_embed(missing.to(u.dtype) * (DMI_EPS / num_classes))
        return neg_log_abs_det(u)


SCRIPT_EPS = 1e-3


def script_dmi_loss(logits: torch.Tensor, labels: torch.Tensor, num_classes: int, form: str) -> torch.Tensor:
    """L_DMI as the paper's scripts compute it (the `authors` protocol): -log(|det M| + 1e-3) in float32, with
    M = onehot(labels)^T softmax(logits), summed over the batch (`form="sum"`: MR/main.py and CIFAR-10/DMI.py) or
    averaged (`"mean"`: fashion/main.py). No guard: a batch missing a class gives -log(1e-3) and no gradient through
    the determinant, as theirs. Leading dimensions (a pack's members) give one loss each."""
    with torch.autocast(device_type=logits.device.type, enabled=False):
        probs = torch.softmax(logits.float(), dim=-1)
        m = one_hot(labels, num_classes, probs.dtype).transpose(-1, -2) @ probs
        if form == "mean":
            m = m / labels.shape[-1]
        return -torch.log(torch.abs(torch.linalg.det(m)) + SCRIPT_EPS)


class DMI(Method):
    """L_DMI, the paper's method: -log|det| of the empirical joint of predictions and noisy labels."""

    name = "dmi"
    title = "L_DMI"
    paper = "Xu, Cao, Kong, Wang. L_DMI: A Novel Information-theoretic Loss Function for Training Deep Nets " \
        "Robust to Label Noise. NeurIPS 2019"
    reference = "Newbeeer/L_DMI, CIFAR-10/DMI.py, commit 7d5e4bc"
    differences = (
        "The loss -log|det U| with U = (1/N) softmax^T onehot — the scripts compute -log(|det(N U^T)| + 1e-3): C log N "
        "lower at a given batch size, and the 1e-3 scales the gradient by d / (d + 1e-3), d = N^C |det U|, a "
        "factor within 1e-3 / d of 1.",
        "slogdet in float64 — the scripts take torch.det of N U^T in float32 (on Clothing1M N^C = 256^14 ~ 5e33, "
        "within 1e5 of float32's largest value).",
        "A batch that misses a noisy class gets eps = 1e-8 / C on that column's diagonal, and the gradient of the "
        "reduced problem — in the scripts det = 0 there, the loss is -log 1e-3 and the gradient through |det| is 0.",
        "Selection (bench): the lowest L_DMI on the whole noisy validation set — the paper's Algorithm 1 and its "
        "scripts select on one validation batch (MR, Fashion: the lowest L_DMI on the first batch; CIFAR-10: the best "
        "accuracy on its first batch of 256); --protocol authors (first_batch_selection) runs theirs.",
        "One optimiser for the whole stage (bench) — the scripts re-create it every epoch, which resets Adam's "
        "moments and SGD's momentum; --protocol authors (optimizer_per_epoch) runs theirs.",
    )

    form = "exact"  # or the script's: "sum" / "mean" (`bench.protocol`'s dmi_script_form)

    def setup(self, stage: StageContext) -> None:
        if stage.protocol is not None:
            self.form = stage.protocol.setting("dmi_script_form", "exact")

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.form == "exact":
            return dmi_loss(logits, labels, self.num_classes)
        return script_dmi_loss(logits, labels, self.num_classes, self.form)
