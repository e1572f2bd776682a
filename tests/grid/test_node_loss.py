"""A lost head node and a worker node lost at every moment of a unit's life (issue 54), with real Ray nodes on one
machine as `tests/grid/test_multinode.py` starts them (its `Cluster`: each node a `ray start --block` in a process
group of its own, the module in a network namespace holding only loopback, a node lost by SIGKILL to its group).

The head's loss ends the grid: the driver notices within its own bound (`bench.grid.cluster.HeadWatch`), prints one
line and the summary of what landed, logs every landed row to MLflow and exits 1. A worker node's loss ends only the
units in flight there, each retried by Ray Tune from its last epoch checkpoint, whatever the moment: while its actor
starts, while it trains, at an epoch's checkpoint, right after its row lands (its actor then cached, or being reset
for the next unit: the moment where a unit ended `failed` without a row, `bench.grid.cluster.retry_units_lost_in_reset`;
`tests/grid/test_reused_actor_retry.py` makes that moment certain).
Run with -s to see the measured figures.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests import netns
from tests.grid.test_multinode import (
    BIN,
    LIST_NODES,
    SECOND,
    Cluster,
    Node,
    busy_workers,
    clean_env,
    cmdline,
    mlflow_trial_runs,
    rows,
    start_driver,
    summary_figure,
    wait_for,
)

pytestmark = pytest.mark.slow
test_in_its_own_network_namespace = netns.module_in_own_namespace(__file__)

HEAD_BOUND_S = 90  # the bound from the head's loss to the driver's exit, its line and summary printed


def grid_file(folder: Path, name: str, r: list[float], epochs: int) -> Path:
    """A grid of CE trials on the synthetic data set (no files), one seed, each trial one CPU."""
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(dict(name=name, dataset="synthetic", noise="case3", r=r, seeds=[0], epochs=epochs,
                                        epochs_warmup=1, resources={"cpu": 1}, methods={"ce": {}}), sort_keys=False))
    return path


def run_command(config: Path, cluster: Cluster, results: Path, *extra: str) -> list[str]:
    return [str(BIN / "bench"), "run", str(config), "--address", cluster.address, "--results", str(results),
            "--executor", "solo", *extra]


def stopped_cluster(cluster: Cluster) -> None:
    left = cluster.stop()
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    assert not any(left.values()), f"processes left behind by the nodes: {left}"


def test_a_lost_head_ends_the_grid_in_one_line_with_the_summary_and_every_landed_row_in_mlflow(tmp_path: Path) -> None:
    """The head's whole process group SIGKILLed once a row has landed, a trial in flight on the second node (which
    lives on, its unit finishing or not): the driver exits 1 within HEAD_BOUND_S with one line naming the lost head
    and how to relaunch, then the summary; the summary counts every row on disk, and MLflow holds one run for each;
    Ray's own C++ line (`Failed to connect to GCS`) is not what the user gets."""
    cluster = Cluster(tmp_path, clean_env())
    results = tmp_path / "r"
    config = grid_file(tmp_path, "hl", r=[0.0, 0.1, 0.2, 0.3, 0.4, 0.5], epochs=4)
    try:
        cluster.start_head()
        cluster.start_second()
        driver = start_driver(run_command(config, cluster, results), tmp_path / "run.log", clean_env())
        try:
            wait_for(lambda: len(rows(results)) >= 1 or driver.poll() is not None, 600, "a row landed")
            assert driver.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            killed = time.monotonic()
            cluster.nodes.pop("head").stop(signal.SIGKILL)
            driver.wait(timeout=HEAD_BOUND_S + 60)
            took = time.monotonic() - killed
            on_disk = {r["trial_id"] for r in rows(results)}  # the second node may still write one after this
        finally:
            if driver.poll() is None:
                driver.kill()
    finally:
        stopped_cluster(cluster)
    run = (tmp_path / "run.log").read_text()
    assert driver.returncode == 1, run[-4000:]
    assert took < HEAD_BOUND_S, f"{took:.0f}s\n{run[-3000:]}"
    lost = [line for line in run.splitlines() if "lost the Ray cluster's head node" in line]
    assert len(lost) == 1 and lost[0].startswith("bench: ") and "run the same command again" in lost[0], run[-3000:]
    assert "Failed to connect to GCS" not in run and "Traceback" not in run, run[-4000:]
    finished = summary_figure(run, r"hl: (\d+) of 6 trials finished")
    assert finished == len(on_disk) >= 1, run[-3000:]
    assert mlflow_trial_runs(f"sqlite:///{results}/mlflow.db", "hl", complete=True) == Counter(
        {trial_id: 1 for trial_id in on_disk})
    print(f"\n[head loss] the driver ended {took:.0f}s after the head's SIGKILL with {finished} of 6 rows counted and "
          "logged (machine loaded: figures indicative)")


