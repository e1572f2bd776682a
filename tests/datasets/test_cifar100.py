"""CIFAR-100, CIFAR-100N and CIFAR-100N's coarse task: small files generated in exactly the published formats (the
python version's pickles, CIFAR-100_human.pt), the split, the checks, checksums, safe unpickling, the superclass
noise patterns, a short trial; the real CIFAR-100N label file when present."""

from __future__ import annotations

import pickle
import re
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from bench import noise
from bench.cli.main import main
from bench.config import UserError
from bench.data import get_dataset
from bench.datasets import cifar100 as cifar100_mod
from bench.datasets import cifar100n as cifar100n_mod
from bench.datasets.cifar100 import CIFAR100
from bench.datasets.cifar100n import CIFAR100N, LABELS_FILE
from bench.download import file_md5
from bench.grid.validate import check_data
from tests.datasets.conftest import (
    Payload,
    refuses_the_pickled_payload,
    trains_an_mlp,
    unpickles_nothing_of_another_md5,
)

# CIFAR-100's superclasses as its web page lists them (www.cs.toronto.edu/~kriz/cifar.html), in coarse-label order,
# spelled as the meta file spells them: the tests' own statement of the data, independent of the module's tables.
SUPERCLASSES = {
    "aquatic_mammals": ("beaver", "dolphin", "otter", "seal", "whale"),
    "fish": ("aquarium_fish", "flatfish", "ray", "shark", "trout"),
    "flowers": ("orchid", "poppy", "rose", "sunflower", "tulip"),
    "food_containers": ("bottle", "bowl", "can", "cup", "plate"),
    "fruit_and_vegetables": ("apple", "mushroom", "orange", "pear", "sweet_pepper"),
    "household_electrical_devices": ("clock", "keyboard", "lamp", "telephone", "television"),
    "household_furniture": ("bed", "chair", "couch", "table", "wardrobe"),
    "insects": ("bee", "beetle", "butterfly", "caterpillar", "cockroach"),
    "large_carnivores": ("bear", "leopard", "lion", "tiger", "wolf"),
    "large_man-made_outdoor_things": ("bridge", "castle", "house", "road", "skyscraper"),
    "large_natural_outdoor_scenes": ("cloud", "forest", "mountain", "plain", "sea"),
    "large_omnivores_and_herbivores": ("camel", "cattle", "chimpanzee", "elephant", "kangaroo"),
    "medium_mammals": ("fox", "porcupine", "possum", "raccoon", "skunk"),
    "non-insect_invertebrates": ("crab", "lobster", "snail", "spider", "worm"),
    "people": ("baby", "boy", "girl", "man", "woman"),
    "reptiles": ("crocodile", "dinosaur", "lizard", "snake", "turtle"),
    "small_mammals": ("hamster", "mouse", "rabbit", "shrew", "squirrel"),
    "trees": ("maple_tree", "oak_tree", "palm_tree", "pine_tree", "willow_tree"),
    "vehicles_1": ("bicycle", "bus", "motorcycle", "pickup_truck", "train"),
    "vehicles_2": ("lawn_mower", "rocket", "streetcar", "tank", "tractor"),
}
FINE_NAMES = tuple(sorted(name for members in SUPERCLASSES.values() for name in members))  # the meta's order
COARSE_NAMES = tuple(SUPERCLASSES)
SUPERCLASS_OF = np.array([COARSE_NAMES.index(next(s for s, m in SUPERCLASSES.items() if f in m)) for f in FINE_NAMES])
N_TRAIN, N_TEST = 60, 20  # the tiny train file: 48 train + 12 validation (the last fifth)


# ---------------------------------------------------------------- generators of the published formats


