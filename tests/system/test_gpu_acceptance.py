"""benchmarks/gpu_acceptance.sh (issue 35): its summary (benchmarks/acceptance_summary.py) against a hand-made
results folder whose answers are computed here independently, and the whole script in its --tiny mode on the CPU:
every step, the grid through Ray and MLflow planned from the table `bench calibrate` wrote, one summary file."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.grid import executor_table
from tests.conftest import repo_script

REPO = Path(__file__).resolve().parents[2]
MR = Path(os.environ.get("BENCH_DATA") or REPO.parent / "shared" / "data")


def _write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


# (method, r, paper mean, paper std, bench's mean, authors' mean); None: not measured under that protocol
CELLS = [("ce", 0.0, 72.35, 0.0, 72.35, 72.35), ("ce", 0.4, 54.52, 1.74, 56.00, 51.00),
         ("dmi", 0.4, 62.67, 2.27, 60.00, 62.00), ("fw", 0.4, 57.89, 2.51, 57.00, None),
         ("gce", 0.4, 58.97, 1.77, None, None)]


def _folder(tmp_path: Path) -> Path:
    """A results folder as the script leaves it: the report's two paper tables, three trial rows, the figures."""
    folder = tmp_path / "run"
    _write_csv(folder / "report" / "paper_vs_measured.csv", [
        {"dataset": "mr", "r": r, "method": m, "paper_mean": p, "paper_std": s, "ours_mean": "" if b is None else b,
         "ours_std": "", "ours_n": 5, "diff": "", "combined_std": "", "flag": ""} for m, r, p, s, b, _ in CELLS])
    _write_csv(folder / "report" / "protocols.csv", [
        {"dataset": "mr", "noise": "pos_to_neg", "r": r, "method": m, "protocol": "authors", "paper_mean": p,
         "paper_std": s, "bench_n": 5, "bench_mean": b, "bench_std": 1, "other_n": 5, "other_mean": a,
         "other_std": 1, "paired_n": 5, "diff": a - b, "diff_ci95": 1}
        for m, r, p, s, b, a in CELLS if a is not None and b is not None])
    (folder / "results" / "trials").mkdir(parents=True)
    rows = [("a", "mr", "ok", 100, None), ("b", "mr", "ok", 50, 1000), ("c", "mr", "failed", None, None)]
    for trial, dataset, status, epochs, subset in rows:
        pq.write_table(pa.table({"trial_id": [trial], "dataset": [dataset], "status": [status],
                                 "epochs_trained": pa.array([epochs], pa.int64()),
                                 "train_subset": pa.array([subset], pa.int64()), "wall_s": [1.0]}),
                       folder / "results" / "trials" / f"{trial}.parquet")
    _write_csv(folder / "figures_resnet.csv", [
        {"model": "resnet34_cifar", "device": "H100", "arm": a, "executor": a.split()[0], "members": 1,
         "as_run": True, "images_per_s": v, "vs_solo": 0, "rounds": 3}
        for a, v in (("solo fp32", 10000), ("solo bf16 + CL", 15000), ("pack 4 fp32", 12000), ("pack 4 bf16", 21000),
                     ("streams 1", 9000), ("streams 2", 14000), ("streams 4", 26000))])
    (folder / "steps.tsv").write_text("cuda_tests\t0\t60\ngrid\t124\t300\n")
    return folder


