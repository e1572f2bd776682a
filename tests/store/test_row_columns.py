"""The result row declared once (bench.store.columns): a solo, a packed and a failed trial's parquet files hold the
same declared columns with the same arrow types; a row with a column nobody declared is refused before anything is
written; rows written by older code (types inferred, columns missing) read back with every declared column, a missing
one as its default."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.exec.pack import run_pack
from bench.exec.trainer import failed_row, run_trial
from bench.report import analysis
from bench.store.columns import CORE_COLUMNS, GROUPS, MLFLOW_METRICS, MLFLOW_PARAMS, ROW, ROW_COLUMNS, group, row_schema
from bench.store.rows import write_trial
from bench.trial import TrialConfig
from tests.report.test_report import make_row

QUIET = dict(log=lambda s: None)


def test_the_declaration_groups_every_column_once() -> None:
    assert len(ROW) == len(set(ROW)) == len(ROW_COLUMNS)  # each declared name once
    assert sorted(sum((group(g) for g in GROUPS), [])) == sorted(ROW)
    assert [c.name for c in ROW_COLUMNS[:len(CORE_COLUMNS)]] == CORE_COLUMNS
    # What a trial cost is one group, a property rather than a list (a new cost column needs no edit here): every
    # duration column (`*_s`) is in it, it holds what the report's cost panel reads, and each of its columns is a
    # number but the executor's name.
    cost = group("cost")
    assert {c for c in ROW if c.endswith("_s")} <= set(cost)
    assert {"wall_s", "warmup_s", "device_s", "networks", "epochs_trained"} <= set(cost)
    assert all(ROW[c].type in ("int64", "float64") for c in cost if c != "executor")
    assert ROW["executor"].type == "string"
    # What the MLflow mirror logs is the declaration's (this file's mirror test checks a real run):
    # a metric is a number, and the CORE columns other tools rely on keep being logged as they were.
    assert {c.mlflow for c in ROW_COLUMNS} <= {"", "param", "metric"}
    assert all(ROW[m].type in ("int64", "float64") for m in MLFLOW_METRICS)
    assert set(MLFLOW_PARAMS) & set(MLFLOW_METRICS) == set()
    # Every column the analysis names is declared.
    assert set(analysis.SETTING_COLUMNS + analysis.PROVENANCE_COLUMNS + analysis.REQUIRED_COLUMNS) <= set(ROW)


def test_solo_packed_and_failed_trials_write_one_declared_schema(tmp_path: Path) -> None:
    """FW estimates T and L_DMI does not (its estimate is null); a solo trial has no pack wall time; a failed trial
    has no measurement. Today's code wrote those nulls as arrow's null type and the pack's wall time only in a
    pack's files."""
    configs = [TrialConfig("synthetic", "fw", "case3", 0.3, seed=1, epochs=2, epochs_warmup=1),
               TrialConfig("synthetic", "dmi", "case3", 0.3, seed=2, epochs=2, epochs_warmup=1)]
    packed = run_pack(configs, "unused", results=tmp_path / "packed", **QUIET)
    solo = [run_trial(c, "unused", results=tmp_path / "solo", **QUIET) for c in configs]
    failed = failed_row(TrialConfig("synthetic", "ce", "case3", 0.3, seed=3), "RuntimeError: boom")
    write_trial(tmp_path / "failed", failed, [])
    files = sorted(tmp_path.glob("*/trials/*.parquet"))
    assert len(files) == 5
    declared = row_schema()
    for path in files:
        schema = pq.read_schema(path)
        assert schema.names == [c.name for c in ROW_COLUMNS], path
        assert schema.equals(declared), (path, schema)
    assert declared.field("estimated_transition").type == pa.string()
    assert declared.field("pack_wall_s").type == pa.float64() and declared.field("best_epoch").type == pa.int64()
    assert [r["pack_size"] for r in packed] == [2, 2] and [r["pack_size"] for r in solo] == [1, 1]
    # The kind of unit that trained each (bench.exec.executor); unknown for a trial that failed before it ended.
    assert [r["executor"] for r in packed + solo] == ["pack", "pack", "solo", "solo"] and failed["executor"] is None
    assert packed[0]["pack_wall_s"] == packed[1]["pack_wall_s"] > 0
    assert packed[0]["wall_s"] == pytest.approx(packed[0]["pack_wall_s"] / 2)
    assert solo[0]["pack_wall_s"] is None and solo[1]["estimated_transition"] is None
    back = pl.read_parquet(tmp_path / "solo" / "trials" / f"{configs[1].trial_id}.parquet")
    assert back.schema["estimated_transition"] == pl.String and back["estimated_transition"].to_list() == [None]
    assert back["test_acc"].item() == solo[1]["test_acc"] and back["best_epoch"].item() == solo[1]["best_epoch"]


