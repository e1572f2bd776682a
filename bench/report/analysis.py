"""The protocol over rows: loading, selection, aggregation, paired tests against L_DMI, the paper comparison.

The benchmark's protocol over result rows, in one place: loading the rows, selecting hyper-parameters,
aggregating over seeds, paired tests against L_DMI, the paper comparison and the transition-matrix table. The run
summary (`bench.grid.progress`), `bench report` and `bench leaderboard` all call it, so each rule exists once; rendering
is `bench.report.leaderboard`'s and `bench.report.plots`'.

The paper's protocol, applied per cell (dataset, noise, r, method):
  1. selection: of the hyper-parameter settings tried (lr, batch size, method parameters, epochs, ...), keep the
     one with the lowest MEAN noisy-validation loss over its seeds (per cell, not per seed: the README's Reports
     section says why). Test accuracy is never looked at to choose.
  2. statistics over the seeds of that setting: mean, sample std, n, a 95% t-interval (from `MIN_CI_SEEDS` seeds;
     clipped to [0, 100], where an accuracy's mean lies), for the accuracy at the selected checkpoint (`test_acc`)
     and at the last epoch (`last_test_acc`).
Trials that diverged keep their best checkpoint before divergence (the trainer's rule), so they count and are
counted; failed trials have no numbers and are only counted. A cell of the grid (methods x r for each dataset
and noise) without a usable trial is shown as missing, never dropped.

Seeds share noisy labels across methods, so L_DMI is compared with each baseline per cell as paired samples
matched on seed (`paired_comparison`). The intervals and tests themselves, over plain numbers, are
`bench.report.statistics`'; the one rounding for display (`fmt`) is here.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import io
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from bench.config import UserError, lookup
from bench.declarations import declared
from bench.noise import is_instance_dependent
from bench.report.statistics import ALPHA, MIN_CI_SEEDS, accuracy_interval, marker, paired_test
from bench.store import folder
from bench.store.columns import conform

CELL = ["dataset", "noise", "r", "method"]
# The columns that make a hyper-parameter setting (everything of a trial's config but the cell and the seed).
# A setting includes its protocol (`bench.protocol`) and its precision: two protocols' (or precisions') trials of one
# seed are two trainings.
SETTING_COLUMNS = ["model", "lr", "batch_size", "method_params", "epochs", "epochs_warmup", "train_subset", "protocol",
                   "precision"]
PROVENANCE_COLUMNS = ["git_commit", "torch_version", "numpy_version", "python_version", "device", "noise_hash"]
REQUIRED_COLUMNS = ["dataset", "method", "noise", "r", "seed", "status", "val_loss", "test_acc"]
USABLE_STATUS = ("ok", "diverged")
# What a row measured: two rows of one trial (from two results folders) that differ here cannot both be its row.
CONFLICT_COLUMNS = ["status", "best_epoch", "val_loss", "test_acc", "last_test_acc"]
REFERENCE = "dmi"
REFERENCE_CSV = "reference_results.csv"
# Published results on the datasets beyond the paper (mini-WebVision, ANIMAL-10N, Food-101N, Red Mini-ImageNet), each
# row citing its paper (`source`) and `table`, the `network` it trained (`model`: the registered bench model of that
# network, empty where bench has none), its training `budget`, and `checked`: how the number was checked against its
# source, or that it could not be. The paper-vs-measured comparison reads them beside the paper's own.
LITERATURE_CSV = "literature_results.csv"
# `bench leaderboard --metric`: the checkpoint selected on the noisy validation set (the protocol), or the last one.
METRICS = {"selected": "test_acc", "last": "last_test_acc"}
DIGITS = 2  # accuracies are shown in percent with two decimals, as in the paper's tables
MISSING = "—"
# `transition_estimates`' truth for instance-dependent noise: no T generates it, its realised T stands in.
REALISED = "realised (instance-dependent: no generating T)"
_ORDER = ["ce", "mentornet", "vat", "fw", "fw_oracle", "gce", "lccn"]


def label(method: str) -> str:
    """A method's name in tables and figures: its `Method.title` up to any parenthesis ("LCCN (safeguarded dynamic
    label regression)" -> "LCCN"); the name itself for a method that is not registered (any more)."""
    return _labels().get(method, method)


@functools.cache
def _labels() -> dict[str, str]:
    # Read from the plug-ins' files, not imported: they are torch modules, and a listing of rows needs no torch
    # (tests/cli/test_no_torch_readers.py).
    return {name: title.split(" (")[0] for name, title in declared("method", "title").items() if title}


