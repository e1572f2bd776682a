"""A trial's float order (`bench.numerics`, issue #53): it computes with its own intra-op threads wherever it runs
(`bench trial`, a grid, a pack), portable's pins are checked in force and recorded in the row, a process whose torch
computed natively refuses portable in one line, native and portable figures differ on a CPU above AVX2 (so the pins
matter), and no observer (diagnostics, MLflow, progress reports, a checkpoint's resume) changes a number.

The suite computes under portable's pins (tests/conftest.py); the tests of native numerics start their own process
without them. CIFAR-10's stand-in is the trial whose figures move with the threads at this size (ResNet-34: its
BatchNorm and convolution gradients sum over the batch by threads); the MLP of the synthetic set does not, so it is
used where only the wiring is tested.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from bench import numerics
from bench.config import UserError
from bench.data import registry
from bench.exec.pack import run_pack
from bench.exec.trainer import run_trial
from bench.grid.files import load_experiment
from bench.grid.runner import Settings, run_experiment
from bench.store.columns import EPOCH_COLUMNS, MEASUREMENT, group
from bench.store.folder import Checkpoints, Store, read_table
from bench.trial import TrialConfig
from tests.conftest import crashing_checkpoints

QUIET = dict(log=lambda s: None)
FIGURES = [c for c in group(MEASUREMENT) if c != "error"]
CURVES = [c for c in EPOCH_COLUMNS if c != "seconds"]
# A ResNet-34 on 16 CIFAR-10 stand-in training images (one batch of 16; 4 validation and 4 test images), one
# warm-start and one L_DMI epoch: its figures still move with the threads (its validation loss differs in the 7th
# digit between one thread and two, which the first test asserts), in less than half the time of 32 images.
CIFAR = TrialConfig("cifar10", "dmi", "uniform", 0.4, seed=1, epochs=1, epochs_warmup=1, batch_size=16)


def figures(results: Path, trial_id: str) -> tuple[dict, list[dict]]:
    """A trial's measured figures and its curves as its results folder holds them (times aside)."""
    row, curves = Store(results).read_row(trial_id)
    return {c: row[c] for c in FIGURES}, curves.sort("stage", "epoch").select(CURVES).to_dicts()


@pytest.fixture(scope="module")
def ray_unverified():
    """A local Ray for the module whose workers read the stand-in's files without their published checksums (a
    worker's environment is the one Ray started with)."""
    import ray

    os.environ["BENCH_VERIFY_CHECKSUMS"] = "0"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()
    del os.environ["BENCH_VERIFY_CHECKSUMS"]


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cifar")
    registry()["cifar10"].stand_in(root, 16)
    return root


