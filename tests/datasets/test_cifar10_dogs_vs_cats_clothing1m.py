"""CIFAR-10, CIFAR-10N, Dogs vs Cats and Clothing1M: small files generated in exactly the published formats, the
loaders, splits, checksums, safe unpickling, device augmentation, the decode cache; the real files when present."""

from __future__ import annotations

import csv
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from bench import noise
from bench.cli.main import main
from bench.config import UserError
from bench.data import get_dataset
from bench.datasets import cifar10 as cifar10_mod
from bench.datasets import dogs_vs_cats as dogs_mod
from bench.datasets.cifar10 import CIFAR10, crop_flip, read_batch
from bench.datasets.cifar10n import CIFAR10N, LABELS_FILE
from bench.datasets.clothing1m import CLASSES as CLOTHING_CLASSES
from bench.download import file_md5
from tests.datasets.conftest import (
    Payload,
    refuses_the_pickled_payload,
    trains_an_mlp,
    unpickles_nothing_of_another_md5,
)
from tests.tolerances import f32

CIFAR_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


# ---------------------------------------------------------------- generators of the published formats


def write_jpeg(path: Path, colour: tuple[int, int, int], size: tuple[int, int]) -> None:
    image = np.zeros((size[1], size[0], 3), dtype=np.uint8)
    image[:] = colour
    image[: size[1] // 2, : size[0] // 2] = 255 - np.array(colour)  # a bright quadrant: not a flat image
    Image.fromarray(image).save(path, quality=95)


def write_dogs(root: Path, n_each: int = 12) -> Path:
    folder = root / "dogs-vs-cats" / "train"
    folder.mkdir(parents=True)
    for i in range(n_each):
        write_jpeg(folder / f"cat.{i}.jpg", (200, 40, 40), (90 + i, 70))  # reddish cats, varied sizes
        write_jpeg(folder / f"dog.{i}.jpg", (40, 40, 200), (70, 80 + i))  # bluish dogs
    return folder


def write_clothing(root: Path, n_train: int = 12, n_val: int = 6, n_test: int = 6) -> dict[str, list[str]]:
    """A tiny `clothing1M/` tree with its annotation files; some training images are also clean-annotated."""
    base = root / "clothing1M"
    (base / "category_names_eng.txt").parent.mkdir(parents=True)
    (base / "category_names_eng.txt").write_text("\n".join(CLOTHING_CLASSES) + "\n")
    keys: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    noisy_kv, clean_kv = [], []
    i = 0
    for part, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        for _ in range(n):
            key = f"images/{i % 10}/{i:02d}/{1000 + i},{2000 + i}.jpg"
            (base / key).parent.mkdir(parents=True, exist_ok=True)
            write_jpeg(base / key, (10 * (i % 14), 100, 150), (300 + 7 * i, 260))
            keys[part].append(key)
            label = i % 14
            if part == "train":
                noisy_kv.append(f"{key} {(label + (i % 3 == 0)) % 14}")
                if i % 2 == 0:  # half of the training images also have a clean label
                    clean_kv.append(f"{key} {label}")
            else:
                clean_kv.append(f"{key} {label}")
            i += 1
    (base / "noisy_label_kv.txt").write_text("\n".join(noisy_kv) + "\n")
    (base / "clean_label_kv.txt").write_text("\n".join(clean_kv) + "\n")
    (base / "noisy_train_key_list.txt").write_text("\n".join(keys["train"]) + "\n")
    (base / "clean_val_key_list.txt").write_text("\n".join(keys["val"]) + "\n")
    (base / "clean_test_key_list.txt").write_text("\n".join(keys["test"]) + "\n")
    return keys


# ---------------------------------------------------------------- CIFAR-10


def test_cifar10_reads_python_batches(tiny_cifar: Path) -> None:
    ds = get_dataset("cifar10")(tiny_cifar)
    splits = ds.load()
    assert (len(splits.train), len(splits.val), len(splits.test)) == (80, 20, 20)
    assert splits.train.x.shape == (80, 3, 32, 32) and splits.train.x.dtype == torch.uint8
    # A row of b"data" is the red plane, then green, then blue, each 32 x 32 in row-major order.
    with open(tiny_cifar / "cifar-10-batches-py" / "data_batch_5", "rb") as f:
        raw = pickle.load(f)
    row = raw[b"data"][3]
    assert torch.equal(splits.val.x[3, 1, 2], torch.from_numpy(row[1024 + 2 * 32 : 1024 + 3 * 32]))
    np.testing.assert_array_equal(splits.val.y, raw[b"labels"])
    # Per-pixel normalisation: the training split comes out with mean 0 and std 1 at every pixel.
    z = ds.eval_transform(splits.train.x)
    assert z.dtype == torch.float32
    # Exactly 0 and 1 but for float32 rounding: z = (x - mean) / std rounds by 3 U32 |z| (mean and std rounded to
    # float32 included), and a mean over the 80 images adds f32(80) of max |z|; a std is a sqrt of such a mean of
    # squares: f32(80, 8).
    assert z.mean(0).abs().max() < f32(80, 3) * z.abs().max()
    assert (z.std(0, unbiased=False) - 1).abs().max() < f32(80, 8)


def test_cifar10_missing_and_corrupt_files(tiny_cifar: Path, tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(UserError, match=r"missing cifar-10-batches-py/data_batch_1.*cs\.toronto\.edu"):
        get_dataset("cifar10")(tmp_path / "nowhere").load()
    monkeypatch.setattr(CIFAR10, "files", cifar10_mod.FILES)  # the official md5s: the small files fail them
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "1")
    with pytest.raises(UserError, match="data_batch_1 is corrupt"):
        get_dataset("cifar10")(tiny_cifar).load()


def test_cifar10_download_checks_the_archive(tiny_cifar: Path, tmp_path: Path, monkeypatch, published) -> None:
    """The download path without the network: a server on 127.0.0.1 serves an archive laid out like the official one."""
    import tarfile

    archive = tmp_path / "published" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tiny_cifar / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    monkeypatch.setattr(CIFAR10, "urls", {published(archive): "cifar-10-python.tar.gz"})
    monkeypatch.setattr(CIFAR10, "archive_md5", {"cifar-10-python.tar.gz": file_md5(archive)})
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "1")
    CIFAR10(tmp_path / "fresh").download()
    assert len(CIFAR10(tmp_path / "fresh").load().train) == 80
    monkeypatch.setattr(CIFAR10, "archive_md5", {"cifar-10-python.tar.gz": cifar10_mod.ARCHIVE_MD5})
    with pytest.raises(UserError, match="arrived corrupt"):
        CIFAR10(tmp_path / "other").download()
    assert not (tmp_path / "other" / "cifar-10-batches-py").exists()


