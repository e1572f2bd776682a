"""A whole grid through packed trials, without Ray: the compute a GPU spends on an experiment file.

    python benchmarks/pack_grid.py tune_configs/fashion_mnist_figure.yaml --data-root DIR [--noise case1,case2]
                                   [--results DIR] [--summary FILE.csv]

Plans the grid's units with the runner's planner (`bench.packed.plan_units`, `--pack auto` on CUDA), runs each
pack with `bench.packed.run_pack` (the function a Ray trial of `bench run` calls) and each solo unit with
`bench.trainer.run_trial`, and prints the wall time end to end (data loading, warm starts, method stages,
selection, test) and the clean test accuracy per (noise, r, method), mean and std over seeds. What it leaves out
of `bench run` is Ray's scheduling and MLflow logging. Imports only torch, numpy and pyyaml (for the experiment
file): it runs on a bare GPU box, where `bench run` (Ray, MLflow, polars) may not.
"""

from __future__ import annotations

import argparse
import csv
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from bench.experiment import load_experiment
from bench.packed import plan_units, run_pack
from bench.trainer import run_trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--noise", default=None, help="only these noise patterns (comma-separated)")
    parser.add_argument("--pack", default="auto")
    parser.add_argument("--results", default=None, help="also write the result rows here (needs pyarrow)")
    parser.add_argument("--summary", default=None, help="write one CSV line per trial here")
    args = parser.parse_args()
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    started = time.perf_counter()
    exp = load_experiment(args.config)
    trials = exp.trials()
    if args.noise:
        trials = [t for t in trials if t.noise in args.noise.split(",")]
    units = plan_units(trials, args.pack if args.pack == "auto" else int(args.pack))
    sizes = sorted((len(u) for u in units), reverse=True)
    more = " ..." if len(sizes) > 8 else ""
    print(f"{exp.name}: {len(trials)} trials in {len(units)} units (sizes {sizes[:8]}{more})"
          f" on {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}", flush=True)
    rows = []
    for i, unit in enumerate(units, 1):
        t0 = time.perf_counter()
        if len(unit) == 1 and unit[0].device == "cpu":
            rows.append(run_trial(unit[0], args.data_root, results=args.results, log=lambda s: None))
        else:
            rows += run_pack(unit, args.data_root, results=args.results,
                             log=lambda s: print("   ", s, flush=True) if "pack" in s else None)
        print(f"unit {i}/{len(units)}: {len(unit)} trials in {time.perf_counter() - t0:.1f}s "
              f"(elapsed {time.perf_counter() - started:.1f}s)", flush=True)
    wall = time.perf_counter() - started
    print(f"{len(rows)} trials, {sum(r['status'] == 'ok' for r in rows)} ok, end to end {wall:.1f}s "
          f"({wall / 60:.1f} min)")
    cells = defaultdict(list)
    for r in rows:
        cells[(r["noise"], r["r"], r["method"])].append(r["test_acc"])
    methods = sorted({m for _, _, m in cells})
    print("clean test accuracy (%) at the epoch selected on the noisy validation set, mean ± std over seeds")
    print(f"{'noise':>6} {'r':>4} " + " ".join(f"{m:>14}" for m in methods))
    for noise, r in sorted({(n, r) for n, r, _ in cells}):
        accs = [cells.get((noise, r, m), []) for m in methods]
        print(f"{noise:>6} {r:>4.1f} " + " ".join(f"{np.mean(a):>7.2f} ± {np.std(a):>4.2f}" if a else f"{'-':>14}"
                                               for a in accs))
    if args.summary:
        keys = ["trial_id", "noise", "r", "seed", "method", "status", "best_epoch", "val_loss", "test_acc",
                "last_test_acc", "warmup_test_acc", "noise_rate", "pack_size", "pack_wall_s"]
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        with open(args.summary, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
