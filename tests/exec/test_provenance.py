"""Provenance a cluster user needs (issue 46, item 3): each row names the node that ran it (host, Ray node id) and
the device (the CPU's model, or the GPU's name and UUID); `bench results --by-node` groups the rows by them.

A trial in a Ray worker names that worker's node (tests/grid/test_multinode.py: two nodes, each trial's row names the
node its worker ran on); here, outside Ray and in a local Ray.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.exec.trainer import run_trial
from bench.store.columns import ROW, row_schema
from bench.store.folder import read_table
from bench.trial import TrialConfig
from tests.report.test_report import make_row, write

BIN = Path(sys.executable).parent


def _cpuinfo_models() -> set[str]:
    """The model names /proc/cpuinfo lists (one per logical CPU), read here with a regex of the test's own."""
    return set(re.findall(r"^model name\s*:\s*(.+?)\s*$", Path("/proc/cpuinfo").read_text(), re.MULTILINE))


def test_the_provenance_columns_are_declared_text() -> None:
    schema = row_schema()
    for name in ("host", "node_id", "device_model", "device_uuid"):
        assert ROW[name].group == "provenance" and str(schema.field(name).type) == "string"


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists() or not _cpuinfo_models(), reason="no /proc/cpuinfo model")
def test_a_trial_without_ray_names_its_cpu_and_no_node(tmp_path: Path) -> None:
    """`bench trial` runs without Ray: its row's node id is empty, its device the CPU's model as /proc/cpuinfo says
    it (the same model on every logical CPU of this machine), no UUID."""
    run = subprocess.run([str(BIN / "bench"), "trial", "--dataset", "synthetic", "--method", "ce", "--noise",
                          "case3", "--r", "0.2", "--epochs", "1", "--epochs-warmup", "1", "--results", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    row = read_table(tmp_path).to_dicts()
    assert len(row) == 1
    assert row[0]["node_id"] == "" and row[0]["device_uuid"] == ""
    assert {row[0]["device_model"]} == _cpuinfo_models()


def test_a_trial_in_a_ray_worker_names_that_node(tmp_path: Path, ray_session) -> None:
    """In a Ray worker the row names the node the worker runs on: the one node of a local Ray, as Ray lists it."""
    ray = ray_session

    @ray.remote(num_cpus=1)
    def trial() -> dict:
        return run_trial(TrialConfig("synthetic", "ce", "case3", 0.2, seed=0, epochs=1, epochs_warmup=1), "unused",
                         results=tmp_path, log=lambda s: None)

    row = ray.get(trial.remote())
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 1 and row["node_id"] == nodes[0] and len(nodes[0]) == 56  # Ray's ids: 28 bytes, hex
    assert read_table(tmp_path)["node_id"].to_list() == nodes


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no NVIDIA GPU here (nvidia-smi absent)")
def test_a_cuda_trial_names_its_gpu_and_its_uuid(tmp_path: Path) -> None:
    """The GPU's name and UUID as `nvidia-smi -L` lists GPU 0 (`GPU 0: NAME (UUID: GPU-...)`)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout.splitlines()
    name, uuid = re.fullmatch(r"GPU 0: (.+) \(UUID: (GPU-[0-9a-f-]+)\)", listed[0].strip()).groups()
    row = run_trial(TrialConfig("synthetic", "ce", "case3", 0.2, seed=0, epochs=1, epochs_warmup=1, device="cuda:0"),
                    "unused", results=tmp_path, log=lambda s: None)
    assert (row["device_model"], row["device_uuid"]) == (name, uuid)


def test_results_by_node_counts_each_nodes_trials(tmp_path: Path) -> None:
    """Three rows on node a (one failed), two on node b computed with other kernels (ATen's AVX-512 and AVX2: two
    float orders, so two lines), one written before the columns existed: one line each, with its float order, its
    counts, the mean wall time of its rows and the mean test accuracy of those with one."""
    rows = [make_row("ce", 0.2, seed, 0.5, 70.0 + seed) for seed in range(5)]
    rows[2]["status"], rows[2]["test_acc"] = "failed", None
    for i, row in enumerate(rows):
        node = "a" * 56 if i < 3 else "b" * 56
        row.update(host="box", node_id=node, device_model="Test CPU", device_uuid="", wall_s=float(2 * i + 1),
                   numerics="portable" if i < 3 else "native", threads=1,
                   cpu_capability="AVX2" if i != 3 else "AVX512", mkl_cbwr="COMPATIBLE" if i < 3 else "OFF")
    write(tmp_path, rows + [make_row("dmi", 0.2, 0, 0.4, 60.0)])
    run = subprocess.run([str(BIN / "bench"), "results", str(tmp_path), "--by-node"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    lines = {(line.split()[1][:1], line.split()[7]): line.split() for line in run.stdout.splitlines()[2:-1]}
    assert lines["a", "AVX2"] == ["box", "a" * 56, "Test", "CPU", "-", "portable", "1", "AVX2", "COMPATIBLE", "3",
                                  "failed", "1,", "ok", "2", "3", "70.50"]
    assert lines["b", "AVX512"] == ["box", "b" * 56, "Test", "CPU", "-", "native", "1", "AVX512", "OFF", "1", "ok",
                                    "1", "7", "73.00"]
    assert lines["b", "AVX2"] == ["box", "b" * 56, "Test", "CPU", "-", "native", "1", "AVX2", "OFF", "1", "ok", "1",
                                  "9", "74.00"]
    assert lines["-", "-"] == ["test", "-", "-", "-", "native", "-", "-", "-", "1", "ok", "1", "2", "60.00"]
    assert run.stdout.splitlines()[-1] == "6 rows on 4 node/device/float-order groups"


def test_a_node_whose_raylet_answers_is_not_lost(ray_session) -> None:
    """A unit whose worker died on a node that lives on is retried as "its worker died": the node's raylet still
    takes connections (tests/grid/test_multinode.py loses a node for real and sees the other verdict)."""
    from bench.grid.cluster import node_lost

    ray = ray_session
    (node,) = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert not node_lost(node)
    assert not node_lost("0" * 56)  # a node the cluster never had: not counted as lost
