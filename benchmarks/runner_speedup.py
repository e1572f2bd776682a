"""Wall time of N short trials through the Ray runner against the same trials in a plain sequential loop.

    python benchmarks/runner_speedup.py [--trials 10] [--epochs 300] [--cpus 2] [--dataset synthetic]

Both arms run the same trials with one torch thread per trial (the sequential loop sets torch.set_num_threads(1);
the runner gives each trial 1 CPU and sets its torch threads to that), so the comparison measures running trials
side by side, not intra-op threading. The sequential loop also runs once with torch's default threads (all cores
for one trial: what a plain script does), and the speedup over that is printed too. Every trial has its own seed,
hence its own warm-start cell: no arm gets cache hits, and each arm writes into its own fresh results folder.
The Ray arm's wall time includes starting and stopping Ray; the time from the first trial's launch is printed as
well. No MLflow logging in any arm. All arms run at the same CPU priority (Ray's workers default to nice 15; here
they run at nice 0).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from bench.exec.trainer import run_trial
from bench.exec.warmstart import WarmStartCache
from bench.grid.experiment import parse_experiment
from bench.grid.runner import Settings, run_experiment
from bench.store.folder import read_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=300, help="method-stage epochs per trial")
    parser.add_argument("--epochs-warmup", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray (trials run side by side)")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--train-subset", type=int, default=None)
    parser.add_argument("--data-root", default=str(Path.home() / ".cache" / "bench" / "data"))
    args = parser.parse_args()
    # Ray starts its workers at nice 15 (below everything else on the machine) while the sequential loop runs at
    # nice 0: on a machine that other work shares, that alone skews the comparison. Same priority for both arms.
    os.environ.setdefault("RAY_worker_niceness", "0")

    exp = parse_experiment(dict(
        name="speedup", dataset=args.dataset, noise="case3", r=0.4, seeds=args.trials, epochs=args.epochs,
        epochs_warmup=args.epochs_warmup, train_subset=args.train_subset, resources={"cpu": 1},
        methods={"dmi": {}},
    ), source="benchmarks/runner_speedup.py")
    trials = exp.trials()
    print(f"{len(trials)} trials: {args.dataset} dmi case3 r=0.4, {args.epochs_warmup} warm-start + {args.epochs} "
          f"method epochs each, one seed each; 1 torch thread per trial in both arms", flush=True)

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-seq-") as seq_dir, \
            tempfile.TemporaryDirectory(prefix="bench-ray-") as ray_dir:
        def sequential_loop(threads: int, folder: str) -> float:
            torch.set_num_threads(threads)
            started = time.perf_counter()
            for trial in trials:
                run_trial(trial, args.data_root, results=folder, log=lambda line: None,
                          warm_cache=WarmStartCache(folder))
            seconds = time.perf_counter() - started
            print(f"sequential loop, {threads} torch thread(s): {seconds:6.1f} s  ({seconds / len(trials):.1f} s per "
                  "trial)", flush=True)
            return seconds

        default_threads = torch.get_num_threads()
        with tempfile.TemporaryDirectory(prefix="bench-seq-threads-") as threads_dir:
            sequential_threaded = sequential_loop(default_threads, threads_dir)
        sequential = sequential_loop(1, seq_dir)

        lines: list[str] = []
        started = time.perf_counter()
        tally = run_experiment(exp, Settings(results=ray_dir, data_root=Path(args.data_root), mlflow=False,
                                             num_cpus=args.cpus), lines.append)
        through_ray = time.perf_counter() - started
        grid_only = time.monotonic() - tally.started
        assert tally.done == len(trials) and set(tally.statuses) == {"ok"}, lines
        per_trial = {arm: read_table(folder)["wall_s"].mean() for arm, folder in (("seq", seq_dir), ("ray", ray_dir))}

    print(f"Ray runner:      {through_ray:6.1f} s  (of which {grid_only:.1f} s from the first trial's launch; "
          f"the rest is Ray start-up and shutdown)")
    print(f"speedup: {sequential / through_ray:.2f}x end to end, {sequential / grid_only:.2f}x from launch "
          f"({args.cpus} CPUs, 1 CPU and 1 torch thread per trial)")
    print(f"against the sequential loop with {default_threads} torch threads: "
          f"{sequential_threaded / through_ray:.2f}x end to end, {sequential_threaded / grid_only:.2f}x from launch")
    # If other work holds the cores, trials under Ray slow down instead of overlapping: show it.
    print(f"mean wall of one trial: {per_trial['seq']:.1f} s alone, {per_trial['ray']:.1f} s side by side; "
          f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after (on an idle machine both arms "
          f"add little to {args.cpus}: the speedup needs {args.cpus} free cores)")
    # Where vCPUs share a physical core (SMT siblings, or a host that throttles), a trial slows down when another
    # runs beside it; no runner can beat this bound, so it is printed next to the speed-up.
    slowdown = per_trial["ray"] / per_trial["seq"]
    ceiling = args.cpus / slowdown
    print(f"ceiling on this machine: {args.cpus} trials side by side each take {slowdown:.2f}x as long as alone, "
          f"so running them at once can give at most {ceiling:.2f}x; the runner reaches "
          f"{sequential / grid_only / ceiling:.0%} of that from launch")


if __name__ == "__main__":
    main()
