"""K stacked networks with BatchNorm as one network in HFTA's layout, for `bench.exec.packed`.

HFTA (Wang et al., MLSys 2021, "Horizontally Fused Training Array"; github.com/UofT-EcoSystem/hfta) fuses K
copies of a network into one: the members' inputs side by side as channels, (N, K x C, H, W), every convolution
grouped (groups = K, member k's kernels in the k-th block), every BatchNorm over K x C channels (member k's batch
statistics and running statistics are its own channels, so nothing is shared), every linear layer a batched matrix
product. Here the fused network (`grouped_twin`) is a copy of the member network with those three module types
replaced, on the meta device, so its forward code is the member's own; it runs by `functional_call` on views of
the pack's stacked tensors (member k's slice of every parameter and buffer, as `torch.func.stack_module_state`
lays them out), so the stacked optimiser, the best states and the checkpoints see one tensor per name as for
every other pack, and BatchNorm's running statistics are updated in place in the stacked buffers.

Why not `torch.func.vmap` here, as for the networks without BatchNorm: vmap gives the same grouped convolutions
(the same numbers, bit for bit), but its batching rule for BatchNorm with stacked running statistics adds
elementwise passes over the activations; measured on the CPU with `benchmarks/bn_pack_layout.py` (one thread,
K = 2 to 8), this layout trains 1.05x to 1.35x faster (benchmarks/README.md; not yet measured on a GPU). It also
makes channels-last explicit: the fused input and the grouped kernels are laid out so that cuDNN gets NHWC tensors
without a copy per step (`Grouped.layout`).

The fused forward pass only reorders what each member computes as long as the member network's forward code
treats dimension 1 as channels and flattens (N, C, ...) before its linear layers: true of ResNet, VGG and
torchvision's ResNet-50, not of a network that concatenates or shuffles channels. `Grouped.check` compares the
fused pass with each member's own network once, before a pack trains, and refuses a network that fails it.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn
from torch.func import functional_call

from bench import models
from bench.config import UserError

COUNTER = "num_batches_tracked"
# `Grouped.check`: the fused pass against each member's own network, as the largest difference relative to the
# logits' scale, in full float32 (TF32 off for the check): sums in another order differ by about 1e-6 a layer; a
# network whose forward code mixes members' channels is off by the logits' own size.
CHECK_TOLERANCE = 1e-3


@contextlib.contextmanager
def full_float32() -> Iterator[None]:
    """TF32 off on CUDA (convolutions and matrix products) for the length of the block, as it was after."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic,
                         allow_tf32=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul


