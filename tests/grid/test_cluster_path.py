"""The cluster path docs/cluster.md recommends (issue 21, item 3): `ray job submit -- bench run ...` against a head
started with `ray start --head --block` (which needs the `cluster` extra, ray[default]); a head stopped by signalling
that one process; `bench run --address` where nothing listens, or without the cluster's token: one line.

Heads run on 127.0.0.1 in a session of their own and are stopped by their own process id, never with `ray stop`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bench.config import UserError
from bench.grid.cluster import probe
from bench.store.folder import read_table
from tests.conftest import answers, free_port, stop_session

BIN = Path(sys.executable).parent
SYNTHETIC = dict(name="syn", dataset="synthetic", noise="case3", r=[0.0, 0.4], seeds=[0, 1], epochs=2,
                 epochs_warmup=2, resources={"cpu": 1}, methods={"ce": {}, "dmi": {"lr": 1e-3}})


def _config(folder: Path) -> Path:
    path = folder / "syn.yaml"
    path.write_text(yaml.safe_dump(SYNTHETIC, sort_keys=False))
    return path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return {**env, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore", **extra}


def _wait(ready, timeout: float, what: str, head: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if head.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{what} did not come up: {log.read_text()[-3000:]}")
        time.sleep(0.5)


@contextlib.contextmanager
def local_head(tmp_path: Path, env: dict[str, str], dashboard: bool = False) -> Iterator[dict[str, object]]:
    """`ray start --head --block` on 127.0.0.1 in a session of its own; stopped as docs/cluster.md says, by
    SIGTERM to that one process, which takes its cluster down (checked: nothing of its session stays)."""
    port, dash = free_port(), free_port()
    temp_dir = tempfile.mkdtemp(prefix="rayc", dir="/tmp")  # short: Ray's socket paths have a length limit
    log = tmp_path / "head.log"
    extra = (["--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash)] if dashboard
             else ["--include-dashboard", "false"])
    with open(log, "w") as out:
        head = subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", "--block", "--port", str(port), "--node-ip-address", "127.0.0.1",
             "--num-cpus", "2", "--temp-dir", temp_dir, "--disable-usage-stats", *extra],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        _wait(lambda: b"block forever" in log.read_bytes(), 120, "the head", head, log)
        if dashboard:
            _wait(lambda: answers(f"http://127.0.0.1:{dash}/api/version"), 120, "the job server", head, log)
        yield dict(address=f"127.0.0.1:{port}", dashboard=f"http://127.0.0.1:{dash}", pid=head.pid)
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        finally:
            left = stop_session(head.pid, grace=30)
        assert not left, f"SIGTERM to `ray start --block` left {len(left)} processes of its cluster"


def _has_job_server() -> bool:
    """Whether this Ray starts the dashboard's job server: its optional dependencies come with ray[default] (Ray
    checks the same import; without them the head logs "Subprocess modules not loaded in minimal mode")."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401
    except ImportError:
        return False
    return True


# -- nothing listens --------------------------------------------------------------------------------------------
def test_the_probe_passes_a_grpc_server_and_auto_and_refuses_a_silent_listener() -> None:
    """A gRPC server (as Ray's GCS and client server are) answers the HTTP/2 preface with a SETTINGS frame and
    acknowledges a PING: that handshake is all a Ray Client address (ray://) is asked; a GCS address is also asked
    Ray's own first call, which such a server fails (tests/grid/test_signals_at_every_moment.py). A listener that
    never answers is refused once the handshake times out."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()

        def settings() -> None:
            for _ in range(1):
                conn, _ = s.accept()
                with conn:
                    conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # an empty SETTINGS frame
                    received = b""
                    while b"bench-ok" not in received:
                        received += conn.recv(64)
                    conn.sendall(bytes([0, 0, 8, 6, 1, 0, 0, 0, 0]) + b"bench-ok")  # the PING's acknowledgement

        server = threading.Thread(target=settings, daemon=True)
        server.start()
        probe(f"ray://127.0.0.1:{s.getsockname()[1]}")
        server.join()
        with pytest.raises(UserError, match="answers as a Ray cluster .no answer to a Ray handshake in 1s"):
            probe(f"127.0.0.1:{s.getsockname()[1]}", timeout=1)
    probe("auto")
    probe("http://127.0.0.1:8265")  # not a GCS address: Ray names what is wrong with it
    with pytest.raises(UserError, match="nothing listens there"):
        probe(f"127.0.0.1:{free_port()}")


def test_an_address_where_nothing_listens_is_one_line_within_seconds(tmp_path: Path) -> None:
    started = time.monotonic()
    run = subprocess.run([str(BIN / "bench"), "run", str(_config(tmp_path)), "--results", str(tmp_path / "r"),
                          "--address", f"127.0.0.1:{free_port()}", "--no-mlflow"],
                         capture_output=True, text=True, timeout=120, env=_env())
    assert time.monotonic() - started < 20
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "nothing listens there (Connection refused)" in run.stderr
    assert not (tmp_path / "r" / "trials").exists()


# -- a head with token authentication, a client without the token ----------------------------------------------------
@pytest.mark.slow
def test_a_missing_token_is_our_one_line_without_rays_log(tmp_path: Path) -> None:
    """The head takes its token from RAY_AUTH_TOKEN, and HOME is a folder of the test's own: no test touches
    ~/.ray/auth_token. `ray.init` asks the head for its cluster id NUM_REDIS_GET_RETRIES times, a second apart, before
    it fails (20 by default, Ray's RAY_NUM_REDIS_GET_RETRIES): 3 here, 17 s sooner; Ray's C++ client still logs a
    line each try, which the one line must leave out."""
    (tmp_path / "head-home").mkdir()
    (tmp_path / "client-home").mkdir()
    head_env = _env(HOME=str(tmp_path / "head-home"), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    with local_head(tmp_path, head_env) as head:
        started = time.monotonic()
        run = subprocess.run([str(BIN / "bench"), "run", str(_config(tmp_path)), "--results", str(tmp_path / "r"),
                              "--address", head["address"], "--no-mlflow"], capture_output=True, text=True,
                             timeout=180, env=_env(HOME=str(tmp_path / "client-home"), RAY_NUM_REDIS_GET_RETRIES="3"))
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.count("\n") == 1, run.stderr  # Ray's C++ client logged ~20 lines here before
    assert "refused this client's token (InvalidAuthToken" in run.stderr and "RAY_AUTH_MODE=token" in run.stderr
    assert time.monotonic() - started < 60


# -- ray job submit, end to end ---------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(not _has_job_server(), reason="needs the cluster extra: pip install -e '.[cluster]'")
def test_ray_job_submit_runs_a_grid_on_the_head(tmp_path: Path) -> None:
    """docs/cluster.md's first choice: the driver submitted as a Ray job runs on the head (`--address auto`) and
    every trial writes its row; stopping the head's `ray start --block` process stops that cluster alone."""
    env = _env(RAY_AUTH_MODE="disabled")  # a private cluster on 127.0.0.1 (docs/cluster.md, section 4)
    results = tmp_path / "results"
    with local_head(tmp_path, env, dashboard=True) as head:
        job = subprocess.run(
            [str(BIN / "ray"), "job", "submit", "--address", str(head["dashboard"]), "--",
             str(BIN / "bench"), "run", str(_config(tmp_path)), "--address", "auto", "--results", str(results),
             "--no-mlflow"], capture_output=True, text=True, timeout=420, env=env)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "syn: 8 of 8 trials finished" in job.stdout and "succeeded" in job.stdout + job.stderr
    assert sorted(read_table(results)["status"]) == ["ok"] * 8
