"""The panel at order 0: the leaderboard's tables, as Markdown, LaTeX (the paper's layout), terminal text and the HTML
page's leading sections.

The leaderboard, the report's first panel (`Leaderboard`, order 0): one wide table per (dataset, noise) (`tables`,
walked by every renderer through `Table.rows`), rendered as Markdown, LaTeX (the paper's layout, `leaderboard.tex`),
the leading sections of the HTML page and aligned terminal text (`bench leaderboard`), with its figures and CSV
tables. The numbers come from `bench.report.analysis`; `bench.report.build` writes these renderings with the other
panels'. Nothing here reads MLflow.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from bench.report import analysis
from bench.report.analysis import MISSING, REFERENCE, fmt, label
from bench.report.panel import Context, Panel
from bench.report.render import fmt_r, html_table, md, pm, png, td, tex

# --------------------------------------------------------------------------------------------------- tables


@dataclass
class Entry:
    text: str  # "mean ± std" (with n where it differs from the table's), or MISSING with counts
    mean: float | None
    best: bool
    marker: str
    cell: dict[str, Any]


@dataclass
class Table:
    """One (dataset, noise): rows r, columns methods. Every renderer walks it through `header` and `rows`."""

    dataset: str
    noise: str
    methods: list[str]
    rs: list[float]
    entries: dict[tuple[float, str], Entry]

    @property
    def privileged(self) -> set[str]:
        return {m for (_, m), e in self.entries.items() if e.cell["privileged"]}

    @property
    def oracle(self) -> set[str]:
        return {m for (_, m), e in self.entries.items() if e.cell["oracle"]}

    def header(self) -> list[str]:
        """The methods' labels, privileged ones marked †, those selected on the clean test set ‡."""
        return [label(m) + (" †" if m in self.privileged else "") + (" ‡" if m in self.oracle else "")
                for m in self.methods]

    def rows(self) -> Iterator[tuple[float, list[Entry]]]:
        """(r, its entries in the column order) for every r."""
        for r in self.rs:
            yield r, [self.entries[(r, m)] for m in self.methods]

    def winners(self) -> str:
        """Which hyper-parameters each method's numbers are of: per method, each setting selected and the r's it was
        selected at, and how many settings its cells tried."""
        parts = []
        for m, head in zip(self.methods, self.header(), strict=True):
            at: dict[str, list[float]] = {}
            cells = [self.entries[(r, m)].cell for r in self.rs]
            for r, c in zip(self.rs, cells, strict=True):
                if c["n"]:
                    at.setdefault(setting_text(c), []).append(r)
            if not at:
                continue
            tried = max(c["settings_tried"] for c in cells)
            where = ["at every r" if len(at) == 1 and len(rs) == len(self.rs) else "at r " + ", ".join(map(fmt_r, rs))
                     for rs in at.values()]
            parts.append(f"{head}: " + "; ".join(f"{text} {w}" for text, w in zip(at, where, strict=True))
                         + f" (of {tried} setting{'s' if tried != 1 else ''} tried)")
        return "Hyper-parameters selected (lowest mean noisy-validation loss): " + " · ".join(parts) + "."


def setting_text(cell: dict[str, Any]) -> str:
    """A cell's selected setting in words: learning rate, batch size and the method's own parameters."""
    params = json.loads(cell["method_params"] or "{}")
    return ", ".join([f"lr {cell['lr']:g}", f"batch {cell['batch_size']}"]
                     + [f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in sorted(params.items())])