def test_cifar10_unpickler_refuses_anything_but_numpy(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": Payload(marker)}))
    with pytest.raises(UserError, match="refusing to load pathlib"):
        read_batch(path)
    assert not marker.exists()


@pytest.mark.parametrize(("labels", "message"), [
    (["a", "b"], r"labels\[0\] is 'a', not an integer label"),
    ([0, 2.0], r"labels\[1\] is 2.0, not an integer label"),  # a float is refused, not cast
    (np.array([1.5, 0.0]), r"labels\[0\] is np.float64\(1.5\), not an integer label"),
    ([0, True], r"labels\[1\] is True, not an integer label"),
    ("01", "labels is a str, not a list of labels"),
    ([0, 10], r"labels outside 0..9"),
])
def test_cifar10_batch_labels_must_be_integers(tmp_path: Path, labels: object, message: str) -> None:
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": labels}, protocol=2))
    with pytest.raises(UserError, match=f"^{re.escape(str(path))}: {message}; use the official CIFAR-10 python batch$"):
        read_batch(path)


def test_crop_flip_matches_padding_and_slicing() -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 3, 8, 10)
    top, left = torch.tensor([0, 1, 4, 2, 3, 0]), torch.tensor([4, 0, 2, 3, 1, 0])
    flip = torch.tensor([False, True, False, True, True, False])
    out = crop_flip(F.pad(x, (2, 2, 2, 2)), top, left, flip, 8, 10)
    for n in range(6):  # an independent computation, one image at a time
        expected = F.pad(x[n], (2, 2, 2, 2))[:, top[n] : top[n] + 8, left[n] : left[n] + 10]
        if flip[n]:
            expected = expected.flip(-1)
        assert torch.equal(out[n], expected)


