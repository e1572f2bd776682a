"""Beyond one box (issue 46): a grid over two Ray nodes on one machine, the second node lost part-way, the driver
killed and relaunched against the same cluster, and a real `mlflow server` stopped and started again mid-grid.

Ray tests its own multi-node behaviour with several raylets on one machine; so do these tests, with real processes:
a head (`ray start --head --block`, one CPU) and a second node (`ray start --address ... --block`, one CPU and a
custom resource that tells it apart), each in a session and process group of its own, all on 127.0.0.1. A multi-node
Ray turns a loopback node address into the machine's network address (docs/cluster.md section 5); so the module runs
in a network namespace of its own holding only loopback (tests/netns.py), where Ray has no other address to take and
nothing else can reach the cluster (no token needed). A node is stopped by signalling its own process group, never
with `ray stop`; each test checks that no process of its nodes (or of its MLflow server) is left behind.

Each grid is eight small Fashion-MNIST trials (CE and L_DMI, two noise rates, two seeds, 1 + 1 epochs: four warm
starts) run by `bench run --address` in a process of its own, as a user runs it. Run with -s to see the measured
figures (trials retried, the wall time the loss cost).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import yaml

from bench.store.folder import read_table
from bench.store.mirror import TAG
from tests import netns
from tests.conftest import answers, free_port, session_pids, stop_session, write_idx

BIN = Path(sys.executable).parent
GRID = dict(name="mn", dataset="fashion_mnist", noise="case3", r=[0.2, 0.4], seeds=[0, 1], epochs=1, epochs_warmup=1,
            resources={"cpu": 1}, methods={"ce": {}, "dmi": {"lr": 1e-3}})
N_TRIALS = 8
SECOND = "second_node"  # the second node's custom resource
pytestmark = pytest.mark.slow
test_in_its_own_network_namespace = netns.module_in_own_namespace(__file__)
LIST_NODES = """import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(json.dumps([dict(NodeID=n["NodeID"], Alive=n["Alive"], Resources=n["Resources"]) for n in ray.nodes()]))
"""


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of every node and driver: no token (the cluster is reachable only from the module's own
    network namespace), no file under ~/.ray read or written, no MLflow or Ray auth settings of the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "MLFLOW_"))}
    return {**env, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
            "RAY_AUTH_MODE": "disabled", "BENCH_VERIFY_CHECKSUMS": "0", **extra}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_for(ready, timeout: float, what: str, log: Path | None = None, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f}s" + (f": {log.read_text()[-3000:]}" if log else ""))
        time.sleep(every)


@dataclass
class Node:
    """One `ray start --block` process, leader of its own session and process group."""

    name: str
    process: subprocess.Popen
    log: Path

    @property
    def pids(self) -> list[int]:
        return session_pids(self.process.pid)

    def send(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 90) -> list[int]:
        """Stop the node: SIGTERM to its `ray start --block` process, which takes its Ray processes down
        (docs/cluster.md, "Stopping one cluster"; the whole group signalled at once left the head's GCS and raylet
        waiting on each other some 30 s), any other signal (SIGKILL: a lost node) to its whole process group. Returns
        the pids of its session still alive after `timeout` (killed then, so that nothing is left behind whatever
        the test says)."""
        if signum == signal.SIGTERM:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)
        else:
            self.send(signum)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout)
        left = stop_session(self.process.pid, grace=timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        return left


@dataclass
class Cluster:
    """A head and (while it lives) a second node on 127.0.0.1, Ray's temp files in a folder of their own."""

    folder: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    temp_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="raymn", dir="/tmp"))  # short: socket paths
    nodes: dict[str, Node] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _start(self, name: str, args: list[str]) -> Node:
        ports = [("--node-manager-port", free_port()), ("--object-manager-port", free_port()),
                 ("--dashboard-agent-listen-port", free_port()), ("--dashboard-agent-grpc-port", free_port()),
                 ("--metrics-export-port", free_port()), ("--runtime-env-agent-port", free_port())]
        log = self.folder / f"{name}.log"
        with open(log, "w") as out:
            process = subprocess.Popen(
                [str(BIN / "ray"), "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
                 "--disable-usage-stats", *args, *(str(x) for pair in ports for x in pair)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
        node = self.nodes[name] = Node(name, process, log)
        # Polled finely: a unit waiting for this node's CPU starts its actor there as soon as the node is up, and
        # tests/grid/test_node_loss.py must still see that actor start.
        wait_for(lambda: b"block forever" in log.read_bytes() or process.poll() is not None, 180,
                 f"the {name} node came up", log, every=0.05)
        assert process.poll() is None, log.read_text()[-3000:]
        return node

    def start_head(self) -> Node:
        return self._start("head", ["--head", "--port", str(self.port), "--include-dashboard", "false",
                                    "--temp-dir", self.temp_dir])

    def start_second(self) -> Node:
        node = self._start("second", ["--address", self.address, "--resources", json.dumps({SECOND: 1})])
        wait_for(lambda: len(self.node_ids()) == 2, 120, "the cluster listed two nodes", node.log)
        return node

    def node_ids(self) -> dict[str, str]:
        """name -> Ray node id of the live nodes, as the cluster lists them (`ray.nodes()` in a short-lived driver
        of its own, so that this process never joins the cluster)."""
        listed = subprocess.run([sys.executable, "-c", LIST_NODES, self.address], capture_output=True, text=True,
                                timeout=120, env=self.env)
        if listed.returncode != 0:
            return {}
        nodes = json.loads(listed.stdout.strip().splitlines()[-1])
        return {("second" if SECOND in n["Resources"] else "head"): n["NodeID"] for n in nodes if n["Alive"]}

    def stop(self) -> dict[str, list[int]]:
        """Every node stopped by its own process group (the second first); name -> pids it left behind."""
        return {name: self.nodes.pop(name).stop() for name in [n for n in ("second", "head") if n in self.nodes]}


def write_fashion(root: Path) -> Path:
    """A data root with a 1,000 + 200 image Fashion-MNIST in torchvision's raw layout (the nodes' and drivers'
    environment turns checksums off): big enough that a trial of 1 + 1 epochs trains for some seconds on one CPU
    (a node can be lost while it trains one), small enough for CI."""
    rng = np.random.default_rng(0)
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n in (("train", 1000), ("t10k", 200)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 50, (n, 28, 28))
        images[np.arange(n), labels, :] = 250  # each class a bright row of its own
        write_idx(raw / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return root


@pytest.fixture(scope="module")
def fashion(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fashion(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A head and a second node for the module (the tests that lose the second node start it again); both stopped
    at the end by their process groups, nothing of them left behind."""
    c = Cluster(tmp_path_factory.mktemp("cluster"), clean_env())
    try:
        c.start_head()
        c.start_second()
        yield c
    finally:
        left = c.stop()
        shutil.rmtree(c.temp_dir, ignore_errors=True)
    assert not any(left.values()), f"processes left behind by the nodes: {left}"


@pytest.fixture
def two_nodes(cluster: Cluster) -> Cluster:
    """The module's cluster with both nodes up (the second started again where a test lost it)."""
    if "second" not in cluster.nodes:
        cluster.start_second()
    return cluster


def grid_config(folder: Path, **changes: object) -> Path:
    path = folder / "mn.yaml"
    path.write_text(yaml.safe_dump({**GRID, **changes}, sort_keys=False))
    return path


def bench_run(cluster: Cluster, results: Path, data: Path, *extra: str) -> list[str]:
    return [str(BIN / "bench"), "run", str(grid_config(results.parent)), "--address", cluster.address,
            "--results", str(results), "--data-root", str(data), "--executor", "solo", *extra]


def start_driver(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def rows(results: Path) -> list[dict]:
    try:
        return read_table(results).to_dicts()
    except Exception:  # noqa: BLE001 - no rows yet
        return []


def busy_workers(node: Node) -> list[int]:
    """The node's Ray workers that run a trial now (Ray names a busy actor's process after the method it runs)."""
    return [pid for pid in node.pids if re.search(r"ray::ImplicitFunc\.\w", cmdline(pid))]


def mlflow_trial_runs(uri: str, experiment: str = "mn", complete: bool = False) -> Counter:
    """trial_id -> the active (not deleted) trial runs the MLflow store holds for it (`complete`: only those whose
    logging finished, tagged so last)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:  # nothing logged yet (the server went down before the first run)
        return Counter()
    query = f"tags.`{TAG}kind` = 'trial'" + (f" and tags.`{TAG}complete` = 'true'" if complete else "")
    runs = client.search_runs([exp.experiment_id], query, max_results=1000)
    return Counter(r.data.tags[f"{TAG}trial_id"] for r in runs)


def warm_starts_trained(results: Path) -> Counter:
    """warm-start key -> how many times its training finished and was kept, from the units' logs."""
    found = Counter()
    for log in (results / "logs").glob("*.log"):
        found.update(re.findall(r"warm-start cache: trained (\S+)", log.read_text()))
    return found


def check_grid(results: Path, run: str, mlflow_uri: str) -> list[dict]:
    """The grid's end as the issue asks: every trial one row, ok, and one MLflow run."""
    landed = rows(results)
    assert len(landed) == N_TRIALS and len({r["trial_id"] for r in landed}) == N_TRIALS, run[-4000:]
    assert {r["status"] for r in landed} == {"ok"}, run[-4000:]
    assert mlflow_trial_runs(mlflow_uri) == Counter({r["trial_id"]: 1 for r in landed})
    return landed


def summary_figure(run: str, pattern: str) -> int:
    found = re.search(pattern, run)
    assert found, run[-3000:]
    return int(found.group(1))


def test_a_driver_killed_and_relaunched_against_the_cluster_resumes(two_nodes: Cluster, fashion: Path,
                                                                  tmp_path: Path) -> None:
    """`bench run --address` SIGKILLed once two rows have landed, then the same command again: the relaunch runs
    only the trials without a row, on both nodes, and every trial ends with one row and one MLflow run."""
    cluster, results, env = two_nodes, tmp_path / "r", clean_env()
    cmd = bench_run(cluster, results, fashion)
    driver = start_driver(cmd, tmp_path / "first.log", env)
    try:
        wait_for(lambda: len(rows(results)) >= 2 or driver.poll() is not None, 600, "two rows landed")
        assert driver.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    done = len(rows(results))
    assert done < N_TRIALS
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert f"running {N_TRIALS - done} of {N_TRIALS} trials ({done} already done)" in again.stdout
    landed = check_grid(results, again.stdout, f"sqlite:///{results}/mlflow.db")
    assert {r["node_id"] for r in landed} == set(cluster.node_ids().values())


# -- a real MLflow tracking server, stopped and started again mid-grid ---------------------------------------------
@dataclass
class Server:
    """`mlflow server` on 127.0.0.1 (sqlite backend, a local artifact root), in a session of its own."""

    folder: Path
    port: int = field(default_factory=free_port)
    node: Node | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = self.folder / "mlflow-server.log"
        with open(log, "a") as out:
            process = subprocess.Popen(
                [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
                 "--backend-store-uri", f"sqlite:///{self.folder}/server.db",
                 "--default-artifact-root", str(self.folder / "artifacts")],
                # MLflow 3's job runner (GenAI jobs: seven huey consumers) is not what a tracking server needs
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env=clean_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
        self.node = Node("mlflow", process, log)
        wait_for(lambda: answers(f"{self.uri}/health") or process.poll() is not None, 180, "mlflow server answered",
                 log)
        assert process.poll() is None, log.read_text()[-3000:]

    def stop(self) -> list[int]:
        node, self.node = self.node, None
        return node.stop() if node else []


def test_a_grid_logs_to_an_mlflow_server_that_restarts_mid_grid(two_nodes: Cluster, fashion: Path,
                                                               tmp_path: Path) -> None:
    """`bench run --address ... --mlflow-uri http://...`: trials on both nodes, the server stopped (SIGTERM to its
    process group) once a row has landed and started again at once on the same store (some 15 seconds down):
    the grid ends with exit 0 and every trial has exactly one run in the server, nothing doubled: the mirror tries
    the store again when the grid ends and backfills what it missed; where the server was not back by then, the
    summary says so and `bench sync-mlflow` (docs/running.md) backfills exactly the runs that are missing."""
    cluster, results = two_nodes, tmp_path / "r"
    server = Server(tmp_path)
    server.start()
    try:
        driver = start_driver(bench_run(cluster, results, fashion, "--mlflow-uri", server.uri), tmp_path / "run.log",
                              clean_env())
        try:
            wait_for(lambda: len(rows(results)) >= 1 or driver.poll() is not None, 600, "a row landed")
            assert driver.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            assert not server.stop(), "SIGTERM to the mlflow server's process group left processes behind"
            down = len(rows(results))
            server.start()
            up = len(rows(results))
            driver.wait(timeout=900)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
        run = (tmp_path / "run.log").read_text()
        assert driver.returncode == 0, run[-4000:]
        landed = rows(results)
        assert len(landed) == N_TRIALS and {r["status"] for r in landed} == {"ok"}, run[-4000:]
        # Ray undisturbed (only the MLflow server restarted): both nodes ran trials, the rows say which and on what
        # host, and no trial was retried. The node-loss test below relies on this grid as its calm counterpart.
        assert {r["node_id"] for r in landed} == set(cluster.node_ids().values())
        assert {r["host"] for r in landed} == {os.uname().nodename}
        assert "retried" not in run
        before, complete = mlflow_trial_runs(server.uri), mlflow_trial_runs(server.uri, complete=True)
        assert set(before.values()) <= {1}, before  # nothing doubled, even before any backfill
        missing = N_TRIALS - len(complete)
        failed_again = "store FAILED" in run
        assert (missing > 0) == failed_again, run[-3000:]  # runs missing only where the summary says so
        sync = subprocess.run([str(BIN / "bench"), "sync-mlflow", str(results), "--mlflow-uri", server.uri],
                              capture_output=True, text=True, timeout=300, env=clean_env())
        assert sync.returncode == 0, sync.stdout + sync.stderr
        assert f"logged {missing} missing runs" in sync.stdout
        assert mlflow_trial_runs(server.uri) == Counter({r["trial_id"]: 1 for r in landed})
        backfilled = re.search(r"(\d+) more when the grid ended", run)
        logged = summary_figure(run, r"MLflow: (\d+) runs logged")
        print(f"\n[mlflow server] down from {down} rows to {up}; the grid's mirror: {logged} runs as they landed, "
              f"{backfilled.group(1) if backfilled else 0} when the grid ended; {missing} by bench sync-mlflow")
    finally:
        assert not server.stop(), "the mlflow server left processes behind"


# -- two nodes, one lost ----------------------------------------------------------------------------------------------
def test_a_grid_spreads_over_two_nodes_and_survives_losing_one(two_nodes: Cluster, fashion: Path,
                                                             tmp_path: Path) -> None:
    """The grid with the second node SIGKILLed (its whole process group) while it trains a trial, once it has
    landed one (so both nodes ran trials; an undisturbed grid over both nodes, no trial retried, is the MLflow
    test's above): the grid ends on the head with exit 0, every trial one row and one MLflow run, each warm start
    trained once, and the summary says how many trials were retried because their node was lost: as many as the
    second node had in flight."""
    cluster = two_nodes
    ids = cluster.node_ids()
    env = clean_env()
    (tmp_path / "loss").mkdir()
    results = tmp_path / "loss" / "r"
    second = cluster.nodes["second"]
    started = time.monotonic()
    driver = start_driver(bench_run(cluster, results, fashion), tmp_path / "loss.log", env)
    try:
        # The loss strikes while the second node trains a trial, once at least one trial has landed there.
        wait_for(lambda: any(r["node_id"] == ids["second"] for r in rows(results)) and busy_workers(second)
                 or driver.poll() is not None, 600, "the second node ran a trial and started another")
        in_flight = len(busy_workers(second))
        assert driver.poll() is None and in_flight == 1, "the grid ended before the loss could strike"
        killed_at = time.monotonic() - started
        left = cluster.nodes.pop("second").stop(signal.SIGKILL)
        assert not left, f"SIGKILL of the second node's process group left {left}"
        before = {r["trial_id"] for r in rows(results)}  # the second node's rows are all in: it is gone
        driver.wait(timeout=900)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    loss_s = time.monotonic() - started
    run = (tmp_path / "loss.log").read_text()
    assert driver.returncode == 0, run[-4000:]
    landed = check_grid(results, run, f"sqlite:///{results}/mlflow.db")
    after = [r for r in landed if r["trial_id"] not in before]
    assert {r["node_id"] for r in after} == {ids["head"]}  # what was left ran on the head
    retried = summary_figure(run, r"(\d+) trials? retried because (?:its|their) node was lost")
    assert retried == in_flight
    trained = warm_starts_trained(results)
    assert set(trained.values()) == {1} and len(trained) == 4, trained  # four cells, each warm start trained once
    print(f"\n[node loss] second node SIGKILLed {killed_at:.0f}s into the grid with {in_flight} trial in flight; "
          f"{retried} trial retried; wall {loss_s:.0f}s (machine loaded: figures indicative)")
