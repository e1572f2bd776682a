"""mini-WebVision tested on ILSVRC-2012's validation images of its 50 classes: the second number every
mini-WebVision table reports (DivideMix: 77.32% on WebVision's validation set, 75.20% on ILSVRC-2012's).

A dataset has one test set, so this is a dataset of its own: everything (files, split, noise, model, schedules) is
`webvision_mini`'s, but the test images are ILSVRC-2012's validation images of the 50 classes, one folder per class
under `DATA_ROOT/webvision/imagenet/val/` (DivideMix's `<label>/` or torchvision's `<synset>/` folders; see
`webvision_mini`). Its trials train their own networks: a run of both trains each cell twice.
"""

from __future__ import annotations

from bench.data import Splits
from bench.datasets.webvision_mini import WebVisionMini


class WebVisionMiniILSVRC12(WebVisionMini):
    """mini-WebVision, tested on ILSVRC-2012's validation images of its 50 classes."""

    name = "webvision_mini_ilsvrc12"
    title = "mini-WebVision (real web noise; ILSVRC-2012 val)"
    files = {**WebVisionMini.files, "imagenet/val/": None}
    source = (f"{WebVisionMini.source}; ILSVRC-2012's validation images (ILSVRC2012_img_val.tar, from "
              "https://image-net.org on agreement) sorted into DATA_ROOT/webvision/imagenet/val/<synset>/ by its "
              "valprep.sh")

    def load(self) -> Splits:
        splits = super().load()
        splits.test = self.ilsvrc12_split()
        splits.notes.append(f"{self.name}: tested on {len(splits.test):,} ILSVRC-2012 validation images")
        return splits
