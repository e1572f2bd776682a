"""The Ray Tune runner end to end, on the real local Ray (no mocks) and the generated synthetic dataset.

One local Ray session serves the in-process tests (module fixture); the killed-driver and cluster tests run
`bench run` in subprocesses. Processes these tests start are stopped by their own ids (never `ray stop`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml

from bench.cli.main import main
from bench.config import UserError
from bench.exec.warmstart import WarmStartCache
from bench.grid.files import load_experiment
from bench.grid.runner import Settings, run_experiment
from bench.methods import registry
from bench.store.folder import read_table
from tests.conftest import crashing_checkpoints, stop_session
from tests.report.test_report import make_row, write
from tests.tolerances import same_accuracy, same_selection, trained_close

REPO = Path(__file__).resolve().parents[2]
BENCH = str(Path(sys.executable).parent / "bench")
SYNTHETIC = dict(
    name="syn", dataset="synthetic", noise="case3", r=[0.0, 0.4], seeds=[0, 1], epochs=2, epochs_warmup=2,
    resources={"cpu": 1}, methods={"ce": {}, "dmi": {"lr": 1e-3}},
)


def write_config(folder: Path, **changes) -> Path:
    data = {**SYNTHETIC, **changes}
    path = folder / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def subprocess_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore", **extra}


def mlflow_trial_runs(results: Path, experiment: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    return [run for run in client.search_runs([exp.experiment_id], max_results=1000)
            if run.data.tags.get("bench.kind") == "trial"]


@pytest.fixture(scope="module")
def grid(ray_session, tmp_path_factory):
    """The 8-trial synthetic grid (CE and L_DMI x 2 noise levels x 2 seeds), run once for several tests."""
    folder = tmp_path_factory.mktemp("grid")
    config = write_config(folder)
    results = folder / "results"
    lines: list[str] = []
    tally = run_experiment(load_experiment(config), Settings(results=str(results), data_root=folder), lines.append)
    return config, results, tally, lines


# -- experiment files -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, key, allowed", [
    ({"epoch": 3}, "epoch", "allowed: name, dataset"),  # unknown key (did you mean epochs?)
    ({"seeds": "five"}, "seeds", "expected an integer"),  # wrong type
    ({"r": [0.0, 1.5]}, "r", "in [0, 1]"),  # impossible value
    ({"epochs": -1}, "epochs", ">= 0"),
    ({"resources": {"cpu": 0}}, "resources.cpu", "> 0.0"),
    ({"resources": {"cpu": 1, "gpus": 1}}, "resources.gpus", "allowed: cpu, gpu"),
    ({"methods": {"dmi": {"lr": "fast"}}}, "methods.dmi.lr", "expected a number"),
    ({"methods": {"dmi": {"batch_size": 0}}}, "methods.dmi.batch_size", ">= 1"),
    ({"methods": {"nope": {}}}, "methods", "unknown method 'nope'"),
    ({"methods": {"gce": {"qq": 0.7}}}, "methods.gce.qq", "allowed: lr, batch_size, epochs"),
    ({"dataset": "mnist"}, "dataset", "unknown dataset 'mnist'"),
    ({"noise": "pairs"}, "noise", "unknown noise for synthetic: 'pairs'"),
    ({"device": "tpu"}, "device", "allowed: cpu, cuda"),
    ({"precision": "fp16"}, "precision", "must be fp32 or bf16, got 'fp16'"),
    ({"precision": ["fp32", "fp32"]}, "precision", "repeats a value"),
    ({"epochs_warmup": 1.5}, "epochs_warmup", "expected an integer >= 0 and <= 10,000, got 1.5 (float)"),
    ({"max_concurrent": 0}, "max_concurrent", "must be an integer >= 1, got 0"),
    ({"seeds": 0}, "seeds", "must be an integer >= 1, got 0"),  # N seeds
    ({"description": 3}, "description", "expected text"),
    ({"resources": [1]}, "resources", "expected a mapping {cpu: N, gpu: F}"),
    ({"resources": {"gpu": 0.5}}, "resources.gpu", "set device: cuda"),
    ({"methods": {}}, "methods", "expected a non-empty mapping: method name -> settings"),
    ({"methods": {"ce": 3}}, "methods.ce", "expected a mapping of settings"),
    ({"methods": {"ce": {"epochs": -2}}}, "methods.ce.epochs", "must be an integer >= 0"),
    ({"methods": {"ce": {"r": 0.1}}}, "methods.ce.r", "is set for the whole experiment"),
    ({"methods": {"ce": {"lr": []}}}, "methods.ce.lr", "an empty list leaves nothing to run"),
    ({"noise": "transition", "transition": "x"}, "transition", "expected a list of rows"),
    ({"noise": "transition", "transition": [[1.0], [0.0, 1.0]]}, "transition", "must be square"),
    ({"noise": "transition", "transition": [[1.5, -0.5], [0.0, 1.0]]}, "transition[0][0]", "in [0, 1]"),
])
def test_config_errors_name_file_and_key(tmp_path, capsys, change, key, allowed):
    path = write_config(tmp_path, **change)
    assert main(["run", str(path), "--dry-run", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"bench: error: {path}: {key}:"), err
    assert allowed in err, err
    assert "\n" not in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("key, value, flag, allowed", [
    ("r", 1.5, "--r", "a finite number in [0, 1]"),
    ("seeds", [-1], "--seed", "an integer >= 0 and <= 9,007,199,254,740,991"),
    ("epochs", -1, "--epochs", "an integer >= 0 and <= 10,000"),
    ("lr", -1.0, "--lr", "positive (a finite number > 0.0)"),
    ("batch_size", 0, "--batch-size", "an integer >= 1"),
    ("precision", "fp16", "--precision", "fp32 or bf16"),
])
def test_a_file_key_and_its_trial_flag_allow_the_same(tmp_path, capsys, key, value, flag, allowed):
    """One declaration (bench.schema) for a value, whether an experiment file or `bench trial` sets it."""
    change = {key: value} if key in ("r", "seeds", "epochs", "precision") else {"methods": {"ce": {key: value}}}
    path = write_config(tmp_path, **change)
    assert main(["run", str(path), "--dry-run", "--results", str(tmp_path / "r")]) == 2
    from_file = capsys.readouterr().err
    given = str(value[0] if isinstance(value, list) else value)
    assert main(["trial", "--dataset", "synthetic", "--method", "ce", "--noise", "case3", "--r", "0.1",
                 flag, given, "--results", str(tmp_path / "r")]) == 2
    from_flag = capsys.readouterr().err
    assert f"must be {allowed}, got" in from_file and f"{flag} must be {allowed}, got" in from_flag


def test_config_yaml_reads_1e_minus_4_as_a_number(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump({**SYNTHETIC, "methods": {"dmi": {"lr": "PLACEHOLDER"}}}).replace(
        "PLACEHOLDER", "[1e-4, 1e-5]"))
    exp = load_experiment(path)
    assert [t.lr for t in exp.trials() if t.seed == 0 and t.r == 0.0] == [1e-4, 1e-5]


def test_shipped_configs_validate_against_the_registries():
    paths = sorted((REPO / "tune_configs").glob("*.yaml"))
    names = {p.stem for p in paths}
    assert {"fashion_mnist_case1", "fashion_mnist_case2", "fashion_mnist_case3", "cifar10", "dogs_vs_cats", "mr",
            "clothing1m", "cifar10n", "cifar100n", "demo", "idn_fashion_mnist", "idn_cifar10"} <= names
    for path in paths:
        exp = load_experiment(path)  # schema and names: every dataset, noise and method is registered
        assert exp.name == path.stem
        if path.stem == "fashion_mnist_figure":  # the figure grid: CE vs L_DMI at the paper's settings
            assert exp.noise == ("case1", "case2", "case3") and len(exp.r) == 10 and len(exp.seeds) == 5
            assert {(t.method, t.lr, t.batch_size) for t in exp.trials()} == {("ce", None, None), ("dmi", None, None)}
        elif path.stem == "baselines_fashion":  # every method once per cell, not the paper's grid
            assert {m.name for m in exp.methods} == set(registry())
            assert exp.r == (0.2, 0.7) and set(exp.noise) == {"case2", "case3"}
            assert (exp.epochs_warmup, exp.epochs, exp.dataset) == (20, 4, "fashion_mnist")
        elif path.stem == "diagnostics_fashion":  # the diagnostics' demonstration grid (README), 12 short trials
            assert {m.name for m in exp.methods} == {"ce", "dmi", "coteaching"} and len(exp.trials()) == 12
            assert exp.r == (0.2, 0.7) and exp.noise == ("case3",) and (exp.epochs_warmup, exp.epochs) == (3, 3)
        elif path.stem.startswith("idn_"):  # class-conditional (symmetric) vs instance-dependent noise, same r
            base = load_experiment(REPO / "tune_configs" / {"fashion_mnist": "fashion_mnist_case1.yaml",
                                                            "cifar10": "cifar10.yaml"}[exp.dataset])
            assert exp.noise == ("symmetric", "idn") and exp.r == (0.2, 0.4)
            assert (exp.methods, exp.seeds, exp.resources) == (base.methods, base.seeds, base.resources)
        elif path.stem == "mr_protocols":  # one paper cell under both protocols (issue 31)
            assert exp.protocol == ("bench", "authors") and exp.r == (0.4,) and exp.seeds == (0, 1)
            assert {m.name for m in exp.methods} == {"ce", "dmi"} and len(exp.trials()) == 8
        elif path.stem == "dogs_vs_cats_protocols":  # the paper's Dogs vs Cats cell under both protocols (issue 36)
            assert exp.protocol == ("bench", "authors") and exp.r == (0.4,) and exp.seeds == (0, 1)
            assert {m.name for m in exp.methods} == {"ce", "dmi", "fw", "gce", "lccn"} and len(exp.trials()) == 20
        elif path.stem in ("animal10n", "food101n", "webvision_mini", "webvision_mini_ilsvrc12", "red_mini_imagenet"):
            # The real-world sets (issue 39): what their papers compare that bench has, CE, L_DMI at the paper's lrs.
            assert exp.dataset == path.stem and {"ce", "dmi"} <= {m.name for m in exp.methods}
            assert {t.lr for t in exp.trials() if t.method == "dmi"} == {1e-4, 1e-5, 1e-6}
            assert exp.r == ((0.2, 0.4, 0.6, 0.8) if exp.dataset == "red_mini_imagenet" else (0.0,))
        elif path.stem == "linear_probe":  # the frozen-feature baseline on CIFAR-10N's label sets
            backbone = dict(exp.model_args)["backbone"]
            assert (exp.dataset, exp.model, backbone) == ("cifar10n", "linear_probe", "resnet50")
            assert {"ce", "dmi"} <= {m.name for m in exp.methods} and (exp.epochs_warmup, exp.epochs) == (20, 20)
        elif path.stem != "demo" and exp.dataset not in ("clothing1m", "cifar10n", "cifar100n"):  # real noise: no r
            assert exp.r == tuple(round(0.1 * i, 1) for i in range(10))
            assert len(exp.seeds) == 5
            dmi = {t.lr for t in exp.trials() if t.method == "dmi"}, {t.batch_size for t in exp.trials()
                                                                       if t.method == "dmi"}
            assert dmi == ({1e-4, 1e-5, 1e-6}, {128, 256})
            assert {"ce", "fw", "gce", "lccn", "mentornet", "vat", "dmi"} <= {m.name for m in exp.methods}


def test_demo_dry_run(capsys, tmp_path):
    # Without Fashion-MNIST (an empty data root) the dry run prints its plan, then ends as the run would (exit 2).
    assert main(["run", str(REPO / "tune_configs" / "demo.yaml"), "--dry-run", "--results",
                 tempfile.mkdtemp(prefix="demo-dry"), "--data-root", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("bench: error: fashion_mnist: missing ")
    assert "grid: 16 trials = 8 ce + 8 dmi" in out
    assert "8 CE warm starts shared by 16 trials" in out


def test_dry_run_estimates_the_time_from_earlier_rows_and_says_how(capsys, tmp_path):
    """#55: `--dry-run` said epochs, not minutes. Seed 0 of the synthetic grid has rows whose seconds are set by hand
    (CE 60 s an epoch, L_DMI 120, the warm start 90 where CE's row trained it, 0.25 where L_DMI's loaded it); seed 1
    is pending: 2 CE and 2 L_DMI trials of 2 epochs and 2 warm starts of 2 epochs: 240 + 480 + 360 s = 18 min of
    compute, 9 min of wall time at 2 trials at once (--num-cpus 2, 1 CPU a trial)."""
    config = write_config(tmp_path)
    results = tmp_path / "results"
    assert main(["run", str(config), "--dry-run", "--results", str(results)]) == 0
    assert "time: no estimate (no earlier row like them in the results folder, no images/s for mlp on cpu" in \
        capsys.readouterr().out
    rows = []
    for t in load_experiment(config).trials():
        if t.seed == 0:
            rows.append(make_row(t.method, t.r, t.seed, 0.5, 80.0, dataset=t.dataset, noise=t.noise) | dict(
                trial_id=t.trial_id, model=t.network(), device="cpu (x86_64)", train_subset=None, epochs=2,
                epochs_warmup=2, method_s=120.0 if t.method == "ce" else 240.0,
                warmup_s=180.0 if t.method == "ce" else 0.5))
    write(results, rows)
    assert main(["run", str(config), "--dry-run", "--results", str(results), "--num-cpus", "2"]) == 0
    assert ("time: about 18 min of trial compute for 4 trials; about 9.0 min of wall time at 2 trials at once "
            "(estimated from 4 earlier rows in the results folder: seconds an epoch of the same dataset, model, method "
            "and device, median; fewer where warm starts are cached)") in capsys.readouterr().out.splitlines()


# -- the grid on local Ray --------------------------------------------------------------------------------------
def test_grid_writes_one_row_and_one_mlflow_run_per_trial(grid):
    config, results, tally, lines = grid
    trials = load_experiment(config).trials()
    rows = read_table(results)
    assert rows.height == 8 and sorted(rows["trial_id"]) == sorted(t.trial_id for t in trials)
    assert set(rows["status"]) == {"ok"}
    assert tally.done == 8 and sum(line.startswith("[") for line in lines) == 8
    assert any("ETA" in line for line in lines) and any("warm-start cache" in line for line in lines)

    runs = mlflow_trial_runs(results, "syn")
    assert len(runs) == 8
    assert tally.mlflow_logged == 8 and any(line.startswith("MLflow: 8 runs logged to ") for line in lines)
    by_id = {r.data.tags["bench.trial_id"]: r for r in runs}
    for row in rows.iter_rows(named=True):
        run = by_id[row["trial_id"]]
        p = run.data.params
        assert (p["method"], float(p["lr"]), float(p["r"]), int(p["seed"])) == (
            row["method"], row["lr"], row["r"], row["seed"])
        assert run.data.tags["bench.cell"] == f"synthetic/case3/r={row['r']:g}"
        assert run.data.metrics["test_acc"] == pytest.approx(row["test_acc"])
        # Flat: no parent run; the trial's own times (ms: its wall time to the millisecond).
        assert "mlflow.parentRunId" not in run.data.tags
        assert run.info.end_time - run.info.start_time == round(row["wall_s"] * 1000)
        assert (p["protocol"], p["train_subset"]) == ("bench", "none")
        assert p["selection"] == "lowest loss on the whole validation set, strict"  # words, not a Python repr

    # `bench ui` links each experiment's runs table in the UI's machine-learning view (MLflow 3 opens an experiment
    # on its GenAI overview).
    from bench.store.mirror import runs_links
    assert runs_links(f"sqlite:///{results / 'mlflow.db'}", "http://127.0.0.1:5000") == [
        f"syn: http://127.0.0.1:5000/#/experiments/{runs[0].info.experiment_id}/runs?workflowType=machine_learning"]


def test_each_mlflow_run_holds_its_row_and_curves_exactly(grid, tmp_path):
    """MLflow's writer (a thread, off Ray Tune's loop: issue #56, item 2) logs what the callback logged before it,
    checked against the rows themselves: one complete, finished run a trial; its tags; each configuration column as
    a param; each measured column as a metric of the row's value; each curve point at its epoch; the row's files."""
    _, results, _, _ = grid
    assert_runs_hold_rows(results / "mlflow.db", "syn", results, tmp_path)


def assert_runs_hold_rows(store: Path, experiment: str, results: Path, tmp_path: Path) -> None:
    """Each row under `results` is one complete, finished run of `experiment` in the sqlite `store`, holding the row:
    its tags, each configuration column as a param, each measured column as a metric of the row's value, each curve
    point at its epoch, the row's files."""
    from mlflow import MlflowClient

    from bench.store.columns import MLFLOW_METRICS, MLFLOW_PARAMS

    rows, epochs = read_table(results), read_table(results, "epochs")
    client = MlflowClient(f"sqlite:///{store}")
    runs = [run for run in client.search_runs([client.get_experiment_by_name(experiment).experiment_id],
                                              max_results=1000) if run.data.tags.get("bench.kind") == "trial"]
    assert sorted(r.data.tags["bench.trial_id"] for r in runs) == sorted(rows["trial_id"])  # one run a trial
    by_id = {r.data.tags["bench.trial_id"]: r for r in runs}
    for row in rows.iter_rows(named=True):
        run = by_id[row["trial_id"]]
        assert (run.info.status, run.info.lifecycle_stage) == ("FINISHED", "active")
        assert {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")} == {
            "bench.kind": "trial", "bench.trial_id": row["trial_id"], "bench.status": "ok", "bench.complete": "true",
            "bench.cell": f"{row['dataset']}/{row['noise']}/r={row['r']:g}", "bench.protocol": "bench",
            "bench.switches": "",
            **{k: str(row[k]) for k in ("dataset", "method", "noise", "r", "seed")}}
        for name in MLFLOW_PARAMS:
            assert run.data.params[name] == ("none" if row[name] is None else str(row[name])), name
        measured = {k: v for k, v in run.data.metrics.items() if "epoch_" not in k}
        assert measured == {k: float(row[k]) for k in MLFLOW_METRICS if row[k] is not None}
        curve = epochs.filter(pl.col("trial_id") == row["trial_id"])
        expected = {(("" if e["stage"] == "method" else f"{e['stage']}_") + f"epoch_{k}", e["epoch"]): float(e[k])
                    for e in curve.iter_rows(named=True) for k in ("train_loss", "val_loss", "val_acc", "seconds")
                    if e[k] is not None}
        logged = {(key, m.step): m.value for key in run.data.metrics if "epoch_" in key
                  for m in client.get_metric_history(run.info.run_id, key)}
        assert expected and {k: v for k, v in logged.items() if k in expected} == expected
        files = {f.path for f in client.list_artifacts(run.info.run_id)}
        assert files == {"result_row.json"} | {name for column, name in ARTIFACTS if row[column]}
        local = client.download_artifacts(run.info.run_id, "result_row.json", str(tmp_path / row["trial_id"]))
        assert json.loads(Path(local).read_text()) == json.loads(json.dumps(row, default=str))


