"""Result rows: what one trial measured, with its configuration and provenance, as parquet.

Layout under a results folder (a local path or any pyarrow filesystem URI):
    trials/<trial_id>.parquet   one row: config, status, selection, accuracies, noise, provenance
    epochs/<trial_id>.parquet   the per-epoch curves of the same trial
Each file is written to a temporary name and renamed, so a reader never sees half a file; the trial row is
written last, so its presence means the trial is complete. Parquet is the source of truth: MLflow mirrors it.

Faults: a file that cannot be read (a disk error, a copy cut short) is skipped with one warning naming it, never
a lock-out of the folder; `bench run` moves it aside to `damaged/` and re-runs its trial. A row that cannot be
written where it belongs is kept in `~/.cache/bench/unsaved` (a results folder of its own) and the error says so.
`bench run` holds `RESULTS/.bench.lock` (one driver per folder).
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Making a row needs only numpy and torch: the training core makes rows on a bare GPU box, which may have neither
# pyarrow (writing) nor polars (reading). Those are needed where files are written or read.
try:
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
except ModuleNotFoundError:  # pragma: no cover - exercised by the bare-box import test
    pa = pafs = pq = None
try:
    import polars as pl
except ModuleNotFoundError:  # pragma: no cover
    pl = None

from bench.config import TrialConfig, UserError
from bench.diagnostics import EPOCH_COLUMNS
from bench.noise import NoisyLabels

# Columns other tools rely on, first and in this order.
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
        # Cost (bench.diagnostics): networks the method stage trains, epochs this trial trained (a cached warm
        # start counts none), seconds on its device without the per-epoch diagnostics.
        networks=outcome.networks if outcome else None,
        epochs_trained=sum(e["train_loss"] is not None for e in outcome.epochs) if outcome else None,
        device_s=max(0.0, float(wall_s) - outcome.diagnostics_s) if outcome else float(wall_s),
        diagnostics_s=outcome.diagnostics_s if outcome else None,
        error=(outcome.error if outcome and outcome.error else error),
        python_version=platform.python_version(),
        numpy_version=np.__version__,
        host=platform.node(),
        config_json=json.dumps(config.identity(), sort_keys=True, default=str),
    )
    return row


def _filesystem(root: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    root = str(root)
    if "://" in root:
        return pafs.FileSystem.from_uri(root)
    return pafs.LocalFileSystem(), str(Path(root).expanduser().resolve())


def _write_atomic(table: pa.Table, fs: pafs.FileSystem, path: str) -> None:
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    pq.write_table(table, tmp, filesystem=fs)
    fs.move(tmp, path)


def _write_trial(results: str | os.PathLike[str], row: dict[str, Any], epochs: list[dict[str, Any]]) -> str:
    fs, root = _filesystem(results)
    for sub in ("trials", "epochs"):
        fs.create_dir(f"{root}/{sub}", recursive=True)
    trial_id = row["trial_id"]
    schema = pa.schema([("trial_id", pa.string()), ("stage", pa.string()), ("epoch", pa.int64()),
                        ("train_loss", pa.float64()), ("val_loss", pa.float64()), ("val_acc", pa.float64()),
                        ("seconds", pa.float64())] + [(c, pa.float64()) for c in EPOCH_COLUMNS])
    curve = pa.Table.from_pylist([{"trial_id": trial_id, **e} for e in epochs], schema=schema)
    _write_atomic(curve, fs, f"{root}/epochs/{trial_id}.parquet")
    path = f"{root}/trials/{trial_id}.parquet"
    _write_atomic(pa.Table.from_pylist([row]), fs, path)
    return path


def unsaved_folder() -> Path:
    """Where a row goes when its results folder refuses it: `$BENCH_UNSAVED`, else ~/.cache/bench/unsaved."""
    env = os.environ.get("BENCH_UNSAVED")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "bench" / "unsaved"


def write_trial(results: str | os.PathLike[str], row: dict[str, Any], epochs: list[dict[str, Any]]) -> str:
    """Write the per-epoch table, then the trial row (atomically); return the trial row's path.

    If the results folder refuses the write (full, read-only, gone), the finished trial is not lost: its row and
    curves go to `unsaved_folder()` and the `UserError` says where, and how to move them back."""
    try:
        return _write_trial(results, row, epochs)
    except (OSError, pa.ArrowException) as e:
        problem = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        fs, root = _filesystem(results)
        try:  # no curves without their row
            fs.delete_file(f"{root}/epochs/{row['trial_id']}.parquet")
        except (OSError, pa.ArrowException):
            pass
        for keep in (unsaved_folder(), Path(tempfile.gettempdir()) / "bench-unsaved"):
            try:
                _write_trial(keep, row, epochs)
            except (OSError, pa.ArrowException):
                continue
            raise UserError(f"could not write the row of trial {row['trial_id']} to {results} ({problem}); kept it "
                            f"in {keep}/trials: move {keep}/trials/{row['trial_id']}.parquet and "
                            f"{keep}/epochs/{row['trial_id']}.parquet into the results folder") from None
        raise UserError(f"could not write the row of trial {row['trial_id']} to {results} ({problem}), nor to "
                        f"{unsaved_folder()}: the trial's result is lost") from None


_WARNED: set[str] = set()  # unreadable files already named in this process


def _read(fs: pafs.FileSystem, path: str) -> pl.DataFrame | None:
    try:
        return pl.from_arrow(pq.read_table(path, filesystem=fs))
    except (OSError, pa.ArrowException) as e:
        if path not in _WARNED:
            _WARNED.add(path)
            print(f"bench: warning: skipping the unreadable result file {path} ({type(e).__name__}: "
                  f"{' '.join(str(e).split())[:160]}); `bench run` sets it aside and runs its trial again",
                  file=sys.stderr, flush=True)
        return None


def _paths(fs: pafs.FileSystem, root: str, table: str) -> list[str]:
    selector = pafs.FileSelector(f"{root}/{table}", allow_not_found=True)
    return sorted(info.path for info in fs.get_file_info(selector) if info.path.endswith(".parquet"))


def read_table(results: str | os.PathLike[str], table: str = "trials") -> pl.DataFrame:
    """All rows of `trials` or `epochs` under a results folder, as one polars frame (empty if none). A file that
    cannot be read is skipped with one warning naming it."""
    fs, root = _filesystem(results)
    frames = [frame for p in _paths(fs, root, table) if (frame := _read(fs, p)) is not None]
    if not frames:
        return pl.DataFrame()
    return pl.concat(frames, how="diagonal_relaxed")


def read_row(results: str | os.PathLike[str], trial_id: str) -> tuple[dict[str, Any] | None, pl.DataFrame | None]:
    """One trial's row and its curves (None where missing or unreadable)."""
    fs, root = _filesystem(results)
    found = []
    for table in ("trials", "epochs"):
        path = f"{root}/{table}/{trial_id}.parquet"
        exists = fs.get_file_info(path).type == pafs.FileType.File
        found.append(_read(fs, path) if exists else None)
    row, epochs = found
    return (row.row(0, named=True) if row is not None and row.height else None), epochs


