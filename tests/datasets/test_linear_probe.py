"""The frozen-feature baseline (`bench.features`): a linear head on a frozen torchvision backbone whose features are
computed once per (dataset, split, backbone, weights) and cached. On tiny CIFAR-10N files: the second trial (another
method) does not run the backbone again and trains on features equal to a fresh computation; the row marks random
weights; other weights are another cache entry; bad options are one line; the trial can pack."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from PIL import Image

from bench import features
from bench.cli.main import main
from bench.config import UserError
from bench.data import get_dataset
from bench.datasets.cifar10n import CIFAR10N
from bench.download import file_md5
from bench.exec.packing import pack_key, why_solo
from bench.trial import TrialConfig

PROBE = ["--model", "linear_probe", "--model-arg", "backbone=resnet18", "--model-arg", "weights=random"]


@pytest.fixture
def tiny(tiny_cifar: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """CIFAR-10 batches of 20 images with CIFAR-10N labels; the feature cache in the same folder."""
    monkeypatch.setenv("BENCH_CACHE", str(tiny_cifar / "cache"))
    return tiny_cifar


@pytest.fixture
def forwards(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of images each backbone forward pass saw, in order."""
    seen: list[int] = []
    real = features.build_backbone

    def counted(name: str, weights: str) -> torch.nn.Module:
        net = real(name, weights)
        net.register_forward_hook(lambda _m, args, _out: seen.append(len(args[0])))
        return net

    monkeypatch.setattr(features, "build_backbone", counted)
    return seen


def trial(root: Path, method: str, *extra: str) -> dict:
    results = root / f"results-{method}-{len(extra)}"
    assert main(["trial", "--dataset", "cifar10n", "--method", method, "--noise", "worse", "--r", "0",
                 "--epochs-warmup", "1", "--epochs", "1", "--batch-size", "16", "--data-root", str(root),
                 "--results", str(results), *PROBE, *extra]) == 0
    (path,) = (results / "trials").glob("*.parquet")
    return pl.read_parquet(path).row(0, named=True)


def test_second_trial_reuses_the_cached_features(tiny: Path, forwards: list[int]) -> None:
    first = trial(tiny, "ce")
    # Every image of the three splits went through the backbone once: 80 training, 20 validation, 20 test.
    assert sum(forwards) == 120 and first["status"] == "ok"
    assert first["model"] == "linear_probe(backbone=resnet18, weights=random)"  # random weights, marked
    cached = sorted((tiny / "cache" / "features").glob("*.npy"))
    assert len(cached) == 3
    forwards.clear()
    second = trial(tiny, "gce")
    assert forwards == [] and second["status"] == "ok"  # no backbone forward pass at all
    assert first["trial_id"] != second["trial_id"]

    # The cached training features equal a fresh computation: the same backbone on the dataset's evaluation
    # transform of the training images (the same shapes and operations: equal up to the kernels' float order).
    ds = get_dataset("cifar10n")(tiny)
    splits = ds.load()
    fresh = features.build_backbone("resnet18", "random")(ds.eval_transform(splits.train.x))
    (train_file,) = [p for p in cached if "-train-" in p.name]
    torch.testing.assert_close(torch.from_numpy(np.load(train_file)), fresh)
    assert fresh.shape == (80, 512)


def test_weights_file_is_its_own_cache_entry_and_bad_options_are_one_line(tiny: Path, forwards, capsys) -> None:
    import torchvision

    trial(tiny, "ce")
    weights = tiny / "r18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), weights)  # other weights than the random ones (seed 0)
    forwards.clear()
    row = trial(tiny, "ce", "--model-arg", f"weights={weights}")  # the later flag wins
    assert sum(forwards) == 120  # not the random weights' features: computed, and cached beside them
    assert len(list((tiny / "cache" / "features").glob("*.npy"))) == 6
    assert row["model"] == f"linear_probe(backbone=resnet18, weights={weights})"
    # A checkpoint without the classification head (a self-supervised one) loads; one of another network does not.
    headless = {k: v for k, v in torchvision.models.resnet18().state_dict().items() if not k.startswith("fc.")}
    torch.save(headless, weights)
    assert features.build_backbone("resnet18", str(weights))(torch.zeros(1, 3, 32, 32)).shape == (1, 512)
    torch.save(torchvision.models.resnet34().state_dict(), weights)
    with pytest.raises(UserError, match=r"r18\.pth is not a torchvision resnet18 state dict"):
        features.build_backbone("resnet18", str(weights))

    for args, message in (
        (["--model-arg", "weights=/no/such.pth"], "no weights file at /no/such.pth"),
        (["--model-arg", "backbone=resnet9000"], "unknown backbone 'resnet9000'"),
        (["--model-arg", "depth=3"], "model linear_probe takes no option 'depth'"),
    ):
        code = main(["trial", "--dataset", "cifar10n", "--method", "ce", "--noise", "worse", "--r", "0",
                     "--data-root", str(tiny), "--results", str(tiny / "bad"), *PROBE, *args])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and message in err, err
        assert not (tiny / "bad" / "trials").exists()


