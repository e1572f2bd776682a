"""Fault injection, third round (issue #29): every failure one line, never a hang. A worker's deterministic error is
not retried by Ray, `--address` to a port that is not Ray answers in seconds, seed counts and long names are refused
before anything is built, a pack's memory bound is checked, unwritable outputs are named up front, a reader that
leaves loses no rows, and damaged CIFAR files are one line. Each test fails on the code before that issue."""

from __future__ import annotations

import gzip
import http.server
import os
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
from bench.grid.files import Overrides, load_experiment
from bench.grid.runner import Settings, run_experiment
from bench.methods import registry as methods
from bench.schema import check_name
from bench.store.folder import read_table
from tests.conftest import method_that_raises
from tests.grid.test_damaged_files_and_bad_values import one_error_line

GRID = dict(name="last", dataset="synthetic", noise="case3", r=[0.2], seeds=[0], epochs=1, epochs_warmup=1,
            resources={"cpu": 1}, methods={"ce": {}})



def write_config(folder: Path, **changes) -> Path:
    path = folder / "grid.yaml"
    path.write_text(yaml.safe_dump({**GRID, **changes}, sort_keys=False))
    return path


def _clear_registries() -> None:
    for registry in (datasets, methods, models.registry):
        registry.cache_clear()


@pytest.fixture(scope="module")
def plugin_ray(tmp_path_factory):
    """A local Ray whose workers see a plug-in folder with the `crashy` method (the folder is set before Ray starts,
    so that the workers inherit it)."""
    import ray

    folder = tmp_path_factory.mktemp("plugins")
    method_that_raises(folder, "crashy", r'ValueError("a bug in the loss,\n  on two lines")')
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
    # Seconds on an idle machine; the bound only catches minutes of retries (the log's count below is the proof).
    assert time.monotonic() - started < 300
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


# -- 1. values that slipped past the checks ----------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["set", "file"])
@pytest.mark.parametrize("count", ["99999999999999999999", "30000000"])
def test_a_seed_count_is_checked_before_its_list_is_built(tmp_path, capsys, where, count):
    config = write_config(tmp_path)
    if where == "file":
        config.write_text(config.read_text().replace("seeds:\n- 0", f"seeds: {count}"))
    sets = ["--set", f"seeds={count}"] if where == "set" else []
    started = time.monotonic()
    assert main(["run", str(config), "--dry-run", *sets]) == (0 if count == "30000000" else 2)
    assert time.monotonic() - started < 10
    if count == "30000000":  # counted, not built: the grid-size guard's summary
        assert "grid: 30,000,000 trials = 30,000,000 ce; more than 100,000: not expanded, not listed (running it " \
            "needs --yes)" in capsys.readouterr().out.splitlines()
        assert main(["run", str(config), *sets]) == 2
        assert "30,000,000 trials" in one_error_line(capsys) and time.monotonic() - started < 20
        return
    assert one_error_line(capsys).endswith(
        "seeds: a count of seeds (0..N-1) must be at most 9,007,199,254,740,992 (the largest seed + 1), got "
        "99999999999999999999; give a smaller count, or a list of seeds")


def test_a_long_experiment_name_is_refused_before_ray_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path)
    assert main(["run", str(config), "--set", "name=" + "a" * 250, "--no-mlflow"]) == 2
    line = one_error_line(capsys)
    assert "name: use letters, digits, '-', '_' and '.', at most 100 characters (it names files), got 'aaa" in line
    assert not (tmp_path / "results").exists()
    # The longest allowed name, renamed by a change of its grid, still names files and rows.
    exp = load_experiment(write_config(tmp_path, name="b" * 100), overrides=Overrides(("r=[0.4]",)))
    assert len(exp.name) == 109 and check_name("experiment", exp.trials()[0].experiment) == exp.name


def test_a_set_for_a_method_that_methods_leaves_out_is_refused(tmp_path, capsys):
    config = write_config(tmp_path, methods={"ce": {}, "dmi": {}})
    assert main(["run", str(config), "--dry-run", "--methods", "dmi", "--set", "methods.ce.lr=2e-3"]) == 2
    assert one_error_line(capsys) == ("bench: error: --set methods.ce.lr=2e-3: changes method ce, which --methods dmi "
                                      "leaves out; add it to --methods, or drop this --set")
    assert main(["run", str(config), "--dry-run", "--methods", "dmi,ce", "--set", "methods.ce.lr=2e-3"]) == 0


