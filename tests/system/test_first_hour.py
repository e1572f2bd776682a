"""A newcomer's first hour (issue 21, item 2): live progress of `bench run`, download progress, one data variable for
the tests, error lines that name the right fix, one rounding for every table, intervals that stay in [0, 100],
command-line overrides of an experiment file, `bench --version`, MLflow run names, `bench results` that fits a
terminal, and `leaderboard --metric selected`.

The Ray tests use a local Ray of their own (stopped by this process; never `ray stop`).
"""

from __future__ import annotations

import importlib.metadata
import io
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch
from scipy import stats

import bench
from bench.cli import main as cli
from bench.config import UserError
from bench.exec.events import EpochRecord, Resumed, StageEnd, StageStart, log_line
from bench.exec.executor import Unit
from bench.grid.files import Overrides, load_experiment
from bench.grid.mlflow_callback import make_mlflow_callback
from bench.grid.plan import Plan
from bench.grid.progress import (
    RunProgress,
    StatusBoard,
    Tally,
    UnitReporter,
    describe_progress,
    make_callback,
    print_summary,
)
from bench.grid.runner import Settings, run_experiment
from bench.report import analysis
from bench.store.folder import read_table
from bench.store.mirror_writer import MirrorWriter
from bench.trial import TrialConfig
from tests.grid.test_runner import write_config
from tests.report.test_report import make_row, write

REPO = Path(__file__).resolve().parents[2]
# -- live progress: what a unit reports -------------------------------------------------------------------------
CURVE = ("stage", "epoch", "train_loss", "val_loss", "val_acc")


def _curves(results: Path, trial_id: str) -> list[tuple]:
    epochs = read_table(results, "epochs").filter(pl.col("trial_id") == trial_id)
    return [tuple(e[c] for c in CURVE) for e in epochs.iter_rows(named=True)]


def _recorded(events: list, member: int) -> list[tuple]:
    """One member's epoch records as curve rows, as the stage writes them (a member that diverged has none)."""
    return [tuple(r.member_row(member)[c] for c in CURVE) for r in events
            if isinstance(r, EpochRecord) and r.active[member]]


def test_a_solo_trial_emits_events_equal_to_its_rows(tmp_path: Path) -> None:
    """A two-network trial (Co-teaching): two warm starts and a method stage of one member each; every epoch's event
    carries the very values of the epochs table (epoch 0 too), and the stages start and end in order."""
    from bench.exec.trainer import run_trial

    config = TrialConfig("synthetic", "coteaching", "case3", 0.3, seed=1, epochs=3, epochs_warmup=2)
    events: list = []
    run_trial(config, tmp_path, results=tmp_path, log=lambda line: None, events=events.append)
    assert _recorded(events, 0) == _curves(tmp_path, config.trial_id)
    assert len(_recorded(events, 0)) == 2 + 2 + 4
    assert [(e.stage, e.epochs, e.members) for e in events if isinstance(e, StageStart)] == [
        ("warmup", 2, 1), ("warmup1", 2, 1), ("method", 3, 1)]
    assert [(e.stage, e.epoch) for e in events if isinstance(e, StageEnd)] == [
        ("warmup", 2), ("warmup1", 2), ("method", 3)]
    assert [type(e).__name__ for e in events if e.stage == "method"] == [
        "StageStart", "EpochRecord", "EpochRecord", "EpochRecord", "EpochRecord", "StageEnd"]


