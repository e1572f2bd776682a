"""Reports over a results folder: `bench report RESULTS [--out DIR]` and `bench leaderboard RESULTS`.

This module owns aggregation, statistics and the tables (Markdown, LaTeX, CSV, one self-contained HTML page,
the terminal leaderboard); the figures are drawn by `bench.plots`. It reads the parquet result rows with polars
(`bench.results.read_table`); nothing here reads MLflow.

The paper's protocol, applied per cell (dataset, noise, r, method):
  1. selection: of the hyper-parameter settings tried (lr, batch size, method parameters, epochs, ...), keep the
     one with the lowest MEAN noisy-validation loss over its seeds. Test accuracy is never looked at to choose.
  2. statistics over the seeds of that setting: mean, sample std, n, a 95% t-interval, for the accuracy at the
     selected checkpoint (`test_acc`) and at the last epoch (`last_test_acc`).
Trials that diverged keep their best checkpoint before divergence (the trainer's rule), so they count and are
counted; failed trials have no numbers and are only counted. A cell of the grid (methods x r for each dataset
and noise) without a usable trial is shown as missing, never dropped.

Seeds share noisy labels across methods, so L_DMI is compared with each baseline per cell as paired samples
matched on seed: Wilcoxon signed-rank from `WILCOXON_MIN_PAIRS` pairs (below that it cannot reach p < 0.05),
else a paired t-test.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import importlib.resources
import io
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from scipy import stats

from bench.config import UserError

CELL = ["dataset", "noise", "r", "method"]
# The columns that make a hyper-parameter setting (everything of a trial's config but the cell and the seed).
SETTING_COLUMNS = ["model", "lr", "batch_size", "method_params", "epochs", "epochs_warmup", "train_subset"]
PROVENANCE_COLUMNS = ["git_commit", "torch_version", "numpy_version", "python_version", "device", "noise_hash"]
REQUIRED_COLUMNS = ["dataset", "method", "noise", "r", "seed", "status", "val_loss", "test_acc"]
USABLE_STATUS = ("ok", "diverged")
REFERENCE = "dmi"
ALPHA = 0.05
WILCOXON_MIN_PAIRS = 6  # with 5 pairs the smallest two-sided exact Wilcoxon p-value is 0.0625
MISSING = "—"
REFERENCE_CSV = "reference_results.csv"
METRICS = {"best": "test_acc", "last": "last_test_acc"}
LABELS = {
    "ce": "CE", "mentornet": "MentorNet", "vat": "VAT", "fw": "FW", "fw_oracle": "FW (true T)", "gce": "GCE",
    "lccn": "LCCN", "dmi": "DMI", "sce": "SCE", "nce_rce": "NCE+RCE", "bootstrap": "Bootstrap", "peer": "Peer",
    "coteaching": "Co-teaching", "backward": "Backward", "elr": "ELR", "gls": "GLS", "fdiv": "f-div",
    "coteaching_plus": "Co-teaching+", "jocor": "JoCoR", "trevision": "T-revision", "volminnet": "VolMinNet",
    "sop": "SOP", "cores": "CORES²", "dividemix": "DivideMix",
}
_ORDER = ["ce", "mentornet", "vat", "fw", "fw_oracle", "gce", "lccn"]

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------- loading


def load_trials(results: str | Path) -> pl.DataFrame:
    """All trial rows under `results`, with the setting hash and the optional columns filled in."""
    from bench.results import read_table

    results = str(results)
    if "://" not in results and not Path(results).expanduser().is_dir():
        raise UserError(f"results folder {results} does not exist")
    df = read_table(results, "trials")
    if df.is_empty():
        raise UserError(f"no result rows under {results}/trials: run `bench trial` or `bench run` first")
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise UserError(f"the result rows under {results} lack the columns {', '.join(missing)}")
    optional = {c: pl.String for c in SETTING_COLUMNS + PROVENANCE_COLUMNS + ["trial_id", "error"]}
    optional |= {"last_test_acc": pl.Float64, "privileged": pl.Boolean}
    df = df.with_columns(pl.lit(None, dtype=t).alias(c) for c, t in optional.items() if c not in df.columns)
    df = df.with_columns(
        pl.col("r").cast(pl.Float64).round(6),
        pl.col("seed").cast(pl.Int64),
        pl.col("val_loss", "test_acc", "last_test_acc").cast(pl.Float64),
        pl.col("privileged").cast(pl.Boolean).fill_null(False),
    )
    settings = [
        hashlib.sha256(json.dumps(list(row), default=str).encode()).hexdigest()[:10]
        for row in df.select(SETTING_COLUMNS).iter_rows()
    ]
    usable = (
        pl.col("status").is_in(USABLE_STATUS) & pl.col("val_loss").is_finite() & pl.col("test_acc").is_not_null()
    )
    return df.with_columns(pl.Series("setting", settings, dtype=pl.String), usable.fill_null(False).alias("usable"))


def method_order(methods: list[str], reference: str = REFERENCE) -> list[str]:
    """The paper's column order (CE ... LCCN), other methods alphabetically, the reference method last."""
    known = [m for m in _ORDER if m in methods]
    rest = sorted(m for m in methods if m not in _ORDER and m != reference)
    return known + rest + ([reference] if reference in methods else [])


