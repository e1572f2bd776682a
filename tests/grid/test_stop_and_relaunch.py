"""Fault injection, fourth round (issue #40): a grid stopped by a scheduler. SIGTERM (Slurm, Kubernetes, `timeout`)
and SIGINT (Ctrl-C) to a real `bench run` driver (real Ray, real parquet) end it with a summary that counts the rows
on disk and says how to resume, exit 143 / 130, and a relaunch gives the rows and curves of an uninterrupted run; a
second signal ends it at once. Each test fails on the code before that issue (SIGTERM: exit 1 or 134 and Ray's C++
stack dump; SIGINT: exit 1).

The runs a signal stops are real drivers in processes of their own; the uninterrupted run and the relaunches, which
no signal reaches, run in this process on the module's Ray (tests/conftest.py `ray_session`): one Ray start for all
of them, not one each. A unit sets its own thread count (`bench.grid.runner.ray_unit`), so their rows are the
subprocesses' rows."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
import yaml

from bench.cli.main import main
from tests.conftest import method_that_raises

BENCH = str(Path(sys.executable).parent / "bench")
# Four trials one at a time, long enough that a signal after the first row finds the second one training.
GRID = dict(name="stop", dataset="synthetic", noise="case3", r=[0.0, 0.2, 0.4, 0.6], seeds=[0], epochs=6,
            epochs_warmup=1, resources={"cpu": 1}, methods={"ce": {}})
# What differs between two runs of the same trial: timings, and which executor ran it.
CHANGES = {"wall_s", "warmup_s", "method_s", "device_s", "diagnostics_s", "pack_wall_s", "finished_at", "executor",
           "node_id"}  # node_id: each Ray start is a new node (bench.store.rows.ray_node_id)


def env() -> dict[str, str]:
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}


def command(config: Path, results: Path) -> list[str]:
    return [BENCH, "run", str(config), "--results", str(results), "--no-mlflow", "--num-cpus", "1",
            "--max-concurrent", "1"]


def rows_on_disk(results: Path) -> int:
    return len(list((results / "trials").glob("*.parquet")))


def kill_session(session: int) -> None:
    """Kill what is left of a session this test started (the leader's pid is the session id)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
    for line in out.splitlines():
        pid, sid = line.split()
        if int(sid) == session:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def interrupted_run(config: Path, results: Path, signals: list[int]) -> tuple[int, str, str, float]:
    """`bench run` in its own session; once its first row lands, `signals` to the driver alone, 0.3 s apart.
    Returns the exit status, stdout, stderr and the seconds from the first signal to the exit."""
    driver = subprocess.Popen(command(config, results), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True, env=env())
    try:
        deadline = time.monotonic() + 180
        while rows_on_disk(results) == 0 and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.1)
        assert rows_on_disk(results) > 0 and driver.poll() is None, "no row landed while the grid ran"
        sent = time.monotonic()
        for sig in signals:
            driver.send_signal(sig)
            time.sleep(0.3)
        out, err = driver.communicate(timeout=120)
        return driver.returncode, out, err, time.monotonic() - sent
    finally:
        driver.kill()
        kill_session(driver.pid)