def test_a_pack_emits_every_members_epochs_and_its_resume(tmp_path: Path) -> None:
    """A pack of three trials of two cells, killed after its second method epoch and run again: the packed warm
    start (two cells) and the method stage (three members) emit each member's values as its epochs table holds
    them (the warm start's as both its cells' trials hold them), and the second run says where it resumed."""
    from bench.exec.executors.pack import pack_id
    from bench.exec.pack import run_pack
    from bench.exec.packing import member_order
    from bench.store.folder import Checkpoints
    from tests.conftest import crashing_checkpoints

    configs = [TrialConfig("synthetic", m, "case3", 0.4, seed=s, epochs=4, epochs_warmup=2)
               for m, s in (("ce", 0), ("dmi", 0), ("dmi", 1))]
    first: list = []
    with pytest.raises(RuntimeError, match="node lost"):
        run_pack(configs, tmp_path, results=tmp_path, log=lambda line: None, events=first.append,
                 checkpoints=crashing_checkpoints(2)(tmp_path, pack_id(configs), lambda line: None))
    events: list = []
    run_pack(configs, tmp_path, results=tmp_path, log=lambda line: None, events=events.append,
             checkpoints=Checkpoints(tmp_path, pack_id(configs), lambda line: None))
    assert [(e.stage, e.epochs, e.members) for e in events if isinstance(e, StageStart)] == [
        ("warmup", 2, 2), ("method", 4, 3)]
    assert [e for e in events if isinstance(e, Resumed)] == [Resumed(stage="method", epoch=2)]
    # The method stage's epochs 0 and 1 come from the first run; epoch 2 was trained and checkpointed, and the crash
    # came before its event (as before its log line): its row comes from the checkpoint.
    assert [e.epoch for e in first if isinstance(e, EpochRecord) and e.stage == "method"] == [0, 1]
    order = member_order(configs)  # member m of the stack is configs[order[m]]
    warm = [e for e in events if isinstance(e, EpochRecord) and e.stage == "warmup"]
    method = [e for e in first if isinstance(e, EpochRecord) and e.stage == "method"] + [
        e for e in events if isinstance(e, EpochRecord) and e.stage == "method"]
    cells = {(c.noise, c.r, c.seed) for c in configs}
    assert len(cells) == 2 and all(e.members == 2 for e in warm)
    for m in range(3):
        curves = _curves(tmp_path, configs[order[m]].trial_id)
        assert [c[1] for c in curves if c[0] == "method"] == [0, 1, 2, 3, 4]
        assert _recorded(method, m) == [c for c in curves if c[0] == "method" and c[1] != 2]
        assert [c for c in curves if c[0] == "warmup"] in [_recorded(warm, 0), _recorded(warm, 1)]
    assert [e.epoch for e in method] == [0, 1, 3, 4]


def test_the_log_line_of_an_event_is_the_text_users_read() -> None:
    """The lines `run_stage` wrote before events existed, word for word, now formatted from the record."""
    solo = EpochRecord(stage="method", epoch=3, epochs=8, train_loss=(0.51234,), val_loss=(0.41236,),
                       val_acc=(88.14,), improved=(True,), active=(True,), seconds=1.23)
    assert log_line(solo) == "epoch 3/8  train 0.5123  val 0.4124  noisy val acc  88.1%  *  1.2s"
    warm = EpochRecord(stage="warmup1", epoch=2, epochs=5, train_loss=(0.6,), val_loss=(0.5,), val_acc=(71.0,),
                       improved=(False,), active=(True,), seconds=10.0)
    assert log_line(warm) == "warmup1 2/5  train 0.6000  val 0.5000  noisy val acc  71.0%  10.0s"
    pack = EpochRecord(stage="method", epoch=2, epochs=8, train_loss=(1.0,) * 12,
                       val_loss=(float("nan"), 0.2, 0.35, *[0.3] * 9), val_acc=(50.0,) * 12,
                       improved=(True,) * 5 + (False,) * 7, active=(False,) + (True,) * 11, seconds=0.04)
    assert log_line(pack) == ("method 2/8  11 of 12 members training, 5 improved; val loss min 0.2000 max 0.3500  "
                              "0.0s")
    initial = EpochRecord(stage="method", epoch=0, epochs=8, train_loss=(None,) * 9,
                          val_loss=tuple(0.1 * i for i in range(9)), val_acc=(None,) * 9, improved=(True,) * 9,
                          active=(True,) * 9, seconds=0.0)
    assert log_line(initial) == ("method: epoch 0 (initial state) val loss 0.0000 0.1000 0.2000 0.3000 0.4000 "
                                 "0.5000 0.6000 0.7000 ...")
    assert log_line(Resumed(stage="method", epoch=4)) == "resumed from the checkpoint of epoch 4"
    assert log_line(StageStart(stage="method", epochs=8, members=12)) is None
    assert log_line(StageEnd(stage="method", epoch=8, seconds=3.0)) is None


