"""Channels-last against the default layout: training throughput of the paper's BatchNorm networks on one GPU.

    python benchmarks/channels_last.py [--device cuda] [--steps 30 --rounds 3 --batch 128]

For ResNet-34 (CIFAR-10, 32x32) and VGG-16-BN (Dogs vs Cats, 64x64), each arm trains the same network from the same
initial weights on the same random batches (SGD with momentum, cross-entropy), built by `bench.models.create` as a
trial builds it: the default arm with `BENCH_CHANNELS_LAST=0` (NCHW), the other in the channels-last layout `create`
picks on CUDA. Both in float32 (TF32 matrix products and convolutions, as trials run) and, for information, under
bf16 autocast. Rounds are interleaved; the best round of each arm counts. Prints images/s and the ratio.

Imports only torch and numpy (and bench's models): it runs on a bare GPU box.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from bench.models import create

NETWORKS = {"resnet34_cifar": ({}, 32, 10), "vgg16_bn": ({"image_size": 64}, 64, 2)}


def build(name: str, device: str, channels_last: bool) -> torch.nn.Module:
    kwargs, _, classes = NETWORKS[name]
    os.environ["BENCH_CHANNELS_LAST"] = "1" if channels_last else "0"
    torch.manual_seed(0)
    return create(name, classes, device, **kwargs)


def timed_steps(net, optimizer, x: torch.Tensor, y: torch.Tensor, steps: int, bf16: bool) -> float:
    torch.cuda.synchronize() if x.is_cuda else None
    t0 = time.perf_counter()
    for i in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16 and x.is_cuda):
            loss = F.cross_entropy(net(x[i]), y[i])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize() if x.is_cuda else None
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--networks", default=",".join(NETWORKS))
    args = parser.parse_args()
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"device {args.device} ({name}), torch {torch.__version__}; {args.steps} steps of batch {args.batch}, "
          f"best of {args.rounds} interleaved rounds")
    print(f"{'network':>15} {'precision':>9} {'NCHW images/s':>14} {'channels-last':>14} {'ratio':>7}")
    for network in args.networks.split(","):
        _, size, classes = NETWORKS[network]
        g = torch.Generator().manual_seed(0)
        x = torch.randn(args.steps, args.batch, 3, size, size, generator=g).to(args.device)
        y = torch.randint(0, classes, (args.steps, args.batch), generator=g).to(args.device)
        for bf16 in (False, True):
            arms = []
            for channels_last in (False, True):
                net = build(network, args.device, channels_last)
                optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
                timed_steps(net, optimizer, x, y, min(5, args.steps), bf16)  # warm-up: kernels chosen
                arms.append((net, optimizer))
            best = [np.inf, np.inf]
            for _ in range(args.rounds):
                for i, (net, optimizer) in enumerate(arms):
                    best[i] = min(best[i], timed_steps(net, optimizer, x, y, args.steps, bf16))
            rates = [args.steps * args.batch / b for b in best]
            print(f"{network:>15} {'bf16' if bf16 else 'fp32':>9} {rates[0]:>14,.0f} {rates[1]:>14,.0f} "
                  f"{rates[1] / rates[0]:>6.2f}x", flush=True)
    os.environ.pop("BENCH_CHANNELS_LAST", None)


if __name__ == "__main__":
    main()
