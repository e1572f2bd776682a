"""The panel of checkpoint rules, memorisation curves, detection quality, the labels' origin and cost (device-seconds, a
CE warm start shared by the trials that load it).

What a benchmark reader asks beyond the headline: three checkpoint-selection rules side by side, memorisation
curves, detection quality, cost per method, and where each cell's exact noisy labels come from.

Per epoch (made by `bench.exec.stage.run_stage` for solo and packed members alike, in the epochs table; the training-set
numbers on a fixed sample of at most `TRAIN_SAMPLE` examples, `train_sample`):
    test_acc                  clean test accuracy of the current state (%)
    train_clean_acc           training-set accuracy against the clean labels (%)
    train_noisy_acc_flipped   accuracy against the noisy label on the examples whose label was flipped (%): how
                              much of the wrong labelling the network has memorised
    train_noisy_acc_kept      the same on the examples whose label was kept (%)
    det_flagged               share of training examples the method judges noisy (`Method.judged_noisy`, 0-1)
    det_precision, det_recall of "judged noisy" against the true flips (0-1; precision is empty when nothing
                              is flagged)
    det_auroc                 AUROC of the method's noise score against the true flips (rank-based, ties averaged)
Training examples with an unknown clean label (< 0, Clothing1M) count in none of these.

The three rules, per trial, over the method-stage epochs (epoch 0 is the warm-started model):
    selected  the epoch with the lowest noisy-validation loss, the earliest on ties: the paper's rule, the
              trainer's, and the leaderboard's headline
    last      the last epoch trained
    oracle    the epoch with the best clean TEST accuracy: it looks at the test set, so it is an oracle (an upper
              bound for any rule), never a result; flagged "†" wherever it appears
A cell's hyper-parameter setting is always the one chosen on noisy validation (`bench.report.analysis.select_settings`);
only the epoch rule differs.

Cost: a trial's device-seconds are its wall time on its one device (its share of a pack's) less the time its
per-epoch diagnostics took, with its CE warm start shared: a warm start is trained once per (data, noise, seed,
warm-start settings) and loaded by the other trials of that cell, so the seconds every trial of the results folder
spent in it (`warmup_s`: the training, the loads) are summed and split evenly over those trials
(`shared_device_seconds`: charged to the one trial that trained it, a 30-trial grid reads as CE costing 13
times L_DMI); networks are those the method stage trains.

The per-epoch numbers themselves are computed on the training device by `bench.exec.diagnostics`; this module reads
them back from the epochs table. The report's panel: `DiagnosticsPanel`.
"""

from __future__ import annotations

import html
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from bench.report.analysis import CELL, fmt
from bench.report.panel import Context, Panel
from bench.report.render import fmt_r, fmt_whole, html_table, md, png, td
from bench.store.columns import DIAGNOSTIC_COLUMNS

ORACLE = "†"
RULES_NOTE = (
    "Clean test accuracy (%) of the same trials under three checkpoint rules: the epoch selected on the noisy "
    "validation set (the paper's rule and the leaderboard's headline), the last epoch, and the best test epoch "
    f"({ORACLE} an oracle: it chooses by looking at the test set, so it bounds every rule from above and is not a "
    "result). Mean over the seeds of the setting selected on noisy validation; gaps are means of per-trial "
    "differences."
)
CURVES_NOTE = (
    "Per epoch (warm start, then the method stage after the dotted line), mean over seeds: accuracy against the "
    "noisy labels on the training examples whose label was flipped (memorisation of the wrong labels), and on "
    "those whose label was kept; accuracy against the clean training labels; clean test accuracy."
)
DETECTION_NOTE = (
    "Methods that flag or down-weight examples: their judgement of the training set scored against the true "
    "flips. Precision and recall of the examples they flag, AUROC of their noise score (0.5: chance), at the epoch "
    "selected on noisy validation and at the last epoch; mean over seeds."
)
COST_NOTE = (
    "Device-seconds: a trial's wall time on its device (its share of a pack's), without the per-epoch diagnostics, "
    "its CE warm start shared: a warm start is trained once and loaded by every other trial (method and setting) of "
    "its data, noise and seed, so its seconds are split evenly over all the trials that use it, whichever trained "
    "it; mean per trial of the selected setting (warm start: its share). Accuracy per device-hour: mean test "
    "accuracy at the selected epoch divided by the mean device-hours of a trial. Networks: trained in the method "
    "stage."
)
# The cost table's two times, named by what each counts: a trial that loaded its cell's cached warm start ran for
# less wall time than its device-seconds, which carry an even share of that warm start's training (#55: "wall s"
# below "device-s" read as a contradiction).
COST_SECONDS = ("wall s / trial, as it ran (a cached warm start: its load only)",
                "device-s / trial, each warm start's seconds split over its trials")
