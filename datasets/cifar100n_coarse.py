"""CIFAR-100N's coarse task: CIFAR-100's images, its 20 superclasses, CIFAR-100N's noisy coarse labels.

A dataset has one number of classes, so the 20-class task of CIFAR-100N is this dataset of its own; everything else
is CIFAR-100N's (the same files, split, checks, model and schedules). The clean labels are the coarse labels of the
CIFAR-100 files (train and test); the file's `clean_coarse_label` must equal the train file's. Noise pattern of kind
human: `noisy_coarse`, the file's `noisy_coarse_label`.

In the current file (github.com/UCSC-REAL/cifar-10-100n, 199b915 of 2023-03-15) both coarse label sets are the fine
ones mapped to their superclasses by the repository's fine2coarse.py: a human fine label of the right superclass
counts as correct here. 26.40% of the 50,000 disagree with `clean_coarse_label`; the 2021 file, whose coarse labels
were not CIFAR-100's superclasses, gave 25.60% (CIFAR-100N refuses that file by its md5).
"""

from __future__ import annotations

from bench.datasets.cifar100 import COARSE
from bench.datasets.cifar100n import CIFAR100N


class CIFAR100NCoarse(CIFAR100N):
    """CIFAR-100N's coarse task (20 superclasses)."""

    name = "cifar100n_coarse"
    title = "CIFAR-100N coarse (real human noise, 20 superclasses)"
    num_classes = 20
    class_names = COARSE
    noise_patterns = {"noisy_coarse": None}  # real noise: the label set comes from the file
    label_key = "coarse_labels"
    clean_key = "clean_coarse_label"
    human_keys = {"noisy_coarse": "noisy_coarse_label"}
    see_also = "the 100 classes' human labels (noisy_fine) are the dataset cifar100n"
    # Not CIFAR-100's (which CIFAR-100N, the same 100 classes, keeps): the references set those for 100 classes
    # (VolMinNet's init 4.5 makes T's diagonal 1 / (1 + 99 sigmoid(-4.5)) = 0.48), and none has a 20-class setting.
    method_defaults = {}
