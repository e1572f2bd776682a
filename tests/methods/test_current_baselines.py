"""The methods of issue 13 (the field's current baselines): each against its paper's defining property or an
independent computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.baselines.backward import Backward, backward_nll
from bench.baselines.coteaching_plus import CoTeachingPlus
from bench.baselines.elr import EarlyLearningRegularization, elr_regulariser
from bench.baselines.fdiv import FDivergence
from bench.baselines.fw import Forward
from bench.baselines.gls import GeneralizedLabelSmoothing, gls_targets
from bench.baselines.jocor import JoCoR
from bench.methods import Batch
from tests.methods.conftest import log_softmax_error, numpy_softmax, random_problem, stage_context
from tests.tolerances import f32, within

T3 = np.array([[0.8, 0.15, 0.05], [0.1, 0.7, 0.2], [0.3, 0.0, 0.7]])


# --- backward correction -----------------------------------------------------------------------------------

def test_backward_with_identity_is_ce_and_works_over_leading_dims() -> None:
    logits, labels, p = random_problem()
    ce = -np.log(p[np.arange(len(p)), labels.numpy()]).mean()
    error = log_softmax_error(logits)  # per example; the mean over 256 adds f32(256)
    assert within(float(backward_nll(logits, labels, torch.eye(4))), ce, rel=f32(256), atol=error)
    stacked = backward_nll(torch.stack([logits, 2 * logits]), torch.stack([labels, labels]), torch.eye(4))
    assert stacked.shape == (2,) and within(float(stacked[0]), ce, rel=f32(256), atol=error)


def test_backward_is_unbiased_for_the_clean_loss() -> None:
    """Patrini's Thm. 1: sum_j T[y, j] l_back(h(x), j) = -log p_y for every x and clean y."""
    logits, _, p = random_problem(n=50, c=3, seed=1)
    per_label = np.stack([
        float(backward_nll(logits[i : i + 1], torch.tensor([j]), torch.tensor(T3)))
        for i in range(50) for j in range(3)
    ]).reshape(50, 3)
    expected = per_label @ T3.T  # [i, y] = sum_j T[y, j] l_back(x_i, j)
    # l_back(x, j) = sum_k T^-1[j, k] (-log p_k): the log-softmax's rounding times ||T^-1||, and T's float32
    # inverse, off by cond(T) f32(3, 3) of it, times the largest -log p_k.
    inverse = np.abs(np.linalg.inv(T3)).sum(axis=1).max()
    bound = inverse * (log_softmax_error(logits) + np.linalg.cond(T3, np.inf) * f32(3, 3) * -np.log(p).max())
    assert within(expected, -np.log(p), atol=bound)


def test_backward_estimates_t_like_fw() -> None:
    rng = np.random.default_rng(3)
    clean = rng.dirichlet(np.ones(3), size=900)
    # Anchors, each with its own tiny share of another class: Patrini's filter drops every value tied at its
    # threshold, so exact one-hot anchors (all tied) would leave none.
    share = rng.permutation(300)[:, None] * 1e-10
    clean[:300] = (1 - share) * np.eye(3)[np.arange(300) % 3] + share * np.eye(3)[(np.arange(300) + 1) % 3]
    probs = torch.tensor(clean @ T3, dtype=torch.float64)
    labels = torch.zeros(900, dtype=torch.int64)
    fw, bw = Forward(3, quantile=0.97), Backward(3)
    fw.setup(stage_context(labels, probs))
    bw.setup(stage_context(labels, probs))
    # An anchor's float32 posterior clean @ T3: 3 products and a sum per entry, f32(3, 2).
    assert bw.estimated_transition() == pytest.approx(T3, abs=f32(3, 2))
    assert np.array_equal(bw.estimated_transition(), fw.estimated_transition())  # one estimator, one input


# --- GLS ---------------------------------------------------------------------------------------------------

