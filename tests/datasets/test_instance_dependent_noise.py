"""Instance-dependent noise (`idn`, Xia et al. 2020's generator): the truncated-normal flip rates against their
closed-form moments, the per-example distributions against a one-example-at-a-time restatement of the generator,
the dependence on the example, the two-class degeneration, the realised T a trial records, and the refusals."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from bench import noise
from bench.cli.main import main
from bench.config import UserError
from bench.data import get_dataset
from bench.exec.prepare import draw_labels, load_data, prepare
from bench.trial import TrialConfig
from tests.datasets.test_cifar100 import write_cifar100
from tests.datasets.test_fashion_mnist_and_mr import _write_mr


def _truncated_moments(mean: float, std: float) -> tuple[float, float]:
    """Mean and variance of N(mean, std^2) conditioned on [0, 1] (the textbook closed form)."""
    a, b = (0 - mean) / std, (1 - mean) / std
    pdf = lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cdf = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))  # noqa: E731
    z = cdf(b) - cdf(a)
    shift = (pdf(a) - pdf(b)) / z
    return mean + std * shift, std**2 * (1 + (a * pdf(a) - b * pdf(b)) / z - shift**2)


@pytest.mark.parametrize("r", [0.0, 0.2, 0.4, 0.95])
def test_flip_rates_are_the_truncated_normal(r: float) -> None:
    n = 200_000
    q = noise.truncated_normal(r, noise.IDN_STD, n, np.random.default_rng(1))
    assert len(q) == n and q.min() >= 0.0 and q.max() <= 1.0
    mean, var = _truncated_moments(r, noise.IDN_STD)
    # Five standard errors: the sample mean's is sqrt(var / n); the sample variance's sqrt((m4 - var^2) / n).
    assert abs(q.mean() - mean) < 5 * math.sqrt(var / n)
    m4 = float(np.mean((q - q.mean()) ** 4))
    assert abs(q.var() - var) < 5 * math.sqrt((m4 - var**2) / n)


def _one_at_a_time(parts, r: float, c: int, seed: int) -> list[np.ndarray]:
    """The generator restated example by example, as Xia et al.'s loop writes it: the same draws in the same order
    (every part's flip rates, then one F x C matrix per class), no chunks, no vectorised softmax."""
    rng = np.random.default_rng(seed)
    sizes = [len(y) for _, y in parts]
    rates = noise.truncated_normal(r, noise.IDN_STD, sum(sizes), rng)
    width = max(x.shape[1] for x, _ in parts)
    w = [rng.standard_normal((width, c)) for _ in range(c)]
    out, offset = [], 0
    for x, y in parts:
        p = np.zeros((len(y), c))
        for i in range(len(y)):
            features = np.zeros(width)
            features[: x.shape[1]] = x[i]
            scores = [float(np.dot(features, w[y[i]][:, k])) for k in range(c)]
            others = [k for k in range(c) if k != y[i]]
            top = max(scores[k] for k in others)
            weights = {k: math.exp(scores[k] - top) for k in others}
            total = sum(weights.values())
            q = rates[offset + i]
            for k in others:
                p[i, k] = q * weights[k] / total
            p[i, y[i]] = 1 - q
        out.append(p)
        offset += len(y)
    return out


def _parts(c: int, n_train: int = 300, n_val: int = 80, width: int = 7, seed: int = 0):
    rng = np.random.default_rng(seed)
    train = (rng.normal(size=(n_train, width)), rng.integers(0, c, n_train))
    val = (rng.normal(size=(n_val, width - 2)), rng.integers(0, c, n_val))  # narrower: its absent columns are zeros
    return [train, val]


def test_probabilities_match_the_example_by_example_generator() -> None:
    c, parts = 5, _parts(5)
    # A chunk of 3 rows (3 x 7 elements): many chunks per class, as a big dataset gets.
    probs, rates = noise.instance_dependent_probabilities(parts, 0.4, c, np.random.default_rng(9), chunk_elements=21)
    expected = _one_at_a_time(parts, 0.4, c, seed=9)
    for p, e in zip(probs, expected, strict=True):
        # Scores are sums of 7 products of O(1) numbers: a different summation order moves them by ~1e-15, and the
        # probabilities by as much relatively.
        np.testing.assert_allclose(p, e, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(1 - probs[0][np.arange(300), parts[0][1]], rates[0], rtol=0, atol=1e-15)


def test_the_flip_depends_on_the_example() -> None:
    """Two examples of one class get different flip rates and, with C >= 3, different classes to flip to; the same
    features in the same class give the same choice of class (the dependence is on the example's features)."""
    c = 6
    x, y = _parts(c)[0]
    x[1], y[1] = x[0], y[0]  # a duplicate of example 0
    probs, rates = noise.instance_dependent_probabilities([(x, y)], 0.4, c, np.random.default_rng(2))
    p = probs[0]
    same_class = np.flatnonzero(y == y[0])
    assert len(set(np.round(rates[0][same_class], 12))) == len(same_class)
    off = p.copy()
    off[np.arange(len(y)), y] = 0
    choice = off / off.sum(axis=1, keepdims=True)  # where an example goes when it flips
    np.testing.assert_allclose(choice[1], choice[0], rtol=1e-12)
    # Some other example of the class flips mostly elsewhere.
    assert max(np.abs(choice[i] - choice[0]).max() for i in same_class[2:]) > 0.5


def test_two_classes_flip_with_the_rate_alone() -> None:
    """With C = 2 the other class takes all of the flip rate, whatever the features: symmetric noise in law."""
    x, y = _parts(2)[0]
    probs, rates = noise.instance_dependent_probabilities([(x * 1e3, y)], 0.3, 2, np.random.default_rng(4))
    np.testing.assert_allclose(probs[0][np.arange(len(y)), 1 - y], rates[0], rtol=0, atol=1e-15)


def test_labels_are_seeded_and_their_realised_transition_recorded() -> None:
    c, (train, val) = 5, _parts(5, n_train=4000, n_val=1000)
    labels = noise.inject_instance_dependent("d", "idn", 0.4, 3, train, val, c)
    assert labels.transition is None
    np.testing.assert_array_equal(labels.empirical, noise.empirical_transition(train[1], labels.train, c))
    flipped = labels.train != train[1]
    assert labels.noise_rate == flipped.mean()
    # 4,000 flips of probability ~0.4: the realised rate's standard error is ~0.008, 0.03 is four of them.
    assert abs(labels.noise_rate - 0.4) < 0.03 and abs(labels.expected_rate - 0.4) < 0.01
    again = noise.inject_instance_dependent("d", "idn", 0.4, 3, train, val, c)
    np.testing.assert_array_equal(again.train, labels.train)
    np.testing.assert_array_equal(again.val, labels.val)
    assert noise.inject_instance_dependent("d", "idn", 0.4, 4, train, val, c).noise_hash != labels.noise_hash
    assert (labels.val != val[1]).mean() > 0.3  # validation is noisy too


def test_an_idn_trial_records_the_realised_transition(tmp_path: Path) -> None:
    results, out = tmp_path / "res", tmp_path / "labels.parquet"
    config = ["--dataset", "synthetic", "--noise", "idn", "--r", "0.4", "--seed", "5"]
    assert main(["trial", *config, "--method", "ce", "--epochs-warmup", "1", "--epochs", "0",
                 "--results", str(results)]) == 0
    row = pl.read_parquet(next((results / "trials").glob("*.parquet")))
    assert row["noise"][0] == "idn" and row["transition"][0] is None
    assert main(["labels", *config, "--out", str(out)]) == 0
    exported = pl.read_parquet(out).filter(pl.col("split") == "train").sort("index")
    realised = noise.empirical_transition(exported["clean"].to_numpy(), exported["noisy"].to_numpy(), 2)
    np.testing.assert_allclose(json.loads(row["empirical_transition"][0]), realised, atol=1e-6)
    assert row["noise_rate"][0] == pytest.approx(float((exported["clean"] != exported["noisy"]).mean()))


def test_methods_that_need_the_true_transition_refuse_idn(capsys) -> None:
    with pytest.raises(UserError, match="'idn' noise has none"):
        TrialConfig(dataset="synthetic", method="fw_oracle", noise="idn", r=0.4, seed=0).check()
    TrialConfig(dataset="synthetic", method="fw", noise="idn", r=0.4, seed=0).check()  # estimates T: runs
    assert main(["trial", "--dataset", "synthetic", "--method", "fw_oracle", "--noise", "idn", "--r", "0.4"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_clothing1m_offers_no_instance_dependent_noise() -> None:
    clothing = get_dataset("clothing1m")
    assert "idn" not in clothing.accepted_noise() and "idn" in get_dataset("mr").accepted_noise()
    # Its clean training labels are mostly unknown: no synthetic noise at all, instance-dependent or not.
    refusal = r"^clothing1m has no clean training labels .* to draw synthetic noise 'idn' from; .*choose from real$"
    config = TrialConfig(dataset="clothing1m", method="ce", noise="idn", r=0.4, seed=0)
    with pytest.raises(UserError, match=refusal):
        config.check()  # a grid's check
    with pytest.raises(UserError, match=refusal):
        prepare(config, "unused")  # a trial's own


def test_mr_projects_each_sentences_bag_of_words(tmp_path: Path) -> None:
    _write_mr(tmp_path, 60)
    dataset = get_dataset("mr")(tmp_path, verify=False)
    splits = dataset.load()
    for split in (splits.train, splits.val):
        tokens = split.x.numpy()
        counts = dataset.noise_features(split)
        assert counts.shape[0] == len(tokens)
        for row, sentence in zip(counts, tokens, strict=True):
            expected = Counter(int(t) for t in sentence if t != 0)  # 0 pads
            assert {int(k): int(row[k]) for k in np.flatnonzero(row)} == dict(expected)


def test_real_fashion_mnist_idn_trial_twice(shared_data: Path, tmp_path: Path) -> None:
    """The issue's check: `bench trial --noise idn --r 0.4` on Fashion-MNIST realises a rate within 0.03 of 0.4
    (50,000 flips: a standard error of 0.002) and draws the same labels twice."""
    rows = []
    for run in ("a", "b"):
        assert main(["trial", "--dataset", "fashion_mnist", "--method", "ce", "--noise", "idn", "--r", "0.4",
                     "--epochs-warmup", "0", "--epochs", "0", "--train-subset", "256", "--data-root",
                     str(shared_data), "--results", str(tmp_path / run)]) == 0
        rows.append(pl.read_parquet(next((tmp_path / run / "trials").glob("*.parquet"))))
    assert abs(rows[0]["noise_rate"][0] - 0.4) < 0.03
    assert rows[0]["noise_hash"][0] == rows[1]["noise_hash"][0]


def test_cifar100_idn_projects_the_pixel_bytes(tmp_path: Path) -> None:
    """On CIFAR-100 the features are the published pixel bytes, row for row (Xia et al. project the raw pixels), and
    an idn draw records a 100 x 100 realised T."""
    written = write_cifar100(tmp_path)
    dataset = get_dataset("cifar100")(tmp_path, verify=False)
    splits = dataset.load()
    n_train = len(splits.train)
    np.testing.assert_array_equal(dataset.noise_features(splits.train), written["train"]["data"][:n_train])
    np.testing.assert_array_equal(dataset.noise_features(splits.val), written["train"]["data"][n_train:])
    config = TrialConfig(dataset="cifar100", method="ce", noise="idn", r=0.4, seed=0)
    labels = draw_labels(config, dataset, splits)
    assert labels.transition is None and labels.empirical.shape == (100, 100)
    np.testing.assert_array_equal(labels.empirical, noise.empirical_transition(splits.train.y, labels.train, 100))


def test_a_label_cell_is_drawn_once_per_loaded_data(monkeypatch) -> None:
    """A pack's members that share (noise, r, seed) share one idn draw (it projects every input), yet each gets its
    own arrays: loaders on the CPU share their labels' memory, so one member's labels must not be another's."""
    calls = []
    inject = noise.inject_instance_dependent
    monkeypatch.setattr(noise, "inject_instance_dependent", lambda *a: calls.append(a[3]) or inject(*a))
    configs = [TrialConfig(dataset="synthetic", method=m, noise="idn", r=0.4, seed=s)
               for m, s in (("ce", 0), ("dmi", 0), ("ce", 1))]
    data = load_data(configs[0], "unused")
    first, second, other = (prepare(c, "unused", data=data, log=lambda _: None) for c in configs)
    assert calls == [0, 1]
    np.testing.assert_array_equal(first.labels.train, second.labels.train)
    assert first.labels.noise_hash == second.labels.noise_hash != other.labels.noise_hash
    assert not np.shares_memory(first.labels.train, second.labels.train)
    assert not np.shares_memory(first.labels.val, second.labels.val)


def test_the_generator_refuses_what_it_cannot_draw() -> None:
    """A mean outside [0, 1] would make the rejection sampler loop for ever; a label outside [0, C) would get a row
    of zeros, which the inverse CDF turns into class C - 1 without a word."""
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="mean must lie in"):
        noise.truncated_normal(1.5, noise.IDN_STD, 4, rng)
    x = rng.random((4, 3))
    for bad in (np.array([0, 1, 2, -1]), np.array([0, 1, 2, 3])):
        with pytest.raises(UserError, match=r"labels lie outside \[0, 3\)"):
            noise.instance_dependent_probabilities([(x, bad)], 0.4, 3, rng)
