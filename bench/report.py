"""Reports over a results folder: `bench report RESULTS [--out DIR]` and `bench leaderboard RESULTS`.

The numbers come from `bench.analysis` (the protocol: selection, statistics, paired tests, the paper comparison);
this module lays them out: one wide table per (dataset, noise) (`tables`, walked by every renderer through
`Table.rows`), rendered as Markdown, LaTeX (the paper's layout), one self-contained HTML page (its CSS and JS are
the package files `bench/report.css` and `report.js`) and aligned terminal text; plus the CSV tables and, through
`bench.plots`, the figures. Nothing here reads MLflow.
"""

from __future__ import annotations

import argparse
import base64
import html
import math
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from bench import analysis
from bench.analysis import REFERENCE, label
from bench.config import UserError
from bench.data import paper_datasets
from bench.store import is_local, local_path

MISSING = "—"
Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _pm(mean: float | None, std: float | None, digits: int = 2) -> str:
    return _fmt(mean, digits) + ("" if std is None or math.isnan(std) else f" ± {_fmt(std, digits)}")


# --------------------------------------------------------------------------------------------------- tables


def _r(r: float) -> str:
    """A noise level as the paper prints it: 0.0, 0.3, 0.25."""
    return f"{r:.1f}" if round(r, 1) == r else f"{r:g}"


def _fmt(x: float | None, digits: int = 2) -> str:
    return MISSING if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


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

    def header(self) -> list[str]:
        """The methods' labels, privileged ones marked †."""
        return [label(m) + (" †" if m in self.privileged else "") for m in self.methods]

    def rows(self) -> Iterator[tuple[float, list[Entry]]]:
        """(r, its entries in the column order) for every r."""
        for r in self.rs:
            yield r, [self.entries[(r, m)] for m in self.methods]


def tables(grid: pl.DataFrame, paired: pl.DataFrame, metric: str = "best") -> list[Table]:
    """One wide table per (dataset, noise): rows r, columns methods, best (non-privileged) mean in bold."""
    mean_col, std_col = ("acc_mean", "acc_std") if metric == "best" else ("last_mean", "last_std")
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
                text = _fmt(mean) + ("" if std is None else f" ± {_fmt(std)}") + ("" if n == top_n else f" (n={n})")
            mark = markers.get((dataset, noise, cell["r"], cell["method"]), "")
            entries[(cell["r"], cell["method"])] = Entry(text, mean, False, mark, cell)
        rs = sorted({r for r, _ in entries})
        for r in rs:
            row = [e for (rr, m), e in entries.items() if rr == r and e.mean is not None and not e.cell["privileged"]]
            if row:
                top = max(round(e.mean, 2) for e in row)
                for e in row:
                    e.best = round(e.mean, 2) == top
        out.append(Table(str(dataset), str(noise), methods, rs, entries))
    return out


def _mark(entry: Entry) -> str:
    """A cell's significance marker after a space, or nothing."""
    return f" {entry.marker}" if entry.marker else ""


def legend() -> str:
    return ("Clean test accuracy (%) at the checkpoint selected on the noisy validation set: mean ± std over seeds "
            "for the hyper-parameters with the lowest mean noisy-validation loss. Best per row in bold; * / ** / ***: "
            f"paired test against {label(REFERENCE)} (matched seeds) p < 0.05 / 0.01 / 0.001; † privileged (uses the "
            f"true T, not a fair competitor); {MISSING}: no usable trial.")


def _md(s: object) -> str:
    """Text from the data (names, noise patterns) as literal Markdown: no emphasis, links, HTML or cell breaks."""
    return re.sub(r"([\\`*_\[\]<>|~])", r"\\\1", str(s))


ESTIMATES_NOTE = (
    "Methods that estimate the noise transition matrix T: relative error ||T^ - T||_1 / ||T||_1 (entrywise) against "
    "the true T (the noise model's; for human noise, the empirical T from the clean labels), mean ± std over seeds "
    "of the selected setting, and the clean test accuracy (selected and last epoch) each estimate bought."
)


