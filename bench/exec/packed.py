"""Packed trials: K trials of a grid trained as one stacked model on one device (`bench run --executor pack`).

Members share the dataset (its tensors live once on the device), the model architecture and the shape of each
stage (optimiser type, epochs, batch size, lr milestones); they may differ in noise pattern, r, seed, learning rate
and method (any method whose `packable()` says yes). Their parameters and buffers are stacked
(`torch.func.stack_module_state`) and one `torch.func.vmap` of `functional_call` gives every member's logits (the
convolutions become grouped ones); networks with BatchNorm run fused in HFTA's layout instead
(`bench.exec.grouped`: grouped convolutions, BatchNorm over K x C channels, each member's running statistics its
own). Each member's loss comes from its own method, and the sum is back-propagated: no parameter is shared, so
member k's gradient is the gradient of its own loss alone.

Each member stays its own trial: its initial weights from its seed, its data order from its own generator, its
dropout masks, random augmentation and random draws from its own device generator (seeded exactly as a solo trial
seeds torch), its own noisy labels and learning rate (a stacked Adam or SGD step, `StackedOptimizer`: torch.optim's
arithmetic term for term, each member's own gradient-norm clip), its own selection on the whole
noisy validation set with its best state kept on the device, its own result row. A member's numbers therefore
equal its solo trial's up to the order of floating-point sums (a grouped convolution adds in another order than a
single one), whoever its pack-mates are (at precision bf16, shared by a pack's members, up to the bf16 roundings
that order moves). A member whose training loss stops being finite is frozen and recorded as diverged.
The loop itself is `bench.exec.stage.run_stage`, the same one a solo trial runs (K = 1). Which trials may share a
pack, and in what order its members sit, is `bench.exec.packing`'s.

Only torch and numpy are imported here, so a bare GPU box runs packs.
"""

from __future__ import annotations

import copy
import math
import os
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from bench import models
from bench.config import Schedule, UserError
from bench.data import Dataset
from bench.exec import diagnostics
from bench.exec.grouped import Grouped
from bench.exec.packing import group_key
from bench.exec.prepare import Prepared, autocast, to_device
from bench.exec.stage import import_dynamo_apart
from bench.methods import Batch, Method, get_method
from bench.protocol import Selection

# Member-images per evaluation chunk (K members x chunk rows): large on a GPU, cache-sized on a CPU.
EVAL_IMAGES = {"cuda": 65536, "cpu": 2048}


def compile_mode(device: torch.device) -> str | None:
    """The torch.compile mode of a pack's method stage on CUDA: opt-in with `BENCH_PACK_COMPILE=default` (or
    another mode). Measured 1.24x the throughput at K = 256 on an H100 (benchmarks/README.md), at the price of a
    compilation per pack (tens of seconds) and float sums in another order: worth it for long stages only."""
    mode = os.environ.get("BENCH_PACK_COMPILE", "")
    return mode if mode and device.type == "cuda" else None


def check_no_pack_precision() -> None:
    """BENCH_PACK_PRECISION, which once turned bf16 on for packs alone, is refused rather than ignored: a trial's
    precision is declared now, so that its row and its id say which it trained at."""
    if os.environ.get("BENCH_PACK_PRECISION"):
        raise UserError("BENCH_PACK_PRECISION is gone: declare a trial's precision instead (precision: bf16 in the "
                        "experiment file, --set precision=bf16, or bench trial --precision bf16)")


# -- the packed stage -------------------------------------------------------------------------------------------
def device_generator(device: torch.device, seed: int) -> torch.Generator:
    """A member's own generator, in the state torch's default generator of `device` has in a solo trial right
    after `torch.manual_seed(seed)` and (on the CPU, which also initialises the weights) the model's creation."""
    if device.type == "cpu":
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
        return generator
    return torch.Generator(device).manual_seed(seed)


def member_forward(base: nn.Module, dropouts: list[models.Dropout]) -> Any:
    """The training forward pass of one member, to be vmapped over the stack: masks are handed to the Dropout
    layers for the length of the call, so that every member uses the masks drawn from its own generator. A
    closure over the network, not a method of the stage: a bound method kept on the stage made a reference cycle,
    which held a finished pack's parameters and optimiser state (on the GPU) until Python's cycle collector ran."""
    def forward(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor,
                masks: list[torch.Tensor]) -> torch.Tensor:
        for layer, mask in zip(dropouts, masks, strict=True):
            layer.mask = mask
        try:
            return functional_call(base, (params, buffers), (x,))
        finally:
            for layer in dropouts:
                layer.mask = None

    return forward


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


