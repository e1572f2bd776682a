"""Fault injection, sixth round (issue #45): a stop at every moment, and an address bounded whatever answers. An
HTTP/2 server that acknowledges PING (every one does), or a gRPC server with no services, at `--address` is one line
within the handshake's bound (it was 120-300 s of silence, then exit 15); SIGTERM and SIGINT during Ray's start,
during a dry run and to `bench trial` stop as a running grid does (143 / 130, one line, nothing left running); the
stop's summary counts what it did, and the rows that landed during the stop are in MLflow before the driver exits.
Each test fails on the code before that issue."""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from test_faults import one_error_line, write_config

from bench.cli.main import main
from bench.grid import cluster
from bench.grid.files import load_experiment
from bench.grid.runner import Settings, run_experiment
from bench.store.folder import read_table


# -- --address at an HTTP/2 server that is not Ray ----------------------------------------------------------------
def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(name: bytes, value: bytes) -> bytes:
    """An HPACK header field, literal without indexing, new name, no Huffman coding (RFC 7541, 6.2.2): lengths
    below 127 fit the 7-bit prefix."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


UNIMPLEMENTED = (literal(b":status", b"200") + literal(b"content-type", b"application/grpc")
                 + literal(b"grpc-status", b"12") + literal(b"grpc-message", b"Method not found"))


@contextmanager
def http2_server(requests: str) -> Iterator[str]:
    """An HTTP/2 server over plain TCP on 127.0.0.1 (h2c, as gRPC speaks it): it answers the preface with SETTINGS,
    acknowledges SETTINGS and every PING; `requests`: "unimplemented" answers each request as a gRPC server with no
    services does (trailers only, grpc-status 12), "ignored" never answers one. Its address."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def connection(conn: socket.socket) -> None:
        conn.settimeout(0.2)
        data = b""
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        while not stop.is_set():
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            data += chunk
            if data.startswith(preface):
                data = data[len(preface):]
                conn.sendall(frame(4, 0, 0))  # our SETTINGS
            while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
                size, kind, flags = int.from_bytes(data[:3], "big"), data[3], data[4]
                stream = struct.unpack(">I", data[5:9])[0] & 0x7FFFFFFF
                payload, data = data[9:9 + size], data[9 + size:]
                if kind == 4 and not flags & 1:
                    conn.sendall(frame(4, 1, 0))  # SETTINGS acknowledged
                elif kind == 6 and not flags & 1:
                    conn.sendall(frame(6, 1, 0, payload))  # PING acknowledged
                elif kind == 1 and requests == "unimplemented":
                    conn.sendall(frame(1, 0x5, stream, UNIMPLEMENTED))  # END_STREAM | END_HEADERS
        conn.close()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=connection, args=(conn,), daemon=True).start()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        server.join()
        listener.close()


@pytest.mark.parametrize("requests", ["unimplemented", "ignored"])
def test_an_http2_server_that_is_not_ray_is_one_line_within_the_bound(tmp_path, capsys, monkeypatch, requests):
    """Both pass the old handshake (SETTINGS, then PING acknowledged); Ray's own first call, with a deadline, tells
    them from a Ray head."""
    monkeypatch.setattr(cluster, "HANDSHAKE_TIMEOUT", 8.0)
    config = write_config(tmp_path)
    with http2_server(requests) as address:
        with socket.create_connection(("127.0.0.1", int(address.rsplit(":", 1)[1]))) as sock:  # the old one passes
            assert cluster._handshake(sock, time.monotonic() + 5) is not None
        for extra in (["--dry-run"], ["--no-mlflow"]):
            started = time.monotonic()
            assert main(["run", str(config), "--address", address, "--results", str(tmp_path / "res"), *extra]) == 2
            assert time.monotonic() - started < cluster.HANDSHAKE_TIMEOUT + 3
            line = one_error_line(capsys)
            assert line.startswith(f"bench: error: nothing at {address} answers as a Ray cluster (an HTTP/2 server "
                                   "answered, but "), line
            assert "ray start --head --port" in line
    assert not (tmp_path / "res").exists()


# -- what a stop did, counted and mirrored ---------------------------------------------------------------------------
def signal_when(condition, sig: int, timeout: float = 120.0) -> threading.Thread:
    """A thread that sends `sig` to this process once `condition()` holds."""
    def wait() -> None:
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), sig)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def test_rows_that_land_during_a_stop_are_counted_and_in_mlflow_before_the_driver_exits(ray_session, tmp_path):
    """A unit hears of the stop at its next report (here: its closing one), so the trial in flight finishes and
    writes its row while the grid stops. That row was counted, but reached MLflow only at a later run's backfill,
    its warm start counted neither trained nor reused ("0 trained, 0 reused"), and the summary asked to run the
    command again with nothing left to run."""
    config = write_config(tmp_path, r=[0.0], epochs=8)
    results = tmp_path / "results"
    lines: list[str] = []
    settings = Settings(results=str(results), data_root=tmp_path, max_concurrent=1, report_every=1000.0)
    sender = signal_when(lambda: any((results / "checkpoints").glob("*.pt")), signal.SIGTERM)
    tally = run_experiment(load_experiment(config), settings, lines.append)
    sender.join()
    assert tally.interrupted == signal.SIGTERM
    rows = read_table(results)
    assert rows.height == 1  # it landed during the stop
    text = "\n".join(lines)
    assert "warm-start cache: 1 trained, 0 reused" in text, text
    assert "stopped by SIGTERM: all 1 trials have their row; nothing is left to run" in text, text
    assert "run the same command again" not in text, text
    assert "MLflow: 1 runs logged to" in text, text
    runs = mlflow_runs(results)
    assert sorted(runs) == sorted(rows["trial_id"].to_list())


def mlflow_runs(results) -> list[str]:
    """The trial ids of the runs in the results folder's MLflow store, read with MLflow's own client."""
    from mlflow.tracking import MlflowClient

    from bench.store.mirror import tracking_uri

    client = MlflowClient(tracking_uri(str(results), None))
    experiments = client.search_experiments()
    runs = client.search_runs([e.experiment_id for e in experiments])
    return [r.data.tags["bench.trial_id"] for r in runs if r.data.tags.get("bench.complete")]
