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
"""

from __future__ import annotations

import hashlib
import json
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
from bench.datasets.cifar10 import PixelNormalisation, random_shift_flip

IMAGE_SIZE = 64
PADDING = 8
FULL_SET = 25_000
CACHE_FORMAT = 1  # bump when the decoding changes, so that old caches are not reused
NAME = re.compile(r"^(cat|dog)\.(\d+)\.jpe?g$", re.IGNORECASE)
CLASS_OF = {"dog": 0, "cat": 1}


def decode_image(path: Path, size: int = IMAGE_SIZE) -> np.ndarray:
    """One JPEG as a size x size x 3 uint8 array (squashed to a square, bilinear with antialiasing)."""
    try:
        with Image.open(path) as img:
            img.draft("RGB", (size, size))  # let the JPEG decoder scale down by up to 8 first: much faster
            return np.asarray(img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR))
    except (UnidentifiedImageError, OSError) as e:
        raise UserError(f"dogs_vs_cats: cannot decode {path} ({e}); remove it or get the file again") from None


def decode_images(paths: list[Path], size: int = IMAGE_SIZE) -> torch.Tensor:
    """All images as N x 3 x size x size uint8 (PIL releases the GIL while decoding: threads help)."""
    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for i, image in enumerate(pool.map(lambda p: decode_image(p, size), paths)):
            out[i] = image
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


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

    def cache_file(self, entries: list[tuple[str, int]]) -> Path:
        folder = self.root / "train"
        listing = [(name, (folder / name).stat().st_size) for name, _ in entries]
        blob = json.dumps([CACHE_FORMAT, IMAGE_SIZE, str(folder.resolve()), listing])
        key = hashlib.sha256(blob.encode()).hexdigest()[:16]
        return self.cache_dir() / f"train_{IMAGE_SIZE}px_{len(entries)}_{key}.pt"

    def load_images(self, entries: list[tuple[str, int]]) -> torch.Tensor:
        """The decoded images, from the cache when it holds this file list, else decoded and cached."""
        path = self.cache_file(entries)
        if path.exists():
            images = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(images, torch.Tensor) and images.shape == (len(entries), 3, IMAGE_SIZE, IMAGE_SIZE):
                return images
        images = decode_images([self.root / "train" / name for name, _ in entries])
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
        self.normalise = PixelNormalisation(train.x)
        return Splits(train=train, val=val, test=test, model_args={"image_size": IMAGE_SIZE}, notes=notes)

    def eval_transform(self, x: torch.Tensor) -> torch.Tensor:
        if self.normalise is None:
            raise RuntimeError("dogs_vs_cats: load() the data before transforming it (normalisation needs it)")
        return self.normalise(x)

    def train_transform(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return random_shift_flip(self.eval_transform(x), PADDING, generator)
