"""The report's figures, drawn with matplotlib's Agg backend (no display needed) and written as PNG (the report's page
embeds them), the single-plot ones also as SVG.

    accuracy_vs_r        clean test accuracy against the noise level r, one line per method with a +-1 std band,
                         for one dataset and noise pattern (the paper's figures 2 and 3)
    paper_heatmap        measured minus published accuracy per (dataset, method) and r; flagged cells marked
    memorisation_curves  per epoch, one panel per (r, method): accuracy against the noisy labels on flipped and
                         on kept training examples, against the clean training labels, and on the clean test set
    detection_curves     per epoch, one panel per (r, method): precision, recall and AUROC of "judged noisy"

Each takes frames built by `bench.report.analysis` or `bench.report.diagnostics` and returns the paths written.
Figures are `Figure` objects, not pyplot state, so drawing many of them leaks nothing. The curves' figures hold a panel
per (r, method) (50 for 10 r and 5 methods), one figure per (dataset, noise): their axes are built once for the
figures of the same r and methods (`Panels`), and they are written as PNG only, an SVG of that many panels costing as
much as the rest of the report.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from bench.store.folder import replace_file  # noqa: E402

FORMATS = ("png", "svg")
DPI = 120
# Fixed metadata, and a fixed salt for the ids an SVG's elements get (random per save without one), keep the files
# byte-stable from run to run.
_METADATA = {"png": {"Software": None}, "svg": {"Date": None}}
_SVG_SALT = {"svg.hashsalt": "bench"}


def file_stem(folder: Path, *parts: str) -> Path:
    """`folder/<parts joined by _>`, a file name whatever the parts hold: names come from result rows, and results
    folders travel between people, so every character but letters, digits, '-' and '_' becomes '_' ('.' too: the
    suffix is ours), and a name that had to change gets a hash of the original, so that two never collide."""
    name = "_".join(parts)
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:100]
    if safe != name:
        safe += "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return folder / safe


def _png_crop(fig: Figure) -> Bbox:
    """What `savefig(bbox_inches="tight")` crops a PNG of `fig` to (its tight bounding box at the PNG's dpi, padded as
    savefig pads it), found without the draw savefig makes first, which costs as much as the PNG's own: that draw
    runs layout engines, which these figures do not use, and `get_tightbbox` places the titles itself.
    tests/report/test_plots.py holds the PNGs to those written with "tight"."""
    fig.set_dpi(DPI)
    return fig.get_tightbbox(FigureCanvasAgg(fig).get_renderer()).padded(matplotlib.rcParams["savefig.pad_inches"])


def _save(fig: Figure, stem: Path, formats: tuple[str, ...] = FORMATS) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = stem.with_suffix(f".{fmt}")
        crop = _png_crop(fig) if fmt == "png" else "tight"
        with matplotlib.rc_context(_SVG_SALT):
            replace_file(path, lambda tmp, fmt=fmt, crop=crop: fig.savefig(tmp, format=fmt, dpi=DPI, bbox_inches=crop,
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


Series = tuple[str, str, str, str]  # a curve of the panels: (column, legend label, colour, matplotlib line style)
MEMORISATION: list[Series] = [
    ("train_noisy_acc_flipped", "noisy label, flipped examples (memorised)", "#d62728", "-o"),
    ("train_noisy_acc_kept", "noisy label, kept examples", "#2ca02c", "-o"),
    ("train_clean_acc", "clean label, training set", "#1f77b4", "-"),
    ("test_acc", "clean test set", "black", "--"),
]
DETECTION: list[Series] = [
    ("det_precision", "precision", "#9467bd", "-o"), ("det_recall", "recall", "#ff7f0e", "-o"),
    ("det_auroc", "AUROC", "black", "--"), ("det_flagged", "share flagged", "#888888", ":"),
]


class Panels:
    """A figure of panels, one per (r, method) (rows r, columns methods), their axes, titles, ranges and axis labels
    built once; `draw` puts one frame's curves into them (a line per (column, label, colour, style) of `series`
    against the epoch `x`, a dotted line where the method stage starts), replacing the frame drawn before. Building
    50 panels' axes costs about what drawing them does, so figures of the same panels share one `Panels`."""

    def __init__(self, rs: list[float], methods: list[str], series: list[Series], ylabel: str,
                 labels: dict[str, str], ylim: tuple[float, float]) -> None:
        self.rs, self.methods, self.series = rs, methods, series
        self.figure = Figure(figsize=(1.0 + 3.0 * len(methods), 0.8 + 2.3 * len(rs)))
        # Not matplotlib's shared axes: every limit an axes reads walks all the axes it shares with, quadratic in the
        # panels (at 50 most of a figure's cost); `draw` gives every panel the same x range, and y is fixed here.
        self.axes = self.figure.subplots(len(rs), len(methods), squeeze=False)
        for i, r in enumerate(rs):
            for j, method in enumerate(methods):
                ax = self.axes[i][j]
                # A fixed title height: no panel has tick labels above it, and matplotlib's search for them costs
                # every axes a pass over its ticks at every draw.
                ax.set_title(f"{labels.get(method, method)}, r = {r:g}", fontsize=9, y=1.0)
                ax.set_ylim(*ylim)
                ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
                ax.grid(alpha=0.3)
                if i == len(rs) - 1:
                    ax.set_xlabel("epoch (warm start, then method)", fontsize=8)
                if j == 0:
                    ax.set_ylabel(ylabel, fontsize=8)
                ax.label_outer()
                # Out of the tight crop's measure: each spine measures its axis' ticks again (200 passes a figure),
                # and none reaches beyond the axes it bounds or the outer panels' tick labels.
                for spine in ax.spines.values():
                    spine.set_in_layout(False)

    def draw(self, curves: pl.DataFrame, title: str) -> Figure:
        """The figure showing `curves` (one row per (r, method, stage, x); its r and methods those of the panels)."""
        # Every panel's arrays out of polars at once, then sliced: a polars call costs about 2 ms, paid per panel.
        frame = curves.sort("r", "method", "x")
        x = frame["x"].to_numpy()
        ys = frame.select(pl.col([column for column, _, _, _ in self.series]).cast(pl.Float64).fill_null(np.nan))
        ys = ys.to_numpy().T
        rows, first = {}, 0
        for key, group in itertools.groupby(frame.select("r", "method").rows()):
            n = len(list(group))
            rows[key], first = slice(first, first + n), first + n
        starts = {(r, method): start for r, method, start in curves.filter(pl.col("stage") == "method")
                  .group_by("r", "method").agg(pl.col("x").min()).iter_rows()}
        for i, r in enumerate(self.rs):
            for j, method in enumerate(self.methods):
                ax = self.axes[i][j]
                for line in list(ax.lines):  # the frame drawn before
                    line.remove()
                if (part := rows.get((r, method))) is not None:
                    for y, (_, label, color, style) in zip(ys[:, part], self.series, strict=True):
                        if not np.all(np.isnan(y)):
                            ax.plot(x[part], y, style, color=color, lw=1.4, ms=3, label=label)
                if (start := starts.get((r, method))) is not None:
                    ax.axvline(start, color="#888", ls=":", lw=1)
                ax.relim()
        # One x range, the one shared axes would take: every panel's data, each axes' autoscale adding the margins.
        if ends := [end for ax in self.axes.flat for end in ax.dataLim.intervalx if np.isfinite(end)]:
            for ax in self.axes.flat:
                ax.update_datalim([(min(ends), 0.0), (max(ends), 0.0)], updatey=False)
                ax.autoscale(axis="x")
        for legend in list(self.figure.legends):
            legend.remove()
        # The legend names every line drawn in any panel: one panel alone may lack some (at r = 0 nothing is flipped).
        drawn = {name: handle for ax in self.axes.flat
                 for handle, name in zip(*ax.get_legend_handles_labels(), strict=True)}
        names = [label for _, label, _, _ in self.series if label in drawn]
        self.figure.legend([drawn[n] for n in names], names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2,
                           fontsize=8, frameon=False)
        self.figure.suptitle(title, fontsize=10)
        return self.figure