def tables(grid: pl.DataFrame, paired: pl.DataFrame, metric: str = "selected") -> list[Table]:
    """One wide table per (dataset, noise): rows r, columns methods, best (non-privileged) mean in bold."""
    mean_col, std_col = ("acc_mean", "acc_std") if metric == "selected" else ("last_mean", "last_std")
    markers = {(p["dataset"], p["noise"], p["r"], p["method"]): p["marker"] for p in paired.iter_rows(named=True)}
    out = []
    for (dataset, noise), part in grid.group_by("dataset", "noise", maintain_order=True):
        methods = list(dict.fromkeys(part["method"].to_list()))
        top_n = int(part["n"].max() or 0)
        entries = {}
        for cell in part.iter_rows(named=True):
            mean, std, n = cell[mean_col], cell[std_col], cell["n"]
            if mean is None:
                broken = [f"{cell[k]} {k}" for k in ("diverged", "failed") if cell[k]]
                text = MISSING + (f" ({', '.join(broken)})" if broken else "")
            else:
                text = fmt(mean) + ("" if std is None else f" ± {fmt(std)}") + ("" if n == top_n else f" (n={n})")
            if cell["unmeasured"]:  # the recorded grid asked for trials that have no usable row
                text += f" [{cell['unmeasured']}/{cell['planned']} missing]"
            mark = markers.get((dataset, noise, cell["r"], cell["method"]), "")
            entries[(cell["r"], cell["method"])] = Entry(text, mean, False, mark, cell)
        rs = sorted({r for r, _ in entries})
        for r in rs:
            row = [e for (rr, m), e in entries.items()
                   if rr == r and e.mean is not None and not e.cell["privileged"] and not e.cell["oracle"]]
            if row:
                top = max(round(e.mean, 2) for e in row)
                for e in row:
                    e.best = round(e.mean, 2) == top
        out.append(Table(str(dataset), str(noise), methods, rs, entries))
    return out


def _mark(entry: Entry) -> str:
    """A cell's significance marker after a space, or nothing."""
    return f" {entry.marker}" if entry.marker else ""


# What each `analysis.METRICS` key's numbers are: the caption names the metric the tables show.
CAPTIONS = {"selected": "at the checkpoint selected on the noisy validation set", "last": "at the last epoch trained"}


def legend(tabs: list[Table], metric: str = "selected") -> str:
    """The tables' caption: what their numbers are, and each mark that appears in `tabs` (only those)."""
    entries = [e for t in tabs for e in t.entries.values()]
    marks = [
        (any(e.marker for e in entries), f"* / ** / ***: paired test against {label(REFERENCE)} (matched seeds) "
         "p < 0.05 / 0.01 / 0.001"),
        (any(t.privileged for t in tabs), "† privileged (uses the true T, not a fair competitor)"),
        (any(t.oracle for t in tabs), "‡ oracle (its epoch kept by clean test accuracy, as the authors' Dogs vs Cats "
         "LCCN script did: an upper bound, not a result)"),
        (any(e.mean is None for e in entries), f"{MISSING}: no usable trial"),
        (any(e.cell["unmeasured"] for e in entries), "[k/m missing]: k of the m trials its recorded grid asked for "
         "have no usable row (the summary names them)"),
    ]
    return (f"Clean test accuracy (%) {CAPTIONS[metric]}: mean ± std over seeds for the hyper-parameters with the "
            "lowest mean noisy-validation loss. Best per row in bold" + "".join(f"; {text}" for shown, text in marks
                                                                                  if shown) + ".")


ESTIMATES_NOTE = (
    "Methods that estimate the noise transition matrix T: relative error ||T^ - T||_1 / ||T||_1 (entrywise) against "
    "the true T (the noise model's; for human noise, the empirical T from the clean labels; for instance-dependent "
    f"noise, which no T generates, the realised per-class T of its noisy labels, labelled \"{analysis.REALISED}\"), "
    "mean ± std over seeds of the selected setting, and the clean test accuracy (selected and last epoch) each "
    "estimate bought."
)


COMPARISON = "Published results vs measured"


def comparison_left_out(comparison: pl.DataFrame) -> str | None:
    """Why the published-results section is left out (None: it is shown): no measured cell has a published
    counterpart. Names the paper's tables and the literature's apart."""
    if comparison.filter(pl.col("ours_mean").is_not_null()).height:
        return None
    published = analysis.published_datasets()
    return (f"{COMPARISON}: left out, no measured cell has a published counterpart (the paper's tables cover "
            f"{', '.join(published[analysis.PAPER])}; the literature's, in {analysis.LITERATURE_CSV}, cover "
            f"{', '.join(published[analysis.LITERATURE])}).")


def _published_in(c: dict[str, Any]) -> str:
    return "the paper" if c["published_by"] == analysis.PAPER else "literature"


