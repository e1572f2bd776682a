"""Packed against solo: training throughput of K Fashion-MNIST CNN trials as one stacked model vs one by one.

    python benchmarks/pack_speedup.py --device cuda --data-root DIR [--members 1,8,64,256 --steps 40 --rounds 3]
                                      [--variants fp32,bf16,compile,bf16+compile]

For each K, both arms train the same K trials (Fashion-MNIST bags vs clothes, the paper's CNN, Adam, batch 128,
half CE and half L_DMI, each member its own noise seed and learning rate) for `--steps` steps, through the code a
grid runs: `bench.exec.packed.PackedStage` for the pack, `bench.exec.stage.SoloStage` for one trial after another. The
solo arm runs min(K, --solo-cap) trials and projects K from their mean time (labelled "projected"). Each arm is warmed
up (one untimed epoch) and timed over --rounds interleaved rounds; the best round counts. Every pack variant
(`--variants`: precision, torch.compile) is timed in the same rounds. Prints member-samples/s (K x steps x batch /
seconds) for each variant and the solo arm, their ratio, and each variant's peak GPU memory over its warm-up epoch.

Imports only torch and numpy (and bench's training core): it runs on a bare GPU box. `--synthetic` uses random
images of Fashion-MNIST's shape instead of the files.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from bench.data import Split, Splits, get_dataset
from bench.exec.packed import PackedStage, device_generator
from bench.exec.prepare import build_model, method_seed, prepare, seed_everything
from bench.exec.stage import SoloStage
from bench.methods import get_method
from bench.trial import TrialConfig

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


def packed_stage(ps: list, precision: str = "fp32", compile: str | None = None) -> PackedStage:
    nets, generators = [], []
    for p in ps:
        seed_everything(method_seed(p))
        nets.append(build_model(p))
        generators.append(device_generator(p.device, method_seed(p)))
    methods = [get_method(p.config.method)(2) for p in ps]
    return PackedStage(ps, nets, generators, ps[0].method_stage, [p.method_stage.lr for p in ps],
                       [method_seed(p) for p in ps], methods, precision=precision, compile=compile)


def solo_stage(p) -> SoloStage:
    seed_everything(method_seed(p))
    method = get_method(p.config.method)(2)
    return SoloStage(p, [build_model(p)], p.method_stage, method_seed(p), method.train_loss,
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
    parser.add_argument("--variants", default="fp32",
                        help="pack variants timed in the same interleaved rounds, comma-separated; each joins "
                             "with '+': fp32 or bf16 (the pack's forward pass under bf16 autocast), compile or "
                             "compile=MODE (torch.compile of the vmapped forward pass). Example: fp32,bf16+compile")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms (both arms)")
    parser.add_argument("--solo-cap", type=int, default=16, help="solo trials actually run per K (then projected)")
    args = parser.parse_args()
    if args.data_root is None and not args.synthetic:
        parser.error("give --data-root DIR (Fashion-MNIST files) or --synthetic")
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
    variants = [parse_variant(v) for v in args.variants.split(",")]
    data = make_data(args, args.steps * BATCH)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"device {args.device} ({name}), torch {torch.__version__}; {args.steps} steps of batch {BATCH} per arm, "
          f"best of {args.rounds} interleaved rounds (every variant and the solo arm in each round); "
          f"cudnn.benchmark {args.cudnn_benchmark}")
    print(f"{'K':>5} {'pack variant':>22} {'packed samples/s':>17} {'per member':>11} {'solo samples/s':>15} "
          f"{'speed-up':>9} {'solo run':>9} {'GPU memory':>11}")
    for k in [int(v) for v in args.members.split(",")]:
        ps = members(k, data, args)
        packs, memory = [], []
        for v in variants:
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            pack = packed_stage(ps, v["precision"], v["compile"])
            pack.train_epoch(0)  # warm-up: kernels chosen (compiled), caches filled
            packs.append(pack)
            memory.append(f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
                          if args.device.startswith("cuda") else "-")
        solo_n = min(k, args.solo_cap)
        solos = [solo_stage(p) for p in ps[:solo_n]]
        for s in solos:
            s.train_epoch(0)
        best_pack, best_solo = [np.inf] * len(packs), np.inf
        for r in range(args.rounds):
            for i, pack in enumerate(packs):
                best_pack[i] = min(best_pack[i], timed(pack.train_epoch, r + 1, args.device))
            best_solo = min(best_solo, timed(lambda epoch, solos=solos: [s.train_epoch(epoch) for s in solos],
                                             r + 1, args.device))
        solo_rate = solo_n * args.steps * BATCH / best_solo
        label = "measured" if solo_n == k else f"proj. {solo_n}"
        for v, best, mem in zip(variants, best_pack, memory, strict=True):
            packed_rate = k * args.steps * BATCH / best
            print(f"{k:>5} {v['name']:>22} {packed_rate:>17,.0f} {packed_rate / k:>11,.0f} {solo_rate:>15,.0f} "
                  f"{packed_rate / solo_rate:>8.1f}x {label:>9} {mem:>11}", flush=True)


def parse_variant(text: str) -> dict:
    variant = {"name": text, "precision": "fp32", "compile": None}
    for token in text.split("+"):
        if token in ("fp32", "bf16"):
            variant["precision"] = token
        elif token.split("=")[0] == "compile":
            variant["compile"] = token.partition("=")[2] or "default"
        else:
            raise SystemExit(f"pack_speedup.py: unknown variant part {token!r} in --variants (allowed: fp32, bf16, "
                             "compile, compile=MODE)")
    return variant


if __name__ == "__main__":
    main()
