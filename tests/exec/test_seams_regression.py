"""Results stay what they were across the executor and event seams: solo trials (one network, two, a method that
estimates T), a pack and a resumed pack give the rows and curves that the code before them wrote
(tests/data/rows_before_seams.json, from commit dd9a58f by tests/data/make_rows_before_seams.py).

The file was written at one thread on one machine; another thread count or vector width sums in another order, so
what must be bit-equal (ids, noisy labels, statuses, counts, the epochs a curve holds) is compared exactly and the
trained numbers within the rounding of a training (tests/tolerances.py). At one thread on the machine that wrote
the file, the numbers were bit-equal when the seams landed (checked by rerunning the script and diffing)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from bench.exec.executors.pack import pack_id
from bench.exec.pack import run_pack
from bench.exec.trainer import run_trial
from bench.store.folder import Checkpoints
from bench.trial import TrialConfig
from tests.conftest import crashing_checkpoints
from tests.tolerances import TRAINED_REL, same_accuracy, same_selection, trained_close, within

BEFORE = json.loads((Path(__file__).parents[1] / "data" / "rows_before_seams.json").read_text())
EXACT = ("trial_id", "noise_hash", "status", "pack_size", "networks", "epochs_trained", "noise_rate", "protocol",
         "switches")
ACCURACIES = ("test_acc", "test_bal_acc", "last_test_acc", "last_test_bal_acc", "warmup_test_acc")
TEST_EXAMPLES = 1000  # the synthetic set's test split
QUIET = dict(log=lambda s: None)

SOLO = [TrialConfig("synthetic", m, "case3", 0.3, seed=1, epochs=3, epochs_warmup=2) for m in ("ce", "fw",
                                                                                                  "coteaching")]
PACK = [TrialConfig("synthetic", m, "case3", 0.4, seed=s, epochs=4, epochs_warmup=2)
        for m in ("ce", "dmi", "gce") for s in (0, 1)]
RESUMED = [TrialConfig("synthetic", m, "case3", 0.4, seed=3, epochs=5, epochs_warmup=2) for m in ("ce", "dmi")]


def assert_as_before(rows: list[dict], results: Path, before: list[dict]) -> None:
    assert [r["trial_id"] for r in rows] == [b["row"]["trial_id"] for b in before]
    for row, was in zip(rows, before, strict=True):
        want, curves = was["row"], was["curves"]
        assert {k: row[k] for k in EXACT} == {k: want[k] for k in EXACT}
        got = pl.read_parquet(results / "epochs" / f"{row['trial_id']}.parquet").to_dicts()
        assert [(c["stage"], c["epoch"]) for c in got] == [(c["stage"], c["epoch"]) for c in curves]
        for a, b in zip(got, curves, strict=True):
            for key in ("train_loss", "val_loss"):
                assert (a[key] is None) == (b[key] is None) and (a[key] is None or trained_close(a[key], b[key])), \
                    (row["method"], a, b)
            assert (a["val_acc"] is None) == (b["val_acc"] is None)
            assert a["val_acc"] is None or same_accuracy(a["val_acc"], b["val_acc"], TEST_EXAMPLES)
        method_losses = [c["val_loss"] for c in curves if c["stage"] == "method"]
        assert same_selection(row["best_epoch"], want["best_epoch"], method_losses)
        assert trained_close(row["val_loss"], want["val_loss"])
        same_epoch = row["best_epoch"] == want["best_epoch"]
        for key in ACCURACIES if same_epoch else ("last_test_acc", "last_test_bal_acc", "warmup_test_acc"):
            # A balanced accuracy moves by one example of the smallest class: within 100/186 of 2 classes' mean.
            examples = TEST_EXAMPLES if "bal" not in key else 2 * 186
            assert same_accuracy(row[key], want[key], examples), (key, row[key], want[key])
        if same_epoch:
            moved = np.abs(np.array(json.loads(row["confusion"])) - np.array(json.loads(want["confusion"]))).sum()
            assert moved <= 2  # one example from one cell to another, at most
        if want["estimated_transition"] is None:
            assert row["estimated_transition"] is None
        else:  # probabilities: the rounding of training, as an absolute bound
            assert within(json.loads(row["estimated_transition"]), json.loads(want["estimated_transition"]),
                          atol=TRAINED_REL)


def test_solo_trials_give_the_rows_and_curves_they_gave(tmp_path: Path) -> None:
    rows = [run_trial(c, "unused", results=tmp_path, **QUIET) for c in SOLO]
    assert_as_before(rows, tmp_path, BEFORE["solo"])


def test_a_pack_gives_the_rows_and_curves_it_gave(tmp_path: Path) -> None:
    assert_as_before(run_pack(PACK, "unused", results=tmp_path, **QUIET), tmp_path, BEFORE["pack"])


def test_a_resumed_pack_gives_the_rows_and_curves_it_gave(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="node lost"):
        run_pack(RESUMED, "unused", results=tmp_path,
                 checkpoints=crashing_checkpoints(2)(str(tmp_path), pack_id(RESUMED), QUIET["log"]), **QUIET)
    rows = run_pack(RESUMED, "unused", results=tmp_path,
                    checkpoints=Checkpoints(str(tmp_path), pack_id(RESUMED), QUIET["log"]), **QUIET)
    assert_as_before(rows, tmp_path, BEFORE["resumed"])
