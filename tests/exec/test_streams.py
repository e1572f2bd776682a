"""The streams executor (bench.exec.executors.streams): K solo trials in threads of one process, taking turns after
each optimiser step. On a CPU each member's row and curves are bit-equal to its solo trial's in the same process
(tests/tolerances.py: the same computation at the same thread count), for a unit mixing methods (one network, two,
one that draws from torch's global generator every step) and seeds; warm starts of one cell train once; a member's
deterministic error is its own failed row, an error a retry may cure ends the unit, which then resumes each member
from its own checkpoint; the planner picks the kind where the executor table names it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
import yaml

import bench.exec.executors.streams as streams
from bench.config import UserError
from bench.exec.events import StageStart
from bench.exec.executor import UnitContext, get_executor
from bench.exec.prepare import prepare
from bench.exec.stage import Stopped, Turns
from bench.exec.trainer import run_trial
from bench.exec.warmstart import WarmStartCache
from bench.grid.plan import plan_units
from bench.methods import get_method
from bench.store.folder import Checkpoints
from bench.trial import TrialConfig
from tests.conftest import crashing_checkpoints
from tests.tolerances import trained_close

# What a second run of one trial changes: its timings and when it finished.
# What differs between a member's row and its solo trial's: the clock, and the kind of unit that trained it.
CHANGES = {"wall_s", "warmup_s", "method_s", "device_s", "diagnostics_s", "pack_wall_s", "finished_at", "executor"}
QUIET = dict(log=lambda s: None)


def config(method: str, seed: int, epochs: int = 2, r: float = 0.3) -> TrialConfig:
    return TrialConfig("synthetic", method, "case3", r, seed=seed, epochs=epochs, epochs_warmup=1)


# fdiv draws its pairings from torch's global generator at every step: it parts from its solo trial unless the
# members' generator states are exchanged at each hand-over.
MIXED = [config("ce", 0), config("dmi", 1), config("coteaching", 0), config("fdiv", 1), config("dmi", 0)]


def within(seconds: float, run: Any) -> Any:
    """`run()`, failing the test where it takes longer than `seconds` (a deadlock)."""
    out: dict[str, Any] = {}

    def call() -> None:
        try:
            out["value"] = run()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: a deadlock?"
    if "error" in out:
        raise out["error"]
    return out["value"]


def unit(trials: list[TrialConfig], results: Path | None = None, **ctx: Any) -> list[dict[str, Any]]:
    context = UnitContext("unused", results=results, **{**QUIET, **ctx})
    return within(300, lambda: get_executor("streams").run(trials, context))


def same_row(got: dict[str, Any], want: dict[str, Any]) -> bool:
    return {k: v for k, v in got.items() if k not in CHANGES} == {k: v for k, v in want.items() if k not in CHANGES}


def curves(results: Path, trial: TrialConfig) -> pl.DataFrame:
    return pl.read_parquet(results / "epochs" / f"{trial.trial_id}.parquet").drop("seconds")


def assert_bit_equal(results: Path, want: Path, trials: list[TrialConfig]) -> None:
    for t in trials:
        got_row = pl.read_parquet(results / "trials" / f"{t.trial_id}.parquet").row(0, named=True)
        want_row = pl.read_parquet(want / "trials" / f"{t.trial_id}.parquet").row(0, named=True)
        assert same_row(got_row, want_row), t.method
        assert curves(results, t).equals(curves(want, t)), t.method


def test_each_member_is_bit_equal_to_its_solo_trial(tmp_path: Path) -> None:
    solo = [run_trial(t, "unused", results=tmp_path / "solo", **QUIET) for t in MIXED]
    lines: list[str] = []
    events: list[Any] = []
    rows = unit(MIXED, tmp_path / "unit", log=lines.append, events=events.append)
    assert [r["trial_id"] for r in rows] == [t.trial_id for t in MIXED]
    for got, want in zip(rows, solo, strict=True):
        assert got["status"] == "ok" and same_row(got, want), got["method"]
        assert (got["executor"], want["executor"]) == ("streams", "solo")
    assert_bit_equal(tmp_path / "unit", tmp_path / "solo", MIXED)
    # Each member's lines carry its index; its events come through as they are, one method stage each.
    assert {line.split(" ")[0] for line in lines} == {f"[m{m}]" for m in range(len(MIXED))}
    assert [e.stage for e in events if isinstance(e, StageStart)].count("method") == len(MIXED)
    # The members took turns: the second member's first line comes before the first member's last.
    assert lines.index(next(x for x in lines if x.startswith("[m1]"))) < max(
        i for i, x in enumerate(lines) if x.startswith("[m0]"))


def test_without_the_exchange_of_random_states_a_member_parts_from_its_solo_trial(monkeypatch) -> None:
    """The check above sees the exchange: without it, the member drawing from torch's generator moves."""
    trials = [config("fdiv", 1), config("ce", 0)]
    solo = run_trial(trials[0], "unused", **QUIET)
    assert same_row(unit(trials)[0], solo)
    monkeypatch.setattr(streams, "set_rng_states", lambda states, device: None)
    assert not same_row(unit(trials)[0], solo)