def test_a_trial_computes_with_its_own_threads_whatever_its_process_has(cifar_root: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same trial from a process at two threads and at one gives the same figures, its row saying one thread;
    the same trial at two threads is another trial (another id) whose figures differ: the equality is the trial's
    own threads, not a float order that threads leave alone."""
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    before = torch.get_num_threads()
    rows = {}
    try:
        for name, process_threads, config in (("two", 2, CIFAR), ("one", 1, CIFAR),
                                              ("own two", 1, replace(CIFAR, threads=2))):
            torch.set_num_threads(process_threads)
            rows[name] = run_trial(config, cifar_root, results=tmp_path / name, **QUIET)
    finally:
        torch.set_num_threads(before)
    assert figures(tmp_path / "two", CIFAR.trial_id) == figures(tmp_path / "one", CIFAR.trial_id)
    assert rows["two"]["threads"] == rows["one"]["threads"] == 1 and rows["own two"]["threads"] == 2
    assert rows["own two"]["trial_id"] != CIFAR.trial_id
    assert rows["own two"]["val_loss"] != rows["one"]["val_loss"]


def test_a_packs_members_compute_with_their_threads() -> None:
    pack = [TrialConfig("synthetic", m, "case3", 0.3, seed=2, epochs=2, epochs_warmup=1) for m in ("ce", "dmi")]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        rows = run_pack(pack, "unused", **QUIET)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert [r["threads"] for r in rows] == [1, 1] and {r["executor"] for r in rows} == {"pack"}


def test_bench_trial_and_a_grid_give_one_row(cifar_root: Path, tmp_path: Path, ray_unverified) -> None:
    """`bench trial` in a shell of two threads (torch's default here: the machine's cores) and the same trial in a grid
    (a Ray worker of one CPU): one trial id, one row, bit for bit."""
    env = {**os.environ, "OMP_NUM_THREADS": "2", "BENCH_VERIFY_CHECKSUMS": "0"}
    done = subprocess.run([sys.executable, "-m", "bench.cli.main", "trial", "--dataset", "cifar10", "--method", "dmi",
                           "--noise", "uniform", "--r", "0.4", "--seed", "1", "--epochs", "1", "--epochs-warmup", "1",
                           "--batch-size", "16", "--results", str(tmp_path / "trial"), "--data-root", str(cifar_root)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("float order: native numerics at 1 thread: ATen AVX2, MKL COMPATIBLE (pinned by the environment)"
            in done.stdout)
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(dict(name="one", dataset="cifar10", noise="uniform", r=[0.4], seeds=[1], epochs=1,
                                        epochs_warmup=1, methods={"dmi": {"batch_size": 16}})))
    exp = load_experiment(grid)
    assert [t.trial_id for t in exp.trials()] == [CIFAR.trial_id]
    tally = run_experiment(exp, Settings(results=str(tmp_path / "grid"), data_root=cifar_root, mlflow=False),
                           lambda s: None)
    assert tally.done == 1
    assert figures(tmp_path / "trial", CIFAR.trial_id) == figures(tmp_path / "grid", CIFAR.trial_id)
    row, _ = Store(tmp_path / "grid").read_row(CIFAR.trial_id)
    assert row["threads"] == 1 and row["node_id"]  # computed in a Ray worker, with the trial's one thread


def test_no_observer_changes_a_number(tmp_path: Path, ray_unverified, monkeypatch: pytest.MonkeyPatch) -> None:
    """One grid twice: with MLflow and progress reports every 10 ms, then without MLflow and with progress reports
    once a minute; each trial again here with the per-epoch diagnostics over the whole training set, and with none;
    and a trial killed after its second epoch and resumed from its checkpoint. Every row's figures and every epoch's
    losses and accuracies are the same throughout (the diagnostics' own columns aside)."""
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(dict(name="observed", dataset="synthetic", noise="case3", r=[0.4], seeds=[0, 1],
                                        epochs=3, epochs_warmup=2, methods={"ce": {}, "dmi": {"lr": 1e-3}})))
    exp = load_experiment(grid)
    run_experiment(exp, Settings(results=str(tmp_path / "on"), data_root=tmp_path, report_every=0.01), lambda s: None)
    run_experiment(exp, Settings(results=str(tmp_path / "off"), data_root=tmp_path, mlflow=False, report_every=60.0),
                   lambda s: None)
    assert (tmp_path / "on" / "mlflow.db").exists() and not (tmp_path / "off" / "mlflow.db").exists()
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'on' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(exp.name).experiment_id])
    assert len(runs) == 4 and {(r.data.params["numerics"], r.data.params["threads"], r.data.params["cpu_capability"])
                               for r in runs} == {("native", "1", "AVX2")}  # the float order, as MLflow params
    for flag in ("full", "0"):
        monkeypatch.setenv("BENCH_EPOCH_EVAL", flag)
        for t in exp.trials():
            run_trial(t, tmp_path, results=tmp_path / f"eval-{flag}", **QUIET)
    assert read_table(tmp_path / "eval-0", "epochs")["train_noisy_acc_flipped"].drop_nulls().len() == 0
    assert read_table(tmp_path / "eval-full", "epochs")["train_noisy_acc_flipped"].drop_nulls().len() > 0
    dmi = next(t for t in exp.trials() if t.method == "dmi")
    with pytest.raises(RuntimeError, match="node lost"):
        run_trial(dmi, tmp_path, results=tmp_path / "resumed",
                  checkpoints=crashing_checkpoints(2)(str(tmp_path / "resumed"), dmi.trial_id, QUIET["log"]), **QUIET)
    run_trial(dmi, tmp_path, results=tmp_path / "resumed",
              checkpoints=Checkpoints(str(tmp_path / "resumed"), dmi.trial_id, QUIET["log"]), **QUIET)

    kept = ("stage", "epoch", "train_loss", "val_loss", "val_acc")  # the diagnostics' columns are the observer's own
    for t in exp.trials():
        ways = ["on", "off", "eval-full", "eval-0"] + (["resumed"] if t == dmi else [])
        seen = [figures(tmp_path / way, t.trial_id) for way in ways]
        assert all(row == seen[0][0] for row, _ in seen), t.describe()
        assert all([{k: e[k] for k in kept} for e in curves] == [{k: e[k] for k in kept} for e in seen[0][1]]
                   for _, curves in seen), t.describe()


def test_portable_pins_are_in_force_and_the_row_names_them(tmp_path: Path) -> None:
    if numerics.machine_problem(numerics.PORTABLE):
        pytest.skip(numerics.machine_problem(numerics.PORTABLE))
    config = TrialConfig("synthetic", "dmi", "case3", 0.4, seed=3, epochs=1, epochs_warmup=1, numerics="portable")
    native = replace(config, numerics="native")
    row = run_trial(config, "unused", **QUIET)
    assert (row["numerics"], row["cpu_capability"], row["mkl_cbwr"]) == ("portable", "AVX2", "COMPATIBLE")
    # oneDNN's ISA from its verbose line, caught at file descriptor 1 even under pytest's capture
    assert row["onednn_isa"] == ("Intel AVX2" if torch.backends.mkldnn.is_available() else "")
    assert row["pins"] == "ATEN_CPU_CAPABILITY=avx2,MKL_CBWR=COMPATIBLE,ONEDNN_MAX_CPU_ISA=AVX2"
    assert row["threads"] == 1 and row["mkl_version"] and row["onednn_version"]
    assert config.trial_id != native.trial_id and json.loads(row["config_json"])["numerics"] == "portable"
    assert "numerics" not in native.identity() and "threads" not in native.identity()  # the ids they always had


