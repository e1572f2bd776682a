"""The report's panel contract and its registry. A panel is one section of `bench report`: one subclass of `Panel` in
one file, found by `bench.config.discover` (as methods and datasets are) among the modules of `bench.report` and the
plug-in folders of `$BENCH_PLUGINS`. Adding a panel is adding that file: `bench.report.build` walks `panels()` in
their declared `order`, writes each one's CSV tables, figures and files, and frames their Markdown and HTML sections.
The leaderboard is a panel too (`bench.report.leaderboard`, order 0): a panel may stand before it.

Every panel is handed the same `Context`: the rows of every protocol (`every`), the headline protocol's (`df`, the
rows the accuracy tables show: `bench.report.protocols.headline`), their aggregate grid, the report's first line, a
progress log, and, read on first use, the epochs table, the setting selected per cell and the methods' labels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from bench.config import discover
from bench.report import analysis
from bench.store.folder import read_table


@dataclass
class Context:
    """What a panel analyses: one results folder, read once for all panels."""

    results: str  # the results folder (a path or a pyarrow filesystem URI); the first, where there are several
    every: pl.DataFrame  # every protocol's trials, as `analysis.load_trials` gives them
    df: pl.DataFrame  # the headline protocol's trials: those the accuracy tables show
    grid: pl.DataFrame  # `analysis.aggregate(df)`: one row per cell, the setting selected on noisy validation
    folder: Path  # where a panel's figures go (`<out>/plots`)
    folders: tuple[str, ...] = ()  # every results folder read (`bench report A B ...`); () means `results` alone
    summary: str = ""  # the report's first line: the trials read, measured cells, commits, the protocol shown
    log: Callable[[str], None] = lambda message: None  # progress for a long step (stderr under `bench report`)

    @cached_property
    def epochs(self) -> pl.DataFrame:
        """The per-epoch table of the results folders (read on first use: only some panels need it), the epochs of
        a trial found in several folders once (its first folder's)."""
        frames, seen = [], set()
        for where in self.folders or (self.results,):
            frame = read_table(where, "epochs")
            if not frame.is_empty():
                frames.append(frame.filter(~pl.col("trial_id").is_in(seen)))
                seen |= set(frame["trial_id"].to_list())
        return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()

    @cached_property
    def settings(self) -> pl.DataFrame:
        """The setting selected per cell of the headline rows (`analysis.select_settings`)."""
        return analysis.select_settings(self.df)

    @cached_property
    def labels(self) -> dict[str, str]:
        """Each method of the headline rows by its display label."""
        return {m: analysis.label(m) for m in self.df["method"].unique().to_list()}


class Panel:
    """One section of the report. `analyse` computes its data once; the other methods render that data. A panel with
    nothing to show returns empty text or one line saying why (a table of no rows is not written)."""

    name: str = ""  # the registry's key; a subclass without one is not a panel (a shared base)
    order: float = 0.0  # where the section stands on the page and in leaderboard.md: lower first

    def analyse(self, ctx: Context) -> Any:
        raise NotImplementedError

    def tables(self, data: Any) -> dict[str, pl.DataFrame]:
        """CSV file name (without `.csv`) -> its frame."""
        return {}

    def figures(self, data: Any, ctx: Context) -> dict[str, Path]:
        """Figure name -> PNG path (written under `ctx.folder`, an SVG beside it where the panel draws one; a panel
        that lists the SVG too names it `<name> svg`)."""
        return {}

    def files(self, data: Any) -> dict[str, str]:
        """Other text files of the report, file name -> text (the leaderboard's `leaderboard.tex`)."""
        return {}

    def markdown(self, data: Any, ctx: Context) -> str:
        return ""

    def html(self, data: Any, figures: dict[str, Path], ctx: Context) -> str:
        return ""


def panels() -> list[Panel]:
    """Every panel, in its declared order (ties by name)."""
    found = discover(Panel, ("bench.report",))
    return sorted((cls() for cls in found.values()), key=lambda p: (p.order, p.name))
