"""Fault injection, second round (issue #21): results folders that travel between people, Ray's network exposure,
damaged mirrors, full disks, resumed and packed records, trial identity, and flags that slip past the checks.
Each test fails on the code before that issue."""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from bench.cli.main import main
from bench.config import Schedule
from bench.exec.executors.pack import pack_id
from bench.exec.pack import run_pack
from bench.exec.trainer import run_trial
from bench.exec.warmstart import WarmStartCache
from bench.grid.files import load_experiment
from bench.grid.runner import Settings, run_experiment
from bench.report import analysis
from bench.store import folder as store_folder
from bench.store.folder import Checkpoints, Store, read_table
from bench.store.rows import write_trial
from bench.trial import TrialConfig, freeze_params
from tests.conftest import crashing_checkpoints

QUIET = dict(log=lambda s: None)
GRID = dict(name="more", dataset="synthetic", noise="case3", r=[0.2, 0.4], seeds=[0], epochs=1, epochs_warmup=1,
            resources={"cpu": 1}, methods={"ce": {}})


def write_config(folder: Path, **changes) -> Path:
    path = folder / "grid.yaml"
    path.write_text(yaml.safe_dump({**GRID, **changes}, sort_keys=False))
    return path


def trial(r: float = 0.2, method: str = "ce", **changes) -> TrialConfig:
    return TrialConfig("synthetic", method, "case3", r, **{"epochs": 1, "epochs_warmup": 1, **changes})


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real rows (CE on the synthetic set at r = 0.2 and 0.4), trained once for the module."""
    folder = tmp_path_factory.mktemp("trained") / "results"
    for r in (0.2, 0.4):
        run_trial(trial(r), "unused", results=folder, **QUIET)
    return folder


@pytest.fixture
def results(trained: Path, tmp_path: Path) -> Path:
    """The test's own copy of the two-row results folder, to damage."""
    return Path(shutil.copytree(trained, tmp_path / "results"))


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("bench: warning:")]


# -- result rows that are not ours --------------------------------------------------------------------------------
def test_a_row_naming_a_path_writes_nothing_outside_the_report_folder(results, tmp_path, capsys):
    """A row whose dataset is `../../../../elsewhere/x` (a results folder from someone else) is set aside with a
    warning; the report of the other rows is written, and nothing lands outside --out."""
    row = read_table(results).row(0, named=True)
    row["dataset"], row["trial_id"] = "../../../../elsewhere/x", "f" * 16
    write_trial(results, row, [])
    out = tmp_path / "deep" / "er" / "report"
    assert main(["report", str(results), "--out", str(out)]) == 0
    warned = warnings_in(capsys.readouterr().err)
    assert len(warned) == 1 and "f" * 16 in warned[0] and "is not a name" in warned[0]
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "deep" / "elsewhere").exists()
    assert {p.name for p in (out / "plots").iterdir()} >= {"accuracy_vs_r_synthetic_case3.png"}
    assert all(out.resolve() in p.resolve().parents for p in out.rglob("*"))


def test_plot_names_stay_in_their_folder_and_apart(tmp_path):
    from bench.report.plots import file_stem

    folder = tmp_path / "plots"
    stems = [file_stem(folder, "accuracy_vs_r", *names) for names in
             (("../../x", "case3"), ("a/b", "c"), ("a_b", "c"), ("mr", "pos.neg"), ("mr", "pos_neg"))]
    assert all(stem.parent == folder for stem in stems) and len({s.name for s in stems}) == len(stems)
    assert file_stem(folder, "accuracy_vs_r", "mr", "pos_to_neg").name == "accuracy_vs_r_mr_pos_to_neg"
    assert all("." not in s.name for s in stems)  # with_suffix(".png") keeps the whole name


