"""Issue 20: every method's fidelity record, and the methods made to follow their authors' released code (DivideMix,
T-revision, MentorNet, VAT, VolMinNet, FW, LCCN, GCE, L_DMI), each against an independent computation."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.cli.main import main
from bench.cli.methods import MEASURED_MARKER
from bench.config import Schedule
from bench.methods import Batch, StageContext, check_params, fidelity_record, registry
from bench.trial import TrialConfig, freeze_params
from tests.methods.conftest import stage_context

REPO = Path(__file__).resolve().parents[2]

# One reference: "owner/repo, a path to a file (path/file.ext, possibly more words), release or commit <id>", the
# commit a hexadecimal id.
REFERENCE = re.compile(r"[\w.-]+/[\w.-]+, [^,;]*[\w-]+/?[\w./-]*\.\w+[^;]*, (release [\w.-]+|commit [0-9a-f]{7,40})")
# What a template or a hurried contributor writes for a citation not yet looked up: a repository named owner/repo
# (or user/, your-, example/, .../project), a commit such as abc1234, 1234567, 0000000 or deadbeef.
PLACEHOLDER = re.compile(r"^(owner|user|username|you|your[\w-]*|example|someone|author|org)/|"
                         r"^[\w.-]+/(repo|repository|project|example|name)\b|"
                         r"commit (abc[0-9a-f]*|0123456[0-9a-f]*|1234567[0-9a-f]*|0{7,}|deadbeef[0-9a-f]*)$", re.I)


def citation_problems(cls: type) -> list[str]:
    """What is wrong with a method's fidelity record: a reference must name a repository, a file in it and a release
    or commit, and be no placeholder; a method that cites none declares itself original (`original = True`), and
    one that does cannot be original too. Each difference says what differs and why ("what — why")."""
    if cls.original:
        problems = [f"{cls.name}: original (no released code) but cites {cls.reference!r}"] if cls.reference else []
    elif not cls.reference:
        problems = [f"{cls.name}: no reference: cite the released code, or declare `original = True`"]
    else:
        problems = [f"{cls.name}: {part!r} is not 'owner/repo, path/file.ext, commit <sha>'"
                    for part in cls.reference.split("; ") if not REFERENCE.fullmatch(part)]
        problems += [f"{cls.name}: {part!r} is a placeholder, not a citation"
                     for part in cls.reference.split("; ") if PLACEHOLDER.search(part)]
    return problems + [f"{cls.name}: {d!r} does not say why (what — why)" for d in cls.differences if " — " not in d]


@pytest.mark.parametrize("name", sorted(registry()))
def test_every_method_names_the_released_code_it_was_checked_against(name: str) -> None:
    """Every registered method (all of them: no exception list) names a repository, a file in it and a release or
    commit, or declares itself original; its differences, if any, each say what differs and why ("what — why")."""
    assert citation_problems(registry()[name]) == []


@pytest.mark.parametrize(("reference", "original", "problem"), [
    ("owner/repo, train.py:40-52, commit abc1234", False, "placeholder"),  # docs/extending.md's switch example's
    ("user/noisy-labels, loss.py, commit 1234567", False, "placeholder"),
    ("someone-real/noisy-labels, loss.py, commit 0000000", False, "placeholder"),
    ("yourname/project, loss.py, release v1", False, "placeholder"),
    ("someone-real/noisy-labels, loss.py, commit <sha>", False, "is not 'owner/repo"),
    ("someone-real/noisy-labels, commit 4d991cedf1", False, "is not 'owner/repo"),  # no file
    ("", False, "no reference"),
    ("someone-real/noisy-labels, loss.py, commit 4d991cedf1", True, "original (no released code) but cites"),
    ("someone-real/noisy-labels, loss.py (f, lines 3-9), commit 4d991cedf1", False, None),
    ("", True, None),
])
def test_a_placeholder_citation_is_refused_unless_the_method_declares_itself_original(reference: str, original: bool,
                                                                                       problem: str | None) -> None:
    cls = type("Sketch", (registry()["ce"],), {"name": "sketch", "reference": reference, "original": original,
                                               "differences": ()})
    problems = citation_problems(cls)
    assert (problems == []) if problem is None else (len(problems) == 1 and problem in problems[0]), problems


def test_docs_fidelity_page_is_the_generated_record(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/fidelity.md is `bench methods --references --markdown` (it cannot drift from the code), then the
    measured figures, written by hand below a marker."""
    assert main(["methods", "--references", "--markdown"]) == 0
    page = capsys.readouterr().out
    assert page == fidelity_record(markdown=True)
    generated, marker, measured = (REPO / "docs" / "fidelity.md").read_text().partition(MEASURED_MARKER)
    assert generated == page, "docs/fidelity.md is stale: regenerate the part above the marker with " \
        "`bench methods --references --update docs/fidelity.md`"
    assert marker and measured.strip(), "docs/fidelity.md: the measured figures follow the generated record"
    for name, cls in registry().items():
        assert f"## `{name}`: {cls.title}" in page


