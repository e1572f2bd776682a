"""bench.report.plots: the curves' figures show every (r, method)'s curves whatever their panels drew before, pixel for
pixel as drawn the plain way (a fresh figure, matplotlib's shared axes, savefig's own tight crop), and every PNG is
cropped as savefig's "tight" crops it."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import matplotlib
import numpy as np
import polars as pl
import pytest
from matplotlib.figure import Figure

from bench.report import plots

LABELS = {"ce": "CE", "dmi": "L_DMI", "lccn": "LCCN"}
WARMUP = 2  # epochs 0 and 1 are the warm start, the method stage starts at x = 2


def made_up_curves(seed: int, rs: list[float], epochs: dict[str, int], left_out: tuple[float, str]) -> list[dict]:
    """Curves of a made-up grid, in shuffled order: per (r, method) `epochs[method]` epochs, random accuracies and
    detection scores, nothing flipped at r = 0 (null), a column null in one panel, the cell `left_out` not measured."""
    rng = np.random.default_rng(seed)
    rows = []
    for r, (method, n) in itertools.product(rs, epochs.items()):
        if (r, method) == left_out:
            continue
        for x in range(n):
            acc = [round(float(a), 2) for a in rng.uniform(0, 100, 4)]
            judged = [round(float(a), 3) for a in rng.uniform(0, 1, 4)]
            rows.append(dict(r=r, method=method, stage="warmup" if x < WARMUP else "method", x=x,
                             train_noisy_acc_flipped=None if r == 0 else acc[0], train_noisy_acc_kept=acc[1],
                             train_clean_acc=None if (r, method) == (rs[-1], "ce") else acc[2], test_acc=acc[3],
                             det_precision=judged[0], det_recall=judged[1], det_auroc=judged[2],
                             det_flagged=judged[3]))
    rng.shuffle(rows)
    return rows


def plain_figure(curves: pl.DataFrame, title: str, series: list, ylabel: str, ylim: tuple[float, float]) -> Figure:
    """The figure drawn the straightforward way: a panel per (r, method) of one fresh figure, matplotlib's shared
    axes, each panel's rows filtered out of the frame (the report drew its figures so until #56)."""
    rs, methods = sorted(curves["r"].unique().to_list()), sorted(curves["method"].unique().to_list())
    fig = Figure(figsize=(1.0 + 3.0 * len(methods), 0.8 + 2.3 * len(rs)))
    axes = fig.subplots(len(rs), len(methods), squeeze=False, sharex=True, sharey=True)
    for (i, r), (j, method) in itertools.product(enumerate(rs), enumerate(methods)):
        ax = axes[i][j]
        part = curves.filter((pl.col("r") == r) & (pl.col("method") == method)).sort("x")
        for column, label, color, style in series:
            y = part[column].fill_null(np.nan).to_numpy().astype(float)
            if not np.all(np.isnan(y)):
                ax.plot(part["x"].to_numpy(), y, style, color=color, lw=1.4, ms=3, label=label)
        if (start := part.filter(pl.col("stage") == "method")["x"].min()) is not None:
            ax.axvline(start, color="#888", ls=":", lw=1)
        ax.set_title(f"{LABELS[method]}, r = {r:g}", fontsize=9)
        ax.set_ylim(*ylim)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if i == len(rs) - 1:
            ax.set_xlabel("epoch (warm start, then method)", fontsize=8)
        if j == 0:
            ax.set_ylabel(ylabel, fontsize=8)
    drawn = {name: handle for ax in axes.flat for handle, name in zip(*ax.get_legend_handles_labels(), strict=True)}
    names = [label for _, label, _, _ in series if label in drawn]
    fig.legend([drawn[n] for n in names], names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=8,
               frameon=False)
    fig.suptitle(title, fontsize=10)
    return fig


GRIDS = [  # (seed, r, epochs per method, the cell left out): the second grid's figure reuses the first's panels
    (1, [0.0, 0.4], {"ce": 5, "dmi": 7, "lccn": 6}, (0.4, "lccn")),
    (2, [0.0, 0.4], {"ce": 4, "dmi": 3, "lccn": 9}, (0.0, "dmi")),
    (3, [0.2, 0.6, 0.8], {"ce": 6, "lccn": 5}, (0.8, "lccn")),
]


@pytest.mark.parametrize("kind", ["memorisation", "detection"])
def test_the_curves_figures_are_the_plain_ways_pixel_for_pixel(tmp_path: Path, kind: str) -> None:
    frames = [pl.DataFrame(made_up_curves(*grid)) for grid in GRIDS]
    draw = plots.memorisation_curves if kind == "memorisation" else plots.detection_curves
    written = draw([(f"grid {k}", frame, tmp_path / f"{kind}_{k}") for k, frame in enumerate(frames)], LABELS)
    assert [path.name for path in written] == [f"{kind}_{k}.png" for k in range(len(frames))]
    assert not list(tmp_path.glob("*.svg"))
    for k, frame in enumerate(frames):
        if kind == "memorisation":
            plain = plain_figure(frame, f"grid {k}: what the network fits, epoch by epoch (mean over seeds)",
                                 plots.MEMORISATION, "accuracy (%)", (-2, 102))
        else:
            plain = plain_figure(frame.filter(pl.col("stage") == "method"),
                                 f"grid {k}: examples judged noisy against the true flips (mean over seeds)",
                                 plots.DETECTION, "0 – 1", (-0.02, 1.02))
        plain.savefig(tmp_path / f"plain_{k}.png", format="png", dpi=120, bbox_inches="tight",
                      metadata={"Software": None})
        assert written[k].read_bytes() == (tmp_path / f"plain_{k}.png").read_bytes(), f"figure {k}"