# ---------------------------------------------------------------------------------------------------- loading


# What computed a trial (`bench.numerics`): a cell whose trials differ here compares other float orders.
FLOAT_ORDER = ("numerics", "threads", "cpu_capability")


def float_orders(df: pl.DataFrame) -> str:
    """What computed the trials, as the report's first line ends (`bench.numerics`): their float order (numerics,
    threads, ATen's kernels), each with its count of trials; and a warning naming the cells whose trials were computed
    in more than one, whose seeds' spread and methods' differences then hold float-order noise too."""
    if df.is_empty():
        return ""
    df = df.with_columns(pl.concat_str([pl.col(c).cast(pl.String).fill_null("?") for c in FLOAT_ORDER],
                                       separator="/").alias("float_order"))
    counts = df.group_by("float_order").len().sort("float_order")
    text = " Float order (numerics/threads/kernels): " + ", ".join(
        f"{order}" + (f" ({n} trials)" if counts.height > 1 else "") for order, n in counts.iter_rows()) + "."
    mixed = (df.group_by(CELL).agg(pl.col("float_order").unique().sort())
             .filter(pl.col("float_order").list.len() > 1).sort(CELL))
    if mixed.is_empty():
        return text
    first = mixed.row(0, named=True)
    where = f"{first['dataset']} {first['noise']} r={first['r']:g} {first['method']}: {', '.join(first['float_order'])}"
    more = f" and {mixed.height - 1} more" if mixed.height > 1 else ""
    return text + (f" Warning: {mixed.height} cell{'s' * (mixed.height > 1)} mix{'es' * (mixed.height == 1)} float "
                   f"orders ({where}{more}): their trials are not one computation; run them with one numerics and "
                   "threads.")


def load_trials(results: str | Path | Sequence[str | Path]) -> pl.DataFrame:
    """All trial rows under `results` (one folder, or several: `bench report A B ...`), with the setting hash and the
    optional columns filled in. A trial found in two folders counts once; two rows of one trial that measured
    different numbers (`CONFLICT_COLUMNS`) are refused in one line: which is the trial's is not ours to choose."""
    folders = [str(results)] if isinstance(results, (str, Path)) else [str(r) for r in results]
    frames = []
    for where in folders:
        if folder.is_local(where) and not folder.local_path(where).is_dir():
            raise UserError(f"results folder {where} does not exist")
        df = folder.read_table(where, "trials")
        if df.is_empty():
            raise UserError(f"no result rows under {where}/trials: run `bench trial` or `bench run` first")
        if missing := [c for c in REQUIRED_COLUMNS if c not in df.columns]:
            raise UserError(f"the result rows under {where} lack the columns {', '.join(missing)}")
        frames.append(conform(df).with_columns(pl.lit(where).alias("_folder")))
    df = pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else frames[0]
    measured = df.select("trial_id", *CONFLICT_COLUMNS, "_folder").unique(["trial_id", *CONFLICT_COLUMNS])
    if (twice := measured.filter(pl.col("trial_id").is_duplicated())).height:
        a, b = twice.filter(pl.col("trial_id") == twice["trial_id"][0]).sort(
            pl.col("_folder").replace_strict(folders, list(range(len(folders))))).head(2).iter_rows(named=True)
        differ = ", ".join(f"{c} {a[c]} vs {b[c]}" for c in CONFLICT_COLUMNS if a[c] != b[c])
        raise UserError(f"trial {a['trial_id']} has two different rows, in {a['_folder']} and {b['_folder']} "
                        f"({differ}): report the folders apart, or remove one of the rows")
    return _once_per_seed(with_usable(df.unique("trial_id", keep="first", maintain_order=True).drop("_folder")))


