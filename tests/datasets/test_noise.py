"""Label noise: the paper's matrices, validation, seeded sampling, and what the trainer does with it."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from bench import noise
from bench.config import UserError
from bench.data import registry
from bench.exec.prepare import prepare
from bench.trial import TrialConfig


def test_paper_matrices() -> None:
    """Each dataset declares its own patterns; the generic ones are the same for every dataset."""
    r = 0.3
    fashion, mr, cifar10, dogs = (registry()[name] for name in ("fashion_mnist", "mr", "cifar10", "dogs_vs_cats"))
    np.testing.assert_allclose(fashion.transition("case1", r), [[0.85, 0.15], [0.15, 0.85]])
    np.testing.assert_allclose(fashion.transition("case2", r), [[0.7, 0.3], [0.0, 1.0]])
    np.testing.assert_allclose(fashion.transition("case3", r), [[1.0, 0.0], [0.3, 0.7]])
    np.testing.assert_allclose(mr.transition("pos_to_neg", r), [[1.0, 0.0], [0.3, 0.7]])
    np.testing.assert_allclose(dogs.transition("cat_to_dog", r), [[1.0, 0.0], [0.3, 0.7]])  # class 0 = dog
    t = cifar10.transition("pairs", r)
    # Appendix C: truck->automobile, bird->airplane, deer->horse, cat->dog.
    for true, noisy in ((9, 1), (2, 0), (4, 7), (3, 5)):
        assert t[true, noisy] == pytest.approx(r) and t[true, true] == pytest.approx(1 - r)
    for unchanged in (0, 1, 5, 6, 7, 8):
        assert t[unchanged, unchanged] == 1.0
    u = noise.transition_matrix("uniform", r, 4)
    np.testing.assert_allclose(u, (1 - r) * np.eye(4) + r / 4)
    np.testing.assert_allclose(cifar10.transition("uniform", r), (1 - r) * np.eye(10) + r / 10)
    s = noise.transition_matrix("symmetric", r, 5)
    assert np.allclose(np.diag(s), 1 - r) and np.allclose(s[~np.eye(5, dtype=bool)], r / 4)


@pytest.mark.parametrize(
    "matrix, message",
    [
        ([[0.5, 0.5, 0.0]], "square"),
        ([[0.9, 0.2], [0.0, 1.0]], "row-stochastic"),
        ([[1.2, -0.2], [0.0, 1.0]], "non-negative"),
        ([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], "2 classes"),
    ],
)
def test_bad_transition_rejected(matrix: list, message: str) -> None:
    with pytest.raises(UserError, match=message):
        noise.validate_transition(np.array(matrix), 2)


def test_singular_transition_warns() -> None:
    with pytest.warns(UserWarning, match="det T = 0"):
        registry()["fashion_mnist"].transition("case3", 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registry()["fashion_mnist"].transition("case3", 0.7)  # non-dominant but invertible: no warning
        # Invertible with 100 classes although det T = 0.7^99 ~ 5e-16: singularity is not a small determinant.
        noise.validate_transition(noise.uniform(0.3, 100), 100)
    with pytest.warns(UserWarning, match="det T = 0"):
        noise.validate_transition(noise.symmetric(0.99, 100), 100)  # every row 1/100: rank 1


def test_r_outside_unit_interval_and_unknown_pattern() -> None:
    synthetic = registry()["synthetic"]
    with pytest.raises(UserError, match=r"\[0, 1\]"):
        synthetic.transition("case1", 1.5)
    with pytest.raises(UserError, match="unknown noise pattern"):
        synthetic.transition("nonsense", 0.1)
    with pytest.raises(UserError, match="unknown noise pattern 'pairs'"):  # CIFAR-10's pattern, not this dataset's
        synthetic.transition("pairs", 0.1)


def test_empirical_transition_converges_within_hoeffding_bound() -> None:
    """Each entry of the empirical T is a mean of n_i Bernoullis: |T^ - T| <= sqrt(log(2 K / delta) / (2 n_i))
    for all K entries at once with probability 1 - delta (Hoeffding plus a union bound); delta = 1e-6."""
    rng = np.random.default_rng(0)
    c = 4
    t = np.array([[0.6, 0.2, 0.1, 0.1], [0.0, 1.0, 0.0, 0.0], [0.3, 0.3, 0.4, 0.0], [0.05, 0.05, 0.1, 0.8]])
    clean = rng.integers(0, c, 200_000)
    noisy = noise.sample_noisy_labels(clean, t, noise.noise_generator("test", "transition", 0.0, 0))
    empirical = noise.empirical_transition(clean, noisy, c)
    counts = np.bincount(clean, minlength=c)[:, None]
    bound = np.sqrt(math.log(2 * c * c / 1e-6) / (2 * counts))
    assert (np.abs(empirical - t) <= bound).all()
    assert (noisy[clean == 1] == 1).all()  # a zero probability is never drawn
    # ... and the bound is tight enough to catch a wrong sampler: sampling from T^T fails it.
    wrong = noise.sample_noisy_labels(clean, t.T / t.T.sum(1, keepdims=True), np.random.default_rng(1))
    assert not (np.abs(noise.empirical_transition(clean, wrong, c) - t) <= bound).all()


def _config(**kw) -> TrialConfig:
    base = dict(dataset="synthetic", method="ce", noise="case3", r=0.4, seed=3, epochs=1, epochs_warmup=1)
    return TrialConfig(**{**base, **kw})


def test_same_cell_same_noisy_labels_for_every_method_and_hyperparameter() -> None:
    a = prepare(_config(method="ce"), "unused")
    b = prepare(_config(method="dmi", lr=1e-5, batch_size=256), "unused")
    np.testing.assert_array_equal(a.labels.train, b.labels.train)
    np.testing.assert_array_equal(a.labels.val, b.labels.val)
    assert a.labels.noise_hash == b.labels.noise_hash
    c = prepare(_config(seed=4), "unused")
    assert c.labels.noise_hash != a.labels.noise_hash
    assert 0.2 < a.labels.noise_rate < 0.45  # case3 flips majority-class labels with prob 0.4


def test_test_split_never_touched() -> None:
    p = prepare(_config(r=0.9), "unused")
    np.testing.assert_array_equal(p.test.labels.cpu().numpy(), p.splits.test.y)
    assert (p.labels.train != p.splits.train.y).mean() > 0.5
    assert (p.labels.val != p.splits.val.y).mean() > 0.5


def test_transition_files(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("# rows = true class\n0.9,0.1\n0.2,0.8\n")
    js = tmp_path / "t.json"
    js.write_text(json.dumps([[0.9, 0.1], [0.2, 0.8]]))
    np.testing.assert_allclose(noise.read_transition_file(csv), noise.read_transition_file(js))
    bad = tmp_path / "bad.csv"
    bad.write_text("0.9,x\n")
    with pytest.raises(UserError, match="not a matrix"):
        noise.read_transition_file(bad)
    p = prepare(_config(noise="transition", transition=((0.9, 0.1), (0.2, 0.8))), "unused")
    np.testing.assert_allclose(p.labels.transition, [[0.9, 0.1], [0.2, 0.8]])
