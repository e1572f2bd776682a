"""How to stack K BatchNorm networks: torch.func (vmap of functional_call over stacked parameters and buffers) or
HFTA's fused layout (`bench.exec.grouped.Grouped`: grouped convolutions, BatchNorm over K x C channels). Both are the
same function of the same stacked state (their logits are compared here); this times a training step of each.

    python benchmarks/bn_pack_layout.py [--device cpu] [--members 2,4,8] [--width 16] [--batch 32] [--steps 3]

The network is `bench.models.ResNet34CIFAR` (CIFAR stem, basic blocks), shrunk by `--blocks` and `--width` so that
a CPU times it in seconds. Prints images/s of each layout (best of --rounds interleaved rounds) and their ratio.
Imports only torch and numpy (and bench's core).
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable

import torch
from torch.func import functional_call, stack_module_state, vmap

from bench.exec.grouped import Grouped
from bench.models import ResNet34CIFAR

Forward = Callable[[dict, dict], torch.Tensor]


def layouts(nets: list[torch.nn.Module], x: torch.Tensor) -> dict[str, tuple[Forward, dict, dict]]:
    """Each layout's training forward pass over its own copy of the members' stacked state."""
    base = copy.deepcopy(nets[0]).to("meta")
    vmapped = vmap(lambda p, b, inputs: functional_call(base, (p, b), (inputs,)))
    grouped = Grouped(nets[0], len(nets))
    return {
        "vmap": (lambda p, b: vmapped(p, b, x), *stack_module_state(nets)),
        "hfta": (lambda p, b: grouped(p, b, x, []), *stack_module_state(nets)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--members", default="2,4,8")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--blocks", default="1,1,1,1")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    blocks = tuple(int(b) for b in args.blocks.split(","))
    print(f"ResNet-34 (CIFAR) blocks {blocks}, width {args.width}, batch {args.batch} a member, {device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("K | vmap images/s | HFTA images/s | HFTA / vmap | max |logit difference|")
    for k in (int(m) for m in args.members.split(",")):
        torch.manual_seed(0)
        nets = [ResNet34CIFAR(10, blocks, args.width).to(device) for _ in range(k)]
        x = torch.randn(k, args.batch, 3, 32, 32, device=device)
        arms = layouts(nets, x)
        gap = (arms["vmap"][0](*arms["vmap"][1:]) - arms["hfta"][0](*arms["hfta"][1:])).abs().max().item()
        best = dict.fromkeys(arms, float("inf"))
        for _ in range(args.rounds):
            for layout, (forward, params, buffers) in arms.items():
                start = time.perf_counter()
                for _ in range(args.steps):
                    forward(params, buffers).square().mean().backward()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                best[layout] = min(best[layout], time.perf_counter() - start)
        rate = {layout: k * args.batch * args.steps / s for layout, s in best.items()}
        print(f"{k} | {rate['vmap']:,.0f} | {rate['hfta']:,.0f} | {rate['hfta'] / rate['vmap']:.2f}x | {gap:.1e}")


if __name__ == "__main__":
    main()