def test_updating_the_page_regenerates_the_record_and_keeps_the_figures_below_the_marker(tmp_path: Path) -> None:
    """The documented command used to be `--markdown > docs/fidelity.md`, which deleted the hand-written half."""
    page = tmp_path / "fidelity.md"
    by_hand = "## Measured\n| r | CE |\n| 0.4 | 52.67 |\n"
    page.write_text("# an old record\n" + MEASURED_MARKER + by_hand)
    assert main(["methods", "--references", "--update", str(page)]) == 0
    assert page.read_text() == fidelity_record(markdown=True) + MEASURED_MARKER + by_hand
    fresh = tmp_path / "new.md"  # a page without a marker yet gets one, with nothing below it
    assert main(["methods", "--references", "--update", str(fresh)]) == 0
    assert fresh.read_text() == fidelity_record(markdown=True) + MEASURED_MARKER
    assert main(["methods", "--update", str(page)]) == 2  # --update formats the record: one line, nothing written
    assert main(["methods", "--references", "--update", str(tmp_path / "no" / "page.md")]) == 2
    assert not (tmp_path / "no").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["fidelity.md", "new.md"]


def test_the_terminal_record_lists_each_method_with_its_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods", "--references"]) == 0
    out = capsys.readouterr().out
    for name, cls in registry().items():
        assert f"{name}  {cls.title}" in out
        assert f"    reference: {cls.reference or ('(none: original)' if cls.original else '(none)')}" in out
        for difference in cls.differences:
            assert f"    - {difference}" in out


def test_markdown_alone_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods", "--markdown"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bench: error: --markdown and --update format the fidelity record: use them with --references"]


def test_dataset_defaults_name_registered_datasets_and_allowed_values() -> None:
    """A per-dataset default is checked like an explicit value, on a dataset that exists; an explicit value wins.
    A dataset's declared method defaults (`Dataset.method_defaults`) name registered methods, pass the same check,
    and replace the method's own for that dataset."""
    from bench.data import registry as datasets

    for name, cls in registry().items():
        for dataset, values in cls.dataset_defaults.items():
            assert dataset in datasets(), (name, dataset)
            assert check_params(cls, values) == values, (name, dataset)
            assert cls(2, dataset=dataset).params == \
                {**cls.defaults, **values, **datasets()[dataset].method_defaults.get(name, {})}
    for dataset, dataset_cls in datasets().items():
        for name, values in dataset_cls.method_defaults.items():
            assert name in registry(), (dataset, name)
            cls = registry()[name]
            assert check_params(cls, values) == values, (dataset, name)
            assert cls(dataset_cls.num_classes, dataset=dataset).params == \
                {**cls.defaults, **cls.dataset_defaults.get(dataset, {}), **values}
            config = TrialConfig(dataset, name, dataset_cls.accepted_noise()[0], 0.2)
            assert {k: v for k, v in config.effective_params().items() if k in values} == values
    vat = registry()["vat"]
    assert vat(2, dataset="cifar10").eps == 8.0 and vat(2, dataset="fashion_mnist").eps == 2.0
    assert vat(2, dataset="fashion_mnist", eps=3.0).eps == 3.0


