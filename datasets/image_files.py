"""What the web-scale image sets (ANIMAL-10N, Food-101N, mini-WebVision, Red Mini-ImageNet) share: reading their
list files, decoding one image from disk on demand, and the ImageNet-style crops they train and test with.

Their images do not fit in memory: a split is an `ImageFiles`, decoded in the DataLoader workers (shorter side
resized to `stored`, the centre `stored` x `stored`, uint8). The crops then run on the training device for the whole
batch (`ImageCrops`): a random `crop` x `crop` window and a horizontal flip for training, the centre window for
evaluation, both normalised by ImageNet's channel statistics (the models start from ImageNet weights where the field's
papers do). Errors name the file and the dataset in one line.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import torch
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


def key_label_lines(path: Path, dataset: str, num_classes: int, sep: str | None = None) -> list[tuple[str, int]]:
    """A `key label` list file (`sep` between them, None: white space) as pairs, each label checked."""
    pairs = []
    for number, line in enumerate(read_lines(path, dataset), 1):
        parts = line.split(sep)
        if len(parts) != 2 or not 0 <= label_of(parts[1]) < num_classes:
            raise UserError(f"{dataset}: {path}, line {number}: expected `key label` with a label in "
                            f"0..{num_classes - 1}, got {line!r}; the file is damaged, get it again")
        pairs.append((parts[0].strip(), label_of(parts[1])))
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
