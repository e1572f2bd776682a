"""A dataset's stand-in (`Dataset.stand_in`, issue #48): random examples in the dataset's published format, which its
own loader reads as it reads the real files; `bench calibrate` takes a model's stand-in from a dataset of that model
that offers one (`bench.exec.calibrate.find_data`), and the tests' file writers share it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bench.config import UserError
from bench.data import registry
from bench.exec.calibrate import find_data

OFFERING = [name for name, cls in registry().items() if cls.offers_stand_in()]


def test_the_built_in_stand_ins_and_who_offers_one() -> None:
    """CIFAR-10's, Dogs vs Cats' and Fashion-MNIST's own; CIFAR-10N is CIFAR-10's class but reads a label file that
    CIFAR-10's stand-in does not write, so it offers none by inheritance."""
    assert {"cifar10", "dogs_vs_cats", "fashion_mnist"} <= set(OFFERING)
    assert "cifar10n" not in OFFERING and issubclass(registry()["cifar10n"], registry()["cifar10"])


@pytest.mark.parametrize("name", OFFERING)
@pytest.mark.parametrize("n", [1, 10])
def test_a_stand_in_loads_as_its_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, n: int) -> None:
    """Its files are what the loader expects (none missing, none damaged), and `load` gives at least n training
    examples, examples in each held-out split, labels of the dataset's classes, inputs of one shape."""
    monkeypatch.setenv("BENCH_CACHE", str(tmp_path / "cache"))
    cls = registry()[name]
    cls.stand_in(tmp_path / "data", n)
    dataset = cls(tmp_path / "data", verify=False)
    assert dataset.missing_files() == [] and dataset.wrong_files() == []
    splits = dataset.load()
    assert len(splits.train) >= n and len(splits.val) >= 1 and len(splits.test) >= 1
    for split in (splits.train, splits.val, splits.test):
        assert split.y.dtype == np.int64 and ((split.y >= 0) & (split.y < cls.num_classes)).all()
        assert isinstance(split.x, torch.Tensor) and split.x.shape[1:] == splits.train.x.shape[1:]
    assert n < cls.num_classes or len(np.unique(splits.train.y)) > 1  # not one class throughout


@pytest.mark.parametrize("name", OFFERING)
def test_a_stand_in_is_its_seed(tmp_path: Path, name: str) -> None:
    """The same seed writes the same files; another seed other examples."""
    cls = registry()[name]
    for folder, seed in (("a", 0), ("b", 0), ("c", 1)):
        cls.stand_in(tmp_path / folder, 8, seed=seed)

    def contents(folder: str) -> dict[str, bytes]:
        return {p.relative_to(tmp_path / folder).as_posix(): p.read_bytes()
                for p in sorted((tmp_path / folder).rglob("*")) if p.is_file()}

    assert contents("a") == contents("b")
    assert contents("a").keys() == contents("c").keys() and contents("a") != contents("c")


def test_calibration_takes_the_stand_in_of_a_dataset_of_the_model(tmp_path: Path) -> None:
    """Without the files: ResNet-34 on CIFAR-10's stand-in, VGG-16-BN on Dogs vs Cats', the Fashion CNN on
    Fashion-MNIST's; a model none of whose
    datasets offers one is one line; the MLP's set is generated, no stand-in needed."""
    empty = tmp_path / "empty"
    assert find_data("resnet34_cifar", empty) == ("cifar10", "bench", True)
    assert find_data("vgg16_bn", empty) == ("dogs_vs_cats", "bench", True)
    assert find_data("fashion_cnn", empty) == ("fashion_mnist", "bench", True)
    assert find_data("mlp", empty) == ("synthetic", "bench", False)
    with pytest.raises(UserError, match="cannot calibrate word_cnn: mr's files are missing .* no dataset of word_cnn "
                                        "offers a stand-in"):
        find_data("word_cnn", empty)
    registry()["cifar10"].stand_in(tmp_path / "data", 4)  # the files present: the dataset itself
    assert find_data("resnet34_cifar", tmp_path / "data") == ("cifar10", "bench", False)