def test_probe_trials_pack_by_backbone() -> None:
    probe = TrialConfig("cifar10n", "ce", "worse", 0.0, model="linear_probe",
                        model_args=(("backbone", "resnet18"), ("weights", "random")))
    assert why_solo(probe) is None
    other = TrialConfig("cifar10n", "dmi", "worse", 0.0, model="linear_probe",
                        model_args=(("backbone", "resnet50"), ("weights", "random")))
    assert pack_key(probe) != pack_key(other)  # different features: never one pack
    # The default network's trial is the trial it always was.
    plain = TrialConfig("cifar10n", "ce", "worse", 0.0)
    assert plain.identity()["model"] == "resnet34_cifar" and "model_args" not in plain.identity()
    assert probe.identity()["model"] == "linear_probe" and probe.trial_id != plain.trial_id


def test_a_changed_probe_is_another_trial_warm_start_and_feature_file(tiny: Path, monkeypatch) -> None:
    """`LinearProbe.version` (2: CLIP's QuickGELU, DINOv2's own interpolation of positions) is in the trial id, the
    warm start's key and the features' file names: rows, warm starts and features of the older backbones are not
    reused; a network at version 1 (every other) keeps the id and key it always had."""
    from bench.exec.prepare import prepare, warm_start_key

    def made() -> tuple[str, str, list[str]]:
        config = TrialConfig("cifar10n", "ce", "worse", 0.0, model="linear_probe",
                             model_args=(("backbone", "resnet18"), ("weights", "random")))
        p = prepare(config, tiny, log=lambda s: None)
        return config.trial_id, warm_start_key(p, 0), sorted(f.name for f in cached(tiny))

    assert features.LinearProbe.version == 2
    assert TrialConfig("cifar10n", "ce", "worse", 0.0).identity()["versions"] == [CIFAR10N.version, 1]
    now = made()
    monkeypatch.setattr(features.LinearProbe, "version", 1)
    before = made()
    assert now[0] != before[0] and now[1] != before[1]
    # The train, validation and test features of version 2, then three more files of version 1 beside them.
    assert len(now[2]) == 3 and len(set(before[2]) - set(now[2])) == 3


def test_instance_dependent_noise_is_drawn_on_the_inputs_not_the_features(tiny: Path, forwards) -> None:
    from bench.exec.prepare import prepare

    args = dict(dataset="cifar10", method="ce", noise="idn", r=0.3, seed=1)
    plain = prepare(TrialConfig(**args), tiny, log=lambda s: None)
    probe = prepare(TrialConfig(**args, model="linear_probe", model_args=(("backbone", "resnet18"),
                                                                          ("weights", "random"))), tiny,
                    log=lambda s: None)
    assert probe.train.x.shape == (80, 512) and plain.train.x.shape == (80, 3, 32, 32)  # it trains on features
    assert probe.labels.noise_hash == plain.labels.noise_hash  # the same noisy labels as every other network's
    np.testing.assert_array_equal(probe.labels.train, plain.labels.train)


def test_probe_trials_train_as_one_pack_as_they_do_alone(tiny: Path) -> None:
    from bench.exec.pack import run_pack
    from bench.exec.trainer import run_trial
    from tests.tolerances import trained_close

    probe = dict(model="linear_probe", model_args=(("backbone", "resnet18"), ("weights", "random")))
    configs = [TrialConfig("cifar10n", method, "worse", 0.0, seed=seed, epochs=2, epochs_warmup=1, batch_size=16,
                           lr=0.01, **probe) for method, seed in (("ce", 0), ("ce", 1), ("dmi", 0))]
    packed = run_pack(configs, tiny, log=lambda s: None)
    for row, config in zip(packed, configs, strict=True):
        solo = run_trial(config, tiny, log=lambda s: None)
        assert (row["status"], row["executor"], solo["executor"]) == ("ok", "pack", "solo")
        # Grouped against single linear layers: the float order of one training (tests/tolerances.py).
        assert trained_close(row["val_loss"], solo["val_loss"]), (row["val_loss"], solo["val_loss"])


