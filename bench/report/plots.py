"""The report's figures, drawn with matplotlib's Agg backend (no display needed) and written as PNG and SVG.

    accuracy_vs_r        clean test accuracy against the noise level r, one line per method with a +-1 std band,
                         for one dataset and noise pattern (the paper's figures 2 and 3)
    paper_heatmap        measured minus published accuracy per (dataset, method) and r; flagged cells marked
    memorisation_curves  per epoch, one panel per (r, method): accuracy against the noisy labels on flipped and
                         on kept training examples, against the clean training labels, and on the clean test set
    detection_curves     per epoch, one panel per (r, method): precision, recall and AUROC of "judged noisy"

Each takes a frame built by `bench.report.analysis` or `bench.report.diagnostics` and returns the paths written.
Figures are `Figure` objects, not pyplot state, so drawing many of them leaks nothing.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from bench.store.folder import replace_file  # noqa: E402

FORMATS = ("png", "svg")
# Fixed metadata keeps the files byte-stable from run to run.
_METADATA = {"png": {"Software": None}, "svg": {"Date": None}}


def file_stem(folder: Path, *parts: str) -> Path:
    """`folder/<parts joined by _>`, a file name whatever the parts hold: names come from result rows, and results
    folders travel between people, so every character but letters, digits, '-' and '_' becomes '_' ('.' too: the
    suffix is ours), and a name that had to change gets a hash of the original, so that two never collide."""
    name = "_".join(parts)
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:100]
    if safe != name:
        safe += "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return folder / safe


def _save(fig: Figure, stem: Path) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in FORMATS:
        path = stem.with_suffix(f".{fmt}")
        replace_file(path, lambda tmp, fmt=fmt: fig.savefig(tmp, format=fmt, dpi=120, bbox_inches="tight",
                                                            metadata=_METADATA[fmt]))
        paths.append(path)
    return paths


def accuracy_vs_r(
    grid: pl.DataFrame, dataset: str, noise: str, methods: list[str], labels: dict[str, str], stem: Path,
    reference: str = "dmi", privileged: frozenset[str] = frozenset(),
) -> list[Path]:
    """`grid` holds one row per (method, r) of this dataset and noise with acc_mean and acc_std (null: missing)."""
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    colors = matplotlib.colormaps["tab10"].colors
    drawn = 0
    for i, method in enumerate(methods):
        rows = grid.filter(pl.col("method") == method).sort("r")
        r = rows["r"].to_numpy()
        mean = rows["acc_mean"].fill_null(np.nan).to_numpy().astype(float)
        std = rows["acc_std"].fill_null(0.0).to_numpy().astype(float)
        if np.all(np.isnan(mean)):
            continue
        color = colors[i % len(colors)]
        drawn += 1
        ax.plot(r, mean, marker="o", ms=4, color=color, label=labels.get(method, method),
                lw=2.4 if method == reference else 1.4, ls="--" if method in privileged else "-")
        ax.fill_between(r, mean - std, mean + std, color=color, alpha=0.18, lw=0)
        ax.errorbar(r, mean, yerr=std, fmt="none", ecolor=color, elinewidth=0.8, capsize=2, alpha=0.7)
    ax.set_xlabel("noise level r")
    ax.set_ylabel("clean test accuracy (%)")
    ax.set_title(f"{dataset}, {noise} noise: mean ± std over seeds")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8, ncol=2 if drawn > 5 else 1, loc="best")
    else:
        ax.text(0.5, 0.5, "no usable trials", ha="center", va="center", transform=ax.transAxes)
    return _save(fig, stem)


def paper_heatmap(comparison: pl.DataFrame, stem: Path, labels: dict[str, str]) -> list[Path]:
    """`comparison` rows: dataset, method, r, diff (null where not measured), flag; at least one measured (the report
    leaves the figure out where none is). `labels`: each method's display name."""
    measured = comparison.filter(pl.col("diff").is_not_null())
    # Rows: every (dataset, method) with at least one measured cell; columns: every r of those datasets.
    keys = measured.select("dataset", "method").unique(maintain_order=True).rows()
    datasets = {d for d, _ in keys}
    rs = sorted(comparison.filter(pl.col("dataset").is_in(list(datasets)))["r"].unique().to_list())
    values = np.full((len(keys), len(rs)), np.nan)
    flags = np.zeros_like(values, dtype=bool)
    index = {k: i for i, k in enumerate(keys)}
    for row in measured.iter_rows(named=True):
        i, j = index[(row["dataset"], row["method"])], rs.index(row["r"])
        values[i, j] = row["diff"]
        flags[i, j] = bool(row["flag"])
    limit = max(1.0, float(np.nanmax(np.abs(values))))
    fig = Figure(figsize=(1.2 + 0.62 * len(rs), 1.0 + 0.36 * len(keys)))
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=-limit, vmax=limit, aspect="auto")
    for i in range(len(keys)):
        for j in range(len(rs)):
            if math.isnan(values[i, j]):
                continue
            text = f"{values[i, j]:+.1f}" + ("!" if flags[i, j] else "")
            dark = abs(values[i, j]) > 0.6 * limit
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_xticks(range(len(rs)), [f"{r:.1f}" if round(r, 1) == r else f"{r:g}" for r in rs])
    ax.set_yticks(range(len(keys)), [f"{d} · {labels.get(m, m)}" for d, m in keys])
    ax.set_xlabel("noise level r")
    ax.set_title("measured − published (accuracy points); ! = beyond the combined std; grey = not measured",
                 fontsize=9)
    fig.colorbar(image, ax=ax, label="difference (points)")
    return _save(fig, stem)


