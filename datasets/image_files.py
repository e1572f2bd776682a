"""What the web-scale image sets share: their list files, one image decoded on demand, ImageNet-style crops.

What the web-scale image sets (ANIMAL-10N, Food-101N, mini-WebVision, Red Mini-ImageNet) share: reading their
list files, decoding one image from disk on demand, and the ImageNet-style crops they train and test with.

Their images do not fit in memory: a split is an `ImageFiles`, decoded in the DataLoader workers (shorter side
resized to `stored`, the centre `stored` x `stored`, uint8). The crops then run on the training device for the whole
batch (`ImageCrops`): a random `crop` x `crop` window and a horizontal flip for training, the centre window for
evaluation, both normalised by ImageNet's channel statistics (the models start from ImageNet weights where the field's
papers do). Errors name the file and the dataset in one line.
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError

from bench.config import UserError, integer
from bench.datasets.cifar10 import IMAGENET_MEAN, IMAGENET_STD, crop_flip, normalise_channels

# A local torchvision ResNet-50 state dict (ImageNet weights) for the sets whose papers fine-tune one; nothing is ever
# downloaded at run time.
WEIGHTS_ENV = "BENCH_RESNET50_WEIGHTS"


def resnet50_weights(dataset: str, notes: list[str]) -> dict[str, object]:
    """The ResNet-50's `model_args`: the ImageNet weights file $BENCH_RESNET50_WEIGHTS names, else none, with a note
    saying that the network starts from random weights where the papers start from ImageNet's."""
    if os.environ.get(WEIGHTS_ENV):
        return {"weights": os.environ[WEIGHTS_ENV]}
    notes.append(f"{dataset}: ResNet-50 starts from random weights; the papers start from ImageNet's: set "
                 f"{WEIGHTS_ENV} to a local torchvision ResNet-50 state dict")
    return {}


def read_lines(path: Path, dataset: str) -> list[str]:
    """The non-empty lines of a published list file, stripped; one line naming the file if it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{dataset}: cannot read {path} ({e}); get the file again") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def escapes(key: str) -> bool:
    """Whether an image key would name a file outside its dataset's folder (or none): an absolute path, a `..`
    step, or a NUL. Keys come from list files, and a list file is data, never a licence to open any file."""
    return (key.startswith("/") or "\0" in key or key == ".." or key.startswith("../") or key.endswith("/..")
            or "/../" in key)


def check_key(key: str, path: Path, number: int, dataset: str) -> str:
    """`key`, read from line `number` of the list file `path`, if it names a file inside the dataset's folder;
    else one line naming the list file and the line."""
    if escapes(key):
        raise UserError(f"{dataset}: {path}, line {number}: the image key {key!r} names a file outside the "
                        "dataset's folder (an absolute path or a '..'); the list file is damaged or not the "
                        "published one, get it again")
    return key


def key_label_lines(path: Path, dataset: str, num_classes: int, sep: str | None = None) -> list[tuple[str, int]]:
    """A `key label` list file (`sep` between them, None: white space) as pairs, each label and key checked."""
    pairs = []
    for number, line in enumerate(read_lines(path, dataset), 1):
        parts = line.split(sep)
        if len(parts) != 2 or not 0 <= label_of(parts[1]) < num_classes:
            raise UserError(f"{dataset}: {path}, line {number}: expected `key label` with a label in "
                            f"0..{num_classes - 1}, got {line!r}; the file is damaged, get it again")
        pairs.append((check_key(parts[0].strip(), path, number, dataset), label_of(parts[1])))
    return pairs


def label_of(text: str) -> int:
    """A list file's class label in ASCII digits, else -1 (a '²' or '٣' there is damage, not a class)."""
    try:
        return integer(text) if text.strip().isdigit() else -1
    except ValueError:
        return -1


def decode(path: Path, size: int, dataset: str) -> torch.Tensor:
    """One image file: shorter side resized to `size`, the centre size x size, as 3 x size x size uint8."""
    try:
        with Image.open(path) as img:
            # past the decoder's pixel limit: an error (PIL only warns up to twice the limit), not gigabytes decoded
            if Image.MAX_IMAGE_PIXELS and img.width * img.height > Image.MAX_IMAGE_PIXELS:
                raise Image.DecompressionBombError(f"{img.width} x {img.height} pixels")
            img.draft("RGB", (size, size))
            img = img.convert("RGB")
            w, h = img.size
            if (w, h) != (size, size):
                scale = size / min(w, h)
                img = img.resize((max(size, round(w * scale)), max(size, round(h * scale))),
                                 Image.Resampling.BILINEAR)
                w, h = img.size
            left, top = (w - size) // 2, (h - size) // 2
            array = np.asarray(img.crop((left, top, left + size, top + size)))
    except FileNotFoundError:
        raise UserError(f"{dataset}: missing image {path}; the image folders are incomplete") from None
    except Image.DecompressionBombError as e:
        raise UserError(f"{dataset}: the image {path} is larger than the decoder's limit of "
                        f"{Image.MAX_IMAGE_PIXELS:,} pixels ({' '.join(str(e).split())[:120]}); it is not one of the "
                        "data set's images: replace it with the published file") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError, struct.error) as e:
        # PIL's decoders raise all of these for a damaged file (SyntaxError: a malformed header)
        raise UserError(f"{dataset}: cannot decode {path} ({' '.join(str(e).split())[:120]}); delete it and get it "
                        "again") from None
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


