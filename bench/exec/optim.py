"""The optimisers: a solo stage's (torch.optim's Adam or SGD, `make_optimizer`), and the step of a pack: Adam or SGD
on stacked parameters, each member with its own learning rate (and its method's factor on it), and each member's own
gradient-norm clip. The pack's arithmetic is torch.optim's, term for term, so that a member's step equals its solo
trial's.
"""

from __future__ import annotations

import functools
import importlib
import math
import threading
from typing import Any

import torch
from torch import nn

from bench.config import Schedule, UserError


@functools.cache
def import_dynamo_apart() -> None:
    """torch.optim imports torch._dynamo on its first use, and that import keeps every frame then on the stack
    alive for the life of the process (seen with torch 2.14): a worker's first trial (its model, optimiser state
    and data, on the GPU) would never be freed. Imported from a thread of its own, no frame of ours is kept.
    Called before the first torch.optim optimiser and before torch.compile, the two that import it."""
    thread = threading.Thread(target=importlib.import_module, args=("torch._dynamo",))
    thread.start()
    thread.join()


def make_optimizer(params: list[nn.Parameter], schedule: Schedule) -> torch.optim.Optimizer:
    import_dynamo_apart()
    if schedule.optimizer == "adam":
        return torch.optim.Adam(params, lr=schedule.lr, weight_decay=schedule.weight_decay)
    if schedule.optimizer == "sgd":
        return torch.optim.SGD(params, lr=schedule.lr, momentum=schedule.momentum, weight_decay=schedule.weight_decay)
    raise UserError(f"unknown optimizer {schedule.optimizer!r}; use adam or sgd")


class StackedOptimizer:
    """Adam or SGD (momentum, L2 weight decay, lr milestones) on stacked parameters, each member with its own
    learning rate. The arithmetic is torch.optim's, term for term, so one member's step equals a solo step."""

    def __init__(self, params: dict[str, torch.Tensor], schedule: Schedule, lrs: list[float]) -> None:
        self.params, self.schedule = params, schedule
        device = next(iter(params.values())).device
        self.host_lr = [float(lr) for lr in lrs]
        self.lr = torch.tensor(self.host_lr, dtype=torch.float64, device=device)
        self.steps = 0
        self.epochs = 0
        self.state: dict[str, dict[str, torch.Tensor]] = {name: {} for name in params}

    def reset(self) -> None:
        """As a newly created optimiser (the `authors` protocol's optimiser per epoch): no moments, no momentum,
        Adam's step count back to 0; the learning rates stay the schedule's."""
        self.steps = 0
        self.state = {name: {} for name in self.params}

    def scale_lr(self, factors: list[float]) -> None:
        """This epoch's learning rates: each member's scheduled one times its factor (`end_epoch` goes back to the
        schedule), as a solo trial scales its optimiser's for the epoch (`Method.lr_factor`)."""
        self.lr = torch.tensor([lr * f for lr, f in zip(self.host_lr, factors, strict=True)], dtype=torch.float64,
                               device=self.lr.device)

    def end_epoch(self) -> None:
        """MultiStepLR's rule: after the epochs named in `milestones`, lr *= gamma (same float sequence)."""
        self.epochs += 1
        for _ in range(self.schedule.milestones.count(self.epochs)):
            self.host_lr = [lr * self.schedule.gamma for lr in self.host_lr]
        self.lr = torch.tensor(self.host_lr, dtype=torch.float64, device=self.lr.device)

    @torch.no_grad()
    def step(self, active: torch.Tensor | None) -> None:
        """One step for every member; members not `active` (diverged) keep their parameters."""
        s = self.schedule
        self.steps += 1
        if s.optimizer == "adam":
            beta1, beta2, eps = 0.9, 0.999, 1e-8
            bias1, bias2_sqrt = 1 - beta1**self.steps, math.sqrt(1 - beta2**self.steps)
            step_size = (self.lr / bias1).float()
        else:
            lr = self.lr.float()
        for name, p in self.params.items():
            grad = p.grad
            if s.weight_decay:
                grad = grad.add(p, alpha=s.weight_decay)
            per_member = (-1,) + (1,) * (p.dim() - 1)
            state = self.state[name]
            if s.optimizer == "adam":
                if not state:
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                state["exp_avg"].lerp_(grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (state["exp_avg_sq"].sqrt() / bias2_sqrt).add_(eps)
                update = state["exp_avg"] * step_size.view(per_member) / denom
            elif s.optimizer == "sgd":
                if s.momentum:
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = grad.detach().clone()
                    else:
                        state["momentum_buffer"].mul_(s.momentum).add_(grad)
                    grad = state["momentum_buffer"]
                update = grad * lr.view(per_member)
            else:
                raise UserError(f"unknown optimizer {s.optimizer!r}; use adam or sgd")
            if active is None:
                p.sub_(update)
            else:
                p.copy_(torch.where(active.view(per_member), p - update, p))

    def state_dict(self) -> dict[str, Any]:
        return dict(host_lr=self.host_lr, steps=self.steps, epochs=self.epochs,
                    state={n: {k: v.cpu() for k, v in st.items()} for n, st in self.state.items()})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.host_lr, self.steps, self.epochs = list(state["host_lr"]), state["steps"], state["epochs"]
        self.lr = torch.tensor(self.host_lr, dtype=torch.float64, device=self.lr.device)
        device = self.lr.device
        self.state = {n: {k: v.to(device) for k, v in st.items()} for n, st in state["state"].items()}


def clip_member_grads(params: dict[str, torch.Tensor], bounds: torch.Tensor) -> None:
    """`torch.nn.utils.clip_grad_norm_` for each member on its own slice of the stacked gradients: member k's gradient
    (the norm over all its parameters) scaled by min(1, bounds[k] / (norm + 1e-6)); an infinite bound leaves it as
    it is."""
    norms = torch.stack([torch.linalg.vector_norm(p.grad.flatten(1), dim=1) for p in params.values()])
    scale = (bounds / (torch.linalg.vector_norm(norms, dim=0) + 1e-6)).clamp(max=1.0)
    for p in params.values():
        p.grad.mul_(scale.view((-1,) + (1,) * (p.dim() - 1)))
