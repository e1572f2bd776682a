"""The report's panel "Diverged and failed trials" (HTML only): every headline trial whose status is not ok, with
its error, last on the page."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from bench.report.analysis import label
from bench.report.panel import Context, Panel
from bench.report.render import html_table, td

COLUMNS = ("trial_id", "dataset", "noise", "r", "method", "seed", "status", "error")


class FailedTrials(Panel):
    name = "failures"
    order = 90.0

    def analyse(self, ctx: Context) -> pl.DataFrame:
        return ctx.df.filter(pl.col("status") != "ok").sort("dataset", "noise", "r", "method", "seed")

    def html(self, data: pl.DataFrame, figures: dict[str, Path], ctx: Context) -> str:
        if data.is_empty():  # a panel with nothing to show is left out, with one line why
            return "<p class=note>Diverged and failed trials: none, every trial of the tables ended ok.</p>"
        rows = ["<tr>" + "".join(td(label(b[k]) if k == "method" else b[k] if b[k] is not None else "", "l")
                                 for k in COLUMNS) + "</tr>" for b in data.iter_rows(named=True)]
        return f"<h2>Diverged and failed trials ({data.height})</h2>" + html_table(
            ["trial", "dataset", "noise", "r", "method", "seed", "status", "error"], rows, 8)
