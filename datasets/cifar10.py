"""CIFAR-10 as the paper uses it: batches 1-4 train, batch 5 validates, the official test batch tests.

Reads torchvision's python-pickle layout, `DATA_ROOT/cifar-10-batches-py/{data_batch_1..5, test_batch,
batches.meta}`, checked against the official md5s; `bench datasets --download cifar10` fetches the official archive
and checks its md5 before unpacking it. Each batch is a pickled dict: b"data" (N x 3072 uint8; a row is the 1024 red,
then 1024 green, then 1024 blue values of a 32 x 32 image in row-major order), b"labels" (N ints), b"batch_label",
b"filenames". The pickles are read by a restricted unpickler that builds numpy arrays and nothing else.

Images stay uint8 (N x 3 x 32 x 32) on the training device. `eval_transform` subtracts the training split's
per-pixel mean image and divides by its per-pixel standard-deviation image; `train_transform` then shifts every
image by up to 4 pixels (a random 32 x 32 crop of the image zero-padded by 4, zero being the mean after
normalisation) and mirrors half of them, for the whole batch at once, as tensor operations on the device (as
airbench does), drawing from the generator it is given (a packed member's own) or torch's. This module also owns
those image helpers (pixel normalisation, vectorised crop and flip), the reader of CIFAR python pickles and the
allow-list for numpy pickles, which Dogs vs Cats, CIFAR-10N and CIFAR-100 reuse.
"""

from __future__ import annotations

import codecs
import pickle
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench import noise
from bench.config import Schedule, UserError
from bench.data import Dataset, Split, Splits
from bench.protocol import Selection, Switch, titan_xp_float32

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
BATCHES = "cifar-10-batches-py"
URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
ARCHIVE = "cifar-10-python.tar.gz"
ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
FILES = {
    f"{BATCHES}/data_batch_1": "c99cafc152244af753f735de768cd75f",
    f"{BATCHES}/data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    f"{BATCHES}/data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    f"{BATCHES}/data_batch_4": "634d18415352ddfa80567beed471001a",
    f"{BATCHES}/data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    f"{BATCHES}/test_batch": "40351d587109b95175f43aff81a1287e",
    f"{BATCHES}/batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
}
PADDING = 4
# ImageNet's channel statistics, by which the authors' CIFAR-10 and Dogs vs Cats scripts normalise (and Clothing1M).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# What a pickled numpy array needs, and nothing more: the array rebuilder (under its numpy 1 and numpy 2 module
# names), the array and dtype types, and `_codecs.encode`, which protocol-2 pickles use to spell bytes.
RECONSTRUCT = np.empty(0).__reduce__()[0]
NUMPY_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,
}


class NumpyUnpickler(pickle.Unpickler):
    """Builds dicts, lists, strings, numbers and numpy arrays; refuses every other global."""

    def find_class(self, module: str, name: str) -> object:
        try:
            return NUMPY_PICKLE_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: not part of a numpy pickle") from None


def read_pickle(path: Path, what: str = "CIFAR-10 python batch") -> dict[str, object]:
    """A CIFAR python pickle (a Python 2 pickle): its dict, keys as str whether pickled as str or bytes; `what` names
    the file in messages."""
    try:
        with open(path, "rb") as f:
            entry = NumpyUnpickler(f, encoding="latin1").load()
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror or e})") from None
    except Exception as e:  # noqa: BLE001 - whatever damaged bytes make the unpickler raise (a MemoryError for a huge
        # declared size, an OverflowError, a RecursionError, ...) means a damaged file
        detail = " ".join(str(e).split()) or type(e).__name__
        raise UserError(f"{path} is not a {what} ({detail}); use the official files") from None
    if not isinstance(entry, dict):
        raise UserError(f"{path} is not a {what} (holds a {type(entry).__name__}, not a dict)")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in entry.items()}


def read_batch(path: Path) -> tuple[torch.Tensor, np.ndarray]:
    """One batch file: images (N x 3 x 32 x 32 uint8) and labels (int64)."""
    images, labels = read_images(path, {"labels": len(CLASSES)}, "CIFAR-10 python batch")
    return images, labels["labels"]


