"""Dogs vs Cats (Kaggle) as the paper uses it: the 25,000 labelled training images split 12,500 / 6,250 / 6,250.

Reads Kaggle's train folder, `DATA_ROOT/dogs-vs-cats/train/{cat,dog}.N.jpg` (the label is in the file name).
Class 0 = dog, 1 = cat: the paper's noise flips cat -> dog. The split is drawn once by a fixed permutation of
the sorted file names; a smaller copy (fewer than 25,000 files) gets the same proportions and a note saying so.

The JPEGs are decoded once, resized to 64 x 64 and kept as one uint8 tensor (N x 3 x 64 x 64) in a cache file
named by a hash of the file list (folder, names and sizes) and the size, written atomically; every later load reads that
file, so no epoch decodes a JPEG. 64 pixels, not the authors' 150: all 25,000 images then take 307 MB (not
1.7 GB), live on the training device like CIFAR-10, and VGG-16 runs about 5 times faster; the images are
squashed to a square as the authors' Resize((150, 150)) did. The cache lives in `$BENCH_CACHE/dogs_vs_cats` when
that is set, else in `~/.cache/bench/cache/dogs_vs_cats`, never in the data folder (it may be shared or read-only).

Augmentation as for CIFAR-10, on the training device: per-pixel normalisation by the training split's mean and
standard-deviation images, random shifts of up to 8 pixels (a crop of the zero-padded image; 8 of 64 as 4 of 32
for CIFAR-10) and horizontal flips.

Under `--protocol authors` (its `script_transform` switch) the inputs are the authors' scripts' instead
(dogcat/dogcat.py:24-35): each JPEG decoded whole and resized to 150 x 150 (its own cache file, 1.7 GB for the 25,000
in memory), mirrored with probability 1/2 and turned by up to 45 degrees as Pillow turns it (nearest, black corners),
then normalised by ImageNet's channel statistics; VGG-16's linear layer then reads 8,192 features, as theirs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from bench import noise
from bench.config import Schedule, UserError
from bench.data import Dataset, Split, Splits, deterministic_permutation
from bench.datasets.cifar10 import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    PixelNormalisation,
    normalise_channels,
    random_shift_flip,
    to_tensor,
)
from bench.protocol import Selection, Switch, titan_xp_float32

IMAGE_SIZE = 64
PADDING = 8
FULL_SET = 25_000
CACHE_FORMAT = 1  # bump when the decoding changes, so that old caches are not reused
NAME = re.compile(r"^(cat|dog)\.([0-9]+)\.jpe?g$", re.IGNORECASE)
CLASS_OF = {"dog": 0, "cat": 1}


def decode_image(path: Path, size: int = IMAGE_SIZE, draft: bool = True) -> np.ndarray:
    """One JPEG as a size x size x 3 uint8 array (squashed to a square, bilinear with antialiasing). `draft=False`:
    from the full decoded image, as the scripts' Resize((150, 150), interpolation=2) on PIL's RGB image."""
    try:
        with Image.open(path) as img:
            if draft:
                img.draft("RGB", (size, size))  # let the JPEG decoder scale down by up to 8 first: much faster
            return np.asarray(img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR))
    except (UnidentifiedImageError, OSError) as e:
        raise UserError(f"dogs_vs_cats: cannot decode {path} ({e}); remove it or get the file again") from None


def decode_images(paths: list[Path], size: int = IMAGE_SIZE, draft: bool = True) -> torch.Tensor:
    """All images as N x 3 x size x size uint8 (PIL releases the GIL while decoding: threads help)."""
    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for i, image in enumerate(pool.map(lambda p: decode_image(p, size, draft), paths)):
            out[i] = image
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


def pil_rotation(angle: float, width: int, height: int) -> tuple[float, ...]:
    """The inverse affine matrix (a, b, c, d, e, f) by which Pillow's Image.rotate(angle) samples (centre (w/2, h/2),
    no expansion): the arithmetic of its Image.rotate, which torchvision's RandomRotation calls on a PIL image."""
    angle = -math.radians(angle % 360.0)
    cx, cy = width / 2, height / 2
    a, b = round(math.cos(angle), 15), round(math.sin(angle), 15)
    d, e = round(-math.sin(angle), 15), round(math.cos(angle), 15)
    return a, b, a * -cx + b * -cy + 0.0 + cx, d, e, d * -cx + e * -cy + 0.0 + cy


