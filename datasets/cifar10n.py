"""CIFAR-10N: CIFAR-10's images with real human noisy labels (Wei et al., ICLR 2022).

The images are CIFAR-10's python batches, read by the CIFAR-10 module. The labels are the published file
`DATA_ROOT/CIFAR-10N/CIFAR-10_human.pt`: a dict of numpy int64 arrays of 50,000, `clean_label`, `aggre_label`,
`worse_label`, `random_label1..3`, in torchvision's CIFAR-10 training order (batches 1 to 5). Its md5 is checked
first, always (whatever BENCH_VERIFY_CHECKSUMS says: the checksum is the gate before unpickling), then it is
read by `torch.load(weights_only=True)` with an allow-list of exactly the numpy types its pickle names; nothing
falls back to unrestricted unpickling. That reader (`read_human_labels`, told what to expect by a `LabelsFile`) is
shared with CIFAR-100N.

Noise patterns of kind human: `aggre`, `worse`, `random1`, `random2`, `random3`. Training (batches 1-4) and
validation (batch 5) get the chosen human labels, the test set stays clean. `bench datasets` reports each label
set's noise rate against `clean_label` over all 50,000 from the labels file alone (the images need not be there).

Training follows CIFAR-10's, schedules included: the paper (of 2019) has no CIFAR-10N experiment, so FW, GCE, LCCN
and L_DMI keep the schedules of the paper's CIFAR-10 scripts (same images, same ResNet-34) and every other method
CIFAR-10's default method stage.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench.config import UserError
from bench.data import Splits
from bench.datasets.cifar10 import CIFAR10, RECONSTRUCT
from bench.download import file_md5

LABELS_FILE = "CIFAR-10N/CIFAR-10_human.pt"
LABELS_MD5 = "96644db5574813cae939af5f7f2a0aec"
LABELS_URL = "https://github.com/UCSC-REAL/cifar-10-100n/raw/main/data/CIFAR-10_human.pt"
# How to get images whose labels the file's clean labels equal (the fix a mismatch message gives).
MATCHING_IMAGES = ("use the official cifar-10-batches-py files, whose training order (data_batch_1 to 5) the label "
                   "file follows")
HUMAN_KEYS = {
    "aggre": "aggre_label",
    "worse": "worse_label",
    "random1": "random_label1",
    "random2": "random_label2",
    "random3": "random_label3",
}
# Exactly what the file's pickle names: the array rebuilder (spelled numpy.core.multiarray by numpy 1, as in
# the published file, and numpy._core.multiarray by numpy 2), the array and dtype types and int64's dtype class
# (rebuilt from its state). `_codecs.encode` is on torch's own allow-list.
# Where torch's weights-only unpickler names the global it refused (a function's or class's dotted name), in its
# two wordings (torch 2.14: a global off the allow-list, a class it cannot build).
REFUSED = re.compile(r"Unsupported global: GLOBAL (\S+) was not an allowed global|but got <class '([^']+)'>")
SAFE_GLOBALS = [
    (RECONSTRUCT, "numpy.core.multiarray._reconstruct"),
    RECONSTRUCT,
    np.ndarray,
    np.dtype,
    type(np.dtype(np.int64)),
]


@dataclass(frozen=True)
class LabelsFile:
    """What a CIFAR-N label file must hold, as one dataset reads it: its label sets (file key -> number of classes),
    and for messages the dataset's name, the file's title and address, and the md5s of earlier releases that are not
    the one to use (md5 -> what that file is)."""

    dataset: str
    title: str
    url: str
    label_sets: dict[str, int]
    superseded: dict[str, str] = field(default_factory=dict)

    def superseded_release(self, path: Path, md5: str) -> str | None:
        """The message for the label file at `path` if its md5 is an earlier release's (None if not): the one home of
        that message, for the reader and for `Dataset.check_files`."""
        if md5 not in self.superseded:
            return None
        return f"{self.dataset}: {path} is {self.superseded[md5]}; delete it and get the current one from {self.url}"


LABELS = LabelsFile("cifar10n", "CIFAR-10N", LABELS_URL, dict.fromkeys(["clean_label", *HUMAN_KEYS.values()], 10))


def read_human_labels(path: Path, md5: str | None, spec: LabelsFile) -> dict[str, np.ndarray]:
    """A CIFAR-N label file: verify its md5, then load it with the numpy allow-list only; its label sets as int64."""
    if not path.exists():
        raise UserError(f"{spec.dataset}: missing {path}; get it from {spec.url}")
    if md5 is not None:
        actual = file_md5(path)
        if superseded := spec.superseded_release(path, actual):
            raise UserError(superseded)
        if actual != md5:
            raise UserError(f"{spec.dataset}: {path} is corrupt or not the published file (md5 mismatch, expected "
                            f"{md5}); delete it and get it again from {spec.url}")
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # the weights-only unpickler refuses anything off the allow-list
        raise UserError(f"{spec.dataset}: {path} is not the published {spec.title} label file ({load_failure(e)}); "
                        f"delete it and get it again from {spec.url}") from None
    needed = list(spec.label_sets)
    if not isinstance(content, dict) or any(k not in content for k in needed):
        raise UserError(f"{spec.dataset}: {path} must hold a dict with {', '.join(needed)}")
    labels = {k: np.asarray(content[k]) for k in needed}  # CIFAR-100N's coarse label sets are lists of ints
    n = len(labels[needed[0]])
    for key, value in labels.items():
        if value.ndim != 1 or len(value) != n or not np.issubdtype(value.dtype, np.integer):
            raise UserError(f"{spec.dataset}: {path}: {key} is not an integer array of {n} labels")
        if n and (value.min() < 0 or value.max() >= spec.label_sets[key]):
            raise UserError(f"{spec.dataset}: {path}: {key} holds labels outside 0..{spec.label_sets[key] - 1}")
    return {k: v.astype(np.int64) for k, v in labels.items()}


def load_failure(error: Exception) -> str:
    """torch.load's failure in one line: the global (or class) its weights-only unpickler refused, which the published
    file does not need; else the last line of its message but for torch's closing pointer to its docs."""
    text = str(error)
    if refused := REFUSED.search(text):
        return f"its pickle names {refused.group(1) or refused.group(2)}, which the allow-list of numpy types refuses"
    gist = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("Check the doc")]
    return gist[-1] if gist else type(error).__name__