# ------------------------------------------------------------------------------------------------ aggregation


def select_settings(df: pl.DataFrame) -> pl.DataFrame:
    """Per cell, the setting with the lowest mean noisy-validation loss over seeds (ties: more seeds, then the
    setting hash). Reads `val_loss` only: test accuracy plays no part in the choice."""
    means = (
        df.filter(pl.col("usable"))
        .group_by(CELL + ["setting"])
        .agg(pl.col("val_loss").mean().alias("sel_val_loss"), pl.len().alias("sel_n"))
        .sort(CELL + ["sel_val_loss", "sel_n", "setting"], descending=[False] * 5 + [True, False])
    )
    return means.group_by(CELL, maintain_order=True).first()


def _t_halfwidth(std: float | None, n: int) -> float | None:
    if n < 2 or std is None or math.isnan(std):
        return None
    return float(stats.t.ppf(0.975, n - 1) * std / math.sqrt(n))


def _joined(values: list[Any]) -> str:
    return ", ".join(sorted({str(v) for v in values if v is not None}))


def aggregate(df: pl.DataFrame, reference: str = REFERENCE) -> pl.DataFrame:
    """The grid: one row per (dataset, noise) x every method in the results x every r of that dataset and noise,
    with the selected setting's statistics (null where no usable trial: a missing cell) and trial counts."""
    chosen = df.join(select_settings(df), on=CELL + ["setting"], how="inner").filter(pl.col("usable"))
    stats_frame = chosen.group_by(CELL).agg(
        pl.len().alias("n"),
        pl.col("test_acc").mean().alias("acc_mean"),
        pl.col("test_acc").std().alias("acc_std"),
        pl.col("last_test_acc").mean().alias("last_mean"),
        pl.col("last_test_acc").std().alias("last_std"),
        pl.col("val_loss").mean().alias("val_loss_mean"),
        pl.col("setting").first(),
        *[pl.col(c).first() for c in SETTING_COLUMNS],
        pl.col("seed").sort().alias("seeds"),
        *[pl.col(c).alias(f"{c}s") for c in PROVENANCE_COLUMNS[:5]],
    )
    counts = df.group_by(CELL).agg(
        pl.len().alias("trials"),
        pl.col("setting").n_unique().alias("settings_tried"),
        (pl.col("status") == "ok").sum().alias("ok"),
        (pl.col("status") == "diverged").sum().alias("diverged"),
        (pl.col("status") == "failed").sum().alias("failed"),
    )
    methods = method_order(df["method"].unique().to_list(), reference)
    grid = (
        df.select("dataset", "noise", "r").unique()
        .join(pl.DataFrame({"method": methods}).with_row_index("method_rank"), how="cross")
        .join(counts, on=CELL, how="left")
        .join(stats_frame, on=CELL, how="left")
        .join(df.group_by("method").agg(pl.col("privileged").any()), on="method", how="left")
        .with_columns(
            pl.col("trials", "ok", "diverged", "failed", "settings_tried", "n").fill_null(0).cast(pl.Int64),
        )
        .sort("dataset", "noise", "r", "method_rank")
    )
    rows = []
    for row in grid.iter_rows(named=True):
        for key, std in (("acc", row["acc_std"]), ("last", row["last_std"])):
            half = _t_halfwidth(std, row["n"])
            mean = row[f"{key}_mean"]
            row[f"{key}_ci_low"] = None if half is None else mean - half
            row[f"{key}_ci_high"] = None if half is None else mean + half
        for c in PROVENANCE_COLUMNS[:5]:
            row[f"{c}s"] = _joined(row[f"{c}s"] or [])
        row["seeds"] = ",".join(str(s) for s in row["seeds"] or [])
        rows.append(row)
    schema = dict(grid.schema) | {f"{k}_ci_{e}": pl.Float64 for k in ("acc", "last") for e in ("low", "high")}
    schema |= {f"{c}s": pl.String for c in PROVENANCE_COLUMNS[:5]} | {"seeds": pl.String}
    first = ["dataset", "noise", "r", "method", "privileged", "n", "acc_mean", "acc_std", "acc_ci_low", "acc_ci_high",
             "last_mean", "last_std", "last_ci_low", "last_ci_high", "val_loss_mean", "trials", "ok", "diverged",
             "failed", "settings_tried", "setting"]
    frame = pl.DataFrame(rows, schema=schema).drop("method_rank")
    return frame.select(first + [c for c in frame.columns if c not in first])


