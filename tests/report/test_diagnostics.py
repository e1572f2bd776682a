"""bench.report.diagnostics and `bench labels`: the three checkpoint rules, the memorisation split, detection quality,
cost, the exported noisy labels, and that solo and packed members record the same per-epoch numbers."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from bench.cli.labels import labels_hash_of
from bench.cli.main import main
from bench.exec import diagnostics as exec_diagnostics
from bench.exec.diagnostics import auroc, detection, memorisation, train_sample
from bench.exec.pack import run_pack
from bench.exec.prepare import prepare
from bench.exec.trainer import run_trial
from bench.methods import get_method
from bench.report import diagnostics, plots
from bench.report.build import build_report
from bench.report.diagnostics import trial_rules
from bench.store.columns import DIAGNOSTIC_COLUMNS
from bench.store.folder import read_table
from bench.trial import TrialConfig
from tests.tolerances import ACCURACY_EXAMPLES

QUIET = dict(log=lambda s: None)


def _epochs(trial_id: str, rows: list[tuple[str, int, float | None, float | None]]) -> pl.DataFrame:
    return pl.DataFrame([dict(trial_id=trial_id, stage=s, epoch=e, val_loss=v, test_acc=a) for s, e, v, a in rows],
                        schema={"trial_id": pl.String, "stage": pl.String, "epoch": pl.Int64, "val_loss": pl.Float64,
                                "test_acc": pl.Float64})


def test_the_three_rules_on_a_hand_made_epochs_table() -> None:
    """a: the lowest val loss is tied at epochs 1 and 3 (the earliest, 1, is selected, as the trainer keeps the
    first strict improvement); the best test epoch is 2; warm-start rows never count. b: the warm-started state
    (epoch 0) is selected; a NaN val loss is never selected; the best test accuracy is tied (earliest, 0)."""
    epochs = pl.concat([
        _epochs("a", [("warmup", 1, 0.1, 99.0), ("method", 0, 0.9, 60.0), ("method", 1, 0.5, 70.0),
                      ("method", 2, 0.6, 80.0), ("method", 3, 0.5, 75.0), ("method", 4, 0.7, 65.0)]),
        _epochs("b", [("method", 0, 0.2, 90.0), ("method", 1, float("nan"), 50.0), ("method", 2, 0.3, 90.0)]),
        _epochs("c", [("method", 0, 0.2, None)]),  # no per-epoch test accuracy: no rules
    ])
    rules = trial_rules(epochs).to_dicts()
    assert rules == [
        dict(trial_id="a", selected_epoch=1, selected_acc=70.0, last_epoch=4, last_acc=65.0, oracle_epoch=2,
             oracle_acc=80.0),
        dict(trial_id="b", selected_epoch=0, selected_acc=90.0, last_epoch=2, last_acc=90.0, oracle_epoch=0,
             oracle_acc=90.0),
    ]


def test_cell_rules_average_the_selected_settings_seeds_and_their_gaps() -> None:
    """Two seeds of one cell: selected 70, 90 (mean 80); last 65, 90 (gap -2.5); oracle 80, 90 (gap +5)."""
    epochs = pl.concat([
        _epochs("a", [("method", 0, 0.9, 60.0), ("method", 1, 0.5, 70.0), ("method", 2, 0.6, 80.0),
                      ("method", 3, 0.7, 65.0)]),
        _epochs("b", [("method", 0, 0.2, 90.0), ("method", 1, 0.4, 85.0), ("method", 2, 0.3, 90.0)]),
    ])
    trials = pl.DataFrame(dict(trial_id=["a", "b"], dataset="d", noise="n", r=0.4, method="ce", seed=[0, 1],
                               setting="s", usable=True, best_epoch=[1, 0], wall_s=[3600.0, 1800.0],
                               device_s=[1800.0, 1800.0], test_acc=[70.0, 90.0], epochs=3, epochs_warmup=2,
                               train_subset=None, networks=1, device="cpu", noise_hash=["h0", "h1"],
                               noise_rate=[0.4, 0.38]))
    settings = pl.DataFrame(dict(dataset=["d"], noise="n", r=0.4, method="ce", setting="s"))
    diag = diagnostics.analyse(trials, epochs, settings)
    cell = diag.rules.to_dicts()[0]
    assert (cell["n"], cell["selected_mean"], cell["last_mean"], cell["oracle_mean"]) == (2, 80.0, 77.5, 85.0)
    assert (cell["last_gap"], cell["oracle_gap"]) == (-2.5, 5.0)
    cost = diag.cost.to_dicts()[0]
    # Half a device-hour per trial at 80% mean accuracy: 160 points per device-hour; both seeds: 1 device-hour.
    assert cost["acc_per_device_hour"] == pytest.approx(160.0) and cost["device_h_total"] == pytest.approx(1.0)
    assert diag.totals.to_dicts() == [dict(device="cpu", trials=2, device_h=1.0)]
    assert diag.labels["noise_hash"].to_list() == ["h0", "h1"]


def test_memorisation_split_on_labels_with_known_flips() -> None:
    """8 examples: flips at 1, 4, 6 (noisy != clean); example 7's clean label is unknown (-1) and counts nowhere.
    Prediction = noisy label on flips 1 and 4 (memorised 2 of 3); on the 4 known kept examples 0, 2, 3, 5 it is
    right on 0, 2, 3; against the clean labels it is right on 0, 2, 3, 6 of the 7 known."""
    clean = torch.tensor([0, 1, 1, 0, 2, 1, 0, -1])
    noisy = torch.tensor([0, 0, 1, 0, 0, 1, 2, 1])
    pred = torch.tensor([0, 0, 1, 0, 0, 2, 0, 1])
    out = memorisation(pred, noisy, clean)
    assert out["train_noisy_acc_flipped"] == pytest.approx(100 * 2 / 3)
    assert out["train_noisy_acc_kept"] == pytest.approx(100 * 3 / 4)
    assert out["train_clean_acc"] == pytest.approx(100 * 4 / 7)
    assert memorisation(pred, clean.clamp_min(0), clean.clamp_min(0))["train_noisy_acc_flipped"] is None


def test_precision_recall_and_auroc_on_a_tiny_hand_made_case() -> None:
    """Flips (positives) score 0.9, 0.5, 0.5; kept examples 0.5, 0.1, 0.3, 0.95. Pairs won: 0.9 beats 3 of 4,
    each 0.5 beats 2 and ties 1 (2.5): AUROC = 8 / 12. Flagged (score >= 0.5): 5 examples, 3 of them flips:
    precision 3/5, recall 3/3."""
    score = np.array([0.9, 0.5, 0.5, 0.5, 0.1, 0.3, 0.95])
    flipped = np.array([1, 1, 1, 0, 0, 0, 0], dtype=bool)
    out = detection(score, score >= 0.5, flipped)
    assert out == pytest.approx(dict(det_flagged=5 / 7, det_precision=3 / 5, det_recall=1.0, det_auroc=8 / 12))
    assert detection(score, np.zeros(7, bool), flipped)["det_precision"] is None  # nothing flagged
    assert auroc(score, np.zeros(7, bool)) is None and auroc(-score[:3], np.ones(3, bool)) is None


def test_auroc_equals_counting_pairs_with_many_ties() -> None:
    rng = np.random.default_rng(3)
    score, positive = rng.integers(0, 4, 60).astype(float), rng.random(60) < 0.3
    pos, neg = score[positive], score[~positive]
    pairs = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in itertools.product(pos, neg))
    assert auroc(score, positive) == pytest.approx(pairs / (len(pos) * len(neg)))


def test_the_judgements_of_coteaching_and_lccn() -> None:
    """Co-teaching flags all but the floor(R(T) N) smallest losses at the coming epoch's keep rate; LCCN flags the
    examples whose last latent label differs from the noisy one."""
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 0.5], [3.0, 0.0]])
    labels = torch.tensor([0, 0, 0, 1, 1])
    coteaching = get_method("coteaching")(2, forget_rate=0.5, num_gradual=3)
    every = torch.arange(5)
    score, flagged = coteaching.judged_noisy(logits, labels, 0, every)  # R(0) = 1 - 0.5 * 1/2: keep 3 of 5
    assert flagged.tolist() == [False, True, False, False, True]
    assert torch.equal(score, torch.nn.functional.cross_entropy(logits, labels, reduction="none"))
    assert coteaching.judged_noisy(logits, labels, 2, every)[1].tolist() == [False, True, False, True, True]  # 2 of 5
    lccn = get_method("lccn")(2)
    assert lccn.judged_noisy(logits, labels, 0, every) is None  # before its setup: no latent labels yet
    lccn.latent, lccn.noisy = torch.tensor([0, 1, 0, 1, 0]), labels
    assert lccn.judged_noisy(logits, labels, 0, every)[1].tolist() == [False, True, False, False, True]
    # On the diagnostics' sample (examples 1 and 4): the latent labels of those examples, not of the first two.
    some = torch.tensor([1, 4])
    assert lccn.judged_noisy(logits[some], labels[some], 0, some)[1].tolist() == [True, True]


def test_the_diagnostics_sample_is_fixed_per_dataset_and_caps_the_work(monkeypatch) -> None:
    """All examples up to TRAIN_SAMPLE; beyond, TRAIN_SAMPLE distinct sorted indices that depend on the dataset
    only (every method, seed and r is diagnosed on the same examples)."""
    assert train_sample(7, "fashion_mnist").tolist() == list(range(7))
    monkeypatch.setattr(exec_diagnostics, "TRAIN_SAMPLE", 40)
    a, b = train_sample(1000, "fashion_mnist"), train_sample(1000, "fashion_mnist")
    assert a.tolist() == b.tolist() and len(set(a.tolist())) == 40 and a.tolist() == sorted(a.tolist())
    assert a.max() < 1000 and a.tolist() != list(range(40))  # spread over the set, not its first examples
    assert train_sample(1000, "mr").tolist() != a.tolist()


def test_exported_labels_have_the_rows_hash(tmp_path: Path) -> None:
    """A real trial (on a training subset) and `bench labels` for its (dataset, noise, r, seed): the file's noisy
    labels hash to the row's noise_hash; its flips and realised rate are the row's."""
    config = TrialConfig("synthetic", "ce", "case3", 0.4, seed=7, epochs=1, epochs_warmup=1, train_subset=1000)
    row = run_trial(config, "unused", results=tmp_path / "results", **QUIET)
    out = tmp_path / "labels.parquet"
    assert main(["labels", "--dataset", "synthetic", "--noise", "case3", "--r", "0.4", "--seed", "7",
                 "--out", str(out)]) == 0
    recomputed, recorded = labels_hash_of(out)
    assert recomputed == recorded == row["noise_hash"]
    table = pl.read_parquet(out)
    train = table.filter(split="train").sort("index")
    assert table.filter(split="val").height == 1000 and train.height == 4000
    assert train["flipped"].to_list() == (train["clean"] != train["noisy"]).to_list()
    assert train["flipped"].mean() == pytest.approx(row["noise_rate"])
    assert main(["labels", "--dataset", "synthetic", "--noise", "case3", "--r", "1.5", "--out", str(out)]) == 2


def test_a_packed_member_records_its_solo_trials_per_epoch_numbers(tmp_path: Path, monkeypatch) -> None:
    """CORES² (which judges examples) and L_DMI packed side by side, diagnosed on a sample of the training set:
    every new per-epoch number equals the solo trial's; and the per-epoch test accuracy at the selected and last
    epochs is the row's."""
    monkeypatch.setattr(exec_diagnostics, "TRAIN_SAMPLE", 300)
    configs = [TrialConfig("synthetic", "cores", "case3", 0.3, seed=1, epochs=3, epochs_warmup=2),
               TrialConfig("synthetic", "dmi", "case2", 0.4, seed=2, epochs=3, epochs_warmup=2)]
    run_pack(configs, "unused", results=tmp_path / "packed", **QUIET)
    for config in configs:
        solo = run_trial(config, "unused", results=tmp_path / "solo", **QUIET)
        a = pl.read_parquet(tmp_path / "packed" / "epochs" / f"{config.trial_id}.parquet")
        b = pl.read_parquet(tmp_path / "solo" / "epochs" / f"{config.trial_id}.parquet")
        assert a["stage"].to_list() == b["stage"].to_list() == ["warmup"] * 2 + ["method"] * 4
        # Every column counts examples; packed and solo are two float orders of one training, in which an
        # example's prediction, judgement or rank moves only where it lies within rounding of the boundary:
        # `ACCURACY_EXAMPLES` at most (tests/tolerances.py). So each may move by that many of its denominator.
        sample = prepare(config, "unused", **QUIET)
        flipped = int((sample.diag_train.labels != sample.diag_clean).sum())
        kept = sample.diag_clean.numel() - flipped
        for column in DIAGNOSTIC_COLUMNS:
            for x, y, flagged in zip(a[column], b[column], b["det_flagged"], strict=True):
                denominator = {"test_acc": 1000 / 100, "train_clean_acc": 300 / 100,
                               "train_noisy_acc_flipped": flipped / 100, "train_noisy_acc_kept": kept / 100,
                               "det_flagged": 300, "det_recall": flipped, "det_auroc": min(flipped, kept),
                               "det_precision": max(round((flagged or 0) * 300) - ACCURACY_EXAMPLES, 1)}[column]
                assert (x is None and y is None) or abs(x - y) <= ACCURACY_EXAMPLES / denominator, (column, x, y)
        method = b.filter(stage="method")
        # Exactly: the leaderboard (rows) and the three-rules table (epochs) must print the same number.
        assert method["test_acc"][solo["best_epoch"]] == solo["test_acc"]
        assert method["test_acc"][-1] == solo["last_test_acc"]
        judged = method["det_auroc"].drop_nulls()
        assert judged.len() == (4 if config.method == "cores" else 0)
        assert config.method != "cores" or judged.min() > 0.5  # the sieve ranks flipped labels above kept ones


