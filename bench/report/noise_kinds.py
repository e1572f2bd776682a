"""The panel "Class-conditional vs instance-dependent noise".

The report's panel "Class-conditional vs instance-dependent noise": per dataset and r where the results hold both
instance-dependent trials (`bench.noise.INSTANCE_DEPENDENT`, idn) and trials of a class-conditional pattern, each
method's clean test accuracy under the one beside the other, their difference paired by seed with a 95% t-interval
(the seed fixes data order and initialisation, so pairing removes that share of the seed-to-seed spread), and the
realised noise rates that say whether the two compare the same overall rate. Computed from the aggregate grid
(`bench.report.analysis.aggregate`: the setting the accuracy tables select) and its trials, rendered as a Markdown
and an HTML section of `bench report` (and `noise_kinds.csv`): the panel `NoiseKinds`.

A pattern is class-conditional where its rows record the T that generated their labels (`transition`, as every
synthetic pattern's do: uniform, symmetric, an explicit matrix, a dataset's own builders); real (human) noise
records none, and neither does instance-dependent noise, which no T generates.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import polars as pl

from bench.noise import INSTANCE_DEPENDENT, is_instance_dependent
from bench.report import analysis, statistics
from bench.report.analysis import CELL, MISSING, fmt, label
from bench.report.panel import Context, Panel
from bench.report.render import fmt_r, html_table, md, pm, td

RATE_GAP = 0.03  # realised noise rates further apart than this: the row does not compare the same overall rate
FLAG = "rates differ"
TITLE = "Class-conditional vs instance-dependent noise"
NOTE = (
    f"Clean test accuracy (%) under a class-conditional pattern (a T generates it) and under instance-dependent "
    f"noise ({', '.join(INSTANCE_DEPENDENT)}: Xia et al., NeurIPS 2020) at the same r: mean ± std over seeds at the "
    f"setting the accuracy tables select, n seeds each; the difference instance-dependent − class-conditional paired "
    f"by seed: the mean over the seeds both hold of each seed's difference ± the half-width of its 95% Student-t "
    f"interval, the number of shared seeds in parentheses (no interval under {statistics.MIN_CI_SEEDS}); and the "
    f"realised noise rate of each (the fraction of flipped training labels, mean over the trials); "
    f"'{FLAG}' marks a row whose two realised rates differ by more than {RATE_GAP}: it does not compare the same "
    f"overall rate. † privileged (uses the true T). "
    f"(a) Instance-dependent noise has no T: its per-class T, wherever this report shows one, is the realised one "
    f"(its noisy training labels against the clean ones), not a parameter of the generator. "
    f"(b) With 2 classes Xia's generator is symmetric noise in law (an example's flip probability is its flip rate, "
    f"drawn independently of the example; the projection only chooses among the other C − 1 classes), so on a "
    f"binary dataset (C = 2) this panel is a control: a row agrees within seed noise where its interval covers 0. "
    f"Instance-dependence only shows with C ≥ 3 (CIFAR-10, CIFAR-100)."
)
SCHEMA = {"dataset": pl.String, "classes": pl.Int64, "noise": pl.String, "instance_dependent": pl.String,
          "r": pl.Float64, "method": pl.String, "privileged": pl.Boolean,
          "cc_n": pl.Int64, "cc_mean": pl.Float64, "cc_std": pl.Float64, "cc_rate": pl.Float64, "cc_setting": pl.String,
          "idn_n": pl.Int64, "idn_mean": pl.Float64, "idn_std": pl.Float64, "idn_rate": pl.Float64,
          "idn_setting": pl.String, "paired_n": pl.Int64, "diff": pl.Float64, "diff_ci95": pl.Float64,
          "rate_gap": pl.Float64, "flag": pl.Boolean}


def _class_conditional(df: pl.DataFrame) -> set[tuple[str, str]]:
    """The (dataset, noise) pairs whose rows record a generating T."""
    if "transition" not in df.columns:
        return set()
    recorded = df.filter(pl.col("transition").is_not_null()).select("dataset", "noise").unique()
    return {(d, n) for d, n in recorded.iter_rows() if not is_instance_dependent(n)}


def _classes(df: pl.DataFrame) -> dict[str, int]:
    """Each dataset's number of classes, read from the size of a realised T its rows record."""
    if "empirical_transition" not in df.columns:
        return {}
    first = df.filter(pl.col("empirical_transition").is_not_null()).group_by("dataset").agg(
        pl.col("empirical_transition").first())
    return {d: len(json.loads(t)) for d, t in first.iter_rows()}