ARTIFACTS = (("confusion", "confusion_matrix.json"), ("estimated_transition", "estimated_transition.json"),
             ("transition", "true_transition.json"), ("empirical_transition", "empirical_transition.json"),
             ("error", "error.txt"))


def test_a_run_plans_its_grid_once(grid, tmp_path, monkeypatch):
    """One `Plan.make` a run (issue #56, item 3; a local run made two), each trial's id hashed once."""
    from collections import Counter

    from bench.grid.plan import Plan
    from bench.trial import TrialConfig

    config, results, _, _ = grid
    shutil.copytree(results / "trials", tmp_path / "results" / "trials")
    calls: Counter = Counter()
    make, identity = Plan.make.__func__, TrialConfig.identity
    monkeypatch.setattr(Plan, "make", classmethod(lambda cls, *a, **k: calls.update(["make"]) or make(cls, *a, **k)))
    monkeypatch.setattr(TrialConfig, "identity", lambda self: calls.update(["identity"]) or identity(self))
    tally = run_experiment(load_experiment(config), Settings(results=str(tmp_path / "results"), data_root=tmp_path,
                                                             mlflow=False), lambda line: None)
    assert tally.total == 0 and calls == {"make": 1, "identity": 8}


def test_warm_start_is_shared_by_the_methods_of_a_cell(grid):
    _, results, tally, _ = grid
    # 4 (r, seed) cells: CE and L_DMI of a cell share one warm start, trained once; each records its epochs (the
    # one that loaded it from the cache too), the same numbers.
    assert len(list((results / "warmstart").glob("*.pt"))) == 4
    assert (tally.warm_misses, tally.warm_hits) == (4, 4)
    trials = read_table(results).select("trial_id", "r", "seed")
    warm = read_table(results, "epochs").filter(pl.col("stage") == "warmup").join(trials, on="trial_id")
    assert warm["trial_id"].n_unique() == 8
    per_cell = warm.group_by("r", "seed", "epoch").agg(pl.col("train_loss").n_unique(), pl.col("val_loss").n_unique())
    assert per_cell.height == 4 * 2 and set(per_cell["train_loss"]) == set(per_cell["val_loss"]) == {1}