def test_the_summary_counts_paper_cells_cost_and_arms_as_computed_independently(tmp_path: Path) -> None:
    summary = repo_script("benchmarks/acceptance_summary.py")
    folder = _folder(tmp_path)
    text = summary.summary(folder, grid_wall_s=300.0, total_wall_s=580.0, gpus=1, mode="full",
                           train_images={"mr": 7676}, machine="NVIDIA H100, torch 2.x")
    lines = text.splitlines()
    for column, protocol in ((4, "bench"), (5, "authors")):
        measured = [(c[0], c[2], c[3], c[column]) for c in CELLS if c[column] is not None
                    and (protocol == "bench" or c[4] is not None)]
        gaps = np.array([m - p for _, p, _, m in measured])
        stds = np.array([s for _, _, s, _ in measured])
        within = int(np.sum(np.abs(gaps) <= stds + 1e-9))
        ce_dmi = [i for i, c in enumerate(measured) if c[0] in ("ce", "dmi")]
        line = next(x for x in lines if x.startswith(f"paper's MR cells, {protocol}:"))
        assert f"{within} of {len(measured)} paper cells within the paper's std" in line
        assert f"mean signed gap {gaps.mean():+.2f} points" in line
        assert f"(CE and L_DMI: {int(np.sum(np.abs(gaps[ce_dmi]) <= stds[ce_dmi] + 1e-9))} of {len(ce_dmi)})" in line
    # bench: 72.35 = 72.35 (std 0), 56.00 within 1.74, 60.00 outside 2.27, 57.00 within 2.51: 3 of 4
    assert "bench: 3 of 4 paper cells" in text and "authors: 2 of 3 paper cells" in text
    images = (100 * 7676 + 50 * 1000) / 300.0
    assert f"grid: 3 trials ended (2 ok) in 300 s wall, {300 / 3600:.3f} GPU-hours (1 GPU), {images:,.0f} " \
           "training images/s; whole run 580 s" in text
    assert "streams: best streams 4 26,000 images/s, 2.60x solo fp32" in text  # not streams 1
    assert "solo bf16 + channels-last: best solo bf16 + CL 15,000 images/s, 1.50x solo fp32" in text
    assert "pack bf16: best pack 4 bf16 21,000 images/s, 2.10x solo fp32" in text
    assert "steps: cuda_tests exit 0 in 60 s; grid exit 124 in 300 s" in text
    # the CIFAR-10 table (600 trials x 100 epochs and 50 warm starts x 120, 40,000 images) at solo fp32's 10,000/s
    solo_hours = (600 * 100 + 50 * 120) * 40_000 / 10_000 / 3600
    assert f"  projection: today: every trial solo fp32: {solo_hours:,.1f} device-hours" in text


def test_the_summary_says_what_it_lacks(tmp_path: Path) -> None:
    """A run whose grid and report never ran: no paper cell, no ResNet figure, nothing invented."""
    (tmp_path / "run").mkdir()
    summary = repo_script("benchmarks/acceptance_summary.py").summary
    text = summary(tmp_path / "run", 10.0, None, 1, "tiny", {"mr": 7676}, "CPU")
    assert "grid: 0 trials ended (0 ok)" in text and "paper's MR cells: none measured" in text
    assert "resnet34_cifar: not measured" in text


@pytest.mark.slow
def test_the_tiny_acceptance_run_passes_on_the_cpu(tmp_path: Path) -> None:
    """Every step of the script on the CPU (about 3 minutes): the CUDA tests collected, the table calibrated, the
    grid run through Ray and MLflow and planned from that table, the report, one summary."""
    out = tmp_path / "acceptance"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env.pop("BENCH_EXECUTOR_TABLE", None)
    args = ["bash", str(REPO / "benchmarks" / "gpu_acceptance.sh"), "--tiny", "--out", str(out)]
    have_mr = (MR / "MR" / "rt-polaritydata" / "rt-polarity.pos").is_file()
    args += ["--data-root", str(MR if have_mr else tmp_path / "no-data")]
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = {line.split("\t")[0]: int(line.split("\t")[1]) for line in (out / "steps.tsv").read_text().splitlines()}
    assert steps == {"cuda_tests": 0, "calibrate": 0, "calibrate_resnet": 0, "grid": 0, "report": 0}
    models = {"word_cnn", "word_cnn_authors"} if have_mr else {"mlp"}
    rows = {r.model: r for r in executor_table.read_table(out / "executors.csv") if r.device == "cpu"}
    assert models | {"resnet34_cifar"} <= set(rows)
    grid_log = (out / "grid.log").read_text()
    for model in models:  # the grid was planned from the calibrated rows
        assert f"executor table ({out / 'executors.csv'}): {rows[model].describe()}" in grid_log
    trials = list((out / "results" / "trials").glob("*.parquet"))
    assert len(trials) == (4 if have_mr else 2)
    assert (out / "mlflow.db").is_file() and (out / "report" / "leaderboard.md").is_file()
    text = (out / "summary.md").read_text()
    assert text == done.stdout[done.stdout.index("# Acceptance run (tiny)"):].split("gpu_acceptance:")[0]
    assert f"grid: {len(trials)} trials ended ({len(trials)} ok)" in text
    assert ("paper's MR cells, authors:" in text) == have_mr
