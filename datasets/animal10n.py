"""ANIMAL-10N (Song et al., ICML 2019, "SELFIE: Refurbishing unclean samples for robust deep learning"): 55,000
64 x 64 web images of five pairs of confusable animals, labelled by people, with real human noise.

The published layout (https://dm.kaist.ac.kr/datasets/animal-10n, on request): `DATA_ROOT/animal10n/training/` (50,000
images) and `testing/` (5,000), each image `<label>_<number>.jpg`, the label (0-9) in the file name before the first
underscore, as PLC's loader reads it (github.com/pxiangwu/PLC animal10/dataset.py, `Animal10.__init__`:
`label = path.split('_')[0]`, 8c2bcfd). The labels are the annotators'; the test images are only those whose label
matches the search keyword, so the test set is taken as clean. No clean label of a training image is published: the
realised noise rate is unknown (NaN in the row); the authors estimate about 8% from a labelling study.

Split: the 50,000 training images less a noisy validation set of 5,000 drawn by a fixed permutation of the sorted
names (bench selects on noisy validation; the papers train on all 50,000 and report the last epoch), and the 5,000
test images. Model and schedule as PLC ran it (animal10/train.py, 8c2bcfd): VGG-19 with batch norm from scratch
(line 90) with torchvision's head, as PLC's animal10/vgg.py builds it (lines 39-48: average pooling to 7 x 7, then
linear 25088 -> 4096 -> 4096 -> 10 with ReLU and dropout 0.5 after each hidden layer; `bench.models.VGG19BN`),
SGD without momentum (93), lr 0.1, weight decay 1e-3 (43), batch 128, 100 epochs (193-196), lr x 0.2 at epochs 50
and 75 (39, 44); augmentation: horizontal flips only (52-56), ImageNet's channel statistics. PLC's warm-up
(40 epochs of CE, line 190) is our warm start; the method stage is PLC's remaining 60 epochs (its milestones shifted
by 40). SGD without momentum keeps no state, so splitting the run in two changes nothing of it. SELFIE's own paper
trains the same VGG-19 and DenseNet (L=25, k=12) with lr 0.1 for 100 epochs.

No checksums are published. The images are decoded from disk on demand, like Clothing1M's (64 x 64 as stored).
"""

from __future__ import annotations

import re

import numpy as np

from bench.config import Schedule, UserError
from bench.data import Dataset, Split, Splits, deterministic_permutation
from bench.datasets.image_files import ImageCrops, ImageFiles

CLASSES = ("cat", "lynx", "wolf", "coyote", "cheetah", "jaguar", "chimpanzee", "orangutan", "hamster", "guinea pig")
NAME = re.compile(r"^([0-9])_[^/]+\.(jpe?g|png)$", re.IGNORECASE)
SIZE = 64
VALIDATION = 5_000


class Animal10N(ImageCrops, Dataset):
    """ANIMAL-10N, real human noise (about 8%)."""

    name = "animal10n"
    title = "ANIMAL-10N (real human noise, ~8%)"
    num_classes = 10
    class_names = CLASSES
    split_sizes = (45_000, 5_000, 5_000)
    model = "vgg19_bn"
    noise_patterns = {"real": None}  # the annotators' labels, in the file names
    paper_noise = "real"  # its published results (bench/report/literature_results.csv) are our cells (real, 0)
    stored, crop = SIZE, SIZE  # flips only: PLC's transform_train has no crop
    warmup = Schedule("sgd", 0.1, epochs=40, batch_size=128, weight_decay=1e-3)
    method_stage = Schedule("sgd", 0.1, epochs=60, batch_size=128, weight_decay=1e-3, milestones=(10, 35), gamma=0.2)
    folder = "animal10n"
    files = {"training/": None, "testing/": None}
    version = 2  # 2: vgg19_bn has PLC's three-layer head (1: one linear layer)
    epoch_eval = False  # a pass over 45,000 decoded images per epoch would add half an epoch's cost
    instance_noise = False  # streamed, and no clean training label is known
    clean_labels = False  # its clean training labels are unknown: its own noise only (`Dataset.accepted_noise`)
    source = ("the KAIST Data Mining Lab on request (https://dm.kaist.ac.kr/datasets/animal-10n; not downloadable "
              "without their agreement); unpack it so that DATA_ROOT/animal10n/training/ and testing/ hold the "
              "<label>_<number>.jpg images")

    def read_folder(self, part: str) -> tuple[list[str], np.ndarray]:
        """The sorted image names of `training` or `testing` and the labels their names carry."""
        folder = self.root / part
        names = sorted(p.name for p in folder.iterdir() if p.is_file())
        if not names:
            raise UserError(f"{self.name}: {folder} holds no images; {self.how_to_get()}")
        labels = []
        for name in names:
            match = NAME.match(name)
            if match is None:
                raise UserError(f"{self.name}: {folder / name} is not named <label>_<number>.jpg (label 0-9); "
                                "remove it or get the folder again")
            labels.append(int(match.group(1)))
        return [f"{part}/{name}" for name in names], np.array(labels, dtype=np.int64)

    def load(self) -> Splits:
        self.check_files()
        train_keys, train_labels = self.read_folder("training")
        test_keys, test_labels = self.read_folder("testing")
        n_val = round(len(train_keys) * VALIDATION / 50_000)
        order = deterministic_permutation(len(train_keys), self.name)
        val_idx, train_idx = np.sort(order[:n_val]), np.sort(order[n_val:])
        notes = []
        if (len(train_keys), len(test_keys)) != (50_000, 5_000):
            notes.append(f"{self.name}: {len(train_keys):,} training and {len(test_keys):,} test images instead of "
                         "the published 50,000 and 5,000; validation keeps 10% of training")
        notes.append(f"{self.name}: no clean training labels are published (noise rate ~8% by the authors' study)")

        def images(keys: list[str], idx: np.ndarray) -> ImageFiles:
            return ImageFiles(self.root, [keys[i] for i in idx], SIZE, self.name)

        unknown = np.full(len(train_idx), -1, dtype=np.int64)  # the clean labels of the training images
        return Splits(
            train=Split(images(train_keys, train_idx), unknown),
            val=Split(images(train_keys, val_idx), np.full(len(val_idx), -1, dtype=np.int64)),
            test=Split(images(test_keys, np.arange(len(test_keys))), test_labels),
            human_labels={"real": (train_labels[train_idx], train_labels[val_idx])},
            model_args={"image_size": SIZE},
            notes=notes,
        )