def test_a_parquet_file_of_another_schema_is_set_aside_not_counted_as_done(results, tmp_path, capsys):
    """Readable, but not a result row: report and leaderboard skip it with one warning; a planned trial whose row
    is such a file is pending; `bench run` moves it to damaged/."""
    ids = sorted(read_table(results)["trial_id"].to_list())
    pl.DataFrame({"a": [1, 2]}).write_parquet(results / "trials" / "someone_elses.parquet")
    pl.DataFrame({"trial_id": [ids[0]], "status": ["ok"]}).write_parquet(results / "trials" / f"{ids[0]}.parquet")
    assert main(["leaderboard", str(results)]) == 0
    assert main(["report", str(results), "--out", str(tmp_path / "report")]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(warnings_in(err)) == 2
    assert read_table(results)["trial_id"].to_list() == ids[1:]
    moved = Store(results).set_aside_damaged()
    assert sorted(Path(p).name.split(".")[0] for p, _ in moved) == sorted(["trials-someone_elses", f"trials-{ids[0]}"])
    assert any("no column" in problem for _, problem in moved)


def test_bench_run_reruns_a_trial_whose_row_has_another_schema(ray_session, tmp_path):
    config = write_config(tmp_path)
    results = tmp_path / "results"
    settings = Settings(results=str(results), data_root=tmp_path, mlflow=False)
    run_experiment(load_experiment(config), settings, lambda s: None)
    first = sorted((results / "trials").glob("*.parquet"))[0]
    pl.DataFrame({"trial_id": [first.stem], "status": ["ok"]}).write_parquet(first)
    lines: list[str] = []
    tally = run_experiment(load_experiment(config), settings, lines.append)
    assert tally.total == 1 and tally.statuses == {"ok": 1}
    assert any("set aside the result file" in line and "no column" in line for line in lines)
    assert read_table(results).height == 2


# -- Ray listens on the loopback interface only ---------------------------------------------------------------------
def test_a_local_run_starts_ray_listening_on_127_0_0_1_only(tmp_path):
    """Every listening socket of the processes a local `bench run` starts (GCS, raylet, workers, the driver)."""
    script = """
from bench.grid.cluster import start_ray
import ray
from ray._private.utils import psutil

assert start_ray(None, 1)
ray.get(ray.remote(lambda: 1).remote())  # a worker too
me = psutil.Process()
listening = {(p.name(), c.laddr.ip) for p in [me, *me.children(recursive=True)]
             for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
print(sorted(listening))
ray.shutdown()
"""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    listening = eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own script's printed list
    assert any(name.startswith("gcs_server") for name, _ in listening), listening
    assert all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for _, ip in listening), listening


# -- a damaged MLflow mirror ---------------------------------------------------------------------------------------
def test_sync_mlflow_sets_a_damaged_database_aside_and_rebuilds_it(results, capsys):
    (results / "mlflow.db").write_bytes(b"this is not a database" * 100)
    assert main(["sync-mlflow", str(results)]) == 0
    captured = capsys.readouterr()
    warned = warnings_in(captured.err)
    assert len(warned) == 1 and "not a usable MLflow database" in warned[0] and "Traceback" not in captured.err
    assert "logged 2 missing runs" in captured.out
    assert len(list(results.glob("mlflow.db.damaged-*"))) == 1


def test_bench_run_trains_past_a_damaged_mlflow_database(ray_session, tmp_path, capsys):
    from mlflow import MlflowClient

    config = write_config(tmp_path, name="mirror")
    results = tmp_path / "results"
    results.mkdir()
    (results / "mlflow.db").write_bytes(b"\0garbage" * 1000)
    tally = run_experiment(load_experiment(config), Settings(results=str(results), data_root=tmp_path),
                           lambda s: None)
    assert tally.statuses == {"ok": 2}
    assert len(warnings_in(capsys.readouterr().err)) == 1
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("mirror").experiment_id],
                              "tags.`bench.kind` = 'trial'")
    assert len(runs) == 2


