"""Packed BatchNorm networks (`bench.exec.grouped`): each member is its own trial, running statistics included.

The members are ResNet-34-shaped (`resnet34_cifar` at width 8 with one basic block in each of two stages, so that a
CPU trains a pack in seconds) on a small CIFAR-10 in the published batch format, whose classes differ in colour
(so that the networks learn and the comparisons follow real training), augmented by random crops and flips, each
member from its own generator as its solo trial draws from torch's.

Tolerance. A pack's grouped convolutions give the same forward values as a single one on the CPU but sum the weight
gradients (m = batch x height x width = 32 x 32 x 32 terms) in another order: each step's gradients differ by about
sqrt(m) x u = 1e-5 of their size (u = 2^-24, the float32 rounding unit; rounding errors add like a random walk).
Over the S = 3 x 7 + 3 x 7 = 42 steps of a trial they accumulate to at most S x 1e-5 ~ 5e-4 of the training's own
movement if nothing amplified them; nearby training trajectories drift apart, so the states are compared at 1e-2
of each tensor's movement (|packed - solo| <= 1e-2 x |solo - initial|), twenty times that, and the losses at 1e-3
of their value (the losses moved by about half their value in training). A member that shared another's batch
statistics, drew its augmentation from another generator or lost its running statistics differs by the size of
the movement itself. Step counters are compared exactly; accuracies within one test image, and the selected epoch
up to a tie within rounding of training (`tests/tolerances.py`: an image whose margin lies within rounding of zero
may go either way).
"""

from __future__ import annotations

import math
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from bench import models
from bench.config import UserError
from bench.datasets.cifar10 import CIFAR10
from bench.exec.executors.pack import pack_id
from bench.exec.grouped import Grouped
from bench.exec.pack import run_pack
from bench.exec.packed import PackedStage, device_generator
from bench.exec.packing import member_order, why_solo
from bench.exec.prepare import build_model, prepare, seed_everything, warm_seed
from bench.exec.trainer import run_trial
from bench.grid import executor_table
from bench.store.folder import Checkpoints
from bench.trial import TrialConfig
from tests.conftest import crashing_checkpoints, repo_script
from tests.exec.test_packed import _peak_allocated
from tests.tolerances import same_accuracy, same_selection

REPO = Path(__file__).resolve().parents[2]
QUIET = dict(log=lambda s: None)
STATE_TOL = 1e-2  # of each tensor's movement in training (see the module docstring)
LOSS_TOL = 1e-3  # relative
TINY = {"width": 8, "blocks": (1, 1)}
TEST_IMAGES = 60  # small_cifar's test batch


def write_coloured_cifar(root: Path, per_batch: int = 60, seed: int = 0) -> None:
    """`root/cifar-10-batches-py/` in the published format (pickled dicts, N x 3072 uint8 in R, G, B planes); each
    class has its own mean colour under pixel noise, and a grey corner that the random crops move around."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    colours = rng.integers(40, 216, (10, 3))
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = rng.permutation(np.arange(per_batch) % 10)
        images = rng.normal(0, 40, (per_batch, 3, 32, 32)) + colours[labels][:, :, None, None]
        images[:, :, :16, :16] = 128
        data = images.clip(0, 255).astype(np.uint8).reshape(per_batch, 3072)
        (folder / name).write_bytes(pickle.dumps({b"labels": labels.tolist(), b"data": data}, protocol=2))
    meta = {b"label_names": [c.encode() for c in CIFAR10.class_names]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))


@pytest.fixture
def small_cifar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data root with 240 / 60 / 60 coloured CIFAR-10 images, loaded for the tiny ResNet (`TINY`)."""
    root = tmp_path / "data"
    write_coloured_cifar(root)
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    load = CIFAR10.load

    def tiny_load(self):
        splits = load(self)
        splits.model_args = dict(TINY)
        return splits

    monkeypatch.setattr(CIFAR10, "load", tiny_load)
    return root


class WarmStarts:
    """A warm-start cache that keeps what it is given: solo trials call it, packs `get` and `put`."""

    def __init__(self) -> None:
        self.states: dict[str, dict[str, torch.Tensor]] = {}

    def __call__(self, key: str, fresh):
        state, epochs = fresh()
        self.states[key] = state
        return state, epochs

    def get(self, key: str) -> None:
        return None

    def put(self, key: str, state: dict[str, torch.Tensor], epochs: list, seconds: float) -> None:
        self.states[key] = state