NO_DETECTION = ("Detection quality: left out, no method here flags or down-weights training examples (or the "
                "epochs table holds no detection numbers).")



# -- tables over a results folder (polars) -----------------------------------------------------------------------
def trial_rules(epochs: pl.DataFrame) -> pl.DataFrame:
    """Per trial: the epoch and clean test accuracy under each rule (selected, last, oracle), from its
    method-stage rows that carry a test accuracy."""

    schema = {"trial_id": pl.String, "selected_epoch": pl.Int64, "selected_acc": pl.Float64,
              "last_epoch": pl.Int64, "last_acc": pl.Float64, "oracle_epoch": pl.Int64, "oracle_acc": pl.Float64}
    if epochs.is_empty() or "test_acc" not in epochs.columns:
        return pl.DataFrame(schema=schema)
    rows = epochs.filter((pl.col("stage") == "method") & pl.col("test_acc").is_not_null())
    by_loss = rows.with_columns(pl.col("val_loss").fill_nan(None)).sort("trial_id", "val_loss", "epoch",
                                                                         nulls_last=True)
    selected = by_loss.group_by("trial_id", maintain_order=True).first().select(
        "trial_id", pl.col("epoch").alias("selected_epoch"), pl.col("test_acc").alias("selected_acc"))
    last = rows.sort("trial_id", "epoch").group_by("trial_id", maintain_order=True).last().select(
        "trial_id", pl.col("epoch").alias("last_epoch"), pl.col("test_acc").alias("last_acc"))
    oracle = rows.sort(["trial_id", "test_acc", "epoch"], descending=[False, True, False]).group_by(
        "trial_id", maintain_order=True).first().select(
        "trial_id", pl.col("epoch").alias("oracle_epoch"), pl.col("test_acc").alias("oracle_acc"))
    out = selected.join(last, on="trial_id").join(oracle, on="trial_id")
    return out.select(list(schema)).cast(schema).sort("trial_id")


@dataclass
class Diagnostics:
    """The report's diagnostic tables (each also written as CSV)."""

    rules: pl.DataFrame  # per cell: the three selection rules
    curves: pl.DataFrame  # per cell and epoch: DIAGNOSTIC_COLUMNS, mean over the selected setting's seeds
    detection: pl.DataFrame  # per cell of a detecting method: precision, recall, AUROC (selected, last epoch)
    cost: pl.DataFrame  # per cell: time, device, epochs, networks, device-seconds, accuracy per device-hour
    totals: pl.DataFrame  # per device: the grid's trials and device-hours
    labels: pl.DataFrame  # per (dataset, noise, r, seed): the noisy labels' hash and how to export them

    def tables(self) -> dict[str, pl.DataFrame]:
        return dict(selection_rules=self.rules, memorisation_curves=self.curves, detection=self.detection,
                    cost=self.cost, cost_totals=self.totals, noisy_labels=self.labels)