def to_markdown(tabs: list[Table], wtl: pl.DataFrame, comparison: pl.DataFrame, summary: str,
                estimates: pl.DataFrame | None = None) -> str:
    lines = ["# Leaderboard", "", legend(), "", summary, ""]
    for t in tabs:
        lines += [f"## {_md(t.dataset)} · {_md(t.noise)}", "", "| r | " + " | ".join(map(_md, t.header())) + " |",
                  "|---|" + "---|" * len(t.methods)]
        lines += [f"| {_r(r)} | " + " | ".join((f"**{e.text}**" if e.best else e.text) + _mark(e) for e in entries)
                  + " |" for r, entries in t.rows()]
        lines.append("")
    if not wtl.is_empty():
        lines += [f"## {label(REFERENCE)} against each baseline (cells won / tied / lost, paired tests)", "",
                  "| dataset | baseline | win | tie | loss | untested | missing |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {_md(w['dataset'])} | {_md(w['method'])} | {w['win']} | {w['tie']} | {w['loss']} | "
                  f"{w['untested']} | {w['missing']} |" for w in wtl.iter_rows(named=True)]
        lines.append("")
    lines += ["## Paper vs measured", ""]
    if comparison.is_empty():
        lines.append(f"No measured dataset has a table in the paper (its tables: {', '.join(paper_datasets())}).")
    else:
        lines += ["| dataset | r | method | paper | measured | diff | flag |", "|---|---|---|---|---|---|---|"]
        for c in comparison.iter_rows(named=True):
            paper = _fmt(c["paper_mean"]) + ("" if c["paper_std"] is None else f" ± {_fmt(c['paper_std'])}")
            ours = MISSING if c["ours_mean"] is None else _fmt(c["ours_mean"]) + (
                "" if c["ours_std"] is None else f" ± {_fmt(c['ours_std'])}")
            diff = MISSING if c["diff"] is None else f"{c['diff']:+.2f}"
            lines.append(f"| {_md(c['dataset'])} | {_r(c['r'])} | {_md(c['method'])} | {paper} | {ours} | {diff} | "
                         f"{'beyond std' if c['flag'] else ''} |")
    lines.append("")
    if estimates is not None and not estimates.is_empty():
        lines += ["## Transition-matrix estimates", "", ESTIMATES_NOTE, "",
                  "| dataset | noise | r | method | n | rel. error | test acc | last-epoch acc | T^ (mean) | true T |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for e in estimates.iter_rows(named=True):
            lines.append(f"| {e['dataset']} | {e['noise']} | {_r(e['r'])} | {label(e['method'])} | "
                         f"{e['n']} | {_pm(e['err_mean'], e['err_std'], 3)} | {_pm(e['acc_mean'], e['acc_std'])} | "
                         f"{_fmt(e['last_mean'])} | {e['t_hat_mean']} | {e['truth'] or MISSING} |")
        lines.append("")
    return "\n".join(lines)


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}", "†": r"$^\dagger$", "±": r"$\pm$", "—": "--"}


def _tex(s: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in s)


def to_latex(tabs: list[Table]) -> str:
    """The paper's layout: one booktabs table per dataset and noise, rows r, columns methods, best in bold."""
    parts = ["% Generated by `bench report`. Needs \\usepackage{booktabs}."]
    for t in tabs:
        head = " & ".join(map(_tex, t.header()))
        body = [f"{_r(r)} & " + " & ".join((rf"\textbf{{{_tex(e.text)}}}" if e.best else _tex(e.text))
                                          + (f"$^{{{e.marker}}}$" if e.marker else "") for e in entries) + r" \\"
                for r, entries in t.rows()]
        name = _tex(f"{t.dataset}, {t.noise}")
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
        f"{cell['settings_tried']} by mean val loss {_fmt(cell['val_loss_mean'], 4)}; n={cell['n']} seeds "
        f"{cell['seeds']}; {counts}; commit {cell['git_commits']}; torch {cell['torch_versions']}, "
        f"numpy {cell['numpy_versions']}, python {cell['python_versions']}; {cell['devices']}"
    )


def _asset(name: str) -> str:
    """`bench/report.css` or `report.js` (package data), inlined into the page."""
    return analysis.package_text(name)


