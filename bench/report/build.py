"""What `bench report` and `bench leaderboard` produce: one loop over the panels into one folder, framed as
`leaderboard.md` and the self-contained `report.html` (`report.css`, `report.js`).

What `bench report` and `bench leaderboard` produce (their commands: `bench.cli.report`): read a results folder
and write every panel's rendering of it into one folder (`build_report`): the panels (`bench.report.panel`: each a
file of its own, found by the registry, the leaderboard first at order 0) in their order, framed as one page
(`leaderboard.md`: the Markdown sections one after another; `report.html`: one self-contained page, its CSS and JS
the package files `bench/report/report.css` and `report.js` inlined, its figures base64 PNG); or the leaderboard
alone as terminal text (`terminal_leaderboard`, from the leaderboard's own tables). `build_report` names no panel
(it takes only the headline rule, `protocols.headline`, which `bench leaderboard` shares).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import polars as pl

from bench.config import UserError
from bench.report import analysis, completeness, leaderboard, protocols
from bench.report.panel import Context, Panel, panels
from bench.report.render import asset, stderr
from bench.store.folder import read_table, replace_file

Log = Callable[[str], None]


def _summary(df: pl.DataFrame, grid: pl.DataFrame, results: str, every: pl.DataFrame | None = None) -> str:
    """The report's first line; `every`: the rows of all protocols, where `df` holds the headline one's."""
    status = {s: int((df["status"] == s).sum()) for s in ("ok", "diverged", "failed")}
    measured = int((grid["n"] > 0).sum())
    commits = ", ".join(sorted({str(c) for c in df["git_commit"].to_list() if c is not None})) or "unknown"
    text = (f"{df.height} trials under {results}: {status['ok']} ok, {status['diverged']} diverged, "
            f"{status['failed']} failed; {measured} of {grid.height} cells measured "
            f"({grid.height - measured} missing); commits {commits}.")
    shown = df["protocol"][0] if df.height else protocols.BENCH
    if every is None or every.height == df.height:
        return text + f" The tables show the {shown} protocol's trials."
    counts = every.group_by("protocol").len().sort("protocol")
    text += " Protocols: " + ", ".join(f"{p} ({n} trials)" for p, n in counts.iter_rows())
    if protocols.BENCH in counts["protocol"].to_list():
        return text + f"; the tables show {shown}'s, the protocol-effect panel compares them."
    # The panel pairs each protocol with bench's trials: without them it is not drawn, and the others are not shown.
    return text + (f"; the tables show {shown}'s only (the first in sorted order); the others are not shown, and "
                   "no panel compares them: that needs bench's trials of the same cells.")


def _read(folders: list[str]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, str]:
    """The folder's rows (every protocol's), the headline protocol's (those the accuracy tables show: the protocol
    panel compares the others), their cells with the trials the recorded grids asked for, and the report's first
    lines: the rows and what computed them (`analysis.float_orders`), then one line a recorded grid, and one where
    MLflow lacks runs (`bench.report.completeness`)."""
    every = analysis.load_trials(folders)
    df = protocols.headline(every)
    found = {where: completeness.gaps(where, every) for where in folders}
    grid = analysis.aggregate(df, planned=completeness.planned(
        [g for gaps in found.values() for g in gaps], df["protocol"][0]))
    own = {folders[0]: every} if len(folders) == 1 else {where: read_table(where) for where in folders}
    lines = [_summary(df, grid, ", ".join(folders), every) + analysis.float_orders(df),
             *(g.line(where) for where in folders for g in found[where]),
             *(completeness.mirror_line(where, own[where]) for where in folders)]
    return every, df, grid, " ".join(line for line in lines if line)


def _page(sections: list[str]) -> str:
    """`report.html`: the panels' sections in one self-contained page, no external asset."""
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>bench report</title>"
            f"<style>{asset('report.css')}</style></head><body>{''.join(sections)}<script>{asset('report.js')}</script>"
            "</body></html>\n")


def _render(panel: Panel, ctx: Context, written: dict[str, Path], tables: dict[str, pl.DataFrame],
            files: dict[str, str], markdown: list[str], html: list[str]) -> None:
    """One panel: its analysis, figures (into `written`), tables (into `tables`, by CSV name), other files (into
    `files`, by file name) and sections."""
    data = panel.analyse(ctx)
    drawn = panel.figures(data, ctx)
    written |= {f"plot {name}": path for name, path in drawn.items()}
    for kind, taken, own in (("table", tables, panel.tables(data)), ("file", files, panel.files(data))):
        if clash := sorted(taken.keys() & own.keys()):
            raise UserError(f"panel {panel.name!r} ({type(panel).__module__}) writes "
                            f"{', '.join(f'{c}.csv' if kind == 'table' else c for c in clash)}, which the report "
                            f"already writes: rename its {kind}")
        taken |= own
    markdown.append(panel.markdown(data, ctx))
    html.append(panel.html(data, drawn, ctx))


def build_report(results: str | Path | Sequence[str | Path], out: Path, log: Log = stderr) -> dict[str, Path]:
    """Write every output of `bench report` under `out`; return them by name: each panel's figures
    (`bench.report.panel.panels()`, in their order: the leaderboard's first), then their CSV tables, then
    `leaderboard.md`, the panels' other files (the leaderboard's `leaderboard.tex`) and `report.html`. A table without
    rows is no file (its panel says in the page why it is left out)."""
    folders = [str(results)] if isinstance(results, (str, Path)) else [str(r) for r in results]
    log(f"reading result rows under {', '.join(folders)} ...")
    every, df, grid, summary = _read(folders)
    log(summary)
    ctx = Context(results=folders[0], every=every, df=df, grid=grid, folder=out / "plots", folders=tuple(folders),
                  summary=summary, log=log)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    tables: dict[str, pl.DataFrame] = {}
    files: dict[str, str] = {}
    markdown: list[str] = []
    html: list[str] = []
    for panel in panels():
        log(f"panel: {panel.name} ...")
        _render(panel, ctx, written, tables, files, markdown, html)
    if clash := sorted(files.keys() & {"leaderboard.md", "report.html"}):
        raise UserError(f"a panel writes {', '.join(clash)}, which the report's page is: rename its file")
    log("writing tables ...")
    for name, frame in tables.items():
        if frame.is_empty():  # a panel left out (nothing to show) writes no table; an earlier report's copy goes
            (out / f"{name}.csv").unlink(missing_ok=True)
            continue
        written[f"{name} csv"] = out / f"{name}.csv"
        replace_file(written[f"{name} csv"], frame.write_csv)
    if left_out := [f"{name}.csv" for name, frame in tables.items() if frame.is_empty()]:
        log(f"tables left out (no rows: their panels had nothing to show): {', '.join(left_out)}")
    texts = {"leaderboard.md": "".join(markdown), **files, "report.html": _page(html)}
    for name, text in texts.items():
        written[name] = out / name
        replace_file(written[name], lambda tmp, text=text: tmp.write_text(text, encoding="utf-8"))
    return written


def terminal_leaderboard(results: str, metric: str = "selected", bold: bool = False) -> str:
    """`bench leaderboard`'s text: the headline protocol's leaderboard as aligned terminal tables under the report's
    first line; `metric` a key of `analysis.METRICS` (the selected checkpoint's accuracy, or the last epoch's)."""
    _, df, grid, summary = _read([results])
    paired = analysis.paired_comparison(df, grid, metric=analysis.METRICS[metric])
    return leaderboard.to_terminal(leaderboard.tables(grid, paired, metric), summary, bold=bold, metric=metric)