class PackedStage:
    """The `bench.exec.stage.Stage` of K members stacked into one model (see the module docstring)."""

    def __init__(self, members: list[Prepared], nets: list[nn.Module], generators: list[torch.Generator],
                 schedule: Schedule, lrs: list[float], seeds: list[int], methods: list[Method] | None = None,
                 precision: str | None = None, compile: str | None = None) -> None:
        self.members, self.p, self.schedule = len(members), members, schedule
        # The members' precision (one a pack) or the benchmarks': bf16 autocasts the forward passes, not the losses.
        check_no_pack_precision()
        self.precision = precision or members[0].precision
        self.device = members[0].device
        self.train_x, self.val_x = members[0].train.x, members[0].val.x
        params, self.buffers = stack_module_state(nets)
        # With buffers (BatchNorm's running statistics): fused in HFTA's layout, checked against the members' own
        # networks before anything trains.
        self.grouped = Grouped(nets[0], len(nets), models.trains_channels_last(nets[0], self.device)) \
            if self.buffers else None
        if self.grouped is not None:
            params = self.grouped.layout(params)
            self.grouped.check(nets, params, self.buffers, members[0].dataset.eval_transform(self.train_x[:2]))
        self.params = params
        self.base = self.grouped.twin if self.grouped is not None else copy.deepcopy(nets[0]).to("meta")
        self.dropouts = [m for m in self.base.modules() if isinstance(m, models.Dropout)]
        self.order_generators = [torch.Generator().manual_seed(s) for s in seeds]
        self.generators = generators
        self.train_labels = torch.stack([p.train.labels for p in members])
        self.val_labels = torch.stack([p.val.labels for p in members])
        self.optimizer = StackedOptimizer(self.params, schedule, lrs)
        self.active = torch.ones(self.members, dtype=torch.bool, device=self.device)
        self.all_active = True
        self.best = {n: t.detach().clone() for n, t in self.state().items()}
        self.set_methods(methods)
        self._dropout_shapes: dict[torch.Size, list[torch.Size]] = {}
        # Opt-in: the vmapped forward pass (and, through AOTAutograd, its backward) compiled by torch.compile,
        # `compile` being its mode ("default", "reduce-overhead", "max-autotune-no-cudagraphs").
        self._train_forward = self.grouped or vmap(member_forward(self.base, self.dropouts))
        if compile:
            import_dynamo_apart()
            self._train_forward = torch.compile(self._train_forward, mode=compile, dynamic=False)

    def set_methods(self, methods: list[Method] | None) -> None:
        """The members' methods (None: CE, the warm start), set up; their losses are computed group by group."""
        self.methods = methods
        self.groups = self._groups(methods)
        # Each member's gradient-norm bound (`Method.max_grad_norm`; inf: none), or None when no member clips.
        bounds = [m.max_grad_norm() for m in methods or []]
        self.grad_bounds = None if all(b is None for b in bounds) else torch.tensor(
            [math.inf if b is None else b for b in bounds], device=self.device)

    def _groups(self, methods: list[Method] | None) -> list[tuple[slice, Method]]:
        """Contiguous runs of members with the same method and hyper-parameters, each with one stacked instance
        (the caller orders members so that equal methods are adjacent)."""
        if methods is None:  # the warm start: CE, the same loss as the `ce` method
            return [(slice(0, None), get_method("ce")(self.p[0].dataset.num_classes))]
        groups: list[tuple[slice, Method]] = []
        keys = [group_key(m.name, m.params) for m in methods]
        start = 0
        for i in range(1, len(methods) + 1):
            if i == len(methods) or keys[i] != keys[start]:
                group = methods[start:i]
                groups.append((slice(start, i), type(group[0]).stack(group)))
                start = i
        return groups

    def state(self) -> dict[str, torch.Tensor]:
        """Every stacked tensor by name: the parameters, then the buffers (a member's state dict, stacked)."""
        return {**self.params, **self.buffers}

    def _forward_eval(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                      x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.base, (params, buffers), (x,))

    def member_inputs(self, idx: torch.Tensor) -> torch.Tensor:
        """The training inputs of every member's batch `idx` (K, B): a dataset that augments at random draws each
        member's augmentation from that member's generator, as its solo trial draws from torch's."""
        ds = self.p[0].dataset
        if type(ds).train_transform is Dataset.train_transform:  # no random augmentation: one pass for all
            return ds.train_transform(self.train_x[idx.flatten()]).unflatten(0, idx.shape)
        return torch.stack([ds.train_transform(self.train_x[i], generator=g)
                            for i, g in zip(idx, self.generators, strict=True)])

    def _masks(self, member_input: torch.Tensor) -> list[torch.Tensor]:
        """Each Dropout layer's masks for this step, (K, *shape), member k's from member k's generator, drawn in
        the layers' forward order as a solo forward pass draws them."""
        shape = member_input.shape
        if not self.dropouts:
            return []
        if shape not in self._dropout_shapes:
            seen: list[torch.Size] = []
            hooks = [layer.register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape))
                     for layer in self.dropouts]
            self.base.eval()
            with torch.no_grad():
                functional_call(self.base, {n: p[0] for n, p in self.params.items()}, (member_input,))
            self.base.train()
            for hook in hooks:
                hook.remove()
            self._dropout_shapes[shape] = seen
        layers = self._dropout_shapes[shape]
        return [torch.stack([layer.draw(s, self.device, g) for g in self.generators])
                for layer, s in zip(self.dropouts, layers, strict=True)]

    def _losses(self, logits: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, x: torch.Tensor,
                epoch: int) -> torch.Tensor:
        parts = []
        for sl, method in self.groups:
            batch = Batch(x=x[sl], y=y[sl], index=idx[sl], epoch=epoch, generators=self.generators[sl])
            parts.append(method.logits_loss(logits[sl], batch).double())
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def train_steps(self, epoch: int) -> torch.Tensor:
        """One pass over the training split: every member's mean training loss, on the device (no host sync)."""
        n, b = self.train_x.shape[0], self.schedule.batch_size
        orders = to_device(torch.stack([torch.randperm(n, generator=g) for g in self.order_generators]),
                           self.device)
        stop = n - n % b if n >= b else n
        total = torch.zeros(self.members, dtype=torch.float64, device=self.device)
        steps = 0
        self.base.train()
        # A frozen (diverged) member's running statistics stay as they were, as its parameters do.
        kept = None if self.all_active else {n: b.clone() for n, b in self.buffers.items()}
        for start in range(0, stop, b):
            losses = self.batch_losses(orders[:, start : start + b], epoch)
            for p in self.params.values():
                p.grad = None
            losses.sum().backward()
            if self.grad_bounds is not None:
                clip_member_grads(self.params, self.grad_bounds)
            self.optimizer.step(None if self.all_active else self.active)
            total += losses.detach()
            steps += 1
        for p in self.params.values():  # not held through the evaluations that follow
            p.grad = None
        for name, old in (kept or {}).items():
            now = self.buffers[name]
            now.copy_(torch.where(self.active.view(-1, *(1,) * (now.dim() - 1)), now, old))
        return total / max(steps, 1)

    def batch_losses(self, idx: torch.Tensor, epoch: int) -> torch.Tensor:
        """Every member's training loss on its batch `idx` (K, B): one stacked forward pass, then each method's
        loss (float64, with the graph for the backward pass)."""
        x = self.member_inputs(idx)
        y = self.train_labels.gather(1, idx)
        with autocast(self.device, self.precision):
            logits = self._train_forward(self.params, self.buffers, x, self._masks(x[0]))
        return self._losses(logits.float(), y, idx, x, epoch)

    def train_epoch(self, epoch: int) -> np.ndarray:
        if self.p[0].protocol.on("optimizer_per_epoch"):  # members share their protocol (`packing.pack_key`)
            self.optimizer.reset()
        if self.methods:
            self.optimizer.scale_lr([method.lr_factor(epoch) for method in self.methods])
        total = self.train_steps(epoch)
        self.optimizer.end_epoch()
        if self.methods:
            for sl, group in self.groups:
                group.unstack(self.methods[sl])
            for method in self.methods:
                method.end_epoch(epoch)
            self.set_methods(self.methods)  # stacked again, with what end_epoch changed
        return total.cpu().numpy()

    @torch.no_grad()
    def predict(self, x: torch.Tensor, state: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Logits (K, N, C) of every member on a shared input split (`eval_transform` applied), in evaluation mode
        (no dropout, BatchNorm's running statistics), with the current `state()` or another (`best`)."""
        state = self.state() if state is None else state
        params, buffers = {n: state[n] for n in self.params}, {n: state[n] for n in self.buffers}
        self.base.eval()
        chunk = max(1, EVAL_IMAGES.get(self.device.type, 2048) // self.members)
        group = getattr(type(self.base), "eval_group", 1)  # rows a model reads as one batch in evaluation
        chunk = max(group, chunk // group * group)
        grouped, transform = self.grouped, self.p[0].dataset.eval_transform
        forward = vmap(self._forward_eval, in_dims=(0, 0, None)) if grouped is None else (
            lambda p, b, inputs: grouped(p, b, inputs.expand(self.members, *inputs.shape), []))
        with autocast(self.device, self.precision):
            out = torch.cat([forward(params, buffers, transform(x[s : s + chunk])).float()
                             for s in range(0, x.shape[0], chunk)], 1)
        self.base.train()
        return out

    def validate(self, selection: Selection) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As `SoloStage.validate`, for a rule without a pass of its own (`packing.why_solo` keeps those out)."""
        logits, labels, first = self.predict(self.val_x), self.val_labels, selection.first
        if first is not None:  # the first validation examples in split order (`bench.protocol.Selection`)
            logits, labels = logits[:, :first], labels[..., :first]
        with torch.no_grad():
            losses = torch.cat([method.validation_loss(logits[sl], labels[sl]).double()
                                for sl, method in self.groups])
            acc = 100.0 * (logits.argmax(-1) == labels).double().mean(-1)
        return losses.cpu().numpy(), acc.cpu().numpy(), selection.score(losses.cpu().numpy(), acc.cpu().numpy())

    def diagnose(self, epoch: int) -> list[dict[str, float | None]]:
        """Every member's epoch diagnostics, from one stacked pass over the training sample and the test set."""
        p = self.p[0]
        if not p.epoch_eval:
            return [{} for _ in range(self.members)]
        train, test = self.predict(p.diag_train.x), self.predict(p.test.x)
        noisy = self.train_labels[:, p.diag_index]
        with torch.no_grad():
            return [diagnostics.epoch_numbers(
                train[m], noisy[m], p.diag_clean, test[m], p.test.labels,
                self.methods[m].judged_noisy(train[m], noisy[m], epoch, p.diag_index) if self.methods else None)
                for m in range(self.members)]

    @torch.no_grad()
    def keep_best(self, improved: np.ndarray) -> None:
        which = torch.as_tensor(np.flatnonzero(improved), device=self.device)
        if which.numel():
            for name, t in self.state().items():
                self.best[name][which] = t.detach()[which]

    def freeze(self, members: np.ndarray) -> None:
        self.active[torch.as_tensor(np.flatnonzero(members), device=self.device)] = False
        self.all_active = False

    def state_dict(self) -> dict[str, Any]:
        return dict(
            params={n: p.detach().cpu() for n, p in self.params.items()},
            buffers={n: b.cpu() for n, b in self.buffers.items()},
            best={n: p.cpu() for n, p in self.best.items()},
            optimizer=self.optimizer.state_dict(), active=self.active.cpu(),
            order_generators=[g.get_state() for g in self.order_generators],
            generators=[g.get_state() for g in self.generators],
            methods=[m.state_dict() for m in self.methods or []],
        )

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, t in self.state().items():
            t.copy_(state["buffers" if name in self.buffers else "params"][name])
        for name, t in self.best.items():
            t.copy_(state["best"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.active = state["active"].to(self.device)
        self.all_active = bool(self.active.all())
        for g, s in zip(self.order_generators, state["order_generators"], strict=True):
            g.set_state(s)
        for g, s in zip(self.generators, state["generators"], strict=True):
            g.set_state(s)
        for method, s in zip(self.methods or [], state["methods"], strict=True):
            method.load_state_dict(s)
        self.set_methods(self.methods)

    def member_state(self, k: int, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Member k's state dict, as a solo model's `state_dict()` (the warm-start cache stores these): of its best
        state, or of another stacked `state`."""
        state = self.best if state is None else state
        return {n: t[k].detach().clone() for n, t in state.items()}