def test_report_shows_rules_curves_detection_cost_and_label_links(tmp_path: Path) -> None:
    """A real two-seed grid of CE and Co-teaching: the report's tables agree with the rows and epochs tables."""
    results = tmp_path / "results"
    for method, seed in itertools.product(("ce", "coteaching"), (0, 1)):
        run_trial(TrialConfig("synthetic", method, "case3", 0.4, seed=seed, epochs=3, epochs_warmup=2),
                  "unused", results=results, **QUIET)
    written = build_report(results, tmp_path / "out", log=lambda s: None)
    trials, epochs = read_table(results), read_table(results, "epochs")
    rules = pl.read_csv(written["selection_rules csv"]).sort("method")
    per_trial = trial_rules(epochs).join(trials.select("trial_id", "method", "test_acc", "last_test_acc"),
                                         on="trial_id")
    for cell in rules.iter_rows(named=True):
        mine = per_trial.filter(method=cell["method"])
        # Float64 means of the same two accuracies, through a CSV that keeps every digit: rounding far below 1e-6.
        assert cell["selected_mean"] == pytest.approx(mine["test_acc"].mean())  # the headline's rule
        assert cell["last_mean"] == pytest.approx(mine["last_test_acc"].mean())
        assert cell["oracle_mean"] == pytest.approx(mine["oracle_acc"].mean())
        assert cell["oracle_mean"] >= cell["selected_mean"] - 1e-9 and cell["oracle_gap"] >= -1e-9
    assert pl.read_csv(written["detection csv"])["method"].to_list() == ["coteaching"]
    cost = pl.read_csv(written["cost csv"]).sort("method")
    assert cost["networks"].to_list() == [1, 2]
    assert cost["device_h_total"].sum() == pytest.approx(trials["device_s"].sum() / 3600)
    page = written["report.html"].read_text(encoding="utf-8")
    for heading in ("Checkpoint selection: three rules", "Memorisation curves", "Detection quality", "Cost",
                    "Noisy labels", "best test epoch †"):
        assert heading in page
    assert 'href="#labels-synthetic-case3-0.4"' in page and 'id="labels-synthetic-case3-0.4"' in page
    for noise_hash in trials["noise_hash"].unique():
        assert noise_hash in page
    for name in ("memorisation synthetic case3", "detection synthetic case3"):
        assert written[f"plot {name}"].read_bytes()[:4] == b"\x89PNG"