def _panel_figures(figures: list[tuple[str, pl.DataFrame, Path]], series: list[Series],
                   ylabel: str, labels: dict[str, str], ylim: tuple[float, float]) -> list[Path]:
    """Each (title, curves, stem) of `figures` as a PNG of `Panels`, one `Panels` drawn again for the next figure
    while its r and methods are the same."""
    paths: list[Path] = []
    panels = None
    for title, curves, stem in figures:
        rs, methods = sorted(curves["r"].unique().to_list()), sorted(curves["method"].unique().to_list())
        if panels is None or (panels.rs, panels.methods) != (rs, methods):
            panels = Panels(rs, methods, series, ylabel, labels, ylim)
        paths += _save(panels.draw(curves, title), stem, ("png",))
    return paths


def memorisation_curves(figures: list[tuple[str, pl.DataFrame, Path]], labels: dict[str, str]) -> list[Path]:
    """One PNG per (title, curves, stem): `curves` (bench.report.diagnostics) one row per (r, method, stage, x) of one
    dataset and noise, `title` naming them."""
    return _panel_figures([(f"{title}: what the network fits, epoch by epoch (mean over seeds)", curves, stem)
                           for title, curves, stem in figures], MEMORISATION, "accuracy (%)", labels, (-2, 102))


def detection_curves(figures: list[tuple[str, pl.DataFrame, Path]], labels: dict[str, str]) -> list[Path]:
    """As `memorisation_curves`, `curves` the rows of the methods that judge examples noisy (det_* columns set)."""
    return _panel_figures([(f"{title}: examples judged noisy against the true flips (mean over seeds)",
                            curves.filter(pl.col("stage") == "method"), stem) for title, curves, stem in figures],
                          DETECTION, "0 – 1", labels, (-0.02, 1.02))
