"""A new embedded MLflow store is a copy of an empty one MLflow built once (issue #56, item 2: a fresh store's
migrations off the grid's path): the same schema, schema version and rows as a store MLflow builds itself, here and
now, its Default experiment's location and times included."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path

import pytest

from bench.store.mirror import open_mirror


def read(path: Path, query: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return sorted(db.execute(query).fetchall(), key=repr)


def schema(path: Path) -> list[tuple]:
    """Each table's and index's definition as a set of its lines: MLflow's own migrations order a table's constraints
    differently from one build to the next (two stores it builds differ so)."""
    return [(kind, name, frozenset(line.strip().rstrip(",") for line in (sql or "").splitlines()))
            for kind, name, sql in read(path, "SELECT type, name, sql FROM sqlite_master")]


def test_a_new_store_reads_as_one_mlflow_built_here_and_now(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # a template of its own, built by this test
    for where in ("elsewhere", "here"):
        (tmp_path / where).mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # MLflow's default artifact root (./mlruns) is made absolute from here
    assert open_mirror(tmp_path / "first", None).ok  # the template built (from another folder, earlier), then copied
    time.sleep(0.01)
    monkeypatch.chdir(tmp_path / "here")
    start = int(time.time() * 1000)
    built = tmp_path / "built" / "mlflow.db"
    built.parent.mkdir()
    MlflowClient(tracking_uri=f"sqlite:///{built}").search_experiments(max_results=1)  # MLflow builds one here
    assert open_mirror(tmp_path / "second", None).ok  # copied here
    end = int(time.time() * 1000)
    assert len(list((tmp_path / "home" / ".cache" / "bench" / "mlflow-stores").glob("empty-*.db"))) == 1
    copy = tmp_path / "second" / "mlflow.db"
    assert schema(copy) == schema(built) == schema(tmp_path / "first" / "mlflow.db")
    for table in ("alembic_version", "workspaces", "experiment_tags", "runs"):
        assert read(copy, f"SELECT * FROM {table}") == read(built, f"SELECT * FROM {table}"), table
    ((*ours, created, updated, workspace),) = read(copy, "SELECT * FROM experiments")
    ((*theirs, _, _, their_workspace),) = read(built, "SELECT * FROM experiments")
    assert ours == theirs == [0, "Default", str(tmp_path / "here" / "mlruns" / "0"), "active"]
    assert start <= created == updated <= end and workspace == their_workspace