class LastCheckpoint:
    """Epoch checkpoints kept in memory: the last one saved."""

    last: dict | None = None

    def load(self) -> None:
        return None

    def save(self, state: dict) -> None:
        self.last = state


def assert_close_states(packed: dict[str, torch.Tensor], solo: dict[str, torch.Tensor],
                        initial: dict[str, torch.Tensor], what: str) -> None:
    assert packed.keys() == solo.keys(), what
    for name, s in solo.items():
        p = packed[name]
        if not s.is_floating_point():
            assert torch.equal(p, s), (what, name)  # BatchNorm's step counters
            continue
        moved = (s.double() - initial[name].double()).abs().max().item()
        gap = (p.double() - s.double()).abs().max().item()
        assert moved > 0 and gap <= STATE_TOL * moved, (what, name, gap, moved)


def assert_close(a: float, b: float) -> None:
    assert math.isclose(a, b, rel_tol=LOSS_TOL), (a, b)


def test_a_packed_resnet_pair_equals_its_solo_trials(small_cifar: Path, tmp_path: Path) -> None:
    """Two members (SCE and CE, which share CIFAR-10's default method stage; other seeds, noise, rates and learning
    rates), warm starts and method stage packed, against their solo trials: rows, epoch curves, warm-started states
    (weights and running statistics) and the method stage's last checkpoint (current and best states)."""
    configs = [TrialConfig("cifar10", m, "pairs", r, seed=s, lr=lr, batch_size=32, epochs=3, epochs_warmup=3)
               for m, r, s, lr in (("sce", 0.4, 0, 1e-2), ("ce", 0.2, 1, 5e-3))]
    warm, checkpoint = WarmStarts(), LastCheckpoint()
    rows = run_pack(configs, small_cifar, results=tmp_path / "packed", warm_cache=warm, checkpoints=checkpoint,
                    **QUIET)
    members = member_order(configs)  # the pack's order (checkpoint states are held in it)
    for i, (config, packed) in enumerate(zip(configs, rows, strict=True)):
        solo_warm, solo_checkpoint = WarmStarts(), LastCheckpoint()
        solo = run_trial(config, small_cifar, results=tmp_path / "solo", warm_cache=solo_warm,
                         checkpoints=solo_checkpoint, **QUIET)
        assert packed["pack_size"] == 2 and packed["status"] == solo["status"] == "ok"
        a, b = (pl.read_parquet(tmp_path / where / "epochs" / f"{config.trial_id}.parquet")
                for where in ("packed", "solo"))
        solo_val = b.filter(stage="method")["val_loss"].to_list()
        assert same_selection(packed["best_epoch"], solo["best_epoch"], solo_val)
        same_best = packed["best_epoch"] == solo["best_epoch"]
        for key in ("test_acc", "last_test_acc", "warmup_test_acc")[0 if same_best else 1:]:
            assert same_accuracy(packed[key], solo[key], TEST_IMAGES), (key, packed[key], solo[key])
        assert_close(packed["val_loss"], solo["val_loss"])
        assert a["stage"].to_list() == b["stage"].to_list() and a.height == 3 + 4
        for column in ("train_loss", "val_loss"):
            for x, y in zip(a[column].drop_nulls(), b[column].drop_nulls(), strict=True):
                assert_close(x, y)

        (key, warm_state), = solo_warm.states.items()
        prepared = prepare(config, small_cifar, **QUIET)
        seed_everything(warm_seed(prepared, 0))
        initial = build_model(prepared).state_dict()
        assert_close_states(warm.states[key], warm_state, initial, "warm start")

        k = members.index(i)
        stage, solo_stage = checkpoint.last["stage"], solo_checkpoint.last["stage"]
        current = {n: t[k] for n, t in (*stage["params"].items(), *stage["buffers"].items())}
        assert_close_states(current, solo_stage["nets"][0], warm_state, "method stage, last epoch")
        assert_close_states({n: t[k] for n, t in stage["best"].items()}, solo_stage["best_state"], warm_state,
                            "method stage, best state")
    assert rows[0]["val_loss"] != rows[1]["val_loss"]