def test_members_of_one_cell_train_its_warm_start_once(tmp_path: Path) -> None:
    """Three members of one cell: one trains the warm start, the two others wait their turns and read it."""
    cell = [config(m, 2) for m in ("ce", "dmi", "gce")]
    cache = WarmStartCache(tmp_path, log=lambda s: None)
    lines: list[str] = []
    rows = unit(cell, tmp_path, log=lines.append, warm_cache=cache)
    assert [r["status"] for r in rows] == ["ok"] * 3
    assert (cache.misses, cache.hits) == (1, 2)
    assert sum("warm start done" in line for line in lines) == 3
    assert sum(line.split(" ", 1)[1].startswith("warmup 1/1") for line in lines) == 1
    solo = [run_trial(t, "unused", **QUIET) for t in cell]  # each training its own warm start
    assert all(same_row(got, want) for got, want in zip(rows, solo, strict=True))


def test_a_member_that_fails_is_its_failed_row_and_the_others_go_on(tmp_path: Path, monkeypatch) -> None:
    trials = [config("ce", 0), config("gce", 1), config("dmi", 1)]
    solo = [run_trial(t, "unused", **QUIET) for t in trials]
    gce = get_method("gce")

    def boom(self: Any, nets: Any, batch: Any) -> Any:
        raise ValueError("boom")

    monkeypatch.setattr(gce, "train_loss", boom)
    rows = unit(trials, tmp_path, checkpoints=Checkpoints(tmp_path, "unit", lambda s: None))
    assert [r["status"] for r in rows] == ["ok", "failed", "ok"]
    assert rows[1]["error"] == "ValueError: boom" and rows[1]["trial_id"] == trials[1].trial_id
    assert same_row(rows[0], solo[0]) and same_row(rows[2], solo[2])
    assert not list((tmp_path / "checkpoints").glob("*.pt"))


def test_bad_input_of_one_member_is_raised_after_the_others_finished(tmp_path: Path, monkeypatch) -> None:
    trials = [config("ce", 0), config("gce", 1)]
    monkeypatch.setattr(get_method("gce"), "train_loss", lambda self, nets, batch: (_ for _ in ()).throw(
        UserError("no such file")))
    with pytest.raises(UserError, match="no such file"):
        unit(trials, tmp_path)
    assert pl.read_parquet(tmp_path / "trials" / f"{trials[0].trial_id}.parquet")["status"].to_list() == ["ok"]


def test_a_retry_resumes_each_member_from_its_own_checkpoint(tmp_path: Path, monkeypatch) -> None:
    """A member loses its node right after its epoch-2 checkpoint: the others stop at their next turn, the unit
    raises what Ray retries, and the retried unit resumes each member from its own last epoch (taking the row of the
    member that had finished): rows and curves as an uninterrupted unit's."""
    trials = [config("ce", 0, epochs=1), config("dmi", 1, epochs=4), config("fdiv", 1, epochs=4),
              config("coteaching", 0, epochs=4)]
    victim = trials[1].trial_id
    crashing = crashing_checkpoints(2)

    class LoseNode(crashing):  # the victim's save at epoch 2 loses the node; the others' saves go through
        def save(self, state: dict[str, Any]) -> None:
            try:
                super().save(state)
            except RuntimeError as e:
                if self.path.endswith(f"{victim}.pt"):
                    raise ConnectionError(str(e)) from None

    uninterrupted = unit(trials, tmp_path / "once", checkpoints=Checkpoints(tmp_path / "once", "u", print))
    results = tmp_path / "retried"
    monkeypatch.setattr(streams, "Checkpoints", LoseNode)
    with pytest.raises(ConnectionError, match="node lost"):
        unit(trials, results, checkpoints=Checkpoints(results, "u", print))
    statuses = {p.stem: pl.read_parquet(p)["status"][0] for p in (results / "trials").glob("*.parquet")}
    assert statuses == {trials[0].trial_id: "ok", victim: "failed"}  # the others stopped without a row
    assert {p.stem for p in (results / "checkpoints").glob("*.pt")} >= {victim}
    monkeypatch.setattr(streams, "Checkpoints", Checkpoints)
    lines: list[str] = []
    rows = unit(trials, results, log=lines.append, checkpoints=Checkpoints(results, "u", print))
    assert "[m1] resumed from the checkpoint of epoch 2" in lines
    assert any(line.startswith("[m0] trial") and "earlier attempt" in line for line in lines)
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert_bit_equal(results, tmp_path / "once", trials)
    assert all(same_row(a, b) for a, b in zip(rows[1:], uninterrupted[1:], strict=True))
    assert not list((results / "checkpoints").glob("*.pt"))


