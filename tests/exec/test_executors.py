"""Executors by kind (bench.exec.executor): found by name, each asking Ray for what its unit needs (a trial's GPUs as
written), what every kind does for a member written once (bench.exec.member: a packed member gets the whole stage
context a solo trial gets), the planner choosing kinds from the executor table (bench.grid.executor_table), and
docs/extending.md's example executor run through `bench run` on a local Ray."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from bench.config import UserError
from bench.exec.executor import executors, get_executor
from bench.exec.pack import run_pack
from bench.exec.trainer import run_trial
from bench.grid import executor_table
from bench.grid.cluster import check_resources
from bench.grid.describe import draw_units
from bench.grid.executor_table import Choice, choose
from bench.grid.plan import plan_units
from bench.methods import get_method
from bench.store.folder import read_table
from bench.trial import TrialConfig
from tests import doc_examples
from tests.tolerances import TRAINED_REL, same_accuracy, trained_close

REPO = Path(__file__).resolve().parents[2]
QUIET = dict(log=lambda s: None)


def trials(n: int, device: str = "cpu", method: str = "dmi") -> list[TrialConfig]:
    return [TrialConfig("synthetic", method, "case3", 0.2, seed=s, epochs=2, epochs_warmup=1, device=device)
            for s in range(n)]


def test_the_executors_are_found_by_name_and_an_unknown_one_names_the_choices() -> None:
    assert {"solo", "pack"} <= set(executors())
    with pytest.raises(UserError,
                       match=r"unknown executor 'streamz' \(did you mean 'streams'\?\); choose from .*pack.*solo"):
        get_executor("streamz")


def test_a_trial_asking_for_two_gpus_is_given_two_and_runs_solo() -> None:
    """The runner used to ask Ray for min(1, gpu x members): a trial asking for 2 GPUs was checked against 2 and
    scheduled on 1."""
    assert get_executor("solo").resources(trials(1, "cuda"), 2.0, 2.0) == [{"CPU": 2.0, "GPU": 2.0}]
    assert get_executor("pack").resources(trials(4, "cuda"), 1.0, 0.125) == [{"CPU": 1.0, "GPU": 0.5}]
    assert get_executor("pack").resources(trials(16, "cuda"), 1.0, 0.25) == [{"CPU": 1.0, "GPU": 1.0}]
    units, _ = draw_units(trials(6, "cuda"), "auto", None, gpus=None, gpu=2.0)
    assert [u.kind for u in units] == ["solo"] * 6  # a pack runs on one device
    units, _ = draw_units(trials(6, "cuda"), "auto", None, gpus=None, gpu=0.5)
    assert [u.kind for u in units] == ["pack"]


def test_a_unit_no_node_can_hold_is_refused_in_one_line(monkeypatch) -> None:
    import ray

    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0}}])
    check_resources({"each trial": [{"CPU": 2.0, "GPU": 1.0}], "a pack of 4 trials": [{"CPU": 2.0, "GPU": 1.0}]})
    with pytest.raises(UserError) as e:
        check_resources({"each trial": [{"CPU": 2.0, "GPU": 2.0}]})
    assert str(e.value) == ("each trial asks for 2 CPU and 2 GPU but no node of this Ray cluster can ever provide it "
                            "(nodes: 8 CPU / 1 GPU); lower resources.gpu (--gpus-per-trial) or add a node with that "
                            "many GPUs")


def test_a_packed_member_gets_the_stage_context_its_solo_trial_gets(monkeypatch) -> None:
    """The pack used to set its members' methods up without the schedule, the augmenter and predict_train_of."""
    seen: list = []
    method = get_method("ce")
    original = method.setup
    monkeypatch.setattr(method, "setup", lambda self, ctx: (seen.append((ctx, ctx.predict_train_of(0),
                                                                         ctx.predict_train())), original(self, ctx))[1])
    config = TrialConfig("synthetic", "ce", "case3", 0.3, seed=1, epochs=1, epochs_warmup=1)
    run_trial(config, "unused", **QUIET)
    run_pack([config, TrialConfig("synthetic", "ce", "case3", 0.3, seed=1, lr=1e-4, epochs=1, epochs_warmup=1)],
             "unused", **QUIET)
    (solo, solo_probs, _), (packed, packed_probs, packed_probs_again) = seen[:2]
    assert packed.schedule == solo.schedule and solo.schedule.epochs == 1
    assert (packed.epochs, packed.noise_rate, packed.protocol) == (solo.epochs, solo.noise_rate, solo.protocol)
    assert (packed.augment_train is None) == (solo.augment_train is None)
    # The member's warm start is its solo trial's cell, trained in another float order: its predictions of the
    # training split agree within the rounding of a training (probabilities: an absolute bound).
    assert torch.equal(packed_probs, packed_probs_again)
    assert torch.allclose(packed_probs, solo_probs, rtol=0, atol=TRAINED_REL)