def rotate_nearest(x: torch.Tensor, angles: list[float]) -> torch.Tensor:
    """Image n of the batch x (N x C x H x W) rotated by angles[n] degrees counter-clockwise about its centre, nearest
    neighbour, black outside, exactly as Pillow rotates (its affine transform's 16.16 fixed-point path: output pixel
    (x, y) reads input (xx >> 16, yy >> 16), xx = FIX(c + a/2 + b/2) + x FIX(a) + y FIX(b), FIX(v) = floor(65536 v +
    1/2); Pillow's Geometry.c affine_fixed). One gather for the batch."""
    n, channels, h, w = x.shape

    def fix(v: float) -> int:
        return math.floor(v * 65536.0 + 0.5)

    rows = []
    for angle in angles:
        a, b, c, d, e, f = pil_rotation(angle, w, h)
        rows.append([fix(a), fix(b), fix(c + a * 0.5 + b * 0.5), fix(d), fix(e), fix(f + d * 0.5 + e * 0.5)])
    k = torch.tensor(rows, dtype=torch.int64, device=x.device)[:, :, None, None]
    xs, ys = torch.arange(w, device=x.device).view(1, 1, w), torch.arange(h, device=x.device).view(1, h, 1)
    col = (k[:, 2] + xs * k[:, 0] + ys * k[:, 1]) >> 16
    row = (k[:, 5] + xs * k[:, 3] + ys * k[:, 4]) >> 16
    inside = (col >= 0) & (col < w) & (row >= 0) & (row < h)
    flat = (row.clamp(0, h - 1) * w + col.clamp(0, w - 1)).view(n, 1, h * w).expand(n, channels, h * w)
    return x.reshape(n, channels, h * w).gather(2, flat).view(n, channels, h, w) * inside[:, None].to(x.dtype)


# FW's method stage in the paper's code, which fw_oracle (FW with the true T) shares.
FW_STAGE = Schedule("sgd", 1e-4, epochs=50, batch_size=128, momentum=0.9, weight_decay=1e-4)


