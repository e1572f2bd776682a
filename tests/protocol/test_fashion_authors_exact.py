"""Fashion-MNIST under `--protocol authors` is the paper's script's computation, every printed figure (issue #43
item 7).

The script (Newbeeer/L_DMI, fashion/main.py and fashion/fashion.py, commit 7d5e4bc) seeds no torch generator, so its
figures exist only for a declared seed: `script_stream` declares `torch.manual_seed(seed)` at the start of its
`__main__` and takes its draws from torch's one global generator in its order: each loader iterator's base seed, the
shuffled training loader's sampler seed, dropout, and the test passes it makes beside validation (one after each
main_ce epoch, main.py:105; one before main_dmi's first validation, main.py:111). The first test checks that as a
property on a tiny Fashion-MNIST, against the script's two stages written out here with torch's own DataLoader and
torchvision's Normalize; the last holds figures the script itself printed on the real files.

The script was run under the portable numerics' pins (ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE
ONEDNN_MAX_CPU_ISA=AVX2, OMP_NUM_THREADS=1: the same figures on any x86-64 CPU; torch 2.14.1, numpy 2.4.6, Pillow
13.0.0), in a scratch folder outside the repository, with these shims and no other change:
- `torch.manual_seed(args.s)` as the first line of `if __name__ == '__main__':` (the declared seed);
- `torch.Tensor.cuda` and `nn.Module.cuda` the identity, `torch.cuda.set_device` a no-op (no GPU),
  `torch.load(..., weights_only=False)` (its whole-model pickles), `tqdm` a stub returning its iterable;
- `int(np.random.choice(...)[0])` in fashion.py:88 and :91 (NumPy 2 refuses `int` of a one-element array);
- main_ce's `range(20)` (main.py:90) run for `warm` epochs and main_dmi's (main.py:115) for `epochs`;
- its data root `./processed/{training,test}.pt` written from the published idx files as its `download()` writes
  them: (uint8 N x 28 x 28 images, int64 labels).
- its loaders' `num_workers=16` as 0 (each iterator draws its base seed and its sampler's seed in the main process
  with or without workers; on a 2-core machine sixteen workers per pass only slow it).
"""

from __future__ import annotations

import copy
import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision.transforms.functional import normalize

from bench import models
from bench.exec.prepare import prepare
from bench.exec.trainer import run_trial
from bench.exec.warmstart import WarmStartCache
from bench.store.folder import read_table
from bench.trial import TrialConfig
from tests.conftest import write_idx


def _quiet(_: str) -> None:
    pass


