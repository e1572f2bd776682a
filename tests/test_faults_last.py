"""Fault injection, third round (issue #29): every failure one line, never a hang. A worker's deterministic error is
not retried by Ray, `--address` to a port that is not Ray answers in seconds, seed counts and long names are refused
before anything is built, a pack's memory bound is checked, unwritable outputs are named up front, a reader that
leaves loses no rows, and damaged CIFAR files are one line. Each test fails on the code before that issue."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from bench import models
from bench.cli.main import main
from bench.data import registry as datasets
from bench.grid import cluster
from bench.grid.files import load_experiment
from bench.grid.runner import Settings, run_experiment
from bench.methods import registry as methods
from bench.store.folder import read_table

GRID = dict(name="last", dataset="synthetic", noise="case3", r=[0.2], seeds=[0], epochs=1, epochs_warmup=1,
            resources={"cpu": 1}, methods={"ce": {}})

# A method plug-in with a bug: its loss raises, the same way on every try.
CRASHY = '''
from bench.methods import Method


class Crashy(Method):
    name = "crashy"
    title = "Crashy"
    paper = "a method whose loss has a bug (tests)"
    reference = "none"

    def loss(self, logits, labels):
        raise ValueError("a bug in the loss,\\n  on two lines")
'''


def write_config(folder: Path, **changes) -> Path:
    path = folder / "grid.yaml"
    path.write_text(yaml.safe_dump({**GRID, **changes}, sort_keys=False))
    return path


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line]
    assert len(err) == 1, err
    assert err[0].startswith("bench: error:"), err
    return err[0]


def _clear_registries() -> None:
    for registry in (datasets, methods, models.registry):
        registry.cache_clear()


@pytest.fixture(scope="module")
def plugin_ray(tmp_path_factory):
    """A local Ray whose workers see a plug-in folder with the `crashy` method (the folder is set before Ray starts,
    so that the workers inherit it)."""
    import ray

    folder = tmp_path_factory.mktemp("plugins")
    (folder / "crashy.py").write_text(CRASHY)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BENCH_PLUGINS", str(folder))
        _clear_registries()
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        try:
            yield ray
        finally:
            ray.shutdown()
    _clear_registries()


# -- 4. a worker's own error is not retried ----------------------------------------------------------------------------
def test_a_deterministic_error_in_a_worker_fails_its_trial_once_and_the_others_go_on(plugin_ray, tmp_path):
    config = write_config(tmp_path, name="crash", methods={"ce": {}, "crashy": {}})
    results = tmp_path / "results"
    lines: list[str] = []
    started = time.monotonic()
    tally = run_experiment(load_experiment(config), Settings(results=str(results), data_root=tmp_path, mlflow=False,
                                                             retries=2), lines.append)
    assert time.monotonic() - started < 60
    assert tally.statuses == {"ok": 1, "failed": 1}
    rows = {row["method"]: row for row in read_table(results).iter_rows(named=True)}
    assert rows["ce"]["status"] == "ok" and rows["crashy"]["status"] == "failed"
    reason = "ValueError: a bug in the loss, on two lines"
    assert rows["crashy"]["error"] == reason
    log = (results / "logs" / f"{rows['crashy']['trial_id']}.log").read_text()
    assert log.count(f"trial {rows['crashy']['trial_id']}:") == 1  # one attempt: Ray did not retry it
    assert "Traceback" in log  # the whole story stays in the trial's log
    text = "\n".join(lines)
    assert "Ray retries" not in text and "Traceback" not in text
    assert f"      error: {reason}" in text.splitlines()
    assert "1 failed trials keep a row with status failed" in text


# -- 2. --address to a port that is not Ray ----------------------------------------------------------------------------
class Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextmanager
def not_ray(kind: str) -> Iterator[str]:
    """A server on 127.0.0.1 that is not a Ray head: an HTTP server, a listener that never answers, an SSH banner;
    its address."""
    if kind == "http":
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()
        return
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    held: list[socket.socket] = []

    def banner() -> None:  # an SSH server speaks first, then waits for the client's banner
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
            held.append(conn)  # open, waiting for the client's banner
        for conn in held:
            conn.close()

    thread = threading.Thread(target=banner, daemon=True)
    if kind == "ssh":
        thread.start()
    try:  # "silent": connections wait in the listen backlog, never answered
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        listener.close()


@pytest.mark.parametrize("kind, said", [("http", "it answered '<!DOCTYPE'"), ("silent", "no answer to a Ray handshake"),
                                        ("ssh", "it answered 'SSH-2.0-O'")])
def test_an_address_that_is_not_ray_is_one_line_in_seconds_for_the_dry_run_and_the_run(
        tmp_path, capsys, monkeypatch, kind, said):
    monkeypatch.setattr(cluster, "HANDSHAKE_TIMEOUT", 2.0)
    config = write_config(tmp_path)
    results = tmp_path / "results"
    with not_ray(kind) as address:
        for extra in (["--dry-run"], ["--no-mlflow"]):
            started = time.monotonic()
            assert main(["run", str(config), "--address", address, "--results", str(results), *extra]) == 2
            assert time.monotonic() - started < 15
            line = one_error_line(capsys)
            assert line.startswith(f"bench: error: nothing at {address} answers as a Ray cluster ({said}"), line
            assert "ray start --head --port" in line
            assert capsys.readouterr().out == ""
    assert not results.exists()


def test_a_real_ray_head_passes_the_handshake(plugin_ray):
    """No false alarm: the GCS of a real Ray answers gRPC's handshake (and a port where nothing listens is still
    refused at once, as before)."""
    address = plugin_ray.get_runtime_context().gcs_address
    started = time.monotonic()
    cluster.probe(address, timeout=5)
    assert time.monotonic() - started < 5