class Counting(Turns):
    """Counts the steps it is called after; raises `Stopped` at step `stop_at` (None: never)."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.steps, self.stop_at = 0, stop_at

    def after_step(self) -> None:
        self.steps += 1
        if self.steps == self.stop_at:
            raise Stopped


def test_a_trial_calls_the_turns_it_is_handed_after_each_step(tmp_path: Path) -> None:
    """The hook is passed down, not found: `run_trial` calls it after every optimiser step of its warm start and its
    method stage (floor(train / batch) steps an epoch: the last partial batch is dropped), and a trial it stops
    writes no row and raises `Stopped`, an ordinary Exception that `run_trial` lets through as it does `UserError`."""
    t = config("ce", 0, epochs=2)
    turns = Counting()
    run_trial(t, "unused", turns=turns, **QUIET)
    p = prepare(t, "unused", log=lambda s: None)
    warm, stage, n = p.warmup, p.method_stage, p.train.size
    assert turns.steps == n // warm.batch_size * warm.epochs + n // stage.batch_size * stage.epochs
    assert issubclass(Stopped, Exception)
    with pytest.raises(Stopped):
        run_trial(t, "unused", results=tmp_path, turns=Counting(stop_at=3), **QUIET)
    assert not (tmp_path / "trials").exists() or not list((tmp_path / "trials").glob("*.parquet"))


def test_one_rule_says_what_a_retry_cures_for_the_runner_and_the_streams_unit() -> None:
    """Ray's errors (by their module: the training core imports no Ray), a GPU out of memory, a dropped connection;
    not a bug, bad input or a full disk. A streams unit also ends on an interrupt."""
    import errno

    import ray.exceptions
    import torch

    from bench.exec.executor import retry_may_cure
    from bench.grid import runner

    cured = [ray.exceptions.RayActorError(), ray.exceptions.RaySystemError("lost"), torch.OutOfMemoryError("out"),
             ConnectionError("x"), ConnectionResetError("y")]
    not_cured = [ValueError("z"), RuntimeError("node lost"), UserError("bad"), OSError(errno.ENOSPC, "full")]
    assert [retry_may_cure(e) for e in cured + not_cured] == [True] * len(cured) + [False] * len(not_cured)
    assert [streams.ends_unit(e) for e in cured + not_cured] == [retry_may_cure(e) for e in cured + not_cured]
    assert streams.ends_unit(KeyboardInterrupt()) and not retry_may_cure(KeyboardInterrupt())
    assert runner.retry_may_cure is streams.retry_may_cure is retry_may_cure  # one home, called by both


def test_what_a_streams_unit_asks_for_and_how_it_is_named() -> None:
    ex = get_executor("streams")
    gpu = [TrialConfig("cifar10", m, "pairs", 0.2, seed=s, device="cuda") for m, s in (("ce", 0), ("dmi", 1),
                                                                                        ("dmi", 2))]
    assert ex.resources(gpu, 2.0, 0.25) == [{"CPU": 2.0, "GPU": 0.75}]
    assert ex.resources(gpu * 3, 2.0, 0.25) == [{"CPU": 2.0, "GPU": 1.0}]
    assert ex.resources(MIXED, 1.0, 0.0) == [{"CPU": 1.0, "GPU": 0.0}]
    assert ex.unit_id(gpu) == ex.unit_id(gpu[::-1]) != ex.unit_id(gpu[:2]) and ex.unit_id(gpu).startswith("streams-")
    assert ex.describe(gpu) == "streams of 3 (1 ce, 2 dmi)"
    assert all(ex.why_not(t) is None for t in gpu + MIXED)
    assert ex.group_key(gpu[0]) == ("cifar10", "resnet34_cifar", "cuda", "native", 1)  # one process: one float order


@pytest.mark.parametrize(("row", "trials", "sizes"), [
    ("*,cpu,streams,3", [config(m, s) for m in ("ce", "dmi", "gce") for s in range(2)], [3, 3]),
    ("resnet34_cifar,cuda,streams,4", [TrialConfig("cifar10", m, "pairs", 0.2, seed=s, device="cuda")
                                       for m in ("ce", "dmi") for s in range(4)], [4, 4]),
])
def test_the_planner_picks_streams_where_the_table_says(tmp_path: Path, monkeypatch, row: str,
                                                        trials: list[TrialConfig], sizes: list[int]) -> None:
    table = tmp_path / "table.csv"
    table.write_text(f"model,device,executor,trials,images_per_s,measured,source\n{row},,today,a test\n")
    monkeypatch.setenv("BENCH_EXECUTOR_TABLE", str(table))
    units = plan_units(trials, "auto")
    assert [(u.kind, len(u)) for u in units] == [("streams", n) for n in sizes]
    # Units hold whole warm-start cells: every method of a seed trains in one unit.
    methods = len({t.method for t in trials})
    assert all(len({t.seed for t in u}) * methods == len(u) for u in units)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_each_member_trains_on_a_stream_of_its_own_as_its_solo_trial(monkeypatch) -> None:
    """Each member's steps are launched on its own stream, none on the default one; its row is its solo trial's
    within the rounding of a training (TF32 off; the kernels may differ per stream)."""
    monkeypatch.setenv("BENCH_TF32", "0")
    trials = [TrialConfig("synthetic", m, "case3", 0.3, seed=s, epochs=2, epochs_warmup=1, device="cuda")
              for m, s in (("ce", 0), ("fdiv", 1), ("coteaching", 0))]
    seen: set[tuple[int, int]] = set()
    turn = streams.Baton.turn

    def turn_seen(self: streams.Baton, m: int) -> None:
        seen.add((m, torch.cuda.current_stream().cuda_stream))
        turn(self, m)

    monkeypatch.setattr(streams.Baton, "turn", turn_seen)
    try:
        solo = [run_trial(t, "unused", **QUIET) for t in trials]
        rows = unit(trials)
    finally:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    assert {m for m, _ in seen} == {0, 1, 2} and len(seen) == 3
    assert all(stream != torch.cuda.default_stream().cuda_stream for _, stream in seen)
    for got, want in zip(rows, solo, strict=True):
        assert got["status"] == want["status"] == "ok"
        assert got["noise_hash"] == want["noise_hash"] and trained_close(got["val_loss"], want["val_loss"])


def test_a_grid_runs_streams_units_through_ray(tmp_path: Path) -> None:
    """`bench run` on a local Ray with a table row naming streams: one unit of the cell's three trials, in one
    worker, its members' progress reported from their threads; each row its solo trial's (the worker's thread count
    may differ: within the rounding of a training)."""
    (tmp_path / "table.csv").write_text("model,device,executor,trials,images_per_s,measured,source\n"
                                        "*,cpu,streams,3,,today,a test\n")
    grid = dict(name="streams", dataset="synthetic", noise="case3", r=[0.2], seeds=[0], epochs=2, epochs_warmup=1,
                resources={"cpu": 1}, methods={"ce": {}, "dmi": {}, "fdiv": {}})
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(grid))
    env = {**os.environ, "BENCH_EXECUTOR_TABLE": str(tmp_path / "table.csv"), "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([str(Path(sys.executable).parent / "bench"), "run", str(tmp_path / "grid.yaml"), "--results",
                           str(tmp_path / "r"), "--no-mlflow", "--num-cpus", "2", "--data-root", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "streams units (--executor auto): 3 trials in 1 streams units of 3; 0 trials solo" in done.stdout
    rows = pl.read_parquet(tmp_path / "r" / "trials" / "*.parquet").to_dicts()
    assert sorted(r["status"] for r in rows) == ["ok"] * 3 and {r["executor"] for r in rows} == {"streams"}
    log = next((tmp_path / "r").rglob("streams-*.log")).read_text()
    assert {f"[m{m}] warm start done" in log for m in range(3)} == {True}
    for row in rows:
        solo = run_trial(TrialConfig("synthetic", row["method"], "case3", 0.2, seed=0, epochs=2, epochs_warmup=1),
                         "unused", **QUIET)
        assert solo["trial_id"] == row["trial_id"] and trained_close(solo["val_loss"], row["val_loss"])