# -- a worker node lost at five moments of one grid ---------------------------------------------------------------
TRIALS = 20
def test_a_worker_node_lost_at_each_moment_of_a_unit_leaves_every_trial_ok(tmp_path: Path) -> None:
    """One grid, its units all on the second node (the head offers no CPU), which is SIGKILLed and started again
    five times, each at another moment of a unit's life there: as its actor starts (before the unit trained),
    mid-epoch, just after an epoch's checkpoint, right as a row lands (the finished unit's actor then cached, or being
    reset for the next unit), and a second after. Every unit in flight is retried (--retries above the losses), and
    the grid ends with exit 0, every trial one row `ok` and one MLflow run."""
    cluster = Cluster(tmp_path, clean_env())
    results = tmp_path / "r"
    # 150 epochs (about 4 s a unit on a quiet 2-core machine, 25 ms an epoch): a unit lasts long enough for each
    # moment to be caught (mid-epoch needs a second of training, a checkpoint must be seen before the unit ends and
    # removes it); and 20 trials, two at a time, outlast the five moments (at 3 epochs a quiet machine finished a grid
    # of 10 before the third moment; at 30 epochs, once a unit's start cost less, a grid of 20 in 20 s, before the
    # second).
    config = grid_file(tmp_path, "wl", r=[round(0.025 * i, 3) for i in range(TRIALS)], epochs=150)
    struck = []
    try:
        cluster._start("head", ["--head", "--port", str(cluster.port), "--include-dashboard", "false",
                                "--temp-dir", cluster.temp_dir, "--num-cpus", "0"])
        # The first second node before the driver: its start-up check wants a node that offers a CPU.
        known: set[str] = set()
        node = start_second(cluster)
        driver = start_driver(run_command(config, cluster, results, "--retries", "8"), tmp_path / "run.log",
                              clean_env())
        try:
            for i, (moment, ready, every) in enumerate(MOMENTS):
                if i:
                    # The nodes lost before, listed before the new one starts: the new node is the one that is not
                    # among them, and watching starts the moment it is up (a unit waiting for its CPU starts its
                    # actor there at once; a listing of the cluster, some seconds, would come after that start).
                    known = second_node_ids(cluster)
                    node = start_second(cluster)
                come = functools.partial(ready, node, results, known, time.time())
                wait_for(lambda: come() or driver.poll() is not None, 600, f"the moment {moment!r}",  # noqa: B023
                         every=every)
                assert driver.poll() is None, f"the grid ended before {moment!r}: " + \
                    (tmp_path / "run.log").read_text()[-3000:]
                in_flight = len(busy_workers(node))
                assert not cluster.nodes.pop("second").stop(signal.SIGKILL)
                struck.append(f"{moment} ({in_flight} training)")
            start_second(cluster)
            driver.wait(timeout=900)
        finally:
            if driver.poll() is None:
                driver.kill()
    finally:
        stopped_cluster(cluster)
    run = (tmp_path / "run.log").read_text()
    assert driver.returncode == 0, run[-5000:]
    landed = rows(results)
    assert len(landed) == TRIALS and {r["status"] for r in landed} == {"ok"}, run[-4000:]
    assert mlflow_trial_runs(f"sqlite:///{results}/mlflow.db", "wl") == Counter({r["trial_id"]: 1 for r in landed})
    retried = summary_figure(run, r"Ray retried (\d+) trials")
    assert retried >= 3, run[-3000:]  # at least the moments where a unit was surely in flight: start, mid, checkpoint
    print(f"\n[worker-node loss] struck at: {'; '.join(struck)}; {retried} trials retried (machine loaded)")


def start_second(cluster: Cluster) -> Node:
    return cluster._start("second", ["--address", cluster.address, "--resources", json.dumps({SECOND: 1})])


def second_node_ids(cluster: Cluster) -> set[str]:
    """The Ray node ids of every second node the cluster lists, alive or lost (Ray lists a lost node as long as the
    cluster lives). Before the first second node: none; the head always answers, so an empty listing is asked
    again."""
    listed: list[dict] = []

    def answered() -> bool:
        listed[:] = nodes_listed(cluster)
        return bool(listed)

    wait_for(answered, 120, "the cluster listed its nodes")
    return {n["NodeID"] for n in listed if SECOND in n["Resources"]}


def nodes_listed(cluster: Cluster) -> list[dict]:
    listed = subprocess.run([str(BIN / "python"), "-c", LIST_NODES, cluster.address], capture_output=True, text=True,
                            timeout=120, env=cluster.env)
    # The listing is the last line that reads as JSON: a line of Ray's own (a raylet's message while a node is lost)
    # can come after it; none: not listed yet, and the caller asks again.
    for line in reversed(listed.stdout.splitlines() if listed.returncode == 0 else []):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, list):
            return found
    return []


# -- the moments: each a test of the second node's state, true when the moment has come --------------------------
def actor_starting(node: Node, results: Path, known: set[str], since: float) -> bool:
    """A worker of the node holds a unit's actor being made or running no method yet (Ray names a busy actor's
    process after the method it runs: `ray::ImplicitFunc.__init__`, then `ray::ImplicitFunc.train`)."""
    return any(re.search(r"ray::ImplicitFunc(\.__init__)?(\s|$)", cmdline(pid)) for pid in node.pids)


def mid_epoch(node: Node, results: Path, known: set[str], since: float) -> bool:
    """A unit has trained there for a second."""
    if not busy_workers(node):
        return False
    time.sleep(1.0)
    return bool(busy_workers(node))


def epoch_checkpointed(node: Node, results: Path, known: set[str], since: float) -> bool:
    """A checkpoint was written since the node started (only its units train)."""
    return any(p.stat().st_mtime > since for p in (results / "checkpoints").glob("*.pt"))


def row_landed(node: Node, results: Path, known: set[str], since: float) -> bool:
    """A row of this node landed: the head trains nothing, so a row of a node not known before is this node's."""
    return any(r["node_id"] not in known for r in rows(results))


def second_after_row(node: Node, results: Path, known: set[str], since: float) -> bool:
    if not row_landed(node, results, known, since):
        return False
    time.sleep(1.0)
    return True


# Each moment with how often it is looked for: an actor's start lasts about a second (its worker imports the
# trainable), the others last longer or stay true.
MOMENTS = [("an actor starting its unit", actor_starting, 0.05), ("mid-epoch", mid_epoch, 0.5),
           ("an epoch's checkpoint", epoch_checkpointed, 0.5), ("a row landing", row_landed, 0.5),
           ("a second after a row", second_after_row, 0.5)]
