"""The method interface every learning-with-noisy-labels method implements, and the registry that finds them.

A method is one class in one file (L_DMI in `bench/dmi.py`, every comparison method in `baselines/`). The
trainer runs the CE warm start, then calls the method's hooks:

* `setup(stage)` once after the warm start (FW estimates T here from the warm-started model; LCCN initialises its
  transition counts; a method with two networks copies the first);
* `train_loss(nets, batch)` for each training step; the default is `loss(net(x), y)`. VAT overrides it to
  perturb the input, LCCN to sample latent labels, Co-teaching to exchange small-loss samples between two nets;
* `loss(logits, labels)` is the method's own objective; the trainer applies it to the whole noisy validation
  set to select the checkpoint (the paper's protocol: the method's loss, not accuracy);
* `end_epoch(epoch)` after each epoch (MentorNet moves its threshold, LCCN its counts).

Hyper-parameters are declared as data in `defaults` (the method's own paper's values) and arrive as keyword
arguments; unknown ones are rejected with the allowed list.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from bench.config import UserError


@dataclass
class Batch:
    """One training step's data on the training device."""

    x: torch.Tensor  # model input, already transformed/augmented
    y: torch.Tensor  # noisy labels (int64)
    index: torch.Tensor  # positions of these examples in the training split (int64), for per-example state
    epoch: int  # 0-based epoch of the method stage


@dataclass
class StageContext:
    """What a method may look at before its stage starts (after the CE warm start)."""

    nets: list[nn.Module]  # nets[0] is the warm-started model
    num_classes: int
    noisy_train: torch.Tensor  # noisy labels of the training split, on the device
    predict_train: Callable[[], torch.Tensor]  # softmax outputs of nets[0] on the (unaugmented) training split
    true_transition: np.ndarray | None  # privileged: only methods with `uses_true_transition` may read it
    device: torch.device
    epochs: int  # length of the method stage
    # softmax outputs of nets[i] on the (unaugmented) training split: DivideMix divides each epoch by both nets
    predict_train_of: Callable[[int], torch.Tensor] | None = None


class Method:
    """Base class: subclasses set `name`, `paper`, `defaults` and implement `loss`."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    networks: ClassVar[int] = 1  # how many networks the trainer builds (Co-teaching: 2)
    uses_true_transition: ClassVar[bool] = False  # privileged information: flagged in results

    def __init__(self, num_classes: int, **params: Any) -> None:
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            allowed = ", ".join(sorted(self.defaults)) or "none"
            raise UserError(f"method {self.name!r} has no parameter {', '.join(unknown)} (allowed: {allowed})")
        self.num_classes = num_classes
        self.params = {**self.defaults, **params}
        for key, value in self.params.items():
            setattr(self, key, value)

    def setup(self, stage: StageContext) -> None:
        """Called once after the warm start, before the method stage."""

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def validation_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The checkpoint-selection criterion on the whole noisy validation set: by default the method's loss."""
        return self.loss(logits, labels)

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        return self.loss(nets[0](batch.x), batch.y)

    def end_epoch(self, epoch: int) -> None:
        """Called after each epoch of the method stage."""

    def state_dict(self) -> dict[str, Any]:
        """Per-run state beyond the networks (LCCN's counts, MentorNet's threshold), for checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""

    def estimated_transition(self) -> np.ndarray | None:
        """The method's estimate of T, where it makes one (FW, LCCN); recorded in the result row."""
        return None


def _discover() -> dict[str, type[Method]]:
    import bench.baselines
    import bench.dmi

    modules = [bench.dmi]
    for info in pkgutil.iter_modules(bench.baselines.__path__):
        modules.append(importlib.import_module(f"bench.baselines.{info.name}"))
    found: dict[str, type[Method]] = {}
    for module in modules:
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Method) and obj.name and obj.__module__ == module.__name__:
                found[obj.name] = obj
    return dict(sorted(found.items()))


_REGISTRY: dict[str, type[Method]] | None = None


def registry() -> dict[str, type[Method]]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _discover()
    return _REGISTRY


def get_method(name: str) -> type[Method]:
    methods = registry()
    if name not in methods:
        raise UserError(f"unknown method {name!r}; choose from {', '.join(methods)}")
    return methods[name]
