"""What the datasets' tests share: a pickled payload that a restricted unpickler must never build, the check that a
CIFAR-N label file holding one is refused in one line without a second, unrestricted try, or one of another md5
before it is unpickled, a CIFAR data set's trial on an MLP, and a data root of tiny CIFAR-10 and CIFAR-10N files in
their published formats."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.config import UserError
from bench.datasets.cifar10 import CIFAR10, read_batch
from bench.datasets.cifar10n import CIFAR10N, LABELS_FILE
from bench.download import file_md5


class Payload:
    """Touches a file when unpickled: what a restricted unpickler must never build."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def refuses_the_pickled_payload(read: Callable[[], object], marker: Path, monkeypatch: pytest.MonkeyPatch,
                                dataset: str, labels: str) -> None:
    """`read()` of a `labels`N label file holding a `Payload(marker)` refuses in one line naming the allow-list that
    refused it (a method's reduce pickles getattr), not torch's advice, and torch.load ran restricted only."""
    calls = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(k) or real_load(*a, **k))
    with pytest.raises(UserError, match=rf"^{dataset}: .*{labels}_human.pt is not the published {labels}N label file "
                                        r"\(its pickle names getattr, which the allow-list of numpy types refuses\); "
                                        "delete it and get it again from https://github.com/UCSC-REAL/.*human.pt$"):
        read()
    assert not marker.exists()
    assert calls and all(k.get("weights_only") is True for k in calls)  # no second, unrestricted try


@contextmanager
def unpickles_nothing_of_another_md5(dataset: type, labels_file: str,
                                     monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Inside, `dataset`'s label file has another md5 than the published one, with checksums switched off (which
    does not switch off the check before unpickling): nothing that runs there may reach torch.load."""
    monkeypatch.setattr(dataset, "files", {**dataset.files, labels_file: "0" * 32})
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    loads = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(k))
    yield
    assert loads == []  # refused before anything was unpickled


def trains_an_mlp(dataset: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CIFAR data set's trials train an MLP on the flattened, normalised images instead of its ResNet: the
    pipeline, not the network, is under test."""
    monkeypatch.setattr(dataset, "model", "mlp")
    monkeypatch.setattr(dataset, "eval_transform", lambda self, x: self.normalise(x).flatten(1))
    monkeypatch.setattr(dataset, "train_transform", lambda self, x, generator=None: self.normalise(x).flatten(1))
    real_load = dataset.load

    def load(self):
        splits = real_load(self)
        splits.model_args = {"in_features": 3072}
        return splits

    monkeypatch.setattr(dataset, "load", load)


def write_cifar_batches(root: Path, per_batch: int = 20, seed: int = 0) -> dict[str, np.ndarray]:
    """`root/cifar-10-batches-py/` as in the official archive (CIFAR-10's stand-in: pickled dicts with bytes keys,
    b"data" N x 3072 uint8 in R, G, B planes, b"labels" a list of ints); each file's labels, as written."""
    CIFAR10.stand_in(root, 4 * per_batch, seed)
    folder = root / "cifar-10-batches-py"
    return {name: read_batch(folder / name)[1] for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]}


def cifar_md5s(root: Path) -> dict[str, str]:
    return {rel: file_md5(root / rel) for rel in CIFAR10.files}


def write_cifar10n(root: Path, clean: np.ndarray, seed: int = 1) -> dict[str, np.ndarray]:
    """`root/CIFAR-10N/CIFAR-10_human.pt` as published: torch.save of a dict of numpy int64 arrays."""
    rng = np.random.default_rng(seed)
    labels = {"clean_label": clean.astype(np.int64)}
    for key, rate in (("aggre_label", 0.1), ("worse_label", 0.4), ("random_label1", 0.2), ("random_label2", 0.2),
                      ("random_label3", 0.2)):
        flip = rng.random(len(clean)) < rate
        labels[key] = np.where(flip, (clean + 1 + rng.integers(0, 9, len(clean))) % 10, clean).astype(np.int64)
    path = root / LABELS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(labels, path)
    return labels


@pytest.fixture
def tiny_cifar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data root with CIFAR-10 batches of 20 images and a matching CIFAR-10N label file (their own md5s)."""
    labels = write_cifar_batches(tmp_path)
    clean = np.concatenate([labels[f"data_batch_{i}"] for i in range(1, 6)])
    write_cifar10n(tmp_path, clean)
    md5s = cifar_md5s(tmp_path)
    monkeypatch.setattr(CIFAR10, "files", md5s)
    monkeypatch.setattr(CIFAR10N, "files", {**md5s, LABELS_FILE: file_md5(tmp_path / LABELS_FILE)})
    return tmp_path