def _realised_rates(chosen: pl.DataFrame) -> dict[tuple[Any, ...], float | None]:
    """Per cell, the mean realised noise rate over its trials in `chosen` (`analysis.selected_trials`)."""
    if "noise_rate" not in chosen.columns:
        return {}
    rates = chosen.group_by(CELL).agg(pl.col("noise_rate").cast(pl.Float64).fill_nan(None).mean())
    return {tuple(row[:4]): row[4] for row in rates.iter_rows()}


def _row(cc: dict[str, Any], idn: dict[str, Any], rates: dict[tuple[Any, ...], float | None],
         accuracies: dict[tuple[Any, ...], dict[int, float]]) -> dict[str, Any]:
    """One method's pair of cells (rows of the aggregate grid) at one (dataset, r)."""
    out: dict[str, Any] = dict(dataset=cc["dataset"], noise=cc["noise"], instance_dependent=idn["noise"], r=cc["r"],
                               method=cc["method"], privileged=bool(cc["privileged"] or idn["privileged"]))
    for side, c in (("cc", cc), ("idn", idn)):
        out |= {f"{side}_n": c["n"], f"{side}_mean": c["acc_mean"], f"{side}_std": c["acc_std"],
                f"{side}_rate": rates.get(tuple(c[k] for k in CELL)), f"{side}_setting": c["setting"]}
    cc_accs, idn_accs = (accuracies.get(tuple(c[k] for k in CELL), {}) for c in (cc, idn))
    out["paired_n"], out["diff"], out["diff_ci95"] = statistics.paired_difference(cc_accs, idn_accs)
    rated = out["cc_rate"] is not None and out["idn_rate"] is not None
    out["rate_gap"] = abs(out["idn_rate"] - out["cc_rate"]) if rated else None
    out["flag"] = out["rate_gap"] is not None and out["rate_gap"] > RATE_GAP
    return out


def compare(df: pl.DataFrame, grid: pl.DataFrame) -> pl.DataFrame:
    """One row per (dataset, class-conditional pattern, r, method) where the dataset holds trials of that pattern and
    of an instance-dependent one at r: both cells' accuracy (the aggregate grid's selected setting), seeds, realised
    noise rates, the difference idn − class-conditional paired by seed (`statistics.paired_difference`) and the flag.
    `df` as `analysis.load_trials` gives it, `grid` `analysis.aggregate(df)`. Methods without a trial in either cell are
    left out."""
    chosen = analysis.selected_trials(df)
    conditional, classes = _class_conditional(df), _classes(df)
    rates, accuracies = _realised_rates(chosen), analysis.seed_accuracies(chosen)
    cells = {tuple(c[k] for k in CELL): c for c in grid.iter_rows(named=True)}
    order = {m: i for i, m in enumerate(analysis.method_order(grid["method"].unique().to_list()))}
    rows = []
    for dataset, r in sorted({(d, r) for d, _, r, _ in cells}):
        present = sorted({n for d, n, rr, _ in cells if (d, rr) == (dataset, r)})
        for cc in (n for n in present if (dataset, n) in conditional):
            for idn in (n for n in present if is_instance_dependent(n)):
                for method in sorted({m for _, _, _, m in cells}, key=order.__getitem__):
                    a, b = cells.get((dataset, cc, r, method)), cells.get((dataset, idn, r, method))
                    if a is not None and b is not None and (a["trials"] or b["trials"]):
                        rows.append(_row(a, b, rates, accuracies) | {"classes": classes.get(dataset)})
    return pl.DataFrame(rows, schema=SCHEMA)