def _is_shift_flip(augmented: torch.Tensor, image: torch.Tensor, padding: int) -> bool:
    """Whether `augmented` is one of the (2p+1)^2 x 2 shifts/flips of `image` (zero-padded)."""
    h, w = image.shape[-2:]
    padded = F.pad(image, (padding,) * 4)
    for dy in range(2 * padding + 1):
        for dx in range(2 * padding + 1):
            window = padded[:, dy : dy + h, dx : dx + w]
            if torch.equal(augmented, window) or torch.equal(augmented, window.flip(-1)):
                return True
    return False


def test_cifar10_train_transform_is_a_shift_and_flip(tiny_cifar: Path) -> None:
    ds = get_dataset("cifar10")(tiny_cifar)
    splits = ds.load()
    torch.manual_seed(1)
    x = splits.train.x[:16]
    augmented = ds.train_transform(x)
    assert augmented.shape == (16, 3, 32, 32)
    normalised = ds.eval_transform(x)
    assert all(_is_shift_flip(augmented[n], normalised[n], 4) for n in range(16))
    assert not torch.equal(augmented, normalised)  # 16 images: some were moved


# ---------------------------------------------------------------- CIFAR-10N


def test_cifar10n_human_labels_for_train_and_validation(tiny_cifar: Path) -> None:
    splits = get_dataset("cifar10n")(tiny_cifar).load()
    stored = torch.load(tiny_cifar / LABELS_FILE, weights_only=False)  # the test's own file: trusted
    assert set(splits.human_labels) == {"aggre", "worse", "random1", "random2", "random3"}
    train, val = splits.human_labels["worse"]
    np.testing.assert_array_equal(train, stored["worse_label"][:80])  # batches 1-4
    np.testing.assert_array_equal(val, stored["worse_label"][80:])  # batch 5 keeps its human labels
    np.testing.assert_array_equal(splits.train.y, stored["clean_label"][:80])
    assert len(splits.test) == 20  # clean: no human labels for the test batch
    summary = noise.summarise(splits.train.y, train, val, 10, None)
    assert summary.noise_rate == pytest.approx(np.mean(train != splits.train.y))


def test_cifar10n_clean_labels_must_match_the_batches(tiny_cifar: Path, monkeypatch) -> None:
    stored = torch.load(tiny_cifar / LABELS_FILE, weights_only=False)  # the test's own file: trusted
    stored["clean_label"][[3, 90]] = (stored["clean_label"][[3, 90]] + 1) % 10
    torch.save(stored, tiny_cifar / LABELS_FILE)
    monkeypatch.setattr(CIFAR10N, "files", {**CIFAR10N.files, LABELS_FILE: file_md5(tiny_cifar / LABELS_FILE)})
    with pytest.raises(UserError, match="^cifar10n: clean_label in CIFAR-10N/CIFAR-10_human.pt disagrees with the "
                                        "labels of the CIFAR-10 training batches at 2 of 100 images, first at image 3; "
                                        "use the official cifar-10-batches-py files, whose training order "
                                        r"\(data_batch_1 to 5\) the label file follows$"):
        get_dataset("cifar10n")(tiny_cifar).load()