# --- DivideMix ---------------------------------------------------------------------------------------------

class Recorder(nn.Module):
    """A linear model on flattened images, without dropout, recording each call's input and training mode."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(3 * 8 * 8, 3)
        self.calls: list[tuple[torch.Tensor, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append((x.detach().clone(), self.training))
        return self.linear(x.flatten(1))


class NoMixing:
    """Beta(alpha, alpha) that always draws 1: lambda' = 1, MixMatch leaves every row as it is."""

    def __init__(self, *args: float) -> None: ...

    def sample(self) -> torch.Tensor:
        return torch.tensor(1.0)


def context(n: int, c: int, labels: torch.Tensor, nets: list[nn.Module], **extra) -> StageContext:  # noqa: ANN003
    uniform = torch.full((n, c), 1.0 / c)
    return stage_context(labels, uniform, nets=nets, predict_train_of=lambda k: uniform, **extra)


def test_dividemix_guesses_over_two_augmented_views_with_the_other_network_in_eval_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On image data that the dataset augments, co-refinement and co-guessing average two different random crops and
    flips of each example (the batch's own and a fresh one), on networks without dropout; the other network guesses
    in evaluation mode; MixMatch mixes both views. The loss equals the paper's, computed here from the recorded
    views (lambda' = 1, ramp r = 1 at epoch 20)."""
    from bench.baselines.dividemix import DivideMix, sharpen
    from bench.datasets.cifar10 import random_shift_flip

    torch.manual_seed(0)
    images, y = torch.randn(40, 3, 8, 8), torch.randint(0, 3, (40,))
    def augment(index: torch.Tensor) -> torch.Tensor:
        return random_shift_flip(images[index], 4)
    f, g = Recorder(0), Recorder(1)
    method = DivideMix(3)
    method.setup(context(40, 3, y, [f, g], augment_train=augment))
    method.clean = [torch.rand(40), torch.rand(40)]
    monkeypatch.setattr(torch.distributions, "Beta", NoMixing)
    index = torch.arange(40)
    own_view = augment(index)  # what the loader hands the step
    f.calls.clear()
    g.calls.clear()
    loss = method.train_loss([f, g], Batch(x=own_view, y=y, index=index, epoch=20))

    # f trains first: it guesses on both views in training mode, then mixes; then it is g's "other" (eval mode).
    (v0, f0), (v1, f1), (mixed, f2), (w0, f3), (w1, f4) = f.calls
    assert torch.equal(v0, own_view) and not torch.equal(v0, v1)  # two different augmentations
    assert (f0, f1, f2, f3, f4) == (True, True, True, False, False)
    assert torch.equal(mixed, torch.cat([v0, v1])) and torch.equal(w0, v0) and torch.equal(w1, v1)
    assert [training for _, training in g.calls] == [False, False, True, True, True]

    with torch.no_grad():
        def mean_p(net: Recorder) -> torch.Tensor:
            return (torch.softmax(net.linear(v0.flatten(1)), 1) + torch.softmax(net.linear(v1.flatten(1)), 1)) / 2
        pf, pg = mean_p(f), mean_p(g)
        prior = torch.full((3,), 1 / 3)
        total = 0.0
        for own, p_own, p_other, w in ((f, pf, pg, method.clean[1]), (g, pg, pf, method.clean[0])):
            labelled = w > 0.5
            refined = sharpen(w[:, None] * F.one_hot(y, 3) + (1 - w[:, None]) * p_own, 0.5)
            guessed = sharpen((p_own + p_other) / 2, 0.5)
            targets = torch.where(labelled[:, None], refined, guessed).repeat(2, 1)
            rows = labelled.repeat(2)
            log_q = torch.log_softmax(own.linear(torch.cat([v0, v1]).flatten(1)), 1)
            lx = -(targets * log_q).sum(1)[rows].mean()
            lu = ((log_q.exp() - targets) ** 2).mean(1)[~rows].mean()
            total += lx + 25.0 * lu + (prior * (prior / log_q.exp().mean(0)).log()).sum()
    assert loss.item() == pytest.approx(float(total), rel=1e-5)


def test_dividemix_unlabelled_weight_ramps_from_zero_step_by_step() -> None:
    """The reference's linear_rampup: lambda_u clip((epoch + batch / batches) / 16, 0, 1) after the warm-up."""
    from bench.baselines.dividemix import DivideMix

    y = torch.randint(0, 2, (40,))
    method = DivideMix(2)
    method.setup(context(40, 2, y, [nn.Identity(), nn.Identity()]))
    ramps = [method.rampup(epoch, batch_size=10) for epoch in (0, 1, 15, 16, 17) for _ in range(4)]
    expected = [min(1.0, (epoch + step / 4) / 16) for epoch in (0, 1, 15, 16, 17) for step in range(4)]
    assert ramps == pytest.approx(expected, abs=1e-12)
    assert ramps[0] == 0.0


@pytest.mark.parametrize("groups", ["separated", "overlapping"])
def test_dividemix_mixture_is_sklearns_gaussian_mixture(groups: str) -> None:
    """The co-divide fit equals scikit-learn's GaussianMixture(2, max_iter=10, tol=1e-2, reg_covar=5e-4) (the
    reference's call) to float32 rounding: on two separated loss groups, whose clean group it finds, and on
    overlapping ones where 10 EM steps from a median split do not get there."""
    from bench.baselines.dividemix import clean_probability

    mixture = pytest.importorskip("sklearn.mixture")
    rng = np.random.default_rng(9)
    if groups == "separated":
        losses = np.concatenate([rng.gamma(2.0, 0.05, 700), 2.0 + rng.normal(0, 0.3, 300)])
    else:
        losses = np.concatenate([rng.exponential(0.1, 4000), 1.5 + rng.normal(0, 0.5, 600)])
    x = ((losses - losses.min()) / (losses.max() - losses.min())).reshape(-1, 1)
    gmm = mixture.GaussianMixture(n_components=2, max_iter=10, tol=1e-2, reg_covar=5e-4, random_state=0).fit(x)
    expected = gmm.predict_proba(x)[:, gmm.means_.argmin()]
    w = clean_probability(torch.tensor(losses)).numpy()
    assert w == pytest.approx(expected, abs=1e-6)
    if groups == "separated":
        assert w[:700].mean() > 0.95 and w[700:].mean() < 0.05


def test_augmenter_draws_fresh_views_only_where_the_dataset_augments_tensors() -> None:
    from bench.datasets.cifar10 import CIFAR10, PixelNormalisation
    from bench.datasets.synthetic import Synthetic
    from bench.exec.member import augmenter

    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    cifar = CIFAR10("unused")
    cifar.normalise = PixelNormalisation(images)
    draw = augmenter(SimpleNamespace(dataset=cifar, train=SimpleNamespace(tensor=True, x=images)))
    torch.manual_seed(0)
    a, b = draw(torch.arange(16)), draw(torch.arange(16))
    assert a.shape == (16, 3, 32, 32) and not torch.equal(a, b)
    assert augmenter(SimpleNamespace(dataset=Synthetic("unused"), train=SimpleNamespace(tensor=True, x=images))) is None
    assert augmenter(SimpleNamespace(dataset=cifar, train=SimpleNamespace(tensor=False, x=None))) is None


# --- T-revision ----------------------------------------------------------------------------------------------

T3 = np.array([[0.8, 0.15, 0.05], [0.1, 0.7, 0.2], [0.3, 0.0, 0.7]])


def numpy_revision_loss(logits: np.ndarray, labels: np.ndarray, transition: np.ndarray) -> float:
    """The reference's revision loss in float64: mean_i p_y / (p T)_y * (-log p_y)."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    rows = np.arange(len(labels))
    return float((p[rows, labels] / (p @ transition)[rows, labels] * -np.log(p[rows, labels])).mean())


def test_trevision_revision_loss_differentiates_the_weights() -> None:
    """In the revision phase beta is not detached (their reweighting_revision_loss): the gradients with respect to
    the logits and to T are those of beta * CE as a whole, checked by central differences of a float64 numpy
    transcription (float32 gradients: relative 1e-4)."""
    from bench.baselines.trevision import reweighted_ce

    rng = np.random.default_rng(11)
    logits, labels = rng.normal(size=(12, 3)), rng.integers(0, 3, 12)
    z = torch.tensor(logits, requires_grad=True)
    t = torch.tensor(T3, requires_grad=True)
    reweighted_ce(z, torch.tensor(labels), t, constant_weights=False).backward()
    h = 1e-6
    for x, grad, loss_of in ((logits, z.grad, lambda v: numpy_revision_loss(v, labels, T3)),
                             (T3, t.grad, lambda v: numpy_revision_loss(logits, labels, v))):
        numeric = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            up, down = x.copy(), x.copy()
            up[i] += h
            down[i] -= h
            numeric[i] = (loss_of(up) - loss_of(down)) / (2 * h)
        assert grad.numpy() == pytest.approx(numeric, rel=1e-4, abs=1e-7)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")  # the stage's, never used
def test_trevision_revision_phase_trains_the_network_with_its_own_adam() -> None:
    """Through the stage: in revision epochs the network is stepped by the method's Adam (lr 5e-7, weight decay
    1e-4, with Delta T), never by the stage's optimiser (Adam at the synthetic stage's 1e-3 here). Adam moves each
    weight by at most about lr per step (|m / sqrt(v)| <= (1 - beta1) / sqrt(1 - beta2) ~ 3.2)."""
    from bench.baselines.trevision import TRevision
    from bench.exec.prepare import build_model, prepare
    from bench.exec.stage import SoloStage, predict

    config = TrialConfig("synthetic", "trevision", "case3", 0.3, seed=0, epochs=2, epochs_warmup=1,
                         train_subset=512, method_params=freeze_params({"revision_start": 0.0}))
    p = prepare(config, "unused", log=lambda s: None)
    torch.manual_seed(0)
    net = build_model(p)
    method = TRevision(2, dataset="synthetic", revision_start=0.0)
    method.setup(StageContext(nets=[net], num_classes=2, noisy_train=p.train.labels,
                              predict_train=lambda: torch.softmax(predict(net, p.train_eval), 1),
                              true_transition=None, device=p.device, epochs=2))
    before = [q.detach().clone() for q in net.parameters()]
    stage = SoloStage(p, [net], p.method_stage, 0, method.train_loss, method.validation_loss, method)
    stage.train_epoch(0)
    steps = 512 // p.method_stage.batch_size
    assert not stage.optimizer.state  # the stage's optimiser never stepped
    group = method.optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"]) == (5e-7, 1e-4)
    for q, q0 in zip(net.parameters(), before, strict=True):
        assert int(method.optimizer.state[q]["step"]) == steps
        assert 0 < float((q.detach() - q0).abs().max()) <= 3.2 * steps * 5e-7
    assert method.slack.detach().abs().max() > 0


# --- MentorNet ---------------------------------------------------------------------------------------------

def test_mentornet_threshold_moves_with_the_reference_decay() -> None:
    """lambda_t = 0.5 lambda_{t-1} + 0.5 percentile_70 (the reference's --loss_moving_average_decay and TensorFlow's
    nearest-rank percentile), v = 1[l <= lambda], over three batches."""
    from bench.baselines.mentornet import MentorNetPD

    rng = np.random.default_rng(12)
    method = MentorNetPD(2)
    method.threshold = torch.tensor(1.0)
    lam = 1.0
    for _ in range(3):
        losses = rng.exponential(1.0, 128)
        v = method.weights(torch.tensor(losses, dtype=torch.float32))
        lam = 0.5 * lam + 0.5 * float(np.percentile(losses.astype(np.float32), 70, method="nearest"))
        assert float(method.threshold) == pytest.approx(lam, rel=1e-6)
        assert np.array_equal(v.numpy(), (losses.astype(np.float32) <= np.float32(lam)).astype(np.float32))


# --- VAT -----------------------------------------------------------------------------------------------------

def test_vat_perturbed_passes_leave_batchnorm_statistics_alone() -> None:
    """Only the clean pass moves BatchNorm's running statistics (the reference's update_batch_stats=False for the
    perturbed passes): after a VAT step they are exactly those after one forward pass of the clean batch."""
    import copy

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 3))
    twin = copy.deepcopy(net)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    net.train()
    twin.train()
    registry()["vat"](3).train_loss([net], Batch(x=x, y=y, index=torch.arange(32), epoch=0)).backward()
    with torch.no_grad():
        twin(x)
    norm, expected = net[1], twin[1]
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(norm, name), getattr(expected, name)), name
    assert norm.momentum == 0.1


def test_vat_eps_is_the_datasets_through_the_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer builds the method for the trial's dataset: the dataset's eps (here a marker, 0.25) reaches the
    perturbation, not the class default (8.0, CIFAR-10's); an explicit eps wins."""
    from bench.baselines import vat
    from bench.exec.prepare import prepare
    from bench.exec.trainer import train

    monkeypatch.setattr(vat.VirtualAdversarialTraining, "dataset_defaults", {"synthetic": {"eps": 0.25}})
    used: list[float] = []
    original = vat.adversarial_perturbation

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        used.append(args[4])
        return original(*args, **kwargs)

    monkeypatch.setattr(vat, "adversarial_perturbation", spy)
    for params, eps in (({}, 0.25), ({"eps": 0.5}, 0.5)):
        used.clear()
        config = TrialConfig("synthetic", "vat", "case3", 0.3, seed=0, epochs=1, epochs_warmup=1, train_subset=256,
                             method_params=freeze_params(params))
        train(prepare(config, "unused", log=lambda s: None), log=lambda s: None)
        assert used and set(used) == {eps}