def _record(stage: str, epoch: int, val_loss: tuple, val_acc: tuple | None = None) -> EpochRecord:
    k = len(val_loss)
    return EpochRecord(stage=stage, epoch=epoch, epochs=3, train_loss=(1.0,) * k, val_loss=val_loss,
                       val_acc=val_acc or (60.0,) * k, improved=(True,) * k, active=(True,) * k, seconds=0.1)


def _reported(events: list) -> tuple[list[dict], int]:
    """The progress records of a unit that emitted `events`, and the work its closing report carries."""
    records: list[dict] = []
    reporter = UnitReporter(records.append, every=0.0)
    reporter.start()
    for event in events:
        reporter.event(event)
    return records, reporter.final()["work"]


def test_the_reporter_counts_an_epoch_once_per_member_of_its_stage() -> None:
    """Solo: an epoch is one trial-epoch. A packed warm start of two cells and a method stage of three members:
    two and three. A resumed stage counts the epochs its checkpoint holds, per member. Epoch 0 trains nothing."""
    solo = [StageStart("warmup", 2, 1), _record("warmup", 1, (0.5,), (70.0,)), _record("warmup", 2, (0.4,), (71.0,)),
            StageStart("method", 3, 1), _record("method", 0, (0.45,)), _record("method", 1, (0.3,), (80.0,))]
    records, work = _reported(solo)
    assert work == 3
    assert records[0]["stage"] == "loading data" and records[-1]["work"] == 3
    assert {k: records[-1][k] for k in ("stage", "epoch", "epochs", "val_loss", "val_acc")} == dict(
        stage="method", epoch=1, epochs=3, val_loss=0.3, val_acc=80.0)

    pack = [StageStart("warmup", 2, 2), _record("warmup", 1, (0.6, 0.5)), _record("warmup", 2, (0.5, 0.4)),
            StageStart("method", 3, 3), _record("method", 0, (0.5, 0.4, 0.3)),
            _record("method", 1, (float("nan"), 0.35, 0.25))]
    records, work = _reported(pack)
    assert work == 2 + 2 + 3
    assert (records[-1]["val_loss"], records[-1]["val_acc"]) == (0.25, None)  # the members' lowest; no accuracy
    assert [r["work"] for r in records] == [0, 0, 2, 4, 4, 4, 7]

    resumed = [StageStart("method", 3, 3), Resumed("method", 2), _record("method", 3, (0.5, 0.4, 0.3))]
    records, work = _reported(resumed)
    assert work == 2 * 3 + 3
    assert [(r["stage"], r["epoch"], r["work"]) for r in records[1:]] == [
        ("method", 0, 0), ("method", 2, 6), ("method", 3, 9)]


def test_a_real_solo_trial_and_a_pack_report_the_work_the_plan_counts(tmp_path: Path) -> None:
    """The reporter fed by real stages (two trials of one warm-start cell solo, the second from the cache; then
    the same two as a pack): the work each reports adds up to the plan's trial-epochs, and every trained epoch's
    noisy-validation loss is reported as the epochs table records it."""
    from bench.exec.pack import run_pack
    from bench.exec.trainer import run_trial
    from bench.exec.warmstart import WarmStartCache

    configs = [TrialConfig("synthetic", m, "case3", 0.4, seed=0, epochs=3, epochs_warmup=2) for m in ("ce", "dmi")]
    plan = Plan(experiment=None, trials=configs, results=str(tmp_path)).work(configs)
    cache, work = WarmStartCache(str(tmp_path / "solo")), 0
    for config in configs:
        events: list = []
        run_trial(config, tmp_path, results=tmp_path / "solo", log=lambda line: None, warm_cache=cache,
                  events=events.append)
        records, done = _reported(events)
        curves = [c for c in _curves(tmp_path / "solo", config.trial_id) if c[1] > 0]
        if config.method == "dmi":  # the cell's warm start came from the cache: its epochs are CE's
            curves = [c for c in curves if c[0] == "method"]
        assert [(r["stage"], r["epoch"], r["val_loss"]) for r in records if r["epoch"]] == [
            (c[0], c[1], c[3]) for c in curves]
        work += done
    assert work == plan["method_epochs"] + plan["warm_epochs"] == 3 + 3 + 2

    events = []
    run_pack(configs, tmp_path, log=lambda line: None, events=events.append)
    records, done = _reported(events)
    assert [(r["stage"], r["epoch"]) for r in records if r["epoch"]] == [
        ("warmup", 1), ("warmup", 2), ("method", 1), ("method", 2), ("method", 3)]
    assert all(r["val_acc"] is None for r in records if r["epoch"] and r["stage"] == "method")
    assert done == plan["method_epochs"] + plan["warm_epochs"] == 2 * 3 + 2