def _td(text: Any, cls: str = "", value: float | None = None, title: str = "") -> str:
    attrs = (f' class="{cls}"' if cls else "") + (f' data-v="{value}"' if value is not None else "")
    attrs += f' title="{html.escape(title)}"' if title else ""
    return f"<td{attrs}>{html.escape(MISSING if text is None else str(text))}</td>"


def _html_table(header: list[str], rows: list[str], left: int = 1) -> str:
    ths = "".join(f'<th class="l">{html.escape(h)}</th>' if i < left else f"<th>{html.escape(h)}</th>"
                  for i, h in enumerate(header))
    return f'<table class="sortable"><thead><tr>{ths}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _png(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _detail_row(head: str, r: float, c: dict[str, Any], p: dict[str, Any]) -> str:
    """One cell's statistics and provenance (`c`: its row of the aggregate grid; `p`: its paired test, if any)."""
    return "<tr>" + "".join([
        _td(head, "l"), _td(_r(r), value=r), _td(c["n"]),
        _td(_fmt(c["acc_mean"]), "missing" if c["acc_mean"] is None else ""), _td(_fmt(c["acc_std"])),
        _td(f"[{_fmt(c['acc_ci_low'])}, {_fmt(c['acc_ci_high'])}]", value=c["acc_ci_low"]),
        _td(_fmt(c["last_mean"])), _td(_fmt(c["last_std"])), _td(_fmt(c["val_loss_mean"], 4)),
        _td(_fmt(p.get("p"), 4) + (f" {p['marker']}" if p.get("marker") else ""), value=p.get("p")),
        _td(p.get("test", "")), _td(c["settings_tried"]), _td(c["ok"]), _td(c["diverged"]),
        _td(c["failed"], "flag" if c["failed"] else ""), _td(c["setting"] or MISSING, "l"),
        _td(c["lr"]), _td(c["batch_size"]), _td(c["method_params"], "l"),
        _td(f"{c['epochs_warmup']}+{c['epochs']}" if c["n"] else None), _td(c["git_commits"] or None, "l"),
        _td(f"torch {c['torch_versions']}; numpy {c['numpy_versions']}; python {c['python_versions']}"
            if c["n"] else None, "l"),
    ]) + "</tr>"