def noise_rates(labels: dict[str, np.ndarray], human_keys: dict[str, str], clean_key: str) -> dict[str, float]:
    """Each human label set's disagreement with the clean labels, over all labels in the file."""
    clean = labels[clean_key]
    return {p: float(np.mean(labels[key] != clean)) for p, key in human_keys.items()}


def rates_lines(path: Path, read: Callable[[], dict[str, np.ndarray]], human_keys: dict[str, str],
                clean_key: str) -> list[str]:
    """`bench datasets`' line of a CIFAR-N label file's noise rates, from the file alone (`read` reads it, checked);
    what is wrong with it instead; nothing where it is absent."""
    if not path.exists():
        return []
    try:
        labels = read()
    except UserError as e:
        return [f"labels: {e}"]
    rates = noise_rates(labels, human_keys, clean_key)
    return [f"human noise rate vs {clean_key} (all {len(labels[clean_key]):,}): "
            + ", ".join(f"{p} {100 * r:.2f}%" for p, r in rates.items())]


def attach_human_labels(splits: Splits, human: dict[str, np.ndarray], clean_key: str, human_keys: dict[str, str],
                        where: tuple[str, str], images: tuple[str, str], fix: str) -> Splits:
    """`splits` with the label file's human label sets (pattern -> file key): the first len(train) labels train,
    the rest validate. The file's clean labels must equal the images' in order; for the messages, `where` is (dataset
    name, label file), `images` (the image files, their label key) and `fix` how to get files that agree."""
    n_train, n_val = len(splits.train), len(splits.val)
    clean = human[clean_key]
    dataset, file = where
    image_files, label_key = images
    if len(clean) != n_train + n_val:
        raise UserError(f"{dataset}: {file} has {len(clean)} labels for the {n_train + n_val} images of {image_files}; "
                        f"{fix}")
    differ = np.flatnonzero(clean != np.concatenate([splits.train.y, splits.val.y]))
    if len(differ):
        raise UserError(f"{dataset}: {clean_key} in {file} disagrees with the {label_key} of {image_files} at "
                        f"{len(differ)} of {len(clean)} images, first at image {differ[0]}; {fix}")
    splits.human_labels = {p: (human[k][:n_train], human[k][n_train:]) for p, k in human_keys.items()}
    return splits


class CIFAR10N(CIFAR10):
    """CIFAR-10 with CIFAR-10N's real human labels."""

    name = "cifar10n"
    title = "CIFAR-10N (real human noise)"
    noise_patterns = dict.fromkeys(HUMAN_KEYS)  # real noise: every label set comes from the file
    paper_noise = None  # not in the paper (CIFAR-10N is of 2022)
    files = {**CIFAR10.files, LABELS_FILE: LABELS_MD5}
    urls = {**CIFAR10.urls, LABELS_URL: LABELS_FILE}
    source = CIFAR10.source + "; labels: https://github.com/UCSC-REAL/cifar-10-100n (data/CIFAR-10_human.pt)"

    def human_labels_file(self) -> dict[str, np.ndarray]:
        return read_human_labels(self.root / LABELS_FILE, self.files[LABELS_FILE], LABELS)

    def load(self) -> Splits:
        human = self.human_labels_file()  # checked before the images: the cheaper failure first
        return attach_human_labels(super().load(), human, "clean_label", HUMAN_KEYS, (self.name, LABELS_FILE),
                                   ("the CIFAR-10 training batches", "labels"), MATCHING_IMAGES)

    def describe(self) -> list[str]:
        return super().describe() + rates_lines(self.root / LABELS_FILE, self.human_labels_file, HUMAN_KEYS,
                                                "clean_label")