class ImageFiles(torch.utils.data.Dataset):
    """The images of one split, decoded on demand (in DataLoader workers) as 3 x size x size uint8."""

    def __init__(self, root: Path, keys: list[str], size: int, dataset: str) -> None:
        # One fixed-width byte array, not a list of str objects: forked workers would touch every object's
        # reference count and copy the whole list each.
        self.root, self.size, self.dataset = root, size, dataset
        if bad := next((k for k in keys if escapes(k)), None):  # every image set's keys pass here
            raise UserError(f"{dataset}: the image key {bad!r} names a file outside {root} (an absolute path or a "
                            "'..'); the list files are damaged or not the published ones, get them again")
        self.keys = np.array([k.encode() for k in keys], dtype=np.bytes_)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> torch.Tensor:
        return decode(self.root / self.keys[index].decode(), self.size, self.dataset)


class ImageCrops:
    """The train and evaluation transforms of an image set stored at `stored` pixels and cropped to `crop`, mixed
    into its `bench.data.Dataset` (a plain class: the registry finds only datasets)."""

    stored: int = 256
    crop: int = 224

    @staticmethod
    def normalise(x: torch.Tensor) -> torch.Tensor:
        return normalise_channels(x.float() / 255, IMAGENET_MEAN, IMAGENET_STD)

    def eval_transform(self, x: torch.Tensor) -> torch.Tensor:
        top, left = (x.shape[-2] - self.crop) // 2, (x.shape[-1] - self.crop) // 2
        return self.normalise(x[:, :, top : top + self.crop, left : left + self.crop])

    def train_transform(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        n, device = x.shape[0], x.device
        top = torch.randint(0, x.shape[-2] - self.crop + 1, (n,), device=device, generator=generator)
        left = torch.randint(0, x.shape[-1] - self.crop + 1, (n,), device=device, generator=generator)
        flip = torch.rand(n, device=device, generator=generator) < 0.5
        return self.normalise(crop_flip(x, top, left, flip, self.crop, self.crop))


def random_resized_boxes(n: int, height: int, width: int, generator: torch.Generator | None = None,
                         device: torch.device | str = "cpu", scale: tuple[float, float] = (0.08, 1.0),
                         ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> torch.Tensor:
    """torchvision's `RandomResizedCrop.get_params` for a batch: each row (top, left, h, w) is the first of ten tries
    whose box fits in the image, a box of area U(scale) x height x width and of aspect ratio (w / h) log-uniform in
    `ratio`, placed uniformly; where none of the ten fits, the whole image clamped to `ratio` (the whole image for a
    square one), centred. The draws are torchvision's, not its random stream."""
    tries = 10
    area = height * width * torch.empty(n, tries, device=device).uniform_(*scale, generator=generator)
    log_ratio = torch.empty(n, tries, device=device).uniform_(math.log(ratio[0]), math.log(ratio[1]),
                                                             generator=generator)
    aspect = torch.exp(log_ratio)
    w = torch.round(torch.sqrt(area * aspect)).long()
    h = torch.round(torch.sqrt(area / aspect)).long()
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.argmax(fits.int(), dim=1)  # the first try that fits (0 where none does)
    w, h = w.gather(1, first[:, None])[:, 0], h.gather(1, first[:, None])[:, 0]
    u = torch.rand(n, 2, device=device, generator=generator)
    top = torch.floor(u[:, 0] * (height - h + 1)).long()
    left = torch.floor(u[:, 1] * (width - w + 1)).long()
    none = ~fits.any(dim=1)
    if none.any():  # the fallback: the whole image, its ratio clamped to `ratio`, centred
        in_ratio = width / height
        fw, fh = (width, round(width / ratio[0])) if in_ratio < ratio[0] else \
            (round(height * ratio[1]), height) if in_ratio > ratio[1] else (width, height)
        w, h = torch.where(none, fw, w), torch.where(none, fh, h)
        top, left = torch.where(none, (height - fh) // 2, top), torch.where(none, (width - fw) // 2, left)
    return torch.stack([top, left, h, w], dim=1)


def resized_crops(x: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """Each image's box (top, left, h, w) cut out and resized to size x size, bilinear with half-pixel centres and
    no antialiasing, reading only inside the box (`F.interpolate(crop, size, mode="bilinear", align_corners=False)`
    of each crop), for the whole batch in one `grid_sample`."""
    n, _, height, width = x.shape
    x = x if x.is_floating_point() else x.float()
    steps = (torch.arange(size, device=x.device, dtype=x.dtype) + 0.5) / size  # each output pixel's centre, 0..1
    top, left, h, w = (boxes[:, i, None].to(x.dtype) for i in range(4))
    cols = torch.minimum(torch.clamp(left + steps * w - 0.5, min=left), left + w - 1)  # N x size, in pixels
    rows = torch.minimum(torch.clamp(top + steps * h - 0.5, min=top), top + h - 1)
    grid = torch.stack(torch.broadcast_tensors((2 * cols[:, None, :] + 1) / width - 1,
                                               (2 * rows[:, :, None] + 1) / height - 1), dim=-1)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
