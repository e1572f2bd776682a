"""Fashion-MNIST and MR: the published formats, the paper's splits (MR's restated from its code), Kim's cleaning;
the real files when present."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.config import UserError
from bench.data import get_dataset
from bench.datasets.mr import PAD, UNKNOWN, MovieReview, clean_sentence
from bench.models import create


def test_fashion_bags_vs_clothes_from_idx_files(tiny_fashion: Path) -> None:
    splits = get_dataset("fashion_mnist")(tiny_fashion).load()
    assert (len(splits.train), len(splits.val), len(splits.test)) == (100, 20, 60)
    assert splits.train.x.shape == (100, 1, 28, 28) and splits.train.x.dtype == torch.float32
    assert 0.0 <= splits.train.x.min() and splits.train.x.max() <= 1.0
    # Class 0 is the bag (original class 8): those images carry the bright square the fixture drew.
    bright = splits.test.x[:, 0, 10:18, 10:18].mean(dim=(1, 2)) > 200 / 255
    np.testing.assert_array_equal(bright.numpy(), splits.test.y == 0)
    logits = create("fashion_cnn", 2)(splits.test.x)
    assert logits.shape == (60, 2)


def test_fashion_missing_and_corrupt_files(tmp_path: Path, tiny_fashion: Path, monkeypatch) -> None:
    with pytest.raises(UserError, match="missing raw/train-images-idx3-ubyte.gz"):
        get_dataset("fashion_mnist")(tmp_path / "nowhere").load()
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "1")
    with pytest.raises(UserError, match="corrupt"):
        get_dataset("fashion_mnist")(tiny_fashion).load()
    truncated = tiny_fashion / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte.gz"
    import gzip

    truncated.write_bytes(gzip.compress(gzip.decompress(truncated.read_bytes())[:-5]))
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    with pytest.raises(UserError, match="truncated"):
        get_dataset("fashion_mnist")(tiny_fashion).load()


def test_kim_cleaning() -> None:
    assert clean_sentence("It's a film, isn't it?!") == "it 's a film , is n't it ? !"
    assert clean_sentence("  The  \"best\" (really)  ") == "the best ( really )"
    assert clean_sentence("we'll they're i'd you've") == "we 'll they 're i 'd you 've"


def _write_mr(root: Path, n: int) -> None:
    folder = root / "MR" / "rt-polaritydata"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    good, bad = ["great", "moving", "superb", "fun"], ["dull", "boring", "awful", "flat"]
    for kind, words in (("pos", good), ("neg", bad)):
        lines = [" ".join(rng.choice(words + ["the", "film"], 6)) + " caf\xe9 \x85 ok" for _ in range(n)]
        # latin-1 bytes, and \x85 (NEL) inside sentences: a line ends only at \n.
        (folder / f"rt-polarity.{kind}").write_bytes(("\n".join(lines) + "\n").encode("latin-1"))


def papers_mr_split(n_pos: int, n_neg: int) -> dict[str, list[int]]:
    """The paper's MR split restated from its code (Newbeeer/L_DMI, MR/main.py and MR/preprocessors.py): line ids
    (positive lines 0.., then negative ones) through two calls of scikit-learn's train_test_split after
    np.random.seed(0). A call draws one permutation of its list from NumPy's global generator (ShuffleSplit,
    random_state=None), holds out its first ceil(test_size * len) items and keeps the rest, both in that order."""
    generator = np.random.RandomState(0)  # the global generator's state after np.random.seed(0)

    def train_test_split(items: list[int], test_size: float) -> tuple[list[int], list[int]]:
        order = generator.permutation(len(items))
        held_out = math.ceil(test_size * len(items))
        return [items[i] for i in order[held_out:]], [items[i] for i in order[:held_out]]

    sentences = list(range(n_pos + n_neg))
    train, test = train_test_split(sentences, test_size=0.1)
    train, val = train_test_split(train, test_size=0.2)
    return {"train": train, "val": val, "test": test}


def test_mr_split_is_the_papers(tmp_path: Path, monkeypatch) -> None:
    """Each line says which it is by its number of words (line g has g + 1), so the split can be read back from the
    tokens. Its words carry cp1252 bytes that UTF-8 cannot decode: the paper's reading drops them ("go\x85od" is
    one word, "good"), so the count holds only if the loader reads as the paper's code does."""
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    n_pos, n_neg = 37, 33
    folder = tmp_path / "MR" / "rt-polaritydata"
    folder.mkdir(parents=True)
    for kind, first, count, word in (("pos", 0, n_pos, b"go\x85od"), ("neg", n_pos, n_neg, b"b\xe9ad")):
        lines = [b" ".join([word] * (g + 1)) for g in range(first, first + count)]
        (folder / f"rt-polarity.{kind}").write_bytes(b"\n".join(lines) + b"\n")
    splits = MovieReview(tmp_path).load()
    expected = papers_mr_split(n_pos, n_neg)
    for name in ("train", "val", "test"):
        split = getattr(splits, name)
        line_ids = ((split.x != PAD).sum(dim=1) - 1).tolist()
        assert line_ids == expected[name], name
        np.testing.assert_array_equal(split.y, [1 if g < n_pos else 0 for g in expected[name]])
        assert (split.x[split.x != PAD] != UNKNOWN).all()  # "good" and "bad" are training words
    assert splits.notes and "70 sentences instead of the published 10,662" in splits.notes[0]


