"""The rows against the grids `bench run` recorded in the folder: "N of M trials missing", by method and cell, and the
trials each table cell expects.

What the rows lack of the grids that were asked for: each grid `bench run` recorded in the folder
(`bench.store.grids`) against the usable rows (`analysis.load_trials`' `usable`), as one line a grid
(`Gap.line`: "N of M trials missing", by method and by cell) and as the trials the accuracy tables expect per cell
(`planned`, which `analysis.aggregate` takes to show the cells and methods that have no row at all, and to mark
those that lack some). `bench report`, `bench leaderboard` and `bench results` say the same lines.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import polars as pl

from bench.config import UserError
from bench.report.analysis import CELL, label
from bench.report.render import fmt_r
from bench.store import grids, mirror

SCHEMA = {"trial_id": pl.String, "dataset": pl.String, "noise": pl.String, "r": pl.Float64, "method": pl.String,
          "seed": pl.Int64, "protocol": pl.String}
CELLS_NAMED = 6  # a line names at most this many incomplete cells, then counts the rest


@dataclass(frozen=True)
class Gap:
    """One recorded grid against the rows: its trials, each `measured` (a usable row) or not, `has_row` (a row
    that is not usable: failed, or without numbers)."""

    name: str
    trials: pl.DataFrame
    started_at: str  # when `bench run` last started the grid (`bench.store.grids.STAMP`; "" where not recorded)

    @property
    def missing(self) -> pl.DataFrame:
        return self.trials.filter(~pl.col("measured"))

    def line(self, results: str) -> str:
        """The grid in one line: complete, or how many of its trials are missing, by method and by cell."""
        missing, total = self.missing, self.trials.height
        if missing.is_empty():
            return f"Grid {self.name}: all {total} trials have a usable row."
        failed = int(missing["has_row"].sum())
        why = f"{failed} failed or without numbers, {missing.height - failed} without a row" if failed else \
            "no row"
        counts = self.trials.group_by("method", maintain_order=True).agg(
            pl.len().alias("of"), (~pl.col("measured")).sum().alias("missing"))
        methods = ", ".join(f"{label(m)} {k} of {n}" for m, n, k in counts.iter_rows() if k)
        cells = (missing.group_by(CELL, maintain_order=True).agg(pl.col("seed").sort().unique(maintain_order=True))
                 .sort(CELL))
        named = [f"{d} {n} r={fmt_r(r)} {label(m)} (seed{'s' * (len(s) > 1)} {', '.join(map(str, s))})"
                 for d, n, r, m, s in cells.head(CELLS_NAMED).iter_rows()]
        more = f" and {cells.height - CELLS_NAMED} more" if cells.height > CELLS_NAMED else ""
        return (f"Grid {self.name}: {missing.height} of {total} trials missing ({why}): {methods}; in "
                f"{cells.height} cell{'s' * (cells.height != 1)}: {'; '.join(named)}{more}. `bench run "
                f"{results}/grids/{self.name}.yaml --results {results}` runs them.")


def gaps(results: str | os.PathLike[str], rows: pl.DataFrame) -> list[Gap]:
    """Each grid recorded under `results` against `rows` (`analysis.load_trials`' frame: every protocol's)."""
    usable = set(rows.filter(pl.col("usable"))["trial_id"].to_list())
    present = set(rows["trial_id"].to_list())
    out = []
    for grid in grids.read_grids(results):
        trials = pl.DataFrame(list(grid.trials), schema=SCHEMA).with_columns(
            pl.col("r").round(6), pl.col("trial_id").is_in(usable).alias("measured"))
        out.append(Gap(grid.name, trials.with_columns(
            (~pl.col("measured") & pl.col("trial_id").is_in(present)).alias("has_row")), grid.started_at))
    return out


def mirror_line(results: str, rows: pl.DataFrame) -> str | None:
    """One line where the folder's embedded MLflow store (`bench.store.mirror`) holds fewer complete trial runs than
    the folder has rows (a grid stopped before its mirror caught up, a folder copied in part); None where it holds
    them all, or where there is no such store to read cheaply."""
    try:
        uri = mirror.tracking_uri(results)
    except UserError:  # a folder name MLflow cannot carry: it has no embedded store
        return None
    logged = mirror.complete_trial_runs(uri) if uri else None
    ids = set(rows["trial_id"].to_list())
    if logged is None or not (missing := ids - logged):
        return None
    return (f"MLflow ({uri}) holds {len(ids) - len(missing)} of the {len(ids)} rows' trials: `bench sync-mlflow "
            f"{results}` logs the other {len(missing)}.")


def planned(found: list[Gap], protocol: str) -> pl.DataFrame:
    """The trials of every recorded grid under `protocol` (the one the tables show), each once, with `measured`."""
    frames = [g.trials.filter(pl.col("protocol") == protocol) for g in found]
    if not frames:
        return pl.DataFrame(schema=SCHEMA | {"measured": pl.Boolean, "has_row": pl.Boolean})
    return pl.concat(frames).unique("trial_id", keep="first", maintain_order=True)