def analyse(trials: pl.DataFrame, epochs: pl.DataFrame, settings: pl.DataFrame) -> Diagnostics:
    """`trials` as `bench.report.analysis.load_trials` gives them (with `setting` and `usable`), `epochs` the epochs
    table, `settings` the setting chosen per cell (`bench.report.analysis.select_settings`)."""

    if not epochs.is_empty():  # files written before a column existed lack it
        epochs = epochs.with_columns(pl.lit(None, pl.Float64).alias(c)
                                     for c in DIAGNOSTIC_COLUMNS if c not in epochs.columns)
    chosen = trials.join(settings.select(CELL + ["setting"]), on=CELL + ["setting"]).filter(pl.col("usable"))
    for column in ("device_s", "networks", "epochs_trained"):
        if column not in chosen.columns:
            chosen = chosen.with_columns(pl.lit(None, dtype=pl.Float64).alias(column))
    chosen = chosen.with_columns(pl.col("device_s").cast(pl.Float64).fill_null(pl.col("wall_s").cast(pl.Float64)))
    chosen = chosen.join(shared_device_seconds(trials), on="trial_id", how="left")
    per_trial = chosen.join(trial_rules(epochs), on="trial_id")
    rules = per_trial.group_by(CELL, maintain_order=True).agg(
        pl.len().alias("n"),
        *[pl.col(f"{k}_acc").mean().alias(f"{k}_mean") for k in ("selected", "last", "oracle")],
        *[pl.col(f"{k}_acc").std().alias(f"{k}_std") for k in ("selected", "last", "oracle")],
        (pl.col("last_acc") - pl.col("selected_acc")).mean().alias("last_gap"),
        (pl.col("oracle_acc") - pl.col("selected_acc")).mean().alias("oracle_gap"),
        pl.col("oracle_epoch").mean().alias("oracle_epoch_mean"),
        pl.col("selected_epoch").mean().alias("selected_epoch_mean"),
    ).sort(CELL)
    return Diagnostics(rules=rules, curves=_curves(trials, chosen, epochs), detection=_detection(chosen, epochs),
                       cost=cost_table(chosen), totals=totals(trials), labels=_labels(trials))


def _curves(trials: pl.DataFrame, chosen: pl.DataFrame, epochs: pl.DataFrame) -> pl.DataFrame:
    """Mean DIAGNOSTIC_COLUMNS per cell, stage and epoch (`x`: warm-start epochs first, then the method stage's). A
    warm start is shared by every method of its (dataset, noise, r, seed) and recorded by the trial that trained
    it, so its rows come from any trial of the cell with the same warm-start settings."""

    if epochs.is_empty() or (epochs := epochs.filter(pl.col("test_acc").is_not_null())).is_empty():
        return pl.DataFrame()
    key = ["dataset", "noise", "r", "epochs_warmup", "subset"]
    values = [pl.col(c).mean() for c in DIAGNOSTIC_COLUMNS]
    info = trials.select("trial_id", "seed", "dataset", "noise", "r", pl.col("epochs_warmup").cast(pl.Int64),
                         pl.col("train_subset").cast(pl.Int64).fill_null(0).alias("subset"))
    warm = (epochs.filter(pl.col("stage") == "warmup").join(info, on="trial_id")
            .unique(key + ["seed", "epoch"], keep="first", maintain_order=True)
            .group_by(key + ["epoch"]).agg(*values))
    method = (epochs.filter(pl.col("stage") == "method")
              .join(chosen.select("trial_id", *CELL, pl.col("epochs_warmup").cast(pl.Int64),
                                  pl.col("train_subset").cast(pl.Int64).fill_null(0).alias("subset")), on="trial_id")
              .group_by(CELL + ["epochs_warmup", "subset", "epoch"]).agg(*values)
              .with_columns(pl.lit("method").alias("stage"), (pl.col("epochs_warmup") + pl.col("epoch")).alias("x")))
    cells = method.select(CELL + ["epochs_warmup", "subset"]).unique()
    warm = cells.join(warm, on=key).with_columns(pl.lit("warmup").alias("stage"), pl.col("epoch").alias("x"))
    columns = CELL + ["stage", "epoch", "x", *DIAGNOSTIC_COLUMNS]
    # Cells of another warm-start length or subset share CELL and x: every column breaks the tie, so the CSV's row
    # order (and the figure drawn from it) is the same at every run.
    return pl.concat([warm.select(columns), method.select(columns)]).sort(CELL + ["x", "stage", "epoch",
                                                                               *DIAGNOSTIC_COLUMNS])


def _detection(chosen: pl.DataFrame, epochs: pl.DataFrame) -> pl.DataFrame:

    if epochs.is_empty():
        return pl.DataFrame()
    rows = epochs.filter((pl.col("stage") == "method") & pl.col("det_flagged").is_not_null())
    if rows.is_empty():
        return pl.DataFrame()
    at = chosen.select("trial_id", *CELL, "best_epoch").join(rows, on="trial_id")
    metrics = ("det_flagged", "det_precision", "det_recall", "det_auroc")
    selected = at.filter(pl.col("epoch") == pl.col("best_epoch")).group_by(CELL).agg(
        pl.len().alias("n"), *[pl.col(m).mean().alias(f"selected_{m[4:]}") for m in metrics])
    last = at.sort("epoch").group_by(["trial_id", *CELL]).last().group_by(CELL).agg(
        *[pl.col(m).mean().alias(f"last_{m[4:]}") for m in metrics])
    return selected.join(last, on=CELL, how="full", coalesce=True).sort(CELL)


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
    """Per cell, over the trials of its selected setting (`chosen`, with `device_s_shared`): their device, epochs,
    networks, mean seconds, warm-start share, device-hours and accuracy per device-hour."""
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


