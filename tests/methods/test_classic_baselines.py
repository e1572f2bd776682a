"""The comparison methods in baselines/: each against an independent computation or a property of its paper."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from torch import nn

from bench.baselines.bootstrap import Bootstrapping
from bench.baselines.coteaching import CoTeaching, small_loss_mask
from bench.baselines.fw import Forward, anchor_transition, forward_nll
from bench.baselines.gce import GeneralizedCrossEntropy, lq_loss
from bench.baselines.lccn import LCCN, latent_posterior, sample_latent
from bench.baselines.mentornet import MentorNetPD
from bench.baselines.nce_rce import NormalizedCEReverseCE
from bench.baselines.peer import PeerLoss
from bench.baselines.sce import SymmetricCrossEntropy
from bench.baselines.vat import adversarial_perturbation, kl_from_logits
from bench.exec.prepare import prepare
from bench.exec.trainer import train
from bench.methods import Batch, registry
from bench.trial import TrialConfig
from tests.methods.conftest import log_softmax_error, random_problem, stage_context
from tests.tolerances import f32, within

# --- GCE ---------------------------------------------------------------------------------------------------

def test_gce_tends_to_ce_as_q_goes_to_zero() -> None:
    logits, labels, p = random_problem()
    ce = -np.log(p[np.arange(len(p)), labels.numpy()])
    for q in (1e-2, 1e-4):
        # L_q = -expm1(q log p) / q = -log p (1 + q log p / 2 + ...): within q |log p| / 2 of CE (relative), plus
        # the rounding of the float32 log-softmax.
        assert within(lq_loss(logits, labels, q).numpy(), ce, rel=q * ce.max() / 2, atol=log_softmax_error(logits))
    assert not np.allclose(lq_loss(logits, labels, 0.7).numpy(), ce, rtol=0.05)  # q = 0.7 is not CE


def test_gce_is_mae_at_q_one() -> None:
    logits, labels, p = random_problem()
    mae = np.abs(np.eye(p.shape[1])[labels.numpy()] - p).sum(axis=1)  # ||e_y - f||_1 = 2 (1 - f_y)
    # 1 - f_y = -expm1(log f_y): within the log-softmax's absolute rounding; the mean adds f32(256) relative.
    error = log_softmax_error(logits)
    assert within(lq_loss(logits, labels, 1.0).numpy(), mae / 2, atol=error)
    method = GeneralizedCrossEntropy(4, q=1.0)
    assert within(float(method.loss(logits, labels)), mae.mean() / 2, rel=f32(256), atol=error)


def test_gce_truncation_prunes_examples_below_k() -> None:
    logits, labels, p = random_problem(n=64, c=3)
    method = GeneralizedCrossEntropy(3, truncated=True, prune_start=1, prune_every=1)
    method.setup(stage_context(labels, torch.tensor(p, dtype=torch.float32)))
    method.end_epoch(0)
    py = p[np.arange(64), labels.numpy()]
    assert np.abs(py - 0.5).min() > 1e-3  # no example within rounding of the threshold: the flags are exact
    expected = (py > 0.5).astype(np.float32)
    assert np.array_equal(method.weights.numpy(), expected)
    assert 0 < expected.sum() < 64
    # Truncated loss: L_q capped at L_q(k).
    lq_k = (1 - 0.5**0.7) / 0.7
    capped = np.minimum((1 - p[np.arange(64), labels.numpy()] ** 0.7) / 0.7, lq_k).mean()
    # d L_q / d log f = -f^q <= 1 in size: L_q inherits the log-softmax's absolute rounding; the mean adds f32(64).
    assert within(float(method.loss(logits, labels)), capped, rel=f32(64), atol=log_softmax_error(logits))


# --- FW ----------------------------------------------------------------------------------------------------

def test_fw_with_identity_is_ce() -> None:
    logits, labels, p = random_problem()
    ce = -np.log(p[np.arange(len(p)), labels.numpy()]).mean()
    # log (p T)_y as a log-sum-exp of log p + log T: two log-softmax-like roundings, then a mean over 256.
    assert within(float(forward_nll(logits, labels, torch.eye(4))), ce, rel=f32(256),
                  atol=2 * log_softmax_error(logits))


def test_fw_matches_numpy_for_a_general_t() -> None:
    logits, labels, p = random_problem(seed=1)
    t = np.array([[0.7, 0.1, 0.1, 0.1], [0.0, 0.6, 0.4, 0.0], [0.2, 0.0, 0.8, 0.0], [0.0, 0.0, 0.3, 0.7]])
    expected = -np.log((p @ t)[np.arange(len(p)), labels.numpy()]).mean()
    assert within(float(forward_nll(logits, labels, torch.tensor(t))), expected, rel=f32(256),
                  atol=2 * log_softmax_error(logits) + f32(0, 1))  # T's log rounded to float32 too


def test_fw_estimator_recovers_known_t() -> None:
    """Exact posteriors p(y~|x) = p(y|x) T, with 10% anchors per class (p(y|x) one-hot): the 97th percentile of
    p(y~ = i | x) is an anchor of class i, whose noisy posterior is row i of T."""
    rng = np.random.default_rng(3)
    c, n = 3, 3000
    t = np.array([[0.8, 0.15, 0.05], [0.1, 0.7, 0.2], [0.3, 0.0, 0.7]])
    clean = rng.dirichlet(np.ones(c) * 0.7, size=n)
    anchors = rng.permutation(n)[: 3 * n // 10]
    clean[anchors] = np.eye(c)[np.arange(len(anchors)) % c]
    noisy_posterior = torch.tensor(clean @ t, dtype=torch.float32)
    method = Forward(c)
    method.setup(stage_context(torch.zeros(n, dtype=torch.int64), noisy_posterior))
    # Row i of the estimate is an anchor's float32 posterior clean @ t: 3 products and a sum per entry, f32(3, 2).
    assert method.estimated_transition() == pytest.approx(t, abs=f32(3, 2))
    # Without anchors at the top (argmax estimator on the non-anchor part only), the estimate is off.
    others = torch.tensor(np.delete(clean, anchors, axis=0) @ t, dtype=torch.float32)
    assert not np.allclose(anchor_transition(others, 0.97).numpy(), t, atol=0.05)


# --- LCCN --------------------------------------------------------------------------------------------------

def test_lccn_sampler_matches_exact_posterior() -> None:
    """Two rows with different noisy labels, 40k draws each; frequencies within 5 standard errors of the exact
    posterior p(z|x) T[z, y~] / sum_z', and a chi-square goodness-of-fit test that does not reject (p > 1e-3)."""
    t = np.array([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.25, 0.25, 0.5]])
    p = np.array([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    noisy = np.array([1, 2])
    exact = p * t[:, noisy].T
    exact /= exact.sum(axis=1, keepdims=True)
    draws = 40_000
    probs = torch.tensor(np.repeat(p, draws, axis=0))
    labels = torch.tensor(np.repeat(noisy, draws))
    z = sample_latent(probs, labels, torch.tensor(t), torch.Generator().manual_seed(0)).numpy()
    for row in range(2):
        counts = np.bincount(z[row * draws : (row + 1) * draws], minlength=3)
        freq = counts / draws
        se = np.sqrt(exact[row] * (1 - exact[row]) / draws)
        assert np.all(np.abs(freq - exact[row]) < 5 * se), (freq, exact[row])
        assert stats.chisquare(counts, exact[row] * draws).pvalue > 1e-3
    assert latent_posterior(probs[:1], labels[:1], torch.tensor(t)).numpy() == pytest.approx(exact[:1])


def test_lccn_counts_follow_latent_labels_and_stay_non_negative() -> None:
    torch.manual_seed(0)
    n, c = 200, 3
    x = torch.randn(n, 5)
    labels = torch.randint(0, c, (n,))
    net = nn.Linear(5, c)
    method = LCCN(c, update_every=1, warmup_steps=0)
    with torch.no_grad():
        probs = torch.softmax(net(x), dim=1)
    method.setup(stage_context(labels, probs, nets=[net]))
    initial = np.zeros((c, c))
    np.add.at(initial, (probs.argmax(1).numpy(), labels.numpy()), 1)
    assert method.counts().numpy() == pytest.approx(initial)  # the warm start's confusion matrix
    for step in range(20):
        idx = torch.randperm(n)[:64]
        loss = method.train_loss([net], Batch(x=x[idx], y=labels[idx], index=idx, epoch=step))
        assert torch.isfinite(loss)
        counts = method.counts()
        assert counts.min() >= 0 and counts.sum() == n
        # Column sums (noisy-label totals) never change: only the latent side moves.
        assert counts.sum(0).numpy() == pytest.approx(np.bincount(labels.numpy(), minlength=c))
    est = method.estimated_transition()
    assert est.sum(axis=1) == pytest.approx(np.ones(c))
    restored = LCCN(c)
    restored.setup(stage_context(labels, probs, nets=[net]))
    restored.load_state_dict(method.state_dict())
    assert restored.estimated_transition() == pytest.approx(est)


# --- VAT ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("xi", [0.0, 1e-3])
def test_vat_perturbation_has_norm_eps_and_beats_random_direction(xi: float) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(10, 64), nn.Tanh(), nn.Linear(64, 3))
    x = torch.randn(256, 10)
    with torch.no_grad():
        clean = net(x)
    r_adv = adversarial_perturbation(net, x, clean, xi=xi, eps=0.5)
    # Two rescalings and a norm over 10 features in the method, a norm again here: 2 f32(10, 3).
    assert r_adv.norm(dim=1).numpy() == pytest.approx(np.full(256, 0.5), rel=2 * f32(10, 3))
    rand = torch.randn_like(x)
    rand = 0.5 * rand / rand.norm(dim=1, keepdim=True)
    with torch.no_grad():
        kl_adv = float(kl_from_logits(clean, net(x + r_adv)))
        kl_rand = float(kl_from_logits(clean, net(x + rand)))
    assert kl_adv > 2 * kl_rand > 0


def test_vat_perturbs_embeddings_of_a_text_model() -> None:
    from bench.models import WordCNN
    torch.manual_seed(0)
    net = WordCNN(2, vocab_size=50)
    method = registry()["vat"](2)
    tokens = torch.randint(1, 50, (8, 12))
    loss = method.train_loss([net], Batch(x=tokens, y=torch.randint(0, 2, (8,)), index=torch.arange(8), epoch=0))
    loss.backward()
    assert torch.isfinite(loss) and net.embedding.weight.grad.abs().sum() > 0


def test_vat_on_text_ignores_the_scale_of_the_embeddings() -> None:
    """eps_text counts in standard deviations of the embedding table (Miyato et al. perturb normalised embeddings):
    a WordCNN whose embeddings are k times larger and whose filters are k times smaller computes the same function,
    and must get the same VAT loss. A fixed eps in raw units would perturb one of them k times harder."""
    from bench.models import WordCNN
    torch.manual_seed(0)
    net = WordCNN(2, vocab_size=50)
    scaled = WordCNN(2, vocab_size=50)
    scaled.load_state_dict(net.state_dict())
    k = 8.0
    with torch.no_grad():
        scaled.embedding.weight.mul_(k)
        for conv in scaled.convs:
            conv.weight.div_(k)
    tokens = torch.randint(1, 50, (8, 12))
    batch = Batch(x=tokens, y=torch.randint(0, 2, (8,)), index=torch.arange(8), epoch=0)
    method = registry()["vat"](2)
    losses = []
    for model in (net, scaled):
        torch.manual_seed(1)  # the same dropout masks and the same random start d
        losses.append(float(method.train_loss([model], batch).detach()))
    # k = 8 is a power of two: scaling by it is exact in binary floating point, so the two are bit-equal.
    assert losses[0] == losses[1]


# --- MentorNet ---------------------------------------------------------------------------------------------

def test_mentornet_drops_the_highest_loss_fraction() -> None:
    losses = torch.randperm(100).float()
    method = MentorNetPD(2, percentile=0.7, decay=0.0)  # threshold = this batch's 70th percentile
    v = method.weights(losses)
    assert v.sum() == 70
    assert torch.all(v[losses > 69] == 0) and torch.all(v[losses <= 69] == 1)
    # The moving average (the reference's decay): test_mentornet_threshold_moves_with_the_reference_decay.
    restored = MentorNetPD(2)
    restored.load_state_dict(method.state_dict())
    assert restored.threshold == method.threshold


# --- the newer losses --------------------------------------------------------------------------------------

def test_sce_and_nce_rce_match_numpy() -> None:
    logits, labels, p = random_problem(seed=2)
    py = p[np.arange(len(p)), labels.numpy()]
    # -sum_k p_k log q_k with the one-hot clamped at 1e-4 (both released codes); NCE+RCE's code clamps p at 1e-7.
    rce = -np.log(1e-4) * (1 - py)
    rce_clamped = -np.log(1e-4) * np.where(np.eye(4)[labels.numpy()] == 1, 0.0, np.maximum(p, 1e-7)).sum(axis=1)
    sce = (0.1 * np.minimum(-np.log(py), -np.log(1e-7)) + 1.0 * rce).mean()
    assert float(SymmetricCrossEntropy(4).loss(logits, labels)) == pytest.approx(sce, rel=1e-5)
    nce = np.log(py) / np.log(p).sum(axis=1)
    assert float(NormalizedCEReverseCE(4).loss(logits, labels)) == pytest.approx((nce + rce_clamped).mean(), rel=1e-5)


def test_bootstrap_soft_and_hard_match_numpy() -> None:
    logits, labels, p = random_problem(seed=4)
    onehot = np.eye(4)[labels.numpy()]
    soft = -((0.95 * onehot + 0.05 * p) * np.log(p)).sum(axis=1).mean()
    hard = -((0.8 * onehot + 0.2 * np.eye(4)[p.argmax(1)]) * np.log(p)).sum(axis=1).mean()
    # -sum_k w_k log p_k with sum_k w_k = 1: one log-softmax rounding (the soft target's p_k adds as much).
    error = 2 * log_softmax_error(logits)
    assert within(float(Bootstrapping(4).loss(logits, labels)), soft, rel=f32(256), atol=error)
    assert within(float(Bootstrapping(4, variant="hard").loss(logits, labels)), hard, rel=f32(256), atol=error)


def test_peer_loss_expectation_matches_all_pairs() -> None:
    logits, labels, p = random_problem(n=40, c=3, seed=5)
    lab = labels.numpy()
    ce = -np.log(p[np.arange(40), lab] + 1e-5)  # their code's floored CE
    pairs = -np.log(p[:, lab] + 1e-5)  # pairs[i, j] = CE of input i with label j
    expected = ce.mean() - pairs.mean()
    # A difference of two means (they cancel): each within the log-softmax's rounding and f32(40 x 3) of its size.
    bound = 2 * log_softmax_error(logits) + f32(120) * (ce.mean() + pairs.mean())
    assert within(float(PeerLoss(3).loss(logits, labels)), expected, atol=bound)


def test_coteaching_small_loss_mask_and_cross_update() -> None:
    # Its keep rate: test_fidelity_losses_and_hooks.py::test_the_keep_rate_is_their_rate_schedule.
    losses = torch.tensor([5.0, 0.1, 3.0, 0.2, 4.0])
    assert small_loss_mask(losses, 0.6).tolist() == [False, True, True, True, False]
    # Each net is trained on the other's small-loss examples.
    torch.manual_seed(0)
    f, g = nn.Linear(3, 2), nn.Linear(3, 2)
    x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    method = CoTeaching(2, forget_rate=0.5, num_gradual=1)
    loss = method.train_loss([f, g], Batch(x=x, y=y, index=torch.arange(10), epoch=5))
    lf = F.cross_entropy(f(x), y, reduction="none")
    lg = F.cross_entropy(g(x), y, reduction="none")
    expected = lf[lg.argsort()[:5]].mean() + lg[lf.argsort()[:5]].mean()
    # The same float32 losses, summed in another order: two means of 5 positive terms, 2 f32(5, 1) = 7e-7.
    assert loss.item() == pytest.approx(expected.item(), rel=2 * f32(5, 1))


# --- every method through the trainer ----------------------------------------------------------------------

BASELINES = sorted(name for name, cls in registry().items() if cls.__module__.startswith("bench.baselines"))


@pytest.fixture(scope="module")
def warm_cache() -> dict[str, dict[str, torch.Tensor]]:
    return {}


@pytest.mark.parametrize("method", BASELINES)
def test_every_method_beats_chance_on_synthetic_noise(method: str, warm_cache: dict) -> None:
    """Synthetic Gaussians with 30% clothes->bag-style noise (case3): after a 1-epoch CE warm start and 3 method
    epochs at a high learning rate, the model at the last epoch (not the selected one, which may be the warm
    start) has balanced clean test accuracy well above chance (50%)."""
    config = TrialConfig(dataset="synthetic", method=method, noise="case3", r=0.3, seed=1, epochs_warmup=1,
                         epochs=3, lr=1e-2, train_subset=2000)

    def cached(key: str, fresh):  # noqa: ANN001
        if key not in warm_cache:
            warm_cache[key] = fresh()
        return warm_cache[key]

    outcome = train(prepare(config, "unused"), log=lambda s: None, warm_cache=cached)
    assert outcome.status == "ok"
    assert outcome.last_test_bal_acc > 65.0, outcome.last_test_bal_acc
