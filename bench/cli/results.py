"""`bench results`: the merged result table (compact, `--wide`, `--by-node`, or one parquet/CSV file) and each recorded
grid's missing trials; `bench status`: each grid's progress and ETA from the folder's files.

`bench results RESULTS [--wide | --by-node | --out FILE]`: the merged result table, as a compact terminal table,
every column, one line per node that ran trials, or one parquet/CSV file."""

from __future__ import annotations

import argparse
import calendar
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.config import UserError
from bench.report import analysis, completeness
from bench.store import grids
from bench.store.columns import ROW, conform
from bench.store.folder import Store, check_output, read_table, replace_file


def cmd_results(args: argparse.Namespace) -> int:
    """`bench results`: the merged result table, printed or written to one file, then one line for each grid
    recorded in the folder: complete, or the trials it lacks (`bench.report.completeness`)."""
    if args.out:
        check_output(args.out, "output file", "give another file to --out", kind="file")
    table = read_table(args.results)
    if table.is_empty():
        raise UserError(f"no result rows under {args.results}/trials")
    _results(args, table)
    for gap in completeness.gaps(args.results, analysis.with_usable(table)):
        print(gap.line(args.results))
    if line := completeness.mirror_line(args.results, table):
        print(line)
    return 0


# What `bench status` reads of each row: its trial, when it landed, and what makes it usable (`analysis.with_usable`).
STATUS_COLUMNS = ("trial_id", "finished_at", "status", "val_loss", "test_acc", "dataset", "noise", "r", "method",
                  "seed")


def cmd_status(args: argparse.Namespace) -> int:
    """`bench status`: per grid recorded in the folder (`bench.store.grids`), its trials with a usable row, failed and
    to go, and while a `bench run` holds the folder (`Store.driver`), the rate its rows landed at since it started
    and the ETA that rate gives; read from the files alone, so any shell on the same filesystem can ask."""
    import polars as pl

    table = read_table(args.results, columns=STATUS_COLUMNS)
    rows = analysis.with_usable(table) if not table.is_empty() else pl.DataFrame(
        schema={"trial_id": pl.String, "usable": pl.Boolean, "finished_at": pl.String})
    found = completeness.gaps(args.results, rows)
    if not found:
        raise UserError(f"no grid recorded under {args.results}/grids: `bench run` records each grid it runs there "
                        "(`bench results` lists the rows)")
    driver = Store(args.results).driver()
    finished = dict(zip(rows["trial_id"].to_list(), rows["finished_at"].to_list(), strict=True))
    now = time.time()
    for gap in found:
        done, failed = int(gap.trials["measured"].sum()), int(gap.trials["has_row"].sum())
        left = gap.trials.height - done
        line = f"{gap.name}: {done} of {gap.trials.height} trials have a usable row, {failed} failed, {left} to go"
        if gap.started_at and driver and left:
            elapsed = now - calendar.timegm(time.strptime(gap.started_at, grids.STAMP))
            landed = sum(1 for t in gap.trials["trial_id"].to_list() if (finished.get(t) or "") >= gap.started_at)
            line += f"; started {_duration(elapsed)} ago, {landed} rows since"
            line += f": ETA about {_duration(left * elapsed / landed)}" if landed else ": ETA once a row lands"
        print(line)
    print(f"running: {driver}" if driver else "no `bench run` holds the folder now: run its grid again to finish it")
    return 0


def _duration(seconds: float) -> str:
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m" if seconds >= 3600 else \
        f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _results(args: argparse.Namespace, table: Any) -> None:
    """The table, as the flags ask."""
    import polars as pl

    if args.out:
        out = Path(args.out)
        if out.suffix == ".csv":
            replace_file(out, table.select(pl.col(c) for c, t in table.schema.items() if t != pl.Null).write_csv)
        else:
            replace_file(out, table.write_parquet)
        print(f"{table.height} rows -> {out}")
        return
    if args.by_node:
        print_by_node(table)
        return
    order = [c for c in ("experiment", "dataset", "noise", "r", "method", "seed") if c in table.columns]
    if args.wide:  # every column: the declared ones in row order, then any other a file holds
        columns = [c for c in ROW if c in table.columns] + [c for c in table.columns if c not in ROW]
        shown = {c: (c, _cut(COMPACT_COLUMNS.get(c, ("", _shown()))[1])) for c in columns}
        _print(table.sort(order), columns, shown)
        print(f"{table.height} rows, all {len(columns)} columns (texts cut at {WIDE_TEXT} characters; --out FILE "
              "keeps them whole)")
        return
    one = [c for c in ("experiment", "dataset") if c in table.columns and table[c].n_unique() == 1]
    columns = [c for c in COMPACT_COLUMNS if c in table.columns and c not in one]
    _print(table.sort(order), columns, COMPACT_COLUMNS)
    common = "".join(f", {c} {table[c][0]}" for c in one)
    print(f"{table.height} rows{common}; --wide: every column")


