"""The cost of the per-epoch diagnostics: a trial's `diagnostics_s` with the training-set sample of
`bench.exec.diagnostics.TRAIN_SAMPLE` (2,000) examples against the whole training set, in the same run.

    python benchmarks/diagnostics_cost.py --data-root DIR [--device cpu|cuda --epochs 1 --rounds 2]

Runs one Fashion-MNIST CE trial (case 3, r = 0.2, all 50,000 training images, `--epochs` warm-start and method
epochs) per arm and round, rounds interleaved; prints each run's wall time and the seconds its diagnostics took
(the rows' `wall_s` and `diagnostics_s`), and the best of each arm. Imports only torch and numpy (and bench's
training core): it runs on a bare GPU box.
"""

from __future__ import annotations

import argparse

from bench.exec import diagnostics
from bench.exec.trainer import run_trial
from bench.trial import TrialConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    config = TrialConfig("fashion_mnist", "ce", "case3", 0.2, seed=0, epochs=args.epochs, epochs_warmup=args.epochs,
                         device=args.device)
    arms = {f"sample of {diagnostics.TRAIN_SAMPLE:,}": diagnostics.TRAIN_SAMPLE, "whole training set": 10**12}
    best: dict[str, float] = {}
    for round_ in range(args.rounds):
        for name, size in arms.items():
            diagnostics.TRAIN_SAMPLE = size
            row = run_trial(config, args.data_root, log=lambda s: None)
            seconds = row["diagnostics_s"]
            best[name] = min(best.get(name, float("inf")), seconds)
            print(f"round {round_}, {name:>20}: wall {row['wall_s']:6.1f}s, diagnostics {seconds:5.1f}s "
                  f"({100 * seconds / row['wall_s']:.0f}% of the wall)", flush=True)
    (a, sampled), (b, whole) = best.items()
    print(f"best: {a} {sampled:.1f}s, {b} {whole:.1f}s: the sample costs {sampled / whole:.2f}x")


if __name__ == "__main__":
    main()