def with_usable(df: pl.DataFrame) -> pl.DataFrame:
    """Rows as read (`bench.store.folder.read_table`) with their columns typed, their setting hashed (`setting`)
    and whether they measured their trial (`usable`: ok or diverged, with a finite validation loss and a test
    accuracy)."""
    df = conform(df)  # a column older rows lack: its default (protocol: bench), else null
    df = df.with_columns(
        pl.col("r").cast(pl.Float64).round(6),
        pl.col("seed").cast(pl.Int64),
        pl.col("val_loss", "test_acc", "last_test_acc").cast(pl.Float64),
        pl.col("privileged").cast(pl.Boolean),
        pl.col("oracle").cast(pl.Boolean),
    )
    settings = [
        hashlib.sha256(json.dumps(list(row), default=str).encode()).hexdigest()[:10]
        for row in df.select(SETTING_COLUMNS).iter_rows()
    ]
    usable = (
        pl.col("status").is_in(USABLE_STATUS) & pl.col("val_loss").is_finite() & pl.col("test_acc").is_not_null()
    )
    return df.with_columns(pl.Series("setting", settings, dtype=pl.String), usable.fill_null(False).alias("usable"))


def _once_per_seed(df: pl.DataFrame) -> pl.DataFrame:
    """One row per (cell, setting, seed): rows of one training under two trial ids (made before ids hashed the
    effective configuration, or before a default changed) would count a seed twice. The newest usable row stays."""
    key = CELL + ["setting", "seed"]
    once = (df.sort(["usable", "finished_at", "trial_id"], descending=[True, True, False], nulls_last=True)
            .unique(subset=key, keep="first", maintain_order=True))
    if once.height < df.height:
        print(f"bench: warning: {df.height - once.height} result rows repeat the (cell, setting, seed) of another "
              "row; each is counted once, from its newest row", file=sys.stderr, flush=True)
    return once.sort("trial_id")


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


def selected_trials(df: pl.DataFrame) -> pl.DataFrame:
    """The usable trials of each cell's selected setting (`select_settings`): the trials its statistics are over."""
    return df.join(select_settings(df), on=CELL + ["setting"], how="inner").filter(pl.col("usable"))


def seed_accuracies(chosen: pl.DataFrame) -> dict[tuple[Any, ...], dict[int, float]]:
    """Per cell, each seed's clean test accuracy among its trials in `chosen` (`selected_trials`: one trial per seed,
    the selected setting's, the trials its mean is over)."""
    seeds = chosen.group_by(CELL).agg("seed", "test_acc")
    return {tuple(row[:4]): dict(zip(row[4], row[5], strict=True)) for row in seeds.iter_rows()}


def fmt(x: float | None, digits: int = DIGITS) -> str:
    """The one rounding of a number for display: the run summary, `bench report` and `bench leaderboard` all call
    it, so they never differ in the last digit. Python's formatting rounds the stored binary value (a mean of
    98.455 is stored as 98.45499... and shows 98.45), where polars' `round` rounds the shortest decimal text
    (98.46)."""
    return MISSING if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def interval_text(low: float | None, high: float | None, n: int) -> str:
    """An interval as the report prints it; under `MIN_CI_SEEDS` seeds it says so instead."""
    if n and n < MIN_CI_SEEDS:
        return f"n = {n}: too few seeds for an interval"
    return MISSING if low is None or high is None else f"[{fmt(low)}, {fmt(high)}]"


def _joined(values: list[Any]) -> str:
    return ", ".join(sorted({str(v) for v in values if v is not None}))