def test_mr_vocabulary_and_encoding(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    _write_mr(tmp_path, 100)
    splits = MovieReview(tmp_path).load()
    expected = papers_mr_split(100, 100)
    assert (len(splits.train), len(splits.val), len(splits.test)) == tuple(map(len, expected.values()))
    again = MovieReview(tmp_path).load()
    assert torch.equal(again.train.x, splits.train.x)  # deterministic split and vocabulary
    tokens = splits.train.x
    assert (tokens[:, 0] != PAD).all() and (tokens == UNKNOWN).sum() == 0  # training words are all known
    model = create("word_cnn", 2, **splits.model_args)
    assert model(splits.test.x).shape == (len(splits.test), 2)


def test_mr_vocabulary_from_training_split_only(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    _write_mr(tmp_path, 100)
    # Give the first test sentence a word of its own.
    folder = tmp_path / "MR" / "rt-polaritydata"
    first_test = papers_mr_split(100, 100)["test"][0]
    kind, line = ("pos", first_test) if first_test < 100 else ("neg", first_test - 100)
    lines = (folder / f"rt-polarity.{kind}").read_bytes().split(b"\n")
    lines[line] = b"zyzzyva " + lines[line]
    (folder / f"rt-polarity.{kind}").write_bytes(b"\n".join(lines))
    test_tokens = MovieReview(tmp_path).load().test.x
    assert test_tokens[0, 0] == UNKNOWN


@pytest.mark.realdata
def test_real_fashion_mnist(shared_data: Path) -> None:
    splits = get_dataset("fashion_mnist")(shared_data).load()
    assert (len(splits.train), len(splits.val), len(splits.test)) == (50_000, 10_000, 10_000)
    assert (splits.test.y == 0).mean() == pytest.approx(0.1)  # 1,000 test bags
    # The first 50k of 60k training images, 6,000 of them bags: the share sits within a few of its hypergeometric
    # sd sqrt(0.09 / 50000 x 10000 / 59999) = 5.5e-4 of 0.1; 0.01 is 18 of them.
    assert (splits.train.y == 0).mean() == pytest.approx(0.1, abs=0.01)


@pytest.mark.realdata
def test_real_mr(shared_data: Path) -> None:
    """The paper's split of the published files: its sizes, and the negatives in each split. A model that collapses
    to "negative" scores the test split's share of negatives, the paper's CE accuracy at r = 0.9 on MR."""
    splits = get_dataset("mr")(shared_data).load()
    assert (len(splits.train), len(splits.val), len(splits.test)) == (7_676, 1_919, 1_067)
    assert not splits.notes
    assert splits.model_args["vocab_size"] > 10_000
    negatives = [int((split.y == 0).sum()) for split in (splits.train, splits.val, splits.test)]
    assert negatives == [3_853, 921, 557]
    reference = next(Path(__file__).parents[2].glob("bench/**/reference_results.csv"))  # the paper's tables
    with open(reference) as f:
        paper = next(float(row["acc_mean"]) for row in csv.DictReader(f)
                     if (row["dataset"], row["noise_r"], row["method"]) == ("mr", "0.9", "ce"))
    assert round(100 * negatives[2] / len(splits.test), 2) == paper


def test_download_fetches_and_verifies_checksums(tiny_fashion: Path, tmp_path: Path, monkeypatch, published) -> None:
    """The download path, exercised without the network: a server on 127.0.0.1 serving files in the published format."""
    from bench.datasets.fashion_mnist import FashionMNIST
    from bench.download import file_md5

    raw, served = tiny_fashion / "FashionMNIST" / "raw", published
    files = {f"raw/{p.name}": file_md5(p) for p in sorted(raw.iterdir())}
    monkeypatch.setattr(FashionMNIST, "files", files)
    monkeypatch.setattr(FashionMNIST, "urls", {served(raw / Path(rel).name): rel for rel in files})
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "1")
    target = tmp_path / "fresh"
    FashionMNIST(target).download()
    assert len(FashionMNIST(target).load().test) == 60
    # A corrupted source is caught by the checksum and reported.
    bad = raw / "t10k-labels-idx1-ubyte.gz"
    bad.write_bytes(bad.read_bytes() + b"junk")
    with pytest.raises(UserError, match="arrived corrupt"):
        FashionMNIST(tmp_path / "other").download()
    assert not (tmp_path / "other" / "FashionMNIST" / "raw" / bad.name).exists()