def test_the_eta_counts_the_work_of_trials_in_flight() -> None:
    """Nothing finished yet, 25 of 100 trial-epochs done in the 50 s since the first unit reported (Ray took 30 s
    to start): 75 left at 0.5 per second."""
    tally = Tally(total=4, work_total=100)
    tally.started -= 80.0
    tally.progress("a", {"work": 0})
    tally.working_since -= 50.0
    assert tally.eta() is None
    tally.progress("a", {"work": 1})  # under 2% of the work: no pace yet
    assert tally.eta() is None
    tally.progress("a", {"work": 20})
    tally.progress("b", {"work": 5})
    assert tally.eta() == pytest.approx(150.0, rel=0.01)
    tally.running.pop("a")
    tally.done, tally.work_finished = 1, 20  # a's trial landed: the same work, the same ETA
    assert tally.eta() == pytest.approx(150.0, rel=0.01)


def _trial(unit: str, status: str = "RUNNING") -> SimpleNamespace:
    return SimpleNamespace(config={"unit": unit}, status=status, last_result={})


def test_the_status_shows_each_unit_in_flight_as_lines_or_a_live_table() -> None:
    units = {"t1": Unit("solo", (TrialConfig("synthetic", "dmi", "case3", 0.4, seed=1, lr=1e-3),)),
             "t2": Unit("solo", (TrialConfig("synthetic", "ce", "case3", 0.0, seed=0),))}
    tally = Tally(total=2, work_total=10)
    tally.running = {"t1": dict(stage="warmup", epoch=3, epochs=5, val_loss=0.41234, val_acc=88.14, work=3)}
    lines: list[str] = []
    board = StatusBoard(lines.append, every=0.0)
    board.tick(tally, units, [_trial("t1"), _trial("t2", "PENDING")])
    assert len(lines) == 1
    assert re.search(r"0/2 trials done, 1 running, 1 waiting; elapsed \dm\d\ds, ETA \dm\d\ds", lines[0])
    assert "dmi lr=0.001  case3 r=0.4 seed=1: warmup 3/5  val loss 0.4123 (acc 88.1%)" in lines[0]
    assert describe_progress(dict(stage="method", epoch=2, epochs=8, val_loss=0.2, val_acc=None)) == \
        "method 2/8  best val loss 0.2000"

    screen = io.StringIO()
    live = StatusBoard(lines.append, live=True, stream=screen)
    live.last = 0.0
    live.tick(tally, units, [_trial("t1"), _trial("t2")])
    table = screen.getvalue().splitlines()
    assert len(table) == 3 and "2 running" in table[0] and "starting" in table[2]
    live.line("[1/2] ok ...")  # a finished line goes above the table: the table is erased first
    assert screen.getvalue().endswith("\x1b[3F\x1b[J[1/2] ok ...\n")


def test_a_rejected_pack_is_one_line(tmp_path: Path) -> None:
    """A worker's check refuses a whole pack: one line for the pack, not one per member; its members count."""
    pack = Unit("pack", tuple(TrialConfig("synthetic", "ce", "case3", 0.1 * i, seed=0) for i in range(3)))
    ids = [t.trial_id for t in pack]
    tally = Tally(total=3)
    lines: list[str] = []
    callback = make_callback(tally, str(tmp_path), {"pack-1": pack}, StatusBoard(lines.append))
    mirror = SimpleNamespace(logged=[], log_row=lambda row, epochs: mirror.logged.append(row["trial_id"]) or True,
                             ok=True)
    writer = MirrorWriter(tally, str(tmp_path), lambda: mirror)
    mlflow = make_mlflow_callback(writer, {"pack-1": ids})
    trial = _trial("pack-1", "TERMINATED")
    trial.last_result = {"unit": "pack-1", "status": "rejected", "error": "no CUDA"}
    callback.on_trial_complete(0, [trial], trial)
    mlflow.on_trial_complete(0, [trial], trial)
    assert writer.close(60)
    assert sum("bench: error: no CUDA" in line for line in lines) == 1
    assert "pack of 3 (3 ce)" in lines[0] and tally.done == 3 and sorted(tally.rejected) == sorted(ids)
    assert mirror.logged == [] and tally.mlflow_logged == 0


