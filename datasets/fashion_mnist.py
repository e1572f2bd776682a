"""Fashion-MNIST as the paper uses it: bags vs clothes (Bag, class 8 -> 0; every other class -> 1).

Reads the four official idx files in torchvision's layout, `DATA_ROOT/FashionMNIST/raw/*.gz`. The paper's split:
the first 50,000 of the 60,000 training images train, the last 10,000 validate, the official 10,000 test
(five sixths / one sixth of a smaller file).
About 10% of images are bags: a highly imbalanced binary problem, on which the paper's cases 2 and 3 become
diagonally non-dominant for r > 0.5.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import torch

from bench import noise
from bench.config import Schedule, UserError
from bench.data import Dataset, Split, Splits

BAG = 8
MIRROR = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FILES = {
    "raw/train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "raw/train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "raw/t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "raw/t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
# The paper's three cases (class 0 = bag, 1 = clothes), as the figures of its section 5.1 name them.
CASES: dict[str, noise.Builder] = {
    "case1": noise.uniform,  # a label is replaced by a uniformly random one: [[1-r/2, r/2], [r/2, 1-r/2]]
    "case2": noise.flip({0: 1}),  # bag -> clothes: [[1-r, r], [0, 1]]
    "case3": noise.flip({1: 0}),  # clothes -> bag: [[1, 0], [r, 1-r]]
}


def read_idx(path: Path) -> np.ndarray:
    """An idx file (gzip-compressed): magic (0, 0, dtype 0x08 = uint8, ndim), big-endian dims, then the data."""
    try:
        data = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, zlib.error) as e:
        raise UserError(f"{path} is not a readable gzip file ({type(e).__name__}: {e}); delete it and download it "
                        "again (`bench datasets --download fashion_mnist`)") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise UserError(f"{path} is not an idx file of unsigned bytes")
    ndim = data[3]
    if len(data) < 4 + 4 * ndim:
        raise UserError(f"{path} is truncated: its header names {ndim} dimensions, and the file ends before them")
    dims = np.frombuffer(data, dtype=">u4", count=ndim, offset=4).astype(int)
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise UserError(f"{path} is truncated: expected {int(np.prod(dims))} bytes of data, found {body.size}")
    return body.reshape(tuple(dims))


class FashionMNIST(Dataset):
    """Fashion-MNIST, bags vs clothes."""

    name = "fashion_mnist"
    title = "Fashion-MNIST (bags vs clothes)"
    num_classes = 2
    class_names = ("bag", "clothes")
    split_sizes = (50_000, 10_000, 10_000)
    model = "fashion_cnn"
    noise_patterns = CASES
    warmup = Schedule("adam", 1e-4, epochs=20, batch_size=128)
    method_stage = Schedule("adam", 1e-4, epochs=20, batch_size=128)
    folder = "FashionMNIST"
    files = FILES
    urls = {MIRROR + Path(rel).name: rel for rel in FILES}
    source = MIRROR + " (or torchvision.datasets.FashionMNIST(root=DATA_ROOT, download=True))"

    def load(self) -> Splits:
        self.check_files()
        raw = self.root / "raw"
        train_x = read_idx(raw / "train-images-idx3-ubyte.gz")
        train_y = read_idx(raw / "train-labels-idx1-ubyte.gz")
        test_x = read_idx(raw / "t10k-images-idx3-ubyte.gz")
        test_y = read_idx(raw / "t10k-labels-idx1-ubyte.gz")

        def split(x: np.ndarray, y: np.ndarray) -> Split:
            # Scaled to [0, 1] once here (190 MB for all 70,000), not in every batch.
            images = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)  # N x 1 x 28 x 28
            return Split(images, np.where(y == BAG, 0, 1).astype(np.int64))

        # The paper's 50,000 / 10,000 of the 60,000 (proportionally for a smaller copy of the files).
        n_train = len(train_y) * 5 // 6
        return Splits(
            train=split(train_x[:n_train], train_y[:n_train]),
            val=split(train_x[n_train:], train_y[n_train:]),
            test=split(test_x, test_y),
        )
