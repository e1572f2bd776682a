"""Every column declared once: its arrow type, its group, its MLflow name; a trial's `Outcome`.

Every column of the results folder, declared once: a trial row's columns (`ROW_COLUMNS`, each with its arrow type,
its group and what the MLflow mirror logs it as), the epochs table's columns, and the per-epoch diagnostics'. The
store writes rows with these types (`row_schema`, `arrow_tables`: a solo and a packed trial's files alike), the MLflow
mirror logs the columns they name, the analysis reads rows through `conform` (a column a row written by older code
lacks reads as its default, else null), and a file read back is one of ours only if it holds what is declared here
(`not_ours`: each table's columns and their kinds, names that are NAMEs, the statuses we write). What a file holds is
this module's; where files live, how they are written and what happens to one that is not ours is
`bench.store.folder`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.schema import NAME

DIAGNOSTIC_COLUMNS = ("test_acc", "train_clean_acc", "train_noisy_acc_flipped", "train_noisy_acc_kept",
                 "det_flagged", "det_precision", "det_recall", "det_auroc")

# What a column says about its trial.
IDENTITY = "identity"  # which trial: its id and its cell (dataset, noise, r, method) and seed
CONFIGURATION = "configuration"  # how it was trained: the hyper-parameters and the protocol
MEASUREMENT = "measurement"  # what it measured: status, selection, accuracies, the realised noise, matrices
COST = "cost"  # what it cost: seconds, networks, epochs, its pack
PROVENANCE = "provenance"  # where and with what it ran
GROUPS = (IDENTITY, CONFIGURATION, MEASUREMENT, COST, PROVENANCE)


@dataclass(frozen=True)
class Column:
    """One column of a trial row: its name, arrow type (an alias `pyarrow.type_for_alias` knows), group, what the
    MLflow mirror logs it as ("param", "metric" or nothing) and what a row written before the column existed reads
    as (`default`, None: null)."""

    name: str
    type: str
    group: str
    mlflow: str = ""
    default: Any = None


def _c(name: str, kind: str, group: str, mlflow: str = "", default: Any = None) -> Column:
    return Column(name, kind, group, mlflow, default)


TEXT, INT, FLOAT, BOOL = "string", "int64", "float64", "bool"  # the arrow types a row holds
# Columns other tools rely on, first and in this order (docs/reports.md, "The result row").
CORE = (
    _c("trial_id", TEXT, IDENTITY, "param"), _c("experiment", TEXT, IDENTITY),
    _c("dataset", TEXT, IDENTITY, "param"), _c("model", TEXT, CONFIGURATION, "param"),
    _c("method", TEXT, IDENTITY, "param"), _c("noise", TEXT, IDENTITY, "param"), _c("r", FLOAT, IDENTITY, "param"),
    _c("seed", INT, IDENTITY, "param"), _c("lr", FLOAT, CONFIGURATION, "param"),
    _c("batch_size", INT, CONFIGURATION, "param"), _c("status", TEXT, MEASUREMENT),
    _c("best_epoch", INT, MEASUREMENT, "metric"), _c("val_loss", FLOAT, MEASUREMENT, "metric"),
    _c("test_acc", FLOAT, MEASUREMENT, "metric"), _c("test_bal_acc", FLOAT, MEASUREMENT, "metric"),
    _c("last_test_acc", FLOAT, MEASUREMENT, "metric"), _c("noise_rate", FLOAT, MEASUREMENT, "metric"),
    _c("noise_hash", TEXT, MEASUREMENT), _c("wall_s", FLOAT, COST, "metric"),
    _c("device", TEXT, PROVENANCE, "param"), _c("git_commit", TEXT, PROVENANCE, "param"),
    _c("torch_version", TEXT, PROVENANCE),
)
# The others, in the order a row holds them.
MORE = (
    _c("epochs", INT, CONFIGURATION, "param"), _c("epochs_warmup", INT, CONFIGURATION, "param"),
    _c("method_params", TEXT, CONFIGURATION),  # JSON; the mirror logs each parameter as a param of its own
    _c("protocol", TEXT, CONFIGURATION, default="bench"),  # rows written before protocols existed are bench's
    _c("switches", TEXT, CONFIGURATION, default=""),  # the authors' switches the protocol turned on, comma-separated
    # `bench.trial.PRECISIONS`: rows written before precisions existed are fp32's
    _c("precision", TEXT, CONFIGURATION, "param", default="fp32"),
    _c("train_subset", INT, CONFIGURATION, "param"),
    # The md5 of each weights file the network started from ("weights=<md5>"; `TrialConfig.weights`); "" for none
    _c("weights", TEXT, CONFIGURATION, "param", default=""),
    _c("last_test_bal_acc", FLOAT, MEASUREMENT, "metric"), _c("warmup_test_acc", FLOAT, MEASUREMENT, "metric"),
    _c("warmup_s", FLOAT, COST, "metric"), _c("method_s", FLOAT, COST, "metric"),
    # Matrices as JSON: the generating T, the realised one, the method's estimate, the test confusion matrix.
    _c("transition", TEXT, MEASUREMENT), _c("empirical_transition", TEXT, MEASUREMENT),
    _c("estimated_transition", TEXT, MEASUREMENT), _c("confusion", TEXT, MEASUREMENT),
    _c("privileged", BOOL, CONFIGURATION, default=False),  # the method uses the true T
    # The method stage kept its epoch by clean test accuracy (`bench.protocol.Selection.oracle`: the authors' Dogs vs
    # Cats LCCN.py): an oracle, whose accuracy is no result.
    _c("oracle", BOOL, CONFIGURATION, default=False),
    _c("pack_size", INT, COST),  # trials trained together with this one (1: solo)
    _c("networks", INT, COST, "metric"), _c("epochs_trained", INT, COST, "metric"),
    _c("device_s", FLOAT, COST, "metric"), _c("diagnostics_s", FLOAT, COST), _c("error", TEXT, MEASUREMENT),
    _c("python_version", TEXT, PROVENANCE), _c("numpy_version", TEXT, PROVENANCE), _c("host", TEXT, PROVENANCE),
    _c("config_json", TEXT, PROVENANCE),  # the trial's effective configuration, whose hash is its id
    _c("finished_at", TEXT, PROVENANCE),  # UTC, ISO 8601: the newest of two rows of a seed counts
    _c("pack_wall_s", FLOAT, COST),  # the whole pack's wall time (null for a solo trial)
    # The kind of unit that trained it (`bench.exec.executor`): solo, pack, streams, ...; null in rows written before
    # executors had names, and in a trial's row where it failed before it ended.
    _c("executor", TEXT, COST),
    # Where it ran, so that a bad node or device can be found from the results (`bench results --by-node`): the Ray
    # node (its id; "" for a trial run without Ray, `bench trial`; two raylets of one machine share `host`), the
    # device's model (the CPU's from /proc/cpuinfo, or the GPU's name) and a GPU's UUID ("" on the CPU); null in rows
    # written before they existed.
    _c("node_id", TEXT, PROVENANCE), _c("device_model", TEXT, PROVENANCE), _c("device_uuid", TEXT, PROVENANCE),
    # Its float order (`bench.numerics`): native (rows written before numerics existed are native's) or portable, and
    # the intra-op threads it computed with (null in rows written before: the process's default, not recorded).
    _c("numerics", TEXT, CONFIGURATION, "param", default="native"), _c("threads", INT, CONFIGURATION, "param"),
    # What computed it: ATen's CPU capability (AVX2, AVX512, ...), MKL's reproducibility branch and oneDNN's ISA in
    # force, the pins in its environment ("" for none), the libraries' versions, and whether deterministic
    # algorithms were on (CUDA under portable); `bench verify` names the ones that differ from the machine re-running
    # it. Null in rows written before they existed.
    _c("cpu_capability", TEXT, PROVENANCE, "param"), _c("mkl_cbwr", TEXT, PROVENANCE),
    _c("onednn_isa", TEXT, PROVENANCE), _c("pins", TEXT, PROVENANCE), _c("mkl_version", TEXT, PROVENANCE),
    _c("onednn_version", TEXT, PROVENANCE), _c("cuda_version", TEXT, PROVENANCE), _c("cudnn_version", TEXT, PROVENANCE),
    _c("deterministic", BOOL, PROVENANCE),
)
# The columns that say what computed a row (`bench.numerics.in_force`), beside its device and versions.
FLOAT_ORDER = ("numerics", "threads", "cpu_capability", "mkl_cbwr", "onednn_isa", "pins", "mkl_version",
               "onednn_version", "cuda_version", "cudnn_version", "deterministic")
ROW_COLUMNS = CORE + MORE
ROW = {c.name: c for c in ROW_COLUMNS}
CORE_COLUMNS = [c.name for c in CORE]
MLFLOW_PARAMS = tuple(c.name for c in ROW_COLUMNS if c.mlflow == "param")
MLFLOW_METRICS = tuple(c.name for c in ROW_COLUMNS if c.mlflow == "metric")


def group(name: str) -> list[str]:
    """The row columns of one group, in row order."""
    return [c.name for c in ROW_COLUMNS if c.group == name]


def check_declared(names: Iterable[str]) -> None:
    """A `ValueError` naming every column in `names` that is not declared here: a new column is declared first."""
    undeclared = set(names) - ROW.keys()
    if undeclared:
        raise ValueError(f"undeclared result-row columns {', '.join(sorted(undeclared))}: declare each in "
                         "bench/store/columns.py")


def row_schema(names: Iterable[str] | None = None) -> Any:
    """The arrow schema of a trial row: every column (or those in `names`), in row order. A name not declared here is
    a `ValueError`: a new column is declared here first."""
    import pyarrow as pa

    names = set(ROW if names is None else names)
    check_declared(names)
    return pa.schema([(c.name, pa.type_for_alias(c.type)) for c in ROW_COLUMNS if c.name in names])


def conform(frame: Any) -> Any:
    """Trial rows as read back (`bench.store.folder.read_table`) with every declared column: one that rows written
    by older code lack reads as its default (else null), of its declared type; a column null in every row gets its
    declared type. Columns of other types are left as the files hold them."""
    import polars as pl

    dtypes = {TEXT: pl.String, INT: pl.Int64, FLOAT: pl.Float64, BOOL: pl.Boolean}
    frame = frame.with_columns(pl.lit(c.default, dtype=dtypes[c.type]).alias(c.name) for c in ROW_COLUMNS
                               if c.name not in frame.columns or frame.schema[c.name] == pl.Null)
    return frame.with_columns(pl.col(c.name).fill_null(c.default) for c in ROW_COLUMNS if c.default is not None)


# The per-epoch curves of a trial: column -> its parquet (arrow) type.
EPOCH_COLUMNS = {"trial_id": "string", "stage": "string", "epoch": "int64", "train_loss": "float64",
                 "val_loss": "float64", "val_acc": "float64", "seconds": "float64",
                 **dict.fromkeys(DIAGNOSTIC_COLUMNS, "float64")}


def arrow_tables(row: dict[str, Any], epochs: list[dict[str, Any]]) -> tuple[str, Any, Any]:
    """A trial's id, its row and its curves as arrow tables of their declared types (`ROW_COLUMNS`: the columns the
    row holds, in row order; `EPOCH_COLUMNS`)."""
    import pyarrow as pa

    trial_id = row["trial_id"]
    curves = pa.schema([(name, pa.type_for_alias(kind)) for name, kind in EPOCH_COLUMNS.items()])
    return (trial_id, pa.Table.from_pylist([row], schema=row_schema(row)),
            pa.Table.from_pylist([{"trial_id": trial_id, **e} for e in epochs], schema=curves))


# Text columns of a row that name things (reports and MLflow build file names from them): each must be a NAME. Not
# `model`: it names the network with its options ("linear_probe(backbone=resnet18, weights=random)") and no file.
NAME_COLUMNS = ("trial_id", "experiment", "dataset", "method", "noise")
STATUSES = ("ok", "diverged", "failed")
# Columns every file of a table has, and what each holds: "name" (a NAME), "text", "int" or "number" (nulls allowed).
TABLE_COLUMNS = {
    "trials": {"trial_id": "name", "dataset": "name", "method": "name", "noise": "name", "status": "text",
               "r": "number", "seed": "int", "val_loss": "number", "test_acc": "number"},
    "epochs": {"trial_id": "name", "stage": "text", "epoch": "int", "val_loss": "number"},
}
_NAME = re.compile(NAME.pattern)


def column_kind(table: str, column: str) -> str | None:
    """What a column of a file of `table` must hold (`TABLE_COLUMNS`; a NAME for the `NAME_COLUMNS`), None: any."""
    return TABLE_COLUMNS.get(table, {}).get(column, "name" if column in NAME_COLUMNS else None)


def kind_fault(table: str, column: str, dtype: Any) -> str | None:
    """What is wrong with a column of polars type `dtype` in a file of `table` (None: nothing; a column of nulls
    only fits any kind): a file's schema alone decides it."""
    import polars as pl

    kind = column_kind(table, column)
    if kind is None or dtype == pl.Null:
        return None
    if kind in ("name", "text") and dtype != pl.String or kind == "int" and not dtype.is_integer() \
            or kind == "number" and not dtype.is_numeric():
        return f"column {column} holds {dtype}"
    return None