def paired_test(ours: np.ndarray, theirs: np.ndarray) -> tuple[str, float | None]:
    """(test name, two-sided p-value) for paired samples; ("none", None) under two pairs."""
    ours, theirs = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    diff = ours - theirs
    if len(diff) < 2:
        return "none", None
    name = "wilcoxon" if len(diff) >= WILCOXON_MIN_PAIRS else "paired t"
    if np.all(diff == 0):
        return name, 1.0
    if name == "wilcoxon":
        return name, float(stats.wilcoxon(ours, theirs).pvalue)
    if np.all(diff == diff[0]):  # a constant non-zero difference: zero variance, the t statistic is infinite
        return name, 0.0
    return name, float(stats.ttest_rel(ours, theirs).pvalue)


def marker(p: float | None) -> str:
    if p is None:
        return ""
    return "***" if p < 0.001 else "**" if p < 0.01 else "*" if p < ALPHA else ""


def paired_comparison(df: pl.DataFrame, grid: pl.DataFrame, reference: str = REFERENCE,
                      metric: str = "test_acc") -> pl.DataFrame:
    """The reference method against each other method per (dataset, noise, r): seeds matched between the two
    selected settings. outcome is the reference's win / tie / loss at level ALPHA (untested under two pairs)."""
    chosen = df.join(select_settings(df), on=CELL + ["setting"], how="inner").filter(pl.col("usable"))
    rows = []
    for cell in grid.filter(pl.col("method") != reference).iter_rows(named=True):
        key = {k: cell[k] for k in ("dataset", "noise", "r")}
        sel = chosen.filter(**key)
        ref = sel.filter(pl.col("method") == reference).select("seed", "noise_hash", pl.col(metric).alias("a"))
        base = sel.filter(pl.col("method") == cell["method"]).select("seed", pl.col("noise_hash").alias("h"),
                                                                     pl.col(metric).alias("b"))
        pairs = ref.join(base, on="seed", how="inner").drop_nulls(["a", "b"]).sort("seed")
        test, p = paired_test(pairs["a"].to_numpy(), pairs["b"].to_numpy())
        diff = float((pairs["a"] - pairs["b"]).mean()) if len(pairs) else None
        if ref.is_empty() or base.is_empty():
            outcome = "missing"
        elif p is None:
            outcome = "untested"
        else:
            outcome = "win" if p < ALPHA and diff > 0 else "loss" if p < ALPHA and diff < 0 else "tie"
        same_labels = bool((pairs["noise_hash"] == pairs["h"]).all()) if len(pairs) else None
        rows.append(key | dict(reference=reference, method=cell["method"], pairs=len(pairs), mean_diff=diff,
                               test=test, p=p, marker=marker(p), outcome=outcome, same_noisy_labels=same_labels))
    schema = {"dataset": pl.String, "noise": pl.String, "r": pl.Float64, "reference": pl.String,
              "method": pl.String, "pairs": pl.Int64, "mean_diff": pl.Float64, "test": pl.String, "p": pl.Float64,
              "marker": pl.String, "outcome": pl.String, "same_noisy_labels": pl.Boolean}
    return pl.DataFrame(rows, schema=schema)


