"""The panel "Protocol effect": the `bench` protocol against `authors` and its single switches.

The report's panel "Protocol effect": wherever a results folder holds trials of the `bench` protocol and of
another (`authors`, or bench with single switches of the authors' scripts: `bench.protocol`), per cell (dataset,
noise, r, method) the paper's published mean ± std, bench's, the other protocol's, and the difference other − bench
paired by seed with its 95% t half-width. Each protocol selects its own setting per cell, as the accuracy tables do
(`bench.report.analysis.aggregate` over that protocol's trials alone). Rendered as a Markdown and an HTML section of
`bench report` (and `protocols.csv`): the panel `ProtocolEffect`.

The accuracy tables themselves show one protocol: bench's where the folder holds it (`headline`).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import polars as pl

from bench.report import analysis, statistics
from bench.report.analysis import CELL, MISSING, fmt, label
from bench.report.panel import Context, Panel
from bench.report.render import fmt_r, html_table, md, pm, td

BENCH = "bench"
TITLE = "Protocol effect"
ORACLE = "‡ oracle"  # after a method whose rows selected on the clean test set (the row's `oracle`)
NOTE = (
    "Clean test accuracy (%) of each cell under bench (the paper's protocol done right) and under another protocol "
    "of the same results folder: authors (as the paper's scripts ran it) or bench with single switches of theirs "
    "(docs/fidelity.md lists each switch with its script and line). Paper: the published mean ± std. Each protocol's "
    "accuracy is the mean ± std over seeds at the setting it selects, n seeds; the difference protocol − bench is "
    "paired by seed (the mean over the seeds both hold ± the half-width of its 95% Student-t interval, the shared "
    f"seeds in parentheses; no interval under {statistics.MIN_CI_SEEDS}). {ORACLE} after a method: its rows kept "
    "their epoch by clean test accuracy, as the authors' script did (the row's oracle column): an upper bound, not a "
    "result."
)
SCHEMA = {"dataset": pl.String, "noise": pl.String, "r": pl.Float64, "method": pl.String, "protocol": pl.String,
          "paper_mean": pl.Float64, "paper_std": pl.Float64, "bench_n": pl.Int64, "bench_mean": pl.Float64,
          "bench_std": pl.Float64, "other_n": pl.Int64, "other_mean": pl.Float64, "other_std": pl.Float64,
          "paired_n": pl.Int64, "diff": pl.Float64, "diff_ci95": pl.Float64, "oracle": pl.Boolean}


def headline(df: pl.DataFrame) -> pl.DataFrame:
    """The rows the accuracy tables show: bench's where the folder holds any, else those of its one protocol (a
    folder of several protocols without bench shows the first in sorted order)."""
    protocols = sorted(df["protocol"].unique().to_list())
    keep = BENCH if BENCH in protocols else protocols[0]
    return df.filter(pl.col("protocol") == keep)


def _cells(df: pl.DataFrame) -> tuple[dict[tuple[Any, ...], dict[str, Any]], dict[tuple[Any, ...], dict[int, float]]]:
    """One protocol's aggregate cells and each cell's per-seed accuracies at its selected setting."""
    grid = analysis.aggregate(df)
    cells = {tuple(c[k] for k in CELL): c for c in grid.iter_rows(named=True) if c["n"]}
    return cells, analysis.seed_accuracies(analysis.selected_trials(df))


def compare(df: pl.DataFrame) -> pl.DataFrame:
    """One row per (cell, protocol other than bench) where both hold a measured cell. `df`: every protocol's trials,
    as `analysis.load_trials` gives them."""
    protocols = sorted(df["protocol"].unique().to_list())
    if BENCH not in protocols or len(protocols) < 2:
        return pl.DataFrame(schema=SCHEMA)
    bench_cells, bench_accs = _cells(df.filter(pl.col("protocol") == BENCH))
    paper = analysis.paper_comparison(analysis.aggregate(df.filter(pl.col("protocol") == BENCH)))
    published = {(p["dataset"], p["r"], p["method"]): p for p in paper.iter_rows(named=True)}
    order = {m: i for i, m in enumerate(analysis.method_order(sorted({k[3] for k in bench_cells})))}
    rows = []
    for spec in (p for p in protocols if p != BENCH):
        cells, accs = _cells(df.filter(pl.col("protocol") == spec))
        oracles = _oracle_cells(df.filter(pl.col("protocol") == spec))
        for key in sorted(cells.keys() & bench_cells.keys(), key=lambda k: (k[0], k[1], k[2], order[k[3]])):
            b, o = bench_cells[key], cells[key]
            ref = published.get((key[0], key[2], key[3])) if analysis.paper_noise(key[0]) == key[1] else None
            n, diff, half = statistics.paired_difference(bench_accs.get(key, {}), accs.get(key, {}))
            rows.append(dict(zip(CELL, key, strict=True), protocol=spec,
                             paper_mean=ref["paper_mean"] if ref else None, paper_std=ref["paper_std"] if ref else None,
                             bench_n=b["n"], bench_mean=b["acc_mean"], bench_std=b["acc_std"], other_n=o["n"],
                             other_mean=o["acc_mean"], other_std=o["acc_std"], paired_n=n, diff=diff,
                             diff_ci95=half, oracle=key in oracles))
    return pl.DataFrame(rows, schema=SCHEMA)


def _oracle_cells(df: pl.DataFrame) -> set[tuple[Any, ...]]:
    """The cells some of whose rows selected on the clean test set (rows written before the column: none)."""
    if "oracle" not in df.columns:
        return set()
    return {tuple(r[k] for k in CELL) for r in df.filter(pl.col("oracle").fill_null(False)).iter_rows(named=True)}


def _diff(row: dict[str, Any]) -> str:
    if row["diff"] is None:
        return MISSING
    return f"{row['diff']:+.2f} ± {fmt(row['diff_ci95'])} ({row['paired_n']})"


HEADER = ["dataset", "noise", "r", "method", "paper", "bench", "n", "protocol", "its accuracy", "n",
          "protocol − bench (paired)"]


def _cells_of(p: dict[str, Any]) -> list[str]:
    method = label(p["method"]) + (f" {ORACLE}" if p["oracle"] else "")
    return [p["dataset"], p["noise"], fmt_r(p["r"]), method, pm(p["paper_mean"], p["paper_std"]),
            pm(p["bench_mean"], p["bench_std"]), str(p["bench_n"]), p["protocol"],
            pm(p["other_mean"], p["other_std"]), str(p["other_n"]), _diff(p)]

# One line where the panel has no row.
LEFT_OUT = f"{TITLE}: left out, no cell holds trials of bench and of another protocol."


def to_markdown(panel: pl.DataFrame) -> str:
    """The panel as a Markdown section (one line why where it has no row)."""
    if panel.is_empty():
        return f"{md(LEFT_OUT)}\n\n"
    lines = ["", f"## {TITLE}", "", NOTE, "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(md(c) for c in _cells_of(p)) + " |" for p in panel.iter_rows(named=True)]
    return "\n".join(lines + ["", ""])


def to_html(panel: pl.DataFrame) -> str:
    """The panel as an HTML section (one line why where it has no row)."""
    if panel.is_empty():
        return f"<p class=note>{html.escape(LEFT_OUT)}</p>"
    rows = []
    for p in panel.iter_rows(named=True):
        text = _cells_of(p)
        rows.append("<tr>" + "".join(td(c, "l" if i in (0, 1, 3, 7) else "", value=v) for i, (c, v) in enumerate(zip(
            text, [None, None, p["r"], None, p["paper_mean"], p["bench_mean"], p["bench_n"], None, p["other_mean"],
                   p["other_n"], p["diff"]], strict=True))) + "</tr>")
    return f"<h2>{html.escape(TITLE)}</h2><p class=note>{html.escape(NOTE)}</p>" + html_table(HEADER, rows)


class ProtocolEffect(Panel):
    """Compares every protocol's rows (`Context.every`), where the other panels see the headline's."""

    name = "protocols"
    order = 10.0

    def analyse(self, ctx: Context) -> pl.DataFrame:
        return compare(ctx.every)

    def tables(self, data: pl.DataFrame) -> dict[str, pl.DataFrame]:
        return {"protocols": data}

    def markdown(self, data: pl.DataFrame, ctx: Context) -> str:
        return to_markdown(data)

    def html(self, data: pl.DataFrame, figures: dict[str, Path], ctx: Context) -> str:
        return to_html(data)
