"""No wrong label reaches training: every registered dataset x every noise is accepted or refused in one line by the
driver's checks; every real-world set, on tiny files in its published layout, trains with every noise it offers and
refuses every other in one line (`bench trial`, exit 2); each trains with every image network `--model` names or
refuses it in one line; and the one boundary check (`bench.noise.check_labels`) refuses any label outside [0, C),
even where a dataset's declaration would let one through."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import yaml

from bench import models, noise
from bench.cli.main import main
from bench.config import UserError
from bench.data import get_dataset, registry
from bench.datasets.image_files import ImageCrops
from bench.exec.prepare import draw_labels, load_data
from bench.trial import TrialConfig
from tests.datasets.test_cifar10_dogs_vs_cats_clothing1m import write_clothing
from tests.datasets.test_realworld import tiny_network, write_animal10n, write_food101n, write_red, write_webvision

REAL_WORLD = ("animal10n", "food101n", "webvision_mini", "webvision_mini_ilsvrc12", "red_mini_imagenet", "clothing1m")
EVERY_NOISE = sorted({*noise.GENERIC_PATTERNS, *(p for ds in registry().values() for p in ds.noise_patterns)})
# The image networks, each with the options that make it small on a CPU.
IMAGE_NETWORKS = {"resnet18_cifar": ["width=4"], "resnet34_cifar": ["width=4"], "vgg16_bn": ["width=4"],
                  "vgg19_bn": ["width=4"], "resnet50": [], "linear_probe": ["backbone=resnet18", "weights=random"]}
OTHER_OPTIONS = {"mlp": ["hidden=4"]}


def r_for(dataset: str, pattern: str) -> float:
    levels = get_dataset(dataset).noise_levels.get(pattern)
    return levels[6] if levels else (0.0 if get_dataset(dataset).is_real_noise(pattern) else 0.2)


def transition_file(root: Path, classes: int) -> Path:
    path = root / f"t{classes}.csv"
    t = noise.uniform(0.3, classes)
    path.write_text("\n".join(",".join(f"{v:.17g}" for v in row) for row in t) + "\n")
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every real-world set's tiny files in their published layouts, side by side under one data root."""
    root = tmp_path_factory.mktemp("realworld")
    write_animal10n(root)
    write_food101n(root)
    write_webvision(root)
    write_red(root)
    write_clothing(root)
    return root


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("BENCH_RESNET50_WEIGHTS", raising=False)
    monkeypatch.setenv("BENCH_CACHE", str(tmp_path / "cache"))


def trial_args(root: Path, dataset: str, pattern: str, results: Path, *extra: str) -> list[str]:
    args = ["trial", "--dataset", dataset, "--method", "ce", "--noise", pattern, "--r", str(r_for(dataset, pattern)),
            "--epochs-warmup", "1", "--epochs", "1", "--batch-size", "4", "--data-root", str(root),
            "--results", str(results), *extra]
    if pattern == "transition":
        args += ["--transition", str(transition_file(results.parent, get_dataset(dataset).num_classes))]
    return args


def one_row(results: Path) -> dict:
    (path,) = (results / "trials").glob("*.parquet")
    return pl.read_parquet(path).row(0, named=True)


def refused_in_one_line(code: int, capsys: pytest.CaptureFixture[str], results: Path) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("bench: error: "), err
    assert not (results / "trials").exists()  # nothing written
    return err


@pytest.mark.parametrize("dataset", sorted(registry()))
def test_every_dataset_accepts_or_refuses_every_noise_in_one_line(dataset: str) -> None:
    """The driver's checks (`bench run`, its --dry-run, `bench trial`): a set without clean labels offers its own
    (real) noise only, and names it; every other refusal is one line too."""
    cls = get_dataset(dataset)
    for pattern in EVERY_NOISE:
        t = tuple(map(tuple, noise.uniform(0.3, cls.num_classes))) if pattern == "transition" else None
        config = TrialConfig(dataset, "ce", pattern, r_for(dataset, pattern), transition=t)
        if pattern in cls.accepted_noise():
            config.check()
            continue
        with pytest.raises(UserError) as info:
            config.check()
        assert "\n" not in str(info.value) and ", ".join(cls.accepted_noise()) in str(info.value)
    if not cls.clean_labels:
        assert all(cls.is_real_noise(p) for p in cls.accepted_noise())


