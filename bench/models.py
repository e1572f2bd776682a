"""The paper's networks, registered by name (`create("fashion_cnn", num_classes=2)`).

Each model reads top to bottom; a dataset names its default model and passes what it needs (vocabulary size).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bench.config import UserError

MODELS: dict[str, Callable[..., nn.Module]] = {}


def register(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    def wrap(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        MODELS[name] = builder
        return builder

    return wrap


def create(name: str, num_classes: int, **kwargs: Any) -> nn.Module:
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}; choose from {', '.join(sorted(MODELS))}")
    return MODELS[name](num_classes=num_classes, **kwargs)


@register("mlp")
class MLP(nn.Module):
    """A small two-layer perceptron for synthetic data and tests."""

    def __init__(self, num_classes: int, in_features: int = 2, hidden: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@register("fashion_cnn")
class FashionCNN(nn.Module):
    """The paper's two-layer CNN for 28x28 Fashion-MNIST: conv 1->16 5x5, pool, conv 16->32 5x5, pool,
    dropout 0.5, linear 512 -> C."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.dropout = nn.Dropout(0.5)
        self.classifier = nn.Linear(32 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.features(x).flatten(1)))


@register("word_cnn")
class WordCNN(nn.Module):
    """Kim's (2014) sentence CNN: random 128-d embeddings, filters of width 3/4/5 x 100, ReLU,
    max-over-time pooling, dropout 0.5, linear 300 -> C. Token 0 is padding."""

    def __init__(
        self, num_classes: int, vocab_size: int, embed_dim: int = 128,
        widths: tuple[int, ...] = (3, 4, 5), filters: int = 100,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(embed_dim, filters, w) for w in widths)
        self.dropout = nn.Dropout(0.5)
        self.classifier = nn.Linear(filters * len(widths), num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward_embedded(self.embedding(tokens))

    def forward_embedded(self, embedded: torch.Tensor) -> torch.Tensor:
        """From word embeddings (N, L, D): the entry point for perturbing embeddings (VAT on text)."""
        h = embedded.transpose(1, 2)
        pooled = [torch.relu(conv(h)).amax(dim=2) for conv in self.convs]
        return self.classifier(self.dropout(torch.cat(pooled, dim=1)))