def _without_pins() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in numerics.PINS}


def test_a_process_whose_torch_computed_natively_refuses_portable() -> None:
    """torch picks MKL's branch at its first product: pins set after it are not in force, and the trial says so in
    one line before it loads data."""
    if numerics.machine_problem(numerics.PORTABLE):
        pytest.skip(numerics.machine_problem(numerics.PORTABLE))
    script = ("import os, torch\nfrom bench import numerics\nfrom bench.config import UserError\n"
              "from bench.trial import TrialConfig\nfrom bench.exec.trainer import run_trial\n"
              "torch.ones(64, 64) @ torch.ones(64, 64)\nos.environ.update(numerics.PINS)\n"
              "try:\n    run_trial(TrialConfig('synthetic', 'ce', 'case3', 0.2, epochs=1, epochs_warmup=1, "
              "numerics='portable'), 'unused', log=print)\nexcept UserError as e:\n    print('REFUSED', e)\n")
    done = subprocess.run([sys.executable, "-c", script], env=_without_pins(), capture_output=True, text=True,
                          timeout=300)
    refusal = [line for line in done.stdout.splitlines() if line.startswith("REFUSED")]
    assert refusal and "before the pins were set" in refusal[0] and "trial " not in done.stdout.replace(refusal[0], "")


def _native_capability() -> str:
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                          env=_without_pins(), capture_output=True, text=True, check=True).stdout.strip()


def test_native_and_portable_figures_differ_above_avx2(tmp_path: Path) -> None:
    """On a CPU whose native kernels are wider than AVX2 the pins change the float order: the same trial's losses
    differ in their last bits natively and under portable (so portable's figures are not native ones by chance)."""
    if numerics.machine_problem(numerics.PORTABLE):
        pytest.skip(numerics.machine_problem(numerics.PORTABLE))
    if (native := _native_capability()) in ("AVX2", "DEFAULT"):
        pytest.skip(f"this CPU's native kernels are {native}: native and portable are the same kernels here")
    losses = {}
    for mode in ("native", "portable"):
        results = tmp_path / mode
        done = subprocess.run([sys.executable, "-m", "bench.cli.main", "trial", "--dataset", "synthetic", "--method",
                               "dmi", "--noise", "case3", "--r", "0.4", "--seed", "1", "--epochs", "2",
                               "--epochs-warmup", "1", "--numerics", mode, "--results", str(results)],
                              env=_without_pins(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        epochs = read_table(results, "epochs").sort("stage", "epoch")
        losses[mode] = epochs["train_loss"].drop_nulls().to_list()
        capability = read_table(results)["cpu_capability"][0]
        assert capability == (native if mode == "native" else "AVX2")
    assert losses["native"] != losses["portable"]


def test_portable_is_refused_in_one_line_where_it_is_not_defined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numerics.platform, "machine", lambda: "aarch64")
    with pytest.raises(UserError, match=r"^numerics portable is defined for x86-64 CPUs \(AVX2 pins\); this is "
                                        r"aarch64: use --numerics native"):
        TrialConfig("synthetic", "ce", "case3", 0.2, numerics="portable").check()


def test_the_authors_protocol_computes_at_one_thread() -> None:
    with pytest.raises(UserError, match=r"^--threads must be 1 under protocol authors: the scripts' figures"):
        TrialConfig("mr", "dmi", "pos_to_neg", 0.2, protocol="authors", threads=2).check()
    exp_threads = [t.threads for t in _grid(protocol=["bench", "authors"], resources={"cpu": 2}).trials()]
    assert sorted(exp_threads) == [1, 2]


def _grid(**changes) -> object:
    from bench.grid.experiment import parse_experiment

    return parse_experiment(dict(name="g", dataset="mr", noise="pos_to_neg", r=[0.2], seeds=[0],
                                 methods={"dmi": {}}, **changes))


def test_a_clusters_workers_get_the_pins_as_the_jobs_runtime_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a cluster the workers were started by `ray start` with their nodes' environment: a portable grid's pins
    reach them as the job's runtime environment (a local Ray's workers inherit the driver's, which the runner pins)."""
    import ray

    from bench.grid import cluster

    joined = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cluster, "connect", lambda address, kwargs: joined.update(address=address, **kwargs))
    assert cluster.start_ray("127.0.0.1:6399", None, env=numerics.pins("portable"))
    assert joined["runtime_env"] == {"env_vars": numerics.PINS} and joined["address"] == "127.0.0.1:6399"
    joined.clear()
    cluster.start_ray("127.0.0.1:6399", None, env=numerics.pins("native"))
    assert "runtime_env" not in joined