def test_gls_rate_zero_is_ce_and_matches_the_smoothed_target() -> None:
    logits, labels, p = random_problem(seed=2)
    ce = -np.log(p[np.arange(len(p)), labels.numpy()])
    error = log_softmax_error(logits)
    assert within(float(GeneralizedLabelSmoothing(4, smooth_rate=0.0).loss(logits, labels)), ce.mean(),
                  rel=f32(256), atol=error)
    for r in (0.4, -0.6):
        smooth = -np.log(p).mean(axis=1)
        expected = ((1 - r) * ce + r * smooth).mean()
        # Weights |1 - r| + |r| on log-softmax entries; the terms cancel for r < 0, so the mean's f32(256 + 4)
        # counts their magnitudes.
        bound = (abs(1 - r) + abs(r)) * error + f32(260) * (abs(1 - r) * ce.mean() + abs(r) * smooth.mean())
        assert within(float(GeneralizedLabelSmoothing(4, smooth_rate=r).loss(logits, labels)), expected,
                      atol=bound)


def test_gls_negative_rate_leaves_the_simplex() -> None:
    t = gls_targets(torch.tensor([0, 2]), 4, -0.4).numpy()
    assert t.sum(axis=1) == pytest.approx([1.0, 1.0])
    assert t[0, 0] == pytest.approx(1.4 - 0.1) and t[0, 0] > 1 and (np.delete(t[0], 0) < 0).all()
    positive = gls_targets(torch.tensor([0]), 4, 0.4).numpy()
    assert ((positive >= 0) & (positive <= 1)).all()


# --- f-divergence ------------------------------------------------------------------------------------------

def test_fdiv_tv_scores_a_constant_classifier_zero_and_a_perfect_one_better() -> None:
    rng = np.random.default_rng(4)
    labels = torch.tensor(rng.integers(0, 3, 300))
    method = FDivergence(3)
    constant = torch.tensor([[0.3, -1.0, 2.0]]).repeat(300, 1)
    # A difference of two float32 means of 300 terms (times a 3-class prior) below 1/2 in size: f32(303, 6) apart.
    bound = f32(303, 6)
    assert float(method.loss(constant, labels)) == pytest.approx(0.0, abs=bound)
    perfect = 50.0 * F.one_hot(labels, 3).float()
    prior = np.bincount(labels.numpy(), minlength=3) / 300
    # p_k(x) is 1 on x's label, 0 elsewhere, and tanh(0) = 0: D_f = tanh(1)/2 - sum_k P(k) P(k) tanh(1)/2.
    expected = -(0.5 * np.tanh(1.0) - (prior * prior).sum() * 0.5 * np.tanh(1.0))
    assert float(method.loss(perfect, labels)) == pytest.approx(expected, abs=bound)
    assert float(method.loss(perfect, labels)) < 0


def test_fdiv_training_estimate_is_unbiased_for_the_selection_criterion() -> None:
    """The peer-batch estimate (random input and label permutations) averages to the exact expectation."""
    torch.manual_seed(0)
    net = nn.Linear(5, 3)
    x, y = torch.randn(64, 5), torch.randint(0, 3, (64,))
    for divergence in ("total_variation", "pearson", "jensen_shannon"):
        method = FDivergence(3, divergence=divergence)
        with torch.no_grad():
            draws = [float(method.train_loss([net], Batch(x=x, y=y, index=torch.arange(64), epoch=0)))
                     for _ in range(3000)]
            exact = float(method.loss(net(x), y))
        # 4 standard errors of the mean of 3000 draws, plus the float32 rounding of each (a difference of two
        # means of 64 terms below 1 in size: f32(64, 8)), which is all there is where the draws barely vary.
        assert np.mean(draws) == pytest.approx(exact, abs=4 * np.std(draws) / np.sqrt(3000) + f32(64, 8))


# --- ELR ---------------------------------------------------------------------------------------------------

def test_elr_regulariser_gradient_pushes_p_toward_the_target() -> None:
    """Descending log(1 - <p, t>) raises <p, t> for every example (their Lemma 4.3); the CE part is separate."""
    logits, _, _ = random_problem(n=64, c=4, seed=5)
    targets = torch.softmax(torch.randn(64, 4) * 3, dim=1)
    logits = logits.clone().requires_grad_(True)
    elr_regulariser(logits, targets).sum().backward()
    with torch.no_grad():
        before = (torch.softmax(logits, dim=1) * targets).sum(dim=1)
        after = (torch.softmax(logits - 1e-2 * logits.grad, dim=1) * targets).sum(dim=1)
    assert torch.all(after > before)


