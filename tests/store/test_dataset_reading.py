"""A results table read as one dataset (`bench.store.dataset.read`) against the same files read one by one, as the
store read them before (`read_one` each, the good ones concatenated `diagonal_relaxed`): the same rows in the same
order, the same columns of the same types, the same files refused with the same words, whatever mix of schemas,
damaged files and files that are not ours a folder holds."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.store import dataset
from bench.store.folder import Store, read_table

CURVE = [dict(stage="warmup", epoch=1, train_loss=2.0, val_loss=1.5, val_acc=40.0, seconds=0.2),
         dict(stage="method", epoch=1, train_loss=1.0, val_loss=0.5, val_acc=50.0, seconds=0.1)]


def row(n: int, **changes: object) -> dict[str, object]:
    return {"trial_id": f"t{n:03d}", "experiment": "e", "dataset": "synthetic", "method": ("ce", "dmi")[n % 2],
            "noise": "case3", "r": 0.1 * (n % 5), "seed": n % 3, "status": "ok", "val_loss": 0.5 + n / 1000,
            "test_acc": 70.0 + n / 7, "wall_s": float(n), **changes}


def write_raw(path: Path, columns: dict[str, list[object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def mixed_folder(root: Path) -> None:
    """Rows of three schemas interleaved (older rows lack columns, one row's error column is all null), zero-epoch
    curves, and each kind of file that is not ours."""
    store = Store(root)
    for n in range(30):
        extra = {"finished_at": f"2026-01-{n % 28 + 1:02d}"} if n % 3 == 0 else {}
        if n % 4 == 1:
            extra["error"] = None  # a column of nulls only: arrow's string, not null
        fields = row(n, **extra)
        if n % 5 == 2:
            del fields["wall_s"]
        store.write_trial(fields, CURVE if n % 6 else [])
    (root / "trials" / "t900.parquet").write_bytes(b"PAR1 not parquet at all")
    good = (root / "trials" / "t001.parquet").read_bytes()
    (root / "trials" / "t901.parquet").write_bytes(good[: len(good) // 2])  # a copy cut short
    write_raw(root / "trials" / "t902.parquet", {"trial_id": ["t902"], "other": [1]})  # another schema
    write_raw(root / "trials" / "t903.parquet", {k: [v] for k, v in row(3).items()})  # its trial_id is t003
    write_raw(root / "trials" / "t904.parquet", {k: [v, v] for k, v in row(904).items()})  # two rows
    write_raw(root / "trials" / "t905.parquet", {k: [v] for k, v in row(905, noise="../x").items()})
    write_raw(root / "trials" / "t906.parquet", {k: [v] for k, v in row(906, status="done").items()})
    write_raw(root / "trials" / "t907.parquet", {k: [v] for k, v in row(907, seed="0").items()})  # seed as text
    write_raw(root / "trials" / "t908.parquet", {k: [v] for k, v in row(908, status=None).items()})
    write_raw(root / "epochs" / "t909.parquet", {"trial_id": ["t909", "t000"], "stage": ["a", "b"], "epoch": [1, 2],
                                                 "val_loss": [1.0, 2.0]})  # curves of two trials in one file


def one_by_one(root: Path, table: str, columns: tuple[str, ...] | None) -> tuple[pl.DataFrame, dict[str, str]]:
    """The files read as the store read them before: each on its own, the good ones concatenated."""
    store, frames, problems = Store(root), [], {}
    for path in dataset.listing(store, table):
        frame, problem = dataset.read_one(store.fs, path)
        if problem:
            problems[path] = problem
        else:
            frames.append(frame if columns is None else frame.select(c for c in frame.columns if c in columns))
    return (pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()), problems


def same_as_one_by_one(root: Path, table: str, columns: tuple[str, ...] | None) -> None:
    expected, refused = one_by_one(root, table, columns)
    found, problems = Store(root).scan(table, columns)
    assert problems == refused
    assert found.schema == expected.schema
    assert found.equals(expected, null_equal=True)


@pytest.mark.parametrize("table", ["trials", "epochs"])
@pytest.mark.parametrize("columns", [None, ("trial_id", "status"), ("wall_s", "finished_at", "r"), ()])
def test_one_pass_reads_what_reading_file_by_file_reads(tmp_path: Path, table: str, columns: tuple | None) -> None:
    mixed_folder(tmp_path)
    assert len(one_by_one(tmp_path, table, None)[1]) == {"trials": 9, "epochs": 1}[table]
    same_as_one_by_one(tmp_path, table, columns)  # the files read, the compact copy written
    assert (tmp_path / "index" / f"{table}.parquet").is_file()
    same_as_one_by_one(tmp_path, table, columns)  # from the copy
    if columns is None and table == "trials":  # the rows themselves, value for value (floats bit for bit)
        found = Store(tmp_path).read_table()
        assert found["trial_id"].to_list() == [f"t{n:03d}" for n in range(30)]
        assert all(math.copysign(1, a) == math.copysign(1, b) and a == b for a, b in
                   zip(found["test_acc"].to_list(), [70.0 + n / 7 for n in range(30)], strict=True))


@pytest.mark.parametrize("table", ["trials", "epochs"])
@pytest.mark.parametrize("columns", [None, ("trial_id", "status", "wall_s")])
def test_the_compact_copy_follows_files_added_removed_and_replaced_by_hand(tmp_path: Path, table: str,
                                                                            columns: tuple | None) -> None:
    mixed_folder(tmp_path)
    Store(tmp_path).scan(table, columns)
    for n in (4, 7):  # removed
        (tmp_path / table / f"t{n:03d}.parquet").unlink()
    Store(tmp_path).write_trial(row(40, host="elsewhere"), CURVE)  # added, of a schema of its own
    Store(tmp_path).write_trial(row(5, status="failed", wall_s=-0.0), [])  # replaced: another row, no curves
    (tmp_path / table / "t010.parquet").write_bytes(b"damaged since")
    same_as_one_by_one(tmp_path, table, columns)
    same_as_one_by_one(tmp_path, table, columns)
    (tmp_path / "index" / f"{table}.parquet").write_bytes(b"a copy cut short")  # a cache that cannot be read
    same_as_one_by_one(tmp_path, table, columns)
    same_as_one_by_one(tmp_path, table, None)


def test_a_folder_that_refuses_the_copy_is_read_all_the_same(tmp_path: Path) -> None:
    mixed_folder(tmp_path)
    (tmp_path / "index").write_text("a file where the copies' folder goes")
    same_as_one_by_one(tmp_path, "trials", None)
    same_as_one_by_one(tmp_path, "trials", ("status",))


def test_each_damaged_file_is_named_once_and_set_aside_with_its_words(tmp_path: Path, capsys) -> None:
    mixed_folder(tmp_path)
    _, refused = one_by_one(tmp_path, "trials", None)
    table = read_table(tmp_path)
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bench: warning:")]
    assert table.height == 30 and len(warned) == len(refused)
    assert all(any(f"{path} ({problem})" in line for line in warned) for path, problem in refused.items())
    curves = one_by_one(tmp_path, "epochs", None)[1]
    moved = Store(tmp_path).set_aside_damaged()
    assert sorted(problem for _, problem in moved) == sorted([*refused.values(), *curves.values()])
    assert sorted(Path(where).name.split(".parquet")[0] for where, _ in moved) == sorted(
        f"{table}-{Path(path).stem}" for table, found in (("trials", refused), ("epochs", curves)) for path in found)
    assert not Store(tmp_path).scan("trials")[1] and not Store(tmp_path).scan("epochs")[1]


def test_an_empty_or_missing_table_reads_as_an_empty_frame(tmp_path: Path) -> None:
    frame, problems = Store(tmp_path / "none").scan("trials")
    assert frame.is_empty() and frame.width == 0 and problems == {}
    assert Store(tmp_path / "none").statuses() == {} and Store(tmp_path / "none").set_aside_damaged() == []