def test_cifar10n_refuses_a_wrong_checksum(tiny_cifar: Path, monkeypatch) -> None:
    with unpickles_nothing_of_another_md5(CIFAR10N, LABELS_FILE, monkeypatch):
        with pytest.raises(UserError, match="md5 mismatch"):
            get_dataset("cifar10n")(tiny_cifar).load()


def test_cifar10n_never_unpickles_unrestricted(tmp_path: Path, monkeypatch) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / LABELS_FILE
    path.parent.mkdir(parents=True)
    torch.save({"clean_label": np.zeros(10, np.int64), "aggre_label": Payload(marker)}, path)
    monkeypatch.setattr(CIFAR10N, "files", {**CIFAR10N.files, LABELS_FILE: file_md5(path)})
    ds = get_dataset("cifar10n")(tmp_path)
    refuses_the_pickled_payload(ds.human_labels_file, marker, monkeypatch, "cifar10n", "CIFAR-10")
    assert any("not the published CIFAR-10N label file" in line for line in ds.describe())


def test_cifar10n_describe_from_the_labels_alone(tiny_cifar: Path, capsys) -> None:
    for rel in CIFAR10.files:
        (tiny_cifar / rel).unlink()  # no images: the rates still come from the label file
    stored = torch.load(tiny_cifar / LABELS_FILE, weights_only=False)
    lines = get_dataset("cifar10n")(tiny_cifar).describe()
    assert any("missing: cifar-10-batches-py/data_batch_1" in line for line in lines)
    worse = 100 * np.mean(stored["worse_label"] != stored["clean_label"])
    assert any(f"worse {worse:.2f}%" in line and "all 100" in line for line in lines)
    assert main(["datasets", "--data-root", str(tiny_cifar)]) == 0
    assert f"worse {worse:.2f}%" in capsys.readouterr().out


def test_cifar10n_trial_on_human_labels(tiny_cifar: Path, tmp_path: Path, monkeypatch) -> None:
    from bench.exec.trainer import run_trial
    from bench.trial import TrialConfig

    trains_an_mlp(CIFAR10N, monkeypatch)
    config = TrialConfig(dataset="cifar10n", method="ce", noise="worse", r=0.0, epochs=1, epochs_warmup=1,
                         batch_size=16)
    row = run_trial(config, tiny_cifar, results=tmp_path / "results", log=lambda s: None)
    stored = torch.load(tiny_cifar / LABELS_FILE, weights_only=False)
    assert row["status"] == "ok"
    assert row["noise_rate"] == pytest.approx(np.mean(stored["worse_label"][:80] != stored["clean_label"][:80]))


def test_resnet34_cifar_shapes() -> None:
    from bench.models import create

    net = create("resnet34_cifar", 10).eval()
    with torch.no_grad():
        assert net(torch.zeros(1, 3, 32, 32)).shape == (1, 10)
    assert sum(1 for m in net.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)) == 33
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in net.modules())


# ---------------------------------------------------------------- Dogs vs Cats


