"""The frozen-feature baseline's cache: the wall time of a first linear-probe trial (the backbone's features
computed and cached) against a second one (another method, the features read back), in one run, through the code a
grid runs (`bench.exec.trainer.run_trial`, `model: linear_probe`).

    python benchmarks/linear_probe_cache.py [--train 4000 --backbone resnet18 --rounds 3
                                             --epochs-warmup 1 --epochs 1 --device cpu]

Synthetic images: CIFAR-10's python batches of random pixels (its stand-in, `Dataset.stand_in`: validation and test a
quarter of --train each), with
the paper's pairs noise at r = 0.2; the backbone has random weights (`weights: random`): the figures are about the
cache, not accuracy. Each round uses a fresh cache folder: a CE trial (cold: every split through the backbone), then
an L_DMI trial (warm: the cached features); the arms cannot swap order (the warm one needs the cold one's cache).
After one untimed round, the best of the rounds is reported for each arm, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench.data import get_dataset
from bench.trial import TrialConfig


def trial_seconds(config: TrialConfig, root: Path, results: Path) -> float:
    from bench.exec.trainer import run_trial

    start = time.perf_counter()
    row = run_trial(config, root, results=results, log=lambda line: None)
    assert row["status"] == "ok", row["error"]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=int, default=4000, help="training images (CIFAR-10 batches 1-4)")
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs-warmup", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    os.environ["BENCH_VERIFY_CHECKSUMS"] = "0"  # random files: no published checksums
    os.environ.setdefault("BENCH_EPOCH_EVAL", "0")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        get_dataset("cifar10").stand_in(root, args.train)
        probe = dict(model="linear_probe", model_args=(("backbone", args.backbone), ("weights", "random")))
        common = dict(dataset="cifar10", noise="pairs", r=0.2, epochs=args.epochs, epochs_warmup=args.epochs_warmup,
                      device=args.device, **probe)
        cold_trial, warm_trial = TrialConfig(method="ce", **common), TrialConfig(method="dmi", **common)
        cold, warm = [], []
        for rnd in range(args.rounds + 1):  # round 0: untimed (imports, first allocations)
            os.environ["BENCH_CACHE"] = str(root / f"cache-{rnd}")
            first = trial_seconds(cold_trial, root, root / f"results-{rnd}-cold")
            second = trial_seconds(warm_trial, root, root / f"results-{rnd}-warm")
            if rnd:
                cold.append(first)
                warm.append(second)
                print(f"round {rnd}: first trial {first:.2f} s, second trial {second:.2f} s", flush=True)
    n = args.train + 2 * (-(-args.train // 4))
    print(f"{args.backbone} (random weights) on {n:,} synthetic 32x32 images, {args.epochs_warmup}+{args.epochs} "
          f"epochs, device {args.device}, torch threads {__import__('torch').get_num_threads()}")
    print(f"first trial (features computed and cached): best {min(cold):.2f} s of {args.rounds}")
    print(f"second trial (features read back):          best {min(warm):.2f} s of {args.rounds}")
    print(f"second / first: {min(warm) / min(cold):.3f}")


if __name__ == "__main__":
    main()
