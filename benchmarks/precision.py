"""bf16 against fp32 on one CIFAR-10 cell at a short schedule: the clean test accuracy (the CE warm start's and the
method's selected epoch) and the training images/s of both arms, in one run, through the code a grid runs
(`bench.exec.trainer.run_trial`, `precision` declared per trial as an experiment's `precision: bf16` declares it).

    python benchmarks/precision.py --device cuda --data-root DATA [--method dmi --noise pairs --r 0.4 --seeds 0,1,2
                                   --epochs-warmup 15 --epochs 10]
    python benchmarks/precision.py --device cpu --fake-data --tiny --train-subset 256 --epochs-warmup 1 --epochs 1
                                   (runs anywhere: random images, a shrunk ResNet; its figures say nothing)

Per seed the two arms train the same trial (same noisy labels, initial weights and data order) at fp32 (on CUDA
with TF32 matrix units, `bench.exec.prepare.resolve_device`) and at bf16 (forward passes under bf16 autocast, losses
from float32 logits), in alternating order from seed to seed, after one untimed short trial of each. images/s =
training images x epochs trained / the seconds of both stages (each epoch's noisy-validation pass included; the
per-epoch diagnostics are off: BENCH_EPOCH_EVAL=0). The schedule is the dataset's (SGD, batch 128) cut to
--epochs-warmup and --epochs. Imports only torch and numpy (and bench's core): it runs on a bare GPU box.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import torch

from bench.data import get_dataset
from bench.exec.prepare import resolve_device
from bench.exec.trainer import run_trial
from bench.trial import PRECISIONS, TrialConfig

TINY = {"width": 8, "blocks": (1, 1)}  # a ResNet of two stages of one block, width 8 (tests/exec/test_packed_bn.py's)


def fake_cifar(root: Path, train: int) -> None:
    """CIFAR-10's python batches of random images (its stand-in: `train` training images, train / 4 each for
    validation and test), checksums off."""
    get_dataset("cifar10").stand_in(root, train)
    os.environ["BENCH_VERIFY_CHECKSUMS"] = "0"


def shrink_resnet() -> None:
    """CIFAR-10's ResNet-34 replaced by `TINY` for a CPU check."""
    cifar10 = get_dataset("cifar10")
    load = cifar10.load

    def tiny_load(self):  # noqa: ANN001, ANN202 - the dataset's own method, wrapped
        splits = load(self)
        splits.model_args = dict(TINY)
        return splits

    cifar10.load = tiny_load


def arm(args: argparse.Namespace, seed: int, precision: str, untimed: bool = False) -> dict[str, float]:
    """One trial at `precision`; `untimed`: one short warm-start epoch only, to set the device up first."""
    epochs, epochs_warmup, subset = (0, 1, 256) if untimed else (args.epochs, args.epochs_warmup, args.train_subset)
    config = TrialConfig("cifar10", args.method, args.noise, args.r, seed=seed, epochs=epochs,
                         epochs_warmup=epochs_warmup, train_subset=subset, device=args.device,
                         experiment="precision", precision=precision)
    row = run_trial(config, args.data_root, log=(lambda s: print(f"  [{precision}] {s}", flush=True))
                    if args.verbose else (lambda s: None))
    train = args.train_subset or get_dataset("cifar10").split_sizes[0]
    seconds = row["warmup_s"] + row["method_s"]
    return dict(warmup_test_acc=row["warmup_test_acc"], test_acc=row["test_acc"], best_epoch=row["best_epoch"],
                val_loss=row["val_loss"], images_s=train * row["epochs_trained"] / seconds, wall_s=row["wall_s"])


def main(argv: list[str] | None = None) -> dict[str, list[dict[str, float]]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data-root", help="the folder holding cifar-10-batches-py/")
    parser.add_argument("--fake-data", action="store_true", help="random CIFAR-10 batch files, for a check only")
    parser.add_argument("--tiny", action="store_true", help="a shrunk ResNet, for a CPU check")
    parser.add_argument("--method", default="dmi")
    parser.add_argument("--noise", default="pairs")
    parser.add_argument("--r", type=float, default=0.4)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--epochs-warmup", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--train-subset", type=int, default=None)
    parser.add_argument("--verbose", action="store_true", help="the trials' own epoch lines")
    args = parser.parse_args(argv)
    if args.data_root is None and not args.fake_data:
        parser.error("give --data-root (CIFAR-10's python batches) or --fake-data")
    os.environ.setdefault("BENCH_EPOCH_EVAL", "0")
    device = resolve_device(args.device)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), torch "
          f"{torch.__version__}; cifar10 {args.method} {args.noise} r={args.r}, seeds {seeds}, "
          f"{args.epochs_warmup} + {args.epochs} epochs" + (f", first {args.train_subset} images" if args.train_subset
                                                             else "") + (", tiny ResNet" if args.tiny else ""))
    if args.tiny:
        shrink_resnet()
    results: dict[str, list[dict[str, float]]] = {p: [] for p in PRECISIONS}
    with tempfile.TemporaryDirectory() as tmp:
        if args.fake_data:
            args.data_root = tmp
            train = args.train_subset or 512
            fake_cifar(Path(tmp), train + -train % 4)  # over four batch files
        for precision in PRECISIONS:  # kernels chosen, memory allocated, before anything is timed
            arm(args, seeds[0], precision, untimed=True)
        print("seed | precision | warm-start test acc % | test acc % | selected epoch | val loss | images/s | wall s")
        for i, seed in enumerate(seeds):
            for precision in PRECISIONS if i % 2 == 0 else PRECISIONS[::-1]:
                r = arm(args, seed, precision)
                results[precision].append(r)
                print(f"{seed} | {precision} | {r['warmup_test_acc']:.2f} | {r['test_acc']:.2f} | {r['best_epoch']} | "
                      f"{r['val_loss']:.4f} | {r['images_s']:,.0f} | {r['wall_s']:.1f}", flush=True)
    fp32, bf16 = (results[p] for p in PRECISIONS)
    print("\nbf16 - fp32, mean over seeds (paired):")
    for key in ("warmup_test_acc", "test_acc"):
        diffs = [b[key] - a[key] for a, b in zip(fp32, bf16, strict=True)]
        spread = f" (sd {statistics.stdev(diffs):.2f})" if len(diffs) > 1 else ""
        print(f"  {key}: {statistics.mean(diffs):+.2f} points{spread}")
    speed = statistics.mean(b["images_s"] / a["images_s"] for a, b in zip(fp32, bf16, strict=True))
    print(f"  images/s: bf16 {speed:.2f}x fp32")
    return results


if __name__ == "__main__":
    main()
