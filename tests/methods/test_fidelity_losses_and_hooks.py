"""Issue 20, methods A: each of backward, peer, coteaching, coteaching_plus, jocor, sce, nce_rce, cores, bootstrap,
gls, fdiv, elr and sop against its authors' released code (the formula of that code, written out here in numpy), and
the stage hooks they use (the trial's noise rate, a per-epoch learning-rate factor, a gradient-norm clip).

Tolerances: the losses are float32 sums of a few terms of size <= 20, so float32's 1.2e-7 relative rounding bounds
them far below the rel=1e-5 asserted; the packed-versus-solo comparisons differ only by the order of float sums."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench import noise
from bench.baselines.backward import Backward
from bench.baselines.bootstrap import Bootstrapping
from bench.baselines.cores import CORES
from bench.baselines.coteaching import CoTeaching
from bench.baselines.coteaching_plus import CoTeachingPlus
from bench.baselines.elr import elr_regulariser
from bench.baselines.fdiv import FDivergence
from bench.baselines.jocor import JoCoR
from bench.baselines.nce_rce import NormalizedCEReverseCE
from bench.baselines.peer import PeerLoss
from bench.baselines.sce import SymmetricCrossEntropy
from bench.config import Schedule, UserError
from bench.data import get_dataset
from bench.exec.pack import run_pack
from bench.exec.prepare import prepare
from bench.exec.stage import SoloStage
from bench.exec.trainer import run_trial
from bench.methods import Batch, Method, describe_params, registry
from bench.trial import TrialConfig, freeze_params
from tests.methods.conftest import stage_context

QUIET = dict(log=lambda s: None)
T2 = np.array([[0.6, 0.4], [0.3, 0.7]])  # the probe


def sure(labels: list[int], scale: float, num_classes: int = 2) -> torch.Tensor:
    """Logits of `scale` on each example's label, 0 elsewhere: a prediction sure of the given label."""
    return scale * F.one_hot(torch.tensor(labels), num_classes).float()


# --- 1. the losses are bounded below, as in the references -------------------------------------------------

def test_backward_clips_the_probabilities_so_the_loss_is_bounded_below() -> None:
    """Patrini's loss.py clips p to [1e-7, 1 - 1e-7] before T^-1 multiplies -log p. Without the clip the probe gives
    -1167 and falls further as the logits grow; with it the loss is its floor whatever the scale."""
    method = Backward(2)
    method.set_transition(torch.tensor(T2))
    labels = [0, 1]
    inverse = np.linalg.inv(T2)
    eps32 = float(np.float32(1 - 1e-7))  # the upper clip as float32 holds it
    p = np.array([[eps32, 1e-7], [1e-7, eps32]])  # the clipped predictions of the probe
    expected = np.mean([inverse[y] @ -np.log(p[i]) for i, y in enumerate(labels)])
    for scale in (1e3, 1e5):
        loss = float(method.loss(sure(labels, scale), torch.tensor(labels)))
        assert loss == pytest.approx(expected, rel=1e-5)
    floor = np.mean([np.minimum(inverse[y], 0).sum() * -np.log(1e-7) for y in labels])
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = torch.tensor(rng.normal(size=(64, 2)) * 10 ** rng.uniform(0, 4), dtype=torch.float32)
        y = torch.tensor(rng.integers(0, 2, 64))
        bound = np.mean([np.minimum(inverse[k], 0).sum() * -np.log(1e-7) for k in y.numpy()])
        assert float(method.loss(logits, y)) >= bound - 1e-4
    assert expected == pytest.approx(floor, abs=1e-5)  # the probe sits at the floor


