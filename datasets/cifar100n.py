"""CIFAR-100N: CIFAR-100's images with real human noisy labels of its 100 classes (Wei et al., ICLR 2022).

The images are CIFAR-100's python files, read by the CIFAR-100 module. The labels are the published file
`DATA_ROOT/CIFAR-100N/CIFAR-100_human.pt` (github.com/UCSC-REAL/cifar-10-100n, data/, as revised by 199b915 of
2023-03-15): a dict of `clean_label` and `noisy_label` (numpy int64 arrays of 50,000) and `clean_coarse_label` and
`noisy_coarse_label` (lists of 50,000 ints), in torchvision's training order (the `train` file's). Its md5 is checked
first, always (the gate before unpickling), then CIFAR-10N's reader loads it with the same numpy allow-list. The
2021 release (b5a80e6, d112813) has the same fine labels but coarse labels that are not CIFAR-100's superclasses
(the repository's issue 6); it is refused by name, on load and by the files check (the grid's pre-flight, the
check after `--download`).

Noise pattern of kind human: `noisy_fine` (40.20% of the 50,000 disagree with `clean_label`). Training (the first
40,000) and validation (the last 10,000) get the human labels, the test set stays clean. `clean_label` must equal the
`train` file's fine labels. `bench datasets` reports the noise rate from the labels file alone.

The file's coarse label sets, the 20 superclasses' task, are the dataset `cifar100n_coarse` (`noisy_coarse`): a
dataset has one number of classes, so the 20-class task is a dataset of its own.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import numpy as np

from bench.data import Splits
from bench.datasets.cifar10n import LabelsFile, attach_human_labels, rates_lines, read_human_labels
from bench.datasets.cifar100 import CIFAR100
from bench.download import file_md5

LABELS_FILE = "CIFAR-100N/CIFAR-100_human.pt"
LABELS_MD5 = "a67b45c1d7992051865b5c755bd68bb1"
LABELS_URL = "https://github.com/UCSC-REAL/cifar-10-100n/raw/main/data/CIFAR-100_human.pt"
# How to get images whose labels the file's clean labels equal (the fix a mismatch message gives).
MATCHING_IMAGES = "use the official cifar-100-python files, whose train file's order the label file follows"
# The first release's md5 (data/CIFAR-100_human.pt at b5a80e6 and d112813, 2021-10-12, until 199b915): a user who
# has it needs the current file, not a "corrupt file" message.
RELEASE_2021_MD5 = "3957ab2a1b5fd13bfbd6ab956831f9b3"
LABELS = LabelsFile(
    "cifar100n", "CIFAR-100N", LABELS_URL,
    {"clean_label": 100, "noisy_label": 100, "clean_coarse_label": 20, "noisy_coarse_label": 20},
    superseded={RELEASE_2021_MD5: "the 2021 release whose coarse labels were revised in 2023"},
)


class CIFAR100N(CIFAR100):
    """CIFAR-100 with CIFAR-100N's real human labels (100 classes)."""

    name = "cifar100n"
    title = "CIFAR-100N (real human noise)"
    noise_patterns = {"noisy_fine": None}  # real noise: the label set comes from the file
    paper_noise = None  # not in the paper (CIFAR-100N is of 2022)
    files = {**CIFAR100.files, LABELS_FILE: LABELS_MD5}
    urls = {**CIFAR100.urls, LABELS_URL: LABELS_FILE}
    source = CIFAR100.source + "; labels: https://github.com/UCSC-REAL/cifar-10-100n (data/CIFAR-100_human.pt)"
    # The file's label sets this dataset trains on: the clean ones (equal to the images' `label_key` labels) and
    # each pattern's noisy ones; and where the file's other label sets are.
    clean_key: ClassVar[str] = "clean_label"
    human_keys: ClassVar[dict[str, str]] = {"noisy_fine": "noisy_label"}
    see_also: ClassVar[str] = "the 20 superclasses' human labels (noisy_coarse) are the dataset cifar100n_coarse"

    def labels_spec(self) -> LabelsFile:
        return replace(LABELS, dataset=self.name)

    def human_labels_file(self) -> dict[str, np.ndarray]:
        return read_human_labels(self.root / LABELS_FILE, self.files[LABELS_FILE], self.labels_spec())

    def md5_mismatch(self, rel: str) -> str:
        """The 2021 label file is named as such (the grid's pre-flight and `--download` check files this way)."""
        path = self.root / rel
        superseded = self.labels_spec().superseded_release(path, file_md5(path)) if rel == LABELS_FILE else None
        return superseded or super().md5_mismatch(rel)

    def load(self) -> Splits:
        human = self.human_labels_file()  # checked before the images: the cheaper failure first
        return attach_human_labels(super().load(), human, self.clean_key, self.human_keys, (self.name, LABELS_FILE),
                                   ("the CIFAR-100 train file", self.label_key), MATCHING_IMAGES)

    def describe(self) -> list[str]:
        return [*super().describe(), *rates_lines(self.root / LABELS_FILE, self.human_labels_file, self.human_keys,
                                                  self.clean_key), self.see_also]
