"""Plans that fill a cluster's GPUs, made without CUDA in the driver.

The splitting rule against counts made by hand; `bench run --dry-run --address` against a local Ray head with
logical GPUs (`ray start --head --block --num-gpus G` on this CPU machine: one head per GPU count for the module,
stopped by signalling its own process, never `ray stop`); and a planner that never opens a GPU.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from bench.cli.main import main
from bench.exec.executor import Unit, get_executor
from bench.exec.memory import GIB, pack_memory
from bench.exec.packed import EVAL_IMAGES
from bench.exec.prepare import prepare
from bench.grid.cluster import start_ray
from bench.grid.describe import describe_gpus
from bench.grid.files import load_experiment
from bench.grid.plan import plan_units, share_gpus, warm_cell
from bench.grid.runner import Settings, plan_on_cluster
from bench.trial import TrialConfig
from tests.conftest import free_port, stop_session

REPO = Path(__file__).resolve().parents[2]
FIGURE = REPO / "tune_configs" / "fashion_mnist_figure.yaml"  # 300 trials: 150 cells of a CE and an L_DMI trial
RAY = str(Path(sys.executable).parent / "ray")


def dmi_trials(n: int, epochs: int = 2) -> list[TrialConfig]:
    """n packable trials, each its own warm-start cell (one method, a seed each)."""
    return [TrialConfig("synthetic", "dmi", "case3", 0.2, seed=s, device="cuda", epochs=epochs, epochs_warmup=1)
            for s in range(n)]


def pack_sizes(units: list[Unit]) -> list[int]:
    return [len(u) for u in units]


# -- the splitting rule -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpus", [1, 2, 3, 8, 13])
@pytest.mark.parametrize("n", [1, 7, 40, 300])
@pytest.mark.parametrize("cap", [1, 5, 64, 256])
def test_n_trials_on_g_gpus_are_g_balanced_packs_more_only_where_the_cap_needs_them(gpus, n, cap):
    units = plan_units(dmi_trials(n), cap, gpus=gpus)
    count = min(n, max(gpus, math.ceil(n / cap)))  # G packs, or as many as the cap needs; never an empty one
    assert len(units) == count
    assert sorted(pack_sizes(units)) == sorted([n // count + 1] * (n % count) + [n // count] * (count - n % count))
    assert max(pack_sizes(units)) <= cap
    assert sorted(t.seed for u in units for t in u) == list(range(n))


@pytest.mark.parametrize("gpus, sizes", [
    (1, [150, 150]),  # one GPU: packs of the pack executor's `most` at most, balanced
    (2, [150, 150]),
    (7, [44, 44, 44, 42, 42, 42, 42]),  # 150 cells over 7 packs: 22, 22, 22, 21, 21, 21, 21
    (8, [38] * 6 + [36] * 2),  # 150 cells over 8 packs: 19 x 6 + 18 x 2
    (200, [2] * 150),  # more GPUs than cells: a cell is never split
])
def test_the_figure_fills_the_gpus_in_whole_warm_start_cells(gpus, sizes):
    trials = load_experiment(FIGURE).trials()
    assert len(trials) == 300 and {t.device for t in trials} == {"cuda"} and get_executor("pack").most == 256
    units = plan_units(trials, "auto", gpus=gpus)
    assert pack_sizes(units) == sizes
    cells = [{warm_cell(t) for t in u} for u in units]
    assert sum(map(len, cells)) == 150 and len(set().union(*cells)) == 150  # no cell in two packs


def test_groups_share_the_gpus_by_their_work_and_the_solo_trials_come_last():
    """20 trials of 1 + 1 epochs (work 40) and 20 of 5 + 1 (work 120) on 8 GPUs: 2 GPUs and 6, so that the
    packs finish together: 10 + 10 trials of 2 epochs, and 4, 4, 3, 3, 3, 3 trials of 6."""
    short, long = dmi_trials(20, epochs=1), dmi_trials(20, epochs=5)
    solo = [dataclasses.replace(t, method="vat") for t in dmi_trials(3)]
    units = plan_units(short + solo + long, 64, gpus=8)
    # Largest work first: 4 x 6 epochs, 10 x 2, 3 x 6; then the solo trials.
    assert [(len(u), u.trials[0].epochs) for u in units] == [(4, 5), (4, 5), (10, 1), (10, 1), (3, 5), (3, 5), (3, 5),
                                                      (3, 5), (1, 2), (1, 2), (1, 2)]
    assert describe_gpus(units[:8], 8) == ("GPUs: 8 seen; expected load per GPU: 3-10 trials, 18-24 epochs "
                                           "(8 packs, then 0 solo trials)")
    # Each solo trial (2 + 1 epochs) on a GPU with the least work so far: three of the four 18s.
    assert describe_gpus(units, 8) == ("GPUs: 8 seen; expected load per GPU: 3-10 trials, 18-24 epochs "
                                       "(8 packs, then 3 solo trials)")
    loads = describe_gpus(units + units[-3:], 8)  # three more: the last 18, then two of the 20s
    assert loads.startswith("GPUs: 8 seen; expected load per GPU: 4-11 trials, 21-24 epochs")
    assert describe_gpus(units, 0).startswith("GPUs: none seen here")


@pytest.mark.parametrize("work, gpus, shares", [
    ([1, 3], 8, [2, 6]),
    ([1, 1, 1], 10, [4, 3, 3]),  # 3.33 each: one largest remainder rounds up (the first of equals)
    ([1, 1, 1], 2, [1, 1, 1]),  # fewer GPUs than groups: a pack each all the same
    ([5, 0], 4, [4, 1]),
])
def test_share_gpus(work, gpus, shares):
    assert share_gpus(work, gpus) == shares


# -- against a Ray head with logical GPUs -------------------------------------------------------------------------
@pytest.fixture(scope="module", params=[8, 2])
def ray_head(request):
    """A Ray head with `param` logical GPUs on 127.0.0.1, without token auth (a private, throw-away cluster)."""
    gpus, port = request.param, free_port()
    temp_dir = tempfile.mkdtemp(prefix="rayg", dir="/tmp")  # short: Ray's socket paths have a length limit
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--num-gpus", str(gpus), "--num-cpus", "2", "--port", str(port),
         "--node-ip-address", "127.0.0.1", "--include-dashboard=false", "--disable-usage-stats",
         "--temp-dir", temp_dir],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
    try:
        seen = []
        for line in head.stdout:  # --block: it prints its banner, then waits
            seen.append(line)
            if "Ray runtime started" in line:
                break
        assert head.poll() is None, "".join(seen)
        yield gpus, f"127.0.0.1:{port}"
    finally:
        head.send_signal(signal.SIGTERM)  # --block stops the head's own processes on a signal
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(1)
        stop_session(head.pid)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_the_dry_run_asks_the_cluster_for_its_gpus(ray_head, tiny_fashion, tmp_path, monkeypatch, capsys):
    gpus, address = ray_head
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    run = ["run", str(FIGURE), "--dry-run", "--address", address, "--results", str(tmp_path / "r"),
           "--data-root", str(tiny_fashion)]
    assert main(run) == 0
    out = capsys.readouterr().out
    sizes = {8: "38, 38, 38, 38, 38, 38, 36, 36", 2: "150, 150"}[gpus]  # 150 cells of 2 over G packs
    assert f"300 trials in {gpus} packs of {sizes}; 0 trials solo" in out
    # 20 method-stage epochs a trial, 20 warm-start epochs a cell: 38 x 20 + 19 x 20, 36 x 20 + 18 x 20, ...
    per_gpu = {8: "36-38 trials, 1,080-1,140 epochs", 2: "150 trials, 4,500 epochs"}[gpus]
    assert f"GPUs: {gpus} seen; expected load per GPU: {per_gpu} ({gpus} packs, then 0 solo trials)" in out
    assert not torch.cuda.is_initialized()

    if gpus != 8:
        return
    # Capped by memory ($BENCH_PACK_MEMORY_GB, where 20 members fit by the estimate): more packs than GPUs.
    like = TrialConfig("fashion_mnist", "ce", "case1", 0.0)
    estimate = dataclasses.replace(pack_memory(prepare(like, tiny_fashion, log=lambda line: None)),
                                   chunk=EVAL_IMAGES["cuda"])
    monkeypatch.setenv("BENCH_PACK_MEMORY_GB", str((estimate.bytes(20) + estimate.bytes(21)) / 2 / GIB))
    assert main(run) == 0
    out = capsys.readouterr().out
    assert "300 trials in 15 packs of " + ", ".join(["20"] * 15) in out and "at most 20 a pack" in out


def test_the_run_plans_by_the_clusters_gpus(ray_head, tiny_fashion, monkeypatch):
    gpus, address = ray_head
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    trials = load_experiment(FIGURE).trials()
    assert start_ray(address, None)
    try:
        lines: list[str] = []
        units = plan_on_cluster(trials, Settings(results="unused", data_root=tiny_fashion), 1.0, lines.append)
    finally:
        import ray  # the test's own connection to the head

        ray.shutdown()
    assert sorted(map(len, units.values())) == sorted({8: [38] * 6 + [36] * 2, 2: [150, 150]}[gpus])
    assert any(line.startswith(f"GPUs: {gpus} seen;") for line in lines)


def test_a_dry_run_that_cannot_connect_fails_as_the_run_does(tmp_path, capsys):
    """The dry run and the run refuse a cluster address where nothing listens in the same one line. The address is
    a free loopback port: a test never sends anything to another host's address (once 10.9.8.7, where whatever
    answered for it in a sandbox decided the outcome)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there
    run = ["run", str(FIGURE), "--address", address, "--results", str(tmp_path / "r"), "--no-mlflow"]
    assert main([*run, "--dry-run"]) == 2
    dry = capsys.readouterr()
    assert main(run) == 2
    real = capsys.readouterr()
    assert dry.out == "" and dry.err == real.err
    assert dry.err.startswith(f"bench: error: cannot connect to the Ray cluster at {address}: nothing listens there") \
        and dry.err.count("\n") == 1
    assert not (tmp_path / "r").exists()


# -- no CUDA in the driver ----------------------------------------------------------------------------------------
def test_planning_opens_no_gpu_in_the_driver(tiny_fashion, tmp_path, monkeypatch, capsys):
    """A driver that sees 4 GPUs (mocked) plans 4 packs and never asks a GPU for its properties, with or
    without a memory budget: no CUDA context in the driver."""
    def refuse(*args, **kwargs):
        raise AssertionError("the driver asked a GPU for its properties")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "get_device_properties", refuse)
    monkeypatch.setattr(torch.cuda, "mem_get_info", refuse)
    run = ["run", str(FIGURE), "--dry-run", "--results", str(tmp_path / "r"), "--data-root", str(tiny_fashion)]
    for budget in (None, "1000"):
        if budget:
            monkeypatch.setenv("BENCH_PACK_MEMORY_GB", budget)
        assert main(run) == 0
        out = capsys.readouterr().out
        assert "300 trials in 4 packs of 76, 76, 74, 74; 0 trials solo" in out  # 150 cells: 38, 38, 37, 37
        assert "GPUs: 4 seen;" in out
        assert ("not estimated here" in out) == (budget is None)
        assert not torch.cuda.is_initialized()