def test_the_memorisation_legend_names_every_curve_drawn_in_any_panel() -> None:
    """#55: the legend was the top-left panel's (r = 0, where nothing is flipped): the red flipped-examples curve,
    the figure's point, was missing from it."""
    rows = [dict(r=r, method="ce", stage="warmup" if x == 1 else "method", x=x,
                 train_noisy_acc_flipped=None if r == 0 else 10.0 * x, train_noisy_acc_kept=90.0, train_clean_acc=80.0,
                 test_acc=75.0) for r in (0.0, 0.4) for x in (1, 2, 3)]
    figure = plots.Panels([0.0, 0.4], ["ce"], plots.MEMORISATION, "accuracy (%)", {"ce": "CE"}, (-2, 102)).draw(
        pl.DataFrame(rows), "t")
    assert [text.get_text() for text in figure.legends[0].get_texts()] == [
        "noisy label, flipped examples (memorised)", "noisy label, kept examples", "clean label, training set",
        "clean test set"]


def test_mlflow_mirrors_the_per_epoch_numbers(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from bench.store.mirror import open_mirror

    results = tmp_path / "results"
    row = run_trial(TrialConfig("synthetic", "coteaching", "case3", 0.4, seed=0, epochs=3, epochs_warmup=2),
                    "unused", results=results, **QUIET)
    assert open_mirror(results, None).sync(results) == 1
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("adhoc").experiment_id])[0]
    epochs = read_table(results, "epochs").filter(stage="method").sort("epoch")
    for column in ("test_acc", "train_noisy_acc_flipped", "det_auroc"):
        history = sorted(client.get_metric_history(run.info.run_id, f"epoch_{column}"), key=lambda m: m.step)
        assert [m.step for m in history] == [0, 1, 2, 3]
        assert [m.value for m in history] == pytest.approx(epochs[column].to_list())
    assert run.data.metrics["device_s"] == pytest.approx(row["device_s"])


