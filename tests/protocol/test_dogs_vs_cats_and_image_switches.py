"""Issue 36: Dogs vs Cats under `authors`, and the switches left on Fashion-MNIST and CIFAR-10. Each switch is checked
against an independent computation: the scripts' torchvision pipelines rebuilt here from torchvision's own transforms
on PIL images (bit for bit), the selection rules against the epoch a direct reading of the numbers picks."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from PIL import Image
from torch import nn
from torchvision.transforms import InterpolationMode

from bench.cli.main import main
from bench.config import Schedule
from bench.data import Split, deterministic_permutation, get_dataset
from bench.exec.prepare import SplitLoader
from bench.exec.stage import SoloStage, run_stage
from bench.exec.trainer import run_trial
from bench.models import create
from bench.protocol import Protocol, Selection, Switch
from bench.report import analysis, leaderboard, protocols
from bench.trial import TrialConfig
from tests.report.test_report import make_row, write

REPO = Path(__file__).resolve().parents[2]
QUIET = dict(log=lambda s: None)
IMAGENET = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
DOGCAT = get_dataset("dogs_vs_cats")


# -- Dogs vs Cats: the scripts' images ----------------------------------------------------------------------------
def kaggle_folder(root: Path, n_per_class: int = 8) -> Path:
    """A data root holding Kaggle's layout, dogs-vs-cats/train/{cat,dog}.N.jpg, of JPEGs of assorted sizes (some
    smaller than 150 pixels, some larger, none square) with structure for a rotation to move."""
    folder = root / "dogs-vs-cats" / "train"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for kind in ("cat", "dog"):
        for i in range(n_per_class):
            h, w = int(rng.integers(90, 260)), int(rng.integers(90, 260))
            yy, xx = np.mgrid[0:h, 0:w]
            image = np.stack([(xx * 255 // w), (yy * 255 // h), rng.integers(0, 256, (h, w))], -1).astype(np.uint8)
            Image.fromarray(image).save(folder / f"{kind}.{i}.jpg", quality=90)
    return root


def split_files(ds, part: str) -> list[Path]:
    """The files of one split in split order, by the split's rule (a fixed permutation of the sorted names)."""
    entries, n = ds.images(), len(ds.images())
    order = deterministic_permutation(n, "dogs_vs_cats-split")
    n_train, n_val = n * 12_500 // 25_000, n * 6_250 // 25_000
    idx = {"train": order[:n_train], "val": order[n_train : n_train + n_val], "test": order[n_train + n_val :]}[part]
    return [ds.root / "train" / entries[i][0] for i in idx]


def script_eval(path: Path) -> torch.Tensor:
    """dogcat.py's test_transform (lines 31-35), interpolation=2 being PIL's bilinear."""
    pipeline = T.Compose([T.Resize((150, 150), interpolation=InterpolationMode.BILINEAR), T.ToTensor(), IMAGENET])
    return pipeline(Image.open(path).convert("RGB"))


def script_train(path: Path, flip: bool, angle: float) -> torch.Tensor:
    """dogcat.py's train_transform (lines 24-30) with its two random draws given: RandomHorizontalFlip, then
    RandomRotation(45) (nearest, fill 0) by `angle`."""
    image = T.Resize((150, 150), interpolation=InterpolationMode.BILINEAR)(Image.open(path).convert("RGB"))
    image = TF.hflip(image) if flip else image
    image = TF.rotate(image, angle, InterpolationMode.NEAREST, fill=0)
    return IMAGENET(T.ToTensor()(image))


