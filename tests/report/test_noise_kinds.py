"""The report's panel "Class-conditional vs instance-dependent noise" (bench.report.noise_kinds) on small hand-made
result folders: its numbers against a computation of their own here, which (dataset, r) get rows, its Markdown,
HTML and CSV, and the realised T standing in as the truth of an instance-dependent cell's T estimate."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

from bench.report import analysis, noise_kinds
from bench.report import leaderboard as report
from bench.report.build import build_report
from tests.report.test_report import make_row, write

SYM_T = [[0.8, 0.2], [0.2, 0.8]]  # symmetric noise at r = 0.2 with 2 classes
REALISED_T = [[0.79, 0.21], [0.2, 0.8]]


def trial(method: str, noise: str, r: float, seed: int, val_loss: float | None, acc: float | None, rate: float,
          dataset: str = "fashion_mnist", lr: float = 1e-4, status: str = "ok", classes: int = 2,
          estimate: list | None = None) -> dict:
    """A result row of test_report's shape with the noise columns a trial writes: idn and real noise record no
    generating T, every synthetic class-conditional pattern does."""
    generating = None if noise in ("idn", "human") else (SYM_T if classes == 2 else np.eye(classes).tolist())
    realised = REALISED_T if classes == 2 else np.eye(classes).tolist()
    return make_row(method, r, seed, val_loss, acc, lr=lr, status=status, dataset=dataset, noise=noise) | dict(
        noise_rate=rate, transition=None if generating is None else json.dumps(generating),
        empirical_transition=json.dumps(realised),
        estimated_transition=None if estimate is None else json.dumps(estimate))


# Fashion-MNIST at r = 0.2, symmetric and idn, over three seeds; CE with two learning rates in each, L_DMI with one.
# Symmetric: CE's lr 1e-4 has the lower mean validation loss (0.5 < 0.7) though lr 1e-3 scores higher on the test.
# idn: there lr 1e-3 wins on validation loss (0.4 < 0.6). Realised rates 0.2 vs 0.225 on average: no flag.
# L_DMI's idn arm has two more seeds (3, 4) than its symmetric one, both low: they pull its mean down, but have no
# partner, so the paired difference (over seeds 0-2) leaves them out.
SYM_RATES, IDN_RATES = [0.19, 0.2, 0.21], [0.22, 0.225, 0.23, 0.225, 0.225]
FASHION = {
    ("ce", "symmetric", 1e-4): ([0.5, 0.4, 0.6], [90.0, 91.0, 95.0]),
    ("ce", "symmetric", 1e-3): ([0.7, 0.7, 0.7], [97.0, 97.5, 98.0]),
    ("ce", "idn", 1e-4): ([0.6, 0.6, 0.6], [80.0, 81.0, 82.0]),
    ("ce", "idn", 1e-3): ([0.3, 0.5, 0.4], [88.0, 92.0, 89.0]),
    ("dmi", "symmetric", 1e-4): ([1.0, 1.1, 1.2], [93.0, 94.0, 96.5]),
    ("dmi", "idn", 1e-4): ([1.0] * 5, [92.0, 92.5, 94.0, 80.0, 81.0]),
}
FW_ESTIMATE = [[0.75, 0.25], [0.2, 0.8]]


def fashion_rows() -> list[dict]:
    rows = []
    for (method, noise, lr), (losses, accs) in FASHION.items():
        rates = SYM_RATES if noise == "symmetric" else IDN_RATES
        rows += [trial(method, noise, 0.2, s, v, a, rates[s], lr=lr)
                 for s, (v, a) in enumerate(zip(losses, accs, strict=True))]
    # A fourth seed of the unselected symmetric setting: its rate is no part of the selected cell's.
    rows.append(trial("ce", "symmetric", 0.2, 3, 0.7, 98.0, 0.26, lr=1e-3))
    # A trial of the selected setting that failed after drawing its labels: counted, never averaged, its rate too.
    rows.append(trial("ce", "idn", 0.2, 3, None, None, 0.5, lr=1e-3, status="failed"))
    rows += [trial("fw", noise, 0.2, s, 0.5, 85.0 + s, rates[s], estimate=FW_ESTIMATE)
             for noise, rates in (("symmetric", SYM_RATES), ("idn", IDN_RATES)) for s in range(3)]
    # fw_oracle (privileged) refuses idn: its row has the symmetric arm only.
    rows += [trial("fw_oracle", "symmetric", 0.2, s, 0.5, 99.0, SYM_RATES[s]) for s in range(2)]
    # r = 0.4 holds symmetric trials only, and human noise (no T: not class-conditional) sits beside idn at 0.2.
    rows += [trial("ce", "symmetric", 0.4, s, 0.5, 70.0, 0.4) for s in range(2)]
    rows += [trial("ce", "human", 0.2, s, 0.5, 60.0, 0.2) for s in range(2)]
    return rows


# CIFAR-10 (10 classes) at r = 0.4: pairs (seeds 0, 1) against idn (seeds 1, 2), realised rates 0.2 vs 0.435 on
# average: flagged; one shared seed: a paired difference without an interval. At r = 0.2 only idn was run: no row.
CIFAR = [trial("ce", noise, 0.4, s, 1.0, acc, rate, dataset="cifar10", classes=10)
         for noise, seeds, accs, rates in (("pairs", [0, 1], [80.0, 82.0], [0.2, 0.2]),
                                           ("idn", [1, 2], [75.0, 76.0], [0.43, 0.44]))
         for s, acc, rate in zip(seeds, accs, rates, strict=True)]
CIFAR.append(trial("ce", "idn", 0.2, 0, 1.0, 85.0, 0.2, dataset="cifar10", classes=10))


@pytest.fixture()
def results(tmp_path: Path) -> Path:
    return write(tmp_path / "results", fashion_rows() + CIFAR)


def expected(rows: list[dict], dataset: str, noise: str, r: float, method: str) -> dict:
    """A cell computed here: the lr with the lowest mean validation loss over usable trials, then the mean and sample
    std of its test accuracies, its seeds, each seed's accuracy and the mean of its realised noise rates."""
    usable = [x for x in rows if (x["dataset"], x["noise"], x["r"], x["method"]) == (dataset, noise, r, method)
              and x["status"] != "failed"]
    lrs = {x["lr"] for x in usable}
    best = min(lrs, key=lambda lr: np.mean([x["val_loss"] for x in usable if x["lr"] == lr]))
    chosen = [x for x in usable if x["lr"] == best]
    accs = [x["test_acc"] for x in chosen]
    return dict(lr=best, n=len(chosen), mean=float(np.mean(accs)), by_seed={x["seed"]: x["test_acc"] for x in chosen},
                std=float(np.std(accs, ddof=1)) if len(accs) > 1 else None,
                rate=float(np.mean([x["noise_rate"] for x in chosen])))


