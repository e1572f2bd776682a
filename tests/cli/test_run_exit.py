"""`bench run` as a command ends without the interpreter's teardown (`bench.cli.main.leave`, issue #47: seconds after
a grid's last line on a 2-core machine), and only once everything is written: every row, every MLflow run with its
artifacts, the whole summary, the folder's lock released, Ray's processes gone, and the exit hooks run. A probe
module (a `sitecustomize` on PYTHONPATH, in the driver only) records whether the exit hooks ran and whether the
teardown did; with a plain `sys.exit` both happen, so the test fails on the code before the change. And the grid's
units ran in plain Ray workers, with no runtime environment of their own (`bench.grid.runner.plain_trial_workers`):
that fails on the code before it too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

GRID = """name: exits
dataset: synthetic
noise: case3
r: [0.3]
seeds: [0, 1]
epochs: 1
epochs_warmup: 1
train_subset: 500
device: cpu
resources: {cpu: 1, gpu: 0}
methods:
  ce: {}
"""

# In the driver (the process started for `bench run`), an exit hook and an object torn down with the interpreter
# each leave a file; Ray's workers run it too, and leave nothing.
PROBE = """import atexit, os
if "bench.cli.main" in open("/proc/self/cmdline").read():
    marks = os.environ["EXIT_PROBE"]
    atexit.register(lambda: open(os.path.join(marks, "exit-hooks-ran"), "w").close())

    class TornDown:  # what it needs is its own: the teardown clears the modules' names first
        def __init__(self):
            self.open, self.path = open, os.path.join(marks, "teardown-ran")

        def __del__(self):
            self.open(self.path, "w").close()

    probe = TornDown()
"""


def ray_processes_of(driver: int) -> list[str]:
    """Command lines of the processes of the Ray session a driver started (Ray names it after the driver's pid)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"_{driver}/" in cmdline and "session_" in cmdline:
            found.append(cmdline)
    return found


def test_a_grid_command_exits_at_once_with_everything_written(tmp_path: Path) -> None:
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "sitecustomize.py").write_text(PROBE)
    (tmp_path / "grid.yaml").write_text(GRID)
    results = tmp_path / "results"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EXIT_PROBE": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "probe"), os.environ.get("PYTHONPATH", "")])}
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "bench.cli.main", "run", str(tmp_path / "grid.yaml"),
                             "--results", str(results), "--num-cpus", "2", "--yes"],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]

    assert (tmp_path / "exit-hooks-ran").exists()  # Ray's, MLflow's and logging's exit hooks ran ...
    assert not (tmp_path / "teardown-ran").exists()  # ... and the interpreter's teardown did not
    assert ray_processes_of(proc.pid) == []
    # The units ran in plain Ray workers: no runtime environment was set up for their actors (Ray Tune's own made
    # each a fresh `setup_worker.py` process, `bench.grid.runner.plain_trial_workers`).
    # Ray names a session after its driver's pid: one of an earlier process that had the same pid is not this run's.
    sessions = [s for s in Path(os.environ.get("RAY_TMPDIR", "/tmp"), "ray").glob(f"session_*_{proc.pid}")
                if s.stat().st_mtime >= started]
    assert len(sessions) == 1 and (sessions[0] / "logs").is_dir()
    assert list((sessions[0] / "logs").glob("runtime_env_setup-*")) == []

    # The whole summary, its table's last line included.
    lines = out.rstrip().splitlines()
    assert any(line.startswith("exits: 2 of 2 trials finished") for line in lines), out
    assert any(line.startswith("MLflow: 2 runs logged to") for line in lines), out
    assert lines[-1].startswith("└") and "0.3" in out.split("clean test accuracy")[-1], out

    rows = {f.stem: pq.read_table(f).to_pylist()[0] for f in (results / "trials").glob("*.parquet")}
    assert len(rows) == 2 and {r["status"] for r in rows.values()} == {"ok"}

    # MLflow: each trial's run finished and complete, its row artifact whole (in a fresh process, as a reader would).
    check = f"""
import json, sys
from mlflow import MlflowClient
client = MlflowClient(tracking_uri="sqlite:///{results}/mlflow.db")
exp = client.get_experiment_by_name("exits")
runs = client.search_runs([exp.experiment_id])
out = {{}}
for run in runs:
    path = client.download_artifacts(run.info.run_id, "result_row.json", "{tmp_path}")
    out[run.data.tags["bench.trial_id"]] = [run.info.status, run.data.tags.get("bench.complete"),
                                            json.load(open(path))["test_acc"]]
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    assert runs == {tid: ["FINISHED", "true", row["test_acc"]] for tid, row in rows.items()}

    # The folder's lock is free: a second driver takes it at once.
    from bench.store.folder import Store

    with Store(str(results)).hold():
        pass
