"""What a grid's driver costs per trial: bench (MLflow on, off) against plain Ray Tune, on grids of tiny trials
(issue #56, item 5: the trial arms).

    python benchmarks/scale_grid.py [--trials 8 128 1024] [--rounds 2] [--baseline-python OTHER/.venv/bin/python]

Per grid size N and round, three arms, interleaved (their order rotating from round to round), each a whole process
into a fresh folder: `bench run` of an N-trial grid of tiny synthetic trials (CE at r = 0.2, seeds 0..N-1, 1 + 1 epochs
on 200 examples) with the local MLflow mirror on; the same with `--no-mlflow`; and plain Ray Tune: `tune.Tuner` over
the same N trial configurations, each running the same trial function (`bench.exec.trainer.run_trial`, its row
written), with the same resources (1 CPU a trial, a local Ray of 2 CPUs, actors reused) and Ray Tune's defaults
otherwise. With --baseline-python, a fourth arm: `bench run` (MLflow on) by another interpreter (another checkout's
venv, PYTHONPATH dropped: the bench it imports is the one measured). Printed per arm: the grid's wall (the process's,
start-up and shutdown included), the driver process's own CPU seconds (its threads, `getrusage(RUSAGE_SELF)` as it
exits: not Ray's processes, where the trials' work is the same in every arm) and those per trial, and, with MLflow on,
the CPU seconds of MLflow's writer process (`bench.store.mirror_writer`), which runs beside the driver: its own
`getrusage(RUSAGE_SELF)` as it exits, written to a file by a `sitecustomize` module this script puts on the arm's
PYTHONPATH (the driver's children's CPU taken around the wait that reaps the writer, as before 2026-12-08, counted
other children of the driver's too: 4.2 s where the writer took 3.4); then per N the best (least) of the rounds and
the ratios to plain Ray Tune's. Each arm runs in the scratch folder: until 2026-12-08 the baseline's writer process,
started from the checkout's folder, imported that checkout's bench, not the baseline's.
The issue's targets: driver CPU a trial with MLflow on at most 2x plain's, grid wall at most 1.15x plain's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARMS = ("bench", "bench --no-mlflow", "plain Ray Tune")
BASELINE = "baseline bench"


def grid_file(scratch: Path, trials: int) -> Path:
    path = scratch / f"tiny{trials}.yaml"
    path.write_text(f"name: tiny{trials}\ndataset: synthetic\nnoise: case3\nr: [0.2]\nseeds: {trials}\nepochs: 1\n"
                    "epochs_warmup: 1\ntrain_subset: 200\ndevice: cpu\nresources: {cpu: 1, gpu: 0}\n"
                    "methods:\n  ce: {}\n")
    return path


def driver_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# Imported by every Python process of an arm (PYTHONPATH): the MLflow writer process appends its own CPU seconds, as
# it exits, to the file $SCALE_GRID_WRITER_CPU.
SITECUSTOMIZE = """import atexit, os, resource, sys
def _writer_cpu():  # sys.argv names the module only once it runs (python -m)
    if any("mirror_writer" in a for a in sys.argv) and os.environ.get("SCALE_GRID_WRITER_CPU"):
        u = resource.getrusage(resource.RUSAGE_SELF)
        with open(os.environ["SCALE_GRID_WRITER_CPU"], "a") as f:
            f.write(f"{u.ru_utime + u.ru_stime}\\n")