def test_the_mlflow_callback_mirrors_each_row_a_unit_wrote(tmp_path: Path) -> None:
    """A pack of three ended; two of its members wrote rows (the third died first): two runs mirrored and counted
    for the summary, with each trial's curves. Ray Tune's LoggerCallback calls it on completion and on error alike."""
    rows = [make_row("dmi", 0.4, seed, 0.5, 70.0 + seed) for seed in (0, 1)]
    write(tmp_path, rows)
    ids = [r["trial_id"] for r in rows] + ["died"]
    tally = Tally(total=3)
    logged: list[tuple[str, int]] = []
    mirror = SimpleNamespace(log_row=lambda row, epochs: logged.append((row["trial_id"], epochs.height)) or True,
                             ok=True)
    writer = MirrorWriter(tally, str(tmp_path), lambda: mirror)
    mlflow = make_mlflow_callback(writer, {"pack-1": ids})
    trial = _trial("pack-1", "ERROR")
    mlflow.on_trial_error(0, [trial], trial)
    assert writer.close(60)  # the writer's thread logged what the callback handed it
    assert logged == [(ids[0], 1), (ids[1], 1)] and tally.mlflow_logged == 2
    lines: list[str] = []
    print_summary(SimpleNamespace(name="m"), Plan(experiment=None, trials=[], results=str(tmp_path)), tally,
                  SimpleNamespace(uri="sqlite:///x.db", ok=True, embedded=True), lines.append)
    assert "MLflow: 2 runs logged to sqlite:///x.db (experiment m)" in "\n".join(lines)


# -- a grid on a local Ray with a GPU that torch cannot see ---------------------------------------------------------
@pytest.fixture
def fake_gpu_ray():
    """A local Ray that believes it has one GPU (stopped by this process; never `ray stop`)."""
    import ray

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if ray.is_initialized():
        pytest.skip("another test's Ray is running in this process")

    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    yield ray
    ray.shutdown()


def test_no_cuda_here_names_the_fix_of_bench_run(fake_gpu_ray, tmp_path: Path) -> None:
    """Locally the driver refuses before anything trains; on a cluster (here: Ray already running, as
    `--address` finds it) each pack is refused once, by its worker. Both name `--gpus-per-trial 0`, a flag of
    `bench run`, not `bench trial`'s `--device cpu`."""
    config = write_config(tmp_path, name="cuda", device="cuda", resources={"cpu": 1, "gpu": 0.25})
    with pytest.raises(UserError, match=r"torch sees no CUDA device.*--gpus-per-trial 0"):
        run_experiment(load_experiment(config), Settings(results=str(tmp_path / "local"), data_root=tmp_path,
                                                         mlflow=False), lambda line: None)
    assert read_table(tmp_path / "local").is_empty()

    lines: list[str] = []
    tally = run_experiment(load_experiment(config), Settings(results=str(tmp_path / "cluster"), data_root=tmp_path,
                                                             mlflow=False, address="cluster", pack=4), lines.append)
    errors = [line for line in lines if "bench: error:" in line]
    assert len(errors) == 2  # two packs of 4 (two warm-start cells of two trials each)
    assert all("--gpus-per-trial 0" in e and "--device cpu" not in e for e in errors)
    assert len(tally.rejected) == 8 and read_table(tmp_path / "cluster").is_empty()