def test_diagnostics_switch_off_leaves_the_training_unchanged(tmp_path: Path, monkeypatch) -> None:
    """BENCH_EPOCH_EVAL=0: no diagnostic column is filled and no sample is held, and the trial's numbers are those
    of the same trial with diagnostics on (they only look: evaluation mode, no random draws)."""
    from bench.exec.prepare import prepare

    config = TrialConfig("synthetic", "mentornet", "case3", 0.3, seed=4, epochs=3, epochs_warmup=2)
    on = run_trial(config, "unused", results=tmp_path / "on", **QUIET)
    monkeypatch.setenv("BENCH_EPOCH_EVAL", "0")
    off = run_trial(config, "unused", results=tmp_path / "off", **QUIET)
    assert prepare(config, "unused", log=lambda s: None).diag_index.numel() == 0
    for key in ("best_epoch", "val_loss", "test_acc", "last_test_acc", "warmup_test_acc"):
        assert on[key] == off[key], key
    curves = {name: pl.read_parquet(tmp_path / name / "epochs" / f"{config.trial_id}.parquet")
              for name in ("on", "off")}
    assert curves["off"]["train_noisy_acc_flipped"].null_count() == curves["off"].height
    assert curves["on"]["train_noisy_acc_flipped"].null_count() == 0
    assert curves["on"]["det_auroc"].drop_nulls().len() > 0
    assert curves["on"]["train_loss"].to_list() == curves["off"]["train_loss"].to_list()