def test_vat_on_text_perturbs_the_words_not_the_padding(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.baselines import vat
    from bench.models import WordCNN

    captured: list[torch.Tensor] = []
    original = vat.adversarial_perturbation

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        captured.append(original(*args, **kwargs))
        return captured[-1]

    monkeypatch.setattr(vat, "adversarial_perturbation", spy)
    torch.manual_seed(0)
    net = WordCNN(2, vocab_size=50)
    tokens = torch.randint(1, 50, (8, 12))
    tokens[:, 7:] = 0  # padding
    tokens[0, 3:] = 0
    registry()["vat"](2).train_loss([net], Batch(x=tokens, y=torch.randint(0, 2, (8,)), index=torch.arange(8),
                                                 epoch=0))
    (r_adv,) = captured
    assert torch.all(r_adv[tokens == 0] == 0) and torch.all(r_adv[tokens != 0].abs().sum(-1) > 0)
    eps = 5.0 * float(net.embedding.weight.detach().std())
    assert r_adv.flatten(1).norm(dim=1).numpy() == pytest.approx(np.full(8, eps), rel=1e-5)


# --- VolMinNet -----------------------------------------------------------------------------------------------

def test_volminnet_t_learning_rate_follows_the_stage_milestones() -> None:
    """T's SGD decays with the classifier's schedule (the reference's scheduler2 shares its milestones): the same
    learning rates as torch's MultiStepLR stepped once an epoch."""
    from bench.baselines.volminnet import VolMinNet

    method = VolMinNet(3)
    schedule = Schedule("sgd", 0.05, epochs=6, batch_size=8, momentum=0.9, milestones=(2, 4), gamma=0.1)
    method.setup(context(4, 3, torch.zeros(4, dtype=torch.int64), [], schedule=schedule))
    reference = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.01)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(reference, [2, 4], 0.1)
    for epoch in range(6):
        method.end_epoch(epoch)
        reference.step()  # no gradient: moves nothing, keeps torch's step order
        scheduler.step()
        assert method.optimizer.param_groups[0]["lr"] == pytest.approx(reference.param_groups[0]["lr"], rel=1e-12)
    assert method.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)


