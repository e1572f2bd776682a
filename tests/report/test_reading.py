"""What a reader of `bench report` / `bench leaderboard` is told (issue 44): a caption that names the metric shown, a
warm start's cost shared by the trials that use it, the winning hyper-parameters, no empty panel, one name per
method, whole numbers printed whole, on small hand-made results folders in the real formats."""

from __future__ import annotations

import html
import random
import re
from pathlib import Path

import polars as pl
import pytest

from bench.cli import main as cli
from bench.report import analysis
from bench.report.build import build_report
from bench.report.diagnostics import COST_NOTE
from bench.store.rows import write_trial
from tests.report.test_report import GRID_ROWS, Page, make_row, write


def test_the_leaderboard_caption_follows_the_metric(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    results = write(tmp_path / "results", GRID_ROWS)
    assert cli.main(["leaderboard", str(results), "--metric", "last"]) == 0
    last = capsys.readouterr().out
    assert cli.main(["leaderboard", str(results)]) == 0
    selected = capsys.readouterr().out
    # CE at r = 0.2, lr 1e-4 (selected on validation loss): last epochs 69, 71, 76 -> 72.00 ± sqrt(13) = 3.61; the
    # selected checkpoints 70, 72, 74 -> 72.00 ± 2.00.
    assert "72.00 ± 3.61" in last and "72.00 ± 2.00" not in last
    assert "72.00 ± 2.00" in selected and "72.00 ± 3.61" not in selected
    assert "at the last epoch trained" in last and "selected on the noisy validation set" not in last
    assert "at the checkpoint selected on the noisy validation set" in selected and "last epoch" not in selected
    # Which setting the numbers are of, in both.
    for text in (last, selected):
        assert "CE: lr 0.0001, batch 128 at every r (of 2 settings tried)" in text


def _warm_rows(rng: random.Random) -> list[dict]:
    """Trials of two r x two seeds, CE and two L_DMI settings each, one of them trains the cell's warm start (long
    warmup_s), the others load it (short); and one trial with another warm-start schedule, which shares nothing."""
    rows = []
    for r in (0.2, 0.4):
        for seed in (0, 1):
            trainer = rng.randrange(3)
            for i, (method, lr) in enumerate((("ce", 1e-4), ("dmi", 1e-4), ("dmi", 1e-5))):
                row = make_row(method, r, seed, 0.5 + lr * 1000, 70.0 + seed, lr=lr)
                warm = rng.uniform(5.0, 9.0) if i == trainer else rng.uniform(0.01, 0.2)
                method_s = rng.uniform(1.0, 2.0)
                row.update(warmup_s=warm, method_s=method_s, device_s=warm + method_s + rng.uniform(0.0, 0.1),
                           wall_s=warm + method_s + 0.5)
                rows.append(row)
    other = make_row("ce", 0.2, 0, 0.4, 71.0, lr=1e-3)  # selected at (0.2, ce): lowest validation loss
    other.update(epochs_warmup=7, warmup_s=6.0, method_s=1.0, device_s=7.2, wall_s=7.5)
    return rows + [other]


def test_the_cost_panel_shares_a_warm_start_across_its_trials(tmp_path: Path) -> None:
    rows = _warm_rows(random.Random(44))
    results = write(tmp_path / "results", rows)
    out = tmp_path / "out"
    written = build_report(results, out, log=lambda s: None)
    cost = pl.read_csv(written["cost csv"])
    # Independently: a warm start is one (r, seed, epochs_warmup) here (dataset, noise, model, labels alike).
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["r"], row["seed"], row["epochs_warmup"]), []).append(row)
    shared = {}
    for members in groups.values():
        share = sum(m["warmup_s"] for m in members) / len(members)
        for m in members:
            shared[m["trial_id"]] = m["device_s"] - m["warmup_s"] + share
    # Splitting moves seconds between trials, never adds or drops any.
    assert sum(shared.values()) == pytest.approx(sum(r["device_s"] for r in rows), rel=1e-12)
    # The selected setting per cell: lowest validation loss (ce at 0.2: the epochs_warmup=7 trial at seed 0 only;
    # elsewhere lr 1e-4).
    def chosen(method: str, r: float) -> list[dict]:
        cell = [x for x in rows if x["method"] == method and x["r"] == r]
        best = min(x["val_loss"] for x in cell)
        return [x for x in cell if x["val_loss"] == best]

    for method in ("ce", "dmi"):
        for r in (0.2, 0.4):
            trials = chosen(method, r)
            expected = sum(shared[t["trial_id"]] for t in trials) / len(trials)
            got = cost.filter(method=method, r=r)
            assert got["device_s_mean"][0] == pytest.approx(expected, rel=1e-9), (method, r)
            assert got["acc_per_device_hour"][0] == pytest.approx(
                sum(t["test_acc"] for t in trials) / len(trials) / (expected / 3600), rel=1e-9)
    # The trial alone with its warm start keeps all of it; CE, which trained some warm starts, is not charged them.
    other = rows[-1]
    assert shared[other["trial_id"]] == pytest.approx(other["device_s"])
    ce = cost.filter(method="ce", r=0.4)["device_s_mean"][0]
    dmi = cost.filter(method="dmi", r=0.4)["device_s_mean"][0]
    assert abs(ce - dmi) < 2.0  # both carry a third of a 5-9 s warm start and 1-2 s of their own
    assert "split evenly over all the trials that use it" in COST_NOTE
    assert "split evenly" in written["report.html"].read_text(encoding="utf-8")