def win_tie_loss(paired: pl.DataFrame) -> pl.DataFrame:
    """Per dataset and baseline: how many cells the reference wins, ties, loses, could not test, or lacks."""
    outcomes = ["win", "tie", "loss", "untested", "missing"]
    return (
        paired.group_by("dataset", "method", maintain_order=True)
        .agg(*[(pl.col("outcome") == o).sum().cast(pl.Int64).alias(o) for o in outcomes])
        .sort("dataset")
    )


# ------------------------------------------------------------------------------------------- paper vs measured


def _relative_error(estimate: str, truth: str) -> float | None:
    t_hat, t = np.asarray(json.loads(estimate), dtype=float), np.asarray(json.loads(truth), dtype=float)
    if t_hat.shape != t.shape:
        return None
    return float(np.abs(t_hat - t).sum() / np.abs(t).sum())


def transition_estimates(df: pl.DataFrame) -> pl.DataFrame:
    """Per cell of every method that estimates T (fw, backward, trevision, volminnet, lccn, ...): the relative error
    ||T^ - T||_1 / ||T||_1 (entrywise sums) of its estimate against the true T, over the seeds of the setting
    the accuracy tables selected, with the clean test accuracy those trials bought. The true T is the noise
    model's T where the noise is synthetic; for human noise (no model T), the empirical T of the noisy labels
    against the clean ones."""
    columns = {"dataset": pl.String, "noise": pl.String, "r": pl.Float64, "method": pl.String, "truth": pl.String,
               "n": pl.Int64, "err_mean": pl.Float64, "err_std": pl.Float64, "acc_mean": pl.Float64,
               "acc_std": pl.Float64, "last_mean": pl.Float64, "t_hat_mean": pl.String}
    if "estimated_transition" not in df.columns:
        return pl.DataFrame(schema=columns)
    truth_cols = [c for c in ("transition", "empirical_transition") if c in df.columns]
    chosen = (df.join(select_settings(df), on=CELL + ["setting"], how="inner")
              .filter(pl.col("usable") & pl.col("estimated_transition").is_not_null()))
    rows = []
    for row in chosen.iter_rows(named=True):
        source = next(((c, row[c]) for c in truth_cols if row[c] is not None), (None, None))
        error = None if source[1] is None else _relative_error(row["estimated_transition"], source[1])
        rows.append(dict(dataset=row["dataset"], noise=row["noise"], r=row["r"], method=row["method"],
                         truth={"transition": "noise model", "empirical_transition": "empirical"}.get(source[0]),
                         error=error, test_acc=row["test_acc"], last_test_acc=row["last_test_acc"],
                         estimate=row["estimated_transition"]))
    if not rows:
        return pl.DataFrame(schema=columns)
    frame = pl.DataFrame(rows, schema_overrides={"error": pl.Float64, "last_test_acc": pl.Float64})
    out = []
    for key, group in frame.group_by(CELL, maintain_order=True):
        estimates = np.stack([np.asarray(json.loads(e), dtype=float) for e in group["estimate"]])
        out.append(dict(zip(CELL, key, strict=True), truth=_joined(group["truth"].to_list()) or None,
                        n=group.height, err_mean=group["error"].mean(), err_std=group["error"].std(),
                        acc_mean=group["test_acc"].mean(), acc_std=group["test_acc"].std(),
                        last_mean=group["last_test_acc"].mean(),
                        t_hat_mean=json.dumps(np.round(estimates.mean(axis=0), 4).tolist())))
    order = {m: i for i, m in enumerate(method_order(frame["method"].unique().to_list()))}
    result = pl.DataFrame(out, schema=columns)
    return result.with_columns(pl.col("method").replace_strict(order, default=len(order)).alias("_rank")) \
        .sort("dataset", "noise", "r", "_rank").drop("_rank")