def test_experiment_files_name_their_network_and_levels_in_one_line(tmp_path: Path) -> None:
    import yaml

    from bench.grid.files import load_experiment

    base = {"name": "x", "dataset": "cifar10n", "noise": "worse", "r": [0.0], "seeds": 1, "methods": {"ce": {}}}
    for change, message in (
        ({"model_args": {"backbone": "resnet18"}}, "model_args.*options of which network\\? set model too"),
        ({"model": "linear_probe", "model_args": {"depth": 3}}, "model linear_probe takes no option 'depth'"),
        ({"model": "no_such_net"}, "no_such_net"),
        ({"model": "linear_probe", "model_args": {"backbone": ["resnet18", "resnet50"]}},
         "option 'backbone' must be a single value"),
        ({"dataset": "red_mini_imagenet", "noise": "red", "r": [0.2, 0.25]},
         "r.*noise 'red' comes at its published levels only.*got r = 0.25"),
    ):
        path = tmp_path / "x.yaml"
        path.write_text(yaml.safe_dump({**base, **change}))
        with pytest.raises(UserError, match=message) as info:
            load_experiment(path)
        assert "\n" not in str(info.value)
    path.write_text(yaml.safe_dump({**base, "model": "linear_probe",
                                    "model_args": {"backbone": "resnet18", "weights": "random"}}))
    (trial,) = load_experiment(path).trials()
    assert trial.model_label() == "linear_probe(backbone=resnet18, weights=random)"


def test_probe_extracts_only_the_red_level_a_trial_asks_for(tmp_path: Path, monkeypatch, forwards) -> None:
    from tests.datasets.test_realworld import write_red

    write_red(tmp_path)  # ten levels of 30 images (27 train, 3 validation) and 10 test images
    monkeypatch.setenv("BENCH_CACHE", str(tmp_path / "cache"))
    assert main(["trial", "--dataset", "red_mini_imagenet", "--method", "ce", "--noise", "red", "--r", "0.4",
                 "--epochs-warmup", "1", "--epochs", "1", "--batch-size", "8", "--data-root", str(tmp_path),
                 "--results", str(tmp_path / "results"), *PROBE]) == 0
    assert sum(forwards) == 30 + 10 + 30  # the clean level 0 (the base splits), the test set, level 0.4: not ten
    (row,) = [pl.read_parquet(p).row(0, named=True) for p in (tmp_path / "results" / "trials").glob("*.parquet")]
    assert (row["status"], row["r"]) == ("ok", 0.4) and row["noise_rate"] > 0  # level 0.4's web images, not level 0


def test_a_weights_files_md5_is_in_the_trial_id_the_row_and_mlflow(tiny: Path, monkeypatch) -> None:
    """The probe's weights file and Food-101N's $BENCH_RESNET50_WEIGHTS: by content, not by name."""
    import os

    import torchvision
    from mlflow import MlflowClient

    from bench.store.mirror import Mirror

    weights = tiny / "r18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), weights)
    row = trial(tiny, "ce", "--model-arg", f"weights={weights}")
    md5 = file_md5(weights)
    assert row["weights"] == f"weights={md5}" and f'"weights": {{"weights": "{md5}"}}' in row["config_json"]
    config = TrialConfig("cifar10n", "ce", "worse", 0.0, epochs_warmup=1, epochs=1, batch_size=16,
                         model="linear_probe", model_args=(("backbone", "resnet18"), ("weights", str(weights))))
    assert config.trial_id == row["trial_id"]
    mirror = Mirror(f"sqlite:///{tiny / 'mlflow.db'}", tiny / "results")
    assert mirror.log_row(row)
    (run,) = MlflowClient(f"sqlite:///{tiny / 'mlflow.db'}").search_runs(
        [mirror.experiment_id(row["experiment"])], f"tags.`bench.trial_id` = '{row['trial_id']}'")
    assert run.data.params["weights"] == f"weights={md5}"
    # Other weights in the same file: another trial.
    torch.save(torchvision.models.resnet18(num_classes=7).state_dict(), weights)
    os.utime(weights, ns=(1, 1))  # even with an old modification time
    changed = dataclasses.replace(config)  # the same fields, its identity computed afresh
    assert changed.weights() == {"weights": file_md5(weights)} != {"weights": md5}
    assert changed.trial_id != config.trial_id

    # Food-101N's ResNet-50 from $BENCH_RESNET50_WEIGHTS: by the file's content, wherever it lies.
    def food(model: str | None = None) -> TrialConfig:
        return TrialConfig("food101n", "ce", "real", 0.0, model=model)

    monkeypatch.delenv("BENCH_RESNET50_WEIGHTS", raising=False)
    scratch = food()
    assert scratch.weights() == {} and "weights" not in scratch.identity() and scratch.trial_id
    monkeypatch.setenv("BENCH_RESNET50_WEIGHTS", str(weights))
    imagenet = food()
    assert imagenet.weights() == {"weights": file_md5(weights)} and imagenet.trial_id != scratch.trial_id
    moved = tiny / "elsewhere.pth"
    moved.write_bytes(weights.read_bytes())
    monkeypatch.setenv("BENCH_RESNET50_WEIGHTS", str(moved))
    assert food().trial_id == imagenet.trial_id  # the same bytes under another name: the same trial
    moved.write_bytes(b"other bytes")
    assert food().trial_id not in (imagenet.trial_id, scratch.trial_id)
    # A network that does not read them is the trial it is without them.
    with_weights = food("resnet34_cifar")
    monkeypatch.delenv("BENCH_RESNET50_WEIGHTS")
    assert with_weights.weights() == {} and with_weights.trial_id == food("resnet34_cifar").trial_id