def test_each_panel_holds_its_cells_curves_after_another_figure(tmp_path: Path) -> None:
    """The plotted arrays against the rows, read without polars: a panel drawn again holds only the new frame's
    lines (a cell measured before and left out now is empty), all panels share the rows' x range."""
    first, second = made_up_curves(*GRIDS[0]), made_up_curves(*GRIDS[1])
    panels = plots.Panels([0.0, 0.4], ["ce", "dmi", "lccn"], plots.MEMORISATION, "accuracy (%)", LABELS, (-2, 102))
    panels.draw(pl.DataFrame(first), "first")
    figure = panels.draw(pl.DataFrame(second), "second")
    assert figure.get_suptitle() == "second"
    lo, hi = min(row["x"] for row in second), max(row["x"] for row in second)
    margin = matplotlib.rcParams["axes.xmargin"] * (hi - lo)
    for (i, r), (j, method) in itertools.product(enumerate(panels.rs), enumerate(panels.methods)):
        ax = panels.axes[i][j]
        assert ax.get_title() == f"{LABELS[method]}, r = {r:g}"
        assert ax.get_ylim() == (-2, 102)
        assert ax.get_xlim() == pytest.approx((lo - margin, hi + margin), rel=1e-12)  # a few float operations
        rows = sorted((row for row in second if (row["r"], row["method"]) == (r, method)), key=lambda row: row["x"])
        lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
        expected = []
        for column, label, color, style in plots.MEMORISATION:
            y = [math.nan if row[column] is None else row[column] for row in rows]
            if rows and not all(math.isnan(v) for v in y):
                expected.append((label, [row["x"] for row in rows], y, matplotlib.colors.to_hex(color), style))
        assert [line.get_label() for line in lines] == [label for label, *_ in expected]
        for line, (_, x, y, color, style) in zip(lines, expected, strict=True):
            np.testing.assert_array_equal(line.get_xdata(), x)
            np.testing.assert_array_equal(line.get_ydata(), y)  # NaN where the row's value is null
            assert matplotlib.colors.to_hex(line.get_color()) == color
            assert line.get_linestyle() == {"-o": "-", "-": "-", "--": "--"}[style]
            assert line.get_marker() == ("o" if "o" in style else "None")
        starts = [line.get_xdata()[0] for line in ax.get_lines() if line.get_label().startswith("_")]
        assert starts == ([WARMUP] if rows else [])  # the dotted line where the method stage starts
    assert [t.get_text() for t in figure.legends[0].get_texts()] == [label for _, label, _, _ in plots.MEMORISATION]
    assert len(figure.legends) == 1


def test_a_png_is_cropped_as_savefigs_tight_crops_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The single-plot figures (auto-placed titles, a legend at its best place, a colour bar) through `_png_crop`
    and through savefig's own "tight"."""
    grid = pl.DataFrame([dict(method=m, r=r, acc_mean=90 - 100 * r * (1 + k), acc_std=1.0 + k)
                         for k, m in enumerate(("ce", "dmi", "lccn")) for r in (0.0, 0.2, 0.4)])
    comparison = grid.select("method", "r", dataset=pl.lit("mr"), diff=pl.col("acc_std") - 2.5,
                             flag=pl.col("r") > 0.3)

    def draw(folder: Path) -> list[bytes]:
        paths = plots.accuracy_vs_r(grid, "mr", "pos_to_neg", ["ce", "dmi", "lccn"], LABELS, folder / "acc")
        paths += plots.paper_heatmap(comparison, folder / "heat", LABELS)
        return [path.read_bytes() for path in paths if path.suffix == ".png"]

    ours = draw(tmp_path / "ours")
    monkeypatch.setattr(plots, "_png_crop", lambda fig: "tight")
    assert ours == draw(tmp_path / "tight") and len(ours) == 2


def test_a_figure_written_twice_is_the_same_bytes_in_every_format(tmp_path: Path) -> None:
    """A report rebuilt from the same rows changes no file: the SVG's element ids (random per save unless salted) and
    both formats' dates are fixed, so a folder of figures under version control or a checksum shows no change."""
    grid = pl.DataFrame({"method": ["ce", "ce", "dmi", "dmi"], "r": [0.0, 0.4, 0.0, 0.4],
                         "acc_mean": [90.0, 70.0, 91.0, 85.0], "acc_std": [0.5, 1.0, 0.4, None]})
    first, second = (plots.accuracy_vs_r(grid, "synthetic", "case3", ["ce", "dmi"], LABELS, tmp_path / name / "acc")
                     for name in ("a", "b"))
    assert [p.suffix for p in first] == [".png", ".svg"]
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name