# -- live progress end to end ---------------------------------------------------------------------------------------
def test_a_grid_shows_its_units_in_flight_before_the_first_trial_ends(ray_session, tmp_path: Path) -> None:
    """Status lines while the first trials train (their stage, epoch and validation loss), an override that
    renames the grid, and the folder keeping the changed grid as a file that `bench run` takes as it is."""
    # One seed: its two trials start at once on the module's two CPUs, as the first two of a larger grid would; more
    # seeds only queued trials behind the first to end.
    config = write_config(tmp_path, name="live", epochs=40, epochs_warmup=20, seeds=[0])
    exp = load_experiment(config, overrides=Overrides(sets=("r=[0.3]",), methods="dmi,ce"))
    results = tmp_path / "results"
    lines: list[str] = []
    # Every epoch line is reported (report_every=0): the test does not race the machine's speed against the
    # default 2 s between reports.
    tally = run_experiment(exp, Settings(results=str(results), data_root=tmp_path, mlflow=False, status_every=0.3,
                                         report_every=0.0), lines.append)
    assert tally.done == 2 and exp.name.startswith("live-")
    first_done = next(i for i, line in enumerate(lines) if line.startswith("[1/2]"))
    early = [line for line in lines[:first_done] if line.startswith("status:")]
    assert any(re.search(r"(warmup|method) \d+/(20|40)  val loss \d\.\d{4} \(acc \d+\.\d%\)", line) for line in early)
    assert any("logs in" in line and str(results / "logs") in line for line in lines[:first_done])

    kept = load_experiment(results / f"{exp.name}.yaml")
    assert kept.name == exp.name
    assert sorted(t.trial_id for t in kept.trials()) == sorted(read_table(results)["trial_id"])


# -- one data variable, the offline shortcut, download progress ----------------------------------------------------
def test_the_tests_read_real_data_from_bench_data(tmp_path: Path) -> None:
    code = "from tests import conftest; print(conftest.SHARED_DATA)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "BENCH_DATA": str(tmp_path)}, check=True)
    assert out.stdout.strip() == str(tmp_path)


def test_an_offline_download_names_the_readme_shortcut(tmp_path: Path, monkeypatch) -> None:
    from bench.datasets.fashion_mnist import FashionMNIST

    monkeypatch.setattr(FashionMNIST, "urls", {(tmp_path / "nowhere.gz").as_uri(): "raw/x.gz"})
    with pytest.raises(UserError) as info:
        FashionMNIST(tmp_path / "root").download()
    assert "BENCH_DATA=/path/to/data make demo" in str(info.value) and "--data-root" in str(info.value)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_download_progress_is_a_bar_on_a_terminal_and_tenths_elsewhere() -> None:
    from bench.download import DownloadProgress

    log = io.StringIO()
    show = DownloadProgress("x.gz", 100_000_000, stream=log)
    for _ in range(100):
        show.add(1_000_000)
    show.close()
    lines = log.getvalue().splitlines()
    assert [int(re.search(r"(\d+)%", line)[1]) for line in lines] == [1, *range(10, 101, 10)]

    screen = _Terminal()
    show = DownloadProgress("x.gz", 4_000_000, stream=screen)
    show.add(3_000_000)
    assert screen.getvalue() == "\rdownloading x.gz [######################        ]  75% 3.0 of 4.0 MB"


# -- one rounding, intervals within [0, 100] ------------------------------------------------------------------------
def test_the_summary_states_only_the_rows_that_were_written(tmp_path: Path) -> None:
    """Two failed trials: one wrote its failure row, one died before writing any. The summary says one keeps a row
    and one wrote none (it said two rows were kept)."""
    trials = [TrialConfig("synthetic", "dmi", "case3", 0.4, seed=s) for s in (0, 1)]
    kept = {**make_row("dmi", 0.4, 0, 0.5, 70.0), "trial_id": trials[0].trial_id, "status": "failed",
            "error": "boom"}
    write(tmp_path, [kept])
    tally, lines = Tally(total=2), []
    progress = RunProgress(tally, str(tmp_path), {"u1": Unit("solo", (trials[0],)), "u2": Unit("solo", (trials[1],))},
                           SimpleNamespace(line=lines.append))
    progress._finish_trial(trials[0].trial_id, {}, errored=False, size=1, unit="u1")
    progress._finish_trial(trials[1].trial_id, {}, errored=True, size=1, unit="u2")
    exp = SimpleNamespace(name="lost")
    print_summary(exp, Plan(experiment=exp, trials=trials, results=str(tmp_path)), tally, None,
                  lines.append)
    summary = "\n".join(lines)
    assert tally.statuses["failed"] == 2
    assert "1 failed trials keep a row" in summary and "1 trials ended without writing a row" in summary