def expected_paired(cc: dict, idn: dict) -> tuple[int, float | None, float | None]:
    """The difference idn − class-conditional computed here, paired by seed: (shared seeds, mean of the per-seed
    differences, half-width of its 95% Student-t interval; None under 3 shared seeds, the accuracy tables' rule)."""
    seeds = sorted(set(cc["by_seed"]) & set(idn["by_seed"]))
    d = np.array([idn["by_seed"][s] - cc["by_seed"][s] for s in seeds])
    if len(d) == 0:
        return 0, None, None
    half = stats.t.ppf(0.975, len(d) - 1) * np.std(d, ddof=1) / np.sqrt(len(d)) if len(d) >= 3 else None
    return len(d), float(d.mean()), half


def test_panel_numbers_match_an_independent_computation(results: Path) -> None:
    df = analysis.load_trials(results)
    grid = analysis.aggregate(df)
    panel = noise_kinds.compare(df, grid)
    rows = fashion_rows() + CIFAR
    keys = [(p["dataset"], p["noise"], p["r"], p["method"]) for p in panel.iter_rows(named=True)]
    # Methods in the tables' order (L_DMI last); human noise, r = 0.4 (symmetric only) and CIFAR-10's r = 0.2 (idn
    # only) give no row.
    assert keys == [("cifar10", "pairs", 0.4, "ce")] + [("fashion_mnist", "symmetric", 0.2, m)
                                                         for m in ("ce", "fw", "fw_oracle", "dmi")]
    by = {k[0] + k[3]: p for k, p in zip(keys, panel.iter_rows(named=True), strict=True)}
    tables = {(t.dataset, t.noise): t for t in report.tables(grid, analysis.paired_comparison(df, grid))}
    for key, p in by.items():
        cc = expected(rows, p["dataset"], p["noise"], p["r"], p["method"])
        assert (p["cc_n"], p["cc_mean"], p["cc_rate"]) == (cc["n"], pytest.approx(cc["mean"]),
                                                           pytest.approx(cc["rate"])), key
        assert p["cc_std"] == (None if cc["std"] is None else pytest.approx(cc["std"]))
        # The setting is the one the accuracy tables show for that cell.
        assert p["cc_setting"] == tables[(p["dataset"], p["noise"])].entries[(p["r"], p["method"])].cell["setting"]
        if p["method"] == "fw_oracle":
            continue
        idn = expected(rows, p["dataset"], "idn", p["r"], p["method"])
        assert (p["idn_n"], p["idn_mean"], p["idn_rate"]) == (idn["n"], pytest.approx(idn["mean"]),
                                                              pytest.approx(idn["rate"])), key
        assert p["idn_std"] == pytest.approx(idn["std"])
        assert p["idn_setting"] == tables[(p["dataset"], "idn")].entries[(p["r"], p["method"])].cell["setting"]
        n, diff, half = expected_paired(cc, idn)
        assert (p["paired_n"], p["diff"]) == (n, pytest.approx(diff)), key
        assert p["diff_ci95"] == (None if half is None else pytest.approx(half)), key
        assert p["rate_gap"] == pytest.approx(abs(idn["rate"] - cc["rate"]))
        assert p["flag"] is (abs(idn["rate"] - cc["rate"]) > 0.03)
    ce = by["fashion_mnistce"]
    # Hand-checked: symmetric picks lr 1e-4 (90, 91, 95), idn lr 1e-3 (88, 92, 89); the failed seed is not averaged.
    assert (ce["cc_mean"], ce["idn_mean"], ce["idn_n"]) == (pytest.approx(92.0), pytest.approx(269 / 3), 3)
    assert ce["flag"] is False
    # Hand-checked pairs: per-seed differences -2, 1, -6; t(0.975, 2 df) = 4.303, std sqrt(37 / 3).
    assert (ce["paired_n"], ce["diff"]) == (3, pytest.approx(-7 / 3))
    assert ce["diff_ci95"] == pytest.approx(4.302653 * np.sqrt(37 / 3) / np.sqrt(3))
    # L_DMI: idn's seeds 3 and 4 have no symmetric partner. Paired over 0-2: -1, -1.5, -2.5; unpaired it would be
    # 87.9 - 94.5 = -6.6.
    dmi = by["fashion_mnistdmi"]
    assert (dmi["idn_n"], dmi["idn_mean"], dmi["paired_n"]) == (5, pytest.approx(87.9), 3)
    assert dmi["diff"] == pytest.approx(-5 / 3)
    assert dmi["diff_ci95"] == pytest.approx(4.302653 * np.sqrt(7 / 12) / np.sqrt(3))
    # CIFAR-10: one shared seed (1): its difference 75 - 82, no interval.
    cifar = by["cifar10ce"]
    assert (cifar["paired_n"], cifar["diff"], cifar["diff_ci95"]) == (1, pytest.approx(-7.0), None)
    assert ce["cc_rate"] == pytest.approx(0.2) and ce["idn_rate"] == pytest.approx(0.225)
    assert by["cifar10ce"]["flag"] is True and by["cifar10ce"]["rate_gap"] == pytest.approx(0.235)
    assert (by["cifar10ce"]["classes"], ce["classes"]) == (10, 2)
    oracle = by["fashion_mnistfw_oracle"]
    assert oracle["privileged"] is True and oracle["idn_n"] == 0 and oracle["idn_mean"] is None
    assert (oracle["paired_n"], oracle["diff"], oracle["diff_ci95"], oracle["flag"]) == (0, None, None, False)


