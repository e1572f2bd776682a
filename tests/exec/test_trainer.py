"""The trainer: the paper's selection rule, determinism, the warm-start cache, and CE's failure under case 3."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.exec.prepare import prepare
from bench.exec.stage import accuracy
from bench.exec.trainer import run_trial, train
from bench.methods import Method, registry
from bench.store.folder import read_table
from bench.trial import TrialConfig


def _config(**kw) -> TrialConfig:
    base = dict(dataset="synthetic", method="dmi", noise="case3", r=0.3, seed=0, epochs=4, epochs_warmup=2)
    return TrialConfig(**{**base, **kw})


def _quiet(_: str) -> None:
    pass


def test_selects_lowest_noisy_validation_loss_including_warm_start(tmp_path) -> None:
    row = run_trial(_config(), "unused", results=tmp_path, log=_quiet)
    curve = read_table(tmp_path, "epochs").filter(stage="method").sort("epoch")
    assert curve["epoch"].to_list() == [0, 1, 2, 3, 4]
    losses = curve["val_loss"].to_numpy()
    assert row["best_epoch"] == int(np.argmin(losses))
    assert row["val_loss"] == pytest.approx(losses.min())
    warm = read_table(tmp_path, "epochs").filter(stage="warmup")
    assert warm.height == 2


def test_same_config_same_numbers() -> None:
    a = run_trial(_config(), "unused", log=_quiet)
    b = run_trial(_config(), "unused", log=_quiet)
    for key in ("test_acc", "val_loss", "best_epoch", "last_test_acc", "noise_hash", "confusion"):
        assert a[key] == b[key]
    c = run_trial(_config(seed=1), "unused", log=_quiet)
    assert c["noise_hash"] != a["noise_hash"]


def test_cached_warm_start_gives_identical_results() -> None:
    store: dict[str, dict] = {}
    calls = []

    def cache(key: str, fresh):
        if key not in store:
            calls.append(key)
            store[key] = fresh()
        return store[key]

    p = prepare(_config(), "unused")
    first = train(p, log=_quiet, warm_cache=cache)
    second = train(prepare(_config(method="ce"), "unused"), log=_quiet, warm_cache=cache)
    third = train(prepare(_config(), "unused"), log=_quiet, warm_cache=cache)
    uncached = train(prepare(_config(), "unused"), log=_quiet)
    assert len(calls) == 1  # CE and DMI of one cell share one warm start
    assert second.warmup_test_acc == first.warmup_test_acc
    assert third.test_acc == first.test_acc == uncached.test_acc
    assert third.val_loss == first.val_loss == uncached.val_loss


def test_ce_collapses_and_dmi_does_not_under_diagonally_non_dominant_noise() -> None:
    """Case 3 at r = 0.7 makes the minority class the noisy majority: CE learns the meaningless all-minority
    classifier (accuracy = the minority's share of the test set); L_DMI keeps learning the true classes."""
    ce = run_trial(_config(method="ce", r=0.7, epochs=8, epochs_warmup=3), "unused", log=_quiet)
    dmi = run_trial(_config(method="dmi", r=0.7, epochs=8, epochs_warmup=3, lr=3e-3), "unused", log=_quiet)
    p = prepare(_config(), "unused")
    minority_share = 100 * float((p.splits.test.y == 0).mean())
    # Not a rounding bound: the all-minority classifier scores the minority share exactly; 1 point (10 of the
    # 1,000 test examples predicted otherwise) is still that classifier, where a working one is far above.
    assert ce["test_acc"] == pytest.approx(minority_share, abs=1.0)
    assert dmi["test_acc"] > 80.0


def test_accuracy_and_balanced_accuracy_against_numpy() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 500)
    logits = rng.normal(size=(500, 3)) + np.eye(3)[labels] * 0.8
    acc, bal, confusion = accuracy(torch.tensor(logits), torch.tensor(labels), 3)
    pred = logits.argmax(1)
    assert acc == pytest.approx(100 * (pred == labels).mean())
    recalls = [(pred[labels == k] == k).mean() for k in range(3)]
    assert bal == pytest.approx(100 * np.mean(recalls))
    assert confusion.sum() == 500 and confusion[1, 2] == ((labels == 1) & (pred == 2)).sum()


class _Exploding(Method):
    """CE that turns into NaN from the second epoch on."""

    name = "exploding"

    def train_loss(self, nets, batch):
        loss = torch.nn.functional.cross_entropy(nets[0](batch.x), batch.y)
        return loss * float("nan") if batch.epoch >= 1 else loss

    def loss(self, logits, labels):
        return torch.nn.functional.cross_entropy(logits, labels)


def test_diverged_trial_is_flagged_and_keeps_the_best_checkpoint(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(registry(), "exploding", _Exploding)
    row = run_trial(_config(method="exploding", epochs=5), "unused", results=tmp_path, log=_quiet)
    assert row["status"] == "diverged" and "epoch 2" in row["error"]
    assert row["best_epoch"] in (0, 1) and row["test_acc"] > 50
    assert read_table(tmp_path)["status"].to_list() == ["diverged"]


def test_a_finished_trial_leaves_nothing_alive_in_its_worker() -> None:
    """A fresh process (a Ray worker) runs its first trial: afterwards no stage or network of it is alive, even
    with the cycle collector off. torch.optim's first use imports torch._dynamo, and that import kept every frame
    then on the stack (the trial's model, optimiser state and data) for the life of the process."""
    import subprocess
    import sys

    script = """
import gc
from torch import nn
from bench.trial import TrialConfig
from bench.exec.stage import SoloStage
from bench.exec.trainer import run_trial
gc.collect()
gc.disable()
run_trial(TrialConfig("synthetic", "ce", "case3", 0.2, epochs=1, epochs_warmup=1), "unused", log=lambda s: None)
alive = [type(o).__name__ for o in gc.get_objects() if type(o) is SoloStage or type(o).__module__ == "bench.models"]
print("ALIVE", alive)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "ALIVE []" in out.stdout, out.stdout + out.stderr[-2000:]