def _labels(trials: pl.DataFrame) -> pl.DataFrame:

    return trials.filter(pl.col("noise_hash").is_not_null()).group_by("dataset", "noise", "r", "seed").agg(
        pl.col("noise_hash").unique().sort().str.join(", ").alias("noise_hash"),
        pl.col("noise_rate").cast(pl.Float64).first().alias("noise_rate"), pl.len().alias("trials"),
    ).sort("dataset", "noise", "r", "seed")


def labels_command(dataset: str, noise: str, r: float, seed: int, noise_hash: str) -> str:
    """The shell command that exports one draw of noisy labels (names quoted: they come from the data)."""
    return (f"bench labels --dataset {shlex.quote(dataset)} --noise {shlex.quote(noise)} --r {r:g} --seed {seed} "
            f"--out {shlex.quote(noise_hash + '.parquet')}")


def _anchor(dataset: str, noise: str, r: float) -> str:
    """An HTML id for a cell's labels: names from the data reduced to characters safe in an attribute."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"labels-{dataset}-{noise}-{r:g}")


# -- rendering: HTML and Markdown sections of `bench report` ------------------------------------------------------
def plot(diag: Diagnostics, folder: Path, labels: dict[str, str]) -> dict[str, Path]:
    """The curves' figures, one per (dataset, noise) and kind: name -> PNG path (each kind's figures drawn in one
    call: they share their panels' axes)."""
    from bench.report import plots  # matplotlib takes a second to import: only a report draws figures
    if diag.curves.is_empty():
        return {}
    parts = {key: part for key, part in diag.curves.group_by("dataset", "noise", maintain_order=True)}
    judged = {key: kept for key, part in parts.items()
              if not (kept := part.filter(pl.col("det_auroc").is_not_null())).is_empty()}
    drawn: dict[tuple[str, str, str], Path] = {}
    for kind, draw, frames in (("memorisation", plots.memorisation_curves, parts),
                               ("detection", plots.detection_curves, judged)):
        paths = draw([(f"{dataset}, {noise} noise", frame, plots.file_stem(folder, kind, dataset, noise))
                      for (dataset, noise), frame in frames.items()], labels)
        drawn |= {(kind, *key): path for key, path in zip(frames, paths, strict=True)}
    return {f"{kind} {dataset} {noise}": drawn[kind, dataset, noise] for dataset, noise in parts
            for kind in ("memorisation", "detection") if (kind, dataset, noise) in drawn}


def _cell_cells(c: dict[str, Any], labels: dict[str, str]) -> list[str]:
    return [td(c["dataset"], "l"), td(c["noise"], "l"), td(fmt_r(c["r"]), value=c["r"]),
            td(labels.get(c["method"], c["method"]), "l")]


def _rules_html(diag: Diagnostics, labels: dict[str, str]) -> list[str]:
    """The three selection rules side by side, each cell linked to its noisy labels."""
    body = []
    body.append(f"<h2>Checkpoint selection: three rules</h2><p class=note>{html.escape(RULES_NOTE)}</p>")
    rows = []
    for c in diag.rules.iter_rows(named=True):
        link = f'<td class="l"><a href="#{_anchor(c["dataset"], c["noise"], c["r"])}">labels</a></td>'
        rows.append("<tr>" + "".join(_cell_cells(c, labels) + [
            td(c["n"]), td(fmt(c["selected_mean"]), value=c["selected_mean"]),
            td(fmt(c["last_mean"]), value=c["last_mean"]), td(fmt(c["oracle_mean"]), "flag", c["oracle_mean"]),
            td(f"{c['last_gap']:+.2f}", value=c["last_gap"]), td(f"{c['oracle_gap']:+.2f}", "flag",
                                                                     c["oracle_gap"]),
            td(fmt_whole(c["selected_epoch_mean"]), value=c["selected_epoch_mean"]),
            td(fmt_whole(c["oracle_epoch_mean"]), "flag", c["oracle_epoch_mean"])]) + link + "</tr>")
    body.append(html_table(["dataset", "noise", "r", "method", "n", "selected (headline)", "last epoch",
                             f"best test epoch {ORACLE}", "last − sel.", f"{ORACLE} − sel.", "sel. epoch",
                             f"{ORACLE} epoch", "labels"], rows, left=2))
    return body


