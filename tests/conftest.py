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


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for a test module (stopped by this process; never `ray stop`)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def crashing_checkpoints(after_epoch: int = 2) -> type:
    """Epoch checkpoints that raise "node lost" right after saving `after_epoch`: a worker killed mid-stage."""
    from bench.store.folder import Checkpoints

    class CrashAfterEpoch(Checkpoints):
        def save(self, state):
            super().save(state)
            if state["epoch"] == after_epoch:
                raise RuntimeError("node lost")

    return CrashAfterEpoch
