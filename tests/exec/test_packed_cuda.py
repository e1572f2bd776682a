"""Packed trials on a CUDA device (skipped without one). Imports only torch, numpy and pytest, so that it runs on
a bare GPU box: `python3 -m pytest tests/exec/test_packed_cuda.py`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.exec.pack import run_pack
from bench.exec.trainer import run_trial
from bench.trial import TrialConfig
from tests.tolerances import same_accuracy, trained_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
QUIET = dict(log=lambda s: None)


def _configs() -> list[TrialConfig]:
    return [TrialConfig("fashion_mnist", m, "case3", r, seed=s, lr=lr, batch_size=16, epochs=6, epochs_warmup=6,
                        device="cuda")
            for m, r, s, lr in (("ce", 0.3, 0, 1e-3), ("dmi", 0.6, 1, 3e-4), ("peer", 0.2, 2, 1e-3))]


@pytest.fixture
def exact_fp32(monkeypatch):
    """TF32 off (BENCH_TF32=0): solo and packed then differ only by the order of float32 sums."""
    monkeypatch.setenv("BENCH_TF32", "0")
    yield
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True


def test_a_packed_member_equals_its_solo_trial_on_cuda(tiny_fashion: Path, exact_fp32) -> None:
    configs = _configs()
    rows = run_pack(configs, tiny_fashion, **QUIET)
    for config, packed in zip(configs, rows, strict=True):
        solo = run_trial(config, tiny_fashion, **QUIET)
        # Two float orders of one training (tests/tolerances.py): the same selection, loss within its rounding,
        # accuracy (tiny_fashion's 60 test images) within one example.
        assert packed["noise_hash"] == solo["noise_hash"]
        assert packed["best_epoch"] == solo["best_epoch"], config.method
        assert trained_close(packed["val_loss"], solo["val_loss"]), (packed["val_loss"], solo["val_loss"])
        assert same_accuracy(packed["test_acc"], solo["test_acc"], 60)


def test_no_host_sync_inside_a_training_step(tiny_fashion: Path) -> None:
    """Inside the step loop of a pack and of a solo trial, no operation waits for the device (CUDA's sync debug
    mode raises on any synchronising call); a float comes back only at the end of an epoch."""
    from bench.exec.packed import PackedStage, device_generator
    from bench.exec.prepare import build_model, method_seed, prepare, seed_everything
    from bench.exec.stage import SoloStage
    from bench.methods import get_method

    configs = _configs()
    ps = [prepare(c, tiny_fashion, log=lambda s: None) for c in configs]
    nets, generators, methods = [], [], []
    for p in ps:
        seed_everything(method_seed(p))
        nets.append(build_model(p))
        generators.append(device_generator(p.device, method_seed(p)))
        methods.append(get_method(p.config.method)(2))
    pack = PackedStage(ps, nets, generators, ps[0].method_stage, [1e-3] * 3, [0, 1, 2], methods)
    solo = SoloStage(ps[1], [build_model(ps[1])], ps[1].method_stage, 0, methods[1].train_loss,
                     methods[1].validation_loss, methods[1])
    pack.train_epoch(0), solo.train_epoch(0)  # first use: allocations, kernel selection
    torch.cuda.set_sync_debug_mode("error")
    try:
        pack.train_steps(1)
        solo.train_steps(1)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_a_compiled_pack_trains_as_the_eager_pack(tiny_fashion: Path, exact_fp32, monkeypatch) -> None:
    """BENCH_PACK_COMPILE (torch.compile of the vmapped forward and backward) changes the speed, not the training:
    every member's validation loss and selected epoch as in the eager pack."""
    configs = _configs()
    eager = run_pack(configs, tiny_fashion, **QUIET)
    monkeypatch.setenv("BENCH_PACK_COMPILE", "default")
    compiled = run_pack(configs, tiny_fashion, **QUIET)
    for a, b in zip(eager, compiled, strict=True):
        assert a["best_epoch"] == b["best_epoch"], a["method"]
        # Fused kernels sum in another order: two float orders of one training (tests/tolerances.py).
        assert trained_close(a["val_loss"], b["val_loss"]), (a["val_loss"], b["val_loss"])


@pytest.mark.parametrize("members", [3, 24])
def test_the_memory_estimate_bounds_a_real_packs_peak_on_cuda(tiny_fashion: Path, members: int) -> None:
    """`bench.exec.memory.pack_memory`, measured on the GPU, against the peak torch's allocator reports for a real pack
    (inputs included): at least that, at most three times it."""
    from bench.exec.memory import pack_memory
    from bench.exec.prepare import prepare

    configs = [TrialConfig("fashion_mnist", ("ce", "dmi", "fw")[i % 3], "case3", 0.1 * (i % 8), seed=i,
                           batch_size=16, epochs=2, epochs_warmup=2, device="cuda") for i in range(members)]
    estimate = pack_memory(prepare(configs[0], tiny_fashion, **QUIET)).bytes(members)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run_pack(configs, tiny_fashion, **QUIET)
    peak = torch.cuda.max_memory_allocated() - before
    assert peak <= estimate <= 3 * peak, (peak, estimate)