def to_html(tabs: list[Table], paired: pl.DataFrame, wtl: pl.DataFrame, comparison: pl.DataFrame,
            df: pl.DataFrame, plots: dict[tuple[str, str], Path], heatmap: Path, summary: str,
            estimates: pl.DataFrame | None = None, extra: str = "") -> str:
    """One self-contained page: inline CSS and JS, figures as base64 PNG, no external asset."""
    p_of = {(p["dataset"], p["noise"], p["r"], p["method"]): p for p in paired.iter_rows(named=True)}
    body = [f"<h1>bench report</h1><p class=note>{html.escape(legend())}</p><p>{html.escape(summary)}</p>"]
    for t in tabs:
        body.append(f"<h2>{html.escape(t.dataset)} · {html.escape(t.noise)}</h2>")
        rows = [f"<tr>{_td(_r(r), 'l', r)}" + "".join(
            _td(e.text + _mark(e), "best" if e.best else "missing" if e.mean is None else "", e.mean,
                _provenance(e.cell)) for e in entries) + "</tr>" for r, entries in t.rows()]
        body.append(_html_table(["r", *t.header()], rows))
        body.append(_png(plots[(t.dataset, t.noise)]))
        detail = []
        for r, entries in t.rows():
            for m, head, e in zip(t.methods, t.header(), entries, strict=True):
                detail.append(_detail_row(head, r, e.cell, p_of.get((t.dataset, t.noise, r, m), {})))
        body.append("<details><summary>every cell: statistics and provenance</summary>" + _html_table(
            ["method", "r", "n", "test acc", "std", "95% CI", "last-epoch acc", "std", "val loss",
             f"p vs {label(REFERENCE)}", "test", "settings", "ok", "diverged", "failed", "setting", "lr", "batch",
             "method params", "epochs", "commit", "versions"], detail) + "</details>")
    if not wtl.is_empty():
        body.append(f"<h2>{label(REFERENCE)} against each baseline</h2>")
        rows = ["<tr>" + "".join(_td(w[k], "l" if k in ("dataset", "method") else "") for k in wtl.columns)
                + "</tr>" for w in wtl.iter_rows(named=True)]
        body.append(_html_table(wtl.columns, rows, left=2))
    body.append("<h2>Paper vs measured</h2>")
    if comparison.is_empty():
        body.append(f"<p>No measured dataset has a table in the paper (its tables: {', '.join(paper_datasets())}).</p>")
    else:
        rows = []
        for c in comparison.iter_rows(named=True):
            rows.append("<tr>" + "".join([
                _td(c["dataset"], "l"), _td(_r(c['r']), value=c["r"]), _td(c["method"], "l"),
                _td(_fmt(c["paper_mean"])), _td(_fmt(c["paper_std"])),
                _td(_fmt(c["ours_mean"]), "missing" if c["ours_mean"] is None else ""), _td(_fmt(c["ours_std"])),
                _td(c["ours_n"]), _td(MISSING if c["diff"] is None else f"{c['diff']:+.2f}", value=c["diff"]),
                _td("beyond std" if c["flag"] else "", "flag" if c["flag"] else ""),
            ]) + "</tr>")
        body.append(_html_table(["dataset", "r", "method", "paper", "std", "measured", "std", "n", "diff", "flag"],
                                rows))
    body.append(_png(heatmap))
    if estimates is not None and not estimates.is_empty():
        body.append(f"<h2>Transition-matrix estimates</h2><p class=note>{html.escape(ESTIMATES_NOTE)}</p>")
        rows = ["<tr>" + "".join([
            _td(e["dataset"], "l"), _td(e["noise"], "l"), _td(_r(e["r"]), value=e["r"]),
            _td(label(e["method"]), "l"), _td(e["n"]),
            _td(_pm(e["err_mean"], e["err_std"], 3), value=e["err_mean"]),
            _td(_pm(e["acc_mean"], e["acc_std"]), value=e["acc_mean"]), _td(_fmt(e["last_mean"])),
            _td(e["t_hat_mean"], "l"), _td(e["truth"], "l"),
        ]) + "</tr>" for e in estimates.iter_rows(named=True)]
        body.append(_html_table(["dataset", "noise", "r", "method", "n", "rel. error", "test acc",
                                 "last-epoch acc", "T^ (mean)", "true T"], rows, left=2))
    body.append(extra)  # bench.diagnostics: selection rules, curves, detection, cost, noisy labels
    broken = df.filter(pl.col("status") != "ok").sort("dataset", "noise", "r", "method", "seed")
    body.append(f"<h2>Diverged and failed trials ({broken.height})</h2>")
    if not broken.is_empty():
        rows = ["<tr>" + "".join(_td(b[k] if b[k] is not None else "", "l") for k in
                                 ("trial_id", "dataset", "noise", "r", "method", "seed", "status", "error"))
                + "</tr>" for b in broken.iter_rows(named=True)]
        body.append(_html_table(["trial", "dataset", "noise", "r", "method", "seed", "status", "error"], rows, 8))
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>bench report</title>"
            f"<style>{_asset('report.css')}</style></head><body>{''.join(body)}<script>{_asset('report.js')}</script>"
            "</body></html>\n")


def to_terminal(tabs: list[Table], summary: str, bold: bool = False) -> str:
    """Aligned text tables for a terminal; the best cell of a row is starred (or bold on a tty)."""
    lines = [summary, ""]
    for t in tabs:
        header = ["r", *t.header()]
        rows = [[(_r(r), False)] + [(e.text + _mark(e) + (" <" if e.best and not bold else ""), e.best)
                                    for e in entries] for r, entries in t.rows()]
        widths = [max(len(header[i]), *(len(row[i][0]) for row in rows)) for i in range(len(header))]
        lines += [f"{t.dataset} · {t.noise}", "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)),
                  "  ".join("-" * w for w in widths)]
        for row in rows:
            lines.append("  ".join(f"\033[1m{text.rjust(w)}\033[0m" if best and bold else text.rjust(w)
                                   for (text, best), w in zip(row, widths, strict=True)))
        lines.append("")
    return "\n".join(lines + [legend().replace("in bold", "marked <" if not bold else "in bold")])


# ------------------------------------------------------------------------------------------------- commands