atexit.register(_writer_cpu)
"""


def child_bench(config: str, results: str, mlflow: bool) -> None:
    from bench.cli.main import main

    code = main(["run", config, "--results", results, "--num-cpus", "2", "--yes"] + ([] if mlflow else
                                                                                     ["--no-mlflow"]))
    if code != 0:
        sys.exit(f"scale_grid: bench run exited {code}")


def plain_trial(config: dict, trials: list, data_root: str, results: str) -> None:
    from ray import tune

    from bench.exec.trainer import run_trial

    row = run_trial(trials[config["i"]], data_root, results=results, log=lambda line: None)
    tune.report({"test_acc": row["test_acc"]})


def child_plain(config: str, results: str) -> None:
    import ray
    from ray import tune

    from bench.grid.files import load_experiment
    from bench.grid.plan import Plan

    trials = Plan.make(load_experiment(config), results).trials
    ray.init(num_cpus=2, include_dashboard=False)
    trainable = tune.with_resources(tune.with_parameters(plain_trial, trials=trials, data_root=results,
                                                         results=results), {"cpu": 1})
    tuner = tune.Tuner(trainable, param_space={"i": tune.grid_search(list(range(len(trials))))},
                       tune_config=tune.TuneConfig(reuse_actors=True),
                       run_config=tune.RunConfig(storage_path=str(Path(results) / "ray"), verbose=0))
    grid = tuner.fit()
    if grid.num_errors:
        sys.exit(f"scale_grid: {grid.num_errors} plain Ray Tune trials failed")
    ray.shutdown()


def one_arm(arm: str, config: Path, results: Path, baseline: str | None) -> tuple[float, float, float]:
    """(wall, driver CPU seconds, MLflow writer process CPU seconds) of one arm's whole process."""
    hook, writer_cpu = results.parent / "sitecustomize", results.parent / f"{results.name}.writer-cpu"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore",
           "SCALE_GRID_WRITER_CPU": str(writer_cpu)}
    python = sys.executable
    if arm == BASELINE:
        python, arm = baseline, "bench"
        env.pop("PYTHONPATH", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    # From the scratch folder: `python -m bench.store.mirror_writer` imports the bench of its working directory
    # first, so a baseline run from a checkout had its writer process run the checkout's code.
    proc = subprocess.run([python, str(Path(__file__).resolve()), "--child", arm, str(config), str(results)], env=env,
                          capture_output=True, text=True, cwd=results.parent)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"scale_grid: arm {arm!r} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    writer = sum(map(float, writer_cpu.read_text().split())) if writer_cpu.is_file() else 0.0
    return wall, measured["cpu"], writer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[8, 128])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-python", default=None,
                        help="another interpreter whose bench runs the grid (MLflow on) as a fourth arm")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        arm, config, results = args.child
        if arm == "plain Ray Tune":
            child_plain(config, results)
        else:
            child_bench(config, results, mlflow=arm == "bench")
        print(json.dumps({"cpu": driver_cpu()}), flush=True)
        return
    arms = ARMS + ((BASELINE,) if args.baseline_python else ())
    scratch = Path(tempfile.mkdtemp(prefix="scale-grid-"))
    print(f"scale_grid: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; arms: "
          f"{', '.join(arms)}", flush=True)
    for n in args.trials:
        config = grid_file(scratch, n)
        best: dict[str, tuple[float, float, float]] = {}
        for round_ in range(args.rounds):
            order = arms[round_ % len(arms):] + arms[:round_ % len(arms)]
            for arm in order:
                wall, cpu, writer = one_arm(arm, config, scratch / f"r{n}-{round_}-{arms.index(arm)}",
                                            args.baseline_python)
                print(f"N={n:5d} round {round_ + 1} {arm:18s} wall {wall:7.1f} s  driver CPU {cpu:7.2f} s  "
                      f"{1000 * cpu / n:7.1f} ms a trial  writer CPU {writer:6.2f} s  (load {os.getloadavg()[0]:.1f})",
                      flush=True)
                walls, cpus, writers = best.get(arm, (wall, cpu, writer))
                best[arm] = (min(walls, wall), min(cpus, cpu), min(writers, writer))
        plain_wall, plain_cpu, _ = best["plain Ray Tune"]
        for arm in arms:
            wall, cpu, writer = best[arm]
            print(f"N={n:5d} best of {args.rounds}: {arm:18s} wall {wall:7.1f} s ({wall / plain_wall:.2f}x plain)  "
                  f"driver CPU {1000 * cpu / n:7.1f} ms a trial ({cpu / plain_cpu:.2f}x plain)  writer CPU "
                  f"{1000 * writer / n:6.1f} ms a trial", flush=True)


if __name__ == "__main__":
    main()
