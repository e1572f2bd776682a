"""Trainer throughput against a bare hand-written PyTorch loop: same model, batch size, data and device.

Prints samples/s of one training epoch for (a) bench's `train_epoch` with the CE step and with the L_DMI step,
and (b) a plain loop over the same float tensors (randperm, slice, forward, backward, step). Rounds are
interleaved and the best epoch of each arm is kept, so load from other processes affects both arms alike.

    python benchmarks/trainer_throughput.py [--data-root DIR] [--device cpu|cuda] [--rounds 3] [--subset N]

Uses the real Fashion-MNIST under --data-root (default $BENCH_DATA) when present, else random images of the
same shape.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from bench.config import UserError, default_data_root
from bench.data import Split, Splits
from bench.dmi import DMI
from bench.exec.prepare import SplitLoader, prepare
from bench.exec.stage import make_optimizer, train_epoch
from bench.methods import Batch
from bench.models import create
from bench.trial import TrialConfig


def fashion_splits(data_root: str, subset: int) -> tuple[object, Splits]:
    config = TrialConfig(dataset="fashion_mnist", method="ce", noise="case1", r=0.2, seed=0, train_subset=subset)
    try:
        p = prepare(config, data_root)
        return p.dataset, p.splits
    except UserError:
        from bench.datasets.fashion_mnist import FashionMNIST

        rng = np.random.default_rng(0)
        x = torch.from_numpy(rng.random((subset, 1, 28, 28), dtype=np.float32))
        y = (rng.random(subset) > 0.1).astype(np.int64)
        print("(real Fashion-MNIST not found: random images of the same shape)")
        return FashionMNIST(data_root), Splits(Split(x, y), Split(x[:10], y[:10]), Split(x[:10], y[:10]))


def bare_epoch(model, optimizer, x: torch.Tensor, y: torch.Tensor, batch_size: int, gen: torch.Generator) -> None:
    model.train()
    n = x.shape[0]
    perm = torch.randperm(n, generator=gen).to(x.device)
    for start in range(0, n - n % batch_size, batch_size):
        idx = perm[start : start + batch_size]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", default=str(default_data_root()))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--subset", type=int, default=20_000, help="training examples per epoch")
    ap.add_argument("--batch-size", type=int, default=128)
    args = ap.parse_args()

    device = torch.device(args.device)
    dataset, splits = fashion_splits(args.data_root, args.subset)
    train = splits.train.subset(min(args.subset, len(splits.train)))
    loader = SplitLoader(train, train.y, dataset, device)
    n = loader.size - loader.size % args.batch_size
    x_float = train.x.clone().to(device)
    y = torch.as_tensor(train.y, device=device)
    schedule = dataset.method_stage.with_overrides(batch_size=args.batch_size)
    dmi = DMI(2)

    def ce_step(nets, batch: Batch):
        return F.cross_entropy(nets[0](batch.x), batch.y)

    def fresh():
        torch.manual_seed(0)
        model = create("fashion_cnn", 2).to(device)
        return model, make_optimizer(list(model.parameters()), schedule)

    arms = {
        "bare loop (CE)": lambda m, o, g: bare_epoch(m, o, x_float, y, args.batch_size, g),
        "bench train_epoch (CE)": lambda m, o, g: train_epoch([m], ce_step, o, loader, args.batch_size, 0, g),
        "bench train_epoch (L_DMI)": lambda m, o, g: train_epoch([m], dmi.train_loss, o, loader, args.batch_size, 0, g),
    }
    best = {name: float("inf") for name in arms}
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{n} samples/epoch, batch {args.batch_size}")
    for round_ in range(args.rounds):
        for name, run in arms.items():
            model, optimizer = fresh()
            gen = torch.Generator().manual_seed(round_)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(model, optimizer, gen)
            if device.type == "cuda":
                torch.cuda.synchronize()
            best[name] = min(best[name], time.perf_counter() - t0)
        print(f"round {round_ + 1}/{args.rounds} done")
    base = n / best["bare loop (CE)"]
    print(f"\n{'arm':28s} {'samples/s':>10s} {'vs bare':>8s}")
    for name, seconds in best.items():
        rate = n / seconds
        print(f"{name:28s} {rate:10.0f} {rate / base:8.3f}x")


if __name__ == "__main__":
    main()
