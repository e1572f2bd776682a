"""`bench calibrate` (issue 35): it times a model's arms on this device (bench.exec.calibrate), writes the fastest
that a grid runs as the model's executor-table row (bench.grid.executor_table), which the planner then names and
follows; it keeps its time budget and says what it skipped; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from bench.cli.main import main
from bench.grid import executor_table
from bench.grid.executor_table import choose, device_kind, table_row, winner

TINY_GRID = """name: tiny
dataset: synthetic
noise: case1
r: [0.2]
seeds: 2
epochs: 1
epochs_warmup: 1
device: cpu
resources: {cpu: 1, gpu: 0}
methods:
  ce: {}
  dmi: {}
"""
QUICK = ["--device", "cpu", "--members", "2", "--steps", "3", "--rounds", "2"]


@dataclass(frozen=True)
class Figure:
    """A measured arm, as `bench.exec.calibrate.Rate` gives it to the chooser."""

    arm: str
    executor: str
    members: int
    as_run: bool
    images_per_s: float


def printed_arms(out: str, model: str) -> dict[str, float]:
    """The arm table `bench calibrate` prints for `model`: arm -> images/s."""
    block = out.split(f"{model}: arm | images/s")[1].split("\n\n")[0]
    return {line.split(" | ")[0].strip(): float(line.split(" | ")[1].replace(",", ""))
            for line in block.splitlines()[1:] if line.count(" | ") == 2}


def test_calibrate_writes_rows_that_parse_and_that_the_planner_names(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "t.csv"
    assert main(["calibrate", *QUICK, "--models", "mlp", "--out", str(out), "--budget-s", "60"]) == 0
    printed = capsys.readouterr().out
    rows = executor_table.read_table(out)
    shipped = executor_table.read_table(executor_table.DEFAULT)
    assert rows[: len(shipped)] == shipped  # a new table starts from the one in force
    (row,) = [r for r in rows if r.model == "mlp"]
    arms = printed_arms(printed, "mlp")
    assert set(arms) == {"solo fp32", "pack 2 fp32", "streams 2"}, arms
    best = max(arms, key=arms.get)  # every arm here is one a grid runs: the fastest is the row
    assert (row.device, row.executor, row.trials) == ("cpu", best.split()[0], 1 if best.startswith("solo") else 2)
    assert row.images_per_s == f"{arms[best]:.0f}"
    assert torch.__version__ in row.source and f"{best} fastest" in row.source
    assert choose("mlp", "cpu", None, rows) == row

    (tmp_path / "tiny.yaml").write_text(TINY_GRID)
    monkeypatch.setenv("BENCH_EXECUTOR_TABLE", str(out))
    assert main(["run", str(tmp_path / "tiny.yaml"), "--dry-run", "--results", str(tmp_path / "res")]) == 0
    assert f"executor table ({out}): {row.describe()}" in capsys.readouterr().out


def test_the_planner_follows_a_calibrated_row(tmp_path: Path, capsys, monkeypatch) -> None:
    """Figures where a pack of 2 wins on this CPU make a pack row; the dry run then plans packs of 2."""
    figures = [Figure("solo fp32", "solo", 1, True, 100.0), Figure("pack 2 fp32", "pack", 2, True, 150.0),
               Figure("streams 2", "streams", 2, True, 90.0)]
    out = tmp_path / "t.csv"
    executor_table.write_rows([table_row("mlp", figures, "cpu", "2026-11-27", "2.x", "bench calibrate")], out)
    (tmp_path / "tiny.yaml").write_text(TINY_GRID)
    monkeypatch.setenv("BENCH_EXECUTOR_TABLE", str(out))
    assert main(["run", str(tmp_path / "tiny.yaml"), "--dry-run", "--results", str(tmp_path / "res")]) == 0
    printed = capsys.readouterr().out
    assert "mlp on cpu: pack, at most 2 trials a unit" in printed
    assert "4 trials in 2 packs of 2, 2" in printed, printed


def test_a_slower_arm_is_never_chosen() -> None:
    """Over many shuffled figures: the row's arm is the fastest of those a grid runs (fp32, K > 1 for the units);
    a faster bf16 arm or `streams 1` is never the row."""
    rng = random.Random(35)
    for _ in range(200):
        figures = [Figure("solo fp32", "solo", 1, True, rng.uniform(1, 100)),
                   Figure("solo bf16 + CL", "solo", 1, False, rng.uniform(1, 300)),
                   Figure("streams 1", "streams", 1, False, rng.uniform(1, 300))]
        for k in rng.sample([2, 4, 8, 16], 2):
            figures += [Figure(f"pack {k} fp32", "pack", k, True, rng.uniform(1, 100)),
                        Figure(f"pack {k} bf16", "pack", k, False, rng.uniform(1, 300)),
                        Figure(f"streams {k}", "streams", k, True, rng.uniform(1, 100))]
        rng.shuffle(figures)
        best = winner(figures)
        assert best.as_run and all(best.images_per_s >= f.images_per_s for f in figures if f.as_run)
        row = table_row("resnet34_cifar", figures, "NVIDIA H100 80GB HBM3", "2026-11-27", "2.x", "bench calibrate")
        assert (row.executor, row.trials) == (best.executor, 1 if best.executor == "solo" else best.members)
        assert float(row.images_per_s) == pytest.approx(best.images_per_s, abs=0.5)
    tie = [Figure("solo fp32", "solo", 1, True, 50.0), Figure("pack 2 fp32", "pack", 2, True, 50.0)]
    assert winner(tie).arm == "solo fp32"  # a tie keeps solo: a unit must be faster to be chosen


def test_rows_match_the_gpu_kind_ray_reports() -> None:
    """The row's device is the kind Ray names ("H100"), so that the planner on an H100 picks it over the generic
    CUDA rows, and not on another card."""
    figures = [Figure("solo fp32", "solo", 1, True, 10.0), Figure("streams 4", "streams", 4, True, 30.0)]
    names = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "cpu")
    assert [device_kind(n) for n in names] == ["H100", "A100", "L40S", "cpu"]
    row = table_row("resnet34_cifar", figures, names[0], "2026-11-27", "2.x", "bench calibrate")
    table = (*executor_table.read_table(executor_table.DEFAULT), row)
    assert choose("resnet34_cifar", "cuda", "H100", table) == row
    assert choose("resnet34_cifar", "cuda", "A100", table) != row


def test_the_budget_is_kept_and_what_was_skipped_is_said(tmp_path: Path, capsys) -> None:
    """A budget spent by the first model: it is measured in one round (not the 3 asked), the next is skipped, and
    the rows and figures hold the first only."""
    out, figures = tmp_path / "t.csv", tmp_path / "f.csv"
    assert main(["calibrate", *QUICK, "--rounds", "3", "--models", "mlp,resnet34_cifar", "--budget-s", "0.01",
                 "--out", str(out), "--figures", str(figures)]) == 0
    printed = capsys.readouterr().out
    assert "measured 1 of 2 models" in printed and "skipped (budget spent): resnet34_cifar" in printed
    assert [r.model for r in executor_table.read_table(out) if r.device == "cpu" and r.model != "*"] == ["mlp"]
    with figures.open() as f:
        measured = list(csv.DictReader(f))
    assert {m["model"] for m in measured} == {"mlp"} and {m["rounds"] for m in measured} == {"1"}


def _no_cuda() -> list[tuple[list[str], str]]:
    return [] if torch.cuda.is_available() else [(["--device", "cuda", "--models", "mlp"], "no CUDA device")]


@pytest.mark.parametrize(("argv", "message"), [
    (["--device", "cpu", "--models", "mlp,nope"], "unknown model 'nope'"),
    (["--device", "cpu", "--models", "mlp", "--members", "1,2"],
     "--members (trials a unit, separated by commas: '1,2') must be a whole number from 2 to 256"),
    (["--device", "cpu", "--models", "mlp", "--budget-s", "0"], "--budget-s must be"),
    (["--device", "cpu", "--models", "mlp", "--out", "{tmp}"], "is a folder, not a file"),
    (["--device", "cpu", "--models", "mlp", "--out", "{tmp}/file/t.csv"], "is a file, not a folder"),
    (["--device", "cpu", "--models", "mlp", "--out", "{tmp}/bad.csv"], "the executor table"),
    (["--device", "cpu", "--models", "word_cnn", "--data-root", "{tmp}/empty"], "cannot calibrate word_cnn"),
    (["--device", "cpu", "--models", "", "--steps", "2", "--rounds", "1", "--members", "2"],
     "--models names no model: ''"),  # an empty list, not the --config path (a TypeError on 9638f3c)
    *_no_cuda(),
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path: Path, capsys, argv: list[str],
                                                     message: str) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "bad.csv").write_text("not,a,table\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["calibrate", *(a.replace("{tmp}", str(tmp_path)) for a in argv)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing measured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench: error:") and message in lines[0], captured.err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_the_members_default_to_the_device(capsys) -> None:
    """Without --members: 2 and 4 on a CPU (8 and 16 only on CUDA), in the first progress line."""
    assert main(["calibrate", "--device", "cpu", "--models", "mlp", "--steps", "2", "--rounds", "1",
                 "--budget-s", "30"]) == 0
    printed = capsys.readouterr().out
    assert "members [2, 4]" in printed.splitlines()[0]
    rows = list(csv.DictReader(printed[printed.index("model,device,"):].splitlines()[:2]))
    assert rows[0]["model"] == "mlp" and rows[0]["device"] == "cpu"
    assert set(printed_arms(printed, "mlp")) == {"solo fp32", "pack 2 fp32", "streams 2", "pack 4 fp32", "streams 4"}


def test_a_grid_names_the_models_its_trials_train() -> None:
    """--config: the networks of the grid's trials, the authors' scripts' own under that protocol."""
    import argparse

    from bench.cli.calibrate import models_of

    repo = Path(__file__).resolve().parents[2]
    grid = argparse.Namespace(models=None, config=str(repo / "tune_configs" / "mr_protocols.yaml"))
    assert models_of(grid) == ["word_cnn", "word_cnn_authors"]
    assert models_of(argparse.Namespace(models=None, config=str(repo / "tune_configs" / "demo.yaml"))) == [
        "fashion_cnn"]
