"""Packed trials (bench.exec.packed): each member is its own trial, whatever its pack-mates.

Solo and packed runs are compared on the CPU: same noisy labels, data order, dropout masks and initial weights,
so what must be bit-equal is compared exactly and the trained numbers within the rounding of a training
(grouped against single convolutions sum in another order: tests/tolerances.py derives how far that goes)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from bench.config import Schedule, UserError
from bench.exec.executors.pack import pack_id
from bench.exec.pack import run_pack
from bench.exec.packed import PackedStage, StackedOptimizer
from bench.exec.packing import group_key, member_order, why_solo
from bench.exec.trainer import run_trial
from bench.grid.plan import plan_units
from bench.methods import Batch, Method, registry
from bench.store.folder import read_table
from bench.trial import TrialConfig, freeze_params
from tests.conftest import crashing_checkpoints
from tests.tolerances import same_accuracy, same_selection, trained_close

REPO = Path(__file__).resolve().parents[2]
QUIET = dict(log=lambda s: None)
TEST_EXAMPLES = {"fashion_mnist": 60, "synthetic": 1000}  # tiny_fashion's and the synthetic set's test splits


def _assert_same_trial(packed: dict, solo: dict, solo_val: list[float] | None = None) -> None:
    """Bit-equal: the trial, its noisy labels, its status. Within the rounding of a training: the selected epoch
    (a tie in `solo_val`, the solo trial's method-stage validation losses, may go either way), its loss and the
    accuracies."""
    assert packed["trial_id"] == solo["trial_id"]
    assert packed["noise_hash"] == solo["noise_hash"]
    assert packed["status"] == solo["status"]
    assert packed["best_epoch"] == solo["best_epoch"] or (
        solo_val is not None and same_selection(packed["best_epoch"], solo["best_epoch"], solo_val))
    assert trained_close(packed["val_loss"], solo["val_loss"]), (packed["val_loss"], solo["val_loss"])
    examples = TEST_EXAMPLES[packed["dataset"]]
    keys = ("last_test_acc", "warmup_test_acc") if packed["best_epoch"] != solo["best_epoch"] else (
        "test_acc", "last_test_acc", "warmup_test_acc")
    for key in keys:
        assert same_accuracy(packed[key], solo[key], examples), (key, packed[key], solo[key])


def _curves(results: Path, trial_id: str) -> pl.DataFrame:
    return pl.read_parquet(results / "epochs" / f"{trial_id}.parquet")


def _assert_same_curves(a: pl.DataFrame, b: pl.DataFrame) -> None:
    assert a["stage"].to_list() == b["stage"].to_list()
    for column in ("train_loss", "val_loss"):
        for x, y in zip(a[column], b[column], strict=True):
            assert (x is None and y is None) or trained_close(x, y), (column, x, y)


def test_a_packed_member_equals_its_solo_trial_with_dropout(tiny_fashion: Path, tmp_path: Path) -> None:
    """Fashion-MNIST's CNN (dropout 0.5): 9 epochs x 6 steps of batch 16 in each stage, 108 steps; the per-epoch
    losses, the selection and the accuracies agree within the rounding of a training (tests/tolerances.py), which
    a learning rate 10% off exceeds."""
    configs = [
        TrialConfig("fashion_mnist", method, "case3", r, seed=seed, lr=lr, batch_size=16, epochs=9,
                    epochs_warmup=9)
        for method, r, seed, lr in (("ce", 0.3, 0, 1e-3), ("dmi", 0.6, 1, 3e-4), ("dmi", 0.3, 0, 1e-3))
    ]
    rows = run_pack(configs, tiny_fashion, results=tmp_path / "packed", **QUIET)
    for config, packed in zip(configs, rows, strict=True):
        solo = run_trial(config, tiny_fashion, results=tmp_path / "solo", **QUIET)
        a, b = _curves(tmp_path / "packed", config.trial_id), _curves(tmp_path / "solo", config.trial_id)
        assert a.height == 9 + 10
        _assert_same_trial(packed, solo, b.filter(stage="method")["val_loss"].to_list())
        assert packed["pack_size"] == 3 and solo["pack_size"] == 1
        _assert_same_curves(a, b)
    off = dataclasses.replace(configs[0], lr=1.1e-3)
    run_trial(off, tiny_fashion, results=tmp_path / "off", **QUIET)
    ours = _curves(tmp_path / "packed", configs[0].trial_id).filter(stage="method")["val_loss"]
    theirs = _curves(tmp_path / "off", off.trial_id).filter(stage="method")["val_loss"]
    assert not all(trained_close(x, y) for x, y in zip(ours, theirs, strict=True))


PACKABLE = sorted(name for name, cls in registry().items() if cls(2).packable())


@pytest.mark.parametrize("method", PACKABLE)
def test_every_packable_method_matches_its_solo_trial(tmp_path: Path, method: str) -> None:
    """The contract of `packable()`, over every registered method that claims it: in a pack beside another
    method, the member's numbers are its solo trial's (state that differs between members, such as an estimated
    T, must be named in `member_state`)."""
    params = {"gce": {"q": 0.5}, "bootstrap": {"variant": "hard"}}.get(method, {})
    config = TrialConfig("synthetic", method, "case2", 0.4, seed=2, epochs=4, epochs_warmup=2,
                         method_params=freeze_params(params))
    neighbour = TrialConfig("synthetic", "dmi", "case3", 0.2, seed=5, epochs=4, epochs_warmup=2)
    packed = run_pack([neighbour, config], "unused", **QUIET)[1]
    _assert_same_trial(packed, run_trial(config, "unused", **QUIET))
    if method.startswith("fw"):
        assert packed["estimated_transition"] is not None


def test_packed_mentornet_members_keep_their_own_thresholds(tmp_path: Path) -> None:
    """MentorNet's lambda moves with every step: in a pack each member moves its own (`member_state`), given back
    to the member after each epoch, so that its detection diagnostics (which read lambda) and a resumed pack equal
    its solo trial's."""
    from bench.store.folder import Checkpoints

    configs = [TrialConfig("synthetic", "mentornet", "case3", r, seed=s, epochs=4, epochs_warmup=2)
               for r, s in ((0.2, 0), (0.5, 1))]
    pack = [TrialConfig("synthetic", "dmi", "case3", 0.3, seed=2, epochs=4, epochs_warmup=2), *configs]
    rows = run_pack(pack, "unused", results=tmp_path / "packed", **QUIET)[1:]
    for config, packed in zip(configs, rows, strict=True):
        solo = run_trial(config, "unused", results=tmp_path / "solo", **QUIET)
        _assert_same_trial(packed, solo)
        a, b = (_curves(tmp_path / where, config.trial_id).filter(pl.col("stage") == "method")
                for where in ("packed", "solo"))
        # Shares of the 4,000 training examples, moved only by an example whose loss lies within TRAINED_REL of
        # the threshold (a flag) or of another's (an AUROC pair): a share of about 2 TRAINED_REL x (density of the
        # losses there x loss), at most 2 x 5e-3 x 1 for losses spread like these (the threshold is their 70th
        # percentile): 0.01 bounds both.
        assert a["det_flagged"].to_list() == pytest.approx(b["det_flagged"].to_list(), abs=0.01)
        assert a["det_auroc"].to_list() == pytest.approx(b["det_auroc"].to_list(), abs=0.01)
    assert rows[0]["val_loss"] != rows[1]["val_loss"]
    results = str(tmp_path / "resumed")
    with pytest.raises(RuntimeError, match="node lost"):
        run_pack(pack, "unused", results=results, log=lambda s: None,
                 checkpoints=crashing_checkpoints(2)(results, pack_id(pack), lambda s: None))
    resumed = run_pack(pack, "unused", results=results, checkpoints=Checkpoints(results, pack_id(pack), print),
                       **QUIET)[1:]
    for a, b in zip(resumed, rows, strict=True):
        for key in ("best_epoch", "val_loss", "test_acc", "last_test_acc"):
            assert a[key] == b[key], key


def test_a_members_numbers_do_not_depend_on_its_pack(tiny_fashion: Path) -> None:
    me = TrialConfig("fashion_mnist", "dmi", "case2", 0.4, seed=3, lr=5e-4, batch_size=16, epochs=3,
                     epochs_warmup=3)
    others = [TrialConfig("fashion_mnist", m, "case1", r, seed=s, lr=lr, batch_size=16, epochs=3, epochs_warmup=3)
              for m, r, s, lr in (("ce", 0.1, 0, 1e-3), ("dmi", 0.5, 1, 1e-4), ("ce", 0.7, 2, 2e-4),
                                  ("dmi", 0.2, 4, 1e-3), ("ce", 0.3, 5, 5e-4), ("dmi", 0.8, 6, 3e-4),
                                  ("ce", 0.0, 7, 1e-3))]
    alone = run_pack([me], tiny_fashion, **QUIET)[0]
    first = run_pack([me, *others[:2]], tiny_fashion, **QUIET)[0]
    middle = run_pack([*others[:4], me, *others[4:]], tiny_fashion, **QUIET)[4]
    for row in (first, middle):
        _assert_same_trial(row, alone)
    assert (alone["pack_size"], first["pack_size"], middle["pack_size"]) == (1, 3, 8)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_the_stacked_step_is_each_members_own_optimizer_step(optimizer: str) -> None:
    """Two members with their own learning rates, three steps and a milestone, against torch.optim per member."""
    torch.manual_seed(0)
    schedule = Schedule(optimizer, 0.1, epochs=3, batch_size=8, momentum=0.9 if optimizer == "sgd" else 0.0,
                        weight_decay=1e-2, milestones=(1,), gamma=0.5)
    lrs = [1e-2, 3e-4]
    start = [torch.randn(4, 3), torch.randn(4, 3)]
    grads = [[torch.randn(4, 3) for _ in range(2)] for _ in range(3)]
    stacked = {"w": torch.stack(start).requires_grad_()}
    opt = StackedOptimizer(stacked, schedule, lrs)
    for step in range(3):
        stacked["w"].grad = torch.stack(grads[step])
        opt.step(None)
        opt.end_epoch()  # one step per "epoch": the milestone halves both lrs after the first
    for m in range(2):
        w = start[m].clone().requires_grad_()
        solo = (torch.optim.Adam([w], lr=lrs[m], weight_decay=1e-2) if optimizer == "adam"
                else torch.optim.SGD([w], lr=lrs[m], momentum=0.9, weight_decay=1e-2))
        sched = torch.optim.lr_scheduler.MultiStepLR(solo, [1], 0.5)
        for step in range(3):
            w.grad = grads[step][m]
            solo.step()
            sched.step()
        # Elementwise updates in another order: each step rounds w by U32|w| and its ~10-operation update
        # (<= 3.2 lr) by 10 U32; three steps: 3 x 6e-8 |w| + 30 x 6e-8 x 3.2 x 1e-2 < 1e-6 |w| + 1e-7.
        torch.testing.assert_close(stacked["w"][m].detach(), w.detach(), rtol=1e-6, atol=1e-7)
    assert not torch.equal(stacked["w"][0], start[0]) and not torch.equal(stacked["w"][1], start[1])


class NaNAfterFirstEpoch(Method):
    """A test method: CE, whose training loss turns NaN from the second epoch on."""

    name = "nan_after_first_epoch"

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return registry()["ce"](self.num_classes).loss(logits, labels)

    def logits_loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        loss = self.loss(logits, batch.y)
        return loss * float("nan") if batch.epoch >= 1 else loss


def test_a_diverging_member_is_frozen_and_the_others_are_unchanged(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(registry(), NaNAfterFirstEpoch.name, NaNAfterFirstEpoch)
    healthy = [TrialConfig("synthetic", m, "case3", 0.3, seed=s, epochs=4, epochs_warmup=2)
               for m, s in (("ce", 0), ("dmi", 1))]
    sick = TrialConfig("synthetic", NaNAfterFirstEpoch.name, "case3", 0.3, seed=0, epochs=4, epochs_warmup=2)
    without = run_pack(healthy, "unused", **QUIET)
    with_sick = run_pack([healthy[0], sick, healthy[1]], "unused", results=tmp_path, **QUIET)
    for a, b in zip(without, (with_sick[0], with_sick[2]), strict=True):
        _assert_same_trial(b, a)
    assert with_sick[1]["status"] == "diverged" and "epoch 2" in with_sick[1]["error"]
    assert with_sick[1]["best_epoch"] in (0, 1)  # its best state from before the NaN
    assert read_table(tmp_path).filter(pl.col("status") == "diverged").height == 1


def test_a_pack_out_of_gpu_memory_stops_with_the_smaller_pack_to_use(tmp_path: Path, monkeypatch) -> None:
    """CUDA's out-of-memory error inside a pack's training becomes one line naming a pack size that halves it,
    and no member leaves a row behind."""
    def out_of_memory(self, epoch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(PackedStage, "train_steps", out_of_memory)
    configs = [TrialConfig("synthetic", "ce", "case3", r, seed=0, epochs=2, epochs_warmup=1) for r in (0.1, 0.2, 0.3)]
    configs.append(TrialConfig("synthetic", "dmi", "case3", 0.1, seed=0, epochs=2, epochs_warmup=1))
    with pytest.raises(UserError, match=r"a pack of 4 trials does not fit .* --pack 2$"):
        run_pack(configs, "unused", results=tmp_path, **QUIET)
    assert read_table(tmp_path).height == 0


def _peak_allocated(fn) -> int:
    """The peak of the bytes torch allocated while `fn` ran, over what was allocated before: the running sum of
    the profiler's allocation and free events (CPU), an account independent of `pack_memory`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    return int(np.cumsum([n for _, n in events]).max())


def test_the_memory_estimate_bounds_what_a_real_pack_allocates(tiny_fashion: Path) -> None:
    """`pack_memory` errs on the safe side, but not wildly: a real pack (CE, L_DMI and FW with its pass over the
    training set; diagnostics every epoch) allocates less than the estimate, and more than a third of it. The
    inputs are left out of both (the data files load through numpy, which the profiler does not see)."""
    from bench.exec.memory import pack_memory
    from bench.exec.prepare import prepare

    configs = [TrialConfig("fashion_mnist", m, "case3", 0.2, seed=s, batch_size=16, epochs=2, epochs_warmup=2)
               for s, m in enumerate(("ce", "dmi", "fw", "ce", "dmi"))]
    memory = pack_memory(prepare(configs[0], tiny_fashion, **QUIET))
    peak = _peak_allocated(lambda: run_pack(configs, tiny_fashion, **QUIET))
    estimate = memory.bytes(len(configs)) - memory.inputs
    assert peak <= estimate <= 3 * peak, (peak, estimate)


def test_the_memory_estimate_bounds_a_real_mr_pack(shared_data: Path) -> None:
    """The same on the real MR (optional), whose WordCNN holds a 2.3-million-parameter embedding table: its
    parameters, gradients and optimiser state are most of a member's memory."""
    from bench.exec.memory import pack_memory
    from bench.exec.prepare import prepare

    configs = [TrialConfig("mr", m, "pos_to_neg", 0.2, seed=s, epochs=1, epochs_warmup=1, train_subset=300)
               for s, m in enumerate(("ce", "dmi", "fw", "ce"))]
    memory = pack_memory(prepare(configs[0], shared_data, **QUIET))
    peak = _peak_allocated(lambda: run_pack(configs, shared_data, **QUIET))
    estimate = memory.bytes(len(configs)) - memory.inputs
    assert peak <= estimate <= 2 * peak, (peak, estimate)


def test_a_pack_that_would_not_fit_stops_before_training_with_the_size_that_fits(tmp_path: Path, monkeypatch) \
        -> None:
    """With BENCH_PACK_MEMORY_GB (a GPU shared with other work), a pack checks its estimate before anything
    trains: too big, it names the largest pack that fits, writes nothing, and that pack then runs; the check
    itself leaves every number unchanged."""
    from bench.exec.memory import GIB, pack_memory
    from bench.exec.prepare import prepare

    configs = [TrialConfig("synthetic", m, "case3", r, seed=0, epochs=2, epochs_warmup=1)
               for m in ("ce", "dmi") for r in (0.1, 0.2, 0.3, 0.4)]
    memory = pack_memory(prepare(configs[0], "unused", **QUIET))
    room = (memory.bytes(3) + memory.bytes(4)) / 2  # 3 members fit, 4 do not
    monkeypatch.setenv("BENCH_PACK_MEMORY_GB", str(room / GIB))
    with pytest.raises(UserError, match=r"a pack of 8 trials needs about .* GiB on cpu, .*: run with --pack 3$"):
        run_pack(configs, "unused", results=tmp_path, **QUIET)
    assert not (tmp_path / "trials").exists() or read_table(tmp_path).height == 0
    checked = run_pack(configs[:3], "unused", **QUIET)
    monkeypatch.delenv("BENCH_PACK_MEMORY_GB")
    for a, b in zip(checked, run_pack(configs[:3], "unused", **QUIET), strict=True):
        for key in ("status", "best_epoch", "val_loss", "test_acc", "last_test_acc", "confusion"):
            assert a[key] == b[key], key
    monkeypatch.setenv("BENCH_PACK_MEMORY_GB", "lots")
    with pytest.raises(UserError, match="BENCH_PACK_MEMORY_GB must be a positive number of GiB, got 'lots'"):
        run_pack(configs[:2], "unused", **QUIET)


def test_auto_packs_hold_as_many_members_as_the_gpus_memory_holds(monkeypatch) -> None:
    """`--pack auto` on CUDA sizes packs by the memory estimate (here against BENCH_PACK_MEMORY_GB, as no GPU
    is visible), at most the pack executor's `most`, balanced; and says how in the plan."""
    from bench.exec.executor import get_executor
    from bench.exec.memory import GIB, pack_memory
    from bench.exec.packed import EVAL_IMAGES
    from bench.exec.prepare import prepare
    from bench.grid.describe import describe_units

    trials = [TrialConfig("synthetic", m, "case3", r, seed=s, device="cuda", epochs=2, epochs_warmup=1)
              for m in ("ce", "dmi") for r in (0.2, 0.4) for s in range(5)]
    memory = pack_memory(prepare(TrialConfig("synthetic", "ce", "case3", 0.2, epochs=2, epochs_warmup=1),
                                 "unused", **QUIET))
    memory = dataclasses.replace(memory, chunk=EVAL_IMAGES["cuda"])  # the planner's, measured on a CPU for CUDA
    monkeypatch.setenv("BENCH_PACK_MEMORY_GB", str(memory.bytes(7) / GIB))
    units = plan_units(trials, "auto", "unused")
    assert [len(u) for u in units] == [6, 6, 4, 4]  # 20 in whole cells of 2, at most 7: four packs, balanced
    assert all(len({(t.r, t.seed) for t in u}) == len(u) // 2 for u in units)
    line = describe_units(units, "auto", "unused")
    assert "synthetic, batch 128: " in line and "7 members fit; at most 7 a pack" in line
    monkeypatch.setenv("BENCH_PACK_MEMORY_GB", "1000")
    assert [len(u) for u in plan_units(trials, "auto", "unused")] == [20]
    monkeypatch.delenv("BENCH_PACK_MEMORY_GB")  # no GPU seen, no bound given: `most`, checked by each pack
    assert [len(u) for u in plan_units(trials, "auto")] == [20] and get_executor("pack").most >= 20
    assert "not estimated here" in describe_units(plan_units(trials, "auto"), "auto")


def test_a_finished_pack_frees_its_stages_and_shares_its_inputs(tiny_fashion: Path) -> None:
    """No reference cycle keeps a pack's stacked parameters and optimiser state alive after it ends (the warm
    starts' stage used to stay, on the GPU, until Python's cycle collector ran); and the members of a pack share
    one copy of the diagnostics' training sample (it was one copy a member: 8 GB for 256 Fashion-MNIST members)."""
    import gc

    from bench.exec.packed import PackedStage
    from bench.exec.prepare import load_data, prepare

    configs = [TrialConfig("fashion_mnist", m, "case3", 0.2, seed=s, batch_size=16, epochs=1, epochs_warmup=1)
               for s, m in enumerate(("ce", "dmi", "fw"))]
    gc.collect()
    gc.disable()
    try:
        run_pack(configs, tiny_fashion, **QUIET)
        assert not [o for o in gc.get_objects() if type(o) is PackedStage]
    finally:
        gc.enable()
    data = load_data(configs[0], tiny_fashion)
    samples = {prepare(c, tiny_fashion, data=data, **QUIET).diag_train.x.data_ptr() for c in configs}
    assert len(samples) == 1


def test_a_killed_pack_resumes_from_its_epoch_checkpoint_with_the_same_numbers(tmp_path: Path) -> None:
    from bench.store.folder import Checkpoints

    configs = [TrialConfig("synthetic", m, "case3", 0.4, seed=3, epochs=5, epochs_warmup=2) for m in ("ce", "dmi")]
    whole = run_pack(configs, "unused", **QUIET)
    results = str(tmp_path / "resumed")
    lines: list[str] = []

    CrashAfterEpoch2 = crashing_checkpoints(2)

    with pytest.raises(RuntimeError, match="node lost"):
        run_pack(configs, "unused", results=results, log=lines.append,
                 checkpoints=CrashAfterEpoch2(results, pack_id(configs), lines.append))
    assert read_table(results).is_empty()
    resumed = run_pack(configs, "unused", results=results, log=lines.append,
                       checkpoints=Checkpoints(results, pack_id(configs), lines.append))
    assert "resumed from the checkpoint of epoch 2" in lines
    for a, b in zip(resumed, whole, strict=True):
        for key in ("status", "best_epoch", "val_loss", "test_acc", "last_test_acc", "confusion"):
            assert a[key] == b[key], key


def test_plan_packs_whole_warm_start_cells_and_leaves_the_rest_solo() -> None:
    trials = [TrialConfig("synthetic", m, "case3", r, seed=s, device="cuda", epochs=2, epochs_warmup=1)
              for m in ("ce", "dmi", "vat") for r in (0.2, 0.4) for s in (0, 1, 2)]
    units = plan_units(trials, 5)
    packs = [u for u in units if u.kind == "pack"]
    assert sorted(len(u) for u in units if u.kind == "solo" and u.trials[0].method == "vat") == [1] * 6
    assert all(why_solo(t) is None for u in packs for t in u)
    # 6 cells of (ce, dmi); at most 5 members a pack, in whole cells: 3 packs of 2 cells.
    assert sum(len(u) for u in units) == len(trials) and [len(u) for u in packs] == [4, 4, 4]
    cells = [{(t.r, t.seed) for t in u} for u in packs]
    assert all(len(c) == 2 for c in cells) and len(set().union(*cells)) == 6  # no cell in two packs
    assert [(u.kind, u.trials) for u in plan_units(trials, "off")] == [("solo", (t,)) for t in trials]
    # Balanced: 7 cells of 2 at 10 a pack are 8 + 6 (two packs, as few as 10 allows), not 10 + 4.
    seven = [TrialConfig("synthetic", m, "case3", 0.2, seed=s, device="cuda") for s in range(7) for m in ("ce", "dmi")]
    assert [len(u) for u in plan_units(seven, 10)] == [8, 6]
    cpu = [TrialConfig("synthetic", "ce", "case3", 0.2, seed=s) for s in range(3)]
    assert [(u.kind, u.trials) for u in plan_units(cpu, "auto")] == [("solo", (t,)) for t in cpu]  # on CUDA only
    assert why_solo(TrialConfig("synthetic", "coteaching", "case3", 0.2)) is not None
    assert why_solo(TrialConfig("cifar10", "ce", "pairs", 0.2)) is None  # BatchNorm and augmentation pack
    assert "augments at random" in why_solo(TrialConfig("clothing1m", "ce", "real", 0.0))


def test_the_training_core_imports_only_torch_and_numpy(tmp_path: Path) -> None:
    """A bare GPU box has torch and numpy: the core and the benchmark must not need Ray, MLflow, polars,
    pyarrow, pandas or scipy (checked by refusing those imports in a fresh interpreter)."""
    script = f"""
import sys
for name in ("ray", "mlflow", "polars", "pyarrow", "pandas", "scipy", "matplotlib", "yaml"):
    sys.modules[name] = None  # `import name` now fails, as where it is not installed
import os
os.environ["BENCH_PACK_MEMORY_GB"] = "8"  # the pack checks its memory estimate (bench.exec.memory) before it trains
import bench.exec.pack
import bench.exec.trainer
import bench.noise
import bench.exec.memory
from bench.data import registry as datasets
from bench.methods import registry as methods
assert len(datasets()) >= 7 and len(methods()) >= 13
from bench.trial import TrialConfig
rows = bench.exec.pack.run_pack([TrialConfig("synthetic", m, "case3", 0.3, epochs=1, epochs_warmup=1)
                              for m in ("ce", "dmi")], "unused", log=lambda s: None)
assert [r["status"] for r in rows] == ["ok", "ok"]
sys.argv = ["pack_speedup", "--device", "cpu", "--members", "1,2", "--steps", "2", "--synthetic"]
import runpy
runpy.run_path("{REPO / 'benchmarks' / 'pack_speedup.py'}", run_name="__main__")
print("CORE-OK")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "CORE-OK" in out.stdout


def test_dmi_loss_over_members_equals_each_members_loss() -> None:
    from bench.dmi import dmi_loss

    logits, labels = torch.randn(5, 64, 3), torch.randint(0, 3, (5, 64))
    labels[2] = labels[2].clamp(max=1)  # member 2 misses class 2: the guard applies to it alone
    stacked = dmi_loss(logits, labels, 3)
    each = torch.stack([dmi_loss(logits[k], labels[k], 3) for k in range(5)])
    torch.testing.assert_close(stacked, each)  # float64 sums of 64 terms: 64 U64 = 7e-15, far inside 1e-7
    assert np.isfinite(stacked.numpy()).all()


def test_members_equal_after_their_dataset_defaults_share_a_loss_group() -> None:
    """VAT's eps is 8.0, and 2.0 on synthetic (its dataset default): a member that omits eps and one that gives 2
    (an int for a float parameter) are one loss group, side by side in the pack's order (from the configs) and one
    group of the stage (from the methods); members of 1.0 and 5.0 sort between 2.0 and 8.0, so a key without the
    dataset default parts them."""
    eps = [None, 1.0, 5.0, 2]  # 2: an int, as YAML reads `eps: 2`
    configs = [TrialConfig(dataset="synthetic", method="vat", noise="case1", r=0.2, seed=0,
                           method_params=freeze_params({} if e is None else {"eps": e})) for e in eps]
    order = member_order(configs)
    assert abs(order.index(0) - order.index(3)) == 1
    methods = [registry()["vat"](2, dataset="synthetic", **configs[i].params) for i in order]
    keys = [group_key(m.name, m.params) for m in methods]
    assert len(set(keys)) == 3 and keys.count(group_key("vat", methods[order.index(0)].params)) == 2


def test_a_packs_members_are_checked_before_its_data_loads(tmp_path: Path) -> None:
    """A bad value in any member stops the pack with the check's own line before the shared data loads: with no
    Fashion-MNIST files under the root, loading first would have named the missing files instead."""
    from bench.exec.pack import prepare_pack
    from bench.trial import TrialError

    configs = [TrialConfig("fashion_mnist", "ce", "uniform", r, seed=0) for r in (0.2, 1.5)]
    with pytest.raises(TrialError, match=r"^--r ") as refused:
        prepare_pack(configs, tmp_path / "no data", log=lambda _: None)
    assert refused.value.field == "r" and not (tmp_path / "no data").exists()