# -- the executor table -------------------------------------------------------------------------------------------
TABLE = (Choice("*", "cuda", "pack", 256), Choice("resnet34_cifar", "cuda", "pack", 32),
         Choice("resnet34_cifar", "H200", "solo", 1), Choice("*", "H100", "pack", 64), Choice("*", "cpu", "solo", 1))


def test_the_most_specific_row_of_the_table_wins() -> None:
    assert choose("resnet34_cifar", "cuda", "NVIDIA H200", TABLE) == TABLE[2]  # the model on this kind
    assert choose("resnet34_cifar", "cuda:1", "H100", TABLE) == TABLE[1]  # the model on any GPU before any model
    assert choose("fashion_cnn", "cuda", "NVIDIA H100 80GB HBM3", TABLE) == TABLE[3]  # any model on this kind
    assert choose("fashion_cnn", "cuda", None, TABLE) == TABLE[0]
    assert choose("resnet34_cifar", "cpu", "H200", TABLE) == TABLE[4]
    assert choose("mlp", "cpu", None, TABLE[:4]) is None


def test_the_shipped_table_keeps_todays_plan() -> None:
    """Packs of at most 256 on any GPU (the memory estimate may cut them), solo on a CPU; each row cites a figure."""
    table = executor_table.read_table(executor_table.DEFAULT)
    assert choose("fashion_cnn", "cuda", None, table).executor == "pack"
    assert choose("fashion_cnn", "cuda", None, table).trials == 256
    assert choose("word_cnn", "cpu", None, table).executor == "solo"
    assert all(row.source and row.measured for row in table)
    assert [(u.kind, len(u)) for u in plan_units(trials(3), "auto")] == [("solo", 1)] * 3


def test_a_bad_table_is_one_line_naming_its_file_and_line(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "table.csv"
    header = ",".join(executor_table.COLUMNS)
    path.write_text(f"{header}\n*,cpu,pack,two,,,\n")
    with pytest.raises(UserError, match=rf"^{re.escape(str(path))}, line 2: trials must be a whole number >= 1, "
                                        r"got 'two'$"):
        executor_table.read_table(path)
    path.write_text("model,device\n*,cpu\n")
    with pytest.raises(UserError, match="has the columns model, device; it needs model, device, executor, trials"):
        executor_table.read_table(path)
    path.write_text(f"{header}\n*,cpu,streamz,2,,,\n")
    monkeypatch.setenv("BENCH_EXECUTOR_TABLE", str(path))
    with pytest.raises(UserError, match=r"names the executor 'streamz' for \* on cpu; there are .*pack.*solo"):
        plan_units(trials(2), "auto")


def test_the_planner_reads_the_table_a_benchmark_writes(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "table.csv"
    executor_table.write_row(Choice("*", "cpu", "solo", 1, measured="then", source="a"), path)
    executor_table.write_row(Choice("mlp", "cpu", "pack", 2, "123", "now", "benchmarks/x.py"), path)
    executor_table.write_row(Choice("mlp", "cpu", "pack", 3, "456", "later", "benchmarks/x.py"), path)  # replaces
    rows = executor_table.read_table(path)
    assert [(r.model, r.trials, r.images_per_s) for r in rows] == [("*", 1, ""), ("mlp", 3, "456")]
    monkeypatch.setenv("BENCH_EXECUTOR_TABLE", str(path))
    units = plan_units(trials(6), "auto")  # the synthetic set's model is the mlp
    assert sorted(len(u) for u in units) == [3, 3] and {u.kind for u in units} == {"pack"}
    _, lines = draw_units(trials(6), "auto", None, gpus=None)
    assert lines[0] == f"executor table ({path}): mlp on cpu: pack, at most 3 trials a unit (later: benchmarks/x.py)"


# -- docs/extending.md's executor, through bench run ---------------------------------------------------------------
def doc_executor() -> tuple[str, str]:
    """The doc's executor under its fresh name (tests/doc_examples.py), and the doc's table row naming it so."""
    code, table = doc_examples.executor(), doc_examples.executor_table()
    name = doc_examples.name_of(code)
    return doc_examples.renamed(code), table.replace(f",{name},", f",{name}{doc_examples.FRESH},")


KIND = doc_examples.name_of(doc_executor()[0])  # the fresh name


def test_the_docs_executor_is_chosen_by_name_and_planned_in_its_own_words(tmp_path: Path) -> None:
    """`--executor NAME:2` picks the plug-in without a table row; `--pack` is its alias, not both at once; a
    name no executor has is one line."""
    code, _ = doc_executor()
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / f"{KIND}.py").write_text(code)
    grid = dict(name="seq", dataset="synthetic", noise="case3", r=[0.2], seeds=[0, 1, 2, 3, 4], epochs=2,
                epochs_warmup=1, resources={"cpu": 1}, methods={"dmi": {}})
    (tmp_path / "seq.yaml").write_text(yaml.safe_dump(grid))

    def dry(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(Path(sys.executable).parent / "bench"), "run", str(tmp_path / "seq.yaml"),
                               "--dry-run", "--results", str(tmp_path / "r"), "--data-root", str(tmp_path), *flags],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "BENCH_PLUGINS": str(tmp_path / "plugins")})

    done = dry("--executor", f"{KIND}:2")
    assert done.returncode == 0, done.stderr
    assert f"sequences (--executor {KIND}:2): 4 trials in 2 sequences of 2, 2; 1 trials solo" in done.stdout
    assert not re.search(r"\bpacks?\b|--pack", done.stdout), done.stdout
    both = dry("--executor", KIND, "--pack", "2")
    assert both.returncode == 2 and "give one of them, not both" in both.stderr
    wrong = dry("--executor", f"{KIND[:-1]}:2")
    assert wrong.returncode == 2 and re.search(rf"got '{KIND[:-1]}:2'; executors: .*{KIND}", wrong.stderr)


