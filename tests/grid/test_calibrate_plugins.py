"""`bench calibrate` times whatever executors are registered (issue #48): a plug-in executor from `$BENCH_PLUGINS`
offers its arm (`Executor.calibration_arms`) and the real command times it beside the built-ins, with nothing of
bench edited."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

PLUGIN = '''
"""An executor kind of a user's own: a unit's trials one after another, each as its solo trial. Its calibration arm
trains a unit's members an epoch each and writes, per call, K and the training steps the members took."""

import os

from bench.exec.executor import Arm, Executor, half_each, solo_epoch
from bench.exec.stage import Turns


class Steps(Turns):
    """Counts the optimiser steps of the training loop it is handed to."""

    def __init__(self):
        self.taken = 0

    def after_step(self):
        self.taken += 1


class Counted(Executor):
    name = "counted"

    def run(self, trials, ctx):
        return [self.run_trial(trial, ctx) for trial in trials]

    def resources(self, trials, cpu, gpu):
        return [{"CPU": cpu, "GPU": gpu}]

    def unit_id(self, trials):
        return "counted-" + "-".join(sorted(t.trial_id for t in trials))

    def describe(self, trials):
        return f"counted of {len(trials)}"

    def calibration_arms(self, members, ks, extras=False, compile=None):
        def arm(k):
            epochs = [solo_epoch(p) for p in half_each(members, k)]

            def run():
                steps = Steps()
                for epoch in epochs:
                    epoch(steps)
                with open(os.environ["COUNTED_CALLS"], "a") as f:
                    f.write(f"{k} {steps.taken}\\n")

            return Arm(f"counted {k}", self.name, k, True, run)

        return [arm(k) for k in ks]
'''


def test_calibrate_times_a_plugin_executor(tmp_path: Path) -> None:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "counted.py").write_text(PLUGIN)
    calls, figures = tmp_path / "calls.txt", tmp_path / "figures.csv"
    env = {**os.environ, "BENCH_PLUGINS": str(folder), "COUNTED_CALLS": str(calls), "OMP_NUM_THREADS": "1"}
    bench = Path(sys.executable).parent / "bench"
    steps, batch, rounds = 3, 16, 2
    out = subprocess.run([str(bench), "calibrate", "--device", "cpu", "--models", "mlp", "--members", "2,4",
                          "--steps", str(steps), "--batch", str(batch), "--rounds", str(rounds), "--budget-s", "120",
                          "--figures", str(figures)], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    # Its arms ran as `timed` runs every arm: one untimed epoch, then one a round; each call trained every member
    # its epoch of `steps` steps.
    lines = calls.read_text().split()
    made = [(int(k), int(s)) for k, s in zip(lines[::2], lines[1::2], strict=True)]
    assert sorted(made) == sorted([(2, 2 * steps), (4, 4 * steps)] * (1 + rounds)), made
    with figures.open() as f:
        measured = {row["arm"]: row for row in csv.DictReader(f)}
    # The built-ins' arms as before, the plug-in's among them by members (its kind's name before pack's).
    assert list(measured) == ["solo fp32", "counted 2", "pack 2 fp32", "streams 2", "counted 4", "pack 4 fp32",
                              "streams 4"]
    for k in (2, 4):
        row = measured[f"counted {k}"]
        assert (row["executor"], row["members"], row["as_run"], row["rounds"]) == ("counted", str(k), "True", "2")
        assert float(row["images_per_s"]) > 0
    block = out.stdout.split("mlp: arm | images/s")[1].split("\n\n")[0]
    assert "  counted 2 | " in block and "  counted 4 | " in block, out.stdout
