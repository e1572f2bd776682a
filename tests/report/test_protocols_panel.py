"""The report's panel "Protocol effect" (bench.report.protocols) on a hand-made results folder: its numbers against a
computation of their own here; the accuracy tables keep to bench's rows; rows from before protocols count as bench."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import stats

from bench.report import analysis, protocols
from bench.report.build import build_report
from tests.report.test_report import make_row, write

# MR at r = 0.4 (a paper cell: CE 54.52 ± 1.74, L_DMI 62.67 ± 2.27), three seeds. bench: CE with two learning rates,
# lr 1e-4 selected by its lower validation loss. authors: one setting each; seed 3 of authors' L_DMI has no bench
# partner and is left out of the paired difference.
BENCH = {("ce", 1e-4): ([0.5, 0.5, 0.5], [60.0, 61.0, 62.0]), ("ce", 1e-3): ([0.9, 0.9, 0.9], [70.0, 70.0, 70.0]),
         ("dmi", 1e-4): ([1.0, 1.0, 1.0], [65.0, 66.0, 64.0])}
AUTHORS = {("ce", 1e-4): ([0.4, 0.4, 0.4], [55.0, 54.0, 58.0]),
           ("dmi", 1e-4): ([1.0] * 4, [60.0, 63.0, 61.0, 40.0])}


def rows() -> list[dict]:
    out = []
    for spec, table in (("bench", BENCH), ("authors", AUTHORS)):
        for (method, lr), (losses, accs) in table.items():
            for seed, (v, a) in enumerate(zip(losses, accs, strict=True)):
                row = make_row(method, 0.4, seed, v, a, lr=lr)
                row["trial_id"] = f"{row['trial_id'][:8]}{spec[:4]}{seed:04d}"
                if spec == "authors":
                    row |= dict(protocol="authors", switches="first_batch_selection,fixed_torch_seed")
                out.append(row)  # bench's rows carry no protocol column: written before protocols existed
    return out


def by_hand(bench: list[float], other: list[float]) -> tuple[float, float]:
    diffs = np.array(other) - np.array(bench)
    return float(diffs.mean()), float(stats.t.ppf(0.975, len(diffs) - 1) * diffs.std(ddof=1) / np.sqrt(len(diffs)))


def test_the_panel_pairs_each_protocol_with_bench_by_seed(tmp_path: Path) -> None:
    df = analysis.load_trials(write(tmp_path / "r", rows()))
    assert set(df["protocol"].to_list()) == {"bench", "authors"}
    panel = {row["method"]: row for row in protocols.compare(df).iter_rows(named=True)}
    assert set(panel) == {"ce", "dmi"}
    ce, dmi = panel["ce"], panel["dmi"]
    assert (ce["paper_mean"], ce["paper_std"], dmi["paper_mean"], dmi["paper_std"]) == (54.52, 1.74, 62.67, 2.27)
    assert ce["bench_mean"] == np.mean([60.0, 61.0, 62.0]) and ce["bench_n"] == 3  # lr 1e-4, not 1e-3's 70
    assert ce["other_mean"] == np.mean([55.0, 54.0, 58.0]) and ce["protocol"] == "authors"
    mean, half = by_hand([60.0, 61.0, 62.0], [55.0, 54.0, 58.0])
    assert ce["paired_n"] == 3 and np.isclose(ce["diff"], mean) and np.isclose(ce["diff_ci95"], half)
    assert dmi["other_n"] == 4 and dmi["other_mean"] == np.mean([60.0, 63.0, 61.0, 40.0])
    mean, half = by_hand([65.0, 66.0, 64.0], [60.0, 63.0, 61.0])  # seed 3 has no partner
    assert dmi["paired_n"] == 3 and np.isclose(dmi["diff"], mean) and np.isclose(dmi["diff_ci95"], half)


def test_the_tables_show_bench_and_the_report_shows_the_panel(tmp_path: Path) -> None:
    results = write(tmp_path / "r", rows())
    written = build_report(results, tmp_path / "report", log=lambda s: None)
    cells = analysis.load_trials(results)
    headline = protocols.headline(cells)
    assert set(headline["protocol"].to_list()) == {"bench"}
    grid = analysis.aggregate(headline)
    assert grid.filter(method="ce")["acc_mean"][0] == np.mean([60.0, 61.0, 62.0])
    md = written["leaderboard.md"].read_text()
    assert "## Protocol effect" in md
    assert "| mr | pos\\_to\\_neg | 0.4 | CE | 54.52 ± 1.74 | 61.00 ± 1.00 | 3 | authors | 55.67 ± 2.08 | 3 |" in md
    assert "Protocols: authors (7 trials), bench (9 trials)" in md
    assert "Protocol effect" in written["report.html"].read_text()
    assert written["protocols csv"].read_text().startswith("dataset,noise,r,method,protocol,paper_mean")


def test_no_panel_without_two_protocols(tmp_path: Path) -> None:
    only_bench = [r for r in rows() if "protocol" not in r]
    assert protocols.compare(analysis.load_trials(write(tmp_path / "r", only_bench))).is_empty()