def _method(row: dict[str, Any]) -> str:
    return label(row["method"]) + (" †" if row["privileged"] else "")


def _rate(x: float | None) -> str:
    return fmt(x, 3)


def _diff(row: dict[str, Any]) -> str:
    """The paired difference as "+0.40 ± 0.62 (3)": mean ± 95% t half-width (shared seeds)."""
    if row["diff"] is None:
        return MISSING
    return f"{row['diff']:+.2f} ± {fmt(row['diff_ci95'])} ({row['paired_n']})"


def _classes_text(c: int | None) -> str:
    return MISSING if c is None else f"{c} (control)" if c == 2 else str(c)

# One line where the panel has no row.
LEFT_OUT = (f"{TITLE}: left out, no dataset here has both class-conditional and instance-dependent noise at "
            "one r.")


def to_markdown(panel: pl.DataFrame) -> str:
    """The panel as a Markdown section (one line why where it has no row)."""
    if panel.is_empty():
        return f"{md(LEFT_OUT)}\n\n"
    lines = ["", f"## {TITLE}", "", NOTE, "",
             "| dataset | C | class-conditional | r | method | class-conditional acc | n | instance-dependent | "
             "instance-dependent acc | n | idn − class-cond. (paired) | class-cond. rate | idn rate | flag |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in panel.iter_rows(named=True):
        lines.append(f"| {md(p['dataset'])} | {_classes_text(p['classes'])} | {md(p['noise'])} | {fmt_r(p['r'])} | "
                     f"{md(_method(p))} | {pm(p['cc_mean'], p['cc_std'])} | {p['cc_n']} | "
                     f"{md(p['instance_dependent'])} | {pm(p['idn_mean'], p['idn_std'])} | {p['idn_n']} | "
                     f"{_diff(p)} | {_rate(p['cc_rate'])} | {_rate(p['idn_rate'])} | "
                     f"{FLAG if p['flag'] else ''} |")
    return "\n".join(lines + ["", ""])


def to_html(panel: pl.DataFrame) -> str:
    """The panel as an HTML section (one line why where it has no row)."""
    if panel.is_empty():
        return f"<p class=note>{html.escape(LEFT_OUT)}</p>"
    rows = ["<tr>" + "".join([
        td(p["dataset"], "l"), td(_classes_text(p["classes"]), value=p["classes"]), td(p["noise"], "l"),
        td(fmt_r(p["r"]), value=p["r"]), td(_method(p), "l"),
        td(pm(p["cc_mean"], p["cc_std"]), "missing" if p["cc_mean"] is None else "", p["cc_mean"]), td(p["cc_n"]),
        td(p["instance_dependent"], "l"),
        td(pm(p["idn_mean"], p["idn_std"]), "missing" if p["idn_mean"] is None else "", p["idn_mean"]),
        td(p["idn_n"]), td(_diff(p), value=p["diff"]),
        td(_rate(p["cc_rate"]), value=p["cc_rate"]), td(_rate(p["idn_rate"]), value=p["idn_rate"]),
        td(FLAG if p["flag"] else "", "flag" if p["flag"] else ""),
    ]) + "</tr>" for p in panel.iter_rows(named=True)]
    return (f"<h2>{html.escape(TITLE)}</h2><p class=note>{html.escape(NOTE)}</p>" + html_table(
        ["dataset", "C", "class-conditional", "r", "method", "class-conditional acc", "n", "instance-dependent",
         "instance-dependent acc", "n", "idn − class-cond. (paired)", "class-cond. rate", "idn rate", "flag"], rows))


class NoiseKinds(Panel):
    name = "noise_kinds"
    order = 20.0

    def analyse(self, ctx: Context) -> pl.DataFrame:
        return compare(ctx.df, ctx.grid)

    def tables(self, data: pl.DataFrame) -> dict[str, pl.DataFrame]:
        return {"noise_kinds": data}

    def markdown(self, data: pl.DataFrame, ctx: Context) -> str:
        return to_markdown(data)

    def html(self, data: pl.DataFrame, figures: dict[str, Path], ctx: Context) -> str:
        return to_html(data)
