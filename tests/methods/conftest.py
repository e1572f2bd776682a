"""What the methods' tests share: a random classification problem with its float64 softmax, and the float32
log-softmax's rounding bound for its logits."""

from __future__ import annotations

import numpy as np
import torch

from tests.tolerances import f32_log_softmax


def numpy_softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def random_problem(n: int = 256, c: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Logits (float32), labels, and the softmax computed in float64 from the same float32 logits: what differs
    from a method's output is its float32 arithmetic alone."""
    rng = np.random.default_rng(seed)
    logits = torch.tensor(rng.normal(size=(n, c)) * 2, dtype=torch.float32)
    labels = rng.integers(0, c, n)
    return logits, torch.tensor(labels), numpy_softmax(logits.double().numpy())


def log_softmax_error(logits: torch.Tensor) -> float:
    """The absolute rounding bound of a float32 log-softmax of these logits (tests/tolerances.py)."""
    return f32_log_softmax(float(logits.detach().abs().max()), logits.shape[-1])