def relaunch(config: Path, results: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The same `bench run` command again, in this process on the module's Ray, to its exit 0; its stdout."""
    capsys.readouterr()
    status = main(command(config, results)[1:])
    out, err = capsys.readouterr()
    assert status == 0, out + err
    return out


@pytest.fixture(scope="module")
def uninterrupted(ray_session, tmp_path_factory) -> tuple[Path, Path]:
    """The grid's config and the results of an uninterrupted run (in this process, on the module's Ray)."""
    where = tmp_path_factory.mktemp("whole")
    config = where / "grid.yaml"
    config.write_text(yaml.safe_dump(GRID, sort_keys=False))
    assert main(command(config, where / "results")[1:]) == 0
    return config, where / "results"


def assert_same_as(results: Path, want: Path) -> None:
    """Every row and every curve of `results` equals the uninterrupted run's, timings aside."""
    names = sorted(p.name for p in (want / "trials").glob("*.parquet"))
    assert sorted(p.name for p in (results / "trials").glob("*.parquet")) == names
    for name in names:
        got, expected = (pl.read_parquet(r / "trials" / name).drop(CHANGES, strict=False) for r in (results, want))
        assert got.equals(expected), name
        got, expected = (pl.read_parquet(r / "epochs" / name).drop("seconds") for r in (results, want))
        assert got.equals(expected), name


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_grid_cleanly_and_a_relaunch_finishes_it(uninterrupted, tmp_path, capsys, sig, code):
    config, whole = uninterrupted
    results = tmp_path / "results"
    status, out, err, seconds = interrupted_run(config, results, [sig])
    name = signal.Signals(sig).name
    assert status == code, err
    assert seconds < 30
    assert err.splitlines() == [f"bench: {name}: stopping the grid at the trials' last checkpoints (send it again "
                                "to stop at once)"]
    landed = rows_on_disk(results)
    assert 0 < landed < 4
    stopped = re.search(rf"stopped by {name}: (\d) of 4 trials have their row, (\d) did not finish .*run the same "
                        "command again", out)
    assert stopped, out
    assert (int(stopped[1]), int(stopped[2])) == (landed, 4 - landed)  # the rows on disk, not Ray's view
    assert f"stop: {landed} of 4 trials finished" in out

    assert f"running {4 - landed} of 4 trials ({landed} already done)" in relaunch(config, results, capsys)
    assert_same_as(results, whole)


def test_a_second_signal_ends_the_run_at_once(uninterrupted, tmp_path, capsys):
    config, whole = uninterrupted
    results = tmp_path / "results"
    status, _, err, seconds = interrupted_run(config, results, [signal.SIGTERM, signal.SIGTERM])
    # 143, or killed by the signal itself where it came while Ray's shutdown had put SIGTERM back to its default
    # action (a window of a fraction of a second, seen once under a loaded machine): a shell reports 143 for both.
    assert status in (143, -signal.SIGTERM)
    assert seconds < 5
    assert err.splitlines()[-1] in ("bench: SIGTERM again: stopped at once; run the same command again to finish "
                                    "the grid", "bench: SIGTERM: stopping the grid at the trials' last checkpoints "
                                    "(send it again to stop at once)")
    relaunch(config, results, capsys)
    assert_same_as(results, whole)


# -- a full disk ---------------------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A real 64 KiB file system (tmpfs): room for the folder's lock and Ray Tune's files, not for a trial's row."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_ends_the_grid_in_one_line_without_retries(uninterrupted, small_disk, tmp_path, capsys):
    """The log and the warm-start cache degrade with one warning each; the row that cannot be written is kept in the
    unsaved folder (an `ok` row, not a `failed` one); ENOSPC is never retried; the grid ends with a summary, exit 2.
    With room again, the kept row moved back and the same command run, the rows and curves are an uninterrupted
    run's (the code before issue #40: Ray retried every unit three times, then 652 lines and `EOFError`)."""
    config, whole = uninterrupted
    results, unsaved = small_disk / "results", tmp_path / "unsaved"
    started = time.monotonic()
    full = subprocess.run(command(config, results), capture_output=True, text=True, timeout=300,
                          env={**env(), "BENCH_UNSAVED": str(unsaved)})
    assert full.returncode == 2, full.stderr
    assert time.monotonic() - started < 120
    assert "Traceback" not in full.stderr and "Ray retries" not in full.stdout
    warnings = [line for line in full.stderr.splitlines() if line.startswith("bench: warning:")]
    assert len(warnings) == len({w.split(" (")[0].split("/")[0] for w in warnings}) <= 3  # one a kind
    assert full.stderr.count("\n") == len(warnings), full.stderr
    assert re.search(r"stopped: the results folder's disk is full: 0 of 4 trials have their row, 4 did not finish: "
                     "free space there and run the same command again", full.stdout), full.stdout
    kept = pl.read_parquet(unsaved / "trials")
    assert kept["status"].to_list() == ["ok"]

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    for table in ("trials", "epochs"):
        (results / table).mkdir(exist_ok=True)
        for path in (unsaved / table).glob("*.parquet"):
            shutil.move(path, results / table / path.name)
    assert "running 3 of 4 trials (1 already done)" in relaunch(config, results, capsys)
    assert_same_as(results, whole)


# -- damaged curves ------------------------------------------------------------------------------------------------
def test_a_damaged_curves_file_runs_its_trial_again(uninterrupted, tmp_path, capsys):
    """`epochs/<id>.parquet` cut short: it and its row go to damaged/, the trial runs again, and the folder ends as
    the uninterrupted run's (the code before issue #40 set the curves aside, then said "nothing to run")."""
    config, whole = uninterrupted
    results = tmp_path / "results"
    shutil.copytree(whole, results)
    damaged = sorted((results / "epochs").glob("*.parquet"))[1]
    damaged.write_bytes(damaged.read_bytes()[:100])
    assert "running 1 of 4 trials (3 already done)" in relaunch(config, results, capsys)
    assert sorted(p.name.split(".")[0] for p in (results / "damaged").iterdir()) == [
        f"epochs-{damaged.stem}", f"trials-{damaged.stem}"]
    assert_same_as(results, whole)


def test_a_full_disk_is_never_retried():
    """The runner's rule and the streams executor's agree: ENOSPC and EDQUOT, as Python and as pyarrow word them."""
    from bench.exec.executor import retry_may_cure

    full = [OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EDQUOT, "Disk quota exceeded"),
            OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")]
    assert [retry_may_cure(e) for e in full] == [False] * 3
    assert retry_may_cure(ConnectionResetError("dropped"))


# -- the streams executor: each member's row counts ------------------------------------------------------------------
def test_a_streams_unit_with_one_rejected_member_counts_the_others_rows(tmp_path):
    """A unit of three members, one meeting bad input: the two rows on disk are counted in the summary and logged to
    MLflow; only the third is rejected (the code before issue #40: "3 ... wrote no row", 0 runs logged)."""
    (tmp_path / "plugins").mkdir()
    method_that_raises(tmp_path / "plugins", "badinput", 'UserError("the worker found a damaged file")')
    (tmp_path / "table.csv").write_text("model,device,executor,trials,images_per_s,measured,source\n"
                                        "*,cpu,streams,3,,today,a test\n")
    config = tmp_path / "grid.yaml"
    config.write_text(yaml.safe_dump(dict(name="members", dataset="synthetic", noise="case3", r=[0.2], seeds=[0],
                                          epochs=2, epochs_warmup=1, resources={"cpu": 1},
                                          methods={"ce": {}, "badinput": {}, "dmi": {}})))
    results = tmp_path / "results"
    done = subprocess.run([BENCH, "run", str(config), "--results", str(results), "--num-cpus", "2"],
                          capture_output=True, text=True, timeout=600,
                          env={**env(), "BENCH_EXECUTOR_TABLE": str(tmp_path / "table.csv"),
                               "BENCH_PLUGINS": str(tmp_path / "plugins")})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "streams units (--executor auto): 3 trials in 1 streams units of 3" in done.stdout
    rows = pl.read_parquet(results / "trials" / "*.parquet")
    assert sorted(rows["method"]) == ["ce", "dmi"] and set(rows["status"]) == {"ok"}
    assert re.search(r"members: 3 of 3 trials finished in \S+ \(2 ok, 1 rejected\)", done.stdout), done.stdout
    assert "1 trials stopped on an error that retrying cannot fix and wrote no row" in done.stdout
    assert re.search(r"MLflow: 2 runs logged to ", done.stdout), done.stdout
