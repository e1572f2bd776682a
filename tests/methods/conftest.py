"""What the methods' tests share: a random classification problem with its float64 softmax, the float32
log-softmax's rounding bound for its logits, and the stage context a method is set up with."""

from __future__ import annotations

import numpy as np
import torch

from bench.methods import StageContext
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


def stage_context(labels: torch.Tensor, probs: torch.Tensor | None = None, num_classes: int | None = None,
                  nets: list[torch.nn.Module] | None = None, **extra) -> StageContext:  # noqa: ANN003
    """The context a method's `setup` reads, on the CPU: 4 epochs and no true T unless `extra` says otherwise, the
    training set's predictions `probs` (their width the classes) or None."""
    known = dict(true_transition=None, epochs=4) | extra
    return StageContext(nets=nets or [], num_classes=probs.shape[1] if num_classes is None else num_classes,
                        noisy_train=labels, predict_train=lambda: probs, device=torch.device("cpu"), **known)