def test_relaunch_runs_nothing_and_a_grown_grid_runs_only_the_new_trials(grid, tmp_path):
    config, results, _, _ = grid
    lines: list[str] = []
    tally = run_experiment(load_experiment(config), Settings(results=str(results), data_root=tmp_path), lines.append)
    assert tally.total == 0 and "nothing to run" in lines[-1]

    grown = write_config(tmp_path, seeds=[0, 1, 2])
    tally = run_experiment(load_experiment(grown), Settings(results=str(results), data_root=tmp_path), lines.append)
    assert tally.total == 4 and tally.done == 4
    rows = read_table(results)
    assert rows.height == 12 and rows["trial_id"].n_unique() == 12
    assert len(mlflow_trial_runs(results, "syn")) == 12


def test_a_failed_row_runs_again(ray_session, tmp_path):
    config = write_config(tmp_path, name="retry", r=[0.2], seeds=[0], methods={"ce": {}})
    results = tmp_path / "results"

    def run() -> int:
        return run_experiment(load_experiment(config), Settings(results=str(results), data_root=tmp_path,
                                                                mlflow=False), lambda s: None).total

    assert run() == 1
    path = next((results / "trials").glob("*.parquet"))
    pl.read_parquet(path).with_columns(status=pl.lit("failed")).write_parquet(path)
    assert run() == 1  # the failed trial ran again ...
    assert read_table(results)["status"].to_list() == ["ok"]  # ... and its row is now the only one, ok
    assert run() == 0


