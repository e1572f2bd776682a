"""bench report / bench leaderboard: selection on noisy validation loss, statistics, paired tests, paper table,
outputs (Markdown, LaTeX, CSV, HTML, plots) and the command line, on small hand-made result folders."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

from bench.cli import main as cli
from bench.report import analysis, statistics
from bench.report import leaderboard as report
from bench.report.build import build_report
from bench.store.rows import write_trial

SOURCE_CSV = Path(__file__).resolve().parents[2] / ".." / "shared" / "paper" / "reference_results.csv"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_row(method: str, r: float, seed: int, val_loss: float | None, test_acc: float | None,
             last: float | None = None, lr: float = 1e-4, status: str = "ok", dataset: str = "mr",
             noise: str = "pos_to_neg", params: str = "{}") -> dict:
    """A result row with the real columns (bench.store.rows.make_row's names), numbers chosen by the test."""
    config = dict(dataset=dataset, method=method, noise=noise, r=r, seed=seed, lr=lr, method_params=params)
    trial_id = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    failed = status == "failed"
    return dict(
        trial_id=trial_id, experiment="test", dataset=dataset, model="wordcnn", method=method, noise=noise,
        r=float(r), seed=seed, lr=lr, batch_size=128, status=status, best_epoch=None if failed else 3,
        val_loss=val_loss, test_acc=test_acc, test_bal_acc=test_acc,
        last_test_acc=test_acc if last is None else last, noise_rate=r / 2,
        noise_hash=f"{dataset}-{noise}-{r}-{seed}", wall_s=1.5, device="cpu (x86_64)", git_commit="abc123def456",
        torch_version="2.14.1", epochs=5, epochs_warmup=3, method_params=params, train_subset=None,
        privileged=method == "fw_oracle", error="boom" if failed else "", python_version="3.11.7",
        numpy_version="2.4.6", host="test", config_json=json.dumps(config),
    )


def write(results: Path, rows: list[dict]) -> Path:
    for row in rows:
        write_trial(results, row, [dict(stage="method", epoch=1, train_loss=1.0, val_loss=row["val_loss"],
                                        val_acc=50.0, seconds=0.1)])
    return results


def cell(grid: pl.DataFrame, method: str, r: float) -> dict:
    rows = grid.filter(method=method, r=r).to_dicts()
    assert len(rows) == 1
    return rows[0]


# Two settings of CE at r=0.2: lr 1e-4 has the lower mean validation loss (0.6 < 0.9) and is selected.
GRID_ROWS = [
    make_row("ce", 0.2, 0, 0.5, 70.0, last=69.0),
    make_row("ce", 0.2, 1, 0.7, 72.0, last=71.0),
    make_row("ce", 0.2, 2, 0.6, 74.0, last=76.0),
    make_row("ce", 0.2, 3, None, None, status="failed"),
    make_row("ce", 0.2, 0, 0.8, 80.0, lr=1e-3),
    make_row("ce", 0.2, 1, 0.9, 80.0, lr=1e-3),
    make_row("ce", 0.2, 2, 1.0, 80.0, lr=1e-3),
    make_row("dmi", 0.2, 0, 1.1, 67.0),
    make_row("dmi", 0.2, 1, 1.2, 68.0, status="diverged"),
    make_row("dmi", 0.2, 2, 1.3, 67.5),
    make_row("ce", 0.4, 0, 0.9, 55.0),
    make_row("ce", 0.4, 1, 0.9, 57.0),
]


@pytest.fixture()
def results(tmp_path: Path) -> Path:
    return write(tmp_path / "results", GRID_ROWS)


def test_aggregation_matches_hand_computed_values(results: Path) -> None:
    df = analysis.load_trials(results)
    grid = analysis.aggregate(df)
    ce = cell(grid, "ce", 0.2)
    assert ce["lr"] == 1e-4 and ce["n"] == 3 and ce["settings_tried"] == 2
    assert ce["acc_mean"] == pytest.approx(72.0)
    assert ce["acc_std"] == pytest.approx(2.0)  # sample std of 70, 72, 74
    # 95% t-interval: t(0.975, df=2) = 4.3027 (tables); half-width 4.3027 * 2 / sqrt(3) = 4.9683. The table's
    # 5 digits (5e-5 x 2 / sqrt(3)) and the 4 decimals here (5e-5) bound the difference: 1.1e-4.
    assert ce["acc_ci_low"] == pytest.approx(67.0317, abs=1.1e-4)
    assert ce["acc_ci_high"] == pytest.approx(76.9683, abs=1.1e-4)
    assert ce["last_mean"] == pytest.approx(72.0)
    assert ce["last_std"] == pytest.approx(math.sqrt(13.0))  # deviations -3, -1, 4 -> 26 / 2
    assert ce["val_loss_mean"] == pytest.approx(0.6)
    assert (ce["trials"], ce["ok"], ce["diverged"], ce["failed"]) == (7, 6, 0, 1)
    assert ce["seeds"] == "0,1,2"
    dmi = cell(grid, "dmi", 0.2)  # the diverged trial kept its best checkpoint: it counts, and is counted
    assert (dmi["n"], dmi["diverged"]) == (3, 1)
    assert dmi["acc_mean"] == pytest.approx(67.5) and dmi["acc_std"] == pytest.approx(0.5)
    # Partial results: DMI never ran at r=0.4, the cell is in the grid as missing.
    missing = cell(grid, "dmi", 0.4)
    assert missing["n"] == 0 and missing["acc_mean"] is None and missing["trials"] == 0
    one = cell(grid, "ce", 0.4)
    # Two seeds: no t-interval (t(0.975, 1) = 12.7 makes it span most of [0, 100]; the report says so instead).
    assert one["acc_mean"] == pytest.approx(56.0) and one["acc_ci_low"] is None and one["acc_ci_high"] is None
    assert grid.height == 4 and grid["method"].to_list() == ["ce", "dmi", "ce", "dmi"]


def test_selection_uses_mean_validation_loss_never_test_accuracy(tmp_path: Path) -> None:
    # Setting A (lr 1e-4): mean val loss 0.5, poor test accuracy. Setting B (lr 1e-3): the single lowest val
    # loss (0.1) but a higher mean (0.8), and far better test accuracy. The paper's rule picks A.
    rows = [make_row("ce", 0.3, s, 0.5, 60.0 + s, lr=1e-4) for s in (0, 1)]
    rows += [make_row("ce", 0.3, 0, 0.1, 95.0, lr=1e-3), make_row("ce", 0.3, 1, 1.5, 96.0, lr=1e-3)]
    df = analysis.load_trials(write(tmp_path / "res", rows))
    selected = analysis.select_settings(df)
    assert selected.height == 1 and selected["sel_val_loss"][0] == pytest.approx(0.5)
    ce = cell(analysis.aggregate(df), "ce", 0.3)
    assert ce["lr"] == 1e-4 and ce["acc_mean"] == pytest.approx(60.5)
    # Whatever the test accuracies are, the choice does not move.
    rng = np.random.default_rng(0)
    for _ in range(5):
        scrambled = df.with_columns(pl.Series("test_acc", rng.uniform(0, 100, df.height)),
                                    pl.Series("last_test_acc", rng.uniform(0, 100, df.height)))
        assert analysis.select_settings(scrambled).equals(selected)


def test_paired_tests_match_scipy(tmp_path: Path) -> None:
    dmi6 = [80.0, 81.5, 79.0, 82.0, 80.5, 83.0]
    ce6 = [70.0, 82.0, 71.0, 74.0, 75.5, 76.0]
    dmi3, ce3 = [60.0, 61.0, 63.5], [58.0, 60.5, 61.0]
    rows = [make_row("dmi", 0.5, s, 1.0, a) for s, a in enumerate(dmi6)]
    rows += [make_row("ce", 0.5, s, 1.0, b) for s, b in enumerate(ce6)]
    rows.append(make_row("ce", 0.5, 9, 1.0, 10.0))  # no DMI partner for seed 9: not paired
    rows += [make_row("dmi", 0.6, s, 1.0, a) for s, a in enumerate(dmi3)]
    rows += [make_row("ce", 0.6, s, 1.0, b) for s, b in enumerate(ce3)]
    rows += [make_row("dmi", 0.7, 0, 1.0, 50.0), make_row("ce", 0.7, 0, 1.0, 40.0)]  # one pair: untested
    rows.append(make_row("gce", 0.7, 0, 1.0, 40.0, dataset="fashion_mnist", noise="case1"))  # no DMI there
    df = analysis.load_trials(write(tmp_path / "res", rows))
    paired = analysis.paired_comparison(df, analysis.aggregate(df))
    by = {(p["dataset"], p["r"], p["method"]): p for p in paired.iter_rows(named=True)}

    w = by[("mr", 0.5, "ce")]
    expected = stats.wilcoxon(np.array(dmi6), np.array(ce6)).pvalue
    assert (w["test"], w["pairs"]) == ("wilcoxon", 6) and w["p"] == pytest.approx(expected)
    assert w["mean_diff"] == pytest.approx(np.mean(np.array(dmi6) - np.array(ce6)))
    assert w["same_noisy_labels"] is True
    t = by[("mr", 0.6, "ce")]
    expected = stats.ttest_rel(np.array(dmi3), np.array(ce3)).pvalue
    assert (t["test"], t["pairs"]) == ("paired t", 3) and t["p"] == pytest.approx(expected)
    assert by[("mr", 0.7, "ce")]["outcome"] == "untested"
    assert by[("fashion_mnist", 0.7, "gce")]["outcome"] == "missing"

    def outcome(p: float, diff: float) -> str:
        return "tie" if p >= 0.05 else "win" if diff > 0 else "loss"

    assert w["outcome"] == outcome(w["p"], w["mean_diff"]) and t["outcome"] == outcome(t["p"], t["mean_diff"])
    assert w["marker"] == statistics.marker(w["p"])
    wtl = analysis.win_tie_loss(paired).filter(dataset="mr", method="ce").to_dicts()[0]
    counts = [w["outcome"], t["outcome"], "untested"]
    assert [wtl[k] for k in ("win", "tie", "loss", "untested", "missing")] == [
        counts.count(k) for k in ("win", "tie", "loss", "untested", "missing")]


def test_paired_test_edge_cases() -> None:
    assert statistics.paired_test(np.array([1.0]), np.array([0.0])) == ("none", None)
    assert statistics.paired_test(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == ("paired t", 1.0)
    assert statistics.marker(0.0004) == "***" and statistics.marker(0.004) == "**" and statistics.marker(0.04) == "*"
    assert statistics.marker(0.5) == "" and statistics.marker(None) == ""


def test_packaged_paper_table_round_trips() -> None:
    packaged = Path(analysis.__file__).with_name("reference_results.csv")
    if SOURCE_CSV.exists():
        assert packaged.read_bytes() == SOURCE_CSV.read_bytes()
    with packaged.open(newline="", encoding="utf-8") as f:
        source = list(csv.DictReader(f))
    table = analysis.read_reference()
    assert table.height == len(source) == 207
    for row, got in zip(source, table.iter_rows(named=True), strict=True):
        assert got["dataset"] == row["dataset"] and got["method"] == row["method"]
        assert got["noise_r"] == (float(row["noise_r"]) if row["noise_r"] else None)
        assert got["acc_mean"] == float(row["acc_mean"])
        assert got["acc_std"] == (float(row["acc_std"]) if row["acc_std"] else None)
    spot = table.filter(dataset="cifar10", method="dmi", noise_r=0.9).to_dicts()[0]
    assert (spot["acc_mean"], spot["acc_std"]) == (85.94, 0.74)
    cloth = table.filter(dataset="clothing1m", method="dmi").to_dicts()[0]
    assert cloth["acc_mean"] == 72.46 and cloth["noise_r"] is None and cloth["acc_std"] is None


def test_paper_vs_measured(results: Path) -> None:
    grid = analysis.aggregate(analysis.load_trials(results))
    comparison = analysis.paper_comparison(grid)
    assert set(comparison["dataset"]) == {"mr"} and comparison.height == 60  # every published MR row stays
    ce = comparison.filter(method="ce", r=0.2).to_dicts()[0]  # paper 67.12 +- 1.19, ours 72 +- 2
    assert ce["diff"] == pytest.approx(72.0 - 67.12)
    assert ce["combined_std"] == pytest.approx(math.sqrt(2.0**2 + 1.19**2)) and ce["flag"] is True
    dmi = comparison.filter(method="dmi", r=0.2).to_dicts()[0]  # paper 67.44 +- 1.22, ours 67.5 +- 0.5
    assert dmi["diff"] == pytest.approx(0.06) and dmi["flag"] is False
    unmeasured = comparison.filter(method="lccn", r=0.2).to_dicts()[0]
    assert unmeasured["ours_mean"] is None and unmeasured["diff"] is None and unmeasured["ours_n"] == 0


class Page(HTMLParser):
    """A report page read back: every table cell's text, the images' sources, any address outside the page, and each
    <h2> section's title with its count of tables and images."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.cells: list[str] = []
        self.imgs: list[str] = []
        self.external: list[str] = []
        self.sections: list[dict] = []
        self._in: str | None = None
        self._text: list[str] = []
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag in ("h2", "td"):
            self._in, self._text = tag, []
        if tag == "h2":
            self.sections.append({"title": "", "tables": 0, "images": 0})
        elif tag == "table" and self.sections:
            self.sections[-1]["tables"] += 1
        elif tag == "img":
            self.imgs.append(a.get("src") or "")
            if self.sections:
                self.sections[-1]["images"] += 1
        for key in ("src", "href"):
            if a.get(key) and not a[key].startswith("data:"):
                self.external.append(a[key])
        if tag == "link":
            self.external.append(str(a))

    def handle_data(self, data: str) -> None:
        if self._in:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in == "h2":
            self.sections[-1]["title"] = "".join(self._text)
        elif tag == self._in == "td":
            self.cells.append("".join(self._text))
        if tag == self._in:
            self._in = None


def test_report_outputs_html_every_cell_and_plots(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    written = build_report(results, out, log=lambda s: None)
    page = written["report.html"].read_text(encoding="utf-8")
    parser = Page(page)
    assert not parser.external and "<script>" in page and "<style>" in page
    assert len(parser.imgs) == 2 and all(s.startswith("data:image/png;base64,") for s in parser.imgs)
    df = analysis.load_trials(results)
    grid = analysis.aggregate(df)
    tabs = report.tables(grid, analysis.paired_comparison(df, grid))
    expected = [e.text + (f" {e.marker}" if e.marker else "") for t in tabs for e in t.entries.values()]
    assert len(expected) == grid.height == 4
    for text in expected:
        assert text in parser.cells
    assert "72.00 ± 2.00 *" in parser.cells and analysis.MISSING in parser.cells
    assert "sortable" in page and "abc123def456" in page and "boom" in page  # provenance, failed trial shown

    for stem in ("plots/accuracy_vs_r_mr_pos_to_neg", "plots/paper_difference"):
        png, svg = out / f"{stem}.png", out / f"{stem}.svg"
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 1000
        assert ET.parse(svg).getroot().tag.endswith("svg")

    md = written["leaderboard.md"].read_text(encoding="utf-8")
    table = [line for line in md.splitlines() if line.startswith("| 0.")][:2]
    assert table == ["| 0.2 | **72.00 ± 2.00** * | 67.50 ± 0.50 |",  # hand-computed paired t: p = 0.0496
                     f"| 0.4 | **56.00 ± 1.41 (n=2)** | {analysis.MISSING} |"]
    tex = written["leaderboard.tex"].read_text(encoding="utf-8")
    assert all(k in tex for k in (r"\toprule", r"\midrule", r"\bottomrule", r"\textbf{56.00 $\pm$ 1.41 (n=2)}"))
    assert "0.4 & " in tex and " & --" in tex
    cells = pl.read_csv(written["cells csv"])
    assert cells.height == 4 and cells.filter(method="ce", r=0.2)["acc_mean"][0] == pytest.approx(72.0)


def test_cli_report_and_leaderboard(results: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    main = cli.main

    out = tmp_path / "cli_out"
    assert main(["report", str(results), "--out", str(out)]) == 0
    for name in ("leaderboard.md", "leaderboard.tex", "report.html", "cells.csv", "paired.csv",
                 "win_tie_loss.csv", "paper_vs_measured.csv", "plots/paper_difference.svg"):
        assert (out / name).stat().st_size > 0
    assert main(["report", str(results)]) == 0 and (results / "report" / "report.html").exists()
    capsys.readouterr()
    assert main(["leaderboard", str(results)]) == 0
    text = capsys.readouterr().out
    assert "mr · pos_to_neg" in text and "72.00 ± 2.00" in text and analysis.MISSING in text
    assert main(["report", str(tmp_path / "no_such_folder")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["leaderboard", str(tmp_path / "empty")]) == 2
    assert "no result rows" in capsys.readouterr().err


def test_all_failed_cells_and_privileged_methods(tmp_path: Path) -> None:
    rows = [make_row("ce", 0.2, 0, None, None, status="failed"), make_row("dmi", 0.2, 0, None, None, status="failed")]
    rows += [make_row("fw_oracle", 0.4, s, 0.5, 99.0) for s in (0, 1)]  # privileged: flagged, never "best"
    rows += [make_row("dmi", 0.4, s, 0.5, 80.0 + s) for s in (0, 1)]
    df = analysis.load_trials(write(tmp_path / "res", rows))
    grid = analysis.aggregate(df)
    assert grid.height == 6  # 3 methods x 2 noise levels, nothing dropped
    failed = cell(grid, "ce", 0.2)
    assert (failed["n"], failed["failed"], failed["acc_mean"]) == (0, 1, None)
    paired = analysis.paired_comparison(df, grid)
    (table,) = report.tables(grid, paired)
    assert table.entries[(0.2, "dmi")].text == f"{analysis.MISSING} (1 failed)"
    assert table.entries[(0.4, "dmi")].best and not table.entries[(0.4, "fw_oracle")].best
    assert cell(grid, "fw_oracle", 0.4)["privileged"] is True
    md = report.to_markdown([table], analysis.win_tie_loss(paired), analysis.paper_comparison(grid), "")
    # A method's label is its Method.title up to any parenthesis.
    assert "FW with the true T †" in md and "| 0.4 | — | 99.00 ± 0.00 * | **80.50 ± 0.71** |" in md


def test_the_caption_explains_only_the_marks_its_tables_show(results: Path, tmp_path: Path) -> None:
    """#55: every caption explained the Dogs vs Cats oracle mark (and †) where neither could appear."""
    md = build_report(results, tmp_path / "plain", log=lambda s: None)["leaderboard.md"].read_text(encoding="utf-8")
    caption = md.splitlines()[2]
    assert "paired test against L_DMI" in caption and f"{analysis.MISSING}: no usable trial" in caption  # shown
    assert "Dogs vs Cats" not in md and "†" not in md and "‡" not in md and "[k/m missing]" not in md
    rows = [make_row("lccn", 0.2, s, 0.5, 60.0) | dict(oracle=True) for s in (0, 1)]
    rows += [make_row("fw_oracle", 0.2, s, 0.5, 99.0) for s in (0, 1)]
    marked = build_report(write(tmp_path / "marked", rows), tmp_path / "out", log=lambda s: None)
    caption = marked["leaderboard.md"].read_text(encoding="utf-8").splitlines()[2]
    assert "‡ oracle" in caption and "Dogs vs Cats" in caption and "† privileged" in caption
    assert "paired test" not in caption and analysis.MISSING not in caption  # no L_DMI here, every cell measured


def test_run_summary_and_report_select_by_the_same_rule(tmp_path, capsys):
    """Two settings x two seeds where per-seed selection (seed 0 -> lr 1e-3 at 80%, seed 1 -> lr 1e-4 at 70%:
    75.0) and per-cell selection (lowest mean validation loss: lr 1e-4, 70.0) disagree: the summary that
    `bench run` prints, `bench report` and `bench leaderboard` all say 70.0."""
    from types import SimpleNamespace

    from bench.grid.plan import Plan
    from bench.grid.progress import Tally, print_summary
    from bench.report.analysis import aggregate, load_trials
    from bench.store.columns import Outcome
    from bench.store.rows import make_row, write_trial
    from bench.trial import TrialConfig

    trials = []
    for lr, seed, val_loss, acc in ((1e-3, 0, 1.0, 80.0), (1e-3, 1, 3.0, 60.0), (1e-4, 0, 1.5, 70.0),
                                    (1e-4, 1, 1.6, 70.0)):
        config = TrialConfig("synthetic", "dmi", "case3", 0.4, seed=seed, lr=lr, experiment="sel")
        outcome = Outcome(status="ok", best_epoch=1, val_loss=val_loss, test_acc=acc, test_bal_acc=acc,
                          last_test_acc=acc, last_test_bal_acc=acc, warmup_test_acc=50.0, warmup_s=1.0, method_s=1.0,
                          estimated_transition=None, confusion=None, epochs=[])
        write_trial(tmp_path, make_row(config, "mlp", None, outcome, 1.0, lr, 128, 2, 2), [])
        trials.append(config)
    grid = aggregate(load_trials(tmp_path))
    assert grid["acc_mean"].to_list() == [70.0]
    lines: list[str] = []
    exp = SimpleNamespace(name="sel")
    print_summary(exp, Plan(experiment=exp, trials=trials, results=str(tmp_path)), Tally(total=4), None,
                  lines.append)
    table = "\n".join(lines[lines.index(next(x for x in lines if x.startswith("clean test accuracy"))):])
    assert "70.0" in table and "75.0" not in table
    assert "┆ L_DMI │" in table and "dmi" not in table  # the method by its label, as every other output names it
    capsys.readouterr()
    assert cli.main(["leaderboard", str(tmp_path)]) == 0
    board = capsys.readouterr().out
    assert "70.00 ± 0.00" in board and "75.0" not in board


def test_transition_estimates_are_scored_against_the_true_t(tmp_path: Path) -> None:
    """Relative error ||T^ - T||_1 / ||T||_1 per trial against the noise model's T (or, for human noise, the
    empirical T), mean ± std over the seeds of the selected setting, beside their accuracy; methods without an
    estimate and unselected settings are left out."""
    t = [[1.0, 0.0], [0.3, 0.7]]
    est = {0: [[0.9, 0.1], [0.3, 0.7]], 1: [[1.0, 0.0], [0.1, 0.9]]}  # errors 0.2 / 2 and 0.4 / 2

    def with_t(row: dict, estimate: list | None, truth: list | None = t, empirical: list | None = None) -> dict:
        return row | dict(transition=None if truth is None else json.dumps(truth),
                          empirical_transition=None if empirical is None else json.dumps(empirical),
                          estimated_transition=None if estimate is None else json.dumps(estimate))

    rows = [with_t(make_row("fw", 0.3, s, 0.5, 80.0 + s, last=70.0), est[s]) for s in (0, 1)]
    rows.append(with_t(make_row("fw", 0.3, 0, 0.9, 50.0, lr=1e-3), [[0.5, 0.5], [0.5, 0.5]]))  # not selected
    rows.append(with_t(make_row("ce", 0.3, 0, 0.4, 60.0), None))
    human = [[0.8, 0.2], [0.1, 0.9]]
    rows.append(with_t(make_row("lccn", 0.0, 0, 0.5, 75.0, noise="aggre"), [[0.8, 0.2], [0.2, 0.8]],
                       truth=None, empirical=human))
    results = write(tmp_path / "results", rows)
    frame = analysis.transition_estimates(analysis.load_trials(results))
    assert set(frame["method"]) == {"fw", "lccn"}
    fw = frame.filter(method="fw").to_dicts()[0]
    errors = [0.2 / 2.0, 0.4 / 2.0]
    assert fw["n"] == 2 and fw["truth"] == "noise model"
    assert fw["err_mean"] == pytest.approx(np.mean(errors))
    assert fw["err_std"] == pytest.approx(np.std(errors, ddof=1))
    assert fw["acc_mean"] == pytest.approx(80.5) and fw["last_mean"] == pytest.approx(70.0)
    assert np.array(json.loads(fw["t_hat_mean"])) == pytest.approx(np.array([[0.95, 0.05], [0.2, 0.8]]))
    lccn = frame.filter(method="lccn").to_dicts()[0]
    assert lccn["truth"] == "empirical" and lccn["err_mean"] == pytest.approx(0.2 / 2.0)
    written = build_report(results, tmp_path / "out", log=lambda s: None)
    markdown = written["leaderboard.md"].read_text()
    assert "## Transition-matrix estimates" in markdown and "0.150 ± 0.071" in markdown
    assert "Transition-matrix estimates" in written["report.html"].read_text()
    assert written["transition_estimates csv"].exists()


def test_a_cell_of_several_float_orders_is_named_in_the_report(tmp_path: Path) -> None:
    """Issue #53: the leaderboard's first line says what computed the trials (numerics, threads, kernels); the seeds of
    one cell computed with other kernels (ATen's AVX-512 and the portable AVX2) are not one computation: it warns,
    naming the cell and its float orders; one float order in every cell gives no warning."""
    from bench.report.build import terminal_leaderboard

    rows = [make_row(m, 0.4, s, 0.5, 60.0 + s) for m in ("ce", "dmi") for s in (0, 1)]
    for row in rows:
        row.update(numerics="portable", threads=1, cpu_capability="AVX2")
    write(tmp_path / "one", rows)
    one = " ".join(terminal_leaderboard(str(tmp_path / "one")).split())
    assert "Float order (numerics/threads/kernels): portable/1/AVX2." in one and "Warning" not in one
    rows[1].update(numerics="native", cpu_capability="AVX512")
    write(tmp_path / "mixed", rows)
    text = terminal_leaderboard(str(tmp_path / "mixed"))
    assert ("Float order (numerics/threads/kernels): native/1/AVX512 (1 trials), portable/1/AVX2 (3 trials). Warning: "
            "1 cell mixes float orders (mr pos_to_neg r=0.4 ce: native/1/AVX512, portable/1/AVX2)"
            ) in " ".join(text.split())
