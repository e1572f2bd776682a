"""Result rows: what one trial measured, with its configuration and provenance, as parquet.

Layout under a results folder (a local path or any pyarrow filesystem URI):
    trials/<trial_id>.parquet   one row: config, status, selection, accuracies, noise, provenance
    epochs/<trial_id>.parquet   the per-epoch curves of the same trial
Each file is written to a temporary name and renamed, so a reader never sees half a file; the trial row is
written last, so its presence means the trial is complete. Parquet is the source of truth: MLflow mirrors it.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa
    import pyarrow.fs as pafs

# pyarrow and polars are imported where files are read or written: making a row needs only numpy and torch, so the
# training core (which makes rows) runs on a bare GPU box; writing needs pyarrow, reading polars.

from bench.config import TrialConfig
from bench.noise import NoisyLabels

# Columns other tools rely on (DESIGN §3), first and in this order.
CORE_COLUMNS = [
    "trial_id", "experiment", "dataset", "model", "method", "noise", "r", "seed", "lr", "batch_size",
    "status", "best_epoch", "val_loss", "test_acc", "test_bal_acc", "last_test_acc", "noise_rate",
    "noise_hash", "wall_s", "device", "git_commit", "torch_version",
]


@functools.cache
def git_commit() -> str:
    """The commit of the bench checkout this code runs from ("unknown" for an installed copy)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if out.returncode != 0:
        return "unknown"
    return out.stdout.strip()[:12] + ("-dirty" if dirty.stdout.strip() else "")


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return f"cpu ({platform.machine()})"


def _matrix(m: np.ndarray | None) -> str | None:
    return None if m is None else json.dumps(np.round(np.asarray(m, dtype=float), 6).tolist())


def make_row(
    config: TrialConfig,
    model: str,
    labels: NoisyLabels | None,
    outcome: Any | None,
    wall_s: float,
    lr: float,
    batch_size: int,
    epochs: int,
    epochs_warmup: int,
    privileged: bool = False,
    error: str = "",
) -> dict[str, Any]:
    """One trial's row. `outcome` is the trainer's `Outcome`; None for a trial that failed before it ended."""
    row: dict[str, Any] = dict(
        trial_id=config.trial_id, experiment=config.experiment, dataset=config.dataset, model=model,
        method=config.method, noise=config.noise, r=float(config.r), seed=int(config.seed),
        lr=float(lr), batch_size=int(batch_size),
        status=outcome.status if outcome else "failed",
        best_epoch=outcome.best_epoch if outcome else None,
        val_loss=outcome.val_loss if outcome else None,
        test_acc=outcome.test_acc if outcome else None,
        test_bal_acc=outcome.test_bal_acc if outcome else None,
        last_test_acc=outcome.last_test_acc if outcome else None,
        noise_rate=labels.noise_rate if labels else None,
        noise_hash=labels.noise_hash if labels else None,
        wall_s=float(wall_s), device=device_name(config.device), git_commit=git_commit(),
        torch_version=torch.__version__,
        # Beyond the core columns:
        epochs=int(epochs), epochs_warmup=int(epochs_warmup),
        method_params=json.dumps(dict(config.method_params), sort_keys=True, default=str),
        train_subset=config.train_subset,
        last_test_bal_acc=outcome.last_test_bal_acc if outcome else None,
        warmup_test_acc=outcome.warmup_test_acc if outcome else None,
        warmup_s=outcome.warmup_s if outcome else None,
        method_s=outcome.method_s if outcome else None,
        transition=_matrix(labels.transition) if labels else None,
        empirical_transition=_matrix(labels.empirical) if labels else None,
        estimated_transition=_matrix(outcome.estimated_transition) if outcome else None,
        confusion=_matrix(outcome.confusion) if outcome else None,
        privileged=bool(privileged),
        pack_size=outcome.pack_size if outcome else None,  # trials trained together with this one (1: solo)
        error=(outcome.error if outcome and outcome.error else error),
        python_version=platform.python_version(),
        numpy_version=np.__version__,
        host=platform.node(),
        config_json=json.dumps(config.identity(), sort_keys=True, default=str),
    )
    return row


def _filesystem(root: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    import pyarrow.fs as pafs

    root = str(root)
    if "://" in root:
        return pafs.FileSystem.from_uri(root)
    return pafs.LocalFileSystem(), str(Path(root).expanduser().resolve())


def _write_atomic(table: pa.Table, fs: pafs.FileSystem, path: str) -> None:
    import pyarrow.parquet as pq

    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    pq.write_table(table, tmp, filesystem=fs)
    fs.move(tmp, path)


def write_trial(results: str | os.PathLike[str], row: dict[str, Any], epochs: list[dict[str, Any]]) -> str:
    """Write the per-epoch table, then the trial row (atomically); return the trial row's path."""
    import pyarrow as pa

    fs, root = _filesystem(results)
    for sub in ("trials", "epochs"):
        fs.create_dir(f"{root}/{sub}", recursive=True)
    trial_id = row["trial_id"]
    schema = pa.schema([("trial_id", pa.string()), ("stage", pa.string()), ("epoch", pa.int64()),
                        ("train_loss", pa.float64()), ("val_loss", pa.float64()), ("val_acc", pa.float64()),
                        ("seconds", pa.float64())])
    curve = pa.Table.from_pylist([{"trial_id": trial_id, **e} for e in epochs], schema=schema)
    _write_atomic(curve, fs, f"{root}/epochs/{trial_id}.parquet")
    path = f"{root}/trials/{trial_id}.parquet"
    _write_atomic(pa.Table.from_pylist([row]), fs, path)
    return path


def finished_trial_ids(results: str | os.PathLike[str]) -> set[str]:
    """Trial ids that have a result row (any status)."""
    import pyarrow.fs as pafs

    fs, root = _filesystem(results)
    selector = pafs.FileSelector(f"{root}/trials", allow_not_found=True)
    return {
        Path(info.path).name.removesuffix(".parquet")
        for info in fs.get_file_info(selector)
        if info.path.endswith(".parquet")
    }


def read_table(results: str | os.PathLike[str], table: str = "trials") -> pl.DataFrame:
    """All rows of `trials` or `epochs` under a results folder, as one polars frame (empty if none)."""
    import polars as pl
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs, root = _filesystem(results)
    selector = pafs.FileSelector(f"{root}/{table}", allow_not_found=True)
    paths = sorted(info.path for info in fs.get_file_info(selector) if info.path.endswith(".parquet"))
    if not paths:
        return pl.DataFrame()
    frames = [pl.from_arrow(pq.read_table(p, filesystem=fs)) for p in paths]
    return pl.concat(frames, how="diagonal_relaxed")