def test_the_run_summary_and_the_leaderboard_round_alike(tmp_path: Path, capsys) -> None:
    """98.44 and 98.47: a mean stored as 98.45499... Both print 98.45 (polars' round said 98.46)."""
    rows = [make_row("dmi", 0.4, s, 0.5, acc) for s, acc in ((0, 98.44), (1, 98.47))]
    write(tmp_path, rows)
    mean = float(np.mean([98.44, 98.47]))
    assert f"{mean:.2f}" == "98.45"
    lines: list[str] = []
    exp = SimpleNamespace(name="round")
    trials = [SimpleNamespace(trial_id=r["trial_id"]) for r in rows]
    print_summary(exp, Plan(experiment=exp, trials=trials, results=str(tmp_path)), Tally(total=2), None,
                  lines.append)
    table = "\n".join(lines)
    assert "98.45" in table and "98.46" not in table
    capsys.readouterr()
    assert cli.main(["leaderboard", str(tmp_path)]) == 0
    board = capsys.readouterr().out
    assert "98.45 ± 0.02" in board and "98.46" not in board


def test_accuracy_intervals_stay_within_0_and_100_and_need_three_seeds(tmp_path: Path) -> None:
    from bench.report.build import build_report

    accs = [99.9, 99.0, 100.0]
    rows = [make_row("ce", 0.2, s, 0.5, a) for s, a in enumerate(accs)]
    rows += [make_row("ce", 0.4, s, 0.5, a) for s, a in ((0, 60.0), (1, 90.0))]
    write(tmp_path, rows)
    grid = analysis.aggregate(analysis.load_trials(tmp_path))
    three = grid.filter(r=0.2).row(0, named=True)
    low, high = stats.t.interval(0.95, 2, loc=np.mean(accs), scale=np.std(accs, ddof=1) / math.sqrt(3))
    assert high > 100 and three["acc_ci_high"] == 100.0
    assert three["acc_ci_low"] == pytest.approx(low, rel=1e-12)
    two = grid.filter(r=0.4).row(0, named=True)
    assert two["acc_ci_low"] is None and two["acc_ci_high"] is None
    html = build_report(tmp_path, tmp_path / "report", log=lambda s: None)["report.html"].read_text()
    assert "n = 2: too few seeds for an interval" in html
    assert not re.search(r"\[\d+\.\d\d, (10[1-9]|1[1-9]\d)\.\d\d\]", html)