@pytest.mark.parametrize("value", ["inf", "1e400", "nan"])
def test_a_pack_memory_bound_that_is_not_a_finite_number_is_one_line_before_ray(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("BENCH_PACK_MEMORY_GB", value)
    config = write_config(tmp_path, device="cuda", resources={"cpu": 1, "gpu": 1}, methods={"ce": {}, "dmi": {}})
    results = tmp_path / "results"
    for extra in (["--dry-run"], ["--no-mlflow", "--pack", "2"]):
        assert main(["run", str(config), "--results", str(results), *extra]) == 2
        assert one_error_line(capsys) == (f"bench: error: BENCH_PACK_MEMORY_GB must be a positive number of GiB, got "
                                          f"{value!r}: set it to the GiB a pack may take on a GPU (e.g. 20), or "
                                          "unset it")
    assert not results.exists()


def test_a_pack_memory_bound_for_one_member_plans_solo_trials(monkeypatch, capsys, tmp_path):
    """Where the bound holds one member but not two, `--pack auto` runs the trials solo (it planned packs of a
    whole warm-start cell, 2 here, while saying "at most 1 a pack")."""
    import dataclasses

    from bench.exec.memory import GIB, pack_memory
    from bench.exec.packed import EVAL_IMAGES
    from bench.exec.prepare import prepare
    from bench.grid.plan import plan_units
    from bench.trial import TrialConfig

    trials = [TrialConfig("synthetic", m, "case3", r, seed=0, device="cuda", epochs=1, epochs_warmup=1)
              for m in ("ce", "dmi") for r in (0.2, 0.4)]
    memory = pack_memory(prepare(TrialConfig("synthetic", "ce", "case3", 0.2, epochs=1, epochs_warmup=1), "unused",
                                 log=lambda s: None))
    memory = dataclasses.replace(memory, chunk=EVAL_IMAGES["cuda"])
    monkeypatch.setenv("BENCH_PACK_MEMORY_GB", str((memory.bytes(1) + memory.bytes(2)) / 2 / GIB))
    units = plan_units(trials, "auto", "unused")
    assert [len(u) for u in units] == [1] * 4 and sorted(u.trials[0].trial_id for u in units) == sorted(
        t.trial_id for t in trials)


# -- 1. outputs that cannot be written ---------------------------------------------------------------------------------
@pytest.fixture
def rows(tmp_path) -> Path:
    """A results folder with one real row (CE on the synthetic set)."""
    from bench.exec.trainer import run_trial
    from bench.trial import TrialConfig

    folder = tmp_path / "results"
    run_trial(TrialConfig("synthetic", "ce", "case3", 0.2, epochs=1, epochs_warmup=1), "unused", results=folder,
              log=lambda s: None)
    return folder


def test_outputs_blocked_by_a_file_are_one_line_and_nothing_is_written(rows, tmp_path, capsys):
    (tmp_path / "a_file").write_text("not a folder")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    cases = [
        (["report", str(rows), "--out", str(tmp_path / "a_file")],
         f"report folder {tmp_path / 'a_file'} is a file, not a folder; give another folder with --out"),
        (["results", str(rows), "--out", str(tmp_path / "a_file" / "all.parquet")],
         f"output file {tmp_path / 'a_file' / 'all.parquet'}: {tmp_path / 'a_file'} is a file, not a folder; give "
         "another file to --out"),
        (["sync-mlflow", str(rows), "--mlflow-uri", f"sqlite:///{tmp_path / 'a_file' / 'mlflow.db'}"],
         f"MLflow store {tmp_path / 'a_file' / 'mlflow.db'}: {tmp_path / 'a_file'} is a file, not a folder; name a "
         "store you can write with --mlflow-uri (e.g. sqlite:////tmp/mlflow.db)"),
    ]
    for args, message in cases:
        started = time.monotonic()
        assert main(args) == 2, args
        assert one_error_line(capsys) == f"bench: error: {message}"
        assert time.monotonic() - started < 10
    (rows / "report").write_text("a file where the default report folder goes")
    assert main(["report", str(rows)]) == 2
    assert "report folder" in one_error_line(capsys)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == sorted(before + [Path("results/report")])
    assert (tmp_path / "a_file").read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folders_are_one_line_and_nothing_is_written(rows, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    cases = [(["report", str(rows)], "report folder"),
             (["results", str(rows), "--out", str(locked / "all.csv")], "output file"),
             (["labels", "--dataset", "synthetic", "--noise", "case3", "--r", "0.2", "--out",
               str(locked / "labels.parquet")], "output file"),
             (["sync-mlflow", str(rows)], "MLflow store")]
    for path in (rows, locked):
        path.chmod(0o555)
    try:
        for args, what in cases:
            started = time.monotonic()
            assert main(args) == 2, args
            line = one_error_line(capsys)
            assert line.startswith(f"bench: error: {what} ") and "cannot be written (Permission denied" in line
            assert time.monotonic() - started < 10
    finally:
        for path in (rows, locked):
            path.chmod(0o755)
    assert not list(locked.iterdir()) and not (rows / "report").exists() and not (rows / "mlflow.db").exists()


# -- 3. the reader leaves ----------------------------------------------------------------------------------------------
def test_a_reader_that_leaves_loses_no_rows(tmp_path):
    """`bench run GRID | head -1`: the grid goes on, its lines discarded, every row written; one warning on stderr
    (it stopped at the next line, exit 0, no row)."""
    import subprocess
    import sys

    config = write_config(tmp_path, r=[0.2, 0.4])
    results = tmp_path / "results"
    run = subprocess.Popen([str(Path(sys.executable).parent / "bench"), "run", str(config), "--results", str(results),
                            "--no-mlflow", "--num-cpus", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore"})
    try:
        first = run.stdout.readline()
        run.stdout.close()  # as `head -1` does
        err = run.stderr.read()
        assert run.wait(timeout=240) == 0, err
    finally:
        run.kill()
    assert first.startswith("last: running 2 of 2 trials")
    assert err.splitlines() == ["bench: warning: the reader of this command's output left; the grid goes on without "
                                "printing, writing every row (see them with `bench results`)"]
    assert sorted(read_table(results)["status"]) == ["ok", "ok"]


# -- 5. crafted or tiny CIFAR-100 files --------------------------------------------------------------------------------
@pytest.fixture
def cifar100_root(tmp_path, monkeypatch) -> Path:
    """A data root with a 60 + 20 image CIFAR-100 in the published layout (checksums off: the files are ours)."""
    from tests.datasets.test_cifar100 import write_cifar100

    write_cifar100(tmp_path / "data")
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    return tmp_path / "data"


def cifar100_trial(root: Path, results: Path) -> list[str]:
    return ["trial", "--dataset", "cifar100", "--method", "ce", "--noise", "symmetric", "--r", "0.2",
            "--epochs-warmup", "0", "--epochs", "0", "--data-root", str(root), "--results", str(results)]


def test_a_pickle_declaring_a_huge_size_is_one_line(cifar100_root, tmp_path, capsys):
    import struct

    train = cifar100_root / "cifar-100-python" / "train"
    train.write_bytes(b"\x80\x04\x8e" + struct.pack("<Q", 2**60) + b"x" * 19)  # BINBYTES8 of 2**60 bytes: 30 bytes
    assert main(cifar100_trial(cifar100_root, tmp_path / "results")) == 2
    assert one_error_line(capsys) == (f"bench: error: {train} is not a CIFAR-100 python file (MemoryError); use the "
                                      "official files")
    assert not (tmp_path / "results").exists()


def test_a_train_file_too_small_for_a_validation_split_is_one_line(cifar100_root, tmp_path, capsys):
    import pickle

    import numpy as np

    train = cifar100_root / "cifar-100-python" / "train"
    entry = pickle.loads(train.read_bytes())
    train.write_bytes(pickle.dumps({**entry, b"data": entry[b"data"][:4], b"fine_labels": entry[b"fine_labels"][:4],
                                    b"coarse_labels": entry[b"coarse_labels"][:4]}, protocol=2))
    assert np.asarray(pickle.loads(train.read_bytes())[b"data"]).shape == (4, 3072)
    for command in (cifar100_trial(cifar100_root, tmp_path / "results"),
                    ["labels", "--dataset", "cifar100", "--noise", "symmetric", "--r", "0.2", "--data-root",
                     str(cifar100_root), "--out", str(tmp_path / "labels.parquet")]):
        assert main(command) == 2
        assert one_error_line(capsys) == (
            f"bench: error: cifar100 under {cifar100_root}: the validation split is empty (training 4, validation 0, "
            "test 20 examples; the paper's: 40000 / 10000 / 10000): its files hold too few examples; use the "
            "official files")
    assert not (tmp_path / "results").exists() and not (tmp_path / "labels.parquet").exists()


def test_an_idx_header_longer_than_its_file_is_one_line(tiny_fashion, tmp_path, capsys):
    images = tiny_fashion / "FashionMNIST" / "raw" / "train-images-idx3-ubyte.gz"
    images.write_bytes(gzip.compress(bytes([0, 0, 0x08, 200]) + b"\0" * 10))  # 200 dimensions, 10 bytes
    assert main(["trial", "--dataset", "fashion_mnist", "--method", "ce", "--noise", "case3", "--r", "0.2",
                 "--epochs-warmup", "0", "--epochs", "0", "--data-root", str(tiny_fashion), "--results",
                 str(tmp_path / "results")]) == 2
    assert one_error_line(capsys) == (f"bench: error: {images} is truncated: its header names 200 dimensions, and the "
                                      "file ends before them")
    assert not (tmp_path / "results").exists()
