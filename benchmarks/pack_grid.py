"""A whole grid through packed trials, without Ray: the compute a GPU spends on an experiment file.

    python benchmarks/pack_grid.py tune_configs/fashion_mnist_figure.yaml --data-root DIR [--noise case1,case2]
                                   [--seeds 0,1] [--results DIR] [--summary FILE.csv] [--workers N]

Plans the grid's units with the runner's planner (`bench.grid.plan.plan_units`, `--pack auto` on CUDA), runs each
pack with `bench.exec.pack.run_pack` (the function a Ray trial of `bench run` calls) and each solo unit with
`bench.exec.trainer.run_trial`, and prints the wall time end to end (data loading, warm starts, method stages,
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

from bench.exec.pack import run_pack
from bench.exec.trainer import run_trial
from bench.grid.files import load_experiment
from bench.grid.plan import plan_units


def _solo(trial, data_root: str, results: str | None) -> dict:
    from bench.exec.warmstart import WarmStartCache

    cache = WarmStartCache(results, log=lambda s: None) if results else None
    return run_trial(trial, data_root, results=results, log=lambda s: None, warm_cache=cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--noise", default=None, help="only these noise patterns (comma-separated)")
    parser.add_argument("--seeds", default=None,
                        help="only these seeds (comma-separated): a slice of the grid, to time it and project")
    parser.add_argument("--where", default=None,
                        help="only trials whose fields have these values, e.g. method=dmi,batch_size=256")
    parser.add_argument("--skip-solo", action="store_true", help="run the packs only (time the packed part)")
    parser.add_argument("--pack", default="auto")
    parser.add_argument("--results", default=None, help="also write the result rows here (needs pyarrow)")
    parser.add_argument("--summary", default=None, help="write one CSV line per trial here")
    parser.add_argument("--workers", type=int, default=1,
                        help="solo trials run in this many processes at once, sharing the device (as Ray's "
                             "fractional GPUs would); packs run first, one at a time")
    args = parser.parse_args()
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    started = time.perf_counter()
    exp = load_experiment(args.config)
    trials = exp.trials()
    if args.noise:
        trials = [t for t in trials if t.noise in args.noise.split(",")]
    for key, _, value in (part.partition("=") for part in (args.where.split(",") if args.where else [])):
        trials = [t for t in trials if str(getattr(t, key)) == value]
    if args.seeds:
        trials = [t for t in trials if str(t.seed) in args.seeds.split(",")]
    units = plan_units(trials, args.pack if args.pack == "auto" else int(args.pack), args.data_root)
    sizes = sorted((len(u) for u in units), reverse=True)
    more = " ..." if len(sizes) > 8 else ""
    print(f"{exp.name}: {len(trials)} trials in {len(units)} units (sizes {sizes[:8]}{more})"
          f" on {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}", flush=True)
    # Packs first: they train their cells' warm starts, which the solo trials then find in the cache.
    packs, solos = [list(u.trials) for u in units if u.kind == "pack"], [u.trials[0] for u in units if u.kind == "solo"]
    cache = None
    if args.results:
        from bench.exec.warmstart import WarmStartCache

        cache = WarmStartCache(args.results, log=lambda s: None)
    rows = []
    for i, unit in enumerate(packs, 1):
        t0 = time.perf_counter()
        rows += run_pack(unit, args.data_root, results=args.results, warm_cache=cache,
                         log=lambda s: print("   ", s, flush=True) if "pack" in s else None)
        write_summary(args.summary, rows)
        print(f"pack {i}/{len(packs)}: {len(unit)} trials in {time.perf_counter() - t0:.1f}s "
              f"(elapsed {time.perf_counter() - started:.1f}s)", flush=True)
    if solos and args.skip_solo:
        print(f"{len(solos)} solo trials skipped (--skip-solo)")
    elif solos:
        import concurrent.futures
        import multiprocessing

        t0 = time.perf_counter()
        with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) \
                as pool:
            futures = [pool.submit(_solo, t, args.data_root, args.results) for t in solos]
            for n, future in enumerate(concurrent.futures.as_completed(futures), 1):
                row = future.result()
                rows.append(row)
                write_summary(args.summary, rows)
                print(f"solo {n}/{len(solos)}: {row['method']} {row['noise']} r={row['r']} {row['status']} "
                      f"test {row['test_acc']:.2f}% (elapsed {time.perf_counter() - started:.1f}s)", flush=True)
        print(f"{len(solos)} solo trials in {time.perf_counter() - t0:.1f}s on {args.workers} workers", flush=True)
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
    write_summary(args.summary, rows)


def write_summary(path: str | None, rows: list[dict]) -> None:
    """One CSV line per finished trial (rewritten as trials finish, so a cut-off run keeps what it did)."""
    if not path:
        return
    keys = ["trial_id", "noise", "r", "seed", "method", "status", "best_epoch", "val_loss", "test_acc",
            "last_test_acc", "warmup_test_acc", "noise_rate", "pack_size", "pack_wall_s", "warmup_s", "method_s",
            "diagnostics_s", "device_s", "estimated_transition", "transition"]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
