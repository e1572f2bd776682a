"""`bench labels`: the exact noisy labels of one (dataset, noise, r, seed), as parquet.

Results at high noise depend on the draw, so a reader who wants to compare with another codebase needs the very
labels our trials trained on. The file holds one row per training and validation example: `split` (train or
val), `index` (the position in the split, as the trainer orders it), `clean` and `noisy` labels and `flipped`.
Its metadata (parquet key-value) names the dataset, noise, r, seed, the transition matrix (null where no T generated
the noise: human and instance-dependent noise), the realised per-class T (`empirical_transition`, training split),
the realised noise rate and `noise_hash`: the hash every result row of those trials records
(`bench.noise.labels_hash` of the noisy training labels then the noisy validation labels), which `labels_hash_of`
recomputes from the file's columns.
The labels are drawn by `bench.exec.prepare.draw_labels`, the function every trial uses, under `--protocol` (the
`authors` protocol's `script_noise` draws them as the paper's scripts do); they do not depend on the method, the
model seed or `--train-subset` (a subset trains on the first N of these). The metadata names the protocol.
"""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench import noise
from bench.config import UserError, default_data_root
from bench.data import check_splits, get_dataset
from bench.exec.prepare import draw_labels
from bench.grid.validate import check_data
from bench.noise import NoisyLabels, labels_hash
from bench.store.folder import check_output
from bench.trial import TrialConfig


def export(config: TrialConfig, data_root: str | Path, out: Path) -> NoisyLabels:
    """Draw the trial's noisy labels and write them to `out` (atomically); return what was drawn."""

    dataset = get_dataset(config.dataset)(data_root)
    splits = check_splits(dataset, dataset.load())
    labels = draw_labels(config, dataset, splits)
    parts = [("train", splits.train.y, labels.train), ("val", splits.val.y, labels.val)]
    table = pa.table({
        "split": pa.array([name for name, clean, _ in parts for _ in range(len(clean))], pa.string()),
        "index": pa.array(np.concatenate([np.arange(len(clean)) for _, clean, _ in parts]), pa.int64()),
        "clean": pa.array(np.concatenate([clean for _, clean, _ in parts]).astype(np.int64)),
        "noisy": pa.array(np.concatenate([noisy for _, _, noisy in parts]).astype(np.int64)),
        "flipped": pa.array(np.concatenate([(clean >= 0) & (clean != noisy) for _, clean, noisy in parts])),
    })
    meta = dict(dataset=config.dataset, noise=config.noise, r=config.r, seed=config.seed, protocol=config.protocol,
                noise_hash=labels.noise_hash, noise_rate=labels.noise_rate,
                transition=None if labels.transition is None else np.round(labels.transition, 6).tolist(),
                empirical_transition=np.round(labels.empirical, 6).tolist())
    table = table.replace_schema_metadata({f"bench.{k}": json.dumps(v) for k, v in meta.items()})
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)
    return labels


def labels_hash_of(path: str | Path) -> tuple[str, str]:
    """(hash recomputed from the file's noisy labels, hash its metadata records)."""
    table = pq.read_table(path)
    split, index, noisy = (table[c].to_numpy(zero_copy_only=False) for c in ("split", "index", "noisy"))
    ordered = [noisy[split == name][np.argsort(index[split == name])] for name in ("train", "val")]
    recorded = json.loads(table.schema.metadata[b"bench.noise_hash"])
    return labels_hash(*ordered), recorded


def cmd_labels(args: argparse.Namespace) -> int:

    noise_name, transition = noise.from_flags(args.noise, args.transition)
    config = TrialConfig(dataset=args.dataset, method="ce", noise=noise_name, r=args.r, seed=args.seed,
                         transition=transition, protocol=args.protocol)
    config.check()
    out = Path(args.out).expanduser()
    if out.suffix != ".parquet":
        raise UserError(f"--out {args.out}: name a .parquet file")
    if not out.parent.is_dir():
        raise UserError(f"--out {args.out}: folder {out.parent} does not exist; create it first")
    if out.is_dir():
        raise UserError(f"--out {args.out} is a folder; name a .parquet file")
    check_output(out, "output file", "give --out a file in a folder you can write", kind="file")
    root = args.data_root if args.data_root is not None else default_data_root()
    check_data([config.dataset], root)
    labels = export(config, root, out)
    print(f"{out}: {len(labels.train)} train + {len(labels.val)} validation labels of {config.dataset} / "
          f"{config.noise} r={config.r:g} seed={config.seed} under protocol {config.protocol}; "
          f"realised noise rate {100 * labels.noise_rate:.2f}%; noise hash {labels.noise_hash}")
    return 0