def _write_fashion(root: Path, n_train: int, n_test: int) -> None:
    """A Fashion-MNIST in the published layout: bags (class 8) about a fifth of the images, brighter in the middle."""
    rng = np.random.default_rng(1)
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, n)
        labels[::5] = 8
        images = rng.integers(0, 120, (n, 28, 28))
        images[labels == 8, 8:20, 8:20] += rng.integers(60, 135, (int((labels == 8).sum()), 12, 12))
        write_idx(raw / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte.gz", labels)


def _read(path: Path) -> np.ndarray:
    data = gzip.decompress(path.read_bytes())
    dims = np.frombuffer(data, ">u4", data[3], 4).astype(int)
    return np.frombuffer(data, np.uint8, offset=4 + 4 * data[3]).reshape(dims)


def _script_inputs(raw: Path, prefix: str) -> torch.Tensor:
    """The script's transform: ToTensor (bytes / 255 in float32), then Normalize((0.1307,), (0.3081,))."""
    images = torch.from_numpy(_read(raw / f"{prefix}-images-idx3-ubyte.gz").copy()).unsqueeze(1)
    return normalize(images.float().div(255), [0.1307], [0.3081])


def _script_dmi(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """fashion/main.py:15-23: -log(|det(onehot^T softmax / N)| + 0.001)."""
    onehot = torch.zeros(len(target), 2).scatter_(1, target[:, None], 1).t()
    return -torch.log(torch.abs(torch.det(onehot @ F.softmax(output, dim=1) / len(target))) + 0.001)


def _script_run(root: Path, p, seed: int, warm: int, epochs: int) -> dict[str, list[float]]:
    """fashion/main.py's __main__ with the declared seed, written out: main_ce (a new Adam each epoch; the shuffled
    loader of 128, the last partial batch ending the epoch; the validation accuracy, the model kept when >= the best,
    then the test accuracy), then main_dmi (the kept model's test accuracy, its first-batch L_DMI, then per epoch
    training with L_DMI and its first-batch L_DMI, kept when < the best). Every loader is torch's, so each draws
    from the global generator as the script's do. The noisy labels are the trial's (script_noise, tested apart)."""
    raw = root / "FashionMNIST" / "raw"
    n = len(p.train.labels)
    x_all = _script_inputs(raw, "train")
    x_train, x_val, x_test = x_all[:n], x_all[n:], _script_inputs(raw, "t10k")
    y_train, y_val = p.train.labels, p.val.labels
    y_test = torch.from_numpy(np.where(_read(raw / "t10k-labels-idx1-ubyte.gz") == 8, 0, 1))

    def test(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
        net.eval()
        correct = sum(int(net(x[idx]).max(1)[1].eq(y[idx]).sum()) for idx in DataLoader(range(len(y)), 128))
        return 100.0 * correct / len(y)

    def validate(net: torch.nn.Module) -> float:
        net.eval()
        with torch.no_grad():
            idx = next(iter(DataLoader(range(len(y_val)), 128)))  # i == 1: break
            return float(_script_dmi(net(x_val[idx]), y_val[idx]))

    def train(net: torch.nn.Module, loss_fn) -> None:
        net.train()
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
        for idx in DataLoader(range(n), batch_size=128, shuffle=True):
            if len(idx) != 128:
                break
            loss = loss_fn(net(x_train[idx]), y_train[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    torch.manual_seed(seed)
    net = models.create("fashion_cnn", 2)
    figures: dict[str, list[float]] = {"valid_acc": [], "test_acc": [], "valid_loss": []}
    best, kept = 0.0, None
    for _ in range(warm):
        train(net, F.cross_entropy)
        figures["valid_acc"].append(test(net, x_val, y_val))
        if figures["valid_acc"][-1] >= best:
            best, kept = figures["valid_acc"][-1], copy.deepcopy(net.state_dict())
        figures["test_acc"].append(test(net, x_test, y_test))
    net.load_state_dict(kept)
    figures["warm_start_test_acc"] = [test(net, x_test, y_test)]
    figures["valid_loss"].append(validate(net))
    for _ in range(epochs):
        train(net, _script_dmi)
        figures["valid_loss"].append(validate(net))
    return figures


def test_authors_trial_is_the_scripts_run_draw_for_draw(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    _write_fashion(tmp_path, 480, 90)  # 400 training images: three full batches of 128 and a partial one
    config = TrialConfig(dataset="fashion_mnist", method="dmi", noise="case1", r=0.3, seed=4, protocol="authors",
                         epochs_warmup=3, epochs=2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same float order in both
    try:
        p = prepare(config, tmp_path, log=_quiet)
        assert p.protocol.on("script_stream") and p.protocol.script_passes("warmup_epoch") == 1
        script = _script_run(tmp_path, p, seed=4, warm=3, epochs=2)
        cache = WarmStartCache(tmp_path / "results", log=_quiet)
        row = run_trial(config, tmp_path, results=tmp_path / "results", log=_quiet, warm_cache=cache)
        # From the cached warm start, the method stage continues the very stream the warm start left.
        again = run_trial(config, tmp_path, results=tmp_path / "again", log=_quiet,
                          warm_cache=WarmStartCache(tmp_path / "results", _quiet))
    finally:
        torch.set_num_threads(threads)
    epochs = read_table(tmp_path / "results", "epochs").sort("epoch")
    warmup, method = epochs.filter(stage="warmup"), epochs.filter(stage="method")
    assert warmup["val_acc"].to_list() == script["valid_acc"]
    assert warmup["test_acc"].to_list() == script["test_acc"]
    assert row["warmup_test_acc"] == script["warm_start_test_acc"][0]
    assert method["val_loss"].to_list() == script["valid_loss"]  # bit for bit, the warm-started model's first
    assert cache.misses == 1
    assert read_table(tmp_path / "again", "epochs").filter(stage="method").sort("epoch")["val_loss"].to_list() \
        == script["valid_loss"]
    assert again["test_acc"] == row["test_acc"]
    # Without the test passes' draws the stream would be another one: the figures are not a coincidence of order.
    monkeypatch.setattr(type(p.protocol), "script_passes", lambda self, where: 0)
    torch.set_num_threads(1)
    try:
        off = run_trial(config, tmp_path, results=tmp_path / "off", log=_quiet)
    finally:
        torch.set_num_threads(threads)
    assert off["val_loss"] != row["val_loss"]


# Printed by the authors' Fashion-MNIST script (fashion/main.py, commit 7d5e4bc) with the shims above, under the
# portable numerics' pins (`bench.numerics`; re-run for issue #53): `python main.py --r R --s S --c C --device 0` with
# main_ce run for `warm` epochs and main_dmi for `epochs`.
SCRIPT_FIGURES = {
    # (case, r, seed, warm, epochs): valid_acc and test_acc per main_ce epoch, test_acc of the kept CE model
    # (main.py:111, also its final_test_acc), valid_loss (main.py:113, then per main_dmi epoch), final_test_acc of
    # the kept L_DMI model
    ("case1", 0.4, 1, 2, 2): ([77.94, 79.11], [95.64, 97.77], 97.77,
                              [4.214860439300537, 3.417252540588379, 3.4061200618743896], 97.55),
    ("case3", 0.2, 2, 2, 1): ([79.07, 79.52], [98.13, 98.37], 98.37,
                              [3.5146942138671875, 2.95719575881958], 98.11),
}


@pytest.mark.realdata
@pytest.mark.slow
@pytest.mark.parametrize("cell", sorted(SCRIPT_FIGURES))
def test_authors_trial_prints_the_scripts_figures(cell, shared_data: Path, tmp_path: Path,
                                                  portable_figures) -> None:
    """Under the portable numerics (the suite's pins, checked in force by the trial; the trial's one thread whatever
    the process has) every digit the script prints."""
    case, r, seed, warm, epochs = cell
    valid_acc, test_acc, ce_test, losses, dmi_test = SCRIPT_FIGURES[cell]
    row = run_trial(TrialConfig(dataset="fashion_mnist", method="dmi", noise=case, r=r, seed=seed,
                                protocol="authors", epochs_warmup=warm, epochs=epochs, numerics="portable"),
                    shared_data, results=tmp_path, log=_quiet)
    assert (row["cpu_capability"], row["threads"]) == ("AVX2", 1)
    table = read_table(tmp_path, "epochs").sort("epoch")
    warmup, method = table.filter(stage="warmup"), table.filter(stage="method")
    # Every digit the script prints: the accuracies are 100 * hits / total in both, the losses the same float32.
    assert warmup["val_acc"].to_list() == valid_acc
    assert warmup["test_acc"].to_list() == test_acc
    assert row["warmup_test_acc"] == ce_test
    assert method["val_loss"].to_list() == losses
    assert row["best_epoch"] == int(np.argmin(losses)) and row["test_acc"] == dmi_test