def _panels(curves: pl.DataFrame, title: str, series: list[tuple[str, str, str, str]], ylabel: str,
            labels: dict[str, str], ylim: tuple[float, float]) -> Figure:
    """One panel per (r, method) of `curves` (rows r, columns methods), each with a line per (column, label,
    colour, style) in `series` against the epoch `x`; a dotted line where the method stage starts."""
    rs = sorted(curves["r"].unique().to_list())
    methods = list(dict.fromkeys(curves.sort("method")["method"].to_list()))
    fig = Figure(figsize=(1.0 + 3.0 * len(methods), 0.8 + 2.3 * len(rs)))
    axes = fig.subplots(len(rs), len(methods), squeeze=False, sharex=True, sharey=True)
    for i, r in enumerate(rs):
        for j, method in enumerate(methods):
            ax = axes[i][j]
            part = curves.filter((pl.col("r") == r) & (pl.col("method") == method)).sort("x")
            for column, label, color, style in series:
                y = part[column].fill_null(np.nan).to_numpy().astype(float)
                if not np.all(np.isnan(y)):
                    ax.plot(part["x"].to_numpy(), y, style, color=color, lw=1.4, ms=3, label=label)
            start = part.filter(pl.col("stage") == "method")["x"].min()
            if start is not None:
                ax.axvline(start, color="#888", ls=":", lw=1)
            ax.set_title(f"{labels.get(method, method)}, r = {r:g}", fontsize=9)
            ax.set_ylim(*ylim)
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            if i == len(rs) - 1:
                ax.set_xlabel("epoch (warm start, then method)", fontsize=8)
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=8)
    # The legend names every line drawn in any panel: one panel alone may lack some (at r = 0 nothing is flipped).
    drawn = {name: handle for ax in axes.flat for handle, name in zip(*ax.get_legend_handles_labels(), strict=True)}
    names = [label for _, label, _, _ in series if label in drawn]
    fig.legend([drawn[n] for n in names], names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=8,
               frameon=False)
    fig.suptitle(title, fontsize=10)
    return fig


def memorisation_curves(curves: pl.DataFrame, title: str, stem: Path, labels: dict[str, str]) -> list[Path]:
    """`curves` (bench.report.diagnostics): one row per (r, method, stage, x) of one dataset and noise."""
    fig = _panels(curves, f"{title}: what the network fits, epoch by epoch (mean over seeds)", [
        ("train_noisy_acc_flipped", "noisy label, flipped examples (memorised)", "#d62728", "-o"),
        ("train_noisy_acc_kept", "noisy label, kept examples", "#2ca02c", "-o"),
        ("train_clean_acc", "clean label, training set", "#1f77b4", "-"),
        ("test_acc", "clean test set", "black", "--"),
    ], "accuracy (%)", labels, (-2, 102))
    return _save(fig, stem)


def detection_curves(curves: pl.DataFrame, title: str, stem: Path, labels: dict[str, str]) -> list[Path]:
    """`curves` rows of the methods that judge examples noisy (det_* columns set)."""
    fig = _panels(curves.filter(pl.col("stage") == "method"),
                  f"{title}: examples judged noisy against the true flips (mean over seeds)", [
                      ("det_precision", "precision", "#9467bd", "-o"), ("det_recall", "recall", "#ff7f0e", "-o"),
                      ("det_auroc", "AUROC", "black", "--"), ("det_flagged", "share flagged", "#888888", ":"),
                  ], "0 – 1", labels, (-0.02, 1.02))
    return _save(fig, stem)
