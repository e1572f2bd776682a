"""The results store (`bench.store.folder`): which locations are local folders, rows written and read back, and epoch
checkpoints that survive or are ignored."""

from __future__ import annotations

from pathlib import Path

import torch

from bench.store import folder as store

CURVE = [dict(stage="warmup", epoch=1, train_loss=2.0, val_loss=1.5, val_acc=40.0, seconds=0.2),
         dict(stage="method", epoch=1, train_loss=1.0, val_loss=0.5, val_acc=50.0, seconds=0.1)]


def test_a_file_uri_is_its_local_folder_and_an_object_store_is_not(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert store.is_local("results/x") and store.is_local(f"file://{tmp_path}") and not store.is_local("s3://b/r")
    assert store.absolute("results/x") == str(tmp_path / "results" / "x")  # workers run in their own folders
    assert store.absolute(f"file://{tmp_path}/r") == str(tmp_path / "r")
    assert store.absolute("s3://bucket/results") == "s3://bucket/results"
    assert store.Store(f"file://{tmp_path}/r").log_path("u1") == tmp_path / "r" / "logs" / "u1.log"


def test_rows_written_through_a_file_uri_are_read_back_from_the_path(tmp_path: Path) -> None:
    row = {"trial_id": "t1", "dataset": "synthetic", "method": "ce", "noise": "case3", "r": 0.2, "seed": 0,
           "status": "ok", "val_loss": 0.5, "test_acc": 71.5}
    path = store.Store(f"file://{tmp_path}").write_trial(row, CURVE)
    assert path == f"{tmp_path}/trials/t1.parquet"
    assert store.read_table(tmp_path).to_dicts() == [row]
    found, curve = store.Store(tmp_path).read_row("t1")
    assert found == row and curve["val_loss"].to_list() == [1.5, 0.5]
    assert curve["stage"].to_list() == ["warmup", "method"]
    assert store.Store(tmp_path).read_row("t2") == (None, None)
    assert store.Store(tmp_path).statuses() == {"t1": "ok"}
    assert [p.name for p in tmp_path.rglob("*.tmp")] == []  # written to a temporary name, then renamed


def test_a_checkpoint_round_trips_and_an_unreadable_one_is_ignored(tmp_path: Path) -> None:
    lines: list[str] = []
    checkpoints = store.Checkpoints(tmp_path, "unit-a", lines.append)
    assert checkpoints.load() is None
    state = {"epoch": 3, "weights": torch.arange(6.0).reshape(2, 3)}
    checkpoints.save(state)
    loaded = store.Checkpoints(tmp_path, "unit-a", lines.append).load()
    assert loaded["epoch"] == 3 and torch.equal(loaded["weights"], state["weights"])
    (tmp_path / "checkpoints" / "unit-a.pt").write_bytes(b"not a tensor file")
    assert checkpoints.load() is None and len(lines) == 1 and "ignoring the unreadable checkpoint" in lines[0]
    checkpoints.clear()
    assert not (tmp_path / "checkpoints" / "unit-a.pt").exists()
