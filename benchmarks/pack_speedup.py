"""Packed against solo: training throughput of K Fashion-MNIST CNN trials as one stacked model vs one by one.

    python benchmarks/pack_speedup.py --device cuda --data-root DIR [--members 1,8,64,256 --steps 40 --rounds 3]

For each K, both arms train the same K trials (Fashion-MNIST bags vs clothes, the paper's CNN, Adam, batch 128,
half CE and half L_DMI, each member its own noise seed and learning rate) for `--steps` steps, through the code a
grid runs: `bench.packed.PackedStage` for the pack, `bench.trainer.SoloStage` for one trial after another. The solo
arm runs min(K, --solo-cap) trials and projects K from their mean time (labelled "projected"). Each arm is warmed
up (one untimed epoch) and timed over --rounds interleaved rounds; the best round counts. Prints member-samples/s
(K x steps x batch / seconds) for both arms and their ratio, and the peak GPU memory of the round (the pack
dominates it; the solo arm's models are trained one at a time).

Imports only torch and numpy (and bench's training core): it runs on a bare GPU box. `--synthetic` uses random
images of Fashion-MNIST's shape instead of the files.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from bench.config import TrialConfig
from bench.data import Split, Splits, get_dataset
from bench.methods import get_method
from bench.packed import PackedStage, device_generator
from bench.trainer import SoloStage, build_model, method_seed, prepare, seed_everything

BATCH = 128


def make_data(args: argparse.Namespace, n_train: int) -> tuple:
    dataset = get_dataset("fashion_mnist")(args.data_root or ".")
    if args.synthetic:
        g = torch.Generator().manual_seed(0)

        def split(n: int) -> Split:
            return Split(torch.rand(n, 1, 28, 28, generator=g), (torch.rand(n, generator=g) < 0.9).long().numpy())

        splits = Splits(train=split(n_train), val=split(2048), test=split(2048))
    else:
        splits = dataset.load()
        splits.train = splits.train.subset(n_train)
    for s in (splits.train, splits.val, splits.test):
        s.x = s.x.to(args.device)
    return dataset, splits


def members(k: int, data: tuple, args: argparse.Namespace) -> list:
    """K trials: CE and L_DMI alternating, case 3 noise at r from 0 to 0.8, seeds 0.., lr 1e-4 or 3e-4."""
    ps = []
    for i in range(k):
        config = TrialConfig("fashion_mnist", ("ce", "dmi")[i % 2], "case3", round(0.1 * (i % 9), 1), seed=i,
                             lr=(1e-4, 3e-4)[(i // 2) % 2], epochs=1, epochs_warmup=1, device=args.device)
        ps.append(prepare(config, args.data_root or ".", data=data, log=lambda s: None))
    ps.sort(key=lambda p: p.config.method)  # equal methods side by side, as run_pack orders them
    return ps


def packed_stage(ps: list, precision: str = "fp32", im2col: bool = False) -> PackedStage:
    nets, generators = [], []
    for p in ps:
        seed_everything(method_seed(p.config.seed))
        nets.append(build_model(p))
        generators.append(device_generator(p.device, method_seed(p.config.seed)))
    methods = [get_method(p.config.method)(2) for p in ps]
    return PackedStage(ps, nets, generators, ps[0].method_stage, [p.method_stage.lr for p in ps],
                       [method_seed(p.config.seed) for p in ps], methods, precision=precision, im2col=im2col)


def solo_stage(p) -> SoloStage:
    seed_everything(method_seed(p.config.seed))
    method = get_method(p.config.method)(2)
    return SoloStage(p, [build_model(p)], p.method_stage, method_seed(p.config.seed), method.train_loss,
                     method.validation_loss, method)


def timed(fn, epoch: int, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(epoch)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--synthetic", action="store_true", help="random images instead of the Fashion-MNIST files")
    parser.add_argument("--members", default="1,8,64,256")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per arm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="the pack's forward pass")
    parser.add_argument("--im2col", action="store_true",
                        help="the pack's convolutions as im2col + one batched matrix product (default: vmap's "
                             "grouped convolutions)")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms (both arms)")
    parser.add_argument("--solo-cap", type=int, default=16, help="solo trials actually run per K (then projected)")
    args = parser.parse_args()
    if args.data_root is None and not args.synthetic:
        parser.error("give --data-root DIR (Fashion-MNIST files) or --synthetic")
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
    data = make_data(args, args.steps * BATCH)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"device {args.device} ({name}), torch {torch.__version__}; {args.steps} steps of batch {BATCH} per arm, "
          f"best of {args.rounds} interleaved rounds; pack {args.precision}, "
          f"{'im2col' if args.im2col else 'grouped'} convolutions, cudnn.benchmark {args.cudnn_benchmark}")
    print(f"{'K':>5} {'packed samples/s':>17} {'per member':>11} {'solo samples/s':>15} {'speed-up':>9} "
          f"{'solo run':>9} {'GPU memory':>11}")
    for k in [int(v) for v in args.members.split(",")]:
        ps = members(k, data, args)
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        pack = packed_stage(ps, args.precision, args.im2col)
        solo_n = min(k, args.solo_cap)
        solos = [solo_stage(p) for p in ps[:solo_n]]
        pack.train_epoch(0)  # warm-up: kernels chosen, caches filled
        for s in solos:
            s.train_epoch(0)
        best_pack, best_solo = np.inf, np.inf
        for r in range(args.rounds):
            best_pack = min(best_pack, timed(pack.train_epoch, r + 1, args.device))
            best_solo = min(best_solo, timed(lambda epoch, solos=solos: [s.train_epoch(epoch) for s in solos],
                                             r + 1, args.device))
        samples = k * args.steps * BATCH
        packed_rate = samples / best_pack
        solo_rate = solo_n * args.steps * BATCH / best_solo
        memory = f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if args.device.startswith("cuda") else "-"
        label = "measured" if solo_n == k else f"proj. {solo_n}"
        print(f"{k:>5} {packed_rate:>17,.0f} {packed_rate / k:>11,.0f} {solo_rate:>15,.0f} "
              f"{packed_rate / solo_rate:>8.1f}x {label:>9} {memory:>11}", flush=True)


if __name__ == "__main__":
    main()