def aggregate(df: pl.DataFrame, reference: str = REFERENCE, planned: pl.DataFrame | None = None) -> pl.DataFrame:
    """The grid: one row per (dataset, noise) x every method in the results x every r of that dataset and noise,
    with the selected setting's statistics (null where no usable trial: a missing cell) and trial counts.
    `planned`: the trials the folder's recorded grids asked for (`bench.report.completeness.planned`, with
    `measured`): their cells and methods join the grid (a method without a row is a column of missing cells), and
    each cell counts them (`planned`) and those without a usable row (`unmeasured`)."""
    if planned is None:
        planned = pl.DataFrame(schema={**dict.fromkeys(CELL, pl.String), "r": pl.Float64, "measured": pl.Boolean})
    chosen = selected_trials(df)
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
    asked = planned.group_by(CELL).agg(pl.len().alias("planned"), (~pl.col("measured")).sum().alias("unmeasured"))
    methods = method_order(list(dict.fromkeys(df["method"].to_list() + planned["method"].to_list())), reference)
    grid = (
        pl.concat([df.select("dataset", "noise", "r"), planned.select("dataset", "noise", "r")]).unique()
        .join(pl.DataFrame({"method": methods}).with_row_index("method_rank"), how="cross")
        .join(counts, on=CELL, how="left")
        .join(asked, on=CELL, how="left")
        .join(stats_frame, on=CELL, how="left")
        .join(df.group_by("method").agg(pl.col("privileged").any()), on="method", how="left")
        # A cell whose trials kept their epoch by clean test accuracy (the authors' Dogs vs Cats LCCN): no result.
        .join(df.group_by(CELL).agg(pl.col("oracle").fill_null(False).any()), on=CELL, how="left")
        .with_columns(
            pl.col("trials", "ok", "diverged", "failed", "settings_tried", "n", "planned", "unmeasured")
            .fill_null(0).cast(pl.Int64),
            pl.col("privileged", "oracle").fill_null(False),  # a method or cell of the grid without a row
        )
        .sort("dataset", "noise", "r", "method_rank")
    )
    rows = []
    for row in grid.iter_rows(named=True):
        for key in ("acc", "last"):
            row[f"{key}_ci_low"], row[f"{key}_ci_high"] = accuracy_interval(row[f"{key}_mean"], row[f"{key}_std"],
                                                                            row["n"])
        for c in PROVENANCE_COLUMNS[:5]:
            row[f"{c}s"] = _joined(row[f"{c}s"] or [])
        row["seeds"] = ",".join(str(s) for s in row["seeds"] or [])
        rows.append(row)
    schema = dict(grid.schema) | {f"{k}_ci_{e}": pl.Float64 for k in ("acc", "last") for e in ("low", "high")}
    schema |= {f"{c}s": pl.String for c in PROVENANCE_COLUMNS[:5]} | {"seeds": pl.String}
    first = ["dataset", "noise", "r", "method", "privileged", "n", "acc_mean", "acc_std", "acc_ci_low", "acc_ci_high",
             "last_mean", "last_std", "last_ci_low", "last_ci_high", "val_loss_mean", "trials", "ok", "diverged",
             "failed", "planned", "unmeasured", "settings_tried", "setting"]
    frame = pl.DataFrame(rows, schema=schema).drop("method_rank")
    return frame.select(first + [c for c in frame.columns if c not in first])


def paired_comparison(df: pl.DataFrame, grid: pl.DataFrame, reference: str = REFERENCE,
                      metric: str = "test_acc") -> pl.DataFrame:
    """The reference method against each other method per (dataset, noise, r): seeds matched between the two
    selected settings. outcome is the reference's win / tie / loss at level ALPHA (untested under two pairs)."""
    chosen = selected_trials(df)
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
    model's T where a T generates the noise; for human noise (no model T), the empirical T of the noisy labels
    against the clean ones; for instance-dependent noise, which no T generates, the realised T (`REALISED`)."""
    columns = {"dataset": pl.String, "noise": pl.String, "r": pl.Float64, "method": pl.String, "truth": pl.String,
               "n": pl.Int64, "err_mean": pl.Float64, "err_std": pl.Float64, "acc_mean": pl.Float64,
               "acc_std": pl.Float64, "last_mean": pl.Float64, "t_hat_mean": pl.String}
    if "estimated_transition" not in df.columns:
        return pl.DataFrame(schema=columns)
    truth_cols = [c for c in ("transition", "empirical_transition") if c in df.columns]
    chosen = selected_trials(df).filter(pl.col("estimated_transition").is_not_null())
    rows = []
    for row in chosen.iter_rows(named=True):
        source = next(((c, row[c]) for c in truth_cols if row[c] is not None), (None, None))
        error = None if source[1] is None else _relative_error(row["estimated_transition"], source[1])
        truth = {"transition": "noise model", "empirical_transition": "empirical"}.get(source[0])
        if source[0] == "empirical_transition" and is_instance_dependent(row["noise"]):
            truth = REALISED
        rows.append(dict(dataset=row["dataset"], noise=row["noise"], r=row["r"], method=row["method"], truth=truth,
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


def package_text(*parts: str) -> str:
    """A text file shipped inside the `bench.report` package (package data, so an installed wheel carries it)."""
    try:
        return importlib.resources.files("bench.report").joinpath(*parts).read_text(encoding="utf-8")
    except (NotADirectoryError, FileNotFoundError, TypeError):
        # An editable install maps `bench` (and its bench.baselines / bench.datasets folders) through a path hook
        # that importlib.resources may reject. The file sits beside this module either way.
        return Path(__file__).parent.joinpath(*parts).read_text(encoding="utf-8")


def read_reference(name: str = REFERENCE_CSV) -> pl.DataFrame:
    """The paper's published table, shipped as package data (bench/report/reference_results.csv), or another table
    of published results in its columns (`LITERATURE_CSV`)."""
    return pl.read_csv(io.StringIO(package_text(name)),
                       schema_overrides={"noise_r": pl.Float64, "acc_mean": pl.Float64, "acc_std": pl.Float64})


def paper_noise(dataset: str) -> str | None:
    """The pattern of the paper's table for a dataset name (None: no table, or no such dataset registered)."""
    return declared("dataset", "paper_noise").get(dataset)