class DogsVsCats(Dataset):
    """Dogs vs Cats, Kaggle train folder."""

    name = "dogs_vs_cats"
    title = "Dogs vs Cats (Kaggle)"
    num_classes = 2
    class_names = ("dog", "cat")
    split_sizes = (12_500, 6_250, 6_250)
    model = "vgg16_bn"
    noise_patterns = {"cat_to_dog": noise.flip({1: 0})}  # [[1, 0], [r, 1-r]]
    paper_noise = "cat_to_dog"
    warmup = Schedule("sgd", 1e-4, epochs=50, batch_size=128, momentum=0.9, weight_decay=1e-4)
    # The method stage of a method the paper's code has no script for (MentorNet, VAT, the newer methods), as the
    # paper's section 5.2 states it (and its dogcat/DMI.py runs L_DMI).
    method_stage = Schedule("sgd", 1e-5, epochs=50, batch_size=128, momentum=0.9, weight_decay=1e-4)
    # The methods the paper's code trains, each with its own script's lr: github.com/Newbeeer/L_DMI, dogcat/
    # {FW,GCE,LCCN,DMI}.py at c6e3d6d2ff25e52fb287052eda1e66e64f97e161 (unchanged at 7d5e4bc): SGD, momentum 0.9,
    # weight decay 1e-4, one lr for 50 epochs, the batch size 128 of its dogcat.py. (Its CE.py is the warm start.)
    method_stages = {
        "fw": FW_STAGE,
        "fw_oracle": FW_STAGE,  # FW with the true T (not in the paper's code) trains as FW
        "gce": Schedule("sgd", 1e-3, epochs=50, batch_size=128, momentum=0.9, weight_decay=1e-4),
        "lccn": Schedule("sgd", 1e-4, epochs=50, batch_size=128, momentum=0.9, weight_decay=1e-4),
        "dmi": Schedule("sgd", 1e-5, epochs=50, batch_size=128, momentum=0.9, weight_decay=1e-4),
    }
    # How the paper's Dogs vs Cats scripts ran it (github.com/Newbeeer/L_DMI, dogcat/, commit 7d5e4bc): the `authors`
    # protocol. Their warm-start batch is bench's 128 (dogcat.py:21); FW.py and GCE.py keep the lowest loss on the
    # whole validation set, as bench does.
    authors_protocol = (
        Switch("warmup_by_accuracy", "Newbeeer/L_DMI, dogcat/CE.py:51-68, commit 7d5e4bc",
               "main_ce saves the model whenever noisy-validation accuracy >= the best so far (from 0)"),
        Switch("first_batch_selection", "Newbeeer/L_DMI, dogcat/DMI.py:61-101 and LCCN.py:66, 121-128, commit 7d5e4bc",
               "DMI.py's validate() stops after the first batch of 128 (i == 1: break) of the unshuffled validation "
               "loader, main_dmi keeping an epoch whose L_DMI there is < the best, the warm-started model's the first "
               "bar; LCCN.py keeps the epoch of the highest clean TEST accuracy (> the best, from 0, so the "
               "warm-started model never): an oracle, its rows flagged",
               {"dmi": Selection("loss", first=128), "lccn": Selection("accuracy", on="test", initial=False)}),
        Switch("optimizer_per_epoch", "Newbeeer/L_DMI, dogcat/CE.py:59, DMI.py:92, FW.py:122, GCE.py:97, LCCN.py:82, "
               "commit 7d5e4bc", "every script builds a new SGD (momentum 0.9) at the start of each epoch"),
        Switch("script_noise", "Newbeeer/L_DMI, dogcat/dogcat.py:37, 53-57, commit 7d5e4bc",
               "each split's Image_ re-seeds np.random with the seed and calls np.random.choice(2, 1, "
               "p=conf_matrix[label]) per image in its CSV's order", {"validation": "reseed"}),
        Switch("ce_is_warm_start", "Newbeeer/L_DMI, dogcat/CE.py:77-79, commit 7d5e4bc",
               "the CE result is evaluate('./dog_model_ce_...'): the warm start itself"),
        Switch("dmi_script_form", "Newbeeer/L_DMI, dogcat/DMI.py:11-18, commit 7d5e4bc",
               "DMI_loss: -log(|det(onehot^T softmax)| + 0.001), the matrix summed over the batch, in float32", "sum"),
        Switch("script_transform", "Newbeeer/L_DMI, dogcat/dogcat.py:24-35, 61-63, commit 7d5e4bc",
               "Resize((150, 150), interpolation=2) of the whole decoded RGB image, RandomHorizontalFlip, "
               "RandomRotation(45) (nearest, black corners), ToTensor, Normalize(ImageNet's mean and std); "
               "validation and test: Resize, ToTensor, Normalize",
               {"size": 150, "flip": True, "rotation": 45, "mean": IMAGENET_MEAN, "std": IMAGENET_STD}),
        titan_xp_float32("Newbeeer/L_DMI, dogcat/CE.py:52 and DMI.py:16, commit 7d5e4bc"),
    )
    authors_differences = (
        "the split — the scripts read train_file.csv, val_file.csv and test_file.csv (dogcat.py:43-47, 69-77), "
        "which were never published: bench's 12,500 / 6,250 / 6,250 is a fixed permutation of Kaggle's file names, "
        "so which images each split holds, their order (the first validation batch, which draw meets which image) "
        "and the labels' numbering are not the script's; the sizes and T = [[1, 0], [r, 1 - r]] are",
        "torch is seeded from the trial's seed — the scripts seed no torch generator: initial weights, data order, "
        "flips, angles and LCCN's Gibbs draws were unseeded; bench draws a batch's flips, then its angles (float32 "
        "uniforms, as RandomRotation's), from the trial's generator, the script's DataLoader workers per image from "
        "torch's: the same law",
        "the network is bench's vgg16_bn, layer for layer the script's VGG('VGG16') (dogcat.py:87-123): its "
        "AvgPool2d(1, 1) is the identity and its log_softmax output changes no loss (CE, softmax and L_DMI read it "
        "through a softmax); at 150 pixels the linear layer reads its 512 x 4 x 4 = 8,192 features",
        "FW.py's validation loss sums per-batch means (FW.py:70-86; the last batch holds 106 of 6,250 examples) — "
        "bench keeps the lowest whole-set mean: the same rule up to that batch's weight; GCE.py's sum of "
        "batch losses over 128 (GCE.py:16-25, 49-63) is the whole-set mean times a constant: the same rule",
        "LCCN.py saves no model before its first epoch and keeps an epoch by test accuracy (LCCN.py:66, 121-128): "
        "`authors` does the same; its accuracy is then an upper bound, not a result (the row's `oracle` is true)",
    )
    folder = "dogs-vs-cats"
    source = ("https://www.kaggle.com/c/dogs-vs-cats/data (train.zip, unpacked so that "
              "DATA_ROOT/dogs-vs-cats/train/cat.0.jpg exists)")

    normalise: PixelNormalisation | None = None

    def images(self) -> list[tuple[str, int]]:
        """(file name, class) of every cat.N.jpg / dog.N.jpg in train/, cats then dogs, by number."""
        folder = self.root / "train"
        if not folder.is_dir():
            return []
        found = [(m.group(1).lower(), int(m.group(2)), name)
                 for name in os.listdir(folder) if (m := NAME.match(name))]
        return [(name, CLASS_OF[kind]) for kind, _, name in sorted(found)]

    def missing_files(self) -> list[str]:
        return [] if self.images() else ["train/cat.N.jpg and train/dog.N.jpg (Kaggle's 25,000 training images)"]

    def status(self) -> str:
        n = len(self.images())
        if not n:
            return "missing the train/ images"
        return "ready" if n == FULL_SET else f"ready ({n:,} of {FULL_SET:,})"

    def describe(self) -> list[str]:
        n = len(self.images())
        if n and n != FULL_SET:
            return [f"{n:,} images instead of Kaggle's {FULL_SET:,}: proportional splits"]
        return super().describe()

    def cache_dir(self) -> Path:
        """`$BENCH_CACHE/dogs_vs_cats`, else `~/.cache/bench/cache/dogs_vs_cats`: never inside the data folder,
        which may be shared or read-only."""
        base = os.environ.get("BENCH_CACHE")
        return (Path(base).expanduser() if base else Path.home() / ".cache" / "bench" / "cache") / "dogs_vs_cats"

    def image_size(self) -> int:
        """The stored images' side: 64 pixels, or the scripts' 150 under `script_transform`."""
        return self.script_transform["size"] if self.script_transform else IMAGE_SIZE

    def cache_file(self, entries: list[tuple[str, int]]) -> Path:
        folder = self.root / "train"
        listing = [(name, (folder / name).stat().st_size) for name, _ in entries]
        size = self.image_size()
        # The scripts' images are resized from the whole decoded JPEG (no draft): another cache.
        script = ["full decode"] if self.script_transform else []
        blob = json.dumps([CACHE_FORMAT, size, str(folder.resolve()), listing] + script)
        key = hashlib.sha256(blob.encode()).hexdigest()[:16]
        return self.cache_dir() / f"train_{size}px_{len(entries)}_{key}.pt"

    def load_images(self, entries: list[tuple[str, int]]) -> torch.Tensor:
        """The decoded images, from the cache when it holds this file list, else decoded and cached."""
        path, size = self.cache_file(entries), self.image_size()
        if path.exists():
            images = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(images, torch.Tensor) and images.shape == (len(entries), 3, size, size):
                return images
        images = decode_images([self.root / "train" / name for name, _ in entries], size,
                               draft=not self.script_transform)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".part", delete=False) as tmp:
            try:
                torch.save(images, tmp)
            except BaseException:
                Path(tmp.name).unlink(missing_ok=True)
                raise
        os.chmod(tmp.name, 0o644)  # a temporary file is private; the cache is as readable as the data
        Path(tmp.name).replace(path)
        return images

    def load(self) -> Splits:
        self.check_files()
        entries = self.images()
        n = len(entries)
        if n < 8:
            raise UserError(f"dogs_vs_cats: only {n} images in {self.root / 'train'}; is the folder complete?")
        images = self.load_images(entries)
        labels = np.array([label for _, label in entries], dtype=np.int64)
        # The paper's 12,500 / 6,250 / 6,250 of the 25,000 (proportionally for a smaller copy).
        n_train = n * self.split_sizes[0] // FULL_SET
        n_val = n * self.split_sizes[1] // FULL_SET
        order = deterministic_permutation(n, "dogs_vs_cats-split")
        parts = [order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :]]
        notes = []
        if n != FULL_SET:
            notes.append(f"dogs_vs_cats: {n:,} images instead of Kaggle's {FULL_SET:,}: proportional splits "
                         f"{n_train:,} / {n_val:,} / {n - n_train - n_val:,}")
        train, val, test = (Split(images[torch.from_numpy(idx)], labels[idx]) for idx in parts)
        if not self.script_transform:
            self.normalise = PixelNormalisation(train.x)
        return Splits(train=train, val=val, test=test, model_args={"image_size": self.image_size()}, notes=notes)

    @classmethod
    def stand_in(cls, data_root: str | Path, n: int, seed: int = 0) -> None:
        """Kaggle's train folder (`Dataset.stand_in`): 2n JPEGs (at least 8, `load`'s least), cat.i.jpg and dog.i.jpg
        in turn, each 32 x 32 pixels in random 8 x 8 blocks of colour (`load` scales every image to 64 x 64), so
        that the proportional splits hold n training images and n / 2 each held out."""
        rng = np.random.default_rng(seed)
        folder = Path(data_root) / cls.folder / "train"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(2 * max(4, n)):
            blocks = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
            Image.fromarray(blocks).save(folder / f"{('cat', 'dog')[i % 2]}.{i // 2}.jpg", quality=90)

    def eval_transform(self, x: torch.Tensor) -> torch.Tensor:
        if self.script_transform:  # ToTensor, Normalize (dogcat.py:31-35)
            return normalise_channels(to_tensor(x), self.script_transform["mean"], self.script_transform["std"])
        if self.normalise is None:
            raise RuntimeError("dogs_vs_cats: load() the data before transforming it (normalisation needs it)")
        return self.normalise(x)

    def train_transform(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.script_transform:
            return self.eval_transform(self.flip_rotate(x, generator))
        return random_shift_flip(self.eval_transform(x), PADDING, generator)

    def flip_rotate(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The scripts' RandomHorizontalFlip then RandomRotation(45) on the stored uint8 images (dogcat.py:26-27):
        each image mirrored with probability 1/2, then turned by an angle uniform in [-45, 45] degrees as Pillow
        turns it (`rotate_nearest`)."""
        n, degrees = x.shape[0], float(self.script_transform["rotation"])
        flip = torch.rand(n, device=x.device, generator=generator) < 0.5
        angles = torch.empty(n, device=x.device).uniform_(-degrees, degrees, generator=generator)
        return rotate_nearest(torch.where(flip[:, None, None, None], x.flip(3), x), angles.tolist())