def cached(root: Path) -> list[Path]:
    return sorted((root / "cache" / "features").glob("*.npy"))


def test_a_changed_image_transform_or_protocol_extracts_again(tmp_path: Path, monkeypatch, forwards, capsys) -> None:
    """On a streamed set (images decoded once), the cache is keyed by what made the features: an image changed in
    place (blackened, same name), the dataset's evaluation transform, the trial's protocol switches; an image that
    cannot be decoded is one line naming it."""
    from bench.datasets import image_files
    from tests.datasets.test_realworld import write_animal10n

    write_animal10n(tmp_path)
    monkeypatch.setenv("BENCH_CACHE", str(tmp_path / "cache"))
    args = ["trial", "--dataset", "animal10n", "--method", "ce", "--noise", "real", "--r", "0", "--epochs-warmup",
            "1", "--epochs", "1", "--batch-size", "8", "--data-root", str(tmp_path), *PROBE]
    assert main([*args, "--results", str(tmp_path / "r1")]) == 0
    # The 36 + 4 training and validation images and the 10 test images, decoded once.
    assert sum(forwards) == 50 and len(cached(tmp_path)) == 3
    forwards.clear()
    test_image = tmp_path / "animal10n" / "testing" / "3_00003.jpg"
    Image.new("RGB", (64, 64)).save(test_image)  # blackened in place
    assert main([*args, "--results", str(tmp_path / "r2")]) == 0
    assert forwards == [10]  # the test split alone, again
    forwards.clear()
    # Another normalisation: every split again.
    monkeypatch.setattr(image_files, "IMAGENET_MEAN", (0.5, 0.5, 0.5))
    assert main([*args, "--results", str(tmp_path / "r3")]) == 0
    assert sum(forwards) == 50 and len(cached(tmp_path)) == 3 + 1 + 3
    forwards.clear()
    assert main([*args, "--results", str(tmp_path / "r4")]) == 0
    assert forwards == []  # nothing changed since: all from the cache
    (tmp_path / "cache").rename(tmp_path / "old-cache")  # a fresh cache: the images are read again
    (tmp_path / "animal10n" / "testing" / "3_00003.jpg").write_bytes(b"not a jpeg")
    capsys.readouterr()
    assert main([*args, "--results", str(tmp_path / "r5")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "animal10n: cannot decode" in err and "3_00003.jpg" in err, err


def test_the_protocols_transform_is_its_own_cache_entry(tiny: Path, forwards) -> None:
    """CIFAR-10 under `bench+script_transform` normalises as the script did: its features are not bench's."""
    def run(protocol: str, results: str) -> None:
        assert main(["trial", "--dataset", "cifar10", "--method", "ce", "--noise", "uniform", "--r", "0.2",
                     "--epochs-warmup", "1", "--epochs", "1", "--batch-size", "16", "--data-root", str(tiny),
                     "--results", str(tiny / results), "--protocol", protocol, *PROBE]) == 0

    run("bench", "a")
    assert sum(forwards) == 120
    forwards.clear()
    run("bench+script_transform", "b")
    assert sum(forwards) == 120 and len(cached(tiny)) == 6
    forwards.clear()
    run("bench", "c")
    assert forwards == []


def test_a_damaged_cache_file_is_set_aside_and_recomputed(tiny: Path, forwards, capsys) -> None:
    trial(tiny, "ce")
    (train_file,) = [p for p in cached(tiny) if "-train-" in p.name]
    good = np.load(train_file)
    assert train_file.stat().st_mode & 0o040  # readable by the owner's group: a shared cache
    for damage in (b"", train_file.read_bytes()[:100], b"\x93NUMPY garbage"):
        train_file.write_bytes(damage)
        forwards.clear()
        capsys.readouterr()
        row = trial(tiny, "gce")
        assert row["status"] == "ok" and forwards == [80]  # the training split alone, computed again
        warning = [line for line in capsys.readouterr().err.splitlines() if "feature cache" in line]
        assert len(warning) == 1 and str(train_file) in warning[0] and "damaged" in warning[0]
        np.testing.assert_array_equal(np.load(train_file), good)
        for aside in train_file.parent.glob(f"{train_file.name}.damaged-*"):
            assert aside.read_bytes() == damage
            aside.unlink()
        for result in tiny.glob("results-gce-*"):
            shutil.rmtree(result)


def test_writes_are_atomic_and_replace_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "victim.txt"
    target.write_text("keep me")
    path = tmp_path / "features" / "x.npy"
    path.parent.mkdir()
    path.symlink_to(target)
    features.write_cache(path, np.ones((3, 2), dtype=np.float32))
    assert target.read_text() == "keep me" and not path.is_symlink()
    np.testing.assert_array_equal(np.load(path), np.ones((3, 2)))
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.npy"]  # no temporary file left
    # Two writers at once: each through its own temporary file, the last replace wins, whole.
    import threading

    arrays = [np.full((2000, 64), i, dtype=np.float32) for i in range(8)]
    threads = [threading.Thread(target=features.write_cache, args=(path, a)) for a in arrays]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    back = np.load(path)
    assert back.shape == (2000, 64) and (back == back[0, 0]).all()
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.npy"]


@pytest.mark.parametrize(("backbone", "small"), [
    ("dinov2_vits14", {"depth": 1}),  # timm's smallest DINOv2 (ViT-S/14), one block
    ("clip_vit_b16", {"depth": 1, "embed_dim": 64, "num_heads": 2}),  # CLIP's ViT-B/16 image tower, made small
])
def test_dinov2_and_clip_probes_train_from_a_local_weights_file(tiny: Path, forwards, monkeypatch, backbone: str,
                                                                 small: dict) -> None:
    """timm's architecture, a checkpoint saved here (other weights than the seed-0 initialisation): the features are
    those of the loaded weights, and the row carries the file's md5. Without timm, one line naming the extra."""
    pytest.importorskip("timm")
    import sys

    architecture, _ = features.TIMM_BACKBONES[backbone]
    monkeypatch.setitem(features.TIMM_BACKBONES, backbone, (architecture, small))
    with torch.random.fork_rng():
        torch.manual_seed(1)
        import timm

        checkpoint = timm.create_model(architecture, pretrained=False, num_classes=0, dynamic_img_size=True,
                                       dynamic_img_pad=True, **small)
    weights = tiny / f"{backbone}.pth"
    torch.save(checkpoint.state_dict(), weights)
    probe = ["--model", "linear_probe", "--model-arg", f"backbone={backbone}", "--model-arg", f"weights={weights}"]
    results = tiny / "results"
    assert main(["trial", "--dataset", "cifar10n", "--method", "ce", "--noise", "worse", "--r", "0",
                 "--epochs-warmup", "1", "--epochs", "1", "--batch-size", "16", "--data-root", str(tiny),
                 "--results", str(results), *probe]) == 0
    (path,) = (results / "trials").glob("*.parquet")
    row = pl.read_parquet(path).row(0, named=True)
    assert row["status"] == "ok" and row["weights"] == f"weights={file_md5(weights)}"
    assert sum(forwards) == 120
    # The cached training features are the checkpoint's (not the random initialisation's) on the evaluation transform.
    ds = get_dataset("cifar10n")(tiny)
    x = ds.eval_transform(ds.load().train.x)
    (train_file,) = [p for p in cached(tiny) if "-train-" in p.name]
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(np.load(train_file)), checkpoint.eval()(x))
        assert not torch.allclose(features.build_backbone(backbone, "random")(x), checkpoint(x))
    # Another network's file: one line; timm missing: one line naming the extra.
    with pytest.raises(UserError, match=rf"is not a {backbone} \({architecture}\) state dict"):
        features.build_backbone(backbone, _save_resnet18(tiny / "r18.pth"))
    monkeypatch.setitem(sys.modules, "timm", None)
    with pytest.raises(UserError, match=r"built by timm, which is not installed here: pip install 'bench-ldmi\[probe"):
        features.build_backbone(backbone, str(weights))


def _save_resnet18(path: Path) -> str:
    import torchvision

    torch.save(torchvision.models.resnet18().state_dict(), path)
    return str(path)