def _pm(mean: float | None, std: float | None, digits: int = 2) -> str:
    return _fmt(mean, digits) + ("" if std is None or math.isnan(std) else f" ± {_fmt(std, digits)}")


def read_reference() -> pl.DataFrame:
    """The paper's published table, shipped as package data (bench/reference_results.csv)."""
    try:
        text = importlib.resources.files("bench").joinpath(REFERENCE_CSV).read_text(encoding="utf-8")
    except (NotADirectoryError, FileNotFoundError, TypeError):
        # An editable install maps `bench` (and its bench.baselines / bench.datasets folders) through a path hook
        # that importlib.resources may reject. The file sits beside this module either way.
        text = Path(__file__).with_name(REFERENCE_CSV).read_text(encoding="utf-8")
    return pl.read_csv(io.StringIO(text), schema_overrides={"noise_r": pl.Float64, "acc_mean": pl.Float64,
                                                            "acc_std": pl.Float64})


def paper_comparison(grid: pl.DataFrame) -> pl.DataFrame:
    """Every published row of the datasets we have results for, with our number beside it (null: not measured),
    the difference and a flag where |diff| exceeds the combined std sqrt(ours^2 + paper^2)."""
    from bench.data import paper_noise  # each dataset says which of its cells the paper's table holds

    ours = grid.filter(
        pl.struct("dataset", "noise").map_elements(
            lambda s: paper_noise(s["dataset"]) == s["noise"], return_dtype=pl.Boolean)
    ).select("dataset", "r", "method", "acc_mean", "acc_std", "n")
    paper = read_reference().with_columns(pl.col("noise_r").fill_null(0.0).round(6).alias("r"))
    paper = paper.filter(pl.col("dataset").is_in(grid["dataset"].unique().to_list()))
    joined = paper.join(ours, on=["dataset", "r", "method"], how="left").with_columns(
        pl.col("noise_r").alias("paper_r"),
        (pl.col("acc_mean_right") - pl.col("acc_mean")).alias("diff"),
        (pl.col("acc_std_right").fill_null(0.0).pow(2) + pl.col("acc_std").fill_null(0.0).pow(2))
        .sqrt().alias("combined_std"),
    )
    return joined.select(
        "dataset", "r", "method",
        pl.col("acc_mean").alias("paper_mean"), pl.col("acc_std").alias("paper_std"),
        pl.col("acc_mean_right").alias("ours_mean"), pl.col("acc_std_right").alias("ours_std"),
        pl.col("n").fill_null(0).alias("ours_n"), "diff", "combined_std",
        (pl.col("diff").abs() > pl.col("combined_std")).alias("flag"),
    )


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
    dataset: str
    noise: str
    methods: list[str]
    rs: list[float]
    entries: dict[tuple[float, str], Entry]


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


def _label(method: str, privileged: bool) -> str:
    return LABELS.get(method, method) + (" †" if privileged else "")


def _privileged(table: Table) -> set[str]:
    return {m for (_, m), e in table.entries.items() if e.cell["privileged"]}