def test_a_killed_resnet_pack_resumes_with_the_same_numbers(small_cifar: Path, tmp_path: Path) -> None:
    """The checkpoint holds the running statistics and the members' generators (their augmentation): a pack killed
    after its first method epoch resumes to the uninterrupted pack's numbers, bit for bit (the same operations in
    the same order)."""
    configs = [TrialConfig("cifar10", m, "pairs", 0.3, seed=s, lr=1e-2, batch_size=32, epochs=3, epochs_warmup=1)
               for m, s in (("ce", 0), ("sce", 1))]
    whole = run_pack(configs, small_cifar, **QUIET)
    results = str(tmp_path / "resumed")
    with pytest.raises(RuntimeError, match="node lost"):
        run_pack(configs, small_cifar, results=results, log=lambda s: None,
                 checkpoints=crashing_checkpoints(1)(results, pack_id(configs), lambda s: None))
    lines: list[str] = []
    resumed = run_pack(configs, small_cifar, results=results, log=lines.append,
                       checkpoints=Checkpoints(results, pack_id(configs), lambda s: None))
    assert "resumed from the checkpoint of epoch 1" in lines
    for a, b in zip(resumed, whole, strict=True):
        for key in ("best_epoch", "val_loss", "test_acc", "last_test_acc", "confusion"):
            assert a[key] == b[key], key


def _stage(small_cifar: Path, seeds: tuple[int, ...]) -> PackedStage:
    ps, nets, generators = [], [], []
    for s in seeds:
        p = prepare(TrialConfig("cifar10", "ce", "pairs", 0.2, seed=s, batch_size=32), small_cifar, **QUIET)
        seed_everything(s)
        ps.append(p)
        nets.append(build_model(p))
        generators.append(device_generator(p.device, s))
    return PackedStage(ps, nets, generators, ps[0].method_stage, [1e-2] * len(ps), list(seeds))


def test_a_frozen_members_running_statistics_stay_as_they_were(small_cifar: Path) -> None:
    """A diverged member is frozen: its parameters and its running statistics; its pack-mates' move on."""
    stage = _stage(small_cifar, (0, 1))
    before = {n: b.clone() for n, b in stage.buffers.items()}
    stage.freeze(np.array([False, True]))
    stage.train_steps(0)
    for name, b in stage.buffers.items():
        assert torch.equal(b[1], before[name][1]), name
        assert not torch.equal(b[0], before[name][0]), name


class ChannelFlip(torch.nn.Module):
    """A BatchNorm network whose forward code reverses the channels: in the fused layout that swaps members."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn(self.conv(x)).flip(1).mean(dim=(2, 3)))


def test_a_network_that_mixes_members_channels_is_refused() -> None:
    """The fused pass is checked against each member's own network before a pack trains."""
    nets = [ChannelFlip(10) for _ in range(2)]
    for net in nets:  # members that differ, so that swapping them shows
        torch.nn.init.normal_(net.fc.weight)
    grouped = Grouped(nets[0], 2)
    params, buffers = torch.func.stack_module_state(nets)
    with pytest.raises(UserError, match="does not keep the members' channels apart"):
        grouped.check(nets, params, buffers, torch.randn(2, 3, 8, 8))
    resnets = [models.create("resnet34_cifar", 10, **TINY) for _ in range(2)]
    params, buffers = torch.func.stack_module_state(resnets)
    Grouped(resnets[0], 2).check(resnets, params, buffers, torch.randn(2, 3, 32, 32))  # the real one passes
    with pytest.raises(UserError, match="not Dropout"):
        Grouped(torch.nn.Sequential(torch.nn.BatchNorm2d(3), models.Dropout(0.5)), 2)