def _summary(df: pl.DataFrame, grid: pl.DataFrame, results: str) -> str:
    status = {s: int((df["status"] == s).sum()) for s in ("ok", "diverged", "failed")}
    measured = int((grid["n"] > 0).sum())
    commits = ", ".join(sorted({str(c) for c in df["git_commit"].to_list() if c is not None})) or "unknown"
    return (f"{df.height} trials under {results}: {status['ok']} ok, {status['diverged']} diverged, "
            f"{status['failed']} failed; {measured} of {grid.height} cells measured "
            f"({grid.height - measured} missing); commits {commits}.")


def build_report(results: str | Path, out: Path, log: Log = _stderr) -> dict[str, Path]:
    """Write every output of `bench report` under `out`; return them by name."""
    from bench import diagnostics, plots
    from bench.store import read_table

    log(f"reading result rows under {results} ...")
    df = analysis.load_trials(results)
    grid = analysis.aggregate(df)
    paired = analysis.paired_comparison(df, grid)
    wtl = analysis.win_tie_loss(paired)
    comparison = analysis.paper_comparison(grid)
    estimates = analysis.transition_estimates(df)
    tabs = tables(grid, paired)
    summary = _summary(df, grid, str(results))
    log(summary)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    figures: dict[tuple[str, str], Path] = {}
    for i, t in enumerate(tabs, 1):
        log(f"plot {i}/{len(tabs)}: {t.dataset} · {t.noise}")
        part = grid.filter(dataset=t.dataset, noise=t.noise)
        png, svg = plots.accuracy_vs_r(part, t.dataset, t.noise, t.methods, {m: label(m) for m in t.methods},
                                       plots.file_stem(out / "plots", "accuracy_vs_r", t.dataset, t.noise), REFERENCE,
                                       frozenset(t.privileged))
        figures[(t.dataset, t.noise)] = png
        written[f"plot {t.dataset} {t.noise}"], written[f"plot {t.dataset} {t.noise} svg"] = png, svg
    log("plot: difference to the paper")
    heat_png, heat_svg = plots.paper_heatmap(comparison, out / "plots" / "paper_difference")
    written["heatmap"], written["heatmap svg"] = heat_png, heat_svg
    log("diagnostics: selection rules, memorisation, detection, cost ...")
    diag = diagnostics.analyse(df, read_table(results, "epochs"), analysis.select_settings(df))
    labels = {m: label(m) for m in df["method"].unique().to_list()}
    diag_figures = diagnostics.plot(diag, out / "plots", labels)
    written |= {f"plot {name}": path for name, path in diag_figures.items()}
    for name, frame in diag.tables().items():
        written[f"{name} csv"] = out / f"{name}.csv"
        frame.write_csv(written[f"{name} csv"])
    log("writing tables ...")
    for name, frame in (("cells", grid), ("paired", paired), ("win_tie_loss", wtl),
                        ("paper_vs_measured", comparison), ("transition_estimates", estimates)):
        written[f"{name} csv"] = out / f"{name}.csv"
        frame.write_csv(written[f"{name} csv"])
    texts = {
        "leaderboard.md": to_markdown(tabs, wtl, comparison, summary, estimates)
        + diagnostics.to_markdown(diag, labels),
        "leaderboard.tex": to_latex(tabs),
        "report.html": to_html(tabs, paired, wtl, comparison, df, figures, heat_png,
                               summary + f" Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.", estimates,
                               diagnostics.to_html(diag, diag_figures, labels)),
    }
    for name, text in texts.items():
        written[name] = out / name
        written[name].write_text(text, encoding="utf-8")
    return written


def cmd_report(args: argparse.Namespace) -> int:
    results = str(args.results)
    if args.out is None and not is_local(results):
        raise UserError("--out DIR is needed when RESULTS is a remote URI")
    out = Path(args.out) if args.out is not None else local_path(results) / "report"
    written = build_report(results, out)
    for name, path in written.items():
        print(f"{name:28s} {path}")
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    df = analysis.load_trials(str(args.results))
    grid = analysis.aggregate(df)
    paired = analysis.paired_comparison(df, grid, metric=analysis.METRICS[args.metric])
    print(to_terminal(tables(grid, paired, args.metric), _summary(df, grid, str(args.results)),
                      bold=sys.stdout.isatty()))
    return 0