def test_the_samples_curves_lie_within_their_standard_error_of_the_whole_sets(tmp_path: Path, monkeypatch) -> None:
    """The same trial diagnosed on the default sample (`train_sample`: 1,500 of the synthetic set's 4,000 training
    examples) and on the whole training set (BENCH_EPOCH_EVAL=full). Training never reads the sample, so every
    other number is bit-equal. Each share measured on the sample is a draw without replacement from the whole
    set's: for a share p over M examples of which the sample holds m, its standard error is
    sqrt(p (1 - p) / m * (M - m) / (M - 1)) (docs/reports.md). Each of the 25 shares here lies within 4 of
    those of the whole set's value (a family-wise false alarm below 0.3%), and the sample is what `train_sample`
    says: a fixed, sorted choice, none of the global streams drawn."""
    config = TrialConfig("synthetic", "cores", "case3", 0.4, seed=5, epochs=3, epochs_warmup=3)
    torch.manual_seed(123)
    stream = torch.get_rng_state()
    sample = train_sample(4000, "synthetic")
    assert torch.equal(torch.get_rng_state(), stream) and len(sample) == exec_diagnostics.TRAIN_SAMPLE == 1500
    by_sample = run_trial(config, "unused", results=tmp_path / "sample", **QUIET)
    monkeypatch.setenv("BENCH_EPOCH_EVAL", "full")
    whole = run_trial(config, "unused", results=tmp_path / "whole", **QUIET)
    for key in ("best_epoch", "val_loss", "test_acc", "last_test_acc", "warmup_test_acc", "noise_hash"):
        assert by_sample[key] == whole[key], key
    a, b = (pl.read_parquet(tmp_path / name / "epochs" / f"{config.trial_id}.parquet") for name in ("sample", "whole"))
    for column in ("train_loss", "val_loss", "val_acc", "test_acc"):
        assert a[column].to_list() == b[column].to_list(), column

    p = prepare(config, "unused", **QUIET)  # the whole set's labels; the sample's are those at `sample`
    clean, noisy = p.splits.train.y, p.labels.train
    flipped = noisy != clean
    sizes = {"train_clean_acc": np.ones_like(flipped), "train_noisy_acc_flipped": flipped,
             "train_noisy_acc_kept": ~flipped, "det_flagged": np.ones_like(flipped)}
    compared = 0
    for column, members in sizes.items():
        big_m, m = int(members.sum()), int(members[sample].sum())
        scale = 100.0 if column.startswith("train_") else 1.0
        for x, y in zip(a[column], b[column], strict=True):
            if y is None:
                assert x is None
                continue
            share = y / scale
            se = np.sqrt(share * (1 - share) / m * (big_m - m) / (big_m - 1))
            assert abs(x - y) / scale <= 4 * se + 1e-12, (column, x, y, se)
            compared += 1
    assert compared >= 20
    # the curves move (memorisation of the flipped labels grows over the warm start), so the check is not vacuous
    assert b.filter(stage="warmup")["train_noisy_acc_flipped"].to_list()[-1] > 0