def read_images(path: Path, label_sets: dict[str, int], what: str) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
    """A CIFAR python pickle of images (CIFAR-10's batches, CIFAR-100's train and test): its images (N x 3 x 32 x 32
    uint8) and the label lists `label_sets` names (key -> number of classes), each int64 and checked."""
    entry = read_pickle(path, what)
    needed = ["data", *label_sets]
    if any(k not in entry for k in needed):
        raise UserError(f"{path} is not a {what} (keys {sorted(entry)}; expected {', '.join(needed)})")
    data = np.asarray(entry["data"])
    labels = {}
    for key, classes in label_sets.items():
        y = integer_labels(entry[key], classes, f"{path}: {key}", what)
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(y) != len(data):
            raise UserError(f"{path}: expected data of N x 3072 uint8 and N {key}, got {data.dtype} {data.shape} "
                            f"and {len(y)} {key}")
        labels[key] = y
    return torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()), labels


def integer_labels(values: object, classes: int, where: str, what: str) -> np.ndarray:
    """A pickle's list (or 1-D array) of labels in 0..classes-1, as int64. Anything else (a string, a float, even
    3.0) is a `UserError` naming `where` (the file and key) and saying to use the official `what`."""
    if not isinstance(values, list | tuple) and not (isinstance(values, np.ndarray) and values.ndim == 1):
        raise UserError(f"{where} is a {type(values).__name__}, not a list of labels; use the official {what}")
    bad = next((i for i, v in enumerate(values) if isinstance(v, bool) or not isinstance(v, int | np.integer)), None)
    if bad is not None:
        raise UserError(f"{where}[{bad}] is {values[bad]!r}, not an integer label; use the official {what}")
    if len(values) and (min(values) < 0 or max(values) >= classes):
        raise UserError(f"{where} outside 0..{classes - 1}; use the official {what}")
    return np.asarray(values, dtype=np.int64)


def read_label_names(path: Path, key: str = "label_names", what: str = "CIFAR-10 python batch") -> tuple[str, ...]:
    names = read_pickle(path, what).get(key)
    if not isinstance(names, list):
        raise UserError(f"{path}: no {key} list; use the official {what}")
    return tuple(n.decode("latin1") if isinstance(n, bytes) else str(n) for n in names)


class PixelNormalisation:
    """Per-pixel standardisation: the mean and standard-deviation images of a training split (C x H x W)."""

    def __init__(self, images: torch.Tensor, chunk: int = 4096) -> None:
        total = torch.zeros(images.shape[1:], dtype=torch.float64)
        squares = torch.zeros_like(total)
        for start in range(0, len(images), chunk):  # float64 sums, a chunk of images at a time
            block = images[start : start + chunk].to(torch.float64)
            total += block.sum(dim=0)
            squares += block.square().sum(dim=0)
        n = max(len(images), 1)
        mean = total / n
        std = (squares / n - mean.square()).clamp_min(0).sqrt()
        self.mean = mean.float()
        self.std = std.clamp_min(1.0).float()  # a constant pixel (tiny sets) must not divide by zero
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.device not in self._on:
            self._on[x.device] = (self.mean.to(x.device), self.std.to(x.device))
        mean, std = self._on[x.device]
        return (x.float() - mean) / std


def normalise_channels(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """torchvision's Normalize(mean, std) on a float batch (N x C x H x W): minus the float32 mean, over the float32
    std, per channel (the same operations in the same order: the same bits)."""
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - m) / s


def to_tensor(x: torch.Tensor) -> torch.Tensor:
    """torchvision's ToTensor on a uint8 batch: float32, divided by 255."""
    return x.to(torch.float32).div(255)


def crop_flip(
    x: torch.Tensor, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor, height: int, width: int
) -> torch.Tensor:
    """For every image n of the batch x (N x C x H x W): the height x width window whose top-left corner is
    (top[n], left[n]), mirrored left-right where flip[n]. One gather for the whole batch."""
    n = x.shape[0]
    rows = top[:, None] + torch.arange(height, device=x.device)  # N x height
    cols = left[:, None] + torch.arange(width, device=x.device)  # N x width
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    batch = torch.arange(n, device=x.device)[:, None, None]
    return x.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