def test_elr_targets_are_a_temporal_ensemble() -> None:
    torch.manual_seed(0)
    net = nn.Linear(5, 3)
    x, y = torch.randn(40, 5), torch.randint(0, 3, (40,))
    warm = torch.softmax(net(x), dim=1).detach()
    method = EarlyLearningRegularization(3)
    method.setup(stage_context(y, warm, nets=[net]))
    idx = torch.arange(0, 40, 2)
    with torch.no_grad():
        net.weight.add_(0.5)  # the prediction moves away from the warm start
    loss = method.train_loss([net], Batch(x=x[idx], y=y[idx], index=idx, epoch=0))
    p = torch.softmax(net(x[idx]), dim=1).clamp(1e-4, 1 - 1e-4)
    p = p / p.sum(1, keepdim=True)
    warm_c = warm.clamp(1e-4, 1 - 1e-4)
    warm_c = warm_c / warm_c.sum(1, keepdim=True)
    expected_t = 0.7 * warm_c[idx] + 0.3 * p
    # Entries below 1 from a softmax, a clamp, a 3-term normalisation and a blend, in float32 on both sides: each
    # side within f32(3, 8) of the exact value.
    assert within(method.targets[idx].numpy(), expected_t.detach().numpy(), atol=2 * f32(3, 8))
    assert within(method.targets[1::2].numpy(), warm_c[1::2].numpy(), atol=2 * f32(3, 8))  # untouched
    agreement = (p * expected_t).sum(1).detach()
    expected = F.cross_entropy(net(x[idx]), y[idx]) + 3.0 * torch.log(1 - agreement).mean()
    # CE: the log-softmax's rounding; the regulariser: log(1 - <p, t>) turns <p, t>'s absolute rounding f32(3, 8)
    # into that over 1 - <p, t>; both sides carry it, and the means over 20 add f32(20) of the magnitudes.
    logits_now = net(x[idx]).detach()
    bound = 2 * (log_softmax_error(logits_now) + 3 * f32(3, 8) / float((1 - agreement).min())) + f32(20) * (
        float(F.cross_entropy(logits_now, y[idx])) + 3 * float(torch.log(1 - agreement).abs().mean()))
    assert within(loss.item(), expected.item(), atol=bound)


# --- Co-teaching+ and JoCoR --------------------------------------------------------------------------------

def test_coteaching_plus_only_exchanges_disagreeing_examples() -> None:
    torch.manual_seed(1)
    f, g = nn.Linear(4, 2), nn.Linear(4, 2)
    x = torch.randn(64, 4, requires_grad=True)
    y = torch.randint(0, 2, (64,))
    method = CoTeachingPlus(2, forget_rate=0.5, num_gradual=1)
    loss = method.train_loss([f, g], Batch(x=x, y=y, index=torch.arange(64), epoch=3))
    loss.backward()
    with torch.no_grad():
        lf, lg = F.cross_entropy(f(x), y, reduction="none"), F.cross_entropy(g(x), y, reduction="none")
        disagree = (f(x).argmax(1) != g(x).argmax(1)).numpy()
    assert 0 < disagree.sum() < 64
    touched = (x.grad.abs().sum(dim=1) > 0).numpy()
    assert not touched[~disagree].any()  # agreed examples take no part
    d = np.flatnonzero(disagree)
    k = int(0.5 * len(d))
    pick_f = d[np.argsort(lf.numpy()[d])[:k]]
    pick_g = d[np.argsort(lg.numpy()[d])[:k]]
    expected = lf.numpy()[pick_g].mean() + lg.numpy()[pick_f].mean()
    # The same float32 losses, summed in another order: two means of at most 32 positive terms.
    assert loss.item() == pytest.approx(expected, rel=2 * f32(32, 1))
    assert set(np.flatnonzero(touched)) == set(pick_f) | set(pick_g)