def test_dogs_vs_cats_splits_cache_and_augmentation(tmp_path: Path, monkeypatch) -> None:
    write_dogs(tmp_path)
    monkeypatch.setenv("BENCH_CACHE", str(tmp_path / "cache"))
    ds = get_dataset("dogs_vs_cats")(tmp_path)
    splits = ds.load()
    assert (len(splits.train), len(splits.val), len(splits.test)) == (12, 6, 6)  # 24 images: 1/2, 1/4, 1/4
    assert splits.notes and "proportional" in splits.notes[0]
    assert splits.train.x.shape == (12, 3, 64, 64) and splits.train.x.dtype == torch.uint8
    # Class 0 = dog (bluish), 1 = cat (reddish): the decoded pixels agree with the labels of the file names.
    for split in (splits.train, splits.val, splits.test):
        bottom_right = split.x[:, :, 40:, 40:].float().mean(dim=(2, 3))
        np.testing.assert_array_equal((bottom_right[:, 2] > bottom_right[:, 0]).numpy(), split.y == 0)
    assert len(list((tmp_path / "cache" / "dogs_vs_cats").glob("*.pt"))) == 1
    assert not list((tmp_path / "cache" / "dogs_vs_cats").glob("*.part"))

    # A second load reads the cache and decodes nothing; the split is the same.
    monkeypatch.setattr(dogs_mod, "decode_images", lambda *a, **k: pytest.fail("decoded again"))
    again = get_dataset("dogs_vs_cats")(tmp_path).load()
    assert torch.equal(again.train.x, splits.train.x)
    np.testing.assert_array_equal(again.test.y, splits.test.y)

    # Another file list is another cache entry.
    write_jpeg(tmp_path / "dogs-vs-cats" / "train" / "dog.99.jpg", (40, 40, 200), (64, 64))
    with pytest.raises(pytest.fail.Exception, match="decoded again"):
        get_dataset("dogs_vs_cats")(tmp_path).load()

    torch.manual_seed(0)
    augmented = ds.train_transform(splits.train.x)
    normalised = ds.eval_transform(splits.train.x)
    assert augmented.shape == (12, 3, 64, 64)
    assert all(_is_shift_flip(augmented[n], normalised[n], dogs_mod.PADDING) for n in range(12))
    from bench.models import create

    assert create("vgg16_bn", 2, **splits.model_args)(normalised[:2]).shape == (2, 2)