def random_shift_flip(x: torch.Tensor, padding: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random crops of the zero-padded images back to their size (shifts of up to `padding` pixels) and
    random horizontal flips (probability 1/2), drawn from `generator` (None: torch's generator on x's device)."""
    n, _, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    top = torch.randint(0, 2 * padding + 1, (n,), device=x.device, generator=generator)
    left = torch.randint(0, 2 * padding + 1, (n,), device=x.device, generator=generator)
    flip = torch.rand(n, device=x.device, generator=generator) < 0.5
    return crop_flip(padded, top, left, flip, h, w)


# FW's method stage in the paper's code, which fw_oracle (FW with the true T) shares.
FW_STAGE = Schedule("sgd", 0.01, epochs=120, batch_size=256, momentum=0.9, weight_decay=1e-4, milestones=(40, 80))


class CIFAR10(Dataset):
    """CIFAR-10 (python batches)."""

    name = "cifar10"
    title = "CIFAR-10"
    num_classes = 10
    class_names = CLASSES
    split_sizes = (40_000, 10_000, 10_000)
    model = "resnet34_cifar"
    # The paper's appendix C: truck -> automobile, bird -> airplane, deer -> horse, cat -> dog, each with prob. r.
    noise_patterns = {"pairs": noise.flip({9: 1, 2: 0, 4: 7, 3: 5})}
    paper_noise = "pairs"
    warmup = Schedule("sgd", 0.1, epochs=120, batch_size=128, momentum=0.9, weight_decay=1e-4, milestones=(40, 80))
    # The method stage of a method the paper's code has no script for (MentorNet, VAT, the newer methods; CE's
    # script is the warm start itself, so the `ce` trial continues it here), as the paper's section 5.2 states it:
    # SGD, momentum 0.9, weight decay 1e-4, lr 1e-5, batch size 128, for the 100 epochs of the authors' DMI.py.
    method_stage = Schedule("sgd", 1e-5, epochs=100, batch_size=128, momentum=0.9, weight_decay=1e-4)
    # The methods the paper's code trains, each with its own script's schedule: github.com/Newbeeer/L_DMI, CIFAR-10/
    # {FW,GCE,LCCN,DMI}.py at c6e3d6d2ff25e52fb287052eda1e66e64f97e161 (2019-10-01; their schedules unchanged at
    # 7d5e4bc): SGD, momentum 0.9, weight decay 1e-4, and the batch size 256 of its dataset.py (the paper's text says
    # 128). The scripts build a new optimiser every epoch; here its momentum carries over (a flaw not copied). The L_DMI
    # grid of the experiment file (lr 1e-4 / 1e-5 / 1e-6 x batch size 128 / 256) sets its own lr and batch size.
    method_stages = {
        # FW.py and GCE.py: lr 0.01, 0.001 from epoch 40, 1e-4 from epoch 80, 120 epochs. fw_oracle (FW with the true
        # T, which the paper's code does not run) trains as FW does.
        "fw": FW_STAGE,
        "fw_oracle": FW_STAGE,
        "gce": Schedule("sgd", 0.01, epochs=120, batch_size=256, momentum=0.9, weight_decay=1e-4,
                        milestones=(40, 80)),
        # LCCN.py: lr 0.5, 0.1 from epoch 40 (its `elif epoch_idx >= 80: 0.01` follows `if epoch_idx >= 40` and is
        # never reached), 120 epochs.
        "lccn": Schedule("sgd", 0.5, epochs=120, batch_size=256, momentum=0.9, weight_decay=1e-4, milestones=(40,),
                         gamma=0.2),
        # DMI.py: lr 1e-6, 100 epochs.
        "dmi": Schedule("sgd", 1e-6, epochs=100, batch_size=256, momentum=0.9, weight_decay=1e-4),
        # VolMinNet, a newer method, on its own code's schedule (xuefeng-li1/Provably-end-to-end-label-noise-learning-
        # without-anchor-points main.py, 06e4167, lines 55-59, 70-76, 94-96; CIFAR-10 and CIFAR-100 alike): the
        # classifier's SGD at lr 0.01 (its --lr, T's too), momentum 0.9, weight decay 1e-4, batch size 128, 80 epochs,
        # both rates x 0.1 at epochs 30 and 60 (two MultiStepLR on the same milestones).
        "volminnet": Schedule("sgd", 0.01, epochs=80, batch_size=128, momentum=0.9, weight_decay=1e-4,
                              milestones=(30, 60)),
    }
    # How the paper's CIFAR-10 scripts ran it (github.com/Newbeeer/L_DMI at 54e0d5d, 2020-07-08: the last commit whose
    # scripts run; dce6c41 moved dataset.py's loaders into a get_loader that no script calls, so from there on, and at
    # the 7d5e4bc the other sets cite, CE.py stops at import with a NameError on test_loader_; the scripts and
    # model.py are the same at both, dataset.py the same code one indentation level out): the `authors` protocol.
    # FW.py and GCE.py select on the whole validation set by their loss, strict (bench's rule, up to the last batch's
    # weight).
    authors_protocol = (
        Switch("warmup_by_accuracy", "Newbeeer/L_DMI, CIFAR-10/CE.py:52-72, commit 54e0d5d",
               "main_ce saves the model whenever noisy-validation accuracy >= the best so far (from 0)"),
        Switch("first_batch_selection", "Newbeeer/L_DMI, CIFAR-10/DMI.py:79-100, 103-122 and LCCN.py:42-56, 96, "
               "143-151, commit 54e0d5d",
               "validate_acc() stops after the first batch of 256 (i == 1: break); main_dmi keeps an epoch whose "
               "accuracy there is > the best, the warm-started model first; train_lccn keeps an epoch whose CE of "
               "the softmax outputs (CE(softmax(output), y), no phi), summed over the validation batches of 256, is "
               "< the best, the warm-started model's the first bar",
               {"dmi": Selection("accuracy", first=256), "lccn": Selection("softmax_ce", batch=256)}),
        Switch("optimizer_per_epoch", "Newbeeer/L_DMI, CIFAR-10/CE.py:63, DMI.py:112, FW.py:122, GCE.py:117, "
               "LCCN.py:106, commit 54e0d5d",
               "every script builds a new SGD (momentum 0.9) at the start of each epoch"),
        Switch("script_noise", "Newbeeer/L_DMI, CIFAR-10/dataset.py:39-57, 127-131, commit 54e0d5d",
               "each split's CIFAR10_ re-seeds np.random with the seed and calls np.random.choice per label, T a "
               "float32 tensor", {"validation": "reseed", "float32": True}),
        Switch("ce_is_warm_start", "Newbeeer/L_DMI, CIFAR-10/CE.py:81-84, commit 54e0d5d",
               "the CE result is evaluate('./model_ce_...'): the warm start itself"),
        Switch("dmi_script_form", "Newbeeer/L_DMI, CIFAR-10/DMI.py:12-19, commit 54e0d5d",
               "DMI_loss: -log(|det(onehot^T softmax)| + 0.001), the matrix summed over the batch, in float32", "sum"),
        Switch("warmup_batch_size", "Newbeeer/L_DMI, CIFAR-10/dataset.py:22, commit 54e0d5d",
               "dataset.py's batch_size = 256 for every loader, the CE warm start's too", 256),
        Switch("script_transform", "Newbeeer/L_DMI, CIFAR-10/dataset.py:203-224, commit 54e0d5d",
               "training: RandomHorizontalFlip, RandomCrop(32, 4) padding the raw image with black, ToTensor, "
               "Normalize(ImageNet's mean and std); validation and test: ToTensor, Normalize",
               {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}),
        titan_xp_float32("Newbeeer/L_DMI, CIFAR-10/dataset.py:33 and CE.py:53 and DMI.py:17, commit 54e0d5d"),
    )
    authors_differences = (
        "FW.py and GCE.py sum their loss's batch means over the validation batches of 256 (FW.py:68-84, GCE.py:20-29, "
        "64-78; the last batch holds 16 of 10,000 examples) — authors keeps bench's whole-set mean for them: the same "
        "rule up to that batch's weight",
        "train_lccn saves no model before its first epoch (LCCN.py:96, 146-148): where no epoch beats the "
        "warm-started model's loss the script evaluates a stale or missing file — authors keeps the warm-started "
        "model, as MR's script",
        "torch is seeded from the trial's seed — the scripts seed no torch generator (their runs were unseeded); "
        "bench draws a batch's crops, then its flips, the script each image's flip, then its crop: the same law",
        "the network is bench's resnet34_cifar, the scripts' ResNet34 (model.py) with their initial weights bit for "
        "bit, but its last pooling averages the 4 x 4 map with `mean` where theirs calls F.avg_pool2d(out, 4) "
        "(model.py:95): the same average summed in another order, so the logits agree within float32 rounding, not "
        "bit for bit (tests/protocol/test_script_same_weights.py derives the bound)",
    )
    folder = ""
    files = FILES
    urls = {URL: ARCHIVE}
    archive_md5 = {ARCHIVE: ARCHIVE_MD5}
    source = "https://www.cs.toronto.edu/~kriz/cifar.html (CIFAR-10 python version, cifar-10-python.tar.gz)"

    normalise: PixelNormalisation | None = None

    def load(self) -> Splits:
        self.check_files()
        folder = self.root / BATCHES
        names = read_label_names(folder / "batches.meta")
        if names != CLASSES:
            raise UserError(f"{folder / 'batches.meta'}: label names {names} are not CIFAR-10's {CLASSES}")
        train = [read_batch(folder / f"data_batch_{i}") for i in range(1, 5)]
        train_x = torch.cat([x for x, _ in train])
        train_y = np.concatenate([y for _, y in train])
        self.normalise = PixelNormalisation(train_x)
        return Splits(
            train=Split(train_x, train_y),
            val=Split(*read_batch(folder / "data_batch_5")),
            test=Split(*read_batch(folder / "test_batch")),
        )

    @classmethod
    def stand_in(cls, data_root: str | Path, n: int, seed: int = 0) -> None:
        """The six batches as the official archive holds them (`Dataset.stand_in`): pickled dicts with bytes keys
        (Python 2's str keys read with encoding="bytes"), each of ceil(n / 4) random images (b"data", N x 3072 uint8 in
        R, G, B planes) and labels, the ten classes in each run of ten in a random order; and batches.meta."""
        rng = np.random.default_rng(seed)
        folder = Path(data_root) / cls.folder / BATCHES
        folder.mkdir(parents=True, exist_ok=True)
        size = max(1, -(-n // 4))
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            entry = {b"batch_label": f"{name} (stand-in)".encode(),
                     b"labels": [int(v) for v in np.concatenate([rng.permutation(len(CLASSES))
                                                                 for _ in range(-(-size // len(CLASSES)))])[:size]],
                     b"data": rng.integers(0, 256, (size, 3072), dtype=np.uint8),
                     b"filenames": [f"img_{i}.png".encode() for i in range(size)]}
            (folder / name).write_bytes(pickle.dumps(entry, protocol=2))
        meta = {b"num_cases_per_batch": size, b"label_names": [c.encode() for c in CLASSES], b"num_vis": 3072}
        (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))

    def eval_transform(self, x: torch.Tensor) -> torch.Tensor:
        if self.script_transform:  # ToTensor, Normalize (dataset.py:203-204, 215-224)
            return normalise_channels(to_tensor(x), self.script_transform["mean"], self.script_transform["std"])
        if self.normalise is None:
            raise RuntimeError(f"{self.name}: load() the data before transforming it (normalisation needs it)")
        return self.normalise(x)

    def train_transform(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.script_transform:  # the raw image padded with black, cropped, mirrored, then normalised
            return self.eval_transform(random_shift_flip(x, PADDING, generator))
        return random_shift_flip(self.eval_transform(x), PADDING, generator)