def test_peer_floors_both_logs_so_the_loss_is_bounded_below() -> None:
    """Their CrossEntropyLossStable: NLL of log(softmax + 1e-5) in both terms, so at most alpha log(1e5) is
    subtracted. Without the floor the probe gives -500 and falls with the logits' scale."""
    labels = [0, 1] * 32
    y = torch.tensor(labels)
    p = np.eye(2)[labels]  # the probe's softmax, exactly one-hot in float32
    own = -np.log(1.0 + 1e-5)
    cross = -np.log(p[:, labels] + 1e-5).mean()  # every input with every label, in expectation
    for scale in (1e3, 1e5):
        logits = sure(labels, scale)
        assert float(PeerLoss(2).loss(logits, y)) == pytest.approx(own - cross, rel=1e-5)  # selection: alpha = 1
        method = PeerLoss(2, alpha_schedule="constant", alpha=1.0)
        torch.manual_seed(0)
        draws = [float(method.logits_loss(logits, Batch(x=logits, y=y, index=torch.arange(64), epoch=0)))
                 for _ in range(50)]
        assert min(draws) >= own - math.log(1e5) - 1e-5


# --- 2. the peer schedule and the learning rate divided by 1 + alpha ---------------------------------------

def f_alpha_cifar10(epoch: int, sparse: bool) -> float:
    """Their CIFAR-10/runner.py's f_alpha, written out as there (epoch counts from the start of their run)."""
    if sparse:
        pieces = [(0.0, 0.0, 20), (0.0, 1, 20), (1, 2, 50), (2, 5, 50), (5, 10, 100), (10, 20, 100)]
    else:
        pieces = [(0.0, 0.0, 20), (0.0, 0.1, 20), (1, 2, 50), (2, 2.5, 50), (2.5, 3.3, 100), (3.3, 5, 100)]
    return float(np.concatenate([np.linspace(a, b, num=n) for a, b, n in pieces])[epoch])


@pytest.mark.parametrize("schedule, sparse", [("cifar10_sparse", True), ("cifar10_uniform", False)])
def test_peer_alpha_follows_their_cifar10_schedule_after_its_ce_epochs(schedule: str, sparse: bool) -> None:
    """Their first 20 epochs (alpha = 0, plain CE) are the warm start: method epoch e is their epoch 20 + e."""
    method = PeerLoss(2, alpha_schedule=schedule)
    for e in (0, 1, 19, 20, 57, 119, 120, 319):
        alpha = f_alpha_cifar10(20 + e, sparse)
        assert method.alpha_at(e) == pytest.approx(alpha, abs=1e-12)
        assert method.lr_factor(e) == pytest.approx(1 / (1 + alpha), abs=1e-12)  # their adjust_learning_rate
    assert method.alpha_at(10_000) == method.alpha_at(319)  # the last value holds
    fashion = PeerLoss(2, alpha_schedule="fashion_mnist")
    assert fashion.alpha_at(90) == pytest.approx(np.linspace(0.0, 1, num=180)[90], abs=1e-12)


def test_the_training_loss_uses_the_epochs_alpha_and_selection_the_fixed_one() -> None:
    torch.manual_seed(1)
    logits, y = torch.randn(32, 3), torch.randint(0, 3, (32,))
    method = PeerLoss(3)  # cifar10_sparse; selection at alpha = 1
    losses = -np.log(torch.softmax(logits, 1).numpy() + 1e-5)
    prior = np.bincount(y.numpy(), minlength=3) / 32
    expected = losses[np.arange(32), y.numpy()].mean() - (losses.mean(0) * prior).sum()
    assert float(method.loss(logits, y)) == pytest.approx(expected, rel=1e-5)
    batch = Batch(x=logits, y=y, index=torch.arange(32), epoch=5)
    torch.manual_seed(7)
    got = float(method.logits_loss(logits, batch))
    torch.manual_seed(7)
    p1, p2 = torch.randint(32, (32,)), torch.randint(32, (32,))
    peer = losses[p1.numpy(), y.numpy()[p2.numpy()]].mean()
    assert got == pytest.approx(losses[np.arange(32), y.numpy()].mean() - method.alpha_at(5) * peer, rel=1e-5)


# --- 3. what the stage does with lr_factor and max_grad_norm (solo and packed) ------------------------------

class Scaled(Method):
    """CE with a learning-rate factor and a gradient bound, to watch the stage apply them."""

    name = ""  # not registered
    defaults = {"factor": 1.0, "bound": math.inf}

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels)

    def lr_factor(self, epoch: int) -> float:
        return self.factor

    def max_grad_norm(self) -> float | None:
        return None if math.isinf(self.bound) else self.bound