def test_the_docs_executor_is_one_file_and_runs_a_grid_through_ray(tmp_path: Path) -> None:
    code, table = doc_executor()
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / f"{KIND}.py").write_text(code)
    (tmp_path / "table.csv").write_text(table)
    grid = dict(name="seq", dataset="synthetic", noise="case3", r=[0.2], seeds=[0, 1, 2], epochs=2, epochs_warmup=1,
                resources={"cpu": 1}, methods={"dmi": {}})
    (tmp_path / "seq.yaml").write_text(yaml.safe_dump(grid))
    env = {"BENCH_PLUGINS": str(plugins), "BENCH_EXECUTOR_TABLE": str(tmp_path / "table.csv"),
           "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([str(Path(sys.executable).parent / "bench"), "run", str(tmp_path / "seq.yaml"),
                           "--results", str(tmp_path / "r"), "--no-mlflow", "--num-cpus", "2", "--data-root",
                           str(tmp_path)], capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    # The driver speaks of the unit in its executor's words, never a pack's; its rows name the executor.
    assert "sequences (--executor auto): 3 trials in 1 sequences of 3; 0 trials solo" in done.stdout
    assert re.search(rf"executor table \(.*table.csv\): \* on cpu: {KIND}, at most 3 trials", done.stdout)
    assert done.stdout.count("(sequence of 3)") == 3  # each member's line as it finishes
    assert not re.search(r"\bpacks?\b|--pack", done.stdout), done.stdout
    rows = read_table(tmp_path / "r").sort("seed")
    assert rows["status"].to_list() == ["ok"] * 3
    assert rows["executor"].to_list() == [KIND] * 3
    # Each row is its solo trial's (the same code, the same random draws), within the rounding of a training: the
    # worker sums at its own thread count.
    for row in rows.to_dicts():
        solo = run_trial(TrialConfig("synthetic", "dmi", "case3", 0.2, seed=row["seed"], epochs=2, epochs_warmup=1),
                         "unused", **QUIET)
        assert (solo["trial_id"], solo["noise_hash"]) == (row["trial_id"], row["noise_hash"])
        assert trained_close(solo["val_loss"], row["val_loss"])
        if solo["best_epoch"] == row["best_epoch"]:
            assert same_accuracy(solo["test_acc"], row["test_acc"], 1000)


def test_the_planner_imports_no_executor_internals() -> None:
    """The plan and its words know executors only by their contract (`bench.exec.executor`): sizing, words and
    reasons come from the unit's own executor, so a kind's internals (packs, memory) stay in its file."""
    import ast

    for module in ("plan", "describe"):
        tree = ast.parse((REPO / "bench" / "grid" / f"{module}.py").read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        assert {m for m in imported if m.startswith("bench.exec")} <= {"bench.exec.executor"}, (module, imported)
