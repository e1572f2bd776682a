"""The published results beyond the paper (bench/report/literature_results.csv): every row names its source, table,
network, training budget and how it was checked; the paper-vs-measured panel shows the network and source beside
each reference and says where ours differs (another network, or a linear probe), in the markdown and the HTML."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from bench.cli import main as cli
from bench.data import registry as datasets
from bench.models import registry as models
from bench.report import analysis
from bench.report.analysis import LITERATURE_CSV, read_reference
from tests.report.test_report import make_row, write


def test_every_literature_row_names_its_source_network_budget_and_check() -> None:
    rows = read_reference(LITERATURE_CSV)
    for column in ("source", "table", "network", "budget", "checked"):
        assert rows[column].null_count() == 0 and (rows[column].str.strip_chars() != "").all(), column
    assert set(rows["dataset"]) <= set(datasets())
    assert set(rows["model"].drop_nulls()) <= set(models())  # a registered network, or none (bench lacks it)
    assert rows["acc_mean"].is_between(0, 100).all()
    # Where a number could not be checked against its source, the check column says so.
    unchecked = rows.filter(pl.col("checked").str.starts_with("not checked"))
    assert set(unchecked["method"]) == {"elr", "plc", "ce", "cleannet"}
    assert set(unchecked["dataset"]) == {"webvision_mini", "webvision_mini_ilsvrc12", "animal10n", "food101n"}


def test_literature_rows_read_as_their_sources_print_them() -> None:
    rows = read_reference(LITERATURE_CSV)
    red = rows.filter(dataset="red_mini_imagenet")
    assert (red["table"] == "FaMUS Table 7").all() and red.height == 16
    # FaMUS's MentorMix baseline trains a ResNet-32 (its train_script.sh), the others FaMUS's PreAct ResNet-18.
    assert set(red.filter(method="mentormix")["network"]) == {"ResNet-32, 32 x 32"}
    assert set(red.filter(pl.col("method") != "mentormix")["network"]) == {"PreAct ResNet-18, 32 x 32"}
    assert red["model"].null_count() == red.height  # neither is a bench network
    # FaMUS's own schedule as its run_famus.sh (26a7b22) passes it at each level: the lr steps (`--step1`, `--step2`)
    # at 200 and 250 for 0.2 and 0.4, at 100 and 200 for 0.6 and 0.8.
    famus = {row["noise_r"]: row["budget"] for row in red.filter(method="famus").to_dicts()}
    for r, steps, lines in ((0.2, (200, 250), "36-37"), (0.4, (200, 250), "20-21"), (0.6, (100, 200), "53-54"),
                            (0.8, (100, 200), "69-70")):
        assert f"lr 0.02 / 10 at {steps[0]} and {steps[1]} " in famus[r], r
        assert f"FaMUS/run_famus.sh, 26a7b22, lines {lines}: `--step1 {steps[0]} --step2 {steps[1]}` at {r}" in famus[r]
    selfie = rows.filter(dataset="animal10n", method="selfie").to_dicts()[0]
    assert selfie["acc_mean"] == 81.6 and selfie["acc_std"] is None  # read off SELFIE's chart: no std
    fw = rows.filter(dataset="webvision_mini_ilsvrc12", method="fw").to_dicts()[0]
    assert fw["acc_mean"] == 57.39 and fw["table"] == "FaMUS Table 6"


def test_panel_shows_network_and_source_and_flags_a_different_network(tmp_path: Path, capsys) -> None:
    def rows(dataset: str, noise: str, r: float, method: str, model: str, accs: tuple[float, ...]) -> list[dict]:
        made = [make_row(method, r, seed, 0.5, acc, dataset=dataset, noise=noise) | {"model": model}
                for seed, acc in enumerate(accs)]
        return made

    results = write(tmp_path / "results",
                    rows("webvision_mini", "real", 0.0, "dividemix", "resnet50", (70.0, 71.0))
                    + rows("animal10n", "real", 0.0, "coteaching", "vgg19_bn", (80.0, 80.4))
                    + rows("red_mini_imagenet", "red", 0.4, "ce", "linear_probe", (30.0, 31.0)))
    comparison = analysis.paper_comparison(analysis.aggregate(analysis.load_trials(results)))
    note = {(c["dataset"], c["method"], c["r"]): c for c in comparison.iter_rows(named=True)}
    dividemix = note["webvision_mini", "dividemix", 0.0]
    assert dividemix["paper_network"] == "Inception-ResNet-v2" and dividemix["ours_model"] == "resnet50"
    assert dividemix["network_note"] == "ours: resnet50, not Inception-ResNet-v2"
    assert dividemix["source"].startswith("Li, Socher, Hoi, DivideMix (ICLR 2020), Table 5")
    coteaching = note["animal10n", "coteaching", 0.0]
    assert coteaching["ours_mean"] == 80.2 and coteaching["network_note"] == ""  # the same network: no note
    probe = note["red_mini_imagenet", "ce", 0.4]
    assert probe["network_note"] == "ours: a linear probe on frozen features (linear_probe), not a trained PreAct " \
        "ResNet-18, 32 x 32"
    unmeasured = note["webvision_mini", "elr", 0.0]
    assert unmeasured["ours_mean"] is None and unmeasured["network_note"] == ""

    out = tmp_path / "report"
    assert cli.main(["report", str(results), "--out", str(out)]) == 0
    markdown = (out / "leaderboard.md").read_text()
    assert "| network | source |" in markdown
    assert "| Inception-ResNet-v2 (ours: resnet50, not Inception-ResNet-v2) | Li, Socher, Hoi, DivideMix" in markdown
    assert "| VGG-19 | Song, Kim, Lee, SELFIE (ICML 2019), Figure: Co-teaching" in markdown
    html = (out / "report.html").read_text()
    assert "Inception-ResNet-v2 (ours: resnet50, not Inception-ResNet-v2)" in html
    assert "<th>network</th><th>source</th>" in html
    assert "read off SELFIE&#x27;s bar chart" in html  # how the number was checked: the source cell's title
    written = pl.read_csv(out / "paper_vs_measured.csv")
    assert {"paper_network", "ours_model", "network_note", "source", "table", "checked"} <= set(written.columns)
    capsys.readouterr()


def test_a_linear_probe_row_is_read_and_noted_by_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A frozen-feature probe's row names its network with its options (`TrialConfig.model_label`, parentheses and
    all): the report reads it, and the published panel says ours is a linear probe (it once skipped such rows as
    files not of ours)."""
    label = "linear_probe(backbone=resnet18, weights=random)"
    row = make_row("ce", 0.0, 0, 0.5, 40.0, dataset="webvision_mini", noise="real") | {"model": label}
    results = write(tmp_path / "results", [row])
    table = analysis.load_trials(results)
    assert table["model"].to_list() == [label]
    assert "skipping" not in capsys.readouterr().err
    assert analysis.network_note(label, "Inception-ResNet-v2", "inception_resnet_v2").startswith(
        "ours: a linear probe on frozen features")
