"""CIFAR-100 with the paper's CIFAR-10 protocol: the 100 fine classes, ResNet-34, CIFAR-10's schedules.

Reads the official python version, `DATA_ROOT/cifar-100-python/{train, test, meta}`, checked against the official
md5s; `bench datasets --download cifar100` fetches the official archive and checks its md5 before unpacking it.
`train` and `test` are pickled dicts: b"data" (N x 3072 uint8; a row is the red, green and blue 32 x 32 planes, as
CIFAR-10's), b"fine_labels" and b"coarse_labels" (N ints each), b"filenames", b"batch_label"; `meta` holds
b"fine_label_names" and b"coarse_label_names". CIFAR-10's restricted unpickler reads them (numpy arrays and nothing
else); the label names and each image's superclass (its coarse label against FINE_TO_COARSE) are checked on load.

Split, the paper's CIFAR-10 protocol adapted: the 50,000 training images in file order, the first 40,000 train and
the last 10,000 validate (the last fifth, as CIFAR-10's batch 5 of 5); the official 10,000 test images test.
Augmentation and per-pixel normalisation are CIFAR-10's. The paper has no CIFAR-100 experiment, so training keeps the
schedules of the paper's CIFAR-10 scripts (the warm start's, each scripted method's, the default method stage).

Noise of its own (on top of `uniform` and `symmetric`), after Patrini et al. (CVPR 2017): each class is relabelled,
with probability r, as the next class of its group of 5, circularly (groups by ascending fine label, the last
member's next being the first). `superclass`: the groups are CIFAR-100's 20 superclasses, as the released code's
docstring describes the noise ("mistakes are inside the same superclass"). `patrini`: the groups the released code
builds, github.com/giorgiop/loss-correction noise.py (`noisify_cifar100_asymmetric` with `build_for_cifar100`) at
09f21ac, unchanged at 15a79de: blocks of 5 consecutive fine labels (0-4, 5-9, ...). The fine labels are alphabetical,
so those blocks are not superclasses (apple, aquarium_fish, baby, bear, beaver form the first); it is the T of the
papers that reuse that code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from bench import noise
from bench.config import UserError
from bench.data import Split, Splits
from bench.datasets.cifar10 import CIFAR10, PixelNormalisation, read_images, read_label_names

FINE = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle", "bowl", "boy",
    "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle", "chair", "chimpanzee", "clock",
    "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish", "forest",
    "fox", "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion", "lizard",
    "lobster", "man", "maple_tree", "motorcycle", "mountain", "mouse", "mushroom", "oak_tree", "orange", "orchid",
    "otter", "palm_tree", "pear", "pickup_truck", "pine_tree", "plain", "plate", "poppy", "porcupine", "possum",
    "rabbit", "raccoon", "ray", "road", "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper",
    "snail", "snake", "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank", "telephone",
    "television", "tiger", "tractor", "train", "trout", "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf",
    "woman", "worm",
)
COARSE = (
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables", "household_electrical_devices",
    "household_furniture", "insects", "large_carnivores", "large_man-made_outdoor_things",
    "large_natural_outdoor_scenes", "large_omnivores_and_herbivores", "medium_mammals", "non-insect_invertebrates",
    "people", "reptiles", "small_mammals", "trees", "vehicles_1", "vehicles_2",
)
# The superclass of each fine class (index: fine label), five fine classes each: what every image's coarse label
# in the files must be (checked on load). The same as CIFAR-100N's current label file pairs clean_label with
# clean_coarse_label for all 50,000 images.
FINE_TO_COARSE = (
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11, 6, 11, 5, 10, 7, 6, 13, 15, 3, 15,
    0, 11, 1, 10, 12, 14, 16, 9, 11, 5, 5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13, 16, 19, 2, 4, 6, 19, 5, 5, 8, 19,
    18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
)
FOLDER = "cifar-100-python"
WHAT = "CIFAR-100 python file"
URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
ARCHIVE = "cifar-100-python.tar.gz"
# The official md5s, as torchvision checks them: pytorch/vision, torchvision/datasets/cifar.py, class CIFAR100
# (tgz_md5, train_list, test_list, meta) at 5c2bb42d9594c4d1a2c892fca7279538626b2aad; the same in torchvision 0.29.
ARCHIVE_MD5 = "eb9058c3a382ffc7106e4002c42a8d85"
FILES = {
    f"{FOLDER}/train": "16019d7e3df5f24257cddd939b257f8d",
    f"{FOLDER}/test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    f"{FOLDER}/meta": "7973b15100ade9c7d40fb424638fde48",
}


def next_in_group(groups: tuple[int, ...]) -> dict[int, int]:
    """Each class (index) -> the next class of its group (`groups[class]`) by ascending index; the last -> the first."""
    members: dict[int, list[int]] = {}
    for cls, group in enumerate(groups):
        members.setdefault(group, []).append(cls)
    return {m[i]: m[(i + 1) % len(m)] for m in members.values() for i in range(len(m))}


def first_difference(got: tuple[str, ...], expected: tuple[str, ...]) -> str:
    """Where two lists of names first differ, for a message."""
    if len(got) != len(expected):
        return f"{len(got)} names, expected {len(expected)}"
    i = next(i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b)
    return f"name {i} is {got[i]!r}, expected {expected[i]!r}"


class CIFAR100(CIFAR10):
    """CIFAR-100 (python version), its 100 fine classes."""

    name = "cifar100"
    title = "CIFAR-100"
    num_classes = 100
    class_names = FINE
    split_sizes = (40_000, 10_000, 10_000)
    noise_patterns = {
        "superclass": noise.flip(next_in_group(FINE_TO_COARSE)),
        "patrini": noise.flip(next_in_group(tuple(i // 5 for i in range(100)))),
    }
    paper_noise = None  # the paper has no CIFAR-100 experiment
    files = FILES
    urls = {URL: ARCHIVE}
    archive_md5 = {ARCHIVE: ARCHIVE_MD5}
    source = "https://www.cs.toronto.edu/~kriz/cifar.html (CIFAR-100 python version, cifar-100-python.tar.gz)"
    # The methods' defaults on CIFAR-100 where their released code sets its own (the rest keep their CIFAR-10 ones).
    method_defaults: ClassVar[dict[str, dict[str, Any]]] = {
        # xuefeng-li1/Provably-end-to-end-label-noise-learning-without-anchor-points main.py line 71 (06e4167):
        # args.init = 4.5 for cifar100, the sig_t init (models.py line 150: 2 elsewhere).
        "volminnet": {"init": 4.5},
        # giorgiop/loss-correction experiment.py lines 59-62 (15a79de): filter_outlier = False for cifar100, anchors
        # by the arg max (NoiseEstimator, models.py lines 439-440).
        "backward": {"quantile": 1.0},
        # xiaoboxia/T-Revision main.py line 78 (b598cf2): estimate_state = False for cifar100, passed to tools.fit as
        # filter_outlier (line 212; tools.py lines 33-34: the arg max).
        "trevision": {"quantile": 1.0},
        # YisenWang/symmetric_cross_entropy_for_noisy_labels train_models.py lines 222-224 (ec778df4a1): CIFAR-100's
        # command, -alpha 6.0 -beta 0.1.
        "sce": {"alpha": 6.0, "beta": 0.1},
        # shengliu66/ELR ELR/config_cifar100.json lines 36-41 (934af53434): elr_loss beta 0.9, lambda 7.
        "elr": {"beta": 0.9, "lambda_": 7.0},
        # hongxin001/JoCoR README.md line 31 (86db3597ff): "For Cifar100 ... the best lambda should be 0.85".
        "jocor": {"co_lambda": 0.85},
        # xingruiyu/coteaching_plus main.py line 94 (a68ed61288): init_epoch = 5 for cifar100.
        "coteaching_plus": {"init_epoch": 5},
        # weijiaheng/Multi-class-Peer-Loss-functions CIFAR-100/runner.py lines 99-106 (fba9eb6d2b): its sparse f_alpha.
        "peer": {"alpha_schedule": "cifar100_sparse"},
    }
    # The label list of the files this dataset classifies (the coarse task reads `coarse_labels`).
    label_key: ClassVar[str] = "fine_labels"

    def load(self) -> Splits:
        self.check_files()
        folder = self.root / FOLDER
        for key, expected in (("fine_label_names", FINE), ("coarse_label_names", COARSE)):
            names = read_label_names(folder / "meta", key, WHAT)
            if names != expected:
                raise UserError(f"{folder / 'meta'}: {key} are not CIFAR-100's ({first_difference(names, expected)}); "
                                "use the official cifar-100-python files")
        train_x, train_y = self.read_split(folder / "train")
        n_train = len(train_y) - len(train_y) // 5  # the last fifth validates: 10,000 of 50,000, as CIFAR-10's batch 5
        self.normalise = PixelNormalisation(train_x[:n_train])
        return Splits(
            train=Split(train_x[:n_train], train_y[:n_train]),
            val=Split(train_x[n_train:], train_y[n_train:]),
            test=Split(*self.read_split(folder / "test")),
        )

    def read_split(self, path: Path) -> tuple[torch.Tensor, np.ndarray]:
        """The images of `train` or `test` and their labels of `label_key`, each image's superclass checked."""
        x, labels = read_images(path, {"fine_labels": len(FINE), "coarse_labels": len(COARSE)}, WHAT)
        fine, coarse = labels["fine_labels"], labels["coarse_labels"]
        wrong = np.flatnonzero(np.asarray(FINE_TO_COARSE)[fine] != coarse)
        if len(wrong):
            i = int(wrong[0])
            c, expected = int(fine[i]), FINE_TO_COARSE[fine[i]]
            raise UserError(f"{path}: image {i} of fine class {c} ({FINE[c]}) has coarse label {coarse[i]}, not its "
                            f"superclass {expected} ({COARSE[expected]}); use the official cifar-100-python files")
        return x, labels[self.label_key]