def to_markdown(tabs: list[Table], wtl: pl.DataFrame, comparison: pl.DataFrame, summary: str,
                estimates: pl.DataFrame | None = None) -> str:
    lines = ["# Leaderboard", "", legend(tabs), "", summary, ""]
    for t in tabs:
        lines += [f"## {md(t.dataset)} · {md(t.noise)}", "", "| r | " + " | ".join(map(md, t.header())) + " |",
                  "|---|" + "---|" * len(t.methods)]
        lines += [f"| {fmt_r(r)} | " + " | ".join((f"**{e.text}**" if e.best else e.text) + _mark(e) for e in entries)
                  + " |" for r, entries in t.rows()]
        lines += ["", md(t.winners()), ""]
    if not wtl.is_empty():
        lines += [f"## {label(REFERENCE)} against each baseline (cells won / tied / lost, paired tests)", "",
                  "| dataset | baseline | win | tie | loss | untested | missing |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {md(w['dataset'])} | {md(label(w['method']))} | {w['win']} | {w['tie']} | {w['loss']} | "
                  f"{w['untested']} | {w['missing']} |" for w in wtl.iter_rows(named=True)]
        lines.append("")
    if why := comparison_left_out(comparison):
        lines += [md(why), ""]
    else:
        lines += [f"## {COMPARISON}", "",
                  "| dataset | r | method | published in | published | measured | diff | flag | network | source |",
                  "|---" * 10 + "|"]
        for c in comparison.iter_rows(named=True):
            paper = fmt(c["paper_mean"]) + ("" if c["paper_std"] is None else f" ± {fmt(c['paper_std'])}")
            ours = MISSING if c["ours_mean"] is None else fmt(c["ours_mean"]) + (
                "" if c["ours_std"] is None else f" ± {fmt(c['ours_std'])}")
            diff = MISSING if c["diff"] is None else f"{c['diff']:+.2f}"
            lines.append(f"| {md(c['dataset'])} | {fmt_r(c['r'])} | {md(label(c['method']))} | {_published_in(c)} | "
                         f"{paper} | {ours} | {diff} | {'beyond std' if c['flag'] else ''} | {md(network_cell(c))} | "
                         f"{md(c['source'] or '')} |")
    lines.append("")
    if estimates is not None and not estimates.is_empty():
        lines += ["## Transition-matrix estimates", "", ESTIMATES_NOTE, "",
                  "| dataset | noise | r | method | n | rel. error | test acc | last-epoch acc | T^ (mean) | true T |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for e in estimates.iter_rows(named=True):
            lines.append(f"| {e['dataset']} | {e['noise']} | {fmt_r(e['r'])} | {label(e['method'])} | "
                         f"{e['n']} | {pm(e['err_mean'], e['err_std'], 3)} | {pm(e['acc_mean'], e['acc_std'])} | "
                         f"{fmt(e['last_mean'])} | {e['t_hat_mean']} | {e['truth'] or MISSING} |")
        lines.append("")
    return "\n".join(lines)


def to_latex(tabs: list[Table]) -> str:
    """The paper's layout: one booktabs table per dataset and noise, rows r, columns methods, best in bold."""
    parts = ["% Generated by `bench report`. Needs \\usepackage{booktabs}."]
    for t in tabs:
        head = " & ".join(map(tex, t.header()))
        body = [f"{fmt_r(r)} & " + " & ".join((rf"\textbf{{{tex(e.text)}}}" if e.best else tex(e.text))
                                          + (f"$^{{{e.marker}}}$" if e.marker else "") for e in entries) + r" \\"
                for r, entries in t.rows()]
        name = tex(f"{t.dataset}, {t.noise}")
        parts += [
            r"\begin{table}[t]", r"\centering", r"\small",
            rf"\caption{{Test accuracy (\%) on {name} noise (mean $\pm$ std.\ dev.\ over seeds).}}",
            rf"\label{{tab:{re.sub(r'[^A-Za-z0-9]+', '-', f'{t.dataset}-{t.noise}')}}}",
            rf"\begin{{tabular}}{{c{'c' * len(t.methods)}}}", r"\toprule",
            rf"$r$ & {head} \\", r"\midrule", *body, r"\bottomrule", r"\end{tabular}", r"\end{table}", "",
        ]
    return "\n".join(parts)


def _provenance(cell: dict[str, Any]) -> str:
    counts = f"{cell['trials']} trials: {cell['ok']} ok, {cell['diverged']} diverged, {cell['failed']} failed"
    if cell["n"] == 0:
        return f"no usable trial; {counts}"
    return (
        f"setting {cell['setting']} (lr={cell['lr']}, batch_size={cell['batch_size']}, "
        f"params={cell['method_params']}, epochs={cell['epochs_warmup']}+{cell['epochs']}) chosen among "
        f"{cell['settings_tried']} by mean val loss {fmt(cell['val_loss_mean'], 4)}; n={cell['n']} seeds "
        f"{cell['seeds']}; {counts}; commit {cell['git_commits']}; torch {cell['torch_versions']}, "
        f"numpy {cell['numpy_versions']}, python {cell['python_versions']}; {cell['devices']}"
    )


def _detail_row(head: str, r: float, c: dict[str, Any], p: dict[str, Any]) -> str:
    """One cell's statistics and provenance (`c`: its row of the aggregate grid; `p`: its paired test, if any)."""
    return "<tr>" + "".join([
        td(head, "l"), td(fmt_r(r), value=r), td(c["n"]),
        td(fmt(c["acc_mean"]), "missing" if c["acc_mean"] is None else ""), td(fmt(c["acc_std"])),
        td(analysis.interval_text(c["acc_ci_low"], c["acc_ci_high"], c["n"]), value=c["acc_ci_low"]),
        td(fmt(c["last_mean"])), td(fmt(c["last_std"])), td(fmt(c["val_loss_mean"], 4)),
        td(fmt(p.get("p"), 4) + (f" {p['marker']}" if p.get("marker") else ""), value=p.get("p")),
        td(p.get("test", "")), td(c["settings_tried"]), td(c["ok"]), td(c["diverged"]),
        td(c["failed"], "flag" if c["failed"] else ""), td(c["setting"] or MISSING, "l"),
        td(c["lr"]), td(c["batch_size"]), td(c["method_params"], "l"),
        td(f"{c['epochs_warmup']}+{c['epochs']}" if c["n"] else None), td(c["git_commits"] or None, "l"),
        td(f"torch {c['torch_versions']}; numpy {c['numpy_versions']}; python {c['python_versions']}"
            if c["n"] else None, "l"),
    ]) + "</tr>"


def network_cell(c: dict) -> str:
    """The published network and, where ours differs, what ours is (`analysis.network_note`)."""
    return (c["paper_network"] or MISSING) + (f" ({c['network_note']})" if c["network_note"] else "")


def _paper_html(comparison: pl.DataFrame, heatmap: Path | None) -> list[str]:
    """The published cells (the paper's, the literature's) beside ours, or one line why there are none."""
    body: list[str] = []
    if why := comparison_left_out(comparison):
        body.append(f"<p class=note>{html.escape(why)}</p>")
    else:
        body.append(f"<h2>{COMPARISON}</h2>")
        rows = []
        for c in comparison.iter_rows(named=True):
            rows.append("<tr>" + "".join([
                td(c["dataset"], "l"), td(fmt_r(c['r']), value=c["r"]), td(label(c["method"]), "l"),
                td(_published_in(c), "l", title=c["source"] or ""),
                td(fmt(c["paper_mean"])), td(fmt(c["paper_std"])),
                td(fmt(c["ours_mean"]), "missing" if c["ours_mean"] is None else ""), td(fmt(c["ours_std"])),
                td(c["ours_n"]), td(MISSING if c["diff"] is None else f"{c['diff']:+.2f}", value=c["diff"]),
                td("beyond std" if c["flag"] else "", "flag" if c["flag"] else ""),
                td(network_cell(c), "l flag" if c["network_note"] else "l"),
                td(c["source"], "l", title=c["checked"] or ""),
            ]) + "</tr>")
        body.append(html_table(["dataset", "r", "method", "published in", "published", "std", "measured", "std", "n",
                                "diff", "flag", "network", "source"], rows))
        if heatmap is not None:
            body.append(png(heatmap))
    return body


def _estimates_html(estimates: pl.DataFrame) -> list[str]:
    """How close the methods that estimate T came to the true T."""
    body: list[str] = []
    body.append(f"<h2>Transition-matrix estimates</h2><p class=note>{html.escape(ESTIMATES_NOTE)}</p>")
    rows = ["<tr>" + "".join([
        td(e["dataset"], "l"), td(e["noise"], "l"), td(fmt_r(e["r"]), value=e["r"]),
        td(label(e["method"]), "l"), td(e["n"]),
        td(pm(e["err_mean"], e["err_std"], 3), value=e["err_mean"]),
        td(pm(e["acc_mean"], e["acc_std"]), value=e["acc_mean"]), td(fmt(e["last_mean"])),
        td(e["t_hat_mean"], "l"), td(e["truth"], "l"),
    ]) + "</tr>" for e in estimates.iter_rows(named=True)]
    body.append(html_table(["dataset", "noise", "r", "method", "n", "rel. error", "test acc",
                             "last-epoch acc", "T^ (mean)", "true T"], rows, left=2))
    return body


def to_html(tabs: list[Table], paired: pl.DataFrame, wtl: pl.DataFrame, comparison: pl.DataFrame,
            plots: dict[tuple[str, str], Path], heatmap: Path | None, summary: str,
            estimates: pl.DataFrame | None = None) -> str:
    """The page's leading sections (the other panels follow; `bench.report.build` frames all): the title, legend and
    summary, one accuracy table per (dataset, noise) with its figure and every cell's provenance, the win/tie/loss
    table, the paper against ours, the transition-matrix estimates. Figures inline as base64 PNG."""
    p_of = {(p["dataset"], p["noise"], p["r"], p["method"]): p for p in paired.iter_rows(named=True)}
    body = [f"<h1>bench report</h1><p class=note>{html.escape(legend(tabs))}</p><p>{html.escape(summary)}</p>"]
    for t in tabs:
        body.append(f"<h2>{html.escape(t.dataset)} · {html.escape(t.noise)}</h2>")
        rows = [f"<tr>{td(fmt_r(r), 'l', r)}" + "".join(
            td(e.text + _mark(e), "best" if e.best else "missing" if e.mean is None else "", e.mean,
                _provenance(e.cell)) for e in entries) + "</tr>" for r, entries in t.rows()]
        body.append(html_table(["r", *t.header()], rows))
        body.append(f"<p class=note>{html.escape(t.winners())}</p>")
        body.append(png(plots[(t.dataset, t.noise)]))
        detail = []
        for r, entries in t.rows():
            for m, head, e in zip(t.methods, t.header(), entries, strict=True):
                detail.append(_detail_row(head, r, e.cell, p_of.get((t.dataset, t.noise, r, m), {})))
        body.append("<details><summary>every cell: statistics and provenance</summary>" + html_table(
            ["method", "r", "n", "test acc", "std", "95% CI", "last-epoch acc", "std", "val loss",
             f"p vs {label(REFERENCE)}", "test", "settings", "ok", "diverged", "failed", "setting", "lr", "batch",
             "method params", "epochs", "commit", "versions"], detail) + "</details>")
    if not wtl.is_empty():
        body.append(f"<h2>{label(REFERENCE)} against each baseline</h2>")
        rows = ["<tr>" + "".join(td(label(w[k]) if k == "method" else w[k], "l" if k in ("dataset", "method") else "")
                                 for k in wtl.columns)
                + "</tr>" for w in wtl.iter_rows(named=True)]
        body.append(html_table(wtl.columns, rows, left=2))
    body += _paper_html(comparison, heatmap)
    if estimates is not None and not estimates.is_empty():
        body += _estimates_html(estimates)
    return "".join(body)


def to_terminal(tabs: list[Table], summary: str, bold: bool = False, metric: str = "selected") -> str:
    """Aligned text tables for a terminal; the best cell of a row is starred (or bold on a tty); `metric` the
    `analysis.METRICS` key the tables show, which the caption names."""
    lines = [summary, ""]
    for t in tabs:
        header = ["r", *t.header()]
        rows = [[(fmt_r(r), False)] + [(e.text + _mark(e) + (" <" if e.best and not bold else ""), e.best)
                                    for e in entries] for r, entries in t.rows()]
        widths = [max(len(header[i]), *(len(row[i][0]) for row in rows)) for i in range(len(header))]
        lines += [f"{t.dataset} · {t.noise}", "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)),
                  "  ".join("-" * w for w in widths)]
        for row in rows:
            lines.append("  ".join(f"\033[1m{text.rjust(w)}\033[0m" if best and bold else text.rjust(w)
                                   for (text, best), w in zip(row, widths, strict=True)))
        lines += [t.winners(), ""]
    return "\n".join(lines + [legend(tabs, metric).replace("in bold", "marked <" if not bold else "in bold")])


# --------------------------------------------------------------------------------------------------- the panel


@dataclass
class Board:
    """The leaderboard's numbers, computed once for all its renderings."""

    grid: pl.DataFrame  # the headline rows' cells (`analysis.aggregate`)
    tabs: list[Table]
    paired: pl.DataFrame  # each cell against L_DMI's (`analysis.paired_comparison`)
    wtl: pl.DataFrame  # L_DMI's wins, ties and losses per baseline
    comparison: pl.DataFrame  # the published cells beside ours (`analysis.paper_comparison`)
    estimates: pl.DataFrame  # the estimated transition matrices against the true ones


class Leaderboard(Panel):
    """The headline, first on the page: the report's first line, one accuracy table per (dataset, noise) with its
    figure and every cell's provenance, L_DMI against each baseline, the published results against ours (with their
    heat map), the transition-matrix estimates; its tables also as LaTeX (`leaderboard.tex`)."""

    name = "leaderboard"
    order = 0.0

    def analyse(self, ctx: Context) -> Board:
        paired = analysis.paired_comparison(ctx.df, ctx.grid)
        return Board(grid=ctx.grid, tabs=tables(ctx.grid, paired), paired=paired,
                     wtl=analysis.win_tie_loss(paired), comparison=analysis.paper_comparison(ctx.grid),
                     estimates=analysis.transition_estimates(ctx.df))

    def tables(self, data: Board) -> dict[str, pl.DataFrame]:
        return {"cells": data.grid, "paired": data.paired, "win_tie_loss": data.wtl,
                "paper_vs_measured": data.comparison, "transition_estimates": data.estimates}

    def figures(self, data: Board, ctx: Context) -> dict[str, Path]:
        """Accuracy against r per table (`<dataset> <noise>`), the difference to the published results (`heatmap`,
        left out with nothing to show); each PNG with its SVG (`... svg`)."""
        from bench.report import plots  # matplotlib takes a second to import: only a report draws figures

        drawn: dict[str, Path] = {}
        for i, t in enumerate(data.tabs, 1):
            ctx.log(f"plot {i}/{len(data.tabs)}: {t.dataset} · {t.noise}")
            part = data.grid.filter(dataset=t.dataset, noise=t.noise)
            drawn[f"{t.dataset} {t.noise}"], drawn[f"{t.dataset} {t.noise} svg"] = plots.accuracy_vs_r(
                part, t.dataset, t.noise, t.methods, {m: label(m) for m in t.methods},
                plots.file_stem(ctx.folder, "accuracy_vs_r", t.dataset, t.noise), REFERENCE, frozenset(t.privileged))
        if comparison_left_out(data.comparison) is None:
            ctx.log("plot: difference to the published results")
            drawn["heatmap"], drawn["heatmap svg"] = plots.paper_heatmap(
                data.comparison, ctx.folder / "paper_difference", ctx.labels)
        return drawn

    def markdown(self, data: Board, ctx: Context) -> str:
        return to_markdown(data.tabs, data.wtl, data.comparison, ctx.summary, data.estimates)

    def html(self, data: Board, figures: dict[str, Path], ctx: Context) -> str:
        accuracy = {(t.dataset, t.noise): figures[f"{t.dataset} {t.noise}"] for t in data.tabs}
        return to_html(data.tabs, data.paired, data.wtl, data.comparison, accuracy, figures.get("heatmap"),
                       ctx.summary + f" Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.", data.estimates)

    def files(self, data: Board) -> dict[str, str]:
        return {"leaderboard.tex": to_latex(data.tabs)}