def test_the_channels_last_layout_reaches_the_convolutions_and_keeps_the_numbers() -> None:
    """On CUDA a pack runs channels-last (`bench.models.trains_channels_last`); the layout is the same on a CPU:
    every fused convolution gets an NHWC input and kernel (no copy per step: the stacked kernels are laid out for
    it, and their gradients follow). It changes the order of sums only, so in float64 its logits and gradients
    equal the NCHW layout's to float64's rounding of the longest sums (m = 4 x 32 x 32 terms in the kernels' and
    BatchNorm's gradients: m x u = 4.5e-13 of the summed magnitudes, u = 2^-53), compared at 1e-8 of each
    tensor's largest value (BatchNorm's gradients cancel: the summed magnitudes exceed the result); a layout that
    mixed members' channels would be off by the values themselves."""
    torch.manual_seed(0)
    nets = [models.create("resnet34_cifar", 10, **TINY) for _ in range(3)]
    x = torch.randn(3, 4, 3, 32, 32)

    def run(channels_last: bool, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        members = [net.to(dtype) for net in nets]
        grouped = Grouped(members[0], 3, channels_last)
        params, buffers = torch.func.stack_module_state(members)
        params = grouped.layout(params)
        seen: list[bool] = []
        with _ConvLayouts(seen):
            logits = grouped(params, buffers, x.to(dtype), [])
        logits.square().sum().backward()
        assert seen and all(layout == channels_last for layout in seen), seen
        for name in (n for n in grouped.kernels if params[n].shape[-1] > 1):  # a 1x1 kernel is both layouts
            assert params[name].grad.flatten(0, 1).is_contiguous(memory_format=torch.channels_last) == channels_last
        return {"logits": logits.detach(), **{n: p.grad for n, p in params.items()}}

    nchw, nhwc = run(False, torch.float64), run(True, torch.float64)
    for name, reference in nchw.items():
        assert (nhwc[name] - reference).abs().max() <= 1e-8 * reference.abs().max(), name


class _ConvLayouts(torch.utils._python_dispatch.TorchDispatchMode):
    """Records, for every convolution, whether its input and kernel are both channels-last."""

    def __init__(self, seen: list[bool]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default:
            x, w = args[0], args[1]
            self.seen.append(x.is_contiguous(memory_format=torch.channels_last)
                             and w.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())
        return func(*args, **(kwargs or {}))


def test_the_memory_estimate_bounds_a_real_resnet_pack(small_cifar: Path) -> None:
    """`pack_memory` (measured on a pack of two) bounds what a real pack of three ResNet members allocates, CE warm
    starts, the method stage and the per-epoch diagnostics included, and is not wildly above it."""
    from bench.exec.memory import pack_memory

    configs = [TrialConfig("cifar10", m, "pairs", 0.2, seed=s, batch_size=32, epochs=1, epochs_warmup=1)
               for s, m in enumerate(("ce", "sce", "ce"))]
    memory = pack_memory(prepare(configs[0], small_cifar, **QUIET))
    peak = _peak_allocated(lambda: run_pack(configs, small_cifar, **QUIET))
    estimate = memory.bytes(len(configs)) - memory.inputs
    assert peak <= estimate <= 3 * peak, (peak, estimate)


def test_the_cifar10_grid_packs_all_but_lccn_and_vat(small_cifar: Path, tmp_path: Path, capsys) -> None:
    """The paper's CIFAR-10 grid (`tune_configs/cifar10.yaml`, 600 trials on CUDA): every trial packs except
    LCCN's and VAT's (extra passes, per-example state), which `--dry-run` lists as solo with their reason."""
    from bench.cli.main import main

    code = main(["run", str(REPO / "tune_configs" / "cifar10.yaml"), "--dry-run", "--data-root", str(small_cifar),
                 "--results", str(tmp_path / "results")])
    out = capsys.readouterr().out
    assert code == 0, out
    solo = [line.strip() for line in out.splitlines() if line.strip().startswith("solo:")]
    assert len(solo) == 2 and all(line.startswith("solo: 50 trials: method") for line in solo), solo
    assert {line.split()[4] for line in solo} == {"lccn", "vat"}
    assert "packs (--executor auto): 500 trials in" in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_packed_resnet_pair_equals_its_solo_trials_on_cuda(small_cifar: Path, tmp_path: Path, monkeypatch) -> None:
    """On CUDA, channels-last (the production layout), TF32 off: packed and solo differ by the order of sums."""
    monkeypatch.setenv("BENCH_TF32", "0")
    configs = [TrialConfig("cifar10", m, "pairs", r, seed=s, lr=1e-2, batch_size=32, epochs=3, epochs_warmup=3,
                           device="cuda") for m, r, s in (("sce", 0.4, 0), ("ce", 0.2, 1))]
    try:
        rows = run_pack(configs, small_cifar, results=tmp_path / "packed", **QUIET)
        for config, packed in zip(configs, rows, strict=True):
            solo = run_trial(config, small_cifar, results=tmp_path / "solo", **QUIET)
            solo_val = pl.read_parquet(tmp_path / "solo" / "epochs" / f"{config.trial_id}.parquet").filter(
                stage="method")["val_loss"].to_list()
            assert same_selection(packed["best_epoch"], solo["best_epoch"], solo_val)
            assert_close(packed["val_loss"], solo["val_loss"])
    finally:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True


def test_the_projection_counts_the_cifar10_table_of_the_experiment_file() -> None:
    """benchmarks/big_models.py's projection (it may not read YAML: it runs on a bare GPU box) against the grid
    that `tune_configs/cifar10.yaml` expands to: training image-steps of its trials and their warm starts, split by
    what packs; at the issue's 11,074 images/s (ResNet-34 solo, channels-last, on an H100), ~66 GPU-hours for all of
    it solo (the issue's ~133 counted a second noise pattern, `uniform`, that the paper's table does not have)."""
    from bench.grid.files import load_experiment
    from bench.grid.plan import warm_cell

    trials = load_experiment(REPO / "tune_configs" / "cifar10.yaml").trials()
    images = CIFAR10.split_sizes[0]
    epochs = {t.trial_id: CIFAR10.method_stage.epochs if t.epochs is None else t.epochs for t in trials}
    solo = sum(epochs[t.trial_id] for t in trials if why_solo(t)) * images
    cells = {warm_cell(t) for t in trials}
    warm = len(cells) * CIFAR10.warmup.epochs * images
    packable = sum(epochs[t.trial_id] for t in trials if not why_solo(t)) * images + warm
    assert len(trials) == 600 and len(cells) == 50
    big_models = repo_script("benchmarks/big_models.py")
    assert big_models.table_image_steps() == (packable, solo)
    hours = big_models.projection({"solo fp32": 11_074.0, "pack 8 fp32": 40_000.0}, out=lambda s: None)
    assert hours["today: every trial solo fp32"] == pytest.approx((600 * 100 + 50 * 120) * 40_000 / 11_074 / 3600)
    assert round(hours["today: every trial solo fp32"]) == 66
    assert hours["pack 8 fp32, LCCN and VAT solo fp32"] == pytest.approx((packable / 40_000 + solo / 11_074) / 3600)


def test_the_big_models_benchmark_runs_on_a_bare_box(tmp_path: Path) -> None:
    """It imports only torch and numpy with bench's core (Ray, MLflow, YAML, SciPy, matplotlib refused in a fresh
    interpreter) and runs every arm on the CPU with tiny networks: positive rates for the solo, packed and streams
    arms of both networks, the projection, and with --write-table each network's fastest arm as grids run it as its
    row of the executor table."""
    script = f"""
import sys
for name in ("ray", "mlflow", "polars", "pyarrow", "pandas", "scipy", "matplotlib", "yaml"):
    sys.modules[name] = None
import runpy
sys.argv = ["big_models", "--device", "cpu", "--tiny", "--members", "2", "--steps", "2", "--rounds", "1",
            "--batch", "16", "--write-table", "{tmp_path / 'table.csv'}"]
runpy.run_path("{REPO / 'benchmarks' / 'big_models.py'}", run_name="__main__")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    table = {row.model: row for row in executor_table.read_table(tmp_path / "table.csv")}
    assert set(table) == {"resnet34_cifar", "vgg16_bn"}
    for network in ("resnet34_cifar", "vgg16_bn"):
        block = out.stdout.split(f"{network}: arm")[1].split("\n\n")[0]
        rates = {line.split(" | ")[0].strip(): float(line.split(" | ")[1].replace(",", ""))
                 for line in block.splitlines()[1:] if line.count(" | ") == 2}
        assert set(rates) == {"solo fp32", "solo fp32 + CL", "pack 2 fp32", "streams 2", "streams 1"}, rates
        assert min(rates.values()) > 0, rates
        as_run = {"solo fp32": ("solo", 1), "pack 2 fp32": ("pack", 2), "streams 2": ("streams", 2)}
        best = max(as_run, key=rates.get)
        row = table[network]
        assert (row.device, row.executor, row.trials) == ("cpu", *as_run[best])
        assert row.images_per_s == f"{rates[best]:.0f}" and row.source.startswith("benchmarks/big_models.py --device")
    assert "today: every trial solo fp32" in out.stdout and "pack 2 fp32, LCCN and VAT solo fp32" in out.stdout
    assert re.search(r"streams [12], every trial", out.stdout)  # the faster of the two, whichever it was here
    from bench.grid.executor_table import device_kind

    assert [device_kind(n) for n in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB",
                                                 "cpu")] == ["H100", "H200", "A100", "cpu"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_compiled_resnet_pack_trains_as_the_eager_pack(small_cifar: Path, monkeypatch) -> None:
    """BENCH_PACK_COMPILE compiles the fused forward pass (running statistics updated in place included): the
    same training up to the order of sums (the tolerance of the pair test), TF32 off."""
    monkeypatch.setenv("BENCH_TF32", "0")
    configs = [TrialConfig("cifar10", m, "pairs", 0.3, seed=s, lr=1e-2, batch_size=32, epochs=2, epochs_warmup=1,
                           device="cuda") for m, s in (("ce", 0), ("sce", 1))]
    try:
        eager = run_pack(configs, small_cifar, **QUIET)
        monkeypatch.setenv("BENCH_PACK_COMPILE", "default")
        compiled = run_pack(configs, small_cifar, **QUIET)
    finally:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    for a, b in zip(eager, compiled, strict=True):
        assert a["best_epoch"] == b["best_epoch"]
        assert_close(a["val_loss"], b["val_loss"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_bf16_pack_runs_its_convolutions_in_bf16_channels_last(small_cifar: Path) -> None:
    """Members of precision bf16: every fused convolution of a training step gets bf16 NHWC tensors (autocast and
    the channels-last layout together), and the losses stay finite."""
    ps, nets, generators = [], [], []
    for s in (0, 1):
        p = prepare(TrialConfig("cifar10", "ce", "pairs", 0.2, seed=s, batch_size=32, device="cuda",
                                precision="bf16"), small_cifar, **QUIET)
        ps.append(p)
        nets.append(build_model(p))
        generators.append(device_generator(p.device, s))
    stage = PackedStage(ps, nets, generators, ps[0].method_stage, [1e-2] * 2, [0, 1])
    seen: list[tuple[torch.dtype, bool]] = []

    class Convolutions(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.convolution.default:
                seen.append((args[0].dtype, args[0].is_contiguous(memory_format=torch.channels_last)))
            return func(*args, **(kwargs or {}))

    with Convolutions():
        losses = stage.batch_losses(torch.arange(32, device="cuda").expand(2, 32), 0)
    assert seen and all(dtype == torch.bfloat16 and nhwc for dtype, nhwc in seen), seen
    assert torch.isfinite(losses).all()


@pytest.mark.parametrize("name", sorted(n for n, cls in models.registry().items() if cls.packable))
def test_every_packable_model_with_batchnorm_passes_the_fused_check(name: str) -> None:
    """The contract of `packable` for the networks with buffers: at full size, their fused pass equals each
    member's own network (`Grouped.check`, evaluation mode, two inputs of the size their dataset trains at)."""
    shapes = {"resnet34_cifar": (3, 32, 32), "resnet18_cifar": (3, 32, 32), "vgg16_bn": (3, 64, 64),
              "vgg19_bn": (3, 64, 64), "resnet50": (3, 64, 64)}
    # What a network needs beyond its classes: the word CNNs a vocabulary, the linear probe its features' width.
    needs = {"word_cnn": {"vocab_size": 50}, "word_cnn_authors": {"vocab_size": 50},
             "linear_probe": {"in_features": 16}}
    torch.manual_seed(0)
    nets = [models.create(name, 10, **needs.get(name, {})) for _ in range(2)]
    params, buffers = torch.func.stack_module_state(nets)
    assert bool(buffers) == (name in shapes), name  # the BatchNorm networks are the ones with buffers
    if buffers:
        Grouped(nets[0], 2).check(nets, params, buffers, torch.randn(2, *shapes[name]))
