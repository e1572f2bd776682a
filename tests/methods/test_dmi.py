"""L_DMI: the loss against an independent computation and the paper's properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.dmi import DMI_EPS, dmi_loss, neg_log_abs_det


def numpy_dmi(logits: np.ndarray, labels: np.ndarray, c: int) -> float:
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    onehot = np.eye(c)[labels]
    u = p.T @ onehot / len(labels)
    return -np.log(abs(np.linalg.det(u)))


@pytest.mark.parametrize("c", [2, 3, 10])
def test_matches_independent_numpy(c: int) -> None:
    rng = np.random.default_rng(c)
    logits = rng.normal(size=(512, c)) * 2
    labels = np.concatenate([np.arange(c), rng.integers(0, c, 512 - c)])
    ours = float(dmi_loss(torch.tensor(logits, dtype=torch.float32), torch.tensor(labels), c))
    expected = numpy_dmi(logits.astype(np.float32).astype(np.float64), labels, c)
    # Both in float64 from the same float32 logits: U's sums of 512 terms are within 512 U64 = 6e-14 relative,
    # and -log|det U| moves by that times C cond(U) (< 1e3 here): far inside 1e-9.
    assert ours == pytest.approx(expected, rel=1e-9, abs=1e-9)


def random_joint(rng: np.random.Generator, c: int) -> np.ndarray:
    q = rng.random((c, c)) + np.eye(c) * c
    return q / q.sum()


def random_transition(rng: np.random.Generator, c: int) -> np.ndarray:
    t = rng.random((c, c)) + np.eye(c) * 2
    return t / t.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("c", [2, 4, 10])
def test_relative_invariance_on_exact_joints(c: int) -> None:
    """Theorem 4.1: -log|det(Q T)| = -log|det Q| - log|det T| (noise only shifts the loss by a constant)."""
    rng = np.random.default_rng(100 + c)
    for _ in range(5):
        q, t = random_joint(rng, c), random_transition(rng, c)
        lhs = float(neg_log_abs_det(torch.tensor(q @ t)))
        rhs = float(neg_log_abs_det(torch.tensor(q))) - np.log(abs(np.linalg.det(t)))
        assert lhs == pytest.approx(rhs, abs=1e-9)


def shannon_mi(q: np.ndarray) -> float:
    px, py = q.sum(axis=1, keepdims=True), q.sum(axis=0, keepdims=True)
    nz = q > 0
    return float((q[nz] * np.log(q[nz] / (px @ py)[nz])).sum())


def test_appendix_b_counterexample() -> None:
    """Shannon MI ranks h and h' differently on clean and noisy labels; DMI ranks them the same."""
    q_h = np.array([[0.1, 0.4], [0.2, 0.3]])
    q_h2 = np.array([[0.2, 0.6], [0.1, 0.1]])
    t = np.array([[0.8, 0.2], [0.4, 0.6]])
    noisy_h, noisy_h2 = q_h @ t, q_h2 @ t
    np.testing.assert_allclose(noisy_h, [[0.24, 0.26], [0.28, 0.22]])
    np.testing.assert_allclose(noisy_h2, [[0.40, 0.40], [0.12, 0.08]])
    # The paper's values (natural logarithm), printed to 5 significant digits and truncated (3.2085e-3 for
    # 3.20858e-3): within one unit of the last digit.
    assert shannon_mi(q_h) == pytest.approx(2.4157e-2, abs=1e-6)
    assert shannon_mi(q_h2) == pytest.approx(2.2367e-2, abs=1e-6)
    assert shannon_mi(noisy_h) == pytest.approx(3.2085e-3, abs=1e-7)
    assert shannon_mi(noisy_h2) == pytest.approx(3.2268e-3, abs=1e-7)
    assert (shannon_mi(q_h) > shannon_mi(q_h2)) != (shannon_mi(noisy_h) > shannon_mi(noisy_h2))

    def loss(q: np.ndarray) -> float:
        return float(neg_log_abs_det(torch.tensor(q)))

    assert (loss(q_h) < loss(q_h2)) == (loss(noisy_h) < loss(noisy_h2))
    assert loss(noisy_h) - loss(q_h) == pytest.approx(-np.log(abs(np.linalg.det(t))), abs=1e-12)


def test_missing_class_gives_finite_loss_and_reduced_gradient() -> None:
    c = 3
    rng = np.random.default_rng(7)
    logits = torch.tensor(rng.normal(size=(64, c)), requires_grad=True)
    labels = torch.tensor(rng.integers(0, 2, 64))  # class 2 never appears
    loss = dmi_loss(logits, labels, c)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    # The guarded loss is the reduced problem's (rows 0, 1; columns 0, 1 of U), shifted by -log eps;
    # up to the tiny U[0:2, 2] coupling that the eigenvector argument says is exactly zero here.
    p = torch.softmax(logits.detach(), dim=1)
    u = p.T @ torch.nn.functional.one_hot(labels, c).double() / 64
    reduced = -torch.log(torch.det(u[:2, :2]).abs())
    assert float(loss.detach()) == pytest.approx(float(reduced) - np.log(DMI_EPS / c), rel=1e-9)


def test_invariant_to_permuting_predicted_classes() -> None:
    """|det| ignores a relabelling of the predictions: DMI alone cannot tell which class is which."""
    rng = np.random.default_rng(3)
    logits = torch.tensor(rng.normal(size=(256, 4)))
    labels = torch.tensor(rng.integers(0, 4, 256))
    perm = torch.tensor([2, 0, 3, 1])
    assert float(dmi_loss(logits[:, perm], labels, 4)) == pytest.approx(float(dmi_loss(logits, labels, 4)), abs=1e-10)


def _train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn, steps: int, lr: float) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()


def test_ce_warm_start_fixes_the_class_permutation() -> None:
    """Gradient steps on -log|det U| never cross det U = 0, so the warm start's labelling survives: DMI from a CE
    warm start on the labels ends right; from a warm start on swapped labels it ends exactly swapped, at an
    equally low DMI loss."""
    torch.manual_seed(0)
    n = 2000
    y = (torch.rand(n) < 0.5).long()
    x = torch.randn(n, 2) + torch.stack([y * 3.0, y * 0.0], dim=1)
    noisy = torch.where(torch.rand(n) < 0.2, 1 - y, y)
    results = {}
    for name, warm_labels in (("right", noisy), ("swapped", 1 - noisy)):
        torch.manual_seed(1)
        model = torch.nn.Linear(2, 2)
        _train(model, x, warm_labels, torch.nn.functional.cross_entropy, 100, 0.05)
        _train(model, x, noisy, lambda lo, la: dmi_loss(lo, la, 2), 200, 0.05)
        with torch.no_grad():
            acc = float((model(x).argmax(1) == y).float().mean())
            results[name] = (acc, float(dmi_loss(model(x), noisy, 2)))
    assert results["right"][0] > 0.9
    assert results["swapped"][0] < 0.1
    # Not a rounding bound: two trainings from different warm starts, whose DMI losses both end near the same
    # minimum (|det| is blind to the swap); 0.05 of a loss near 0.7 tells "equally low" from a stuck run.
    assert results["right"][1] == pytest.approx(results["swapped"][1], abs=0.05)
