"""Writes tests/data/bench_rows_f352407.json: rows of the code before protocols existed (commit f352407), which
tests/protocol/test_switches.py compares today's bench protocol against. Run from a checkout of that commit:
    git worktree add /tmp/orig f352407
    PYTHONPATH=/tmp/orig .venv/bin/python tests/data/make_bench_rows.py /tmp/orig > tests/data/bench_rows_f352407.json
"""
import json
import sys

import bench
from bench.exec.pack import run_pack
from bench.exec.trainer import run_trial
from bench.trial import TrialConfig

assert bench.__file__.startswith(sys.argv[1]), bench.__file__
KEYS = ("trial_id", "best_epoch", "val_loss", "test_acc", "last_test_acc", "noise_hash")
quiet = dict(log=lambda s: None)
out = {"commit": "f352407", "solo": [], "pack": []}
for method in ("ce", "dmi", "gce"):
    c = TrialConfig("synthetic", method, "case3", 0.3, seed=1, epochs=3, epochs_warmup=2)
    row = run_trial(c, "unused", **quiet)
    out["solo"].append({k: row[k] for k in KEYS})
pack = [TrialConfig("synthetic", "dmi", "case3", 0.3, seed=s, lr=lr, epochs=3, epochs_warmup=2)
        for s in (0, 1) for lr in (1e-3, 1e-4)]
for row in run_pack(pack, "unused", **quiet):
    out["pack"].append({k: row[k] for k in KEYS})
print(json.dumps(out, indent=1))