def test_the_mirror_logs_every_declared_column_a_row_holds(tmp_path: Path) -> None:
    """A property, not a list of names: a trial's MLflow run holds, as metrics, exactly the declared metric columns
    its row has a value for, each with the row's value, and as params the declared param columns; a failed trial's
    row, with no measurement, logs only what it holds. A new column declared "metric" is logged with nothing else to
    edit."""
    from mlflow import MlflowClient

    from bench.store.mirror import open_mirror

    results = tmp_path / "results"
    ok = run_trial(TrialConfig("synthetic", "ce", "case3", 0.3, seed=1, epochs=1, epochs_warmup=1), "unused",
                   results=results, **QUIET)
    failed = failed_row(TrialConfig("synthetic", "ce", "case3", 0.3, seed=2), "RuntimeError: boom")
    write_trial(results, failed, [])
    assert open_mirror(results, None).sync(results) == 2
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = {r.data.params["trial_id"]: r for r in client.search_runs([client.get_experiment_by_name("adhoc")
                                                                      .experiment_id])}
    for row in (ok, failed):
        run = runs[row["trial_id"]]
        declared = {c.name for c in ROW_COLUMNS if c.mlflow == "metric" and row[c.name] is not None}
        logged = {k: v for k, v in run.data.metrics.items() if "epoch_" not in k}  # per-epoch curves aside
        assert logged == {k: pytest.approx(float(row[k])) for k in declared}, sorted(set(logged) ^ declared)
        assert {c.name for c in ROW_COLUMNS if c.mlflow == "param"} <= set(run.data.params)
    # The failed row (the last) logged fewer metrics than declared; the trained one its accuracy.
    assert len(declared) < len(MLFLOW_METRICS) and "test_acc" in runs[ok["trial_id"]].data.metrics


def test_a_row_that_does_not_fit_the_declaration_writes_nothing(tmp_path: Path) -> None:
    row = make_row("ce", 0.2, 0, 0.5, 70.0)
    with pytest.raises(ValueError, match="undeclared result-row columns shoe_size: declare each in"):
        write_trial(tmp_path, row | {"shoe_size": 42}, [])
    with pytest.raises(pa.ArrowException):  # an int64 column given text
        write_trial(tmp_path, row | {"best_epoch": "three"}, [])
    assert list(tmp_path.rglob("*.parquet")) == []


def test_rows_written_by_older_code_read_with_every_declared_column(tmp_path: Path) -> None:
    """Two rows as older code wrote them (`pa.Table.from_pylist` without a schema): one from before protocols and
    packs (no protocol, switches, privileged, pack columns), one with a column of nulls (arrow's null type)."""
    (tmp_path / "trials").mkdir()
    old = make_row("ce", 0.2, 0, 0.5, 70.0)
    for key in ("privileged", "train_subset"):
        del old[key]
    newer = make_row("ce", 0.2, 1, 0.6, 72.0) | dict(protocol="authors", switches="fixed_torch_seed", pack_size=2,
                                                       pack_wall_s=3.0)
    for row in (old, newer):
        pq.write_table(pa.Table.from_pylist([row]), tmp_path / "trials" / f"{row['trial_id']}.parquet")
    assert pq.read_schema(tmp_path / "trials" / f"{newer['trial_id']}.parquet").field("train_subset").type == pa.null()
    df = analysis.load_trials(tmp_path).sort("seed")
    types = {"string": pl.String, "int64": pl.Int64, "float64": pl.Float64, "bool": pl.Boolean}
    assert {c.name: df.schema[c.name] for c in ROW_COLUMNS} == {c.name: types[c.type] for c in ROW_COLUMNS}
    assert df["protocol"].to_list() == ["bench", "authors"]
    assert df["switches"].to_list() == ["", "fixed_torch_seed"]
    assert df["precision"].to_list() == ["fp32", "fp32"]  # neither row has the column: the default
    assert df["privileged"].to_list() == [False, False]
    assert df["pack_size"].to_list() == [None, 2] and df["pack_wall_s"].to_list() == [None, 3.0]
    assert df["train_subset"].to_list() == [None, None] and df["test_acc"].to_list() == [70.0, 72.0]


def test_make_row_refuses_a_column_it_makes_but_nobody_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if `host` had been added to make_row but never declared: it used to vanish from the row without a word."""
    from bench.store import columns, rows

    declared = {name: column for name, column in columns.ROW.items() if name != "host"}
    monkeypatch.setattr(columns, "ROW", declared)
    monkeypatch.setattr(rows, "ROW", declared)
    config = TrialConfig("synthetic", "ce", "case3", 0.3, seed=1)
    with pytest.raises(ValueError, match="undeclared result-row columns host: declare each in"):
        rows.make_row(config, "mlp", None, None, 1.0, 1e-3, 128, 2, 1)
