"""Every column of the results folder, declared once: a trial row's columns (`ROW_COLUMNS`, each with its arrow type,
its group and what the MLflow mirror logs it as), the epochs table's columns, and the per-epoch diagnostics'. The
store writes rows with these types (`row_schema`: a solo and a packed trial's files alike), the MLflow mirror logs the
columns they name, the analysis reads rows through `conform` (a column a row written by older code lacks reads as
its default, else null).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

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
# Columns other tools rely on, first and in this order (DESIGN.md section 3).
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
    _c("last_test_bal_acc", FLOAT, MEASUREMENT, "metric"), _c("warmup_test_acc", FLOAT, MEASUREMENT, "metric"),
    _c("warmup_s", FLOAT, COST, "metric"), _c("method_s", FLOAT, COST, "metric"),
    # Matrices as JSON: the generating T, the realised one, the method's estimate, the test confusion matrix.
    _c("transition", TEXT, MEASUREMENT), _c("empirical_transition", TEXT, MEASUREMENT),
    _c("estimated_transition", TEXT, MEASUREMENT), _c("confusion", TEXT, MEASUREMENT),
    _c("privileged", BOOL, CONFIGURATION, default=False),  # the method uses the true T
    _c("pack_size", INT, COST),  # trials trained together with this one (1: solo)
    _c("networks", INT, COST, "metric"), _c("epochs_trained", INT, COST, "metric"),
    _c("device_s", FLOAT, COST, "metric"), _c("diagnostics_s", FLOAT, COST), _c("error", TEXT, MEASUREMENT),
    _c("python_version", TEXT, PROVENANCE), _c("numpy_version", TEXT, PROVENANCE), _c("host", TEXT, PROVENANCE),
    _c("config_json", TEXT, PROVENANCE),  # the trial's effective configuration, whose hash is its id
    _c("finished_at", TEXT, PROVENANCE),  # UTC, ISO 8601: the newest of two rows of a seed counts
    _c("pack_wall_s", FLOAT, COST),  # the whole pack's wall time (null for a solo trial)
)
ROW_COLUMNS = CORE + MORE
ROW = {c.name: c for c in ROW_COLUMNS}
CORE_COLUMNS = [c.name for c in CORE]
MLFLOW_PARAMS = tuple(c.name for c in ROW_COLUMNS if c.mlflow == "param")
MLFLOW_METRICS = tuple(c.name for c in ROW_COLUMNS if c.mlflow == "metric")


def group(name: str) -> list[str]:
    """The row columns of one group, in row order."""
    return [c.name for c in ROW_COLUMNS if c.group == name]


def row_schema(names: Iterable[str] | None = None) -> Any:
    """The arrow schema of a trial row: every column (or those in `names`), in row order. A name not declared here is
    a `ValueError`: a new column is declared here first."""
    import pyarrow as pa

    names = set(ROW if names is None else names)
    undeclared = names - ROW.keys()
    if undeclared:
        raise ValueError(f"undeclared result-row columns {', '.join(sorted(undeclared))}: declare each in "
                         "bench/store/columns.py")
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