NODE = ("host", "node_id", "device_model", "device_uuid")  # a node and the device a trial ran on
# What computed its trials there (`bench.numerics`): two groups of one node that differ here are other float orders.
FLOAT_ORDER = ("numerics", "threads", "cpu_capability", "mkl_cbwr")


def print_by_node(table: Any) -> None:
    """One line per node, device and float order (numerics, threads, ATen's kernels, MKL's branch): its trials,
    their statuses, their mean wall seconds and mean test accuracy (of the rows with one). Rows written before the
    provenance columns existed have them empty ("-")."""
    import polars as pl

    table = conform(table)
    keys = (*NODE, *FLOAT_ORDER)
    nodes = (table.with_columns(pl.col(c).cast(pl.String).fill_null("-").replace("", "-") for c in keys)
             .group_by(keys).agg(pl.len().alias("trials"), pl.col("status").sort().alias("statuses"),
                                 pl.col("wall_s").mean(), pl.col("test_acc").mean())
             .sort(*keys))
    header = ["host", "node", "device", "uuid", "numerics", "threads", "ATen", "MKL", "trials", "statuses", "wall s",
              "test %"]
    rows = [[*(n[k] for k in keys), str(n["trials"]),
             ", ".join(f"{k} {v}" for k, v in sorted(Counter(n["statuses"]).items())),
             _shown(0)(n["wall_s"]), _shown(2)(n["test_acc"])] for n in nodes.iter_rows(named=True)]
    _print_table(header, rows)
    print(f"{table.height} rows on {nodes.height} node/device/float-order groups")


def _print(table: object, columns: list[str], shown: dict[str, tuple[str, Callable[[object], str]]]) -> None:
    """`columns` of the rows as aligned text, each headed and its values shown as `shown` says."""
    rows = [[shown[c][1](v) for c, v in row.items()] for row in table.select(columns).iter_rows(named=True)]
    _print_table([shown[c][0] for c in columns], rows)


def _print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for line in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(text.rjust(w) if i else text.ljust(w)
                        for i, (text, w) in enumerate(zip(line, widths, strict=True))))


WIDE_TEXT = 40  # `--wide` cuts a longer text (a matrix, the configuration) here: a row stays one line


def _cut(show: Callable[[object], str]) -> Callable[[object], str]:
    def text(value: object) -> str:
        s = " ".join(show(value).split())
        return s if len(s) <= WIDE_TEXT else s[:WIDE_TEXT - 1] + "…"
    return text


def _shown(digits: int | None = None) -> Callable[[object], str]:
    """A value of `bench results`' compact table: numbers to `digits` (accuracies as every table rounds them,
    `bench.report.analysis.fmt`), or as short as they go."""
    def text(value: object) -> str:
        if value is None:
            return "-"
        if isinstance(value, float) and digits is not None:
            return f"{value:.{digits}f}" if digits == 0 else analysis.fmt(value)
        return f"{value:g}" if isinstance(value, float) else str(value)
    return text


# `bench results`: the columns that fit a terminal, each with its heading and how a value is shown; --wide shows
# every column.
COMPACT_COLUMNS = {"trial_id": ("trial", _shown()), "dataset": ("dataset", _shown()),
                   "method": ("method", _shown()), "noise": ("noise", _shown()), "r": ("r", _shown()),
                   "seed": ("seed", _shown()), "lr": ("lr", _shown()), "batch_size": ("bs", _shown()),
                   "status": ("status", _shown()), "best_epoch": ("sel ep", _shown()),
                   "test_acc": ("test %", _shown(2)), "last_test_acc": ("last %", _shown(2)),
                   "wall_s": ("wall s", _shown(0))}
