"""`bench verify RESULTS [--trial ID ...]`: re-run trials from their rows and compare them bit for bit.

What a reviewer runs to check a paper's rows: each trial's configuration is in its row (`bench.store.rows.
trial_config`), so it is trained again, here, into a scratch folder, and every figure it measured (the row's
measurement columns, every epoch's losses and accuracies) is compared with the row's, as the same float64 or the same
text. A trial that differs is named with its first differing figure and the provenance that differs between its row
and this machine (CPU capability, the kernels' branches, pins, threads, library versions: `bench.numerics`). The rows
of each numerics are re-run in a fresh process of their own, its pins set before torch loads, as `bench run` does.
Exit 0 only when every trial matched.

A trial that trained in a pack (`executor` pack) computed with its pack-mates' float order, which its row does not
hold: it is reported as not verifiable, and counts as not matched.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import tempfile
from pathlib import Path
from typing import Any

from bench.config import UserError
from bench.exec.trainer import run_trial
from bench.exec.warmstart import WarmStartCache
from bench.numerics import NATIVE, restore, set_pins
from bench.store import folder
from bench.store.columns import DIAGNOSTIC_COLUMNS, EPOCH_COLUMNS, FLOAT_ORDER, MEASUREMENT, group
from bench.store.rows import trial_config

# What a trial measured (its row's measurement columns; its error's words are not a figure) and each epoch's figures
# (the per-epoch diagnostics where the re-run computes them too: `BENCH_EPOCH_EVAL` turns them off, and they only look).
FIGURES = [c for c in group(MEASUREMENT) if c != "error"]
EPOCH_FIGURES = [c for c in EPOCH_COLUMNS if c not in ("trial_id", "stage", "epoch", "seconds")]
# Where it was computed, beside its float order: the device's model and the libraries.
PROVENANCE = (*FLOAT_ORDER, "device_model", "torch_version", "numpy_version", "python_version")


def cmd_verify(args: argparse.Namespace) -> int:
    results = folder.absolute(args.results)
    store = folder.Store(results)
    table = store.read_table() if Path(results).is_dir() else None
    if table is None or table.is_empty():
        raise UserError(f"{args.results}: no result rows to verify (a results folder holds trials/*.parquet)")
    rows = {row["trial_id"]: row for row in table.to_dicts()}
    wanted = args.trial or sorted(rows)
    unknown = [t for t in wanted if t not in rows]
    if unknown:
        raise UserError(f"--trial {unknown[0]}: no row of that trial in {args.results} (`bench results "
                        f"{args.results}` lists them)")
    epochs = store.read_table("epochs")
    curves = {t: epochs.filter(trial_id=t).sort("stage", "epoch").to_dicts() if not epochs.is_empty() else []
              for t in wanted}
    print(f"verify: re-running {len(wanted)} trial{'s' * (len(wanted) != 1)} of {args.results}, each compared bit for "
          "bit with its row", flush=True)
    matched = 0
    for mode in sorted({rows[t]["numerics"] or NATIVE for t in wanted}):
        ids = [t for t in wanted if (rows[t]["numerics"] or NATIVE) == mode]
        for trial_id, again in rerun(ids, rows, mode, args.data_root).items():
            verdict = compare(rows[trial_id], curves[trial_id], again)
            matched += verdict[0]
            for line in verdict[1]:
                print(line, flush=True)
    print(f"verify: {matched} of {len(wanted)} trials reproduced bit for bit", flush=True)
    return 0 if matched == len(wanted) else 1


def rerun(ids: list[str], rows: dict[str, dict[str, Any]], mode: str,
          data_root: Path) -> dict[str, tuple[dict[str, Any] | None, list[dict[str, Any]], str]]:
    """Each trial of `ids` (all of numerics `mode`) trained again in a fresh process pinned for `mode`: trial id ->
    (its new row, its new curves, why it could not be re-run: "" where it was)."""
    context = multiprocessing.get_context("spawn")
    devices = {str(rows[t]["device"]).split(" ")[0] for t in ids}
    before = set_pins(mode, "cuda" if any(d.startswith("cuda") for d in devices) else "cpu")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-verify-") as scratch, context.Pool(1) as pool:
            return pool.apply(_rerun_here, ([rows[t] for t in ids], str(data_root), scratch))
    finally:
        restore(before)


def _rerun_here(rows: list[dict[str, Any]], data_root: str,
                scratch: str) -> dict[str, tuple[dict[str, Any] | None, list[dict[str, Any]], str]]:
    """In the re-running process: each row's trial, trained into `scratch` (the warm starts of a cell shared there,
    as a grid shares them), with its row and curves read back as the store holds them."""
    out: dict[str, tuple[dict[str, Any] | None, list[dict[str, Any]], str]] = {}
    cache = WarmStartCache(scratch, log=lambda _: None)
    for row in rows:
        trial_id = row["trial_id"]
        if (row["executor"] or "solo") == "pack" and (row["pack_size"] or 1) > 1:
            out[trial_id] = (None, [], f"trained in a pack of {row['pack_size']}: its float order is its pack's, "
                                       "which its row does not hold")
            continue
        try:
            config = trial_config(row)
            if config.trial_id != trial_id:
                out[trial_id] = (None, [], f"this code computes its configuration as trial {config.trial_id} (a "
                                           "default or a plug-in's version changed since the row was written)")
                continue
            run_trial(config, data_root, results=scratch, log=lambda _: None, warm_cache=cache)
        except UserError as e:
            out[trial_id] = (None, [], str(e))
            continue
        again, curves = folder.Store(scratch).read_row(trial_id)
        out[trial_id] = (again, curves.sort("stage", "epoch").to_dicts() if curves is not None else [], "")
    return out


def compare(row: dict[str, Any], curves: list[dict[str, Any]],
            again: tuple[dict[str, Any] | None, list[dict[str, Any]], str]) -> tuple[bool, list[str]]:
    """Whether the re-run gave the row's every figure, and the lines that say so: the first differing figure, and
    the provenance that differs between the row and this machine."""
    new, new_curves, why = again
    name = f"{row['trial_id']}  {row['method']} {row['noise']} r={row['r']:g} seed={row['seed']}"
    if new is None:
        return False, [f"NOT RE-RUN  {name}: {why}"]
    first = first_difference(row, curves, new, new_curves)
    moved = [f"{c} {_shown(new.get(c))} here, {_shown(row.get(c))} in the row" for c in PROVENANCE
             if row.get(c) is not None and new.get(c) != row.get(c)]
    lines = [f"{'ok' if first is None else 'DIFFERS'}  {name}" + ("" if first is None else f": {first}")]
    if moved:
        lines.append(f"    provenance that differs: {'; '.join(moved)}")
    return first is None, lines


def first_difference(row: dict[str, Any], curves: list[dict[str, Any]], new: dict[str, Any],
                     new_curves: list[dict[str, Any]]) -> str | None:
    """The first figure the re-run gives otherwise (the row's, then each epoch's in order), in words; None: none."""
    for column in FIGURES:
        if not _same(row.get(column), new.get(column)):
            return f"{column} {_shown(new.get(column))} here, {_shown(row.get(column))} in the row"
    if [(c["stage"], c["epoch"]) for c in curves] != [(c["stage"], c["epoch"]) for c in new_curves]:
        return f"its epochs {len(new_curves)} here, {len(curves)} in the row"
    for was, now in zip(curves, new_curves, strict=True):
        for column in EPOCH_FIGURES:
            # The per-epoch diagnostics are an observer's, on where the re-run has them on (BENCH_EPOCH_EVAL)
            observed = column not in DIAGNOSTIC_COLUMNS or now.get(column) is not None
            if was.get(column) is not None and observed and not _same(was.get(column), now.get(column)):
                return (f"{was['stage']} epoch {was['epoch']} {column} {_shown(now.get(column))} here, "
                        f"{_shown(was.get(column))} in the row")
    return None


def _same(a: Any, b: Any) -> bool:
    """Bit for bit: equal values, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)