# -- a full disk while a checkpoint is written ---------------------------------------------------------------------
class FullDisk:
    """`open` as the store's local writes call it (on the descriptor of their new file, `bench.store.folder`): a
    write under checkpoints/ stops half-way with ENOSPC; everything else passes through."""

    def __init__(self) -> None:
        self.failures = 0

    def __call__(self, file, mode: str = "r", *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN204
        stream = builtins.open(file, mode, *args, **kwargs)
        if not isinstance(file, int) or "/checkpoints/" not in os.readlink(f"/proc/self/fd/{file}"):
            return stream
        outer = self

        class Half:
            def __enter__(self):  # noqa: ANN204
                return self

            def __exit__(self, *exc) -> None:  # noqa: ANN002
                stream.close()

            def write(self, data: bytes) -> None:
                stream.write(data[: len(data) // 2])
                outer.failures += 1
                raise OSError(errno.ENOSPC, "No space left on device")

        return Half()


def test_a_full_disk_while_checkpointing_warns_once_and_the_trial_finishes(tmp_path, monkeypatch):
    config = trial(0.4, "dmi", epochs=3, epochs_warmup=1)
    whole = run_trial(config, "unused", **QUIET)
    results = tmp_path / "results"
    lines: list[str] = []
    checkpoints = Checkpoints(results, config.trial_id, lines.append)
    disk = FullDisk()
    monkeypatch.setattr(store_folder, "open", disk, raising=False)
    row = run_trial(config, "unused", results=results, log=lines.append, checkpoints=checkpoints)
    assert disk.failures == 1  # tried once, then no more checkpoints for this trial
    assert row["status"] == "ok" and read_table(results)["status"].to_list() == ["ok"]
    for key in ("best_epoch", "val_loss", "test_acc", "last_test_acc"):
        assert row[key] == whole[key], key
    assert [line for line in lines if "could not write the checkpoint" in line and "No space" in line]
    assert not [p for p in results.rglob("*") if p.name.endswith(".tmp")]


# -- per-epoch records and cost do not depend on interruptions or packing -----------------------------------------
def _record(results: Path, trial_id: str) -> list[tuple]:
    epochs = pl.read_parquet(results / "epochs" / f"{trial_id}.parquet")
    return list(zip(epochs["stage"], epochs["epoch"], epochs["train_loss"], epochs["val_loss"], strict=True))


def test_a_resumed_pack_records_the_epochs_of_an_uninterrupted_one(tmp_path):
    pack = [trial(0.4, m, seed=3, epochs=4, epochs_warmup=2) for m in ("ce", "dmi")]
    whole = run_pack(pack, "unused", results=tmp_path / "whole", warm_cache=WarmStartCache(tmp_path / "whole"),
                     **QUIET)
    resumed_at = str(tmp_path / "resumed")
    with pytest.raises(RuntimeError, match="node lost"):
        run_pack(pack, "unused", results=resumed_at, warm_cache=WarmStartCache(resumed_at), log=lambda s: None,
                 checkpoints=crashing_checkpoints(2)(resumed_at, pack_id(pack), lambda s: None))
    resumed = run_pack(pack, "unused", results=resumed_at, warm_cache=WarmStartCache(resumed_at),
                       checkpoints=Checkpoints(resumed_at, pack_id(pack), lambda s: None), **QUIET)
    for config, a, b in zip(pack, whole, resumed, strict=True):
        assert _record(tmp_path / "resumed", config.trial_id) == _record(tmp_path / "whole", config.trial_id)
        assert a["epochs_trained"] == b["epochs_trained"] == 2 + 4


def test_a_solo_trial_on_a_cached_warm_start_records_what_its_packed_twin_does(tmp_path):
    """CE trains the cell's warm start; L_DMI loads it from the cache: its record and cost are those of the same
    trial trained in a pack (where the pack trained the warm start)."""
    ce, dmi = (trial(0.4, m, seed=1, epochs=3, epochs_warmup=2) for m in ("ce", "dmi"))
    solo = tmp_path / "solo"
    cache = WarmStartCache(solo)
    run_trial(ce, "unused", results=solo, warm_cache=cache, **QUIET)
    row = run_trial(dmi, "unused", results=solo, warm_cache=cache, **QUIET)
    assert cache.hits == 1
    twin = run_pack([ce, dmi], "unused", results=tmp_path / "packed", **QUIET)[1]
    ours, theirs = _record(solo, dmi.trial_id), _record(tmp_path / "packed", dmi.trial_id)
    assert [r[:2] for r in ours] == [r[:2] for r in theirs] == [("warmup", 1), ("warmup", 2)] + [
        ("method", e) for e in range(4)]
    assert row["epochs_trained"] == twin["epochs_trained"] == 2 + 3


# -- trial identity is the effective configuration -----------------------------------------------------------------
def test_a_default_written_out_is_the_same_trial_and_a_changed_default_a_new_one(monkeypatch):
    from bench.baselines.gce import GeneralizedCrossEntropy
    from bench.datasets.synthetic import Synthetic

    implicit = trial(method="gce")
    schedule = Synthetic.method_stage
    explicit = trial(method="gce", lr=schedule.lr, batch_size=schedule.batch_size,
                     method_params=freeze_params({"q": GeneralizedCrossEntropy.defaults["q"]}))
    assert explicit.trial_id == implicit.trial_id
    assert trial(method="gce", method_params=freeze_params({"q": 1})).trial_id == \
        trial(method="gce", method_params=freeze_params({"q": 1.0})).trial_id
    assert trial(method="gce", lr=2e-3).trial_id != implicit.trial_id
    monkeypatch.setattr(Synthetic, "method_stage", Schedule("adam", 2e-3, epochs=5, batch_size=128))
    assert trial(method="gce").trial_id != implicit.trial_id  # the dataset's default lr changed
    monkeypatch.undo()
    monkeypatch.setitem(GeneralizedCrossEntropy.defaults, "q", 0.5)
    assert trial(method="gce").trial_id != implicit.trial_id  # the method's default q changed


def test_a_grid_stating_defaults_runs_nothing_new_and_counts_each_seed_once(ray_session, tmp_path, capsys):
    config = write_config(tmp_path, methods={"ce": {}})
    results = tmp_path / "results"
    settings = Settings(results=str(results), data_root=tmp_path, mlflow=False)
    run_experiment(load_experiment(config), settings, lambda s: None)
    explicit = write_config(tmp_path, methods={"ce": {"lr": 1e-3, "batch_size": 128}})
    lines: list[str] = []
    assert run_experiment(load_experiment(explicit), settings, lines.append).total == 0
    assert "nothing to run" in lines[-1]
    # A row of the same training under another id (written before ids hashed the effective configuration).
    row = read_table(results).row(0, named=True)
    write_trial(results, {**row, "trial_id": "e" * 16, "finished_at": "2000-01-01T00:00:00Z"}, [])
    cells = analysis.aggregate(analysis.load_trials(results))
    assert cells["n"].to_list() == [1, 1] and all(s.count(",") == 0 for s in cells["seeds"].to_list())
    assert "repeat the (cell, setting, seed)" in capsys.readouterr().err
    smaller = write_config(tmp_path, r=[0.2])
    lines.clear()
    run_experiment(load_experiment(smaller), settings, lines.append)
    assert any("2 result rows" in line and "match no trial of this grid" in line for line in lines)


# -- values that passed every check --------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [2**63, 2**53])
def test_a_seed_out_of_range_is_one_line_before_anything_runs(tmp_path, capsys, seed):
    config = write_config(tmp_path, seeds=[0, seed])
    assert main(["run", str(config), "--results", str(tmp_path / "res"), "--no-mlflow"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seeds" in err[0] and "<= 9,007,199,254,740,991" in err[0]
    assert main(["trial", "--dataset", "synthetic", "--method", "ce", "--noise", "case3", "--r", "0.2", "--seed",
                 str(seed), "--results", str(tmp_path / "res")]) == 2
    assert "--seed" in capsys.readouterr().err
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("flag, value", [("--cpus-per-trial", "nan"), ("--cpus-per-trial", "inf"),
                                         ("--cpus-per-trial", "-1"), ("--gpus-per-trial", "nan")])
def test_non_finite_resources_are_refused_up_front(tmp_path, capsys, flag, value):
    config = write_config(tmp_path)
    for extra in (["--dry-run"], []):
        assert main(["run", str(config), "--results", str(tmp_path / "res"), flag, value, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and flag in err[0] and "finite" in err[0]
    assert not (tmp_path / "res").exists()


def test_bench_datasets_shows_files_that_fail_their_checksums_as_damaged(tiny_fashion, monkeypatch, capsys):
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "1")
    assert main(["datasets", "--data-root", str(tiny_fashion)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("fashion_mnist"))
    assert "damaged" in line and "ready" not in line
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")  # a re-packaged copy: not checked, so ready
    assert main(["datasets", "--data-root", str(tiny_fashion)]) == 0
    assert "ready" in next(line for line in capsys.readouterr().out.splitlines() if line.startswith("fashion_mnist"))


def test_a_rows_config_json_is_its_effective_configuration(tmp_path):
    row = run_trial(trial(method="gce"), "unused", **QUIET)
    config = json.loads(row["config_json"])
    assert config["method_stage"]["lr"] == row["lr"] and dict(config["method_params"])["q"] == 0.7