LEGEND = (
    "Clean test accuracy (%) at the checkpoint selected on the noisy validation set: mean ± std over seeds for the "
    "hyper-parameters with the lowest mean noisy-validation loss. Best per row in bold; * / ** / ***: paired test "
    f"against {REFERENCE.upper()} (matched seeds) p < 0.05 / 0.01 / 0.001; † privileged (uses the true T, not a fair "
    f"competitor); {MISSING}: no usable trial."
)


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
    lines = ["# Leaderboard", "", LEGEND, "", summary, ""]
    for t in tabs:
        priv = _privileged(t)
        lines += [f"## {_md(t.dataset)} · {_md(t.noise)}", ""]
        lines.append("| r | " + " | ".join(_md(_label(m, m in priv)) for m in t.methods) + " |")
        lines.append("|---|" + "---|" * len(t.methods))
        for r in t.rs:
            cells = []
            for m in t.methods:
                e = t.entries[(r, m)]
                text = f"**{e.text}**" if e.best else e.text
                cells.append(text + (f" {e.marker}" if e.marker else ""))
            lines.append(f"| {_r(r)} | " + " | ".join(cells) + " |")
        lines.append("")
    if not wtl.is_empty():
        lines += [f"## {REFERENCE.upper()} against each baseline (cells won / tied / lost, paired tests)", "",
                  "| dataset | baseline | win | tie | loss | untested | missing |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {_md(w['dataset'])} | {_md(w['method'])} | {w['win']} | {w['tie']} | {w['loss']} | "
                  f"{w['untested']} | {w['missing']} |" for w in wtl.iter_rows(named=True)]
        lines.append("")
    lines += ["## Paper vs measured", ""]
    if comparison.is_empty():
        lines.append("None of our datasets is in the paper's tables (cifar10, dogs_vs_cats, mr, clothing1m).")
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
            lines.append(f"| {e['dataset']} | {e['noise']} | {_r(e['r'])} | {_label(e['method'], False)} | "
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
        priv = _privileged(t)
        head = " & ".join(_tex(_label(m, m in priv)) for m in t.methods)
        body = []
        for r in t.rs:
            cells = []
            for m in t.methods:
                e = t.entries[(r, m)]
                text = _tex(e.text)
                if e.best:
                    text = rf"\textbf{{{text}}}"
                cells.append(text + (f"$^{{{e.marker}}}$" if e.marker else ""))
            body.append(f"{_r(r)} & " + " & ".join(cells) + r" \\")
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


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
h1,h2,h3{font-weight:600}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f2f2f2;cursor:pointer;user-select:none}th:hover{background:#e4e4e4}
td.l,th.l{text-align:left}td.best{font-weight:700;background:#eaf5ea}td.missing{color:#999;background:#fafafa}
td.flag{background:#fbe3e3}.note{color:#555;max-width:75em}img{max-width:100%;border:1px solid #eee}
details{margin:.4em 0 1em}summary{cursor:pointer;color:#335}
"""

_JS = """
document.querySelectorAll('table.sortable th').forEach(function (th) {
  th.title = 'click to sort';
  th.addEventListener('click', function () {
    var body = th.closest('table').tBodies[0], i = th.cellIndex, asc = th.dataset.dir !== 'asc';
    th.dataset.dir = asc ? 'asc' : 'desc';
    function key(row) {
      var c = row.cells[i], t = c.dataset.v !== undefined ? c.dataset.v : c.textContent, x = parseFloat(t);
      return isNaN(x) ? [1, t] : [0, x];
    }
    Array.from(body.rows).sort(function (a, b) {
      var x = key(a), y = key(b);
      if (x[0] !== y[0]) return x[0] - y[0];
      return (x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0) * (asc ? 1 : -1);
    }).forEach(function (row) { body.appendChild(row); });
  });
});
"""


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


def to_html(tabs: list[Table], paired: pl.DataFrame, wtl: pl.DataFrame, comparison: pl.DataFrame,
            df: pl.DataFrame, plots: dict[tuple[str, str], Path], heatmap: Path, summary: str,
            estimates: pl.DataFrame | None = None, extra: str = "") -> str:
    """One self-contained page: inline CSS and JS, figures as base64 PNG, no external asset."""
    p_of = {(p["dataset"], p["noise"], p["r"], p["method"]): p for p in paired.iter_rows(named=True)}
    body = [f"<h1>bench report</h1><p class=note>{html.escape(LEGEND)}</p><p>{html.escape(summary)}</p>"]
    for t in tabs:
        priv = _privileged(t)
        body.append(f"<h2>{html.escape(t.dataset)} · {html.escape(t.noise)}</h2>")
        rows = []
        for r in t.rs:
            cells = [_td(_r(r), "l", r)]
            for m in t.methods:
                e = t.entries[(r, m)]
                cls = "best" if e.best else "missing" if e.mean is None else ""
                cells.append(_td(e.text + (f" {e.marker}" if e.marker else ""), cls, e.mean, _provenance(e.cell)))
            rows.append(f"<tr>{''.join(cells)}</tr>")
        body.append(_html_table(["r"] + [_label(m, m in priv) for m in t.methods], rows))
        body.append(_png(plots[(t.dataset, t.noise)]))
        detail = []
        for (r, m), e in sorted(t.entries.items()):
            c, p = e.cell, p_of.get((t.dataset, t.noise, r, m), {})
            detail.append("<tr>" + "".join([
                _td(_label(m, m in priv), "l"), _td(_r(r), value=r), _td(c["n"]),
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
            ]) + "</tr>")
        body.append("<details><summary>every cell: statistics and provenance</summary>" + _html_table(
            ["method", "r", "n", "test acc", "std", "95% CI", "last-epoch acc", "std", "val loss",
             f"p vs {REFERENCE}", "test", "settings", "ok", "diverged", "failed", "setting", "lr", "batch",
             "method params", "epochs", "commit", "versions"], detail) + "</details>")
    if not wtl.is_empty():
        body.append(f"<h2>{REFERENCE.upper()} against each baseline</h2>")
        rows = ["<tr>" + "".join(_td(w[k], "l" if k in ("dataset", "method") else "") for k in wtl.columns)
                + "</tr>" for w in wtl.iter_rows(named=True)]
        body.append(_html_table(wtl.columns, rows, left=2))
    body.append("<h2>Paper vs measured</h2>")
    if comparison.is_empty():
        body.append("<p>None of our datasets is in the paper's tables (cifar10, dogs_vs_cats, mr, clothing1m).</p>")
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
            _td(_label(e["method"], False), "l"), _td(e["n"]),
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
            f"<style>{_CSS}</style></head><body>{''.join(body)}<script>{_JS}</script></body></html>\n")


def to_terminal(tabs: list[Table], summary: str, bold: bool = False) -> str:
    """Aligned text tables for a terminal; the best cell of a row is starred (or bold on a tty)."""
    lines = [summary, ""]
    for t in tabs:
        priv = _privileged(t)
        header = ["r"] + [_label(m, m in priv) for m in t.methods]
        rows = []
        for r in t.rs:
            cells = []
            for m in t.methods:
                e = t.entries[(r, m)]
                cells.append((e.text + (f" {e.marker}" if e.marker else "") + (" <" if e.best and not bold else ""),
                              e.best))
            rows.append([(_r(r), False)] + cells)
        widths = [max(len(header[i]), *(len(row[i][0]) for row in rows)) for i in range(len(header))]
        lines += [f"{t.dataset} · {t.noise}", "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)),
                  "  ".join("-" * w for w in widths)]
        for row in rows:
            lines.append("  ".join(f"\033[1m{text.rjust(w)}\033[0m" if best and bold else text.rjust(w)
                                   for (text, best), w in zip(row, widths, strict=True)))
        lines.append("")
    return "\n".join(lines + [LEGEND.replace("in bold", "marked <" if not bold else "in bold")])


# ------------------------------------------------------------------------------------------------- commands


def _summary(df: pl.DataFrame, grid: pl.DataFrame, results: str) -> str:
    status = {s: int((df["status"] == s).sum()) for s in ("ok", "diverged", "failed")}
    measured = int((grid["n"] > 0).sum())
    commits = _joined(df["git_commit"].to_list()) or "unknown"
    return (f"{df.height} trials under {results}: {status['ok']} ok, {status['diverged']} diverged, "
            f"{status['failed']} failed; {measured} of {grid.height} cells measured "
            f"({grid.height - measured} missing); commits {commits}.")


def build_report(results: str | Path, out: Path, log: Log = _stderr) -> dict[str, Path]:
    """Write every output of `bench report` under `out`; return them by name."""
    from bench import diagnostics, plots
    from bench.results import read_table

    log(f"reading result rows under {results} ...")
    df = load_trials(results)
    grid = aggregate(df)
    paired = paired_comparison(df, grid)
    wtl = win_tie_loss(paired)
    comparison = paper_comparison(grid)
    estimates = transition_estimates(df)
    tabs = tables(grid, paired)
    summary = _summary(df, grid, str(results))
    log(summary)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    figures: dict[tuple[str, str], Path] = {}
    for i, t in enumerate(tabs, 1):
        log(f"plot {i}/{len(tabs)}: {t.dataset} · {t.noise}")
        part = grid.filter(dataset=t.dataset, noise=t.noise)
        png, svg = plots.accuracy_vs_r(part, t.dataset, t.noise, t.methods, LABELS, out / "plots" /
                                       f"accuracy_vs_r_{t.dataset}_{t.noise}", REFERENCE, frozenset(_privileged(t)))
        figures[(t.dataset, t.noise)] = png
        written[f"plot {t.dataset} {t.noise}"], written[f"plot {t.dataset} {t.noise} svg"] = png, svg
    log("plot: difference to the paper")
    heat_png, heat_svg = plots.paper_heatmap(comparison, out / "plots" / "paper_difference")
    written["heatmap"], written["heatmap svg"] = heat_png, heat_svg
    log("diagnostics: selection rules, memorisation, detection, cost ...")
    diag = diagnostics.analyse(df, read_table(results, "epochs"), select_settings(df))
    diag_figures = diagnostics.plot(diag, out / "plots", LABELS)
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
        + diagnostics.to_markdown(diag, LABELS),
        "leaderboard.tex": to_latex(tabs),
        "report.html": to_html(tabs, paired, wtl, comparison, df, figures, heat_png,
                               summary + f" Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.", estimates,
                               diagnostics.to_html(diag, diag_figures, LABELS)),
    }
    for name, text in texts.items():
        written[name] = out / name
        written[name].write_text(text, encoding="utf-8")
    return written


def cmd_report(args: argparse.Namespace) -> int:
    results = str(args.results)
    if args.out is None and "://" in results:
        raise UserError("--out DIR is needed when RESULTS is a remote URI")
    out = Path(args.out) if args.out is not None else Path(results).expanduser() / "report"
    written = build_report(results, out)
    for name, path in written.items():
        print(f"{name:28s} {path}")
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    df = load_trials(str(args.results))
    grid = aggregate(df)
    paired = paired_comparison(df, grid, metric=METRICS[args.metric])
    print(to_terminal(tables(grid, paired, args.metric), _summary(df, grid, str(args.results)),
                      bold=sys.stdout.isatty()))
    return 0


def add_commands(subparsers: argparse._SubParsersAction,
                 add_data_root: Callable[[argparse.ArgumentParser], None]) -> None:
    p = subparsers.add_parser(
        "report", help="leaderboards (Markdown, LaTeX, CSV, one HTML page), plots, paper vs measured, and the "
        "diagnostics: three checkpoint rules, memorisation curves, detection quality, cost, label hashes")
    p.add_argument("results", help="results folder (holds trials/*.parquet)")
    p.add_argument("--out", default=None, help="output folder (default: RESULTS/report)")
    add_data_root(p)
    p.set_defaults(func=cmd_report)

    p = subparsers.add_parser("leaderboard", help="print the leaderboard as an aligned terminal table")
    p.add_argument("results", help="results folder (holds trials/*.parquet)")
    p.add_argument("--metric", choices=sorted(METRICS), default="best",
                   help="accuracy at the selected checkpoint (best, default) or at the last epoch (last)")
    add_data_root(p)
    p.set_defaults(func=cmd_leaderboard)
