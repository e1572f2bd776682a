"""Writes tests/data/rows_before_seams.json: the rows and epoch curves that the code before the executor and event
seams (commit dd9a58f) gave for solo trials (one network, two networks, a method that estimates T), a pack and a
pack killed after its second method epoch and resumed. tests/exec/test_seams_regression.py compares today's code against
them. Run from a checkout of that commit, at one thread:
    git worktree add /tmp/before dd9a58f
    OMP_NUM_THREADS=1 PYTHONPATH=/tmp/before:. .venv/bin/python tests/data/make_rows_before_seams.py /tmp/before \
        > tests/data/rows_before_seams.json
"""
import json
import sys
import tempfile

import numpy as np
import polars as pl

import bench
from bench.exec.pack import run_pack
from bench.exec.trainer import run_trial
from bench.grid.plan import pack_id
from bench.store.folder import Checkpoints
from bench.trial import TrialConfig
from tests.conftest import crashing_checkpoints

assert bench.__file__.startswith(sys.argv[1]), bench.__file__
# What a trial measured and what identifies it; not the clock (wall_s, ...) nor the provenance (git commit, host).
KEYS = ("trial_id", "noise_hash", "status", "best_epoch", "val_loss", "test_acc", "test_bal_acc", "last_test_acc",
        "last_test_bal_acc", "warmup_test_acc", "confusion", "estimated_transition", "pack_size", "networks",
        "epochs_trained", "noise_rate", "protocol", "switches")
CURVE = ("stage", "epoch", "train_loss", "val_loss", "val_acc")
quiet = dict(log=lambda s: None)


def record(rows, results):
    out = []
    for row in rows:
        curves = pl.read_parquet(f"{results}/epochs/{row['trial_id']}.parquet")
        out.append({"row": {k: row[k] for k in KEYS}, "curves": curves.select(CURVE).to_dicts()})
    return out


SOLO = [TrialConfig("synthetic", "ce", "case3", 0.3, seed=1, epochs=3, epochs_warmup=2),
        TrialConfig("synthetic", "fw", "case3", 0.3, seed=1, epochs=3, epochs_warmup=2),
        TrialConfig("synthetic", "coteaching", "case3", 0.3, seed=1, epochs=3, epochs_warmup=2)]
PACK = [TrialConfig("synthetic", m, "case3", 0.4, seed=s, epochs=4, epochs_warmup=2)
        for m in ("ce", "dmi", "gce") for s in (0, 1)]
RESUMED = [TrialConfig("synthetic", m, "case3", 0.4, seed=3, epochs=5, epochs_warmup=2) for m in ("ce", "dmi")]

out = {"commit": "dd9a58f", "solo": [], "pack": [], "resumed": []}
with tempfile.TemporaryDirectory() as tmp:
    rows = [run_trial(c, "unused", results=f"{tmp}/solo", **quiet) for c in SOLO]
    out["solo"] = record(rows, f"{tmp}/solo")
    out["pack"] = record(run_pack(PACK, "unused", results=f"{tmp}/pack", **quiet), f"{tmp}/pack")
    results = f"{tmp}/resumed"
    try:
        run_pack(RESUMED, "unused", results=results,
                 checkpoints=crashing_checkpoints(2)(results, pack_id(RESUMED), quiet["log"]), **quiet)
    except RuntimeError:
        pass
    rows = run_pack(RESUMED, "unused", results=results,
                    checkpoints=Checkpoints(results, pack_id(RESUMED), quiet["log"]), **quiet)
    out["resumed"] = record(rows, results)


def plain(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return value


print(json.dumps(out, indent=1, default=plain))