def write_cifar100(root: Path, seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """`root/cifar-100-python/{train, test, meta}` as in the official archive: pickled dicts with bytes keys,
    b"data" N x 3072 uint8 in R, G, B planes, b"fine_labels" and b"coarse_labels" lists of ints."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    written = {}
    for name, n in (("train", N_TRAIN), ("test", N_TEST)):
        fine = rng.integers(0, 100, n)
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        entry = {
            b"filenames": [f"img_{i}.png".encode() for i in range(n)],
            b"batch_label": f"{name} (generated)".encode(),
            b"fine_labels": [int(v) for v in fine],
            b"coarse_labels": [int(SUPERCLASS_OF[v]) for v in fine],
            b"data": data,
        }
        (folder / name).write_bytes(pickle.dumps(entry, protocol=2))
        written[name] = {"data": data, "fine": fine, "coarse": SUPERCLASS_OF[fine]}
    write_meta(folder / "meta", FINE_NAMES, COARSE_NAMES)
    return written


def write_meta(path: Path, fine: tuple[str, ...], coarse: tuple[str, ...]) -> None:
    meta = {b"fine_label_names": [n.encode() for n in fine], b"coarse_label_names": [n.encode() for n in coarse]}
    path.write_bytes(pickle.dumps(meta, protocol=2))


def write_cifar100n(root: Path, clean: np.ndarray, rate: float = 0.4, seed: int = 1) -> dict[str, np.ndarray]:
    """`root/CIFAR-100N/CIFAR-100_human.pt` as published in 2023: fine labels flipped at `rate`, their superclasses
    as the coarse labels."""
    rng = np.random.default_rng(seed)
    flip = rng.random(len(clean)) < rate
    noisy = np.where(flip, (clean + 1 + rng.integers(0, 99, len(clean))) % 100, clean)
    labels = {"clean_label": clean, "noisy_label": noisy, "clean_coarse_label": SUPERCLASS_OF[clean],
              "noisy_coarse_label": SUPERCLASS_OF[noisy]}
    save_human(root, labels)
    return labels


def save_human(root: Path, labels: dict[str, np.ndarray]) -> None:
    """torch.save of the published dict: the fine label sets numpy int64 arrays, the coarse ones lists of ints."""
    content = {k: [int(v) for v in y] if "coarse" in k else np.asarray(y, dtype=np.int64) for k, y in labels.items()}
    path = root / LABELS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(content, path)


def set_md5s(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    md5s = {rel: file_md5(root / rel) for rel in cifar100_mod.FILES}
    monkeypatch.setattr(CIFAR100, "files", md5s)
    monkeypatch.setattr(CIFAR100N, "files", {**md5s, LABELS_FILE: file_md5(root / LABELS_FILE)})  # and the coarse


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict]:
    """A data root with a 60 + 20 image CIFAR-100 and a matching CIFAR-100N label file (their own md5s)."""
    written = write_cifar100(tmp_path)
    written["human"] = write_cifar100n(tmp_path, written["train"]["fine"])
    set_md5s(tmp_path, monkeypatch)
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "1")
    return tmp_path, written


# ---------------------------------------------------------------- CIFAR-100


def test_the_class_tables_are_cifar100s() -> None:
    assert cifar100_mod.FINE == FINE_NAMES and cifar100_mod.COARSE == COARSE_NAMES
    np.testing.assert_array_equal(cifar100_mod.FINE_TO_COARSE, SUPERCLASS_OF)
    assert CIFAR100.num_classes == 100 and get_dataset("cifar100n_coarse").class_names == COARSE_NAMES


def test_cifar100_split_pixels_and_normalisation(tiny) -> None:
    root, written = tiny
    ds = get_dataset("cifar100")(root)
    splits = ds.load()
    assert (len(splits.train), len(splits.val), len(splits.test)) == (48, 12, 20)
    train = written["train"]
    # The training file in order: the first 48 train, the last 12 validate; a row is the R, G, B planes.
    expected = torch.from_numpy(train["data"].reshape(60, 3, 32, 32))
    assert torch.equal(splits.train.x, expected[:48]) and torch.equal(splits.val.x, expected[48:])
    assert torch.equal(splits.val.x[5, 2, 31], torch.from_numpy(train["data"][53, 2048 + 31 * 32:]))
    np.testing.assert_array_equal(splits.train.y, train["fine"][:48])
    np.testing.assert_array_equal(splits.val.y, train["fine"][48:])
    np.testing.assert_array_equal(splits.test.y, written["test"]["fine"])
    assert torch.equal(splits.test.x, torch.from_numpy(written["test"]["data"].reshape(20, 3, 32, 32)))
    # The normalisation comes from the 48 training images alone.
    torch.testing.assert_close(ds.normalise.mean, expected[:48].double().mean(0).float())
    assert ds.train_transform(splits.train.x[:4]).shape == (4, 3, 32, 32)


def test_cifar100_label_names_and_superclasses_are_checked(tiny) -> None:
    root, _ = tiny
    meta = root / "cifar-100-python" / "meta"
    write_meta(meta, tuple("computer_keyboard" if n == "keyboard" else n for n in FINE_NAMES), COARSE_NAMES)
    with pytest.raises(UserError, match="fine_label_names are not CIFAR-100's .name 39 is 'computer_keyboard', "
                                        "expected 'keyboard'"):
        get_dataset("cifar100")(root, verify=False).load()
    write_meta(meta, FINE_NAMES, COARSE_NAMES[:19])
    with pytest.raises(UserError, match="coarse_label_names are not CIFAR-100's .19 names, expected 20"):
        get_dataset("cifar100")(root, verify=False).load()
    meta.write_bytes(pickle.dumps({b"coarse_label_names": [n.encode() for n in COARSE_NAMES]}, protocol=2))
    with pytest.raises(UserError, match="meta: no fine_label_names list; use the official CIFAR-100 python file$"):
        get_dataset("cifar100")(root, verify=False).load()
    write_meta(meta, FINE_NAMES, COARSE_NAMES)
    path = root / "cifar-100-python" / "train"
    entry = pickle.loads(path.read_bytes())
    entry[b"coarse_labels"][7] = (entry[b"coarse_labels"][7] + 1) % 20
    path.write_bytes(pickle.dumps(entry, protocol=2))
    with pytest.raises(UserError, match="train: image 7 of fine class .* has coarse label .*, not its superclass"):
        get_dataset("cifar100")(root, verify=False).load()


def test_cifar100_labels_must_be_integers(tiny) -> None:
    root, _ = tiny
    path = root / "cifar-100-python" / "train"
    entry = pickle.loads(path.read_bytes())
    entry[b"fine_labels"][3] = float(entry[b"fine_labels"][3])
    path.write_bytes(pickle.dumps(entry, protocol=2))
    with pytest.raises(UserError, match=r"train: fine_labels\[3\] is [0-9]+\.0, not an integer label; use the official "
                                        "CIFAR-100 python file$"):
        get_dataset("cifar100")(root, verify=False).load()


def test_cifar100_missing_and_corrupt_files(tiny, tmp_path: Path, monkeypatch) -> None:
    root, _ = tiny
    with pytest.raises(UserError, match=r"missing cifar-100-python/train.*download cifar100.*cifar-100-python\.tar"):
        get_dataset("cifar100")(tmp_path / "nowhere").load()
    monkeypatch.setattr(CIFAR100, "files", cifar100_mod.FILES)  # the official md5s: the small files fail them
    with pytest.raises(UserError, match="cifar-100-python/train is corrupt .md5 mismatch"):
        get_dataset("cifar100")(root).load()
    assert get_dataset("cifar100")(root, verify=False).load().test.x.shape == (20, 3, 32, 32)


def test_cifar100_download_checks_the_archive(tiny, tmp_path: Path, monkeypatch, published) -> None:
    root, _ = tiny
    archive = tmp_path / "published" / cifar100_mod.ARCHIVE
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root / "cifar-100-python", arcname="cifar-100-python")
    monkeypatch.setattr(CIFAR100, "urls", {published(archive): cifar100_mod.ARCHIVE})
    monkeypatch.setattr(CIFAR100, "archive_md5", {cifar100_mod.ARCHIVE: file_md5(archive)})
    CIFAR100(tmp_path / "fresh").download()
    assert len(CIFAR100(tmp_path / "fresh").load().val) == 12
    monkeypatch.setattr(CIFAR100, "archive_md5", {cifar100_mod.ARCHIVE: cifar100_mod.ARCHIVE_MD5})
    with pytest.raises(UserError, match="arrived corrupt"):
        CIFAR100(tmp_path / "other").download()


def test_cifar100_unpickler_refuses_anything_but_numpy(tiny, tmp_path: Path) -> None:
    root, _ = tiny
    marker = tmp_path / "pwned"
    entry = {b"data": np.zeros((5, 3072), np.uint8), b"fine_labels": [0] * 5, b"coarse_labels": [4] * 5,
             b"x": Payload(marker)}
    (root / "cifar-100-python" / "train").write_bytes(pickle.dumps(entry, protocol=2))
    with pytest.raises(UserError, match="train is not a CIFAR-100 python file .refusing to load "):
        get_dataset("cifar100")(root, verify=False).load()
    assert not marker.exists()


def next_in_superclass(c: int) -> int:
    """The tests' own statement of the pattern: the next member of c's superclass by fine label, circularly."""
    members = sorted(FINE_NAMES.index(f) for f in SUPERCLASSES[COARSE_NAMES[SUPERCLASS_OF[c]]])
    return members[(members.index(c) + 1) % 5]


# No block of these patterns is singular at any r (a block's det is (1-r)^5 + r^5): a "det T = 0" warning is an error.
NOT_SINGULAR = pytest.mark.filterwarnings("error:noise .* det T = 0")


@NOT_SINGULAR
@pytest.mark.parametrize("r", [0.0, 0.3, 0.8, 1.0])
def test_the_superclass_pattern_flips_to_the_next_class_of_the_superclass(r: float) -> None:
    t = CIFAR100.transition("superclass", r)
    assert t.shape == (100, 100) and np.allclose(t.sum(axis=1), 1) and (t >= 0).all()
    expected = np.zeros((100, 100))
    for c in range(100):
        expected[c, c] += 1 - r
        expected[c, next_in_superclass(c)] += r
    np.testing.assert_array_equal(t, expected)
    assert next_in_superclass(FINE_NAMES.index("whale")) == FINE_NAMES.index("beaver")  # circularly
    assert next_in_superclass(FINE_NAMES.index("beaver")) == FINE_NAMES.index("dolphin")


@NOT_SINGULAR
def test_the_patrini_pattern_is_the_released_codes_blocks() -> None:
    """giorgiop/loss-correction noise.py: P[init:end, init:end] = build_for_cifar100(5, n) for init = 5i, i.e.
    (1 - n) I with n on the next index of the block of 5 and the block's last row's n on its first column."""
    r = 0.4
    block = (1 - r) * np.eye(5) + r * np.roll(np.eye(5), 1, axis=1)
    expected = np.kron(np.eye(20), block)
    np.testing.assert_allclose(CIFAR100.transition("patrini", r), expected, rtol=0, atol=1e-15)
    assert not np.allclose(CIFAR100.transition("superclass", r), expected)  # blocks of 5 indices are not superclasses


@NOT_SINGULAR
def test_superclass_noise_samples_within_superclasses(tiny) -> None:
    root, _ = tiny
    splits = get_dataset("cifar100")(root).load()
    labels = noise.inject("cifar100", "superclass", 1.0, 0, splits.train.y, splits.val.y,
                          CIFAR100.transition("superclass", 1.0))
    np.testing.assert_array_equal(labels.train, [next_in_superclass(c) for c in splits.train.y])


# ---------------------------------------------------------------- CIFAR-100N and its coarse task


def test_cifar100n_human_labels_for_train_and_validation(tiny) -> None:
    root, written = tiny
    human = written["human"]
    splits = get_dataset("cifar100n")(root).load()
    assert set(splits.human_labels) == {"noisy_fine"}
    train, val = splits.human_labels["noisy_fine"]
    np.testing.assert_array_equal(train, human["noisy_label"][:48])
    np.testing.assert_array_equal(val, human["noisy_label"][48:])
    np.testing.assert_array_equal(splits.train.y, human["clean_label"][:48])
    np.testing.assert_array_equal(splits.test.y, written["test"]["fine"])  # the test set keeps its clean labels
    assert len(splits.test) == 20 and all(len(t) + len(v) == 60 for t, v in splits.human_labels.values())
    summary = noise.summarise(splits.train.y, train, val, 100, None)
    flipped = sum(int(a != b) for a, b in zip(human["noisy_label"][:48], human["clean_label"][:48], strict=True))
    assert summary.noise_rate == pytest.approx(flipped / 48) and flipped > 0


def test_cifar100n_coarse_task(tiny) -> None:
    root, written = tiny
    human = written["human"]
    splits = get_dataset("cifar100n_coarse")(root).load()
    assert set(splits.human_labels) == {"noisy_coarse"}
    np.testing.assert_array_equal(splits.train.y, written["train"]["coarse"][:48])
    np.testing.assert_array_equal(splits.val.y, written["train"]["coarse"][48:])
    np.testing.assert_array_equal(splits.test.y, written["test"]["coarse"])
    train, val = splits.human_labels["noisy_coarse"]
    np.testing.assert_array_equal(np.concatenate([train, val]), human["noisy_coarse_label"])
    assert max(splits.train.y.max(), train.max()) < 20


def test_the_clean_labels_must_match_the_images(tiny, monkeypatch) -> None:
    root, written = tiny
    fix = "; use the official cifar-100-python files, whose train file's order the label file follows$"
    for key, dataset, other, image_key in (("clean_label", "cifar100n", "cifar100n_coarse", "fine_labels"),
                                           ("clean_coarse_label", "cifar100n_coarse", "cifar100n", "coarse_labels")):
        labels = written["human"][key].copy()
        labels[[5, 40]] = (labels[[5, 40]] + 1) % 20
        save_human(root, {**written["human"], key: labels})
        set_md5s(root, monkeypatch)
        with pytest.raises(UserError, match=f"^{dataset}: {key} in CIFAR-100N/CIFAR-100_human.pt disagrees with the "
                                            f"{image_key} of the CIFAR-100 train file at 2 of 60 images, first at "
                                            f"image 5{fix}"):
            get_dataset(dataset)(root).load()
        assert get_dataset(other)(root).load().human_labels  # its own clean labels still agree
    # A label file of another length: its labels cannot be the train file's images'.
    save_human(root, {k: y[:50] for k, y in written["human"].items()})
    set_md5s(root, monkeypatch)
    with pytest.raises(UserError, match="^cifar100n: CIFAR-100N/CIFAR-100_human.pt has 50 labels for the 60 images "
                                        f"of the CIFAR-100 train file{fix}"):
        get_dataset("cifar100n")(root).load()


def test_cifar100n_refuses_a_wrong_checksum_before_unpickling(tiny, monkeypatch) -> None:
    root, _ = tiny
    with unpickles_nothing_of_another_md5(CIFAR100N, LABELS_FILE, monkeypatch):
        with pytest.raises(UserError, match="cifar100n: .* is corrupt or not the published file .md5 mismatch"):
            get_dataset("cifar100n")(root).load()
        with pytest.raises(UserError, match="cifar100n_coarse: .*[(]md5 mismatch"):
            get_dataset("cifar100n_coarse")(root).load()
        # The 2021 release is named as such, with where to get the current file.
        old = {file_md5(root / LABELS_FILE): cifar100n_mod.LABELS.superseded[cifar100n_mod.RELEASE_2021_MD5]}
        monkeypatch.setattr(cifar100n_mod, "LABELS", replace(cifar100n_mod.LABELS, superseded=old))
        with pytest.raises(UserError, match="is the 2021 release whose coarse labels were revised in 2023; delete "
                                            "it and get the current one from https://github.com/UCSC-REAL/.*"
                                            "CIFAR-100_human.pt$"):
            get_dataset("cifar100n")(root).load()


def test_the_files_check_names_the_2021_release(tiny, monkeypatch) -> None:
    """The grid's pre-flight (and the check after --download) names the 2021 label file as the loader does."""
    root, _ = tiny
    monkeypatch.setattr(CIFAR100N, "files", {**CIFAR100N.files, LABELS_FILE: "0" * 32})
    old = {file_md5(root / LABELS_FILE): cifar100n_mod.LABELS.superseded[cifar100n_mod.RELEASE_2021_MD5]}
    monkeypatch.setattr(cifar100n_mod, "LABELS", replace(cifar100n_mod.LABELS, superseded=old))
    for dataset in ("cifar100n", "cifar100n_coarse"):
        named = (f"^{dataset}: {re.escape(str(root / LABELS_FILE))} is the 2021 release whose coarse labels were "
                 "revised in 2023; delete it and get the current one from https://github.com/UCSC-REAL/.*"
                 "CIFAR-100_human.pt$")
        with pytest.raises(UserError, match=named):
            check_data([dataset], root)
        with pytest.raises(UserError, match=named):
            get_dataset(dataset)(root).load()
    # Any other md5 of the label file is "corrupt", as before.
    monkeypatch.setattr(cifar100n_mod, "LABELS", replace(cifar100n_mod.LABELS, superseded={}))
    with pytest.raises(UserError, match="cifar100n: .*CIFAR-100_human.pt is corrupt .md5 mismatch.; delete it and run "
                                        "`bench datasets --download cifar100n`"):
        check_data(["cifar100n"], root)


def test_cifar100n_never_unpickles_unrestricted(tiny, tmp_path: Path, monkeypatch) -> None:
    root, written = tiny
    marker = tmp_path / "pwned"
    torch.save({"clean_label": written["human"]["clean_label"], "noisy_label": Payload(marker)}, root / LABELS_FILE)
    set_md5s(root, monkeypatch)
    ds = get_dataset("cifar100n")(root)
    refuses_the_pickled_payload(ds.load, marker, monkeypatch, "cifar100n", "CIFAR-100")
    assert any("not the published CIFAR-100N label file (its pickle names getattr" in line for line in ds.describe())
    # Anything else torch.load fails on gives the last line of its message, less torch's pointer to its docs.
    (root / LABELS_FILE).write_bytes(b"not a torch file")
    set_md5s(root, monkeypatch)
    with pytest.raises(UserError) as failure:
        ds.load()
    assert "\n" not in str(failure.value) and "Check the documentation" not in str(failure.value)
    assert "is not the published CIFAR-100N label file (" in str(failure.value)


def test_cifar100n_describe_from_the_labels_alone(tiny, capsys) -> None:
    root, written = tiny
    for rel in cifar100_mod.FILES:
        (root / rel).unlink()  # no images: the rates still come from the label file
    human = written["human"]
    fine = 100 * np.mean(human["noisy_label"] != human["clean_label"])
    coarse = 100 * np.mean(human["noisy_coarse_label"] != human["clean_coarse_label"])
    assert fine != coarse  # the test can tell them apart
    lines = get_dataset("cifar100n")(root).describe()
    assert any("missing: cifar-100-python/train" in line for line in lines)
    assert any(f"vs clean_label (all 60): noisy_fine {fine:.2f}%" in line for line in lines)
    assert any("noisy_coarse" in line and "cifar100n_coarse" in line for line in lines)  # where the coarse task is
    lines = get_dataset("cifar100n_coarse")(root).describe()
    assert any(f"vs clean_coarse_label (all 60): noisy_coarse {coarse:.2f}%" in line for line in lines)
    assert main(["datasets", "--data-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"noisy_fine {fine:.2f}%" in out and f"noisy_coarse {coarse:.2f}%" in out


def test_cifar100n_trial_on_human_labels(tiny, tmp_path: Path, monkeypatch) -> None:
    """`bench trial` end to end on the tiny files: CE on noisy_fine, an MLP instead of ResNet-34 (the pipeline is
    under test here), one epoch each stage."""
    root, written = tiny
    trains_an_mlp(CIFAR100N, monkeypatch)
    results = tmp_path / "results"
    assert main(["trial", "--dataset", "cifar100n", "--method", "ce", "--noise", "noisy_fine", "--r", "0",
                 "--epochs-warmup", "1", "--epochs", "1", "--batch-size", "16", "--data-root", str(root),
                 "--results", str(results)]) == 0
    (path,) = (results / "trials").glob("*.parquet")
    row = pl.read_parquet(path).row(0, named=True)
    human = written["human"]
    assert (row["status"], row["dataset"], row["noise"]) == ("ok", "cifar100n", "noisy_fine")
    assert row["noise_rate"] == pytest.approx(np.mean(human["noisy_label"][:48] != human["clean_label"][:48]))
    assert 0 <= row["test_acc"] <= 100


# ---------------------------------------------------------------- the real label file (skipped when absent)


@pytest.mark.realdata
def test_real_cifar100n_labels(shared_data: Path) -> None:
    assert CIFAR100N.files[LABELS_FILE] == "a67b45c1d7992051865b5c755bd68bb1"  # the current (2023) release
    labels = get_dataset("cifar100n")(shared_data).human_labels_file()  # refuses any file of another md5
    clean = labels["clean_label"]
    assert len(clean) == 50_000
    assert round(100 * np.mean(labels["noisy_label"] != clean), 2) == 40.20  # the published rate
    # 26.40%: the coarse rate of this md5-fixed file (a67b45c1...), computed from it; the CIFAR-N paper's 25.60% is
    # the 2021 file's, whose coarse labels were not CIFAR-100's superclasses.
    assert round(100 * np.mean(labels["noisy_coarse_label"] != labels["clean_coarse_label"]), 2) == 26.40
    np.testing.assert_array_equal(labels["clean_coarse_label"], SUPERCLASS_OF[clean])  # the same superclasses
    lines = get_dataset("cifar100n")(shared_data).describe()
    assert any("noisy_fine 40.20%" in line for line in lines)