def test_dogs_vs_cats_missing_folder(tmp_path: Path, monkeypatch) -> None:
    ds = get_dataset("dogs_vs_cats")(tmp_path)
    monkeypatch.delenv("BENCH_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ds.cache_dir() == tmp_path / "home" / ".cache" / "bench" / "cache" / "dogs_vs_cats"  # not the data
    assert ds.status().startswith("missing")
    with pytest.raises(UserError, match=r"missing train/cat\.N\.jpg.*kaggle"):
        ds.load()


# ---------------------------------------------------------------- Clothing1M


def test_clothing1m_annotations_streaming_and_transforms(tmp_path: Path, monkeypatch) -> None:
    keys = write_clothing(tmp_path)
    monkeypatch.delenv("BENCH_RESNET50_WEIGHTS", raising=False)
    ds = get_dataset("clothing1m")(tmp_path)
    splits = ds.load()
    assert (len(splits.train), len(splits.val), len(splits.test)) == (12, 6, 6)
    assert not isinstance(splits.train.x, torch.Tensor)  # streamed, decoded on demand
    image = splits.train.x[0]
    assert image.shape == (3, 256, 256) and image.dtype == torch.uint8
    noisy_train, val_labels = splits.human_labels["real"]
    np.testing.assert_array_equal(val_labels, splits.val.y)  # validation and test are clean
    np.testing.assert_array_equal(splits.val.y, [i % 14 for i in range(12, 18)])
    np.testing.assert_array_equal(noisy_train, [(i + (i % 3 == 0)) % 14 for i in range(12)])
    np.testing.assert_array_equal(splits.train.y, [i if i % 2 == 0 else -1 for i in range(12)])  # -1: unknown
    assert [k.decode() for k in splits.train.x.keys] == keys["train"]

    summary = noise.summarise(splits.train.y, noisy_train, val_labels, 14, None)
    known = splits.train.y >= 0
    # Over the annotated half only: i = 0, 2, ..., 10 of which i % 3 == 0 (0, 6) are flipped.
    assert summary.noise_rate == pytest.approx(2 / 6)
    assert np.isnan(noise.summarise(np.full(4, -1), np.zeros(4, np.int64), val_labels, 14, None).noise_rate)
    np.testing.assert_allclose(summary.empirical, noise.empirical_transition(
        splits.train.y[known], noisy_train[known], 14))

    batch = torch.stack([splits.train.x[i] for i in range(4)])
    torch.manual_seed(0)
    train_out, eval_out = ds.train_transform(batch), ds.eval_transform(batch)
    assert train_out.shape == eval_out.shape == (4, 3, 224, 224)
    assert train_out.dtype == eval_out.dtype == torch.float32
    # The centre crop is exactly the middle 224 x 224, normalised by ImageNet's statistics.
    mean = torch.tensor((0.485, 0.456, 0.406)).view(1, 3, 1, 1)
    std = torch.tensor((0.229, 0.224, 0.225)).view(1, 3, 1, 1)
    # The same three float32 operations on both sides: 3 U32 apart at most, inside assert_close's float32 rtol.
    torch.testing.assert_close(eval_out, (batch[:, :, 16:240, 16:240].float() / 255 - mean) / std)


def test_clothing1m_missing_files_and_bad_lines(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="missing category_names_eng.txt.*noisy_label_kv.txt.*on request"):
        get_dataset("clothing1m")(tmp_path).load()
    write_clothing(tmp_path)
    (tmp_path / "clothing1M" / "noisy_label_kv.txt").write_text("images/0/00/1.jpg fourteen\n")
    with pytest.raises(UserError, match="noisy_label_kv.txt, line 1"):
        get_dataset("clothing1m")(tmp_path).load()


def test_clothing1m_missing_image_is_named(tmp_path: Path) -> None:
    keys = write_clothing(tmp_path)
    (tmp_path / "clothing1M" / keys["test"][0]).unlink()
    splits = get_dataset("clothing1m")(tmp_path).load()
    with pytest.raises(UserError, match="missing image .*" + keys["test"][0].split("/")[-1]):
        splits.test.x[0]


def test_resnet50_local_weights_only(tmp_path: Path) -> None:
    from bench.models import create

    with pytest.raises(UserError, match="no ImageNet weights file"):
        create("resnet50", 14, weights=str(tmp_path / "absent.pth"))
    import torchvision

    state = torchvision.models.resnet50(weights=None).state_dict()
    state["conv1.weight"] = torch.full_like(state["conv1.weight"], 0.5)
    torch.save(state, tmp_path / "r50.pth")
    net = create("resnet50", 14, weights=str(tmp_path / "r50.pth"))
    assert torch.all(net.conv1.weight == 0.5) and net.fc.out_features == 14


# ---------------------------------------------------------------- each method's stage schedule (the paper's code)

# The paper's scripts (github.com/Newbeeer/L_DMI at c6e3d6d), restated: the lr each sets for epoch e and its number
# of epochs. CIFAR-10/{FW,GCE,LCCN,DMI}.py use SGD, momentum 0.9, weight decay 1e-4, at the batch size 256 of
# CIFAR-10/dataset.py.
CIFAR10_SCRIPTS = {
    "fw": (lambda e: 0.0001 if e >= 80 else 0.001 if e >= 40 else 0.01, 120),
    "gce": (lambda e: 1e-4 if e >= 80 else 1e-3 if e >= 40 else 1e-2, 120),
    "lccn": (lambda e: 0.1 if e >= 40 else 0.5, 120),  # `if e >= 40: 0.1 elif e >= 80: 0.01` never reaches 0.01
    "dmi": (lambda e: 1e-6, 100),
}


@pytest.mark.parametrize("method", sorted(CIFAR10_SCRIPTS))
def test_a_cifar10_trial_trains_with_its_methods_script_schedule(tiny_cifar: Path, method: str) -> None:
    """What the method stage of a trial uses (its optimiser, lr at every epoch, epochs, batch size) is what the
    method's script in the paper's code uses. MultiStepLR reaches 0.001 and 1e-4 by multiplying by 0.1: at most two
    roundings of 2^-53 each and 0.1's own representation error, so a relative 1e-15 bounds the difference."""
    from bench.exec.prepare import prepare
    from bench.exec.stage import SoloStage
    from bench.trial import TrialConfig

    lr_of_epoch, epochs = CIFAR10_SCRIPTS[method]
    p = prepare(TrialConfig("cifar10", method, "pairs", 0.2), tiny_cifar, log=lambda line: None)
    assert (p.method_stage.epochs, p.method_stage.batch_size) == (epochs, 256)
    stage = SoloStage(p, [torch.nn.Linear(2, 2)], p.method_stage, 0, print, print)  # losses unused: not trained
    assert type(stage.optimizer) is torch.optim.SGD
    lrs = []
    for _ in range(epochs):
        group = stage.optimizer.param_groups[0]
        assert (group["momentum"], group["weight_decay"]) == (0.9, 1e-4)
        lrs.append(group["lr"])
        stage.optimizer.step()  # no gradients: a no-op, which keeps the scheduler's order check quiet
        stage.scheduler.step()
    assert lrs == pytest.approx([lr_of_epoch(e) for e in range(epochs)], rel=1e-15, abs=0)


def test_an_explicit_lr_batch_size_or_epochs_wins_over_a_methods_schedule() -> None:
    from bench.trial import TrialConfig

    cifar10 = get_dataset("cifar10")
    grid = TrialConfig("cifar10", "dmi", "pairs", 0.2, lr=1e-4, batch_size=128).schedules()[1]
    assert (grid.lr, grid.batch_size, grid.epochs) == (1e-4, 128, 100)
    short = TrialConfig("cifar10", "fw", "pairs", 0.2, epochs=3).schedules()[1]
    assert (short.lr, short.epochs, short.milestones) == (0.01, 3, (40, 80))
    other = TrialConfig("cifar10", "mentornet", "pairs", 0.2).schedules()[1]
    assert other == cifar10.method_stage  # no script in the paper's code: the dataset's method stage


@pytest.mark.parametrize(("dataset", "method", "optimizer", "lr", "momentum", "weight_decay"), [
    # dogcat/{FW,GCE,LCCN,DMI}.py: SGD, momentum 0.9, weight decay 1e-4, one lr, 50 epochs, batch size 128.
    ("dogs_vs_cats", "fw", "sgd", 1e-4, 0.9, 1e-4),
    ("dogs_vs_cats", "gce", "sgd", 1e-3, 0.9, 1e-4),
    ("dogs_vs_cats", "lccn", "sgd", 1e-4, 0.9, 1e-4),
    ("dogs_vs_cats", "dmi", "sgd", 1e-5, 0.9, 1e-4),
    # MR/main.py: main_dmi, main_gce, main_fw with Adam (no weight decay), train_lccn with SGD; 50 epochs, batch 128.
    ("mr", "fw", "adam", 1e-4, 0.0, 0.0),
    ("mr", "gce", "adam", 1e-4, 0.0, 0.0),
    ("mr", "lccn", "sgd", 1e-4, 0.9, 1e-4),
    ("mr", "dmi", "adam", 1e-4, 0.0, 0.0),
])
def test_dogs_vs_cats_and_mr_methods_take_their_scripts_schedules(dataset, method, optimizer, lr, momentum,
                                                                   weight_decay) -> None:
    from bench.config import Schedule
    from bench.trial import TrialConfig

    schedule = TrialConfig(dataset, method, "uniform", 0.2).schedules()[1]
    assert schedule == Schedule(optimizer, lr, epochs=50, batch_size=128, momentum=momentum,
                                weight_decay=weight_decay)


def test_the_dry_run_shows_each_methods_schedule(tmp_path: Path, capsys) -> None:
    config = Path(__file__).parents[2] / "tune_configs" / "cifar10.yaml"
    # No data here: the plan is printed, then the run's missing-data line ends the dry run (exit 2, as the run).
    assert main(["run", str(config), "--dry-run", "--results", str(tmp_path / "r"), "--data-root",
                 str(tmp_path / "data")]) == 2
    prefix = "method stage of "
    stage = {line.removeprefix(prefix).split(":")[0]: line.split(": ", 1)[1]
             for line in capsys.readouterr().out.splitlines() if line.startswith(prefix)}
    for method in ("fw", "gce"):
        assert stage[method] == ("sgd lr 0.01 (x0.1 at epochs 40, 80), 120 epochs, batch 256, momentum 0.9, "
                                 "weight decay 0.0001 (its own on cifar10)")
    assert stage["lccn"].startswith("sgd lr 0.5 (x0.2 at epoch 40), 120 epochs, batch 256")
    assert stage["dmi"].startswith("sgd lr 0.0001 | 1e-05 | 1e-06, 100 epochs, batch 128 | 256")
    assert stage["dmi"].endswith("(its own on cifar10; lr, batch size from the experiment)")
    assert stage["mentornet"].startswith("sgd lr 1e-05, 100 epochs, batch 128")
    assert stage["mentornet"].endswith("(cifar10's default)")


# ---------------------------------------------------------------- the real files (skipped when absent)


@pytest.mark.realdata
def test_real_cifar10n_noise_rates(shared_data: Path) -> None:
    labels = get_dataset("cifar10n")(shared_data).human_labels_file()
    clean = labels["clean_label"]
    assert len(clean) == 50_000
    assert round(100 * np.mean(labels["aggre_label"] != clean), 2) == 9.01
    assert round(100 * np.mean(labels["worse_label"] != clean), 2) == 40.21
    lines = get_dataset("cifar10n")(shared_data).describe()
    assert any("aggre 9.01%" in line and "worse 40.21%" in line for line in lines)


@pytest.mark.realdata
def test_real_cifar10_sample_through_the_batch_format(shared_data: Path, tmp_path: Path) -> None:
    """The 200 real sample images (Kaggle PNGs) written as a CIFAR-10 python batch: the loader gives back their
    pixels, their labels agree with CIFAR-10N's clean labels (torchvision's order), and the augmentation of real
    images is a shift/flip of their normalised pixels."""
    folder = shared_data / "CIFAR-10-sample"
    with open(folder / "trainLabels.csv") as f:
        rows = [(name, label) for name, label in csv.reader(f) if name.endswith(".png")]
    rows.sort(key=lambda r: int(r[0].split(".")[0]))
    pixels = np.stack([np.asarray(Image.open(folder / "train" / name).convert("RGB")) for name, _ in rows])
    labels = [CIFAR_CLASSES.index(label) for _, label in rows]
    path = tmp_path / "data_batch_1"
    data = pixels.transpose(0, 3, 1, 2).reshape(len(rows), 3072)  # the published layout: R, G, B planes
    path.write_bytes(pickle.dumps({b"data": data, b"labels": labels}, protocol=2))
    x, y = read_batch(path)
    assert torch.equal(x, torch.from_numpy(pixels).permute(0, 3, 1, 2))
    human = get_dataset("cifar10n")(shared_data).human_labels_file()
    np.testing.assert_array_equal(y, human["clean_label"][: len(y)])

    ds = get_dataset("cifar10")(tmp_path)
    ds.normalise = cifar10_mod.PixelNormalisation(x)
    torch.manual_seed(2)
    augmented, normalised = ds.train_transform(x[:20]), ds.eval_transform(x[:20])
    assert all(_is_shift_flip(augmented[n], normalised[n], 4) for n in range(20))


@pytest.mark.realdata
def test_real_dogs_vs_cats_subset(shared_data: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("BENCH_CACHE", str(tmp_path))
    ds = get_dataset("dogs_vs_cats")(shared_data)
    splits = ds.load()
    n = len(ds.images())
    assert n == 2_002
    assert (len(splits.train), len(splits.val), len(splits.test)) == (1_001, 500, 501)
    assert splits.train.x.shape == (1_001, 3, 64, 64)
    assert 0.4 < splits.train.y.mean() < 0.6
    assert ds.status() == "ready (2,002 of 25,000)"
