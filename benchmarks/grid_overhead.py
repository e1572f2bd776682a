"""How long a tiny grid takes through `bench run` beyond its trials' own compute and Ray's start.

    python benchmarks/grid_overhead.py [--rounds 2]

Per round, interleaved: (a) Ray's own start and stop, alone (`ray.init(num_cpus=2)` then `ray.shutdown()` in a fresh
interpreter, the import of Ray included); (b) `bench run` of a 4-trial synthetic grid (CE and L_DMI at r = 0.2 and
0.4, seed 0, 1 + 1 epochs, the local MLflow mirror on, as a newcomer runs it) as a whole process into a fresh results
folder, each line of its output timed. Printed per round: the grid's wall, its trials' compute (the sum of the rows'
`wall_s`), Ray's start, the seconds from the start to the first line and to the first trial's row, and from the last
trial's line to the end (Ray's shutdown, the summary); and the ratio of the wall to 2 x compute + Ray's start (the
target: at most 1).
"""

from __future__ import annotations

import argparse
import os
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    scratch = Path(tempfile.mkdtemp(prefix="grid-overhead-"))
    (scratch / "grid.yaml").write_text(GRID)
    for i in range(args.rounds):
        ray_s, _ = timed_lines([sys.executable, "-c", RAY_ALONE], env, scratch)
        results = scratch / f"results-{i}"
        wall, lines = timed_lines([sys.executable, "-m", "bench.cli.main", "run", str(scratch / "grid.yaml"),
                                   "--results", str(results), "--num-cpus", "2", "--yes"], env, scratch)
        trials = [t for t, text in lines if text.startswith("[") and "] ok " in text]
        compute = compute_seconds(results)
        print(f"round {i + 1}: grid wall {wall:6.1f} s  trial compute {compute:6.1f} s  Ray start+stop {ray_s:5.1f} s  "
              f"first line {lines[0][0]:5.1f} s  first row {trials[0]:6.1f} s  after the last row "
              f"{wall - trials[-1]:5.1f} s  wall / (2 x compute + Ray) {wall / (2 * compute + ray_s):.2f}", flush=True)


if __name__ == "__main__":
    main()