def test_the_dry_run_refuses_synthetic_noise_on_a_set_without_clean_labels(tmp_path: Path, capsys) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"name": "x", "dataset": "animal10n", "noise": "uniform", "r": [0.2],
                                    "seeds": 1, "methods": {"ce": {}}}))
    code = main(["run", str(grid), "--dry-run", "--results", str(tmp_path / "results")])
    err = refused_in_one_line(code, capsys, tmp_path / "results")
    assert "uniform" in err and "real" in err


@pytest.mark.parametrize("dataset", REAL_WORLD)
def test_each_real_world_set_trains_every_noise_it_offers_and_refuses_the_others(
        dataset: str, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    cls = get_dataset(dataset)
    tiny_network(monkeypatch, cls)  # the pipeline is under test, not the network (the next test varies it)
    trained = []
    for pattern in EVERY_NOISE:
        results = tmp_path / f"results-{pattern}"
        code = main(trial_args(root, dataset, pattern, results))
        if pattern not in cls.accepted_noise():
            assert pattern in refused_in_one_line(code, capsys, results)
            continue
        assert code == 0, capsys.readouterr().err
        row = one_row(results)
        assert row["status"] == "ok" and row["noise"] == pattern
        # The labels it trained on, drawn again: every one a class of the set.
        config = TrialConfig(dataset, "ce", pattern, r_for(dataset, pattern), transition=(
            tuple(map(tuple, noise.uniform(0.3, cls.num_classes))) if pattern == "transition" else None))
        ds, splits = load_data(config, root)
        labels = draw_labels(config, ds, splits.for_noise(pattern, config.r))
        assert labels.noise_hash == row["noise_hash"]
        for drawn in (labels.train, labels.val):
            assert drawn.min() >= 0 and drawn.max() < cls.num_classes
        trained.append(pattern)
    assert trained == sorted(cls.accepted_noise())


@pytest.fixture
def small_crops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Food-101N's and Clothing1M's ResNet-50 weights set (random ones, saved); the sets' crops made small (36
    pixels) so that ResNet-50 and the VGGs run in seconds on a CPU: the files and the code paths stay the published
    ones."""
    import torchvision

    import bench.datasets.clothing1m as clothing

    weights = tmp_path / "resnet50.pth"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.save(torchvision.models.resnet50().state_dict(), weights)
    monkeypatch.setenv("BENCH_RESNET50_WEIGHTS", str(weights))
    for cls in registry().values():
        if issubclass(cls, ImageCrops) and cls.crop > 64:
            monkeypatch.setattr(cls, "stored", 40)
            monkeypatch.setattr(cls, "crop", 36)
    monkeypatch.setattr(clothing, "STORED", 40)
    monkeypatch.setattr(clothing, "CROP", 36)


@pytest.mark.parametrize("dataset", REAL_WORLD)
def test_every_network_takes_each_real_world_set_or_is_refused_in_one_line(dataset: str, root: Path,
                                                                            small_crops: None) -> None:
    """`--model` with each registered network, the set's own noise: the trial is prepared and its network built and
    run on a training batch, or it is refused in one line before any label is drawn. The next test trains them."""
    from bench.exec.prepare import build_model, prepare

    cls = get_dataset(dataset)
    (pattern,) = cls.noise_patterns
    ok, refused = [], []
    for model in sorted(models.registry()):
        options = IMAGE_NETWORKS.get(model, OTHER_OPTIONS.get(model, []))
        config = TrialConfig(dataset, "ce", pattern, r_for(dataset, pattern), model=model,
                             model_args=tuple((k, int(v) if v.isdigit() else v)
                                             for k, v in (o.split("=") for o in options)))
        try:
            p = prepare(config, root, log=lambda s: None)
        except UserError as e:
            assert "\n" not in str(e) and f"--model {model} cannot take {dataset}'s inputs" in str(e), e
            refused.append(model)
            continue
        x, y, _ = next(p.train.batches(4, train=True, generator=torch.Generator().manual_seed(0)))
        assert build_model(p)(x).shape == (len(y), cls.num_classes)
        ok.append(model)
    assert set(IMAGE_NETWORKS) <= set(ok)
    assert {"fashion_cnn", "mlp", "word_cnn"} <= set(refused)  # one grey channel, vectors, tokens


@pytest.mark.parametrize(("dataset", "model"), [
    ("animal10n", "resnet18_cifar"), ("food101n", "resnet34_cifar"), ("webvision_mini", "vgg19_bn"),
    ("red_mini_imagenet", "vgg16_bn"), ("clothing1m", "linear_probe"), ("webvision_mini_ilsvrc12", "resnet50")])
def test_the_overrides_that_crashed_train(dataset: str, model: str, root: Path, tmp_path: Path, small_crops: None,
                                          capsys) -> None:
    """Each image network trains 1 + 1 epochs on one set (the three that crashed first); a network other than the
    set's ResNet-50 does not take its weights, and says so."""
    (pattern,) = get_dataset(dataset).noise_patterns
    results = tmp_path / "results"
    code = main(trial_args(root, dataset, pattern, results, "--model", model, "--train-subset", "8",
                           *(arg for option in IMAGE_NETWORKS[model] for arg in ("--model-arg", option))))
    out = capsys.readouterr()
    assert code == 0, out.err
    assert one_row(results)["status"] == "ok"
    if dataset in ("food101n", "clothing1m") and model not in ("resnet50", "linear_probe"):  # the probe: its own
        assert f"not {model}'s: {model} starts from random weights" in out.out


