"""Shared fixtures: small files in the datasets' published formats, and the optional real data."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BENCH_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture
def shared_data() -> Path:
    """The real data sets (../shared/data); tests using it skip cleanly when it is absent."""
    if not (SHARED_DATA / "README.md").exists():
        pytest.skip(f"real data not available at {SHARED_DATA}")
    return SHARED_DATA


def write_idx(path: Path, array: np.ndarray) -> None:
    """An idx file as published: magic 0x00 0x00 0x08 ndim, big-endian uint32 dims, uint8 data, gzip."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


@pytest.fixture
def tiny_fashion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data root with a 120 + 60 image Fashion-MNIST in torchvision's raw layout (checksums off)."""
    rng = np.random.default_rng(0)
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n in (("train", 120), ("t10k", 60)):
        labels = rng.integers(0, 10, n)
        labels[:: 5] = 8  # enough bags
        images = rng.integers(0, 50, (n, 28, 28))
        images[labels == 8, 10:18, 10:18] = 250  # bags are visibly different
        write_idx(raw / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte.gz", labels)
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    return tmp_path