def _detection_html(diag: Diagnostics, labels: dict[str, str]) -> list[str]:
    """Detection quality at the selected and the last epoch."""
    body = []
    body.append(f"<h2>Detection quality</h2><p class=note>{html.escape(DETECTION_NOTE)}</p>")
    rows = ["<tr>" + "".join(_cell_cells(c, labels) + [td(c["n"])] + [
        td(fmt(c[f"{when}_{m}"], 3), value=c[f"{when}_{m}"]) for when in ("selected", "last")
        for m in ("flagged", "precision", "recall", "auroc")]) + "</tr>"
        for c in diag.detection.iter_rows(named=True)]
    body.append(html_table(["dataset", "noise", "r", "method", "n"] + [
        f"{m} ({when})" for when in ("sel.", "last") for m in ("flagged", "precision", "recall", "AUROC")],
        rows, left=2))
    return body


def _cost_html(diag: Diagnostics, labels: dict[str, str]) -> list[str]:
    """Device time per method and the grid's total."""
    body = []
    total = diag.totals["device_h"].sum()
    per_device = "; ".join(f"{t['device']}: {t['trials']} trials, {t['device_h']:.3f} device-hours"
                           for t in diag.totals.iter_rows(named=True))
    body.append(f"<h2>Cost</h2><p class=note>{html.escape(COST_NOTE)}</p><p>The grid: {total:.3f} "
                f"device-hours in all ({html.escape(per_device)}).</p>")
    rows = ["<tr>" + "".join(_cell_cells(c, labels) + [
        td(c["n"]), td(c["devices"], "l"), td(c["epochs"]), td(c["networks"]),
        td(fmt(c["wall_s_mean"], 1), value=c["wall_s_mean"]),
        td(fmt(c["device_s_mean"], 1), value=c["device_s_mean"]),
        td(fmt(c["warm_share_s_mean"], 1), value=c["warm_share_s_mean"]),
        td(fmt(c["device_h_total"], 4), value=c["device_h_total"]), td(fmt(c["acc_mean"])),
        td(fmt(c["acc_per_device_hour"], 0), value=c["acc_per_device_hour"])]) + "</tr>"
        for c in diag.cost.iter_rows(named=True)]
    body.append(html_table(["dataset", "noise", "r", "method", "n", "device", "epochs", "networks",
                             *COST_SECONDS, "of which warm-start share",
                             "device-h (all seeds)", "test acc",
                             "acc. per device-hour"], rows, left=2))
    return body


def _labels_html(diag: Diagnostics) -> list[str]:
    """The hash of every draw of noisy labels and the command that exports it."""
    body = []
    body.append("<h2>Noisy labels</h2><p class=note>The hash of each draw of noisy training and validation "
                "labels, as the result rows record it; the command writes exactly those labels (with the clean "
                "ones and the indices) to parquet with the same hash.</p>")
    rows, seen = [], set()
    for c in diag.labels.iter_rows(named=True):
        anchor = _anchor(c["dataset"], c["noise"], c["r"])
        ident = "" if anchor in seen else f' id="{anchor}"'
        seen.add(anchor)
        rows.append(f"<tr{ident}>" + "".join([
            td(c["dataset"], "l"), td(c["noise"], "l"), td(fmt_r(c["r"]), value=c["r"]), td(c["seed"]),
            td(c["noise_hash"], "l"), td(fmt(None if c["noise_rate"] is None else 100 * c["noise_rate"])),
            td(c["trials"]),
            td(labels_command(c["dataset"], c["noise"], c["r"], c["seed"], c["noise_hash"]), "l")]) + "</tr>")
    body.append(html_table(["dataset", "noise", "r", "seed", "label hash", "noise %", "trials",
                             "export"], rows, left=2))
    return body