def check_dogcat_images(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_CACHE", str(tmp_path / "cache"))
    ds = DOGCAT(root, trial_protocol=DOGCAT.protocol("bench+script_transform"))
    splits = ds.load()
    assert splits.train.x.shape[1:] == (3, 150, 150) and splits.model_args == {"image_size": 150}
    got = ds.eval_transform(splits.test.x)
    for k, path in enumerate(split_files(ds, "test")):
        assert torch.equal(got[k], script_eval(path)), path.name
    generator = torch.Generator().manual_seed(7)
    trained = ds.train_transform(splits.train.x, generator=generator)
    draws = torch.Generator().manual_seed(7)  # the draws train_transform makes: the batch's flips, then its angles
    flips = torch.rand(len(trained), generator=draws) < 0.5
    angles = torch.empty(len(trained)).uniform_(-45, 45, generator=draws)
    assert flips.any() and not flips.all()
    for k, path in enumerate(split_files(ds, "train")):
        assert torch.equal(trained[k], script_train(path, bool(flips[k]), float(angles[k]))), path.name
    # bench's own images stay 64 pixels, per-pixel normalised, in another cache file
    bench = DOGCAT(root)
    own = bench.load()
    assert own.train.x.shape[1:] == (3, 64, 64) and bench.cache_file(bench.images()) != ds.cache_file(ds.images())


def test_authors_images_are_the_scripts_torchvision_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_dogcat_images(kaggle_folder(tmp_path / "data"), tmp_path, monkeypatch)


@pytest.mark.realdata
def test_authors_images_on_real_kaggle_files(shared_data: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    source = shared_data / "dogs-vs-cats" / "train"
    if not (source / "cat.0.jpg").exists():
        pytest.skip(f"no Dogs vs Cats images under {source}")
    folder = tmp_path / "data" / "dogs-vs-cats" / "train"
    folder.mkdir(parents=True)
    for kind in ("cat", "dog"):
        for i in range(8):
            shutil.copy(source / f"{kind}.{i}.jpg", folder)
    check_dogcat_images(tmp_path / "data", tmp_path, monkeypatch)


def test_rotation_is_pillows_pixel_for_pixel() -> None:
    """Random images of odd and even sizes, 300 angles in [-45, 45] drawn as RandomRotation draws them and the
    boundaries: every pixel as Pillow's rotate (the torchvision pipeline's) puts it."""
    from bench.datasets.dogs_vs_cats import rotate_nearest

    rng = np.random.default_rng(3)
    angles = [float(a) for a in torch.empty(300).uniform_(-45, 45, generator=torch.Generator().manual_seed(0))]
    for h, w in ((150, 150), (37, 52)):
        array = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        batch = torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0).expand(len(angles) + 3, -1, -1, -1)
        every = angles + [45.0, -45.0, 0.0]
        got = rotate_nearest(batch.contiguous(), every).permute(0, 2, 3, 1).numpy()
        for k, angle in enumerate(every):
            want = np.asarray(TF.rotate(Image.fromarray(array), angle, InterpolationMode.NEAREST, fill=0))
            assert np.array_equal(got[k], want), (h, w, angle)


def test_vgg16_at_the_scripts_150_pixels_reads_8192_features() -> None:
    """dogcat.py:102: nn.Linear(8192, 2) after five 2x2 max-pools of a 150-pixel image (150 -> 4)."""
    assert create("vgg16_bn", 2, image_size=150).classifier.in_features == 512 * 4 * 4
    small = create("vgg16_bn", 2, image_size=150, width=8)
    assert small(torch.zeros(2, 3, 150, 150)).shape == (2, 2)


# -- Fashion-MNIST and CIFAR-10: the scripts' normalisation -------------------------------------------------------
def test_fashion_script_transform_is_to_tensor_then_normalize(tiny_fashion: Path) -> None:
    """fashion.py:187-192: ToTensor, Normalize((0.1307,), (0.3081,)) of each 28 x 28 byte image (mode L)."""
    from bench.datasets.fashion_mnist import read_idx

    fashion = get_dataset("fashion_mnist")
    ds = fashion(tiny_fashion, verify=False, trial_protocol=fashion.protocol("bench+script_transform"))
    splits = ds.load()
    raw = read_idx(tiny_fashion / "FashionMNIST" / "raw" / "t10k-images-idx3-ubyte.gz")
    pipeline = T.Compose([T.ToTensor(), T.Normalize((0.1307,), (0.3081,))])
    want = torch.stack([pipeline(Image.fromarray(image, mode="L")) for image in raw])
    assert torch.equal(ds.eval_transform(splits.test.x), want)
    assert torch.equal(ds.train_transform(splits.test.x), want)  # no augmentation in the script either
    bench = get_dataset("fashion_mnist")(tiny_fashion, verify=False)
    assert torch.equal(bench.eval_transform(splits.test.x), splits.test.x)  # bench: bytes / 255, as before


def write_cifar(root: Path) -> Path:
    """A CIFAR-10 python layout with 20 images a batch (its stand-in; checksums off)."""
    get_dataset("cifar10").stand_in(root, 80, seed=2)
    return root


def test_cifar10_script_transform_pads_the_raw_image_with_black(tmp_path: Path) -> None:
    """dataset.py:200-226: the training images flipped and cropped from the raw image padded with 4 black pixels,
    then ToTensor and ImageNet's Normalize; evaluation: ToTensor, Normalize. Bench pads after normalising (zero is
    the mean), so its padded border differs."""
    cifar10 = get_dataset("cifar10")
    ds = cifar10(write_cifar(tmp_path), verify=False, trial_protocol=cifar10.protocol("bench+script_transform"))
    x = ds.load().train.x[:16]
    pils = [Image.fromarray(image.permute(1, 2, 0).numpy()) for image in x]
    pipeline = T.Compose([T.ToTensor(), IMAGENET])
    assert torch.equal(ds.eval_transform(x), torch.stack([pipeline(image) for image in pils]))
    got = ds.train_transform(x, generator=torch.Generator().manual_seed(4))
    draws = torch.Generator().manual_seed(4)  # random_shift_flip's draws: tops, lefts, then flips
    tops, lefts = (torch.randint(0, 9, (16,), generator=draws) for _ in range(2))
    flips = torch.rand(16, generator=draws) < 0.5
    for k, image in enumerate(pils):
        crop = TF.crop(TF.pad(image, 4, fill=0), int(tops[k]), int(lefts[k]), 32, 32)
        want = pipeline(TF.hflip(crop) if flips[k] else crop)
        assert torch.equal(got[k], want), k
    assert (got == pipeline(Image.new("RGB", (1, 1)))[:, 0, 0].view(3, 1, 1)).any()  # a black border, normalised


# -- selection: LCCN's rules ---------------------------------------------------------------------------------------
class Table(nn.Module):
    """Logits looked up by (epoch, example index), the epoch moved by each training step."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table, self.w, self.epoch = table, nn.Parameter(torch.zeros(())), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[self.epoch][x.long()] + 0 * self.w


def table_stage(table: torch.Tensor, val_labels: np.ndarray, test_labels: np.ndarray) -> SoloStage:
    """A solo stage whose validation examples are rows 0..n-1 of each epoch's table and test examples the rest."""
    ds = SimpleNamespace(num_classes=2, train_transform=lambda x, generator=None: x, eval_transform=lambda x: x)
    n = len(val_labels)
    val = SplitLoader(Split(torch.arange(n, dtype=torch.float32), val_labels), val_labels, ds, torch.device("cpu"))
    test_x = torch.arange(n, n + len(test_labels), dtype=torch.float32)
    test = SplitLoader(Split(test_x, test_labels), test_labels, ds, torch.device("cpu"))
    p = SimpleNamespace(val=val, train=val, test=test, dataset=ds, protocol=Protocol(), epoch_eval=False)

    def step(nets: list[nn.Module], batch: object) -> torch.Tensor:
        nets[0].epoch += 1  # one step an epoch: the batch is the whole split
        return nets[0].w * 0

    return SoloStage(p, [Table(table)], Schedule("sgd", 1e-3, epochs=3, batch_size=n), 0, step,
                     lambda logits, y: nn.functional.cross_entropy(logits, y))


def test_lccn_oracle_keeps_the_epoch_of_the_best_test_accuracy_never_the_warm_start() -> None:
    """dogcat/LCCN.py:66, 121-128: best_test_acc = 0, an epoch kept when its test accuracy is > the best. The
    warm-started model (epoch 0) is perfect on test and best on validation, and still not kept; epochs 2 and 3 tie
    at the highest test accuracy, and strict keeps 2; bench keeps the warm start (lowest validation loss)."""
    val_labels, test_labels = np.array([0, 1, 0, 1]), np.array([0, 1, 0, 1, 0, 1, 0, 1])
    labels = torch.as_tensor(np.concatenate([val_labels, test_labels]))
    right = torch.where(labels[:, None] == torch.arange(2), 2.0, -2.0)
    correct_on_test = {0: 8, 1: 4, 2: 6, 3: 6}
    table = torch.stack([right.clone() for _ in range(4)])
    for epoch, k in correct_on_test.items():
        table[epoch, 4 + k :] *= -1  # test examples past the first k wrong
        table[epoch, :4] *= 1.0 / (1 + epoch)  # validation: ever less sure, the warm start the lowest loss
    test_acc = {e: 100 * k / 8 for e, k in correct_on_test.items() if e}
    want = min(e for e in test_acc if test_acc[e] == max(test_acc.values()))
    oracle = Selection("accuracy", on="test", initial=False)
    got = run_stage(table_stage(table, val_labels, test_labels), "method", 3, lambda s: None, True,
                    selection=oracle)
    assert got.best_epoch[0] == want == 2
    assert [row["epoch"] for row in got.epochs[0]] == [1, 2, 3]  # no epoch-0 candidate recorded
    bench = run_stage(table_stage(table, val_labels, test_labels), "method", 3, lambda s: None, True)
    assert bench.best_epoch[0] == 0


def test_softmax_ce_rule_sums_batch_means_of_ce_of_probabilities() -> None:
    """CIFAR-10/LCCN.py:42-56: loss_t += CE(softmax(output), target) per validation batch of 256."""
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(600, 10, generator=g) * 3, torch.randint(0, 10, (600,), generator=g)
    z = logits.double().numpy()
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    ce = np.log(np.exp(p).sum(1)) - p[np.arange(600), labels.numpy()]  # CE applied to the probabilities
    want = sum(ce[s : s + 256].mean() for s in range(0, 600, 256))
    assert Selection("softmax_ce", batch=256).logit_score(logits, labels) == pytest.approx(want, rel=1e-12)
    assert Selection("softmax_ce").logit_score(logits, labels) == pytest.approx(ce.mean(), rel=1e-12)
    rule = get_dataset("cifar10").protocol("authors").selection("lccn")
    assert rule == Selection("softmax_ce", batch=256) and rule.initial and not rule.oracle


def test_oracle_rows_are_flagged_and_select_the_best_test_epoch(tiny_fashion: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A real LCCN trial (`bench trial`) under an oracle rule (Dogs vs Cats' LCCN rule, declared on the tiny
    Fashion-MNIST): the row is flagged, the summary says so, and the trial keeps the method-stage epoch whose test
    accuracy (the curve's) is the first maximum; the same trial under bench is not flagged."""
    fashion = get_dataset("fashion_mnist")
    lccn_rule = DOGCAT.switches()["first_batch_selection"]
    assert lccn_rule.setting["lccn"].oracle and not lccn_rule.setting["dmi"].oracle
    monkeypatch.setattr(fashion, "authors_protocol", (Switch("first_batch_selection", lccn_rule.cite, "test",
                                                             {"lccn": lccn_rule.setting["lccn"]}),))
    assert main(["trial", "--dataset", "fashion_mnist", "--method", "lccn", "--noise", "case3", "--r", "0.3",
                 "--seed", "1", "--epochs", "4", "--epochs-warmup", "2", "--protocol", "bench+first_batch_selection",
                 "--data-root", str(tiny_fashion), "--results", str(tmp_path / "r")]) == 0
    assert "  oracle: its epoch was kept by clean test accuracy" in capsys.readouterr().out
    row = pl.read_parquet(next((tmp_path / "r" / "trials").glob("*.parquet"))).to_dicts()[0]
    curves = pl.read_parquet(tmp_path / "r" / "epochs" / f"{row['trial_id']}.parquet")
    method = curves.filter(pl.col("stage") == "method").sort("epoch")
    accs = method["test_acc"].to_list()
    assert method["epoch"].to_list() == [1, 2, 3, 4]
    assert row["oracle"] is True and row["best_epoch"] == 1 + accs.index(max(accs))
    assert row["test_acc"] == max(accs)
    from mlflow import MlflowClient

    from bench.store.mirror import open_mirror

    open_mirror(tmp_path / "r", None).sync(tmp_path / "r")  # the MLflow mirror tags the run
    client = MlflowClient(f"sqlite:///{tmp_path / 'r' / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("adhoc").experiment_id], "tags.`bench.kind` = 'trial'")
    assert run.data.tags["bench.oracle"] == "true"
    plain = run_trial(TrialConfig("fashion_mnist", "lccn", "case3", 0.3, seed=1, epochs=4, epochs_warmup=2),
                      tiny_fashion, **QUIET)
    assert plain["oracle"] is False


def test_the_protocol_panel_marks_oracle_cells(tmp_path: Path) -> None:
    """Dogs vs Cats at r = 0.4, bench and authors: LCCN's authors rows flagged as the trainer flags them."""
    rows = []
    for spec in ("bench", "authors"):
        for method in ("lccn", "dmi"):
            for seed in range(3):
                row = make_row(method, 0.4, seed, 0.5, 60.0 + seed + (spec == "authors"), dataset="dogs_vs_cats",
                               noise="cat_to_dog")
                row["trial_id"] = f"{row['trial_id'][:8]}{spec[:4]}{seed:04d}"
                row |= dict(protocol=spec, oracle=spec == "authors" and method == "lccn")
                rows.append(row)
    df = analysis.load_trials(write(tmp_path / "r", rows))
    panel = {row["method"]: row for row in protocols.compare(df).iter_rows(named=True)}
    assert panel["lccn"]["oracle"] is True and panel["dmi"]["oracle"] is False
    text = protocols.to_markdown(protocols.compare(df))
    lccn_line = next(line for line in text.splitlines() if "| 0.4 |" in line and "LCCN" in line)
    assert protocols.ORACLE in lccn_line and protocols.ORACLE in protocols.NOTE
    assert all(protocols.ORACLE not in line for line in text.splitlines() if "L_DMI" in line)
    # a folder of authors' rows alone: its accuracy tables mark LCCN and bold no oracle as the row's best
    authors = analysis.load_trials(write(tmp_path / "a", [r for r in rows if r["protocol"] == "authors"]))
    grid = analysis.aggregate(authors)
    [table] = leaderboard.tables(grid, analysis.paired_comparison(authors, grid))
    assert sorted(table.header()) == ["LCCN ‡", "L_DMI"]
    assert not table.entries[(0.4, "lccn")].best and table.entries[(0.4, "dmi")].best


# -- the grid -----------------------------------------------------------------------------------------------------
def test_dry_run_of_the_dogs_vs_cats_grid_lists_its_switches(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    assert main(["run", str(REPO / "tune_configs" / "dogs_vs_cats_protocols.yaml"), "--dry-run",
                 "--results", str(tmp_path / "r"), "--data-root", str(tmp_path / "none")]) == 2
    out, err = capsys.readouterr()  # the plan, then the run's one line on the missing data
    assert err.startswith("bench: error: dogs_vs_cats: missing ")
    assert "protocol authors: 8 switches of the authors' scripts" in out
    for name, switch in DOGCAT.switches().items():
        assert f"  {name}: {switch.what} ({switch.cite})" in out
    assert "clean test set (an oracle)" in out
