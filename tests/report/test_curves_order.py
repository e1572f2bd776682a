"""The memorisation curves' table (`diagnostics._curves`) comes out in one order whatever order the rows were read in:
cells of two warm-start lengths share (cell, x), and the order of such ties once followed the input's."""

from __future__ import annotations

import polars as pl

from bench.report import diagnostics
from bench.store.columns import DIAGNOSTIC_COLUMNS


def _frames() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Two trials of one cell (dmi on mr, pairs, 0.2, seed 0), one with a 1-epoch warm start and one with 2, so the
    method stage's epoch 1 of the first and the warm start's epoch 2 of the second share x = 2."""
    ids, warmups = ["a", "b"], [1, 2]
    trials = pl.DataFrame({"trial_id": ids, "seed": [0, 0], "dataset": ["mr"] * 2, "noise": ["pairs"] * 2,
                           "r": [0.2] * 2, "method": ["dmi"] * 2, "epochs_warmup": warmups,
                           "train_subset": [None, None]},
                          schema_overrides={"train_subset": pl.Int64})
    rows = []
    for trial, warmup in zip(ids, warmups, strict=True):
        rows += [(trial, "warmup", e) for e in range(1, warmup + 1)] + [(trial, "method", e) for e in (1, 2)]
    epochs = pl.DataFrame({"trial_id": [r[0] for r in rows], "stage": [r[1] for r in rows],
                           "epoch": [r[2] for r in rows]})
    epochs = epochs.with_columns(*[(pl.int_range(pl.len()) * (7 + i) % 11 * 1.0).alias(c)
                                   for i, c in enumerate(DIAGNOSTIC_COLUMNS)])
    return trials, trials, epochs


def test_the_curves_table_is_the_same_for_every_order_of_its_input_rows() -> None:
    trials, chosen, epochs = _frames()
    first = diagnostics._curves(trials, chosen, epochs)
    assert first.height == 7 and (first.group_by(["x"]).len()["len"] > 1).any()  # the ties this is about
    for seed in range(8):
        shuffled = diagnostics._curves(trials.sample(fraction=1.0, shuffle=True, seed=seed),
                                       chosen.sample(fraction=1.0, shuffle=True, seed=seed + 100),
                                       epochs.sample(fraction=1.0, shuffle=True, seed=seed + 200))
        assert shuffled.equals(first), seed