def test_volminnet_selects_by_the_corrected_nll_without_the_volume_term() -> None:
    """The reference's validation loss: -log (p T)_y~ only (the volume penalty is a training term)."""
    from bench.baselines.volminnet import VolMinNet

    rng = np.random.default_rng(13)
    logits, labels = rng.normal(size=(64, 3)), rng.integers(0, 3, 64)
    method = VolMinNet(3, lambda_=1.0)
    method.setup(context(64, 3, torch.tensor(labels), []))
    t = method.estimated_transition()
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    nll = -np.log((p @ t)[np.arange(64), labels]).mean()
    with torch.no_grad():
        value = float(method.validation_loss(torch.tensor(logits, dtype=torch.float32), torch.tensor(labels)))
        training = float(method.loss(torch.tensor(logits, dtype=torch.float32), torch.tensor(labels)))
    assert value == pytest.approx(nll, rel=1e-5)
    assert abs(training - nll) > 0.1


# --- FW ------------------------------------------------------------------------------------------------------

def patrini_anchor_rows(probs: np.ndarray, filter_outlier: bool) -> np.ndarray:
    """Patrini et al.'s NoiseEstimator.fit (giorgiop/loss-correction, models.py), per class on its own column."""
    rows = []
    for i in range(probs.shape[1]):
        column = probs[:, i].copy()
        if filter_outlier:
            column[column >= np.percentile(column, 97, method="higher")] = 0.0
        rows.append(probs[np.argmax(column)])
    return np.array(rows)


