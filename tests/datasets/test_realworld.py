"""ANIMAL-10N, Food-101N, mini-WebVision (and its ILSVRC-2012 test) and Red Mini-ImageNet: a few dozen tiny images
written in each published layout, the loaders' splits and labels against the files, the realised noise rate against
an independent count, one trial of each end to end (a tiny network: the pipeline is under test), and a damaged or
missing file answered in one line with exit code 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from PIL import Image

from bench import noise
from bench.cli.main import main
from bench.config import UserError
from bench.data import Splits, get_dataset
from bench.datasets.food101n import CLASSES as FOOD_CLASSES
from bench.datasets.food101n import Food101N
from bench.datasets.red_mini_imagenet import RedMiniImageNet

FOOD = list(FOOD_CLASSES)


def write_image(path: Path, label: int, size: tuple[int, int]) -> None:
    """A JPEG whose colour says its class (so a network can learn something), with a bright quadrant."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = np.zeros((size[1], size[0], 3), dtype=np.uint8)
    image[:] = ((37 * label) % 256, (91 * label) % 256, (53 * label + 80) % 256)
    image[: size[1] // 2, : size[0] // 2] = 255 - image[0, 0]
    Image.fromarray(image).save(path, quality=90)


def write_animal10n(root: Path, n_train: int = 40, n_test: int = 10) -> dict[str, list[int]]:
    """`animal10n/training/<label>_<number>.jpg` and `testing/`, 64 x 64; the labels as written."""
    labels: dict[str, list[int]] = {"training": [], "testing": []}
    for part, n in (("training", n_train), ("testing", n_test)):
        for i in range(n):
            label = i % 10
            write_image(root / "animal10n" / part / f"{label}_{i:05d}.jpg", label, (64, 64))
            labels[part].append(label)
    return labels


def write_food101n(root: Path) -> dict[str, object]:
    """`Food-101N_release/` (meta/*.tsv with their headers, images/<class>/<key>.jpg) and `food-101/` (meta/test.txt,
    images/<class>/<id>.jpg). 30 images of classes 0-2 in imagelist.tsv: 0-23 train, 24-29 in verified_val; some
    verified right, some wrong."""
    release, food = root / "Food-101N_release", root / "food-101"
    (release / "meta").mkdir(parents=True)
    (food / "meta").mkdir(parents=True)
    (release / "meta" / "classes.txt").write_text("class_name\n" + "\n".join(FOOD) + "\n")
    keys = [f"{FOOD[i % 3]}/{i:032x}.jpg" for i in range(30)]
    for i, key in enumerate(keys):
        write_image(release / "images" / key, i % 3, (48 + i, 40))
    (release / "meta" / "imagelist.tsv").write_text("class_name/key\n" + "\n".join(keys) + "\n")
    verified_train = {keys[i]: int(i % 4 != 0) for i in range(0, 12)}  # 0, 4, 8 wrong; 9 right
    verified_val = {keys[i]: int(i != 24) for i in range(24, 30)}
    for name, table in (("verified_train.tsv", verified_train), ("verified_val.tsv", verified_val)):
        rows = "".join(f"{key}\t{v}\n" for key, v in table.items())
        (release / "meta" / name).write_text("class_name/key\tverification_label\n" + rows)
    test = [f"{FOOD[i % 3]}/{1000 + i}" for i in range(9)]
    for i, line in enumerate(test):
        write_image(food / "images" / f"{line}.jpg", i % 3, (60, 50 + i))
    (food / "meta" / "test.txt").write_text("\n".join(test) + "\n")
    return {"keys": keys, "verified_train": verified_train, "test": test}


def write_webvision(root: Path, n_train: int = 40) -> dict[str, list]:
    """`webvision/info/` (train_filelist_google.txt with labels beyond 49 to drop, val_filelist.txt, synsets.txt),
    `google/q....`, `val_images_256/`, `imagenet/val/<synset>/`."""
    base = root / "webvision"
    (base / "info").mkdir(parents=True)
    synsets = [f"n{10000000 + i}" for i in range(1000)]
    (base / "info" / "synsets.txt").write_text("".join(f"{s} class {i}\n" for i, s in enumerate(synsets)))
    train = []
    for i in range(n_train):
        label = 50 + 10 * (i % 4) if i % 5 == 4 else i % 4  # every fifth image is of class 50 or beyond: not mini
        key = f"google/q{label + 1:04d}/{i:08d}.jpg"
        write_image(base / key, label, (70, 50))
        train.append((key, label))
    (base / "info" / "train_filelist_google.txt").write_text("".join(f"{k} {lab}\n" for k, lab in train))
    val = [(f"val{i:09d}.jpg", (i * 13) % 60) for i in range(12)]
    for key, label in val:
        write_image(base / "val_images_256" / key, label, (50, 60))
    (base / "info" / "val_filelist.txt").write_text("".join(f"{k} {lab}\n" for k, lab in val))
    for label in range(50):  # one image in each of the first four class folders, the others empty
        (base / "imagenet" / "val" / synsets[label]).mkdir(parents=True, exist_ok=True)
        if label < 4:
            write_image(base / "imagenet" / "val" / synsets[label] / f"ILSVRC2012_val_{label:08d}.JPEG", label,
                        (40, 40))
    return {"train": train, "val": val}


def write_red(root: Path, n: int = 30, layout: str = "all_images") -> dict[str, list]:
    """`mini-imagenet/split/red_noise_nl_{p}` for the ten levels (level p: round(p n) web images, the rest
    Mini-ImageNet's `n<synset>...jpg`), `split/clean_validation`, and the images: `all_images/` and `validation/`
    (84 x 84), or FaMUS's `training_s32/red_noise_nl_{p}/<label>/` and `validation_s32/<label>/` (32 x 32)."""
    base = root / "mini-imagenet"
    levels = {}
    for level in ("0.0", "0.05", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5", "0.6", "0.8"):
        web = round(float(level) * n)
        rows = [(f"{i:016x}.jpg" if i < web else f"n0{1000000 + i}{i:08d}.jpg", i % 5) for i in range(n)]
        levels[level] = rows
        for key, label in rows:
            path = (base / "all_images" / key if layout == "all_images"
                    else base / "training_s32" / f"red_noise_nl_{level}" / str(label) / key)
            if not path.exists():
                write_image(path, label, (84, 84) if layout == "all_images" else (32, 32))
        (base / "split").mkdir(parents=True, exist_ok=True)
        (base / "split" / f"red_noise_nl_{level}").write_text("".join(f"{k} {lab}\n" for k, lab in rows))
    test = [(f"ILSVRC2012_val_{i:08d}.jpg", i % 5) for i in range(10)]
    for key, label in test:
        if layout == "all_images":
            write_image(base / "validation" / key, label, (84, 84))
        else:
            write_image(base / "validation_s32" / str(label) / key, label, (32, 32))
    (base / "split" / "clean_validation").write_text("".join(f"{k} {lab}\n" for k, lab in test))
    return {"levels": levels, "test": test}


def tiny_network(monkeypatch: pytest.MonkeyPatch, cls: type) -> None:
    """Train the dataset with a one-block, four-channel ResNet: the pipeline, not the paper's network, is under
    test (its own network is checked in test_resnet_shapes below)."""
    monkeypatch.setattr(cls, "model", "resnet34_cifar")
    real_load = cls.load

    def load(self) -> Splits:
        splits = real_load(self)
        splits.model_args = {"blocks": (1,), "width": 4}
        return splits

    monkeypatch.setattr(cls, "load", load)


def run_trial(root: Path, results: Path, dataset: str, noise_pattern: str = "real", r: float = 0.0) -> dict:
    assert main(["trial", "--dataset", dataset, "--method", "ce", "--noise", noise_pattern, "--r", str(r),
                 "--epochs-warmup", "1", "--epochs", "1", "--batch-size", "8", "--data-root", str(root),
                 "--results", str(results)]) == 0
    (path,) = (results / "trials").glob("*.parquet")
    return pl.read_parquet(path).row(0, named=True)


@pytest.fixture(autouse=True)
def no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCH_RESNET50_WEIGHTS", raising=False)


# ---------------------------------------------------------------- ANIMAL-10N


def test_animal10n_layout_split_and_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = write_animal10n(tmp_path)
    ds = get_dataset("animal10n")(tmp_path)
    assert ds.status() == "ready"
    splits = ds.load()
    assert (len(splits.train), len(splits.val), len(splits.test)) == (36, 4, 10)  # 10% of training validates
    noisy_train, noisy_val = splits.human_labels["real"]
    # The training and validation images partition the training folder, each with the label its name carries.
    keys = [k.decode() for k in splits.train.x.keys] + [k.decode() for k in splits.val.x.keys]
    assert sorted(keys) == sorted(f"training/{lab}_{i:05d}.jpg" for i, lab in enumerate(written["training"]))
    assert [int(Path(k).name[0]) for k in keys] == list(noisy_train) + list(noisy_val)
    np.testing.assert_array_equal(splits.test.y, written["testing"])
    assert (splits.train.y == -1).all()  # no clean training label is published
    image = splits.train.x[0]
    assert image.shape == (3, 64, 64) and image.dtype == torch.uint8
    batch = torch.stack([splits.test.x[i] for i in range(3)])
    mean = torch.tensor((0.485, 0.456, 0.406)).view(1, 3, 1, 1)
    std = torch.tensor((0.229, 0.224, 0.225)).view(1, 3, 1, 1)
    torch.testing.assert_close(ds.eval_transform(batch), (batch.float() / 255 - mean) / std)
    flipped = ds.train_transform(batch, torch.Generator().manual_seed(0))
    plain = ds.eval_transform(batch)
    for out, ref in zip(flipped, plain, strict=True):  # flips only: each image is itself or its mirror
        assert torch.equal(out, ref) or torch.equal(out, ref.flip(-1))

    tiny_network(monkeypatch, type(ds))
    row = run_trial(tmp_path, tmp_path / "results", "animal10n")
    assert row["status"] == "ok" and row["noise"] == "real" and 0 <= row["test_acc"] <= 100
    assert np.isnan(row["noise_rate"])  # unknown: no clean training labels


def test_animal10n_bad_name_and_damaged_image_are_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    write_animal10n(tmp_path)
    (tmp_path / "animal10n" / "training" / "cat_1.jpg").write_bytes(b"x")
    with pytest.raises(UserError, match=r"cat_1\.jpg is not named <label>_<number>\.jpg"):
        get_dataset("animal10n")(tmp_path).load()
    (tmp_path / "animal10n" / "training" / "cat_1.jpg").unlink()
    (tmp_path / "animal10n" / "testing" / "3_00003.jpg").write_bytes(b"not a jpeg")
    tiny_network(monkeypatch, get_dataset("animal10n"))
    code = main(["trial", "--dataset", "animal10n", "--method", "ce", "--noise", "real", "--r", "0",
                 "--epochs-warmup", "1", "--epochs", "1", "--batch-size", "8", "--data-root", str(tmp_path),
                 "--results", str(tmp_path / "results")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "animal10n: cannot decode" in err and "3_00003.jpg" in err


# ---------------------------------------------------------------- Food-101N


def test_food101n_layout_verification_and_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = write_food101n(tmp_path)
    ds = get_dataset("food101n")(tmp_path)
    splits = ds.load()
    keys = written["keys"]
    assert [k.decode() for k in splits.train.x.keys] == keys[:24]
    assert [k.decode() for k in splits.val.x.keys] == keys[24:]  # verified_val's images validate
    noisy_train, noisy_val = splits.human_labels["real"]
    np.testing.assert_array_equal(noisy_train, [i % 3 for i in range(24)])  # the folder is the noisy label
    np.testing.assert_array_equal(splits.test.y, [i % 3 for i in range(9)])
    # Clean labels: the label where verified right, WRONG where verified wrong, unknown elsewhere.
    expected = [(i % 3 if i % 4 else noise.WRONG) if i < 12 else -1 for i in range(24)]
    np.testing.assert_array_equal(splits.train.y, expected)
    assert splits.test.x[0].shape == (3, 256, 256)
    assert ds.eval_transform(torch.stack([splits.test.x[0]])).shape == (1, 3, 224, 224)

    # 12 verified training images of which 3 wrong, 6 verified validation images of which 1 wrong.
    assert ds.describe() == ["real, realised noise rate: 22.22% of the 18 human-verified images"]

    tiny_network(monkeypatch, Food101N)
    row = run_trial(tmp_path, tmp_path / "results", "food101n")
    assert row["status"] == "ok"
    # 12 verified training images, 3 of them (0, 4, 8) verified wrong.
    assert row["noise_rate"] == pytest.approx(3 / 12)


def test_food101n_bad_line_and_missing_test_image(tmp_path: Path, monkeypatch, capsys) -> None:
    write_food101n(tmp_path)
    meta = tmp_path / "Food-101N_release" / "meta"
    good = (meta / "verified_train.tsv").read_text()
    (meta / "verified_train.tsv").write_text(good + "no_such_dish/abc.jpg\t1\n")
    with pytest.raises(UserError, match=r"verified_train\.tsv, line 14: expected `class/key` of one of the 101"):
        get_dataset("food101n")(tmp_path).load()
    (meta / "verified_train.tsv").write_text(good)
    (tmp_path / "food-101" / "images" / FOOD[1] / "1001.jpg").unlink()
    tiny_network(monkeypatch, Food101N)
    code = main(["trial", "--dataset", "food101n", "--method", "ce", "--noise", "real", "--r", "0",
                 "--epochs-warmup", "1", "--epochs", "1", "--batch-size", "8", "--data-root", str(tmp_path),
                 "--results", str(tmp_path / "results")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "food101n: missing image" in err and "1001.jpg" in err


# ---------------------------------------------------------------- mini-WebVision


def test_webvision_mini_first_50_classes_both_tests_and_trial(tmp_path: Path, monkeypatch) -> None:
    written = write_webvision(tmp_path)
    ds = get_dataset("webvision_mini")(tmp_path)
    splits = ds.load()
    mini = [(k, lab) for k, lab in written["train"] if lab < 50]
    assert len(splits.train) + len(splits.val) == len(mini) == 32 and len(splits.val) == round(0.05 * 32)
    noisy_train, noisy_val = splits.human_labels["real"]
    listed = dict(mini)
    pairs = [(k.decode(), lab) for k, lab in zip(list(splits.train.x.keys) + list(splits.val.x.keys),
                                                  list(noisy_train) + list(noisy_val), strict=True)]
    assert sorted(pairs) == sorted(listed.items())
    test_expected = [(k, lab) for k, lab in written["val"] if lab < 50]
    assert [k.decode() for k in splits.test.x.keys] == [k for k, _ in test_expected]
    np.testing.assert_array_equal(splits.test.y, [lab for _, lab in test_expected])
    assert splits.train.x[0].shape == (3, 320, 320)
    assert ds.train_transform(torch.stack([splits.train.x[0]] * 2)).shape == (2, 3, 299, 299)

    ilsvrc = get_dataset("webvision_mini_ilsvrc12")(tmp_path).load()
    np.testing.assert_array_equal(ilsvrc.test.y, [0, 1, 2, 3])  # one image in each of the first four folders
    np.testing.assert_array_equal(ilsvrc.human_labels["real"][0], noisy_train)  # the same training labels

    tiny_network(monkeypatch, type(ds))
    row = run_trial(tmp_path, tmp_path / "results", "webvision_mini")
    assert row["status"] == "ok" and np.isnan(row["noise_rate"])


def test_webvision_mini_missing_ilsvrc_folder_is_named(tmp_path: Path) -> None:
    write_webvision(tmp_path)
    (tmp_path / "webvision" / "imagenet" / "val" / "n10000049").rmdir()
    with pytest.raises(UserError, match=r"missing .*imagenet/val/49/ \(or .*n10000049/\).*valprep"):
        get_dataset("webvision_mini_ilsvrc12")(tmp_path).load()


# ---------------------------------------------------------------- Red Mini-ImageNet


@pytest.mark.parametrize("layout", ["all_images", "training_s32"])
def test_red_mini_imagenet_levels_rates_and_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  layout: str) -> None:
    written = write_red(tmp_path, layout=layout)
    ds = get_dataset("red_mini_imagenet")(tmp_path)
    assert ds.status() == "ready"
    splits = ds.load()
    for level in ("0.2", "0.8"):
        view = splits.for_noise("red", float(level))
        rows = dict(written["levels"][level])
        # Each image where its layout puts it: all_images/<image>, or FaMUS's training_s32/<level>/<label>/<image>.
        where = {k: (f"all_images/{k}" if layout == "all_images" else f"training_s32/red_noise_nl_{level}/{lab}/{k}")
                 for k, lab in rows.items()}
        keys = [k.decode() for k in view.train.x.keys] + [k.decode() for k in view.val.x.keys]
        assert sorted(keys) == sorted(where.values()) and len(view.val) == 3  # each level's own images, 10% validate
        noisy_train, _ = view.human_labels["red"]
        np.testing.assert_array_equal(noisy_train, [rows[Path(k.decode()).name] for k in view.train.x.keys])
        web = np.array([not Path(k.decode()).name.startswith("n") for k in view.train.x.keys])
        assert noise.summarise(view.train.y, noisy_train, noisy_train, 100, None).noise_rate == web.mean()
        assert view.test is splits.test
    assert splits.for_noise("uniform", 0.3) is splits  # a generic pattern draws on the clean level
    assert (splits.train.y >= 0).all()
    with pytest.raises(UserError, match=r"red_mini_imagenet: noise 'red' comes at its published levels only: "
                                        r"r = 0, 0.05, .*0.8; got r = 0.25"):
        RedMiniImageNet.check_level("red", 0.25)
    assert splits.test.x[0].shape == (3, 32, 32)
    test_where = [f"validation/{k}" if layout == "all_images" else f"validation_s32/{lab}/{k}"
                  for k, lab in written["test"]]
    assert [k.decode() for k in splits.test.x.keys] == test_where
    np.testing.assert_array_equal(splits.test.y, [lab for _, lab in written["test"]])
    # FaMUS's normalisation (its dataloader's Normalize((0.507, 0.487, 0.441), (0.267, 0.256, 0.276))), as
    # torchvision computes it on a PIL image: ToTensor (bytes / 255), then (x - mean) / std per channel.
    batch = torch.stack([splits.test.x[i] for i in range(2)])
    famus = (batch.float() / 255 - torch.tensor((0.507, 0.487, 0.441)).view(1, 3, 1, 1)) \
        / torch.tensor((0.267, 0.256, 0.276)).view(1, 3, 1, 1)
    torch.testing.assert_close(ds.eval_transform(batch), famus)
    (line,) = ds.describe()  # level p: round(30 p) web images of 30
    assert line.startswith("red, realised noise rate (web images) at r = 0.0 0.0%, 0.05 6.7%, 0.1 10.0%")

    tiny_network(monkeypatch, RedMiniImageNet)
    row = run_trial(tmp_path, tmp_path / "results", "red_mini_imagenet", "red", 0.4)
    view = splits.for_noise("red", 0.4)
    assert row["status"] == "ok" and (row["noise"], row["r"]) == ("red", 0.4)
    assert row["noise_rate"] == pytest.approx(np.mean([not Path(k.decode()).name.startswith("n")
                                                       for k in view.train.x.keys]))


def test_red_mini_imagenet_missing_level_file(tmp_path: Path, capsys) -> None:
    write_red(tmp_path)
    (tmp_path / "mini-imagenet" / "split" / "red_noise_nl_0.6").unlink()
    code = main(["trial", "--dataset", "red_mini_imagenet", "--method", "ce", "--noise", "red", "--r", "0.2",
                 "--data-root", str(tmp_path), "--results", str(tmp_path / "results")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "missing split/red_noise_nl_0.6" in err
    assert "controlled-noisy-web-labels" in err and not (tmp_path / "results" / "trials").exists()


def test_red_mini_imagenet_famus_layout_missing_level_folder(tmp_path: Path) -> None:
    write_red(tmp_path, n=10, layout="training_s32")
    import shutil

    shutil.rmtree(tmp_path / "mini-imagenet" / "training_s32" / "red_noise_nl_0.15")
    ds = get_dataset("red_mini_imagenet")(tmp_path)
    assert ds.missing_files() == ["training_s32/red_noise_nl_0.15/"]
    assert ds.status() == "missing 1 of 22 files"  # 10 levels + clean_validation, and each one's folder + the test's
    with pytest.raises(UserError, match=r"missing training_s32/red_noise_nl_0\.15/ under .*training_s32/red_noise"):
        ds.load()


def test_new_networks_shapes() -> None:
    from bench.models import create

    vgg = create("vgg19_bn", 10, image_size=64).eval()
    convs = [m for m in vgg.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 16
    # PLC's head (animal10/vgg.py lines 40-48, torchvision's VGG): 512 x 7 x 7 -> 4096 -> 4096 -> C, ReLU and
    # dropout 0.5 after each hidden layer; its initialisation: linear weights N(0, 0.01), biases 0.
    linears = [m for m in vgg.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(512 * 7 * 7, 4096), (4096, 4096), (4096, 10)]
    assert [type(m).__name__ for m in vgg.classifier] == ["Linear", "ReLU", "Dropout", "Linear", "ReLU", "Dropout",
                                                          "Linear"]
    assert all(m.p == 0.5 for m in vgg.classifier if type(m).__name__ == "Dropout")
    weights = linears[1].weight.detach()
    assert abs(weights.std().item() - 0.01) < 0.0002 and abs(weights.mean().item()) < 0.0002  # 16.8M draws
    assert all(float(m.bias.detach().abs().max()) == 0 for m in linears + convs)
    # Kaiming normal, fan_out: std sqrt(2 / (out_channels * 9)); the last conv has 512 x 512 x 9 weights.
    assert abs(convs[-1].weight.std().item() / (2 / (512 * 9)) ** 0.5 - 1) < 0.01
    resnet = create("resnet18_cifar", 100).eval()
    blocks = [m for m in resnet.modules() if type(m).__name__ == "_BasicBlock"]
    assert len(blocks) == 8
    with torch.no_grad():
        assert vgg(torch.zeros(2, 3, 64, 64)).shape == (2, 10)
        for size in (32, 224, 299):  # Red Mini-ImageNet's, Food-101N's and mini-WebVision's crops (`--model vgg19_bn`)
            small = create("vgg19_bn", 3, image_size=size, width=8, hidden=16).eval()
            assert small(torch.zeros(1, 3, size, size)).shape == (1, 3)
    with pytest.raises(UserError, match=r"vgg19_bn needs images of at least 32 pixels .*got 28"):
        create("vgg19_bn", 10, image_size=28)
        assert resnet(torch.zeros(2, 3, 32, 32)).shape == (2, 100)