def test_results_command(grid, tmp_path, capsys):
    _, results, _, _ = grid
    out = tmp_path / "all.parquet"
    assert main(["results", str(results), "--out", str(out)]) == 0
    assert pl.read_parquet(out).height == read_table(results).height
    assert main(["results", str(results)]) == 0
    printed = capsys.readouterr().out
    assert read_table(results)["trial_id"][0] in printed
    assert main(["results", str(tmp_path / "empty")]) == 2


def test_the_folder_keeps_its_grid_and_a_row_removed_by_hand_reads_as_missing(grid, tmp_path, capsys):
    """`bench run` records the grid it ran (its file and its trial ids: `bench.store.grids`); with a row file removed
    by hand, `bench results` and `bench leaderboard` name the trial's cell (#55: before, both read as complete)."""
    _, results, _, _ = grid
    copy = tmp_path / "copy"
    shutil.copytree(results, copy)
    recorded = json.loads((copy / "grids" / "syn.json").read_text())["trials"]
    # The recorded file is the grid the ids come from (the fixture's, or the grown one where a test grew it first).
    assert [t.trial_id for t in load_experiment(copy / "grids" / "syn.yaml").trials()] == \
        [t["trial_id"] for t in recorded]
    assert {t["trial_id"] for t in recorded} == set(read_table(copy)["trial_id"])  # the grid's trials, each a row
    gone = next(t for t in recorded if t["method"] == "dmi")
    (copy / "trials" / f"{gone['trial_id']}.parquet").unlink()
    for command in ("results", "leaderboard"):
        assert main([command, str(copy)]) == 0
        out = capsys.readouterr().out
        assert f"Grid syn: 1 of {len(recorded)} trials missing (no row): L_DMI 1 of {len(recorded) // 2}; in 1 cell: " \
            f"synthetic case3 r={gone['r']:.1f} L_DMI (seed {gone['seed']})." in out