def is_name(value: str) -> bool:
    return _NAME.fullmatch(value) is not None


def not_ours(frame: Any, table: str, stem: str) -> str | None:
    """What makes a polars frame read from `<table>/<stem>.parquet` not one of ours (None: nothing): a missing
    column (`TABLE_COLUMNS`) or one of another type, a trial_id other than the file's name, a name field that is not
    a NAME (it would reach a file name: "../x"), a status we do not write, or more than one row in a trial's file."""
    import polars as pl

    columns, one_row = TABLE_COLUMNS.get(table, {}), table == "trials"
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        return f"not a result file of this table: no column {', '.join(missing)}"
    if one_row and frame.height != 1:
        return f"{frame.height} rows where a trial has one"
    for column, dtype in frame.schema.items():  # the schema once: polars builds it anew at each `frame.schema`
        if problem := kind_fault(table, column, dtype):
            return problem
        if column_kind(table, column) == "name" and dtype == pl.String:
            bad = [v for v in frame[column].drop_nulls().unique().to_list() if not is_name(v)]
            if bad:
                return f"{column} {bad[0][:60]!r} is not a name ({NAME.words})"
    if frame.height and set(frame["trial_id"].to_list()) != {stem}:
        return "its trial_id is not its file name"
    if "status" in columns and not set(frame["status"].to_list()) <= set(STATUSES):
        return f"status {frame['status'][0]!r} is not one of {', '.join(STATUSES)}"
    return None


@dataclass
class Outcome:
    """What a trial measured, whichever executor trained it: the measurement and cost columns of its row before they
    are formatted (`bench.store.rows.make_row`), and its epoch rows (the `EPOCH_COLUMNS`)."""

    status: str
    best_epoch: int
    val_loss: float
    warmup_test_acc: float
    test_acc: float
    test_bal_acc: float
    last_test_acc: float
    last_test_bal_acc: float
    confusion: np.ndarray
    estimated_transition: np.ndarray | None
    epochs: list[dict[str, Any]]
    warmup_s: float
    method_s: float
    error: str = ""
    pack_size: int = 1
    executor: str = "solo"  # the kind of unit that trained it (`bench.exec.executor`)
    networks: int = 1  # networks the method stage trains (Co-teaching, DivideMix: 2)
    diagnostics_s: float = 0.0  # seconds spent on the per-epoch diagnostics (measuring, not the method's cost)
