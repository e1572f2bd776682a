"""Bootstrapping: the noisy target mixed with the model's own prediction (soft or hard).

Reed, Lee, Anguelov, Szegedy, Erhan, Rabinovich. Training Deep Neural Networks on Noisy Labels with
Bootstrapping. ICLR 2015 workshop (arXiv 1412.6596, 2014).

With q = softmax(h(x)) clipped to [1e-7, 1 - 1e-7] (as the public implementations do) and t = onehot(y~):

    soft:  l = -sum_k (beta t_k + (1 - beta) q_k) log q_k                 beta = 0.95   (their Eq. 6)
    hard:  l = -sum_k (beta t_k + (1 - beta) z_k) log q_k,  z = onehot(argmax q)   beta = 0.8    (their Eq. 7)

Soft bootstrapping equals CE plus (1 - beta) times the prediction's entropy (minimum-entropy regularisation), so q
inside the target is differentiated like the rest (as in those implementations); the hard target z is a constant.

Reference: the authors released no code. Checked against the two public implementations the field uses, both
Keras: giorgiop/loss-correction (Patrini et al.), loss.py (`boot_soft`), commit 15a79de3c6, and
YisenWang/symmetric_cross_entropy_for_noisy_labels (Wang et al.), loss.py (`boot_soft`, `boot_hard`), commit
ec778df4a1. Differences (`Bootstrapping.differences`):
- Checked against those two ports, not against the authors' code (Reed et al. released none).
- Optimiser and schedule are the stage's (the paper's own settings are for its MNIST, TFD and ILSVRC networks).
"""

from __future__ import annotations

from typing import Any

import torch

from bench.methods import Method, one_hot

EPSILON = 1e-7  # Keras' K.epsilon(): both implementations clip q to [EPSILON, 1 - EPSILON]


class Bootstrapping(Method):
    """Soft (default) or hard bootstrapping of the noisy targets."""

    name = "bootstrap"
    title = "Bootstrapping (Reed et al.)"
    paper = "Reed, Lee, Anguelov, Szegedy, Erhan, Rabinovich. Training Deep Neural Networks on Noisy Labels " \
        "with Bootstrapping. arXiv:1412.6596, 2014 (ICLR 2015 workshop)"
    reference = "giorgiop/loss-correction, loss.py (boot_soft), commit 15a79de3c6; " \
        "YisenWang/symmetric_cross_entropy_for_noisy_labels, loss.py (boot_soft, boot_hard), commit ec778df4a1"
    differences = (
        "checked against two widely used ports, not the authors' code — Reed et al. released none",
        "optimiser and schedule are the stage's — the paper's own settings are for its MNIST, TFD and ILSVRC "
        "networks",
    )
    defaults: dict[str, Any] = {"variant": "soft", "beta_soft": 0.95, "beta_hard": 0.8}
    ranges = {"beta_soft": "[0, 1]", "beta_hard": "[0, 1]"}  # weight of the noisy label in the target
    choices = {"variant": ("soft", "hard")}

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        q = torch.softmax(logits.float(), dim=-1).clamp(EPSILON, 1.0 - EPSILON)
        target = one_hot(labels, self.num_classes, q.dtype)
        if self.variant == "soft":
            target = self.beta_soft * target + (1 - self.beta_soft) * q
        else:
            z = one_hot(q.argmax(dim=-1), self.num_classes, q.dtype)
            target = self.beta_hard * target + (1 - self.beta_hard) * z
        return -(target * q.log()).sum(dim=-1).mean(-1)