def test_the_boundary_refuses_any_label_outside_the_classes() -> None:
    t = noise.uniform(0.2, 3)
    good = np.array([0, 1, 2, 0])
    for bad in (np.array([0, 1, -1, 2]), np.array([0, noise.WRONG, 1, 2]), np.array([0, 1, 3, 2])):
        for draw in (lambda b: noise.inject("d", "uniform", 0.2, 0, b, good, t),
                     lambda b: noise.inject("d", "uniform", 0.2, 0, good, b, t),
                     lambda b: noise.inject_as_script(0, b, good, t),
                     lambda b: noise.summarise(good, b, good, 3, None),
                     lambda b: noise.summarise(good, good, b, 3, None)):
            with pytest.raises(UserError, match=r"labels lie outside \[0, 3\)") as info:
                draw(bad)
            assert "\n" not in str(info.value)
    # Unknown clean labels are no noisy labels: human noise on them passes (rate: 1 of the 2 known flipped, and the
    # one known wrong, of 3).
    human = np.array([0, 1, 1, 0])
    assert noise.summarise(np.array([-1, noise.WRONG, 1, 2]), human, good, 3, None).noise_rate == pytest.approx(2 / 3)


def test_the_boundary_holds_where_a_declaration_would_let_a_wrong_label_through(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """ANIMAL-10N declared, wrongly, to have clean labels: uniform noise passes the driver's checks and is refused
    where the labels are drawn (its clean labels are all -1), before anything trains."""
    cls = get_dataset("animal10n")
    monkeypatch.setattr(cls, "clean_labels", True)
    monkeypatch.setattr(cls, "instance_noise", False)
    tiny_network(monkeypatch, cls)
    results = tmp_path / "results"
    code = main(trial_args(root, "animal10n", "uniform", results))
    err = refused_in_one_line(code, capsys, results)
    assert "labels lie outside [0, 10)" in err and "first: -1" in err