def test_coteaching_plus_trains_neither_net_when_they_agree() -> None:
    """Their code after its first 5000 steps: a batch without disagreement gives loss 0 and no gradient."""
    f = nn.Linear(4, 2)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    loss = CoTeachingPlus(2, forget_rate=0.2).train_loss([f, f], Batch(x=x, y=y, index=torch.arange(16), epoch=5))
    loss.backward()
    assert loss.item() == 0.0 and float(f.weight.grad.abs().sum()) == 0.0


def test_jocor_loss_is_symmetric_and_the_weighted_ce_kl_sum() -> None:
    torch.manual_seed(2)
    f, g = nn.Linear(4, 3), nn.Linear(4, 3)
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    method = JoCoR(3, forget_rate=0.4, num_gradual=3)
    batch = Batch(x=x, y=y, index=torch.arange(50), epoch=0)  # keep rate 1 - 0.4 * 1/2 = 0.8 (their linspace)
    loss = method.train_loss([f, g], batch).item()
    # The swapped call adds the same per-example terms in another order: a mean of 40 positive terms, 2 f32(40, 1).
    assert loss == pytest.approx(method.train_loss([g, f], batch).item(), rel=2 * f32(40, 1))
    with torch.no_grad():
        p1, p2 = numpy_softmax(f(x).double().numpy()), numpy_softmax(g(x).double().numpy())
        error = log_softmax_error(torch.cat([f(x), g(x)]))
    lab = y.numpy()
    ce = -np.log(p1[np.arange(50), lab]) - np.log(p2[np.arange(50), lab])
    kl = (p1 * np.log(p1 / p2)).sum(1) + (p2 * np.log(p2 / p1)).sum(1)
    joint = 0.1 * ce + 0.9 * kl
    # Per example 0.1 x 2 log-softmax roundings and 0.9 x 2 KLs of 3 terms, each term p (log p - log q) with two
    # of them: 0.2 + 0.9 x 2 x 3 x 2 < 11 roundings; the mean of 40 adds f32(40).
    assert within(loss, np.sort(joint)[:40].mean(), rel=f32(40), atol=11 * error)


# --- VolMinNet, T-revision, SOP (parameters of their own) --------------------------------------------------