class GroupedLinear(nn.Module):
    """K linear layers side by side: input (N, K x F), member-major, output (N, K x O); weight (K, O, F)."""

    def __init__(self, members: int, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.members = members
        self.weight = nn.Parameter(torch.empty(members, out_features, in_features, device="meta"))
        self.bias = nn.Parameter(torch.empty(members, out_features, device="meta")) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        per_member = x.reshape(n, self.members, -1).transpose(0, 1)  # (K, N, F)
        if self.bias is None:
            out = torch.bmm(per_member, self.weight.transpose(1, 2))
        else:
            out = torch.baddbmm(self.bias.unsqueeze(1), per_member, self.weight.transpose(1, 2))
        return out.transpose(0, 1).flatten(1)


def grouped_module(module: nn.Module, k: int) -> nn.Module | None:
    """The K-fold fused replacement of one layer (None: the layer has no state and stays as it is)."""
    if isinstance(module, nn.Conv2d):
        if module.padding_mode != "zeros":
            raise UserError(f"packs of BatchNorm networks need zero-padded convolutions, not {module.padding_mode}")
        return nn.Conv2d(k * module.in_channels, k * module.out_channels, module.kernel_size, module.stride,
                         module.padding, module.dilation, k * module.groups, module.bias is not None, device="meta")
    if isinstance(module, nn.BatchNorm2d):
        if module.momentum is None or not module.track_running_stats:
            raise UserError("packs of BatchNorm networks need BatchNorm with a momentum and running statistics")
        return nn.BatchNorm2d(k * module.num_features, module.eps, module.momentum, module.affine, device="meta")
    if isinstance(module, nn.Linear):
        return GroupedLinear(k, module.in_features, module.out_features, module.bias is not None)
    own_state = next(module.parameters(recurse=False), None) is not None or \
        next(module.buffers(recurse=False), None) is not None
    if own_state or isinstance(module, (nn.Dropout, models.Dropout)):
        raise UserError(f"packs of BatchNorm networks fuse Conv2d, BatchNorm2d and Linear layers only, not "
                        f"{type(module).__name__}")
    return None


def grouped_twin(net: nn.Module, k: int) -> nn.Module:
    """`net`'s K-fold fused copy on the meta device (see the module docstring)."""
    twin = copy.deepcopy(net).to("meta")
    for name, module in list(twin.named_modules()):
        if name and (fused := grouped_module(module, k)) is not None:
            parent, _, child = name.rpartition(".")
            setattr(twin.get_submodule(parent) if parent else twin, child, fused)
    return twin


class Grouped:
    """The fused forward pass of K stacked members: `(params, buffers, x) -> logits`, x (K, B, ...) and logits
    (K, B, classes), in training or evaluation mode as `train()` / `eval()` set; in training mode it updates
    the running statistics (and their counters) in the stacked buffers."""

    def __init__(self, net: nn.Module, members: int, channels_last: bool = False) -> None:
        self.channels_last = channels_last
        self.twin = grouped_twin(net, members)
        self.batched = {f"{name}.{p}" for name, m in self.twin.named_modules() if isinstance(m, GroupedLinear)
                        for p in ("weight", "bias")}
        self.kernels = {f"{name}.weight" for name, m in self.twin.named_modules() if isinstance(m, nn.Conv2d)}

    def layout(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The stacked parameters, same values; in channels-last, the convolution kernels (K, O, C, kh, kw) laid
        out so that the fused kernel `flatten(0, 1)` is a channels-last view (the stacked optimiser's updates and
        the gradients keep that layout), so that cuDNN gets NHWC kernels without a copy per step."""
        if not self.channels_last:
            return params
        return {n: t.detach().permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3).requires_grad_()
                if n in self.kernels else t for n, t in params.items()}

    def train(self, mode: bool = True) -> None:
        self.twin.train(mode)

    def eval(self) -> None:
        self.twin.eval()

    def fused_input(self, x: torch.Tensor) -> torch.Tensor:
        """(K, B, C, ...) -> (B, K x C, ...): channels-last for images when asked (one copy either way)."""
        if self.channels_last and x.dim() == 5:
            b, h, w = x.shape[1], *x.shape[3:]
            return x.permute(1, 3, 4, 0, 2).reshape(b, h, w, -1).permute(0, 3, 1, 2)
        return x.transpose(0, 1).flatten(1, 2)

    def __call__(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor,
                 masks: list[torch.Tensor]) -> torch.Tensor:
        """`masks` as in the vmapped form's signature: always empty, a fused network has no dropout."""
        k, b = x.shape[:2]
        state = {n: t if n in self.batched else t.flatten(0, 1)
                 for n, t in (*params.items(), *buffers.items()) if not n.endswith(COUNTER)}
        # Counters are left out (BatchNorm adds 1 to the twin's own, on the meta device) and counted here.
        out = functional_call(self.twin, state, (self.fused_input(x),), strict=False)
        if self.twin.training:
            with torch.no_grad():
                for n, t in buffers.items():
                    if n.endswith(COUNTER):
                        t.add_(1)
        return out.view(b, k, -1).transpose(0, 1)

    @torch.no_grad()
    @full_float32()
    def check(self, nets: list[nn.Module], params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
              x: torch.Tensor) -> None:
        """Before a pack trains: the fused pass (evaluation mode, inputs x of one member's shape) against each
        member's own network; a network whose forward code mixes members' channels is refused."""
        was_training = self.twin.training
        self.eval()
        fused = self(params, buffers, x.expand(len(nets), *x.shape), [])
        self.train(was_training)
        for k, net in enumerate(nets):
            training = net.training
            own = net.eval()(x)
            net.train(training)
            scale = own.abs().max().clamp_min(1e-6)
            if not (fused[k] - own).abs().max() <= CHECK_TOLERANCE * scale:
                raise UserError(f"{type(net).__name__} cannot pack: its forward pass does not keep the members' "
                                "channels apart (it concatenates or reshapes channels); run its trials with --pack off")