# -- overrides ------------------------------------------------------------------------------------------------------
def test_overrides_make_the_grid_a_file_would_and_name_it(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    over = Overrides(sets=("r=[0.2,0.4]", "methods.dmi.lr=1e-5"), methods="dmi,ce", seeds="0,1,2")
    exp = load_experiment(config, overrides=over)
    (tmp_path / "hand").mkdir()
    by_hand = write_config(tmp_path / "hand", r=[0.2, 0.4], seeds=[0, 1, 2], methods={"dmi": {"lr": 1e-5}, "ce": {}})
    assert sorted(t.trial_id for t in exp.trials()) == sorted(t.trial_id for t in load_experiment(by_hand).trials())
    assert re.fullmatch(r"syn-[0-9a-f]{8}", exp.name) and all(t.experiment == exp.name for t in exp.trials())
    # The same grid written another way has the same name; a change that trains nothing differently keeps the name.
    again = Overrides(sets=("methods.dmi.lr=1.0e-05", "r=[0.4, 0.2]", "seeds=[2,1,0]", "methods={dmi: {lr: 1e-5}, "
                            "ce: {}}"))
    assert load_experiment(config, overrides=again).name == exp.name
    assert load_experiment(config, overrides=Overrides(sets=("description=again", "max_concurrent=1"))).name == "syn"
    # Two CPUs a trial are two intra-op threads: another float order, other trial ids, a grid of its own (#53).
    assert load_experiment(config, overrides=Overrides(sets=("resources.cpu=2",))).name != "syn"
    assert load_experiment(config, overrides=Overrides(sets=("name=mine", "r=0.1"))).name == "mine"
    grown = load_experiment(config, overrides=Overrides(sets=("name=syn",), seeds="0,1,2"))  # grows the file's grid
    assert grown.name == "syn" and grown.text


@pytest.mark.parametrize("flags, message", [
    (["--set", "r=[0.2,1.5]"], "with --set r=[0.2,1.5]: r: must be a finite number in [0, 1], got 1.5"),
    (["--set", "epoch=3"], "epoch: unknown key 'epoch' (did you mean 'epochs'?)"),
    (["--set", "methods.dmi.lr=fast"], "methods.dmi.lr: expected a number, got 'fast' (str)"),
    (["--set", "methods.gce.qq=2"], "methods.gce.qq: unknown setting of gce: 'qq' (did you mean 'q'?)"),
    (["--set", "r"], "--set 'r': expected KEY=VALUE"),
    (["--set", "r=[0.2"], "--set r=[0.2: the value is not valid YAML"),
    (["--methods", "dmi,,ce"], "--methods 'dmi,,ce': expected distinct method names"),
    (["--methods", "dmii"], "unknown method 'dmii' (did you mean 'dmi'?)"),
    (["--seeds", "0,x"], "seeds: expected an integer >= 0 and <= 9,007,199,254,740,991, got 'x' (str)"),
])
def test_a_bad_override_is_one_line_exit_2_nothing_written(tmp_path: Path, capsys, flags, message) -> None:
    config = write_config(tmp_path)
    results = tmp_path / "results"
    assert cli.main(["run", str(config), "--results", str(results), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not results.exists()


# -- version, MLflow run names, `bench results`, leaderboard --metric ----------------------------------------------
def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"bench {bench.__version__}" == \
        f"bench {importlib.metadata.version('bench-ldmi')}"


def test_mlflow_run_names_tell_two_cells_apart() -> None:
    from bench.store.mirror import run_name

    a, b = (make_row("dmi", r, 0, 0.5, 80.0) for r in (0.2, 0.4))
    assert run_name(a) != run_name(b)
    assert "pos_to_neg r=0.2 seed=0" in run_name(a)


def test_bench_results_fits_a_terminal(tmp_path: Path, capsys) -> None:
    """The compact table (`--wide`, every column, is held by tests/cli/test_honest_exits.py)."""
    write(tmp_path, [make_row(m, r, s, 0.5, 70.0 + s) for m in ("ce", "dmi") for r in (0.2, 0.4) for s in (0, 1)])
    assert cli.main(["results", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + 8 + 1 and max(map(len, lines)) <= 100
    assert lines[0].split() == ["trial", "method", "noise", "r", "seed", "lr", "bs", "status", "sel", "ep", "test",
                                "%", "last", "%", "wall", "s"]
    assert "dataset mr" in lines[-1]


def test_leaderboard_metric_is_selected_and_best_is_refused_with_a_hint(tmp_path: Path, capsys) -> None:
    write(tmp_path, [make_row("dmi", 0.4, s, 0.5, 70.0 + s, last=60.0) for s in (0, 1)])
    assert cli.main(["leaderboard", str(tmp_path), "--metric", "selected"]) == 0
    assert "70.50 ± 0.71" in capsys.readouterr().out
    assert cli.main(["leaderboard", str(tmp_path), "--metric", "last"]) == 0
    assert "60.00 ± 0.00" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        cli.main(["leaderboard", str(tmp_path), "--metric", "best"])
    assert info.value.code == 2
    assert "'best' is now called 'selected'" in capsys.readouterr().err


def test_first_status_comes_within_seconds() -> None:
    """Off a terminal the first status line comes 10 s after the start, then every `every` seconds."""
    lines: list[str] = []
    board = StatusBoard(lines.append, every=30.0)
    tally = Tally(total=1)
    board.tick(tally, {}, [])
    assert lines == []
    board.last -= 10.0
    board.tick(tally, {}, [])
    assert len(lines) == 1
    board.tick(tally, {}, [])
    assert len(lines) == 1  # not again within `every`
    board.last -= 30.0
    board.tick(tally, {}, [])
    assert len(lines) == 2