def scattered_problem(t: np.ndarray, n: int = 4000, seed: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of clean posteriors spread over the simplex, and noisy labels drawn through T from them."""
    rng = np.random.default_rng(seed)
    c = t.shape[0]
    clean = rng.dirichlet(np.ones(c) * 0.5, size=n).clip(1e-6)
    noisy_posterior = clean @ t
    labels = (noisy_posterior.cumsum(1) > rng.random((n, 1))).argmax(1)
    return torch.tensor(np.log(clean), dtype=torch.float32), torch.tensor(labels)


def test_volminnet_t_stays_row_stochastic_and_is_learned_from_the_noisy_labels() -> None:
    from bench.baselines.volminnet import VolMinNet
    logits, labels = scattered_problem(T3, n=2000)
    method = VolMinNet(3, lr_t=1.0)
    method.setup(stage_context(labels, torch.softmax(logits, 1)))
    start = method.estimated_transition()
    assert start.sum(axis=1) == pytest.approx(np.ones(3))
    assert np.all(np.diag(start) > start[~np.eye(3, dtype=bool)].reshape(3, 2).max(axis=1))
    for _ in range(200):  # the classifier is fixed at the true clean posterior: only T learns
        method.loss(logits, labels).backward()
        method.end_epoch(0)  # applies the pending gradient of T
    est = method.estimated_transition()
    assert est.sum(axis=1) == pytest.approx(np.ones(3)) and (est >= 0).all()
    assert np.abs(est - T3).sum() / np.abs(T3).sum() < 0.1
    assert np.abs(est - T3).sum() < 0.3 * np.abs(start - T3).sum()


def test_volminnet_volume_penalty_shrinks_the_determinant() -> None:
    from bench.baselines.volminnet import VolMinNet
    method = VolMinNet(3, lambda_=1.0, lr_t=0.1)
    method.setup(stage_context(torch.zeros(4, dtype=torch.int64), torch.full((4, 3), 1 / 3)))
    dets = []
    for _ in range(50):
        t = method.transition()
        dets.append(float(torch.linalg.det(t.detach())))
        torch.linalg.slogdet(t)[1].backward()
        method.end_epoch(0)
    # Non-increasing up to the rounding of a float32 3 x 3 determinant (6 products of 3 factors: f32(6, 2)).
    assert dets[-1] < 0.8 * dets[0] and all(b <= a * (1 + f32(6, 2)) for a, b in zip(dets, dets[1:], strict=False))
    assert method.estimated_transition().sum(axis=1) == pytest.approx(np.ones(3))


def test_trevision_weights_make_the_noisy_risk_the_clean_risk() -> None:
    """With the true T, sum_j (p T)_j beta_j CE_j = sum_j p_j CE_j: the reweighted loss, in expectation over the
    noisy label, is the clean loss (their Eq. 5). With T = I it is CE."""
    from bench.baselines.trevision import TRevision, reweighted_ce
    logits, labels, p = random_problem(n=30, c=3, seed=7)
    ce = -np.log(p[np.arange(30), labels.numpy()]).mean()
    error = log_softmax_error(logits)
    assert within(float(reweighted_ce(logits, labels, torch.eye(3))), ce, rel=f32(30), atol=error)
    per_example = np.stack([
        [reweighted_ce(logits[i : i + 1], torch.tensor([j]), torch.tensor(T3)).item() for j in range(3)]
        for i in range(30)
    ])
    noisy = p @ T3
    assert (noisy * per_example).sum(1) == pytest.approx((p * -np.log(p)).sum(1), rel=1e-4)
    # The slack is learned only after revision_start, by the method's own optimiser (the one the stage then uses
    # for the network too), and the recorded estimate is T^ + Delta T.
    net = nn.Linear(3, 3)
    method = TRevision(3, lr_revision=1e-2, revision_start=0.5)
    method.setup(stage_context(labels, torch.tensor(p, dtype=torch.float32), nets=[net]))
    x = torch.randn(30, 3)
    for epoch in range(4):
        optimizer = method.network_optimizer(epoch)
        assert (optimizer is not None) == (epoch >= 2)
        loss = method.train_loss([net], Batch(x=x, y=labels, index=torch.arange(30), epoch=epoch))
        if optimizer is not None:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        method.end_epoch(epoch)
        moved = np.abs(method.estimated_transition() - method.anchor.double().numpy()).sum()
        assert (moved > 0) == (epoch >= 2)


def test_sop_noise_term_absorbs_the_examples_the_network_contradicts() -> None:
    """With the network fixed, gradient descent on u, v alone drives u^2 -> 1 (and v^2 on the predicted class)
    where the label contradicts the prediction, and leaves them near 0 where they agree (the sparse noise)."""
    from bench.baselines.sop import SparseOverParameterization
    torch.manual_seed(3)
    logits = torch.randn(200, 3) * 4
    labels = logits.argmax(1).clone()
    flipped = torch.arange(200) < 50
    labels[flipped] = (labels[flipped] + 1) % 3
    method = SparseOverParameterization(3, init_std=1e-2, lr_u=1.0, lr_v=1.0)
    method.setup(stage_context(labels, torch.softmax(logits, 1)))
    net = nn.Identity()
    for _ in range(300):
        idx = torch.randperm(200)[:64]
        method.train_loss([net], Batch(x=logits[idx], y=labels[idx], index=idx, epoch=0)).backward()
    method.end_epoch(0)
    u2 = (method.u.detach() ** 2).squeeze(1).clamp(0, 1)
    v2 = (method.v.detach() ** 2).clamp(0, 1)
    assert u2[flipped].min() > 0.5 and u2[~flipped].max() < 0.2
    predicted_v2 = v2[flipped].gather(1, logits[flipped].argmax(1, keepdim=True)).squeeze(1)
    assert predicted_v2.median() > 0.5  # v grows multiplicatively from its tiny start: most, not all, are there
    # Only the rows of examples seen in a batch ever move.
    method2 = SparseOverParameterization(3)
    method2.setup(stage_context(labels, torch.softmax(logits, 1)))
    before = method2.u.detach().clone()
    idx = torch.arange(10)
    method2.train_loss([net], Batch(x=logits[idx], y=labels[idx], index=idx, epoch=0)).backward()
    method2.end_epoch(0)
    changed = (method2.u.detach() != before).squeeze(1)
    assert not changed[10:].any()


# --- CORES² ------------------------------------------------------------------------------------------------

def test_cores_sieves_what_its_criterion_says_and_regularises_the_rest() -> None:
    from bench.baselines.cores import CORES
    logits, labels, p = random_problem(n=200, c=4, seed=8)
    ce = -np.log(p)
    floored = -np.log(p + 1e-8)  # the paper's code floors the regulariser's CE
    lab = labels.numpy()
    own = ce[np.arange(200), lab]
    keep = own <= floored.mean(axis=1)
    assert 0 < keep.sum() < 200
    # No example within rounding of the sieve's threshold (log-softmax roundings of a few 1e-6): the sieve is exact.
    assert np.abs(own - floored.mean(axis=1)).min() > 1e-4
    prior = np.bincount(lab, minlength=4) / 200
    regularised = own - 2.0 * (floored * prior).sum(axis=1)
    logits = logits.clone().requires_grad_(True)
    method = CORES(4)
    method.setup(stage_context(labels, torch.tensor(p)))  # the prior of the training labels (here, these)
    loss = method.loss(logits, labels)
    assert loss.item() == pytest.approx(regularised[keep].mean(), rel=1e-5)
    loss.backward()
    touched = (logits.grad.abs().sum(dim=1) > 0).numpy()
    assert np.array_equal(touched, keep)  # sieved-out examples get no gradient
    # beta = 0: plain CE over the sieved examples.
    plain = CORES(4, beta=0.0)
    plain.setup(stage_context(labels, torch.tensor(p)))
    assert plain.loss(logits.detach(), labels).item() == pytest.approx(own[keep].mean(), rel=1e-5)


# --- DivideMix ---------------------------------------------------------------------------------------------

class Deterministic(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def test_dividemix_co_divides_refines_and_guesses(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.baselines.dividemix import DivideMix, sharpen
    f, g = Deterministic(0), Deterministic(1)
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    method = DivideMix(3)
    method.clean = [torch.zeros(40), torch.rand(40)]  # net 0 learns from net 1's division and vice versa
    w = method.clean[1]
    labelled = w > 0.5
    targets = method.targets(f, g, [x, x], y, w, labelled)
    with torch.no_grad():
        pf, pg = torch.softmax(f(x), 1), torch.softmax(g(x), 1)
    refined = sharpen(w[:, None] * F.one_hot(y, 3) + (1 - w[:, None]) * pf, 0.5)
    guessed = sharpen((pf + pg) / 2, 0.5)
    assert targets[labelled].numpy() == pytest.approx(refined[labelled].numpy(), abs=1e-6)
    assert targets[~labelled].numpy() == pytest.approx(guessed[~labelled].numpy(), abs=1e-6)
    # Without mixing (lambda' = 1), the step's loss for net 0 is CE against its targets on the labelled rows,
    # lambda_u r times the squared error on the others (r = 8 / 16 at the first step of epoch 8), plus the prior
    # penalty; net 1 sees net 0's division, which labels nothing. No augmentation here: the views are the input.
    class NoMixing:
        def __init__(self, *args: float) -> None: ...

        def sample(self) -> torch.Tensor:
            return torch.tensor(1.0)

    monkeypatch.setattr(torch.distributions, "Beta", NoMixing)
    method = DivideMix(3)
    uniform = torch.full((40, 3), 1 / 3)
    method.setup(stage_context(y, uniform, nets=[f, g], predict_train_of=lambda k: uniform))
    method.clean = [torch.zeros(40), w]
    torch.manual_seed(0)
    loss = method.train_loss([f, g], Batch(x=x, y=y, index=torch.arange(40), epoch=8))
    with torch.no_grad():
        log_pf = torch.log_softmax(f(x), 1)
        lx = -(targets * log_pf).sum(1)[labelled].mean()
        lu = ((pf - targets) ** 2).mean(1)[~labelled].mean()
        penalty = lambda p: (torch.full((3,), 1 / 3) * (1 / 3 / p.mean(0)).log()).sum()  # noqa: E731
        loss_f = lx + 25.0 * 8 / 16 * lu + penalty(pf)
        targets_g = method.targets(g, f, [x, x], y, torch.zeros(40), torch.zeros(40, dtype=torch.bool))
        loss_g = 25.0 * 8 / 16 * ((pg - targets_g) ** 2).mean(1).mean() + penalty(pg)
    assert loss.item() == pytest.approx((loss_f + loss_g).item(), rel=1e-4)


def test_dividemix_mixes_word_embeddings_for_text() -> None:
    from bench.baselines.dividemix import DivideMix
    from bench.models import WordCNN
    torch.manual_seed(0)
    nets = [WordCNN(2, vocab_size=50), WordCNN(2, vocab_size=50)]
    tokens, y = torch.randint(1, 50, (16, 12)), torch.randint(0, 2, (16,))
    method = DivideMix(2)
    uniform = torch.full((16, 2), 0.5)
    method.setup(stage_context(y, uniform, nets=nets, predict_train_of=lambda k: uniform))
    method.clean = [torch.rand(16), torch.rand(16)]
    loss = method.train_loss(nets, Batch(x=tokens, y=y, index=torch.arange(16), epoch=1))
    loss.backward()
    assert torch.isfinite(loss) and all(net.embedding.weight.grad.abs().sum() > 0 for net in nets)


# --- registry, declared ranges (the README's table: tests/system/test_readme_tables.py) ---------------------------

CLASSIC = ("fw", "fw_oracle", "gce", "lccn", "mentornet", "vat", "sce", "nce_rce", "bootstrap", "peer", "coteaching")
NEW = ("backward", "elr", "gls", "fdiv", "coteaching_plus", "jocor", "trevision", "volminnet", "sop", "cores",
       "dividemix")


def test_the_baselines_are_registered_with_papers_and_the_new_ones_with_declared_ranges() -> None:
    from bench.methods import registry
    methods = registry()
    assert len(methods) >= 24
    for name in CLASSIC + NEW:
        cls = methods[name]
        assert cls.__module__.startswith("bench.baselines") and cls.paper and cls.title
    for name in NEW:
        cls = methods[name]
        declared = set(getattr(cls, "ranges", {})) | set(getattr(cls, "choices", {}))
        assert declared == set(cls.defaults), name
        for key, options in getattr(cls, "choices", {}).items():
            assert cls.defaults[key] in options


def test_trevision_reweighting_sees_the_weights_as_constants() -> None:
    """The reweighting phase (their reweight_loss detaches beta): the network's gradient is beta times CE's."""
    from bench.baselines.trevision import reweighted_ce
    logits, labels, p = random_problem(n=30, c=3, seed=10)
    logits = logits.clone().requires_grad_(True)
    slack = torch.zeros(3, 3, requires_grad=True)
    loss = reweighted_ce(logits, labels, torch.tensor(T3, dtype=torch.float32) + slack)
    loss.backward()
    assert slack.grad is None
    beta = p[np.arange(30), labels.numpy()] / (p @ T3)[np.arange(30), labels.numpy()]
    expected = (beta[:, None] * (p - np.eye(3)[labels.numpy()])) / 30  # d(beta CE)/d logits with beta constant
    # beta (p - e_y) / 30 in float32: p, (p T)_y and their ratio within f32(3, 12) of the exact values.
    assert within(logits.grad.numpy(), expected, atol=f32(3, 12) * np.abs(beta).max() / 30)