def one_sgd_step(method: Method) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(parameters before, after, the optimiser's lr after the epoch) of a one-step epoch of plain SGD at lr 0.5."""
    p = prepare(TrialConfig("synthetic", "ce", "case3", 0.3, seed=0, train_subset=128), "unused", **QUIET)
    torch.manual_seed(0)
    net = nn.Linear(10, 2)
    before = torch.cat([q.detach().flatten().clone() for q in net.parameters()])
    solo = SoloStage(p, [net], Schedule("sgd", 0.5, epochs=1, batch_size=128), 0,
                     lambda nets, b: method.logits_loss(nets[0](b.x), b), method.loss, method)
    solo.train_epoch(0)
    after = torch.cat([q.detach().flatten() for q in net.parameters()])
    return before, after, solo.optimizer.param_groups[0]["lr"]


def test_the_solo_stage_scales_the_epochs_learning_rate_and_clips_the_gradient() -> None:
    before, plain, lr = one_sgd_step(Scaled(2))
    _, halved, lr_after = one_sgd_step(Scaled(2, factor=0.5))
    assert (halved - before).numpy() == pytest.approx(0.5 * (plain - before).numpy(), rel=1e-5, abs=1e-8)
    assert lr == lr_after == 0.5  # the scheduled rate is what the scheduler and the checkpoints keep
    _, clipped, _ = one_sgd_step(Scaled(2, bound=1e-3))
    step = (clipped - before).norm().item()
    assert (plain - before).norm().item() > 10 * 0.5 * 1e-3
    assert step == pytest.approx(0.5 * 1e-3, rel=1e-4)  # lr x bound: the gradient clipped to norm 1e-3


def test_a_packed_nce_rce_member_clips_its_own_gradient_as_its_solo_trial() -> None:
    """A bound small enough that every step clips, beside an L_DMI member that does not clip (and a peer member
    whose learning rate is scaled): each member's numbers are its solo trial's."""
    clipped = TrialConfig("synthetic", "nce_rce", "case2", 0.4, seed=2, epochs=3, epochs_warmup=2,
                          method_params=freeze_params({"grad_bound": 0.01}))
    peer = TrialConfig("synthetic", "peer", "case3", 0.3, seed=3, epochs=3, epochs_warmup=2,
                       method_params=freeze_params({"alpha_schedule": "constant", "alpha": 3.0}))
    neighbour = TrialConfig("synthetic", "dmi", "case3", 0.2, seed=5, epochs=3, epochs_warmup=2)
    rows = run_pack([neighbour, clipped, peer], "unused", **QUIET)
    for config, packed in zip((neighbour, clipped, peer), rows, strict=True):
        solo = run_trial(config, "unused", **QUIET)
        assert packed["best_epoch"] == solo["best_epoch"]
        assert packed["val_loss"] == pytest.approx(solo["val_loss"], rel=1e-5)
        assert packed["last_test_acc"] == pytest.approx(solo["last_test_acc"], abs=1e-6)
    unclipped = run_trial(dataclasses.replace(clipped, method_params=()), "unused", **QUIET)
    assert unclipped["val_loss"] != pytest.approx(rows[1]["val_loss"], rel=1e-4)  # the clip changed the training


# --- 4. the forget rate of Co-teaching, Co-teaching+ and JoCoR -------------------------------------------

def test_the_expected_noise_rate_is_the_fraction_of_labels_t_changes() -> None:
    clean = np.array([0] * 30 + [1] * 70)
    t = np.array([[1.0, 0.0], [0.4, 0.6]])
    labels = noise.inject("x", "case3", 0.4, 0, clean, clean, t)
    assert labels.expected_rate == pytest.approx(0.7 * 0.4, abs=1e-12)
    human = noise.summarise(clean, np.where(np.arange(100) < 9, 1 - clean, clean), clean, 2, None)
    assert human.expected_rate == pytest.approx(0.09) == human.noise_rate  # no T: the realised rate
    # The L_DMI paper's CIFAR-10 pattern flips 4 of 10 balanced classes with probability r: 0.4 r, not r.
    cifar = get_dataset("cifar10").transition("pairs", 0.5)
    balanced = np.repeat(np.arange(10), 5)
    assert noise.summarise(balanced, balanced, balanced, 10, cifar).expected_rate == pytest.approx(0.2)
    # JoCoR's asymmetric CIFAR-10 noise (data/utils.py) flips 5 of 10 classes: their forget rate r / 2 is this rule.
    jocor = np.eye(10)
    for a, b in ((9, 1), (2, 0), (3, 5), (5, 3), (4, 7)):
        jocor[a, a], jocor[a, b] = 0.6, 0.4
    assert noise.summarise(balanced, balanced, balanced, 10, jocor).expected_rate == pytest.approx(0.4 / 2)


@pytest.mark.parametrize("cls", [CoTeaching, CoTeachingPlus, JoCoR])
def test_the_forget_rate_is_the_trials_noise_rate_unless_given(cls: type[CoTeaching]) -> None:
    labels = torch.zeros(10, dtype=torch.int64)
    method = cls(2)
    method.setup(stage_context(labels, num_classes=2, noise_rate=0.28))
    assert method.forget_rate == 0.28 and method.keep_rate(50) == pytest.approx(0.72)
    given = cls(2, forget_rate=0.1)
    given.setup(stage_context(labels, num_classes=2, noise_rate=0.28))
    assert given.forget_rate == 0.1
    with pytest.raises(UserError, match="forget_rate"):
        cls(2).setup(stage_context(labels, num_classes=2, noise_rate=math.nan))  # unknown noise rate and none given
    assert "forget_rate=the trial's noise rate" in describe_params(cls)[0]


def test_a_coteaching_trial_forgets_its_expected_noise_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []
    monkeypatch.setattr(CoTeaching, "end_epoch", lambda self, epoch: seen.append(self.forget_rate))
    config = TrialConfig("synthetic", "coteaching", "case3", 0.3, seed=0, epochs=1, epochs_warmup=1,
                         train_subset=1000)
    p = prepare(config, "unused", **QUIET)
    clean = p.splits.train.y
    expected = np.mean(clean == 1) * 0.3  # case3: clothes (class 1) -> bag with probability r
    assert p.labels.expected_rate == pytest.approx(expected, abs=1e-12)
    run_trial(config, "unused", **QUIET)
    assert seen == [pytest.approx(expected, abs=1e-12)]


@pytest.mark.parametrize("tau, gradual, c", [(0.2, 10, 1.0), (0.4, 10, 1.0), (0.45, 5, 2.0), (0.3, 1, 1.0),
                                             (0.5, 0, 0.5)])
def test_the_keep_rate_is_their_rate_schedule(tau: float, gradual: int, c: float) -> None:
    """main.py: rate_schedule = ones(n_epoch) tau; rate_schedule[:num_gradual] = linspace(0, tau^c, num_gradual),
    read at training epochs 1, 2, ... (epoch 0 evaluates the untrained networks)."""
    schedule = np.ones(200) * tau
    schedule[:gradual] = np.linspace(0, tau**c, gradual)
    method = CoTeaching(2, forget_rate=tau, num_gradual=gradual, exponent=c)
    for e in range(31):
        assert method.keep_rate(e) == pytest.approx(1 - schedule[e + 1], abs=1e-12)


def test_coteaching_plus_keeps_all_disagreements_where_its_share_rounds_to_none() -> None:
    """Their loss_coteaching: num_remember = int(keep |D|); if that is 0, every example of D is used."""
    torch.manual_seed(4)
    f, g = nn.Linear(4, 2), nn.Linear(4, 2)
    x, y = torch.randn(48, 4), torch.randint(0, 2, (48,))
    with torch.no_grad():
        disagree = (f(x).argmax(1) != g(x).argmax(1)).numpy()
        lf, lg = F.cross_entropy(f(x), y, reduction="none").numpy(), F.cross_entropy(g(x), y, reduction="none").numpy()
    d = np.flatnonzero(disagree)
    assert 1 < len(d) < 48
    keep = 0.9 / len(d)  # int(keep |D|) = 0
    method = CoTeachingPlus(2, forget_rate=1 - keep, num_gradual=0)
    loss = method.train_loss([f, g], Batch(x=x, y=y, index=torch.arange(48), epoch=3))
    assert loss.item() == pytest.approx(lf[d].mean() + lg[d].mean(), rel=1e-5)


# --- 5. SCE and NCE+RCE: the one-hot clamped at 1e-4, NCE+RCE's gradient clip ----------------------------

def test_sce_and_nce_rce_use_log_1e_4_for_log_0() -> None:
    """A prediction sure of the wrong class: RCE = -log(1e-4) = 9.21 in both released codes (the paper's text: 4);
    SCE's Keras code also caps its CE at -log(1e-7)."""
    logits, y = sure([1], 100.0), torch.tensor([0])
    assert float(SymmetricCrossEntropy(2, alpha=0.0).loss(logits, y)) == pytest.approx(-math.log(1e-4), rel=1e-6)
    assert float(SymmetricCrossEntropy(2, beta=0.0).loss(logits, y)) == pytest.approx(-0.1 * math.log(1e-7), rel=1e-6)
    assert float(NormalizedCEReverseCE(2, alpha=0.0).loss(logits, y)) == pytest.approx(-math.log(1e-4), rel=1e-6)
    assert float(SymmetricCrossEntropy(2, alpha=0.0, log_zero=-4.0).loss(logits, y)) == pytest.approx(4.0)
    assert NormalizedCEReverseCE(2).max_grad_norm() == 5.0  # every config's grad_bound
    assert NormalizedCEReverseCE(2, grad_bound=math.inf).max_grad_norm() is None


# --- 6. CORES²: the prior over the sieved examples, lr / (1 + beta) --------------------------------------

def test_cores_prior_is_over_the_training_set_then_over_the_examples_its_sieve_kept() -> None:
    rng = np.random.default_rng(9)
    train_labels = torch.tensor(rng.choice(3, 300, p=[0.6, 0.3, 0.1]))
    method = CORES(3)
    method.setup(stage_context(train_labels, num_classes=3))
    counts = np.bincount(train_labels.numpy(), minlength=3)
    # A batch whose label frequencies are not the training set's: the loss uses the training set's (their
    # noise_prior), not the batch's.
    logits = torch.tensor(rng.normal(size=(40, 3)) * 3, dtype=torch.float32)
    y = torch.tensor(rng.integers(0, 3, 40))
    p = torch.softmax(logits, 1).numpy()
    own, floored = -np.log(p[np.arange(40), y.numpy()]), -np.log(p + 1e-8)
    v = own - floored.mean(1) <= 0
    assert 0 < v.sum() < 40
    regularised = own - 2.0 * (floored * counts / 300).sum(1)
    loss = method.logits_loss(logits, Batch(x=logits, y=y, index=torch.arange(40), epoch=0))
    assert loss.item() == pytest.approx(regularised[v].mean(), rel=1e-5)
    assert method.prior.numpy() == pytest.approx(counts / 300, abs=1e-7)
    method.end_epoch(0)
    # phase1.py: noise_prior_cur = noise_prior * N - (sieved-out examples per noisy class), normalised.
    kept = counts - np.bincount(y.numpy()[~v], minlength=3)
    assert method.prior.numpy() == pytest.approx(kept / kept.sum(), abs=1e-7)
    assert method.sieved_out.sum() == 0  # counted afresh each epoch
    assert method.lr_factor(0) == pytest.approx(1 / 3)  # their adjust_learning_rate: lr / (1 + f_beta), beta = 2


# --- 7. bootstrap and ELR clip as their references ---------------------------------------------------------

@pytest.mark.parametrize("variant, beta", [("soft", 0.95), ("hard", 0.8)])
def test_bootstrap_clips_the_prediction_as_the_keras_implementations(variant: str, beta: float) -> None:
    logits, y = torch.tensor([[120.0, 0.0, -5.0], [0.3, 0.1, -0.2]]), torch.tensor([1, 0])
    q = np.clip(torch.softmax(logits, 1).numpy(), 1e-7, float(np.float32(1 - 1e-7)))
    other = q if variant == "soft" else np.eye(3)[q.argmax(1)]
    expected = -((beta * np.eye(3)[y.numpy()] + (1 - beta) * other) * np.log(q)).sum(1).mean()
    assert float(Bootstrapping(3, variant=variant).loss(logits, y)) == pytest.approx(expected, rel=1e-5)


def test_elr_regulariser_takes_the_clamped_prediction_unnormalised() -> None:
    """loss.py: y_pred = clamp(softmax, 1e-4, 1 - 1e-4) enters <p, t> as it is (renormalised only in the target)."""
    logits = torch.tensor([[30.0, 0.0, 0.0]])
    targets = torch.tensor([[1.0, 0.0, 0.0]])
    expected = math.log(1 - float(np.float32(1 - 1e-4)))  # log(1e-4): p_0 clamped at 1 - 1e-4
    assert float(elr_regulariser(logits, targets)) == pytest.approx(expected, rel=1e-3)


# --- 8. f-divergence: their activation and conjugate, for each divergence used -------------------------------

THEIR_F = {  # CIFAR-10/runner.py: activation(v) = -E[g(v)], conjugate(v) = -E[f*(g(v))], v the label's probability
    "total_variation": (lambda v: -np.mean(np.tanh(v) / 2), lambda v: -np.mean(np.tanh(v) / 2)),
    "kl": (lambda v: -np.mean(v), lambda v: -np.mean(np.exp(v - 1))),
    "jeffrey": (lambda v: -np.mean(v), lambda v: -np.mean(v + v * v / 4 + v**3 / 16)),
    "pearson": (lambda v: -np.mean(v), lambda v: -np.mean(v * v / 4 + v)),
    "jensen_shannon": (lambda v: -np.mean(-np.log(1 + np.exp(-v))) - np.log(2),
                       lambda v: -np.mean(v + np.log(1 + np.exp(-v))) + np.log(2)),
}


@pytest.mark.parametrize("divergence", sorted(THEIR_F))
def test_fdiv_is_their_loss_regular_minus_loss_peer(divergence: str) -> None:
    """Their training loss is activation(p_y) - conjugate(p of a peer input at a peer label); ours over the exact
    product expectation is the mean of theirs over every (input, label) pair."""
    rng = np.random.default_rng(11)
    logits = torch.tensor(rng.normal(size=(30, 3)) * 2, dtype=torch.float32)
    y = torch.tensor(rng.integers(0, 3, 30))
    p = torch.softmax(logits, 1).numpy()
    activation, conjugate = THEIR_F[divergence]
    lab = y.numpy()
    expected = activation(p[np.arange(30), lab]) - conjugate(p[:, lab].ravel())
    assert float(FDivergence(3, divergence=divergence).loss(logits, y)) == pytest.approx(expected, rel=1e-5)


# --- 9. the fidelity record --------------------------------------------------------------------------------

METHODS_A = ("backward", "peer", "coteaching", "coteaching_plus", "jocor", "sce", "nce_rce", "cores", "bootstrap",
             "gls", "fdiv", "elr", "sop")


@pytest.mark.parametrize("name", METHODS_A)
def test_each_method_names_its_reference_and_its_differences(name: str) -> None:
    import sys

    cls = registry()[name]
    assert "commit " in cls.reference and "/" in cls.reference.split(",")[0]
    assert cls.differences and all(isinstance(d, str) and len(d) > 20 for d in cls.differences)
    doc = sys.modules[cls.__module__].__doc__
    repository = cls.reference.split(",")[0].split()[-1]
    assert f"Reference: {repository}" in doc or repository in doc
    assert len([line for line in doc.splitlines() if line.startswith("- ")]) == len(cls.differences)
