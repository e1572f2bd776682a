"""What a trial cost, for the report's cost table (`bench.report.diagnostics`): its device-seconds with its CE warm
start shared. A warm start is trained once per (data, noise, seed, warm-start settings) and loaded by every other
trial of that cell, whatever its method or setting (`bench.exec.warmstart`); the trial that happened to train it
records its training seconds in `warmup_s`, the others their loads. Charged to that one trial, a 30-trial grid reads
as CE costing 13 times L_DMI; here the seconds all the trials of one warm start spent in it are summed and split
evenly over them."""

from __future__ import annotations

import polars as pl

from bench.report.analysis import CELL

COST_NOTE = (
    "Device-seconds: a trial's wall time on its device (its share of a pack's), without the per-epoch diagnostics, "
    "its CE warm start shared: a warm start is trained once and loaded by every other trial (method and setting) of "
    "its data, noise and seed, so its seconds are split evenly over all the trials that use it, whichever trained "
    "it; mean per trial of the selected setting (warm start: its share). Accuracy per device-hour: mean test "
    "accuracy at the selected epoch divided by the mean device-hours of a trial. Networks: trained in the method "
    "stage."
)
# The columns that tell which CE warm start a trial used (`bench.exec.prepare.warm_start_key` from its row): its data,
# noise and seed, the labels drawn, the warm start's schedule, precision and protocol.
WARM_START = ["dataset", "model", "noise", "r", "seed", "noise_hash", "train_subset", "epochs_warmup", "precision",
              "protocol"]


def shared_device_seconds(trials: pl.DataFrame) -> pl.DataFrame:
    """Per trial (`trial_id`): its device-seconds with its CE warm start shared (`device_s_shared`), and that share
    (`warm_share_s`). The seconds the trials of one warm start (`WARM_START`) spent in it, training it or loading it,
    summed and split evenly over them; its own seconds are the rest of its device-seconds. A row without `warmup_s`
    (failed before it ended, or written before the column) keeps its device-seconds and takes no share."""
    frame = trials.with_columns(pl.lit(None).alias(c) for c in WARM_START + ["warmup_s", "device_s"]
                                if c not in trials.columns)
    frame = frame.with_columns(
        pl.col("device_s").cast(pl.Float64).fill_null(pl.col("wall_s").cast(pl.Float64)).alias("_device"),
        pl.col("warmup_s").cast(pl.Float64).alias("_warm"))
    has = pl.col("_warm").is_not_null()
    share = (pl.col("_warm").sum() / has.sum()).over([pl.col(c).fill_null(-1) if c == "train_subset" else c
                                                      for c in WARM_START] + [has])
    return frame.select(
        "trial_id",
        pl.when(has).then(share).alias("warm_share_s"),
        pl.when(has).then((pl.col("_device") - pl.col("_warm")).clip(lower_bound=0.0) + share)
        .otherwise(pl.col("_device")).alias("device_s_shared"))


def cost_table(chosen: pl.DataFrame) -> pl.DataFrame:

    return chosen.with_columns(pl.col("device_s_shared").alias("device_s")).group_by(CELL).agg(
        pl.len().alias("n"), pl.col("device").unique().sort().str.join(", ").alias("devices"),
        (pl.col("epochs_warmup").cast(pl.String) + "+" + pl.col("epochs").cast(pl.String)).first().alias("epochs"),
        pl.col("networks").max().alias("networks"), pl.col("wall_s").mean().alias("wall_s_mean"),
        pl.col("device_s").mean().alias("device_s_mean"), pl.col("warm_share_s").mean().alias("warm_share_s_mean"),
        (pl.col("device_s").sum() / 3600).alias("device_h_total"),
        pl.col("test_acc").mean().alias("acc_mean"),
    ).with_columns((pl.col("acc_mean") / (pl.col("device_s_mean") / 3600)).alias("acc_per_device_hour")).sort(CELL)


def totals(trials: pl.DataFrame) -> pl.DataFrame:
    """The whole grid's cost per device: every trial, every setting, failed ones included."""

    seconds = pl.col("device_s").cast(pl.Float64) if "device_s" in trials.columns else pl.lit(None, pl.Float64)
    frame = trials.with_columns(seconds.fill_null(pl.col("wall_s").cast(pl.Float64)).alias("_s"))
    return frame.group_by("device").agg(pl.len().alias("trials"), (pl.col("_s").sum() / 3600).alias("device_h"),
                                        ).sort("device")