def test_mlflow_store_down_loses_nothing_and_sync_backfills(ray_session, tmp_path, capsys):
    config = write_config(tmp_path, name="down", r=[0.2], seeds=[0])
    results = tmp_path / "results"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once the socket closes
    tally = run_experiment(load_experiment(config),
                           Settings(results=str(results), data_root=tmp_path, mlflow_uri=dead), lambda s: None)
    assert tally.done == 2 and read_table(results).height == 2
    err = capsys.readouterr().err
    assert "MLflow store" in err and "bench sync-mlflow" in err

    assert main(["sync-mlflow", str(results)]) == 0
    assert "logged 2 missing runs" in capsys.readouterr().out
    assert main(["sync-mlflow", str(results)]) == 0  # idempotent
    assert "logged 0 missing runs" in capsys.readouterr().out
    assert len(mlflow_trial_runs(results, "down")) == 2


def test_gpu_request_on_a_cpu_only_cluster_fails_at_once(ray_session, tmp_path):
    if ray_session.cluster_resources().get("GPU"):
        pytest.skip("this machine has a GPU")
    config = write_config(tmp_path, name="gpu", device="cuda", resources={"cpu": 1, "gpu": 0.5})
    started = time.monotonic()
    with pytest.raises(UserError, match=r"0.5 GPU.*no node of this Ray cluster"):
        run_experiment(load_experiment(config), Settings(results=str(tmp_path / "r"), data_root=tmp_path,
                                                         mlflow=False), lambda s: None)
    assert time.monotonic() - started < 30
    assert read_table(tmp_path / "r").is_empty()
    assert not (tmp_path / "r" / "grids").exists()  # a grid refused is not recorded as one the folder runs