PAPER, LITERATURE = "paper", "literature"  # `read_published`'s `published_by`: whose table a published row is from


def read_published() -> pl.DataFrame:
    """Every published result a run is shown beside: the paper's table (its network: each dataset's own model, which
    the paper trains), then the literature's on the other datasets, with their networks. `published_by` says whose
    each row is (`PAPER` or `LITERATURE`); `source` and `table` cite the table itself."""
    models = declared("dataset", "model")
    paper = read_reference().with_columns(
        pl.col("dataset").map_elements(lambda name: lookup(models, "dataset", name), return_dtype=pl.String)
        .alias("model"))
    paper = paper.with_columns(pl.col("model").alias("network"), pl.lit("the L_DMI paper").alias("table"),
                               pl.lit(PAPER).alias("published_by"))
    literature = read_reference(LITERATURE_CSV).with_columns(pl.lit(LITERATURE).alias("published_by"))
    return pl.concat([paper, literature], how="diagonal_relaxed")


def published_datasets() -> dict[str, list[str]]:
    """The datasets each published table covers: {PAPER: the paper's tables', LITERATURE: the literature's}."""
    published = read_published()
    return {t: sorted(published.filter(published_by=t)["dataset"].unique().to_list()) for t in (PAPER, LITERATURE)}


def network_note(ours: str | None, network: str | None, model: str | None) -> str:
    """What the panel says where our network is not the published one: a linear probe, another registered network,
    or a network bench does not have ("" where they are the same, or nothing was measured)."""
    if not ours:
        return ""
    base = ours.split("(")[0]
    if base == "linear_probe":
        return f"ours: a linear probe on frozen features ({ours}), not a trained {network}"
    if not model:
        return f"ours: {ours}; the published {network} is not in bench"
    return "" if base == model else f"ours: {ours}, not {network}"


def paper_comparison(grid: pl.DataFrame) -> pl.DataFrame:
    """Every published row of the datasets we have results for, with whose table it is (`published_by`: the paper's
    or the literature's), our number beside it (null: not measured), the difference and a flag where |diff| exceeds
    the combined std sqrt(ours^2 + paper^2); beside each, the network it was published with and ours
    (`network_note` says where they differ: another network, or a linear probe), and its source, table and how it
    was checked."""
    ours = grid.filter(
        pl.struct("dataset", "noise").map_elements(
            lambda s: paper_noise(s["dataset"]) == s["noise"], return_dtype=pl.Boolean)
    ).select("dataset", "r", "method", "acc_mean", "acc_std", "n", pl.col("model").alias("ours_model"))
    paper = read_published().with_columns(pl.col("noise_r").fill_null(0.0).round(6).alias("r"))
    paper = paper.filter(pl.col("dataset").is_in(grid["dataset"].unique().to_list()))
    joined = paper.join(ours, on=["dataset", "r", "method"], how="left").with_columns(
        pl.col("noise_r").alias("paper_r"),
        (pl.col("acc_mean_right") - pl.col("acc_mean")).alias("diff"),
        (pl.col("acc_std_right").fill_null(0.0).pow(2) + pl.col("acc_std").fill_null(0.0).pow(2))
        .sqrt().alias("combined_std"),
    )
    notes = [network_note(*row) for row in joined.select("ours_model", "network", "model").iter_rows()]
    return joined.with_columns(pl.Series("network_note", notes, dtype=pl.String)).select(
        "dataset", "r", "method", "published_by",
        pl.col("acc_mean").alias("paper_mean"), pl.col("acc_std").alias("paper_std"),
        pl.col("acc_mean_right").alias("ours_mean"), pl.col("acc_std_right").alias("ours_std"),
        pl.col("n").fill_null(0).alias("ours_n"), "diff", "combined_std",
        (pl.col("diff").abs() > pl.col("combined_std")).alias("flag"),
        pl.col("network").alias("paper_network"), "ours_model", "network_note", "source", "table", "checked",
    )
