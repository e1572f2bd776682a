"""Bootstrapping: the noisy target mixed with the model's own prediction (soft or hard).

Reed, Lee, Anguelov, Szegedy, Erhan, Rabinovich. Training Deep Neural Networks on Noisy Labels with
Bootstrapping. ICLR 2015 workshop (arXiv 1412.6596, 2014).

With q = softmax(h(x)) and t = onehot(y~):

    soft:  l = -sum_k (beta t_k + (1 - beta) q_k) log q_k                 beta = 0.95   (their Eq. 6)
    hard:  l = -sum_k (beta t_k + (1 - beta) z_k) log q_k,  z = onehot(argmax q)   beta = 0.8    (their Eq. 7)

Soft bootstrapping equals CE plus (1 - beta) times the prediction's entropy (minimum-entropy regularisation),
so q inside the target is differentiated like the rest; the hard target z is a constant.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.methods import Method, one_hot


class Bootstrapping(Method):
    """Soft (default) or hard bootstrapping of the noisy targets."""

    name = "bootstrap"
    title = "Bootstrapping (Reed et al.)"
    paper = "Reed, Lee, Anguelov, Szegedy, Erhan, Rabinovich. Training Deep Neural Networks on Noisy Labels " \
        "with Bootstrapping. arXiv:1412.6596, 2014 (ICLR 2015 workshop)"
    defaults: dict[str, Any] = {"variant": "soft", "beta_soft": 0.95, "beta_hard": 0.8}
    ranges = {"beta_soft": "[0, 1]", "beta_hard": "[0, 1]"}  # weight of the noisy label in the target
    choices = {"variant": ("soft", "hard")}

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        log_q = torch.log_softmax(logits.float(), dim=-1)
        target = one_hot(labels, self.num_classes, log_q.dtype)
        if self.variant == "soft":
            target = self.beta_soft * target + (1 - self.beta_soft) * log_q.exp()
        else:
            z = one_hot(log_q.argmax(dim=-1), self.num_classes, log_q.dtype)
            target = self.beta_hard * target + (1 - self.beta_hard) * z
        return -(target * log_q).sum(dim=-1).mean(-1)
