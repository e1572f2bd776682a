"""Red Mini-ImageNet (Jiang et al., ICML 2020, "Beyond synthetic noise: deep learning on controlled noisy labels";
Controlled Noisy Web Labels): Mini-ImageNet's 100 classes where a fraction p of the training images is replaced by web
images that annotators marked as wrongly labelled, at ten published levels p.

The published files (https://google.github.io/controlled-noisy-web-labels; `dataset_no_images.zip`, whose web images
must be fetched from their URLs and whose clean images come from ILSVRC-2012 on agreement) under
`DATA_ROOT/mini-imagenet/`: `split/red_noise_nl_{p}` for p in 0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8 (one
`<image>.jpg <label>` a line; 50,000 lines, 49,985 at 0.3, 50,010 at 0.4, 49,962 at 0.5 and 50,008 at 0.8, as FaMUS's
MentorMix baseline lists them: github.com/youjiangxu/FaMUS baselines/code_mentormix_r32/code/mini_imagenet_dataset.py
lines 48-59, 26a7b22) and `split/clean_validation` (5,000 lines); TensorFlow Datasets' `controlled_noisy_web_labels.py`
documents the same `split/` folder. The images in one of two layouts:
- FaMUS's 32-pixel one (FaMUS/train_famus_redminiimage.py lines 438-444 and FaMUS/dataloader_red_mini_imagenet.py
  line 114, 26a7b22): `training_s32/red_noise_nl_{p}/<label>/<image>` for each level and
  `validation_s32/<label>/<image>`, the images at 32 x 32;
- the one DivideMix-style loaders read (`all_images/<image>` for every level's training images, `validation/<image>`),
  at any size (decoded to 32 x 32 here); `bench datasets --prepare red_mini_imagenet --from
  mini-imagenet-annotations.json` fetches the web images into `all_images/` (resumed, each file's sha256 kept).
Whichever of `training_s32/` and `all_images/` is present is read (FaMUS's where both are). A training image named
after its ImageNet synset (`n01532829...jpg`) is one of Mini-ImageNet's clean images; every other one is a web image
that annotators marked as wrong for its label (TFDS's builder sets `is_clean` = 0 for them), so the realised noise
rate is exactly the share of web images (`noise.WRONG`), shown in the row.

Noise pattern `red` at r = p, one of the ten published levels (`--noise red --r 0.4` reads `red_noise_nl_0.4`; another
r is refused in one line). Each level lists its own training images, so each (red, r) cell has its own training and
validation splits (`Splits.noise_splits`); a generic pattern (uniform, flip) draws on the clean level 0.0 images.
Split: each level's images less a noisy validation set (10%, by a fixed permutation); test = `clean_validation`
(clean). Model and schedule as FaMUS (Xu et al., CVPR 2021, whose table the field cites) runs it on Red Mini-ImageNet
(FaMUS/run_famus.sh, 26a7b22, the values it passes over train_famus_redminiimage.py's argparse defaults): a PreAct
ResNet-18 on 32 x 32 images (run_famus.sh `--network 'PreActResNet18'`), SGD momentum 0.9 (Nesterov) and weight decay
5e-4 (train_famus_redminiimage.py lines 38-40; build_models.py lines 10-11), lr 0.02 (run_famus.sh `--lr 0.02`; the
argparse default, line 34, is 0.01), 30 warm-up epochs of CE (`--warmup_epochs 30`; default 5, line 54) with batches
of 128 (the warm-up loader's batch_size*2, dataloader_red_mini_imagenet.py line 128), then 300 epochs (line 30) of
batch 64 (`-b 64`) whose lr is divided by 10 at epochs 200 and 250 (`--step1 200 --step2 250` at 0.2 and 0.4; lines
125-128); the warm-up is our warm start, the 300 our method stage. Inputs normalised by FaMUS's channel statistics
(dataloader_red_mini_imagenet.py line 95, CIFAR-100's), a random 32 crop of the image padded by 4 and a flip for
training (lines 92-93). Differences: ResNet-18 here has the standard (post-activation) blocks (`resnet18_cifar`),
the momentum is not Nesterov's and restarts after the warm start; run_famus.sh moves the lr steps to 100 and 200 at
0.6 and 0.8 for FaMUS itself (`--step1 100 --step2 200`, lines 53-54 and 69-70; the runs of 0.2, 0.6 and 0.8 are
commented out there, 0.4's runs), which bench does not follow (one schedule for every level and method). MentorMix's own
paper trains Inception-ResNet-v2 at 299 pixels; FaMUS's MentorMix baseline a ResNet-32 at 32 pixels
(baselines/code_mentormix_r32/train_script.sh `--studentnet=resnet32`).

No checksums are published for the images (they are fetched from the web); the images are decoded on demand.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch

from bench import noise
from bench.config import Schedule, UserError
from bench.data import Dataset, Split, Splits, deterministic_permutation
from bench.datasets.cifar10 import normalise_channels, random_shift_flip
from bench.datasets.image_files import ImageCrops, ImageFiles, decode, key_label_lines
from bench.download import fetch_many

# The 100 classes by their ImageNet synsets, in label order (TensorFlow Datasets' controlled_noisy_web_labels.py
# `_IMNET_MINI_SYNSETS`, less its test-only n01440764: a label is its synset's index there).
CLASSES = (
    "n01704323", "n04515003", "n02101006", "n03062245", "n04509417", "n03854065", "n02110063", "n03998194",
    "n02111277", "n04443257", "n02165456", "n03075370", "n02747177", "n01558993", "n04149813", "n03220513",
    "n03584254", "n04243546", "n03770439", "n02108915", "n02971356", "n02108551", "n03908618", "n01981276",
    "n03535780", "n04275548", "n03272010", "n02138441", "n03337140", "n07584110", "n01910747", "n03146219",
    "n02443484", "n04146614", "n02113712", "n02981792", "n04251144", "n03838899", "n04604644", "n02116738",
    "n02099601", "n02966193", "n02687172", "n03924679", "n02120079", "n03476684", "n04435653", "n02091244",
    "n01843383", "n01532829", "n03980874", "n07613480", "n03544143", "n03347037", "n02114548", "n06794110",
    "n04258138", "n02606052", "n02105505", "n02871525", "n03127925", "n04418357", "n04389033", "n02074367",
    "n02110341", "n13133613", "n03773504", "n13054560", "n07747607", "n04522168", "n02089867", "n02129165",
    "n02457408", "n03676483", "n09256479", "n04067472", "n02823428", "n01749939", "n03400231", "n04596742",
    "n01855672", "n02174001", "n04612504", "n03047690", "n02091831", "n03017168", "n04296562", "n02108089",
    "n09246464", "n02219486", "n02950826", "n01770081", "n03775546", "n01930112", "n03888605", "n03417042",
    "n03527444", "n02795169", "n07697537", "n03207743",
)
LEVELS = ("0.0", "0.05", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5", "0.6", "0.8")  # as the files are named
SIZE, PADDING = 32, 4
VALIDATION = 0.1
# FaMUS's normalisation (dataloader_red_mini_imagenet.py line 95: CIFAR-100's channel statistics), not ImageNet's.
MEAN, STD = (0.507, 0.487, 0.441), (0.267, 0.256, 0.276)
FAMUS_TRAIN, FAMUS_TEST = "training_s32", "validation_s32"  # FaMUS's 32-pixel layout: <folder>[/<level>]/<label>/
CLEAN_NAME = re.compile(r"^n\d{8}")  # a Mini-ImageNet (ILSVRC-2012) image; the others are web images
IMAGE_CHECK_SIZE = 8  # a fetched web image is decoded at this size before it counts (an HTML page was kept as one)


class RedMiniImageNet(ImageCrops, Dataset):
    """Red Mini-ImageNet (Controlled Noisy Web Labels), real web noise at ten levels."""

    name = "red_mini_imagenet"
    title = "Red Mini-ImageNet (controlled real web noise)"
    num_classes = 100
    class_names = CLASSES
    split_sizes = (45_000, 5_000, 5_000)
    model = "resnet18_cifar"
    noise_patterns = {"red": None}  # at r = one of LEVELS: that level's file
    noise_levels = {"red": tuple(float(level) for level in LEVELS)}
    paper_noise = "red"  # the reference table's rows (red_mini_imagenet, r = p) are our cells (red, r)
    stored, crop = SIZE, SIZE
    warmup = Schedule("sgd", 0.02, epochs=30, batch_size=128, momentum=0.9, weight_decay=5e-4)
    method_stage = Schedule("sgd", 0.02, epochs=300, batch_size=64, momentum=0.9, weight_decay=5e-4,
                            milestones=(200, 250))
    version = 2  # 2: FaMUS's normalisation (1: ImageNet's)
    folder = "mini-imagenet"
    # The split files; the image folders are those of the layout present (`image_folders`).
    files = {**{f"split/red_noise_nl_{level}": None for level in LEVELS}, "split/clean_validation": None}
    epoch_eval = False
    instance_noise = False
    source = ("https://google.github.io/controlled-noisy-web-labels (dataset_no_images.zip: the split files and "
              "the web images' URLs, to fetch yourself; the clean images from ILSVRC-2012 on agreement at "
              "https://image-net.org); put the images of every level in DATA_ROOT/mini-imagenet/all_images/ (`bench "
              "datasets --prepare red_mini_imagenet --from mini-imagenet-annotations.json` fetches the web ones) and "
              "clean_validation's in validation/, or in FaMUS's 32-pixel layout training_s32/red_noise_nl_<p>/<label>/ "
              "and validation_s32/<label>/")

    def famus_layout(self) -> bool:
        """Whether the images are in FaMUS's 32-pixel layout (`training_s32/`), else in `all_images/`."""
        return (self.root / FAMUS_TRAIN).is_dir()

    def image_folders(self) -> list[str]:
        if self.famus_layout():
            return [f"{FAMUS_TRAIN}/red_noise_nl_{level}/" for level in LEVELS] + [f"{FAMUS_TEST}/"]
        return ["all_images/", "validation/"]

    def expected_files(self) -> list[str]:
        return [*self.files, *self.image_folders()]

    def level(self, level: str, test: Split, famus: bool) -> Splits:
        """One level's splits: its training images less 10% that validate (clean labels: the label, or `noise.WRONG`
        for a web image), their noisy labels as the human labels of `red`, and the shared test set; the images where
        the layout puts them (`famus`: FaMUS's, else all_images/)."""
        pairs = key_label_lines(self.root / "split" / f"red_noise_nl_{level}", self.name, self.num_classes)
        labels = np.array([label for _, label in pairs], dtype=np.int64)
        clean = np.array([label if CLEAN_NAME.match(key) else noise.WRONG for key, label in pairs], dtype=np.int64)
        order = deterministic_permutation(len(pairs), f"{self.name}/{level}")
        n_val = round(VALIDATION * len(pairs))
        train_idx, val_idx = np.sort(order[n_val:]), np.sort(order[:n_val])

        def split(idx: np.ndarray) -> Split:
            keys = [f"{FAMUS_TRAIN}/red_noise_nl_{level}/{pairs[i][1]}/{pairs[i][0]}" if famus
                    else f"all_images/{pairs[i][0]}" for i in idx]
            return Split(ImageFiles(self.root, keys, SIZE, self.name), clean[idx])

        return Splits(split(train_idx), split(val_idx), test, {"red": (labels[train_idx], labels[val_idx])},
                      notes=[f"{self.name}: level {level}: {100 * np.mean(clean == noise.WRONG):.1f}% web images "
                             f"(wrong labels), {len(train_idx):,} training / {n_val:,} validation images"])

    def load(self) -> Splits:
        self.check_files()
        test_pairs = key_label_lines(self.root / "split" / "clean_validation", self.name, self.num_classes)
        famus = self.famus_layout()
        test_keys = [f"{FAMUS_TEST}/{label}/{key}" if famus else f"validation/{key}" for key, label in test_pairs]
        test = Split(ImageFiles(self.root, test_keys, SIZE, self.name),
                     np.array([label for _, label in test_pairs], dtype=np.int64))
        levels = {("red", float(level)): self.level(level, test, famus) for level in LEVELS}
        clean = levels["red", 0.0]
        return Splits(clean.train, clean.val, test, clean.human_labels, noise_splits=levels)

    def prepare(self, source: Path) -> list[str]:
        """`bench datasets --prepare red_mini_imagenet --from mini-imagenet-annotations.json`: fetch the web images
        that the split files name from the URLs the annotations list (TFDS's builder reads the same file: its
        `data` entries' `image/id` and `image/uri`) into `all_images/<id>.jpg`, resumably, each file's sha256 kept
        (`bench.download.fetch_many`). Mini-ImageNet's clean images (`n<synset>...jpg`) and `validation/` come from
        ILSVRC-2012, on the owners' agreement: not fetched here."""
        missing = [rel for rel in self.files if not (self.root / rel).is_file()]  # the split files, not the images
        if missing:
            raise UserError(f"{self.name}: missing {', '.join(missing)} under {self.root}: unpack "
                            "dataset_no_images.zip's mini-imagenet/ there first (the split files name the images)")
        try:
            entries = json.loads(source.read_text(encoding="utf-8"))["data"]
            urls = {entry[0]["image/id"]: entry[0]["image/uri"] for entry in entries}
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            raise UserError(f"{self.name}: cannot read the web images' URLs from {source} ({type(e).__name__}: {e}); "
                            "give dataset_no_images.zip's mini-imagenet-annotations.json") from None
        wanted = sorted({key for level in LEVELS for key, _ in key_label_lines(
            self.root / "split" / f"red_noise_nl_{level}", self.name, self.num_classes) if not CLEAN_NAME.match(key)})
        unlisted = [key for key in wanted if Path(key).stem not in urls]
        if unlisted:
            raise UserError(f"{self.name}: {source} lists no URL for {len(unlisted)} web images the split files name "
                            f"(first: {unlisted[0]}); give the annotations file of the same release")
        folder = self.root / "all_images"
        done = fetch_many({key: urls[Path(key).stem] for key in wanted}, folder,
                          check=lambda path: decode(path, IMAGE_CHECK_SIZE, self.name))  # an image, or not fetched
        lines = [f"{self.name}: {len(wanted):,} web images in {folder}: {len(done.fetched):,} fetched, "
                 f"{len(done.kept):,} already there and intact, {len(done.failed):,} failed"]
        lines += done.lines(f"{self.name}: ")
        if done.failed:
            lines.append(f"{self.name}: the failed URLs are in {folder / '.failed.tsv'}; run the same command again "
                         "to retry them (a trial stops, naming the image, where one is missing)")
        lines.append(f"{self.name}: Mini-ImageNet's clean images (n<synset>...jpg) go in all_images/ and "
                     "clean_validation's in validation/, from ILSVRC-2012 (https://image-net.org, on agreement)")
        return lines

    def describe(self) -> list[str]:
        """`bench datasets`: what is missing, or each level's realised noise rate (its share of web images)."""
        if lines := super().describe():
            return lines
        rates = []
        for level in LEVELS:
            keys = [key for key, _ in key_label_lines(self.root / "split" / f"red_noise_nl_{level}", self.name, 100)]
            rates.append(f"{level} {100 * np.mean([not CLEAN_NAME.match(key) for key in keys]):.1f}%")
        return [f"red, realised noise rate (web images) at r = {', '.join(rates)}"]

    @staticmethod
    def normalise(x: torch.Tensor) -> torch.Tensor:
        return normalise_channels(x.float() / 255, MEAN, STD)

    def eval_transform(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalise(x)

    def train_transform(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.normalise(random_shift_flip(x, PADDING, generator))