# -- the warm-start cache ---------------------------------------------------------------------------------------
def _want_warm_start(results: str, key: str, log: str) -> tuple[float, dict]:
    cache = WarmStartCache(results)

    def train() -> tuple[dict[str, torch.Tensor], list[dict]]:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        return {"w": torch.full((3,), float(os.getpid()))}, []

    state, _ = cache(key, train)
    return float(state["w"][0]), cache.stats()


def test_warm_start_cache_is_concurrent_safe(tmp_path):
    log = tmp_path / "trained.txt"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        out = pool.starmap(_want_warm_start, [(str(tmp_path), "k1", str(log))] * 2)
    assert len(log.read_text().split()) == 1  # trained once; the other waited on the lock and loaded it
    assert out[0][0] == out[1][0]
    assert sorted((s["warm_hits"], s["warm_misses"]) for _, s in out) == [(0, 1), (1, 0)]
    assert [p.name for p in (tmp_path / "warmstart").iterdir() if p.suffix == ".tmp"] == []


@pytest.mark.parametrize("method", ["dmi", "mentornet"])
def test_a_crashed_trial_resumes_from_its_epoch_checkpoint_with_the_same_numbers(tmp_path, method):
    from bench.exec.trainer import run_trial
    from bench.store.folder import Checkpoints
    from bench.trial import TrialConfig

    config = TrialConfig("synthetic", method, "case3", 0.4, seed=3, epochs=5, epochs_warmup=2)
    whole = run_trial(config, tmp_path, results=tmp_path / "whole", log=lambda s: None)

    results = str(tmp_path / "resumed")
    lines: list[str] = []

    CrashAfterEpoch2 = crashing_checkpoints(2)

    with pytest.raises(RuntimeError, match="node lost"):
        run_trial(config, tmp_path, results=results, log=lines.append,
                  checkpoints=CrashAfterEpoch2(results, config.trial_id, lines.append))
    assert read_table(results)["status"].to_list() == ["failed"]
    resumed = run_trial(config, tmp_path, results=results, log=lines.append,
                        checkpoints=Checkpoints(results, config.trial_id, lines.append))
    assert "resumed from the checkpoint of epoch 2" in lines
    for key in ("status", "best_epoch", "val_loss", "test_acc", "last_test_acc", "confusion"):
        assert resumed[key] == whole[key], key
    curves = [read_table(r, "epochs").filter(pl.col("stage") == "method")["val_loss"].to_list()
              for r in (tmp_path / "whole", results)]
    assert curves[0] == curves[1]


