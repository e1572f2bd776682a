"""Fault injection (issue #12): damaged files, bad values, worker-only faults, wrong stores, path names, concurrent
launches and huge grids, each met with a clear answer. Real local Ray, real MLflow (sqlite), real parquet, the
generated synthetic dataset (tiny Fashion-MNIST files where a data file must be damaged)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from bench.cli.main import main
from bench.config import UserError
from bench.grid.files import load_experiment
from bench.grid.runner import Settings, run_experiment
from bench.methods import FromTrial, Interval, registry
from bench.store.folder import read_table
from bench.store.rows import write_trial
from tests.conftest import held_by_another_process

GRID = dict(name="faults", dataset="synthetic", noise="case3", r=[0.0, 0.4], seeds=[0], epochs=1, epochs_warmup=1,
            resources={"cpu": 1}, methods={"ce": {}})
TRIAL = ["trial", "--dataset", "synthetic", "--method", "gce", "--noise", "case3", "--r", "0.3",
         "--epochs-warmup", "0", "--epochs", "0"]


def write_config(folder: Path, **changes) -> Path:
    data = {**GRID, **changes}
    path = folder / "grid.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line]
    assert len(err) == 1, err
    assert err[0].startswith("bench: error:"), err
    return err[0]


def accuracies(results: Path) -> dict[str, float]:
    table = read_table(results)
    return dict(zip(table["trial_id"], table["test_acc"], strict=True))


@pytest.fixture(scope="module")
def grid(ray_session, tmp_path_factory):
    """The 2-trial grid, run once without faults: the reference numbers and a folder to copy and damage."""
    folder = tmp_path_factory.mktemp("reference")
    config = write_config(folder)
    results = folder / "results"
    tally = run_experiment(load_experiment(config), Settings(results=str(results), data_root=folder, mlflow=False),
                           lambda line: None)
    assert tally.statuses == {"ok": 2}
    return config, results, accuracies(results)


def copy_of(grid, tmp_path: Path) -> Path:
    results = tmp_path / "results"
    shutil.copytree(grid[1], results)
    return results


def rerun(config: Path, results: Path, **settings):
    lines: list[str] = []
    tally = run_experiment(load_experiment(config), Settings(results=str(results), data_root=results, **settings),
                           lines.append)
    return tally, lines


# -- 1. a damaged result file ------------------------------------------------------------------------------------
def test_damaged_row_is_skipped_with_one_warning_then_set_aside_and_rerun(grid, tmp_path, capsys):
    config, _, reference = grid
    results = copy_of(grid, tmp_path)
    damaged = sorted((results / "trials").glob("*.parquet"))[0]
    damaged.write_bytes(damaged.read_bytes()[:100])

    assert main(["results", str(results)]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line]
    assert len(warnings) == 1 and str(damaged) in warnings[0] and "Traceback" not in captured.err
    other = (set(reference) - {damaged.stem}).pop()
    assert other in captured.out and damaged.stem not in captured.out

    assert main(["leaderboard", str(results)]) == 0
    assert main(["run", str(config), "--results", str(results), "--dry-run"]) == 0
    assert "1 already have a result row, 1 to run" in capsys.readouterr().out

    tally, lines = rerun(config, results, mlflow=False)
    assert tally.total == 1 and tally.statuses == {"ok": 1}
    assert any("set aside the result file" in line and "unreadable" in line for line in lines)
    assert [p.name.split(".")[0] for p in (results / "damaged").iterdir()] == [f"trials-{damaged.stem}"]
    assert accuracies(results) == reference  # every row once, numbers identical to the uninterrupted run


# -- 2. results that cannot be written ---------------------------------------------------------------------------
@pytest.mark.parametrize("where, message", [
    ("a_file", "is a file, not a folder"),
    ("a_file/below", "is a file, not a folder"),
])
def test_unwritable_results_are_refused_before_training(tmp_path, capsys, where, message):
    (tmp_path / "a_file").write_text("not a folder")
    results = tmp_path / where
    assert main([*TRIAL, "--results", str(results)]) == 2
    assert message in one_error_line(capsys)
    config = write_config(tmp_path)
    assert main(["run", str(config), "--results", str(results), "--no-mlflow"]) == 2
    assert message in one_error_line(capsys)
    assert (tmp_path / "a_file").read_text() == "not a folder"


def test_a_row_that_cannot_be_written_is_kept_and_the_error_says_where(tmp_path, monkeypatch):
    from bench.exec.trainer import run_trial

    row = run_trial(load_experiment(write_config(tmp_path)).trials()[0], tmp_path, log=lambda line: None)
    results = tmp_path / "results"
    results.mkdir()
    (results / "trials").write_text("a file where the folder belongs")  # the folder refuses the row late
    monkeypatch.setenv("BENCH_UNSAVED", str(tmp_path / "unsaved"))
    with pytest.raises(UserError) as e:
        write_trial(results, row, [dict(stage="method", epoch=0, train_loss=None, val_loss=0.5, val_acc=None,
                                        seconds=0.0)])
    assert str(tmp_path / "unsaved") in str(e.value) and row["trial_id"] in str(e.value)
    kept = read_table(tmp_path / "unsaved")
    assert kept["trial_id"].to_list() == [row["trial_id"]] and kept["test_acc"].item() == row["test_acc"]
    assert not (results / "epochs" / f"{row['trial_id']}.parquet").exists()  # no stray curves without their row


# -- 3. hyper-parameters and trial values, on the command line and in a grid --------------------------------------
def test_every_method_declares_parseable_ranges_and_choices():
    for cls in registry().values():
        assert set(cls.ranges) | set(cls.choices) <= set(cls.defaults), cls.name
        for key, text in cls.ranges.items():
            if not isinstance(cls.defaults[key], FromTrial):  # the trial supplies it (Co-teaching's forget rate)
                assert cls.defaults[key] in Interval.parse(text), (cls.name, key)
        for key, allowed in cls.choices.items():
            assert cls.defaults[key] in allowed, (cls.name, key)
    assert registry()["gce"].ranges["q"] == "(0, 1]"


@pytest.mark.parametrize("args, message", [
    (["--param", "truncated=maybe"], "truncated='maybe' is not allowed; expected true or false"),
    (["--param", "q=abc"], "q='abc' is not allowed; expected a number in (0, 1]"),
    (["--param", "q=0"], "expected a number in (0, 1]"),
    (["--param", "prune_every=1.5"], "expected an integer in [1, inf)"),
    (["--lr", "nan"], "--lr must be positive"),
    (["--train-subset", "-5"], "--train-subset must be an integer >= 1"),
    (["--train-subset", "0"], "--train-subset must be an integer >= 1"),
    (["--train-subset", "4001"], "<= 4,000"),
    (["--seed", "-1"], "--seed must be an integer >= 0"),
    (["--experiment", "../../x"], "no path separators, no '..'"),
    (["--experiment", "caf\udce9"], "not a safe name"),  # a non-UTF-8 byte, as the shell hands it over
])
def test_bad_trial_values_are_one_line_exit_2_nothing_written(tmp_path, capsys, args, message):
    assert main([*TRIAL, *args, "--results", str(tmp_path / "res")]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "res").exists()


def test_param_strings_are_converted_by_the_declared_type(tmp_path, capsys):
    assert main([*TRIAL, "--param", "truncated=false", "--param", "q=1", "--results", str(tmp_path / "res")]) == 0
    params = json.loads(read_table(tmp_path / "res")["method_params"].item())
    assert params == {"truncated": False, "q": 1.0}
    assert type(params["truncated"]) is bool


@pytest.mark.parametrize("change, key, message", [
    ({"methods": {"gce": {"q": 0}}}, "methods.gce.q", "expected a number in (0, 1]"),
    ({"methods": {"gce": {"q": "abc"}}}, "methods.gce.q", "expected a number in (0, 1]"),
    ({"methods": {"gce": {"truncated": "false"}}}, "methods.gce.truncated", "expected true or false"),
    ({"methods": {"bootstrap": {"variant": "medium"}}}, "methods.bootstrap.variant", "one of soft, hard"),
    ({"methods": {"ce": {"lr": float("nan")}}}, "methods.ce.lr", "finite"),
    ({"r": [0.0, float("nan")]}, "r", "finite"),
    ({"seeds": [-1]}, "seeds", ">= 0"),
    ({"train_subset": 0}, "train_subset", ">= 1"),
    ({"train_subset": 5000}, "train_subset", "4,000 training examples"),
    ({"noise": "transition", "r": 0.0, "transition": [[0.9, 0.0], [0.3, 0.7]]}, "transition", "row 0 sums to 0.9"),
])
def test_bad_grid_values_fail_the_dry_run_and_the_run_before_ray(tmp_path, capsys, change, key, message):
    config = write_config(tmp_path, **change)
    for extra in (["--dry-run"], ["--no-mlflow"]):
        assert main(["run", str(config), "--results", str(tmp_path / "res"), *extra]) == 2
        line = one_error_line(capsys)
        assert line.startswith(f"bench: error: {config}: {key}:") and message in line, line
    assert not (tmp_path / "res").exists()


# -- 4. a fault only a worker can see ------------------------------------------------------------------------------
def test_a_worker_only_fault_is_reported_once_without_retries_or_rows(ray_session, tiny_fashion, tmp_path):
    # The driver checks presence (checksums off); the file is damaged, so only loading it in the worker fails.
    image = tiny_fashion / "FashionMNIST" / "raw" / "train-images-idx3-ubyte.gz"
    image.write_bytes(image.read_bytes()[:50])
    config = write_config(tmp_path, dataset="fashion_mnist", train_subset=None)
    results = tmp_path / "results"
    lines: list[str] = []
    tally = run_experiment(load_experiment(config), Settings(results=str(results), data_root=tiny_fashion,
                                                             mlflow=False, retries=2), lines.append)
    assert len(tally.rejected) == 2 and tally.statuses == {"rejected": 2}
    assert all("train-images-idx3-ubyte.gz" in error for error in tally.rejected.values())
    assert not list(results.glob("trials/*.parquet"))
    for trial_id in tally.rejected:  # the log shows one attempt: Ray did not retry
        assert (results / "logs" / f"{trial_id}.log").read_text().count("bench: error:") == 1
    text = "\n".join(lines)
    assert "Traceback" not in text and "failed trials keep a row" not in text
    assert "2 trials stopped on an error that retrying cannot fix" in text


# -- 5. a damaged warm-start cache entry ---------------------------------------------------------------------------
class Planted:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['BENCH_PLANTED_MARK']}",))


def test_a_damaged_or_planted_warm_start_is_set_aside_and_retrained_once(grid, tmp_path, monkeypatch):
    config, _, reference = grid
    results = copy_of(grid, tmp_path)
    mark = tmp_path / "code-ran"
    monkeypatch.setenv("BENCH_PLANTED_MARK", str(mark))
    entries = sorted((results / "warmstart").glob("*.pt"))
    assert len(entries) == 2
    entries[0].write_bytes(b"garbage")
    entries[1].write_bytes(pickle.dumps({"state": Planted()}))
    for row in (results / "trials").glob("*.parquet"):
        row.unlink()

    tally, _ = rerun(config, results, mlflow=False)
    assert tally.statuses == {"ok": 2} and tally.warm_misses == 2
    assert accuracies(results) == reference
    assert not mark.exists()  # the planted pickle was never executed
    aside = sorted(p.name for p in (results / "warmstart").iterdir() if ".damaged-" in p.name)
    assert [name.split(".damaged-")[0] for name in aside] == [e.name for e in entries]
    logs = "".join(p.read_text() for p in (results / "logs").glob("*.log"))
    assert all(str(e) in logs for e in entries) and "weights_only=False" not in logs

    tally, _ = rerun(config, results, mlflow=False)  # the retrained entries serve the next launch
    assert tally.total == 0


# -- 6. the backfill hint names the store that was used ----------------------------------------------------------------
def test_backfill_hint_names_the_mlflow_server_that_was_down(grid, tmp_path):
    config, _, reference = grid
    results = copy_of(grid, tmp_path)
    sorted((results / "trials").glob("*.parquet"))[0].unlink()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once the socket closes
    tally, lines = rerun(config, results, mlflow_uri=uri)
    assert tally.statuses == {"ok": 1}
    hint = [line for line in lines if "store FAILED" in line]
    assert len(hint) == 1 and f"`bench sync-mlflow {results} --mlflow-uri {uri}`" in hint[0]
    assert not (results / "mlflow.db").exists()


# -- 7. names that become paths ------------------------------------------------------------------------------------
def test_a_row_with_a_path_for_an_experiment_name_writes_nothing_outside(grid, tmp_path, capsys):
    results = copy_of(grid, tmp_path / "a" / "b")
    row = read_table(results).row(0, named=True)
    row["experiment"], row["trial_id"] = "../../x", "0" * 16
    write_trial(results, row, [])
    assert main(["sync-mlflow", str(results)]) == 0
    err = capsys.readouterr().err
    assert "skipping the result file" in err and "experiment '../../x' is not a name" in err
    assert not (tmp_path / "a" / "x").exists() and not (tmp_path / "x").exists()
    assert sorted(p.name for p in (results / "mlartifacts").iterdir()) == ["faults"]


def test_names_with_path_characters_are_refused_in_a_grid(tmp_path, capsys):
    config = write_config(tmp_path, name="../../x")
    assert main(["run", str(config), "--dry-run"]) == 2
    assert "name: use letters, digits" in one_error_line(capsys)


# -- 8. two launches on one results folder -------------------------------------------------------------------------
def test_a_second_launch_on_a_held_folder_names_the_holder_and_exits_2(tmp_path, capsys):
    config = write_config(tmp_path)
    results = tmp_path / "results"
    with held_by_another_process(results) as holder:
        assert main(["run", str(config), "--results", str(results), "--no-mlflow"]) == 2
        line = one_error_line(capsys)
        assert f"pid {holder}" in line and "in use" in line
        assert not (results / "trials").exists() and not (results / "mlflow.db").exists()


# -- 9. a huge grid --------------------------------------------------------------------------------------------------
def test_a_huge_grid_needs_yes_and_its_dry_run_is_a_summary(tmp_path, capsys):
    config = write_config(tmp_path, seeds=1_000_000)
    assert main(["run", str(config), "--results", str(tmp_path / "res"), "--dry-run"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and "grid: 2,000,000 trials = 2,000,000 ce" in out[1]
    assert main(["run", str(config), "--results", str(tmp_path / "res")]) == 2
    assert "2,000,000 trials" in one_error_line(capsys) and not (tmp_path / "res").exists()


def test_a_large_grid_dry_run_is_not_listed(tmp_path, capsys):
    config = write_config(tmp_path, seeds=600)
    assert main(["run", str(config), "--results", str(tmp_path / "res"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    # Not the 1,200 trial lines: the plan's dozen (the time estimate's among them since #55).
    assert "trials: 1,200 (not listed" in out and len(out.splitlines()) < 12


# -- 10. the smaller ones ------------------------------------------------------------------------------------------
def test_smaller_faults_are_one_line_exit_2(tmp_path, tiny_fashion, capsys):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    assert main(["run", str(latin), "--dry-run"]) == 2
    assert "not UTF-8 text (byte 0xe9" in one_error_line(capsys)

    matrix = tmp_path / "t.csv"
    matrix.write_bytes(b"0.9,0.1\n0.2,0.8 \xe9\n")
    assert main([*TRIAL[:6], "transition", "--r", "0", "--transition", str(matrix), "--results",
                 str(tmp_path / "res")]) == 2
    assert "not UTF-8 text" in one_error_line(capsys)

    twice = tmp_path / "twice.yaml"
    twice.write_text(write_config(tmp_path).read_text() + "r: 0.5\n")
    assert main(["run", str(twice), "--dry-run"]) == 2
    assert "key 'r' is given twice" in one_error_line(capsys)

    assert main(["run", str(write_config(tmp_path)), "--num-cpus", "-1"]) == 2
    assert "--num-cpus must be >= 1" in one_error_line(capsys)

    labels = tiny_fashion / "FashionMNIST" / "raw" / "train-labels-idx1-ubyte.gz"
    labels.write_bytes(labels.read_bytes()[:20])  # BENCH_VERIFY_CHECKSUMS=0 (the fixture): only a parse sees it
    assert main(["trial", "--dataset", "fashion_mnist", "--method", "ce", "--noise", "case1", "--r", "0.1",
                 "--data-root", str(tiny_fashion), "--results", str(tmp_path / "res")]) == 2
    assert "is not a readable gzip file" in one_error_line(capsys)


def test_report_escapes_names_from_the_data(grid, tmp_path, monkeypatch, capsys):
    """A name that is not a NAME never reaches a report (the store sets its row aside); one that got past the store
    is still escaped by every renderer."""
    from bench.store import dataset
    results = copy_of(grid, tmp_path)
    for path in (results / "trials").glob("*.parquet"):
        frame = pl.read_parquet(path).with_columns(noise=pl.lit("a_b&c<script>"))
        frame.write_parquet(path)
    assert main(["report", str(results), "--out", str(tmp_path / "report")]) == 2  # no row of ours left
    assert "noise 'a_b&c<script>' is not a name" in capsys.readouterr().err
    monkeypatch.setattr(dataset, "not_ours", lambda *args: None)  # the store's check, file by file and over columns
    monkeypatch.setattr(dataset, "_suspects", lambda *args: [])
    assert main(["report", str(results), "--out", str(tmp_path / "report")]) == 0
    tex = (tmp_path / "report" / "leaderboard.tex").read_text()
    md = (tmp_path / "report" / "leaderboard.md").read_text()
    assert r"a\_b\&c" in tex and "a_b&c" not in tex
    assert r"a\_b&c\<script\>" in md and "<script>" not in md


def test_sigterm_to_bench_ui_stops_its_mlflow_server(tmp_path):
    import signal

    store = tmp_path / "mlflow.db"
    store.touch()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    ui = subprocess.Popen([str(Path(sys.executable).parent / "bench"), "ui", str(tmp_path), "--port", port,
                           "--mlflow-uri", f"sqlite:///{store}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True)
    try:
        assert ui.stdout.readline().startswith("starting MLflow's server for")
        children = Path(f"/proc/{ui.pid}/task/{ui.pid}/children")
        server = None
        while server is None:  # the server starts after that line, the links once it answers
            assert ui.poll() is None
            for pid in children.read_text().split():
                try:  # other short-lived children come and go
                    if b"server" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                        server = int(pid)
                except OSError:
                    continue
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(timeout=60) == 128 + signal.SIGTERM
        with pytest.raises(ProcessLookupError):
            os.kill(server, 0)
    finally:
        if ui.poll() is None:
            ui.kill()
