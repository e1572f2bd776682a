"""Issue 31, item 2: the methods the last review left, each against its reference's rule written out here by hand
(VolMinNet's shared rates, CIFAR-100's per-method defaults declared in its dataset file, Co-teaching+'s ramp, peer
loss's per-dataset alpha, fw_oracle on FW's stage, the records of the reweighting optimisers)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bench.baselines.backward import Backward
from bench.baselines.coteaching_plus import CoTeachingPlus
from bench.baselines.mentornet import MentorNetPD
from bench.baselines.peer import PeerLoss
from bench.baselines.trevision import TRevision
from bench.baselines.volminnet import VolMinNet
from bench.config import UserError
from bench.data import get_dataset
from bench.methods import describe_params, get_method
from bench.trial import TrialConfig
from tests.methods.conftest import stage_context
from tests.tolerances import U64

# --- VolMinNet: the classifier's and T's rates equal, decayed together at epochs 30 and 60 -------------------------

def volminnet_rate(epoch: int) -> float:
    """main.py: --lr 0.01 for both optimisers, two MultiStepLR(milestones=[30, 60], gamma=0.1) stepped after each
    epoch: the rate during 0-based epoch e."""
    return 0.01 * 0.1 ** sum(epoch >= m for m in (30, 60))


@pytest.mark.parametrize("dataset, noise", [("cifar10", "pairs"), ("cifar100", "superclass")])
def test_volminnet_trains_the_classifier_and_t_at_one_rate_decayed_at_30_and_60(dataset: str, noise: str) -> None:
    config = TrialConfig(dataset, "volminnet", noise, 0.2)
    stage = config.schedules()[1]
    assert (stage.optimizer, stage.epochs, stage.batch_size, stage.momentum, stage.weight_decay) == \
        ("sgd", 80, 128, 0.9, 1e-4)
    # The classifier's rate as the solo stage sets it (the stage's SGD under torch's MultiStepLR).
    classifier = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=stage.lr, momentum=stage.momentum)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(classifier, list(stage.milestones), stage.gamma)
    method = VolMinNet(get_dataset(dataset).num_classes, dataset=dataset, **config.params)
    method.setup(stage_context(torch.zeros(4, dtype=torch.int64), num_classes=method.num_classes, schedule=stage))
    # Two or three rounded multiplications each side: a few units in the last place of float64.
    for epoch in range(stage.epochs):
        rate_t, rate_net = method.optimizer.param_groups[0]["lr"], classifier.param_groups[0]["lr"]
        assert rate_t == pytest.approx(volminnet_rate(epoch), rel=8 * U64, abs=0)
        assert rate_net == pytest.approx(volminnet_rate(epoch), rel=8 * U64, abs=0)
        method.end_epoch(epoch)
        classifier.step()
        scheduler.step()


def test_volminnet_starts_t_at_the_references_cifar100_init() -> None:
    """main.py line 71: args.init = 4.5 on CIFAR-100; sig_t: w = -init, T = rows of I + sigmoid(w) off the diagonal
    normalised: diagonal 1 / (1 + 99 sigmoid(-4.5)) with 100 classes."""
    assert TrialConfig("cifar100", "volminnet", "superclass", 0.2).effective_params()["init"] == 4.5
    method = VolMinNet(100, dataset="cifar100")
    diagonal = 1.0 / (1.0 + 99.0 / (1.0 + math.exp(4.5)))
    # float32: a sigmoid and a sum of 100 terms, then a division.
    assert torch.diagonal(method.transition()).detach().double().numpy() == pytest.approx(diagonal, rel=1e-5)
    assert VolMinNet(10, dataset="cifar10").init == 2.0


# --- CIFAR-100's per-method defaults, declared in its dataset file -------------------------------------------------

CIFAR100_DEFAULTS = [
    ("volminnet", "init", 4.5),  # main.py line 71
    ("backward", "quantile", 1.0),  # experiment.py lines 59-62: filter_outlier = False
    ("trevision", "quantile", 1.0),  # main.py line 78: estimate_state = False
    ("sce", "alpha", 6.0), ("sce", "beta", 0.1),  # train_models.py line 224
    ("elr", "beta", 0.9), ("elr", "lambda_", 7.0),  # ELR/config_cifar100.json lines 39-40
    ("jocor", "co_lambda", 0.85),  # README.md line 31
    ("coteaching_plus", "init_epoch", 5),  # main.py line 94
    ("peer", "alpha_schedule", "cifar100_sparse"),  # CIFAR-100/runner.py lines 99-106
]


@pytest.mark.parametrize("method, key, value", CIFAR100_DEFAULTS)
def test_cifar100_runs_each_method_with_its_references_cifar100_setting(method: str, key: str, value: object) -> None:
    cls = get_method(method)
    assert TrialConfig("cifar100", method, "superclass", 0.2).effective_params()[key] == value
    assert cls(100, dataset="cifar100").params[key] == value
    assert cls(100, dataset="cifar100n").params[key] == value  # the same 100 classes with human labels
    assert cls(20, dataset="cifar100n_coarse").params[key] == cls.defaults[key]  # 20 classes: no reference setting
    assert cls(10, dataset="cifar10").params[key] == {**cls.defaults, **cls.dataset_defaults.get("cifar10", {})}[key]
    other = cls.defaults[key] if value != cls.defaults[key] else value
    explicit = TrialConfig("cifar100", method, "superclass", 0.2, method_params=((key, other),))
    assert explicit.effective_params()[key] == other  # an explicit value wins
    assert any(line.startswith(f"{key}=") and f"cifar100: {value}" in line for line in describe_params(cls))


def test_defaults_stack_method_then_its_dataset_defaults_then_the_datasets_then_explicit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cifar100 = get_dataset("cifar100")
    monkeypatch.setattr(PeerLoss, "dataset_defaults", {"cifar100": {"alpha": 2.0, "alpha_schedule": "constant"}})
    monkeypatch.setattr(cifar100, "method_defaults", {"peer": {"alpha_schedule": "cifar100_uniform"}})
    config = TrialConfig("cifar100", "peer", "superclass", 0.2)
    assert config.effective_params() == {"alpha": 2.0, "alpha_schedule": "cifar100_uniform"}
    assert PeerLoss(100, dataset="cifar100").params == config.effective_params()
    given = TrialConfig("cifar100", "peer", "superclass", 0.2, method_params=(("alpha_schedule", "constant"),))
    assert given.effective_params() == {"alpha": 2.0, "alpha_schedule": "constant"}
    assert given.trial_id != config.trial_id


@pytest.mark.parametrize("declared, words", [({"sce": {"alpha": -1.0}}, "alpha=-1.0"),
                                             ({"sce": {"gamma": 1.0}}, "no parameter gamma")])
def test_a_datasets_method_defaults_are_checked_like_explicit_values(
        monkeypatch: pytest.MonkeyPatch, declared: dict, words: str) -> None:
    monkeypatch.setattr(get_dataset("cifar100"), "method_defaults", declared)
    with pytest.raises(UserError, match=words):
        TrialConfig("cifar100", "sce", "superclass", 0.2).effective_params()
    with pytest.raises(UserError, match=words):
        get_method("sce")(100, dataset="cifar100")


@pytest.mark.parametrize("cls", [Backward, TRevision])
def test_backward_and_trevision_take_arg_max_anchors_on_cifar100(cls: type) -> None:
    """NoiseEstimator.fit without filter_outlier (and T-revision's tools.fit): row i is the prediction of the example
    with the largest p(y~ = i | x); the 97th-percentile filter elsewhere picks other rows."""
    probs = torch.softmax(torch.randn(200, 3, generator=torch.Generator().manual_seed(0)) * 3, dim=1)
    expected = probs.numpy()[probs.numpy().argmax(axis=0)]
    for dataset, anchors_by_arg_max in (("cifar100", True), ("cifar10", False)):
        method = cls(3, dataset=dataset)
        method.setup(stage_context(torch.zeros(200, dtype=torch.int64), probs, nets=[torch.nn.Linear(2, 3)]))
        assert np.array_equal(method.estimated_transition(), expected) == anchors_by_arg_max


# --- Co-teaching+: the ramp goes on from the reference's init_epoch ---------------------------------------------

def coteaching_plus_rate(epoch: int, tau: float, init_epoch: int, num_gradual: int = 10) -> float:
    """main.py gen_forget_rate: rate_schedule = ones(200) tau, rate_schedule[:num_gradual] = linspace(0, tau,
    num_gradual), read at their epoch; their epochs run from 1 (0 evaluates), plain Co-teaching before init_epoch."""
    schedule = np.ones(200) * tau
    schedule[:num_gradual] = np.linspace(0, tau, num_gradual)
    first_disagreement_epoch = max(init_epoch, 1)
    return float(schedule[first_disagreement_epoch + epoch])


@pytest.mark.parametrize("dataset, init_epoch", [("cifar10", 20), ("cifar100", 5), ("fashion_mnist", 20)])
def test_coteaching_plus_forgets_at_the_references_rate_of_its_disagreement_epochs(dataset: str,
                                                                                    init_epoch: int) -> None:
    method = CoTeachingPlus(2, dataset=dataset, forget_rate=0.45)
    assert method.init_epoch == init_epoch
    # Both sides approximate tau i / 9 with two rounded float64 operations, then take 1 minus it: under 4 U64 apart.
    for epoch in range(40):
        assert method.keep_rate(epoch) == pytest.approx(1 - coteaching_plus_rate(epoch, 0.45, init_epoch), abs=8 * U64)
    mnist_like = CoTeachingPlus(2, forget_rate=0.45, init_epoch=0)  # their MNIST: disagreement from epoch 1
    for epoch in range(15):
        assert mnist_like.keep_rate(epoch) == pytest.approx(1 - coteaching_plus_rate(epoch, 0.45, 0), abs=8 * U64)


# --- peer loss: each dataset's own alpha schedule ----------------------------------------------------------------

def f_alpha(pieces: list[tuple[float, float, int]], epoch: int) -> float:
    return float(np.concatenate([np.linspace(a, b, num=n) for a, b, n in pieces])[epoch])


FASHION = [(0.0, 0.0, 120), (0.0, 1, 180)]  # Fashion_MNIST/runner.py lines 98-101
CIFAR100_SPARSE = [(0.0, 0.0, 110), (0.0, 2, 20), (2, 10, 70), (10, 20, 50)]  # CIFAR-100/runner.py lines 101-106
CIFAR100_UNIFORM = [(0.0, 0.0, 100), (0.95, 0.95, 150)]  # CIFAR-100/runner.py lines 109-112


@pytest.mark.parametrize("dataset, params, pieces", [
    ("fashion_mnist", {}, FASHION), ("cifar100", {}, CIFAR100_SPARSE),
    ("cifar100", {"alpha_schedule": "cifar100_uniform"}, CIFAR100_UNIFORM)])
def test_peer_alpha_is_each_datasets_runner_after_its_ce_epochs(dataset: str, params: dict, pieces: list) -> None:
    """Their leading alpha = 0 epochs (plain CE) are the warm start: method epoch e is their epoch zeros + e."""
    method = PeerLoss(2, dataset=dataset, **params)
    zeros = pieces[0][2]
    last = sum(n for _, _, n in pieces) - 1
    for epoch in range(last - zeros + 1):
        alpha = f_alpha(pieces, zeros + epoch)
        assert method.alpha_at(epoch) == pytest.approx(alpha, abs=0)  # the same np.linspace values
        assert method.lr_factor(epoch) == pytest.approx(1 / (1 + alpha), rel=2 * U64, abs=0)
    assert method.alpha_at(last - zeros + 50) == f_alpha(pieces, last)  # the last value holds


# --- fw_oracle: FW's own stage wherever FW has one ----------------------------------------------------------------

@pytest.mark.parametrize("dataset, noise", [("cifar10", "pairs"), ("cifar100", "superclass"),
                                            ("dogs_vs_cats", "cat_to_dog"), ("mr", "pos_to_neg")])
def test_fw_oracle_trains_on_fws_stage(dataset: str, noise: str) -> None:
    oracle = TrialConfig(dataset, "fw_oracle", noise, 0.2).schedules()[1]
    assert oracle == TrialConfig(dataset, "fw", noise, 0.2).schedules()[1]
    assert oracle != get_dataset(dataset).method_stage or dataset == "mr"  # MR's FW stage is its default one
    if dataset == "cifar10":  # CIFAR-10/FW.py: SGD 0.01, 0.001 from epoch 40, 1e-4 from 80, 120 epochs, batch 256
        assert (oracle.optimizer, oracle.lr, oracle.milestones, oracle.gamma, oracle.epochs, oracle.batch_size) == \
            ("sgd", 0.01, (40, 80), 0.1, 120, 256)


# --- the records -----------------------------------------------------------------------------------------------------

def test_the_records_name_the_reweighting_optimisers_and_where_noise_estimator_lives() -> None:
    assert "models.py (NoiseEstimator" in Backward.reference and "noise.py" not in Backward.reference
    trevision = " ".join(TRevision.differences)
    assert "SGD at lr 0.01, momentum 0.9, weight decay 1e-4" in trevision and "[40, 80]" in trevision
    mentornet = " ".join(MentorNetPD.differences)
    assert "MomentumOptimizer (momentum 0.9) at lr 0.1" in mentornet and "39,000" in mentornet
    assert CoTeachingPlus.version >= 2  # its ramp changed: old rows are not reused
