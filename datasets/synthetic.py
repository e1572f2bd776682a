"""A generated two-class problem for tests, demos and runner checks: no files, loads in milliseconds.

Gaussian classes in 10 dimensions, imbalanced like Fashion-MNIST's bags vs clothes (20% class 0), so that the
paper's cases 2 and 3 show the same failure of CE at large r in seconds.
"""

from __future__ import annotations

import numpy as np
import torch

from bench.config import Schedule
from bench.data import Dataset, Split, Splits
from bench.datasets.fashion_mnist import CASES

FEATURES = 10


class Synthetic(Dataset):
    """Two imbalanced Gaussian classes (generated; for tests and quick demos)."""

    name = "synthetic"
    title = "Synthetic Gaussians (generated)"
    num_classes = 2
    class_names = ("minority", "majority")
    split_sizes = (4_000, 1_000, 1_000)
    model = "mlp"
    noise_patterns = CASES  # the same imbalance, the same three cases
    warmup = Schedule("adam", 1e-2, epochs=3, batch_size=128)
    method_stage = Schedule("adam", 1e-3, epochs=5, batch_size=128)
    source = "generated in memory"

    def load(self) -> Splits:
        rng = np.random.default_rng(20191208)
        n = sum(self.split_sizes)
        y = (rng.random(n) >= 0.2).astype(np.int64)
        centres = rng.normal(size=(2, FEATURES)) * 0.6
        x = torch.from_numpy((centres[y] + rng.normal(size=(n, FEATURES))).astype(np.float32))
        a, b = self.split_sizes[0], self.split_sizes[0] + self.split_sizes[1]
        return Splits(
            train=Split(x[:a], y[:a]), val=Split(x[a:b], y[a:b]), test=Split(x[b:], y[b:]),
            model_args={"in_features": FEATURES},
        )
