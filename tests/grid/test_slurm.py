"""A Slurm launch (issue 46, item 5): cluster/bench.sbatch submitted to a real single-machine Slurm
(benchmarks/slurm_local.sh: munged, slurmctld and slurmd for this host, from Debian's slurm-wlm and munge packages)
runs a grid with `bench run --address` against the Ray it starts inside the job; `scancel` of the running job stops
the grid and Ray (nothing of the job is left behind), and the same job submitted again finishes the grid with every
trial exactly one row and one MLflow run.

Like tests/grid/test_multinode.py, the module runs in a network namespace of its own holding only loopback
(tests/netns.py): the job's Ray then has no address but 127.0.0.1 (bench.sbatch falls back to it where `hostname -I`
prints nothing), and slurmctld, slurmd and munged listen only there.

Skipped, with the reason, where Slurm is not installed or the tests do not run as root (slurmd needs it); `.ci/run`
installs the packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns
from tests.grid.test_multinode import (
    BIN,
    GRID,
    N_TRIALS,
    clean_env,
    cmdline,
    grid_config,
    mlflow_trial_runs,
    rows,
    summary_figure,
    wait_for,
    write_fashion,
)

REPO = Path(__file__).resolve().parents[2]
SCRIPT, RECIPE = REPO / "benchmarks" / "slurm_local.sh", REPO / "cluster" / "bench.sbatch"
MISSING = [tool for tool in ("munged", "mungekey", "slurmctld", "slurmd", "sbatch") if shutil.which(tool) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"Slurm is not installed ({', '.join(MISSING)} not found): apt-get "
                       "install -y slurm-wlm munge (.ci/run does)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a local Slurm needs root (slurmd runs jobs as their users)"),
]
test_in_its_own_network_namespace = netns.module_in_own_namespace(__file__)


def processes_naming(text: str) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and text in cmdline(int(p.name))
            and int(p.name) != os.getpid()]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A local Slurm; the environment that submits to it. Stopped afterwards: none of its daemons left."""
    folder = tmp_path_factory.mktemp("slurm")
    started = subprocess.run([str(SCRIPT), "start", str(folder)], capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield clean_env(SLURM_CONF=str(folder / "slurm.conf"), BENCH_BIN=str(BIN))
    finally:
        subprocess.run([str(SCRIPT), "stop", str(folder)], capture_output=True, timeout=180)
        wait_for(lambda: not processes_naming(str(folder)), 60, "the local Slurm's daemons stopped")


def sbatch(env: dict[str, str], folder: Path, results: Path, data: Path) -> str:
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--cpus-per-task", "2", "--output", str(folder / "job-%j.out"), str(RECIPE),
         str(grid_config(folder)), str(results), "--data-root", str(data), "--executor", "solo"],
        capture_output=True, text=True, timeout=60, env=env)
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0]


def queued(env: dict[str, str], job: str) -> bool:
    listed = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, timeout=60, env=env)
    return bool(listed.stdout.strip())


def test_sbatch_runs_a_grid_and_a_cancelled_job_resumes_when_submitted_again(slurm: dict[str, str],
                                                                             tmp_path: Path) -> None:
    data, results = write_fashion(tmp_path / "data"), tmp_path / "r"
    assert len(GRID["methods"]) * len(GRID["r"]) * len(GRID["seeds"]) == N_TRIALS
    first = sbatch(slurm, tmp_path, results, data)
    wait_for(lambda: rows(results) or not queued(slurm, first), 900, "a row landed")
    assert queued(slurm, first), (tmp_path / f"job-{first}.out").read_text()[-3000:]
    subprocess.run(["scancel", first], check=True, timeout=60, env=slurm)
    wait_for(lambda: not queued(slurm, first), 180, "the cancelled job left the queue")
    # Nothing of the job stays: its Ray (its temp folder names the job) and its driver (which names the results).
    wait_for(lambda: not processes_naming(f"/tmp/ray-{first}") and not processes_naming(str(results)), 120,
             "the cancelled job's processes ended")
    done = len(rows(results))
    cut = (tmp_path / f"job-{first}.out").read_text()
    assert 0 < done < N_TRIALS, cut[-3000:]
    assert "SIGTERM: stopping the grid" in cut, cut[-3000:]

    again = sbatch(slurm, tmp_path, results, data)
    wait_for(lambda: not queued(slurm, again), 900, "the resubmitted job ended")
    out = (tmp_path / f"job-{again}.out").read_text()
    assert f"of {N_TRIALS} trials ({done} already done)" in out, out[-3000:]
    assert summary_figure(out, rf"(\d+) of {N_TRIALS - done} trials finished") == N_TRIALS - done
    landed = rows(results)
    assert len(landed) == N_TRIALS and {r["status"] for r in landed} == {"ok"}, out[-3000:]
    assert mlflow_trial_runs(f"sqlite:///{results}/mlflow.db") == Counter({r["trial_id"]: 1 for r in landed})
    wait_for(lambda: not processes_naming(f"/tmp/ray-{again}"), 120, "the finished job's Ray stopped")
