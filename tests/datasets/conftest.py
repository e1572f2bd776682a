"""What the datasets' tests share: a pickled payload that a restricted unpickler must never build, the check that a
CIFAR-N label file holding one is refused in one line without a second, unrestricted try, or one of another md5
before it is unpickled, and a CIFAR data set's trial on an MLP."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from bench.config import UserError


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