def demo_results(folder: Path) -> Path:
    """Rows shaped like the README's demo (`tune_configs/demo.yaml`): Fashion-MNIST case 3, CE and L_DMI, four r, two
    seeds, each trial with its warm-start and method-stage epochs and their diagnostics."""
    for r in (0.0, 0.3, 0.6, 0.8):
        for seed in (0, 1):
            for method in ("ce", "dmi"):
                row = make_row(method, r, seed, 0.5 + r, 90.0 - 40.0 * r * (method == "ce") + seed,
                               dataset="fashion_mnist", noise="case3")
                row.update(model="fmnist_cnn", warmup_s=8.0 if method == "ce" else 0.1, method_s=2.0, wall_s=10.5,
                           device_s=10.0, networks=1, epochs_trained=13, train_subset=20000, epochs=8,
                           epochs_warmup=5)
                curve = dict(train_loss=1.0, val_acc=50.0, seconds=0.1, train_clean_acc=80.0,
                             train_noisy_acc_flipped=10.0, train_noisy_acc_kept=90.0)
                epochs = [dict(stage="warmup", epoch=e, val_loss=1.0, test_acc=80.0, **curve) for e in range(1, 6)]
                epochs += [dict(stage="method", epoch=e, val_loss=row["val_loss"] + (e - seed - 2) ** 2,
                                test_acc=row["test_acc"] - abs(e - 3), **curve) for e in range(9)]
                write_trial(folder, row, epochs)
    return folder


def test_the_demos_report_has_no_empty_panel_and_one_name_per_method(tmp_path: Path) -> None:
    results = demo_results(tmp_path / "results")
    written = build_report(results, tmp_path / "out", log=lambda s: None)
    page = written["report.html"].read_text(encoding="utf-8")
    parser = Page(page)
    titles = [s["title"] for s in parser.sections]
    assert "fashion_mnist · case3" in titles and "Cost" in titles
    for section in parser.sections:  # every heading heads something to read
        assert section["tables"] or section["images"], section["title"]
    # The demo's dataset has no published table: that section and its figure are left out, with one line why, which
    # names the paper's tables and the literature's apart.
    assert not any("measured" in t for t in titles) and "plot heatmap" not in written
    why = html.unescape(re.search(r"Published results vs measured: left out[^<]*", page).group(0))
    paper = why[why.index("the paper's tables cover"):why.index("; the literature's")]
    literature = why[why.index("the literature's"):]
    assert "mr" in paper and "webvision_mini" not in paper
    assert "webvision_mini" in literature and "mr," not in literature
    md = written["leaderboard.md"].read_text(encoding="utf-8")
    blocks = re.split(r"^## ", md, flags=re.M)[1:]
    assert blocks and all("|---|" in b for b in blocks), [b.splitlines()[0] for b in blocks if "|---|" not in b]
    # One display name per method: the labels, never the registry's names, in every table of the page.
    assert {"CE", "L_DMI"} <= set(parser.cells) and not {"ce", "dmi"} & set(parser.cells)
    assert not re.search(r"\| (ce|dmi) \|", md)
    # The winning hyper-parameters under the headline table.
    assert "Hyper-parameters selected (lowest mean noisy-validation loss): CE: lr 0.0001, batch 128 at every r" in page
    # Whole numbers print whole: every selected epoch here is seed + 2, so the means over seeds 0 and 1 are 2.5, and
    # the best test epoch is 3 for every trial.
    rules = re.search(r"<h2>Checkpoint selection.*?</table>", page, re.S).group(0)
    assert ">2.5<" in rules and ">3<" in rules and ">3.0<" not in rules
    assert re.search(r"table\{[^}]*overflow-x:auto", page)  # wide tables scroll inside the page


def test_the_published_comparison_says_whose_table_each_row_is(tmp_path: Path) -> None:
    results = write(tmp_path / "results", GRID_ROWS)  # MR: a dataset of the paper's tables
    comparison = analysis.paper_comparison(analysis.aggregate(analysis.load_trials(results)))
    assert set(comparison["published_by"].to_list()) == {analysis.PAPER}
    written = build_report(results, tmp_path / "out", log=lambda s: None)
    page = written["report.html"].read_text(encoding="utf-8")
    assert "<h2>Published results vs measured</h2>" in page and "plot heatmap" in written
    assert "<td class=\"l\" title=\"appendix table" in page  # the paper's own table, cited on the cell
