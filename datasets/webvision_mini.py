"""mini-WebVision (Chen et al., ICML 2019; Li et al., ICLR 2020, DivideMix): the Google images of WebVision 1.0's
first 50 classes (Li et al., 2017), labelled by their search query, tested on WebVision's validation images of those
classes; ILSVRC-2012's validation images of the same classes are the second test set (`webvision_mini_ilsvrc12`).

The published layout under `DATA_ROOT/webvision/` (https://data.vision.ee.ethz.ch/cvl/webvision/dataset2017.html,
"resized" release), read as DivideMix reads it (github.com/LiJunnan1992/DivideMix dataloader_webvision.py, d9d3058):
`info/train_filelist_google.txt` (lines `google/q0001/<name>.jpg <label>`, images under the root; lines 47-55 keep
the labels < 50), `info/val_filelist.txt` (lines `<name>.jpg <label>`, images under `val_images_256/`; lines 36-45
and 97), `info/synsets.txt` (the 1000 ImageNet synsets in label order). ILSVRC-2012's validation images sorted into
one folder per class: `imagenet/val/<label>/` as DivideMix's own preparation names them (lines 9-17), or
`imagenet/val/<synset>/` as torchvision's ImageNet folder and ILSVRC's valprep.sh name them.

Split: training = the Google images of labels 0-49 less a noisy validation set (5% of them, by a fixed permutation;
DivideMix selects nothing and reports its last epoch); test = WebVision's 2,500 validation images of those classes.
WebVision publishes no clean training labels: the realised noise rate is unknown (the WebVision paper estimates about
20% for the whole set). Schedule as DivideMix ran it (Train_webvision.py, d9d3058): SGD momentum 0.9, weight decay
5e-4 (222-223), lr 0.01 divided by 10 from epoch 40 (20, 232-235), batch 32 (19), one warm-up epoch of CE (212) then
80 epochs (25, 232): our warm start is that epoch, of batches of 64 (its warm-up loader's batch_size*2,
dataloader_webvision.py line 141), our method stage the 80 (lr / 10 from its 40th, index 39).
The network is DivideMix's Inception-ResNet-v2 from scratch (Train_webvision.py line 205; ELR's too,
ELR_plus/config_webvision.json), built by timm (`bench.models.InceptionResNetV2`; `pip install -e '.[models]'`,
else `--model resnet50`, the ResNet-50 several later papers use). Training inputs as dataloader_webvision.py
(lines 116-122) makes them: RandomResizedCrop(299) (area 8-100%, aspect 3/4-4/3) and a flip, ImageNet's
normalisation; testing: the centre 299 of the image resized to 320 (lines 123-128). DivideMix's own settings on
WebVision (alpha 0.5, lambda_u 0: Train_webvision.py lines 21-22) are this dataset's `method_defaults`.
Differences: images are stored at 320 (shorter side, as its Resize(320)) and only their centre 320 x 320 is kept, so
the random crop is drawn in that square, where DivideMix draws it in the whole resized image; the crop is resized
bilinearly without antialiasing (torchvision resizes the PIL image with it); the optimiser's momentum restarts after
the warm-up epoch.

No checksums are published. The images are decoded from disk on demand, like Clothing1M's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bench.config import Schedule, UserError
from bench.data import Dataset, Split, Splits, deterministic_permutation
from bench.datasets.image_files import (
    ImageCrops,
    ImageFiles,
    key_label_lines,
    random_resized_boxes,
    read_lines,
    resized_crops,
)

CLASSES = 50
# ILSVRC-2012's first 50 classes (WebVision 1.0's labels 0-49: info/synsets.txt's first 50 lines).
NAMES = (
    "tench", "goldfish", "great white shark", "tiger shark", "hammerhead", "electric ray", "stingray", "cock",
    "hen", "ostrich", "brambling", "goldfinch", "house finch", "junco", "indigo bunting", "robin", "bulbul",
    "jay", "magpie", "chickadee", "water ouzel", "kite", "bald eagle", "vulture", "great grey owl",
    "European fire salamander", "common newt", "eft", "spotted salamander", "axolotl", "bullfrog", "tree frog",
    "tailed frog", "loggerhead", "leatherback turtle", "mud turtle", "terrapin", "box turtle", "banded gecko",
    "common iguana", "American chameleon", "whiptail", "agama", "frilled lizard", "alligator lizard",
    "Gila monster", "green lizard", "African chameleon", "Komodo dragon", "African crocodile",
)
VALIDATION = 0.05
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}


class WebVisionMini(ImageCrops, Dataset):
    """mini-WebVision (WebVision 1.0, Google images, first 50 classes), tested on WebVision's validation set."""

    name = "webvision_mini"
    title = "mini-WebVision (real web noise; WebVision val)"
    num_classes = CLASSES
    class_names = NAMES
    split_sizes = (62_647, 3_297, 2_500)  # nominal (65,944 Google images of the 50 classes); the files decide
    model = "inception_resnet_v2"
    noise_patterns = {"real": None}  # each image's search query
    paper_noise = "real"  # its published results (bench/report/literature_results.csv) are our cells (real, 0)
    stored, crop = 320, 299
    warmup = Schedule("sgd", 0.01, epochs=1, batch_size=64, momentum=0.9, weight_decay=5e-4)
    method_stage = Schedule("sgd", 0.01, epochs=80, batch_size=32, momentum=0.9, weight_decay=5e-4, milestones=(39,))
    folder = "webvision"
    files = {"info/train_filelist_google.txt": None, "info/val_filelist.txt": None, "info/synsets.txt": None,
             "google/": None, "val_images_256/": None}
    epoch_eval = False
    instance_noise = False
    clean_labels = False  # its clean training labels are unknown: its own noise only (`Dataset.accepted_noise`)
    # DivideMix's WebVision settings (Train_webvision.py lines 21-22: alpha 0.5, lambda_u 0; its CIFAR ones are 4
    # and 25); the others (p_threshold 0.5, T 0.5, lines 23-24) are its defaults. ELR's WebVision config
    # (ELR_plus/config_webvision.json: beta 0.7, lambda 3) is ELR's defaults already.
    method_defaults = {"dividemix": {"alpha": 0.5, "lambda_u": 0.0}}
    version = 2  # 2: DivideMix's RandomResizedCrop (1: a random 299 window of the 320 square)
    source = ("https://data.vision.ee.ethz.ch/cvl/webvision/dataset2017.html (WebVision 1.0, the resized images "
              "and info/, for research under its terms: not downloadable without accepting them), unpacked as "
              "DATA_ROOT/webvision/info/, google/ and val_images_256/")

    def train_transform(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """DivideMix's RandomResizedCrop(299) and flip (dataloader_webvision.py lines 116-122), on the stored 320 x 320
        centre (module docstring)."""
        boxes = random_resized_boxes(x.shape[0], x.shape[-2], x.shape[-1], generator, x.device)
        flip = torch.rand(x.shape[0], device=x.device, generator=generator) < 0.5
        crops = resized_crops(x, boxes, self.crop)
        return self.normalise(torch.where(flip[:, None, None, None], crops.flip(-1), crops))

    def synsets(self) -> list[str]:
        synsets = [line.split()[0] for line in read_lines(self.root / "info" / "synsets.txt", self.name)]
        if len(synsets) < CLASSES:
            raise UserError(f"{self.name}: {self.root / 'info' / 'synsets.txt'} lists {len(synsets)} synsets, "
                            f"not 1000; get info/ again")
        return synsets[:CLASSES]

    def test_split(self) -> Split:
        """WebVision's validation images of the 50 classes."""
        pairs = [(key, label) for key, label in
                 key_label_lines(self.root / "info" / "val_filelist.txt", self.name, 1000) if label < CLASSES]
        return Split(ImageFiles(self.root / "val_images_256", [k for k, _ in pairs], self.stored, self.name),
                     np.array([label for _, label in pairs], dtype=np.int64))

    def ilsvrc12_split(self) -> Split:
        """ILSVRC-2012's validation images of the 50 classes, one folder per class (its label or its synset)."""
        val = self.root / "imagenet" / "val"
        keys, labels = [], []
        for label, synset in enumerate(self.synsets()):
            folder = next((val / name for name in (str(label), synset) if (val / name).is_dir()), None)
            if folder is None:
                raise UserError(f"{self.name}: missing {val / str(label)}/ (or {val / synset}/): ILSVRC-2012's "
                                "validation images sorted into one folder per class; get ILSVRC2012_img_val.tar from "
                                "https://image-net.org (on agreement) and sort it with its valprep.sh")
            names = sorted(p.name for p in folder.iterdir() if Path(p.name).suffix.lower() in IMAGE_SUFFIXES)
            keys += [f"{folder.name}/{name}" for name in names]
            labels += [label] * len(names)
        return Split(ImageFiles(val, keys, self.stored, self.name), np.array(labels, dtype=np.int64))

    def load(self) -> Splits:
        self.check_files()
        self.synsets()
        pairs = [(key, label) for key, label in
                 key_label_lines(self.root / "info" / "train_filelist_google.txt", self.name, 1000) if label < CLASSES]
        if not pairs:
            raise UserError(f"{self.name}: {self.root / 'info' / 'train_filelist_google.txt'} lists no image of the "
                            f"first {CLASSES} classes; get info/ again")
        noisy = np.array([label for _, label in pairs], dtype=np.int64)
        order = deterministic_permutation(len(pairs), "webvision_mini")  # webvision_mini_ilsvrc12's too
        n_val = round(VALIDATION * len(pairs))
        val_idx, train_idx = np.sort(order[:n_val]), np.sort(order[n_val:])

        def images(idx: np.ndarray) -> ImageFiles:
            return ImageFiles(self.root, [pairs[i][0] for i in idx], self.stored, self.name)

        test = self.test_split()
        notes = [f"{self.name}: {len(train_idx):,} / {len(val_idx):,} / {len(test):,} images; no clean training "
                 "labels are published (noise rate unknown)"]
        return Splits(
            train=Split(images(train_idx), np.full(len(train_idx), -1, dtype=np.int64)),
            val=Split(images(val_idx), np.full(len(val_idx), -1, dtype=np.int64)),
            test=test,
            human_labels={"real": (noisy[train_idx], noisy[val_idx])},
            notes=notes,
        )
