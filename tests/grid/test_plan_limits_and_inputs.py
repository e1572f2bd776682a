"""Fault injection, fourth round (issue #40): what a plan promises it does, and inputs read where they are read. Pack
sizes hold (`--pack K`, the executor table's limit, the memory bound) even where a warm-start cell is larger; every
malformed executor table is one line; a huge finite `BENCH_PACK_MEMORY_GB` is one line. Each test fails on the code
before that issue."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from bench.cli.main import main
from bench.config import UserError
from bench.exec.memory import GIB, pack_memory
from bench.exec.packed import EVAL_IMAGES
from bench.exec.prepare import prepare
from bench.grid import cluster, executor_table
from bench.grid.plan import plan_units, warm_cell
from bench.store.folder import read_table
from bench.trial import TrialConfig
from tests.grid.test_damaged_files_and_bad_values import one_error_line

METHODS = ("ce", "dmi", "gce", "fw", "sce")  # all packable


def one_cell(device: str = "cuda") -> list[TrialConfig]:
    """Five trials of one warm-start cell (five methods, one noise level and seed)."""
    return [TrialConfig("synthetic", m, "case3", 0.2, seed=0, device=device, epochs=1, epochs_warmup=1)
            for m in METHODS]


def assert_every_trial_once(units, trials, most: int) -> None:
    assert max(len(u) for u in units) <= most
    assert sorted(t.trial_id for u in units for t in u.trials) == sorted(t.trial_id for t in trials)


# -- 5. pack sizes hold ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 3, 4])
def test_pack_k_holds_for_a_cell_larger_than_k(k):
    trials = one_cell()
    assert len({warm_cell(t) for t in trials}) == 1
    units = plan_units(trials, k)
    assert_every_trial_once(units, trials, k)
    parts = math.ceil(5 / k)  # as few units as K allows, as equal as can be
    assert sorted(map(len, units)) == sorted(len(range(5)[i::parts]) for i in range(parts))


def test_the_executor_tables_limit_holds_for_a_cell_larger_than_it(tmp_path, monkeypatch):
    (tmp_path / "table.csv").write_text("model,device,executor,trials,images_per_s,measured,source\n"
                                        "*,cpu,streams,3,,today,a test\n")
    monkeypatch.setenv("BENCH_EXECUTOR_TABLE", str(tmp_path / "table.csv"))
    trials = one_cell("cpu")
    units = plan_units(trials, "auto")
    assert_every_trial_once(units, trials, 3)
    assert {u.kind for u in units} == {"streams"}


def test_the_pack_size_the_memory_advice_names_is_the_plans(monkeypatch):
    """With memory for three members, `--pack auto` plans packs of three at most, and so does the `--pack K` that
    the memory check names (it named 3, then `--pack 3` built the same pack of five)."""
    memory = dataclasses.replace(pack_memory(prepare(one_cell("cpu")[0], "unused", log=lambda s: None)),
                                 chunk=EVAL_IMAGES["cuda"])
    monkeypatch.setenv("BENCH_PACK_MEMORY_GB", str((memory.bytes(3) + memory.bytes(4)) / 2 / GIB))
    fits = memory.members(int((memory.bytes(3) + memory.bytes(4)) / 2))
    assert fits == 3
    trials = one_cell()
    for pack in ("auto", fits):
        assert_every_trial_once(plan_units(trials, pack, "unused"), trials, fits)


# -- 6. executor tables ----------------------------------------------------------------------------------------------
HEADER = ",".join(executor_table.COLUMNS).encode()


@pytest.mark.parametrize("body, message", [
    ("*,cpu,streams,²,,t,s".encode(), "line 2: trials must be a whole number >= 1, got '²'"),
    ("*,cpu,streams,٣,,t,s".encode(), "line 2: trials must be a whole number >= 1, got '٣'"),
    (b"*,cpu,streams,3,,t,s,extra", "line 2: 8 fields where the header has 7"),
    (b"*,cpu,streams", "line 2: 3 fields where the header has 7"),
    (b"*,cpu,str\xffeams,3,,t,s", "line 2: not UTF-8 text (byte 0xff)"),
    (b'*,cpu,streams,3,,t,s\n*,cpu,"x"y,3,,t,s', "line 3: not a CSV line"),
    (b"*,cpu,streams," + b"9" * 5000 + b",,t,s", "line 2: trials must be at most 999999"),
])
def test_a_malformed_executor_table_is_one_line(tmp_path, monkeypatch, capsys, body, message):
    path = tmp_path / "table.csv"
    path.write_bytes(HEADER + b"\n" + body + b"\n")
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        executor_table.read_table(path)
    monkeypatch.setenv("BENCH_EXECUTOR_TABLE", str(path))
    config = tmp_path / "grid.yaml"
    config.write_text(yaml.safe_dump(dict(name="table", dataset="synthetic", noise="case3", r=[0.2], seeds=[0],
                                          epochs=1, epochs_warmup=1, methods={"ce": {}})))
    assert main(["run", str(config), "--results", str(tmp_path / "results"), "--dry-run"]) == 2
    assert message in one_error_line(capsys)


# -- 8. a huge finite pack memory bound -----------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["1.7e299", "1e300", "2e6"])
def test_a_huge_finite_pack_memory_bound_is_one_line(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("BENCH_PACK_MEMORY_GB", value)
    config = tmp_path / "grid.yaml"
    config.write_text(yaml.safe_dump(dict(name="huge", dataset="synthetic", noise="case3", r=[0.2], seeds=[0],
                                          epochs=1, epochs_warmup=1, methods={"ce": {}})))  # a CPU grid
    results = tmp_path / "results"
    for extra in (["--dry-run"], ["--no-mlflow"]):
        assert main(["run", str(config), "--results", str(results), *extra]) == 2
        assert one_error_line(capsys) == (f"bench: error: BENCH_PACK_MEMORY_GB must be at most 1,048,576 GiB (1 PiB, "
                                          f"more than any GPU holds), got {value!r}: set it to the GiB a pack may "
                                          "take on a GPU (e.g. 20), or unset it")
    assert not results.exists()


# -- 7. --address to an HTTP/2 service that is not Ray ----------------------------------------------------------------
def test_an_address_that_answers_the_preface_then_nothing_is_one_line_within_seconds(tmp_path, capsys, monkeypatch):
    """A server that answers HTTP/2's preface with a SETTINGS frame and then says nothing (Ray waited on it for
    minutes, the dry run 240 s and the run 580 s): one line, exit 2, within the handshake's bound. The bound is
    2 s here (10 s in production): each command waits it out whole, and the line must name it."""
    monkeypatch.setattr(cluster, "HANDSHAKE_TIMEOUT", 2.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        stop = threading.Event()

        def preface_then_nothing() -> None:
            s.settimeout(0.2)
            held = []
            while not stop.is_set():
                try:
                    conn, _ = s.accept()
                except TimeoutError:
                    continue
                conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # an empty SETTINGS frame, then silence
                held.append(conn)
            for conn in held:
                conn.close()

        server = threading.Thread(target=preface_then_nothing, daemon=True)
        server.start()
        address = f"127.0.0.1:{s.getsockname()[1]}"
        try:
            with pytest.raises(UserError, match="answers as a Ray cluster .no answer to a Ray handshake in 1s"):
                cluster.probe(address, timeout=1)
            config = tmp_path / "grid.yaml"
            config.write_text(yaml.safe_dump(dict(name="addr", dataset="synthetic", noise="case3", r=[0.2],
                                                  seeds=[0], epochs=1, epochs_warmup=1, methods={"ce": {}})))
            for extra in (["--dry-run"], ["--no-mlflow"]):
                started = time.monotonic()
                assert main(["run", str(config), "--results", str(tmp_path / "r"), "--address", address, *extra]) == 2
                assert time.monotonic() - started < cluster.HANDSHAKE_TIMEOUT + 5
                assert (f"nothing at {address} answers as a Ray cluster (no answer to a Ray handshake in 2s)"
                        in one_error_line(capsys))
        finally:
            stop.set()
            server.join()
    assert not (tmp_path / "r").exists()


# -- 9. results folders whose names a URI cannot carry ---------------------------------------------------------------
@pytest.mark.parametrize("name, odd", [("pct%20x", "'%'"), ("q?x=1", "'?'"), ("h#x", "'#'")])
def test_a_results_folder_name_mlflow_cannot_carry_is_one_line_before_anything(tmp_path, capsys, name, odd):
    """`pct%20x` cost minutes of MLflow retries, `q?x=1` put the database in a file beside the folder: refused."""
    config = tmp_path / "grid.yaml"
    config.write_text(yaml.safe_dump(dict(name="odd", dataset="synthetic", noise="case3", r=[0.2], seeds=[0],
                                          epochs=1, epochs_warmup=1, methods={"ce": {}})))
    results = tmp_path / name
    for extra in (["--dry-run"], []):
        assert main(["run", str(config), "--results", str(results), *extra]) == 2
        line = one_error_line(capsys)
        assert line.startswith(f"bench: error: results folder {results}: its path holds {odd}, which the MLflow "
                               "store's URI"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.yaml"]  # nothing written, nothing beside it
    assert main(["run", str(config), "--results", str(results), "--dry-run", "--mlflow-uri",
                 f"sqlite:///{tmp_path / 'store.db'}"]) == 0  # a store named elsewhere is fine
    capsys.readouterr()


# -- 10. standard output or error that cannot be used -----------------------------------------------------------------
BENCH = [sys.executable, "-m", "bench.cli.main"]


def closing(fd: int):
    return lambda: os.close(fd)


def test_a_command_whose_stdout_refuses_writes_is_one_line_on_stderr():
    with open("/dev/full", "w") as full:
        done = subprocess.run([*BENCH, "methods"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["bench: error: standard output cannot be written (No space left on device); "
                                        "send it to a file or a pipe that takes it"]


@pytest.mark.parametrize("fault", ["stdout to /dev/full", "stdout closed", "stderr closed"])
def test_a_grid_goes_on_where_its_output_cannot_be_used(tmp_path, fault):
    """The grid runs and writes its row; a refused stdout is one warning on stderr (it was a traceback, exit 1),
    and a closed stderr costs nothing (Ray's start failed on it: a silent exit 1)."""
    config = tmp_path / "grid.yaml"
    config.write_text(yaml.safe_dump(dict(name="out", dataset="synthetic", noise="case3", r=[0.2], seeds=[0],
                                          epochs=1, epochs_warmup=1, methods={"ce": {}})))
    results = tmp_path / "results"
    command = [*BENCH, "run", str(config), "--results", str(results), "--no-mlflow", "--num-cpus", "1"]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    with open("/dev/full", "w") as full:
        done = subprocess.run(command, text=True, timeout=300, env=env, stdout=full if "full" in fault else
                              subprocess.PIPE, stderr=subprocess.PIPE,
                              preexec_fn=closing(1 if fault == "stdout closed" else 2) if "closed" in fault else None)
    assert done.returncode == 0, done.stderr
    assert read_table(results)["status"].to_list() == ["ok"]
    if fault == "stdout to /dev/full":
        assert done.stderr.splitlines() == ["bench: warning: standard output cannot be written (No space left on "
                                            "device); the grid goes on without printing, writing every row (see "
                                            "them with `bench results`)"]
    elif fault == "stderr closed":
        assert "out: 1 of 1 trials finished" in done.stdout


# -- 11. reports say which protocol their tables show ------------------------------------------------------------------
def report_rows(bench_as: str | None) -> list[dict]:
    """The protocol panel's test rows, bench's relabelled `bench_as` (None: left out)."""
    from tests.report.test_protocols_panel import rows

    out = []
    for row in rows():
        if "protocol" not in row:  # bench's
            if bench_as is None:
                continue
            row = {**row, "protocol": bench_as, "switches": "first_batch_selection"}
        out.append(row)
    return out


@pytest.mark.parametrize("bench_as, shown, says", [
    (None, "authors", "The tables show the authors protocol's trials."),
    ("bench+first_batch_selection", "authors", "Protocols: authors (7 trials), bench+first_batch_selection (9 "
     "trials); the tables show authors's only (the first in sorted order); the others are not shown, and no panel "
     "compares them: that needs bench's trials of the same cells."),
])
def test_a_report_names_the_protocol_of_its_tables_and_promises_only_its_panels(tmp_path, bench_as, shown, says):
    from bench.report.build import build_report, terminal_leaderboard
    from tests.report.test_report import write

    results = write(tmp_path / "r", report_rows(bench_as))
    written = build_report(results, tmp_path / "report", log=lambda s: None)
    md = written["leaderboard.md"].read_text()
    assert says in md and says in terminal_leaderboard(str(results))
    # No protocol-effect panel is promised: where it has nothing to show, one line says it is left out and why
    # (issue #44: no empty panels, each left out in one line).
    left_out = "Protocol effect: left out, no cell holds trials of bench and of another protocol."
    assert "protocol-effect panel compares" not in md
    assert [line for line in md.splitlines() if "Protocol effect" in line] == [left_out]
    html = written["report.html"].read_text()
    assert html.count("Protocol effect") == 1 and left_out in html


# -- 12. MR files that cannot be the published ones --------------------------------------------------------------------
SENTENCE = "a film {} that moves slowly and well enough ."  # ten words, 46 bytes with pos or neg


def write_mr(root, lines: int = 300) -> Path:
    """MR in its published layout: `lines` sentences of ten words in each file."""
    folder = root / "MR" / "rt-polaritydata"
    folder.mkdir(parents=True)
    for kind in ("pos", "neg"):
        (folder / f"rt-polarity.{kind}").write_text((SENTENCE.format(kind) + "\n") * lines)
    return folder


MR_TRIAL = ["trial", "--dataset", "mr", "--method", "ce", "--noise", "pos_to_neg", "--r", "0.2", "--epochs-warmup",
            "0", "--epochs", "0"]


@pytest.mark.parametrize("damage, says", [
    ("a folder", "rt-polarity.pos is a folder, not the published file"),
    ("line ends lost", f"rt-polarity.pos, line 1: {300 * (len(SENTENCE.format('pos')) + 1):,} bytes on one line, "
                       "where the published file's longest holds 269: were its line ends lost?"),
])
def test_an_mr_file_that_cannot_be_the_published_one_is_one_line(tmp_path, monkeypatch, capsys, damage, says):
    """A folder named rt-polarity.pos (a traceback, and `bench datasets` said ready), or the file with its line ends
    stripped (checksums off: one sentence of 3,000 words, and the encoded set grew to gigabytes)."""
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    folder = write_mr(tmp_path / "data")
    pos = folder / "rt-polarity.pos"
    if damage == "a folder":
        pos.unlink()
        pos.mkdir()
    else:
        pos.write_bytes(pos.read_bytes().replace(b"\n", b" "))
    assert main([*MR_TRIAL, "--data-root", str(tmp_path / "data"), "--results", str(tmp_path / "r")]) == 2
    line = one_error_line(capsys)
    assert line.startswith("bench: error: mr: ") and says in line, line
    assert not (tmp_path / "r").exists()
    assert main(["datasets", "--data-root", str(tmp_path / "data")]) == 0
    listed = capsys.readouterr().out
    assert re.search(r"^mr +damaged: 1 of 2 files not the published ones", listed, re.M), listed
    assert says in listed


def test_a_small_mr_copy_still_loads(tmp_path, monkeypatch):
    """The bound is on files far over the published size: a small copy (tests, a subset) loads, with its note."""
    from bench.datasets.mr import MovieReview

    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    write_mr(tmp_path)
    splits = MovieReview(tmp_path).load()
    assert len(splits.train) + len(splits.val) + len(splits.test) == 600


def test_a_file_where_a_published_folder_belongs_is_one_line_and_a_folder_that_belongs_passes(tmp_path):
    """A name in a dataset's `files` ending in "/" is a folder (Clothing1M's images/, ANIMAL-10N's training/): that
    folder passes the check, and a plain file in its place is named, as a folder in a file's place is."""
    from bench.datasets.animal10n import Animal10N

    root = tmp_path / "data"
    ds = Animal10N(root)
    ds.root.mkdir(parents=True)
    (ds.root / "training").mkdir()
    (ds.root / "testing").write_text("not a folder")
    assert ds.wrong_files() == [f"{ds.root / 'testing'} is a file, not the published folder"]
