"""Clothing1M (Xiao et al., CVPR 2015): a million clothing images with real noisy labels from shop web pages.

Reads the published annotation files and image tree under `DATA_ROOT/clothing1M/`:
`category_names_eng.txt` (the 14 class names, one a line), `noisy_label_kv.txt` and `clean_label_kv.txt` (lines
`images/x/yy/name.jpg label`), `noisy_train_key_list.txt`, `clean_val_key_list.txt` and `clean_test_key_list.txt`
(one image key a line), and `images/`. The paper's protocol: train on the noisy training set (1M) with its
published labels, select on the clean validation set (14,313), test on the clean test set (10,526). Noise pattern
`real`: the labels as published; the clean label of a training image is known only where `clean_label_kv.txt`
also annotates it, and is -1 (unknown) elsewhere, so the realised noise rate and the empirical T count only
the training images that both files annotate.

The set does not fit in memory: its splits stream through DataLoader workers that decode each JPEG on the fly
(shorter side resized to 256, centre 256 x 256, uint8). The paper's augmentation then runs on the training device
for the whole batch: a random 224 x 224 crop, a horizontal flip, brightness and saturation jitter (factors in
[0.6, 1.4]); evaluation takes the centre 224 x 224. Both normalise by ImageNet's channel statistics, since the
ResNet-50 starts from ImageNet weights when a local file gives them: set BENCH_RESNET50_WEIGHTS to torchvision's
ResNet-50 state dict (nothing is ever downloaded at run time).

Clothing1M is distributed by its authors on request only: there is no download address.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bench.config import Schedule, UserError
from bench.data import Dataset, Split, Splits
from bench.datasets.cifar10 import IMAGENET_MEAN, IMAGENET_STD, crop_flip, normalise_channels
from bench.datasets.image_files import WEIGHTS_ENV, ImageFiles, check_key, label_of, resnet50_weights

CLASSES = ("T-Shirt", "Shirt", "Knitwear", "Chiffon", "Sweater", "Hoodie", "Windbreaker", "Jacket", "Down Coat",
           "Suit", "Shawl", "Dress", "Vest", "Underwear")
STORED, CROP = 256, 224
JITTER = 0.4  # brightness and saturation factors drawn from [1 - JITTER, 1 + JITTER]
ANNOTATIONS = ("category_names_eng.txt", "noisy_label_kv.txt", "clean_label_kv.txt", "noisy_train_key_list.txt",
               "clean_val_key_list.txt", "clean_test_key_list.txt")


def read_keys(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def read_kv(path: Path) -> dict[str, int]:
    """A `key label` file as a dict."""
    labels: dict[str, int] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not 0 <= label_of(parts[1]) < len(CLASSES):
            raise UserError(f"clothing1m: {path}, line {number}: expected `images/... label` with a label in "
                            f"0..{len(CLASSES) - 1}, got {line!r}")
        labels[check_key(parts[0], path, number, "clothing1m")] = label_of(parts[1])
    return labels


class Clothing1M(Dataset):
    """Clothing1M, real label noise."""

    name = "clothing1m"
    title = "Clothing1M (real noise)"
    num_classes = 14
    class_names = CLASSES
    split_sizes = (1_000_000, 14_313, 10_526)
    model = "resnet50"
    noise_patterns = {"real": None}  # the published noisy labels
    paper_noise = "real"  # the paper's table records no r: our r = 0
    warmup = Schedule("sgd", 0.01, epochs=10, batch_size=256, momentum=0.9, weight_decay=1e-3, milestones=(5,))
    # The paper's L_DMI stage: lr 1e-6 for 5 epochs, then 5e-7 for 5 more (github.com/Newbeeer/L_DMI clothing/main.py,
    # main_dmi, c6e3d6d). The paper's code trains no other method on Clothing1M (its main_ce is the warm start), so
    # every method takes this one.
    method_stage = Schedule("sgd", 1e-6, epochs=10, batch_size=256, momentum=0.9, weight_decay=1e-3,
                            milestones=(5,), gamma=0.5)
    folder = "clothing1M"
    epoch_eval = False  # a pass over 1M training images per epoch would double the cost (BENCH_EPOCH_EVAL=1)
    instance_noise = False  # the clean label of most training images is unknown, and the images are streamed
    clean_labels = False  # its clean training labels are unknown: its own noise only (`Dataset.accepted_noise`)
    weights_env = {"weights": WEIGHTS_ENV}  # the ResNet-50's ImageNet weights (`resnet50_weights`)
    files = {**{name: None for name in ANNOTATIONS}, "images/": None}
    source = ("Clothing1M's authors, on request only (Xiao et al., CVPR 2015, 'Learning from massive noisy "
              "labeled data for image classification'; see https://github.com/Cysu/noisy_label); unpack it so that "
              "DATA_ROOT/clothing1M/noisy_label_kv.txt and DATA_ROOT/clothing1M/images/ exist")

    def load(self) -> Splits:
        self.check_files()
        names = read_keys(self.root / "category_names_eng.txt")
        if len(names) != len(CLASSES):
            raise UserError(f"clothing1m: {self.root / 'category_names_eng.txt'} lists {len(names)} classes, "
                            f"not {len(CLASSES)}")
        noisy = read_kv(self.root / "noisy_label_kv.txt")
        clean = read_kv(self.root / "clean_label_kv.txt")
        keys = {part: read_keys(self.root / f"{part}_key_list.txt")
                for part in ("noisy_train", "clean_val", "clean_test")}

        def labels(table: dict[str, int], part: str, default: int | None = None) -> np.ndarray:
            missing = [k for k in keys[part] if k not in table] if default is None else []
            if missing:
                raise UserError(f"clothing1m: {len(missing)} keys of {part}_key_list.txt have no label "
                                f"(first: {missing[0]})")
            return np.array([table.get(k, default) for k in keys[part]], dtype=np.int64)

        noisy_train = labels(noisy, "noisy_train")
        clean_train = labels(clean, "noisy_train", default=-1)  # unknown where the clean set does not cover it
        val_y, test_y = labels(clean, "clean_val"), labels(clean, "clean_test")
        notes = []
        sizes = (len(noisy_train), len(val_y), len(test_y))
        if sizes != self.split_sizes:
            notes.append(f"clothing1m: {sizes[0]:,} / {sizes[1]:,} / {sizes[2]:,} images instead of the published "
                         f"{' / '.join(f'{s:,}' for s in self.split_sizes)}")
        model_args = resnet50_weights(self.name, notes)

        def images(part: str) -> ImageFiles:  # decoded on demand, in DataLoader workers
            return ImageFiles(self.root, keys[part], STORED, self.name)

        return Splits(
            train=Split(images("noisy_train"), clean_train),
            val=Split(images("clean_val"), val_y),
            test=Split(images("clean_test"), test_y),
            human_labels={"real": (noisy_train, val_y)},
            model_args=model_args,
            notes=notes,
        )

    @staticmethod
    def _normalise(x: torch.Tensor) -> torch.Tensor:
        return normalise_channels(x, IMAGENET_MEAN, IMAGENET_STD)

    def eval_transform(self, x: torch.Tensor) -> torch.Tensor:
        start = (x.shape[-1] - CROP) // 2
        return self._normalise(x[:, :, start : start + CROP, start : start + CROP].float() / 255)

    def train_transform(self, x: torch.Tensor) -> torch.Tensor:
        n, device = x.shape[0], x.device
        top = torch.randint(0, x.shape[-2] - CROP + 1, (n,), device=device)
        left = torch.randint(0, x.shape[-1] - CROP + 1, (n,), device=device)
        flip = torch.rand(n, device=device) < 0.5
        x = crop_flip(x, top, left, flip, CROP, CROP).float() / 255
        brightness = 1 + JITTER * (2 * torch.rand(n, 1, 1, 1, device=device) - 1)
        saturation = 1 + JITTER * (2 * torch.rand(n, 1, 1, 1, device=device) - 1)
        x = (x * brightness).clamp(0, 1)
        grey = (x * torch.tensor((0.299, 0.587, 0.114), device=device).view(1, 3, 1, 1)).sum(1, keepdim=True)
        x = (grey + saturation * (x - grey)).clamp(0, 1)
        return self._normalise(x)
