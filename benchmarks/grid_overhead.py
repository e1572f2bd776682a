"""How long a tiny grid takes through `bench run` beyond its trials' own compute and Ray's start.

    python benchmarks/grid_overhead.py [--rounds 2] [--baseline-python OTHER/.venv/bin/python]

Per round, interleaved: (a) Ray's own start and stop, alone (`ray.init(num_cpus=2)` then `ray.shutdown()` in a fresh
interpreter, the import of Ray and the interpreter's exit included); (b) `bench run` of a 4-trial synthetic grid (CE
and L_DMI at r = 0.2 and 0.4, seed 0, 1 + 1 epochs, the local MLflow mirror on, as a newcomer runs it) as a whole
process into a fresh results folder, each line of its output timed; with --baseline-python, (c) the same grid run by
another interpreter (another checkout's venv: the bench it imports is the one measured), the arms' order rotating
from round to round. Printed per round and arm: the grid's wall, its trials' compute (the sum of the rows' `wall_s`:
the trials' own start-up in their worker, torch's compiler import by the first optimiser included), Ray's start,
the seconds from the start to the first line and to the first trial's row, and from the last trial's line to the
end (Ray's shutdown, the summary, the exit); and the ratio of the wall to 2 x compute + Ray's start (the target: at
most 1). Then per arm the median of those ratios over the rounds, and with a baseline the median of the rounds'
ratios of the two arms' walls (the trials' compute moves with the load, and with it each arm's bound).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRID = """name: overhead
dataset: synthetic
noise: case3
r: [0.2, 0.4]
seeds: [0]
epochs: 1
epochs_warmup: 1
device: cpu
resources: {cpu: 1, gpu: 0}
methods:
  ce: {}
  dmi: {}
"""
RAY_ALONE = "import ray\nray.init(num_cpus=2, include_dashboard=False)\nray.shutdown()\n"


def timed_lines(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, list[tuple[float, str]]]:
    """(wall seconds, [(seconds since the start, line)]) of one whole process, stdout and stderr together."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [(time.perf_counter() - started, line.rstrip()) for line in proc.stdout]
    if proc.wait() != 0:
        sys.exit(f"grid_overhead: {' '.join(command[:4])}... failed:\n" + "\n".join(text for _, text in lines[-30:]))
    return time.perf_counter() - started, lines


def compute_seconds(results: Path) -> float:
    import pyarrow.parquet as pq

    return sum(pq.read_table(f).column("wall_s")[0].as_py() for f in (results / "trials").glob("*.parquet"))


def one_grid(python: str, env: dict[str, str], scratch: Path, results: Path) -> tuple[float, float, list[float]]:
    """(wall, trial compute, [first line, first row, the last row's time]) of one `bench run` of the grid."""
    wall, lines = timed_lines([python, "-m", "bench.cli.main", "run", str(scratch / "grid.yaml"),
                               "--results", str(results), "--num-cpus", "2", "--yes"], env, scratch)
    trials = [t for t, text in lines if text.startswith("[") and "] ok " in text]
    return wall, compute_seconds(results), [lines[0][0], trials[0], trials[-1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-python", default=None,
                        help="another interpreter whose bench runs the same grid as a second arm (a venv of another "
                             "checkout)")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    scratch = Path(tempfile.mkdtemp(prefix="grid-overhead-"))
    (scratch / "grid.yaml").write_text(GRID)
    arms = {"this": sys.executable} | ({"baseline": args.baseline_python} if args.baseline_python else {})
    ratios: dict[str, list[float]] = {name: [] for name in arms}
    walls: dict[str, list[float]] = {name: [] for name in arms}
    for i in range(args.rounds):
        order = list(arms)[i % len(arms):] + list(arms)[:i % len(arms)]
        ray_s, _ = timed_lines([sys.executable, "-c", RAY_ALONE], env, scratch)
        for name in order:
            wall, compute, (first, row, last) = one_grid(arms[name], env, scratch, scratch / f"results-{name}-{i}")
            ratios[name].append(wall / (2 * compute + ray_s))
            walls[name].append(wall)
            print(f"round {i + 1} {name:8s}: grid wall {wall:6.1f} s  trial compute {compute:6.1f} s  Ray start+stop "
                  f"{ray_s:5.1f} s  first line {first:5.1f} s  first row {row:6.1f} s  after the last row "
                  f"{wall - last:5.1f} s  wall / (2 x compute + Ray) {ratios[name][-1]:.2f}", flush=True)
    for name, values in ratios.items():
        print(f"{name}: wall / (2 x compute + Ray), median of {len(values)} rounds: {statistics.median(values):.2f}")
    if args.baseline_python:  # the two arms' walls round by round: steadier than either's ratio to its compute
        paired = [this / base for this, base in zip(walls["this"], walls["baseline"], strict=True)]
        print(f"this / baseline grid wall, median of {len(paired)} rounds: {statistics.median(paired):.2f}")


if __name__ == "__main__":
    main()