def test_fw_takes_the_arg_max_anchors_of_the_paper_scripts() -> None:
    from bench.baselines.fw import Forward

    probs = np.random.default_rng(14).dirichlet(np.ones(4) * 0.5, size=700)
    method = Forward(4)
    method.setup(StageContext(nets=[], num_classes=4, noisy_train=torch.zeros(700, dtype=torch.int64),
                              predict_train=lambda: torch.tensor(probs), true_transition=None,
                              device=torch.device("cpu"), epochs=1))
    assert method.estimated_transition() == pytest.approx(patrini_anchor_rows(probs, False), abs=0)


@pytest.mark.parametrize("n", [81, 500, 1001, 4000])
def test_fw_quantile_below_one_is_patrinis_outlier_filter(n: int) -> None:
    from bench.baselines.fw import anchor_transition

    probs = np.random.default_rng(n).dirichlet(np.ones(3) * 0.5, size=n)
    estimate = anchor_transition(torch.tensor(probs), 0.97).numpy()
    assert estimate == pytest.approx(patrini_anchor_rows(probs, True), abs=0)


# --- LCCN ----------------------------------------------------------------------------------------------------

def test_lccn_samples_with_the_initial_phi_for_warmup_steps_then_the_counts_phi_of_every_update(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Step s samples with phi_0 while s < warmup_steps, afterwards with the counts' posterior mean as it was at
    the last multiple of update_every (the references' step loop), here warm-up 3 steps and updates every 2."""
    from bench.baselines import lccn

    torch.manual_seed(0)
    n, c = 60, 3
    x, labels = torch.randn(n, 5), torch.randint(0, c, (n,))
    net = nn.Linear(5, c)
    method = lccn.LCCN(c, update_every=2, warmup_steps=3)
    with torch.no_grad():
        probs = torch.softmax(net(x), 1)
    method.setup(StageContext(nets=[net], num_classes=c, noisy_train=labels, predict_train=lambda: probs,
                              true_transition=None, device=torch.device("cpu"), epochs=1))
    used: list[torch.Tensor] = []
    original = lccn.sample_latent
    monkeypatch.setattr(lccn, "sample_latent", lambda p, y, t: (used.append(t.clone()), original(p, y, t))[1])
    posteriors = []
    for _ in range(8):
        counts = method.counts() + 1.0  # alpha = 1
        posteriors.append(counts / counts.sum(1, keepdim=True))
        idx = torch.randperm(n)[:16]
        method.train_loss([net], Batch(x=x[idx], y=labels[idx], index=idx, epoch=0))
    for step, t in enumerate(used):
        expected = posteriors[0] if step < 3 else posteriors[step - step % 2]
        assert torch.equal(t, expected), step
    assert lccn.LCCN(c, dataset="mr").params == {"alpha": 1.0, "update_every": 100, "warmup_steps": 1000}


# --- L_DMI ---------------------------------------------------------------------------------------------------

def test_dmi_and_the_paper_scripts_loss_differ_by_c_log_n_and_their_1e3() -> None:
    """The scripts' -log(|det(onehot^T softmax)| + 1e-3), in float64 here: |det(onehot^T softmax)| = N^C |det U|,
    so it is -log(N^C exp(-ours) + 1e-3), and its gradient is ours scaled by d / (d + 1e-3), d = N^C |det U|."""
    from bench.dmi import dmi_loss

    rng = np.random.default_rng(15)
    n, c = 128, 4
    logits = torch.tensor(rng.normal(size=(n, c)) * 2, requires_grad=True)
    labels = torch.tensor(np.arange(n) % c)
    ours = dmi_loss(logits, labels, c)
    (grad_ours,) = torch.autograd.grad(ours, logits)
    onehot = F.one_hot(labels, c).double()
    script = -torch.log(torch.abs(torch.det(onehot.t() @ torch.softmax(logits, 1))) + 0.001)
    (grad_script,) = torch.autograd.grad(script, logits)
    d = np.exp(c * np.log(n) - float(ours.detach()))
    assert float(script.detach()) == pytest.approx(-np.log(d + 1e-3), rel=1e-12)
    assert grad_script.numpy() == pytest.approx(grad_ours.numpy() * d / (d + 1e-3), rel=1e-9, abs=1e-15)


def test_dividemix_divides_on_the_losses_averaged_over_loss_history_epochs() -> None:
    """loss_history = 3: each network's division is fitted to its normalised losses averaged over the last 3
    divisions (the reference's history[-5:].mean(0) at r = 0.9), here against the mixture of that mean."""
    from bench.baselines.dividemix import DivideMix, fit_mixture

    rng = np.random.default_rng(16)
    y = torch.tensor(rng.integers(0, 2, 300))
    rounds = [torch.tensor(rng.dirichlet([1.0, 1.0], size=300)) for _ in range(5)]
    served = iter(rounds)
    current: list[torch.Tensor] = []

    def predict(k: int) -> torch.Tensor:
        if k == 0:
            current[:] = [next(served)]
        return current[0]

    method = DivideMix(2, loss_history=3)
    method.setup(StageContext(nets=[], num_classes=2, noisy_train=y, predict_train=lambda: rounds[0],
                              true_transition=None, device=torch.device("cpu"), epochs=4, predict_train_of=predict))
    for epoch in range(4):
        method.end_epoch(epoch)
    losses = [-np.log(p.numpy()[np.arange(300), y.numpy()]) for p in rounds]
    norm = [(v - v.min()) / (v.max() - v.min()) for v in losses]
    expected = fit_mixture(torch.tensor(np.mean(norm[2:], axis=0)))
    assert method.clean[0].numpy() == pytest.approx(expected.numpy(), abs=1e-7)
    assert len(method.history[0]) == 3
