"""mini-WebVision tested on ILSVRC-2012's validation images of its 50 classes: the second number every
mini-WebVision table reports (DivideMix: 77.32% on WebVision's validation set, 75.20% on ILSVRC-2012's).

A dataset has one test set, so this is a dataset of its own: everything (files, split, noise, model, schedules) is
`webvision_mini`'s, but the test images are ILSVRC-2012's validation images of the 50 classes, one folder per class
under `DATA_ROOT/webvision/imagenet/val/` (DivideMix's `<label>/` or torchvision's `<synset>/` folders; see
`webvision_mini`). Its trials train their own networks: a run of both trains each cell twice.

`bench datasets --prepare webvision_mini_ilsvrc12 --from DIR` sorts them: DIR holds ILSVRC2012_img_val.tar's images
(`ILSVRC2012_val_<n>.JPEG`, directly or in `ILSVRC2012_img_val/`) and the unpacked development kit
(`ILSVRC2012_devkit_t12/`), whose `data/ILSVRC2012_validation_ground_truth.txt` gives image n's class id on line n and
`data/meta.mat` each id's synset, read as torchvision's ImageNet reads them (torchvision/datasets/imagenet.py,
`parse_meta_mat`: the synsets without children, `parse_val_groundtruth_txt`). The images of the 50 classes are linked
(copied across file systems) into `imagenet/val/<synset>/`; a present file of the same size is kept.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from bench.config import UserError
from bench.data import Splits
from bench.datasets.image_files import read_lines
from bench.datasets.webvision_mini import WebVisionMini

DEVKIT = Path("ILSVRC2012_devkit_t12") / "data"


class WebVisionMiniILSVRC12(WebVisionMini):
    """mini-WebVision, tested on ILSVRC-2012's validation images of its 50 classes."""

    name = "webvision_mini_ilsvrc12"
    title = "mini-WebVision (real web noise; ILSVRC-2012 val)"
    files = {**WebVisionMini.files, "imagenet/val/": None}
    source = (f"{WebVisionMini.source}; ILSVRC-2012's validation images (ILSVRC2012_img_val.tar, from "
              "https://image-net.org on agreement) sorted into DATA_ROOT/webvision/imagenet/val/<synset>/ by "
              "`bench datasets --prepare webvision_mini_ilsvrc12 --from DIR` (DIR: the images and the devkit) or "
              "valprep.sh")

    def load(self) -> Splits:
        splits = super().load()
        splits.test = self.ilsvrc12_split()
        splits.notes.append(f"{self.name}: tested on {len(splits.test):,} ILSVRC-2012 validation images")
        return splits

    def prepare(self, source: Path) -> list[str]:
        """Sort ILSVRC-2012's validation images of the 50 classes into `imagenet/val/<synset>/` (module docstring)."""
        self.synsets()  # info/synsets.txt names the 50 classes
        truth, meta = source / DEVKIT / "ILSVRC2012_validation_ground_truth.txt", source / DEVKIT / "meta.mat"
        if not (truth.is_file() and meta.is_file()):
            raise UserError(f"{self.name}: no {truth} and {meta}: unpack ILSVRC2012_devkit_t12.tar.gz (from "
                            "https://image-net.org, on agreement) into the folder given by --from")
        from scipy.io import loadmat  # here: the datasets load without scipy

        try:
            rows = loadmat(meta, squeeze_me=True)["synsets"]
            synset_of = {int(row[0]): str(row[1]) for row in rows if int(row[4]) == 0}  # leaves: the 1000 classes
            ids = [int(line) for line in read_lines(truth, self.name)]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise UserError(f"{self.name}: cannot read the devkit's {meta.name} or {truth.name} ({e}); unpack the "
                            "devkit again") from None
        images = source / "ILSVRC2012_img_val" if (source / "ILSVRC2012_img_val").is_dir() else source
        wanted, val = set(self.synsets()), self.root / "imagenet" / "val"
        counts = {"linked": 0, "kept": 0, "missing": 0}
        for number, class_id in enumerate(ids, 1):
            synset = synset_of.get(class_id)
            if synset is None:
                raise UserError(f"{self.name}: {truth}, line {number}: class id {class_id} is not in {meta.name}")
            if synset not in wanted:
                continue
            name = f"ILSVRC2012_val_{number:08d}.JPEG"
            source_image, target = images / name, val / synset / name
            if not source_image.is_file():
                counts["missing"] += 1
            elif target.is_file() and target.stat().st_size == source_image.stat().st_size:
                counts["kept"] += 1
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.unlink(missing_ok=True)
                try:
                    os.link(source_image, target)
                except OSError:  # another file system
                    shutil.copyfile(source_image, target)
                counts["linked"] += 1
        for synset in wanted:  # a class without images is still a folder: the loader reads every class's
            (val / synset).mkdir(parents=True, exist_ok=True)
        lines = [f"{self.name}: ILSVRC-2012 validation images of the {len(wanted)} classes in {val}: "
                 f"{counts['linked']:,} placed, {counts['kept']:,} already there"]
        if counts["missing"]:
            lines.append(f"{self.name}: {counts['missing']:,} of them are not in {images}: unpack "
                         "ILSVRC2012_img_val.tar there and run the command again")
        return lines