# -- a killed driver, and a cluster reached by --address --------------------------------------------------------
@pytest.mark.slow
def test_killed_driver_relaunch_gives_every_row_exactly_once(ray_session, tmp_path):
    config = write_config(tmp_path, name="killed", r=[0.0, 0.2, 0.4, 0.6], seeds=[0], epochs=10, epochs_warmup=3)
    results = tmp_path / "results"
    driver = subprocess.Popen([BENCH, "run", str(config), "--results", str(results), "--max-concurrent", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                              env=subprocess_env())
    try:
        deadline = time.monotonic() + 120
        while not list((results / "trials").glob("*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert list((results / "trials").glob("*.parquet")), "no trial finished in time"
        driver.kill()
        driver.wait()
    finally:
        stop_session(driver.pid)
    landed = len(list((results / "trials").glob("*.parquet")))
    assert landed < 8, "the driver finished before it was killed: make the trials longer"

    tally = run_experiment(load_experiment(config), Settings(results=str(results), data_root=tmp_path),
                           lambda s: None)
    assert tally.total <= 8 - 1
    rows = read_table(results)
    expected = sorted(t.trial_id for t in load_experiment(config).trials())
    assert sorted(rows["trial_id"]) == expected  # none missing, none twice
    assert set(rows["status"]) == {"ok"}
    runs = mlflow_trial_runs(results, "killed")
    assert sorted(r.data.tags["bench.trial_id"] for r in runs) == expected


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_grid_on_a_local_cluster_reached_by_address(tmp_path):
    # Token auth (docs/cluster.md, the RAY_AUTH_MODE trap): the cluster and its client agree on RAY_AUTH_MODE; this
    # private cluster on 127.0.0.1 runs without a token so that the test never touches ~/.ray/auth_token.
    env = subprocess_env(RAY_AUTH_MODE="disabled")
    temp_dir = tempfile.mkdtemp(prefix="rayt", dir="/tmp")  # short: Ray's socket paths have a length limit
    port = _free_port()
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--port", str(port),
         "--node-ip-address", "127.0.0.1", "--num-cpus", "2", "--temp-dir", temp_dir,
         "--include-dashboard", "false", "--disable-usage-stats"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env,
    )
    try:
        out, _ = head.communicate(timeout=120)
        assert head.returncode == 0, out
        config = write_config(tmp_path, name="cluster")
        results = tmp_path / "results"
        run = subprocess.run([BENCH, "run", str(config), "--results", str(results), "--address",
                              f"127.0.0.1:{port}", "--no-mlflow"], capture_output=True, text=True, timeout=240,
                             env=env)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "[8/8]" in run.stdout
        assert read_table(results).height == 8
    finally:
        stop_session(head.pid)


def test_a_packed_grid_gives_each_trial_its_row_and_run_and_the_solo_numbers(grid, tmp_path):
    """`--pack 4` on the CPU (auto would run solo here): the same 8 trials in 2 packs of whole warm-start cells,
    one row and one MLflow run per trial, the numbers of the solo grid; a relaunch runs nothing."""
    config, solo_results, _, _ = grid
    results = tmp_path / "packed"
    lines: list[str] = []
    settings = Settings(results=str(results), data_root=tmp_path, pack=4)
    tally = run_experiment(load_experiment(config), settings, lines.append)
    assert tally.done == 8 and any("8 trials in 2 packs" in line for line in lines)
    rows = read_table(results).sort("trial_id")
    solo = read_table(solo_results).filter(pl.col("trial_id").is_in(rows["trial_id"].to_list())).sort("trial_id")
    assert rows.height == 8 and rows["trial_id"].to_list() == solo["trial_id"].to_list()
    assert set(rows["pack_size"]) == {4} and set(solo["pack_size"]) == {1}
    # Two float orders of each training (tests/tolerances.py): the same selection unless tied within rounding,
    # the selected loss within it, the accuracy (1,000 test examples) within one example.
    curves = read_table(solo_results, "epochs").filter(stage="method").sort("epoch")
    for a, b in zip(rows.iter_rows(named=True), solo.iter_rows(named=True), strict=True):
        val = curves.filter(trial_id=b["trial_id"])["val_loss"].to_list()
        assert same_selection(a["best_epoch"], b["best_epoch"], val)
        assert trained_close(a["val_loss"], b["val_loss"]), (a["val_loss"], b["val_loss"])
        assert a["best_epoch"] != b["best_epoch"] or same_accuracy(a["test_acc"], b["test_acc"], 1000)
    assert len(mlflow_trial_runs(results, "syn")) == 8
    assert len(list((results / "warmstart").glob("*.pt"))) == 4  # each cell's warm start trained once, cached
    again = run_experiment(load_experiment(config), settings, lines.append)
    assert again.total == 0 and "nothing to run" in lines[-1]


def test_dry_run_shows_the_packs_and_why_the_rest_runs_solo(tmp_path, capsys):
    config = write_config(tmp_path, device="cuda", resources={"cpu": 1, "gpu": 0.5},
                          methods={"ce": {}, "dmi": {}, "vat": {}})
    assert main(["run", str(config), "--dry-run", "--pack", "3", "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "8 trials in 4 packs of 2, 2, 2, 2; 4 trials solo" in out
    assert "solo: 4 trials: method vat" in out
    assert main(["run", str(config), "--dry-run", "--pack", "zero", "--results", str(tmp_path / "r")]) == 2


def test_ray_tune_keeps_only_the_actor_variables_the_workers_do_not_inherit(monkeypatch):
    """A local grid's units run in Ray's idle workers only if Ray Tune gives their actors no runtime environment
    (bench.grid.runner.plain_trial_workers): each variable of its table that the driver's environment already has,
    with the same value, leaves the table; one the environment sets otherwise stays (its actors then get it)."""
    from ray.tune.execution import class_cache

    from bench.grid.runner import TUNE_ACTOR_ENV, inherited_tune_env, plain_trial_workers

    monkeypatch.setattr(class_cache, "DEFAULT_ENV_VARS", {"PL_DISABLE_FORK": "1", "OTHER": "a", "THIRD": "b"})
    for name in (*TUNE_ACTOR_ENV, "OTHER", "THIRD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTHER", "not a")
    plain_trial_workers()
    assert os.environ["PL_DISABLE_FORK"] == "1"
    inherited_tune_env()
    assert class_cache.DEFAULT_ENV_VARS == {"OTHER": "a", "THIRD": "b"}


def test_the_units_resources_travel_without_the_units():
    """Ray Tune pickles a grid's resources with its trainable and reads them back several times a trial: each unit
    gets the placement group its executor asks (as `unit_bundles` gives it), and what travels holds no trial, only the
    distinct bundles (one placement group where all units ask the same), so a read does not cost the whole grid."""
    import cloudpickle
    from ray import tune

    from bench.exec.executor import Unit
    from bench.grid.runner import unit_bundles, unit_resources
    from bench.trial import TrialConfig

    trials = [TrialConfig("synthetic", "ce", "case3", 0.2, seed=s) for s in range(400)]
    alike = {f"u{i}": Unit("solo", (t,)) for i, t in enumerate(trials)}
    mixed = {**alike, "pack": Unit("pack", tuple(trials[:3]))}
    for units in (alike, mixed):
        resources = unit_resources(units, 1.0, 0.25)
        assert b"TrialConfig" not in cloudpickle.dumps(resources)
        for unit_id, unit in units.items():
            got = resources if isinstance(resources, tune.PlacementGroupFactory) else resources({"unit": unit_id})
            assert got == tune.PlacementGroupFactory(unit_bundles(unit, 1.0, 0.25))
    assert isinstance(unit_resources(alike, 1.0, 0.25), tune.PlacementGroupFactory)
    assert unit_bundles(mixed["pack"], 1.0, 0.25) != unit_bundles(alike["u0"], 1.0, 0.25)  # a pack of 3 asks 0.75 GPU