def to_html(diag: Diagnostics, figures: dict[str, Path], labels: dict[str, str]) -> str:
    body = _rules_html(diag, labels) if not diag.rules.is_empty() else []
    if not diag.curves.is_empty():
        body.append(f"<h2>Memorisation curves</h2><p class=note>{html.escape(CURVES_NOTE)}</p>")
        body += [png(path) for name, path in figures.items() if name.startswith("memorisation")]
    if not diag.detection.is_empty():
        body += _detection_html(diag, labels)
        body += [png(path) for name, path in figures.items() if name.startswith("detection")]
    else:
        body.append(f"<p class=note>{html.escape(NO_DETECTION)}</p>")
    if not diag.cost.is_empty():
        body += _cost_html(diag, labels)
    if not diag.labels.is_empty():
        body += _labels_html(diag)
    return "".join(body)


def to_markdown(diag: Diagnostics, labels: dict[str, str]) -> str:

    def head(c: dict[str, Any]) -> str:
        method = md(labels.get(c["method"], c["method"]))
        return f"| {md(c['dataset'])} | {md(c['noise'])} | {fmt_r(c['r'])} | {method} |"

    lines: list[str] = []
    if not diag.rules.is_empty():
        lines += ["## Checkpoint selection: three rules", "", RULES_NOTE, "",
                  f"| dataset | noise | r | method | n | selected (headline) | last | best test {ORACLE} | "
                  f"last − selected | {ORACLE} oracle − selected |", "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"{head(c)} {c['n']} | {fmt(c['selected_mean'])} | {fmt(c['last_mean'])} | "
                  f"{fmt(c['oracle_mean'])} {ORACLE} | {c['last_gap']:+.2f} | {c['oracle_gap']:+.2f} {ORACLE} |"
                  for c in diag.rules.iter_rows(named=True)]
        lines.append("")
    if diag.detection.is_empty():
        lines += [md(NO_DETECTION), ""]
    else:
        lines += ["## Detection quality", "", DETECTION_NOTE, "",
                  "| dataset | noise | r | method | n | precision | recall | AUROC | last-epoch AUROC |",
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"{head(c)} {c['n']} | {fmt(c['selected_precision'], 3)} | {fmt(c['selected_recall'], 3)} | "
                  f"{fmt(c['selected_auroc'], 3)} | {fmt(c['last_auroc'], 3)} |"
                  for c in diag.detection.iter_rows(named=True)]
        lines.append("")
    if not diag.cost.is_empty():
        lines += ["## Cost", "", COST_NOTE, "", f"The grid: {diag.totals['device_h'].sum():.3f} device-hours.", "",
                  f"| dataset | noise | r | method | n | device | epochs | networks | {COST_SECONDS[1]} | "
                  "of which warm-start share | accuracy per device-hour |", "|---" * 11 + "|"]
        lines += [f"{head(c)} {c['n']} | {md(c['devices'])} | {c['epochs']} | {c['networks'] or '—'} | "
                  f"{fmt(c['device_s_mean'], 1)} | {fmt(c['warm_share_s_mean'], 1)} | "
                  f"{fmt(c['acc_per_device_hour'], 0)} |"
                  for c in diag.cost.iter_rows(named=True)]
        lines.append("")
    if not diag.labels.is_empty():
        lines += ["## Noisy labels", "", "| dataset | noise | r | seed | label hash | export |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {md(c['dataset'])} | {md(c['noise'])} | {fmt_r(c['r'])} | {c['seed']} | {md(c['noise_hash'])} | "
                  f"{md(labels_command(c['dataset'], c['noise'], c['r'], c['seed'], c['noise_hash']))} |"
                  for c in diag.labels.iter_rows(named=True)]
        lines.append("")
    return "\n".join(lines)


class DiagnosticsPanel(Panel):
    """The headline rows' selection rules, curves, detection, cost and noisy labels (six CSV tables)."""

    name = "diagnostics"
    order = 30.0

    def analyse(self, ctx: Context) -> Diagnostics:
        return analyse(ctx.df, ctx.epochs, ctx.settings)

    def tables(self, data: Diagnostics) -> dict[str, pl.DataFrame]:
        return data.tables()

    def figures(self, data: Diagnostics, ctx: Context) -> dict[str, Path]:
        return plot(data, ctx.folder, ctx.labels)

    def markdown(self, data: Diagnostics, ctx: Context) -> str:
        return to_markdown(data, ctx.labels)

    def html(self, data: Diagnostics, figures: dict[str, Path], ctx: Context) -> str:
        return to_html(data, figures, ctx.labels)