def set_aside_damaged(results: str | os.PathLike[str]) -> list[str]:
    """Move every unreadable result file to `RESULTS/damaged/` (so that its trial runs again and the file stays for
    inspection); return where each went."""
    fs, root = _filesystem(results)
    moved = []
    for table in ("trials", "epochs"):
        for path in _paths(fs, root, table):
            try:
                pq.read_metadata(path, filesystem=fs)
            except (OSError, pa.ArrowException):
                fs.create_dir(f"{root}/damaged", recursive=True)
                target = f"{root}/damaged/{table}-{Path(path).name}.{time.strftime('%Y%m%d-%H%M%S')}"
                fs.move(path, target)
                moved.append(target)
    return moved


@contextmanager
def hold(results: str | os.PathLike[str]) -> Iterator[None]:
    """One driver per results folder: an exclusive `flock` on `RESULTS/.bench.lock`, which names its holder. A
    second holder gets a `UserError` naming the first. The kernel drops the lock when its process dies. Object
    stores have no lock (one driver per folder is then the user's rule)."""
    fs, root = _filesystem(results)
    if not isinstance(fs, pafs.LocalFileSystem):
        yield
        return
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        handle = open(Path(root) / ".bench.lock", "a+")  # noqa: SIM115 - held for the whole block
    except OSError:  # a read-only folder (sync-mlflow to a server): nobody else can write into it either
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise UserError(f"results folder {root} is in use by {holder}; wait for it to finish (or stop it), or "
                            "use another --results") from None
        handle.truncate(0)
        handle.write(f"`bench` pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