def test_no_row_without_both_kinds(tmp_path: Path) -> None:
    only_sym = [r for r in fashion_rows() if r["noise"] != "idn"]
    df = analysis.load_trials(write(tmp_path / "a", only_sym))
    assert noise_kinds.compare(df, analysis.aggregate(df)).is_empty()
    written = build_report(tmp_path / "a", tmp_path / "out", log=lambda s: None)
    md = written["leaderboard.md"].read_text(encoding="utf-8")  # left out, with one line why
    assert f"## {noise_kinds.TITLE}" not in md and md.count(noise_kinds.TITLE) == 1
    assert f"{noise_kinds.TITLE}: left out" in md
    assert "noise_kinds csv" not in written and not (tmp_path / "out" / "noise_kinds.csv").exists()  # no empty file
    # idn beside real (human) noise only: human noise has no T, so it is not a class-conditional arm.
    human = [r for r in fashion_rows() if r["noise"] in ("idn", "human")]
    df = analysis.load_trials(write(tmp_path / "b", human))
    assert noise_kinds.compare(df, analysis.aggregate(df)).is_empty()


def _cells(page: str) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", page)]


def test_markdown_html_and_csv_show_the_panel(results: Path, tmp_path: Path) -> None:
    written = build_report(results, tmp_path / "out", log=lambda s: None)
    md = written["leaderboard.md"].read_text(encoding="utf-8")
    assert "## Class-conditional vs instance-dependent noise" in md and noise_kinds.NOTE in md
    for part in ("is the realised one", "not a parameter of the generator", "symmetric noise in law",
                 "a control", "C ≥ 3 (CIFAR-10, CIFAR-100)", "more than 0.03", "paired by seed", "95% Student-t",
                 "where its interval covers 0"):
        assert part in noise_kinds.NOTE
    lines = [line for line in md.splitlines() if line.startswith(("| fashion\\_mnist | 2", "| cifar10 | 10"))]
    assert lines == [
        "| cifar10 | 10 | pairs | 0.4 | CE | 81.00 ± 1.41 | 2 | idn | 75.50 ± 0.71 | 2 | -7.00 ± — (1) | 0.200 | "
        "0.435 | rates differ |",
        "| fashion\\_mnist | 2 (control) | symmetric | 0.2 | CE | 92.00 ± 2.65 | 3 | idn | 89.67 ± 2.08 | 3 | "
        "-2.33 ± 8.72 (3) | 0.200 | 0.225 |  |",
        "| fashion\\_mnist | 2 (control) | symmetric | 0.2 | FW | 86.00 ± 1.00 | 3 | idn | 86.00 ± 1.00 | 3 | "
        "+0.00 ± 0.00 (3) | 0.200 | 0.225 |  |",
        "| fashion\\_mnist | 2 (control) | symmetric | 0.2 | FW with the true T † | 99.00 ± 0.00 | 2 | idn | — | 0 | "
        "— | 0.195 | — |  |",
        "| fashion\\_mnist | 2 (control) | symmetric | 0.2 | L\\_DMI | 94.50 ± 1.80 | 3 | idn | 87.90 ± 6.80 | 5 | "
        "-1.67 ± 1.90 (3) | 0.200 | 0.225 |  |",
    ]
    page = written["report.html"].read_text(encoding="utf-8")
    assert "<h2>Class-conditional vs instance-dependent noise</h2>" in page and html.escape(noise_kinds.NOTE) in page
    cells = _cells(page)
    start = cells.index("pairs") - 2  # the panel's row: the first cell that names the pattern
    assert cells[start:start + 14] == ["cifar10", "10", "pairs", "0.4", "CE", "81.00 ± 1.41", "2", "idn",
                                       "75.50 ± 0.71", "2", "-7.00 ± — (1)", "0.200", "0.435", "rates differ"]
    csv = pl.read_csv(written["noise_kinds csv"])
    assert csv.height == 5
    dmi = csv.filter(dataset="fashion_mnist", method="dmi").row(0, named=True)
    assert (dmi["paired_n"], dmi["diff"]) == (3, pytest.approx(-5 / 3))
    assert dmi["diff_ci95"] == pytest.approx(4.302653 * np.sqrt(7 / 12) / np.sqrt(3))
    assert csv.filter(dataset="cifar10")["diff_ci95"].to_list() == [None]


def test_an_instance_dependent_estimate_is_scored_against_the_realised_t(results: Path, tmp_path: Path) -> None:
    frame = analysis.transition_estimates(analysis.load_trials(results))
    fw = {row["noise"]: row for row in frame.filter(method="fw").iter_rows(named=True)}
    assert fw["idn"]["truth"] == "realised (instance-dependent: no generating T)"
    assert fw["symmetric"]["truth"] == "noise model"
    estimate, realised, generating = (np.array(m) for m in (FW_ESTIMATE, REALISED_T, SYM_T))
    assert fw["idn"]["err_mean"] == pytest.approx(np.abs(estimate - realised).sum() / np.abs(realised).sum())
    assert fw["symmetric"]["err_mean"] == pytest.approx(np.abs(estimate - generating).sum() / 2.0)
    assert "realised (instance-dependent: no generating T)" in report.ESTIMATES_NOTE
    written = build_report(results, tmp_path / "out", log=lambda s: None)
    md = written["leaderboard.md"].read_text(encoding="utf-8")
    row = next(line for line in md.splitlines() if line.startswith("| fashion_mnist | idn | 0.2 | FW |"))
    assert row.endswith("| realised (instance-dependent: no generating T) |")
