"""Links planted in a results folder (issue #45): bench never writes through one. A results folder unpacked from a
tarball can hold links where bench's own files belong; `bench run`, `bench sync-mlflow` and `bench report` refuse
such a folder in one line naming the link, or replace the link by a file of their own, and the file a link points to
stays as it was, byte for byte. Real local Ray, real MLflow (sqlite), real parquet, the generated synthetic set."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from bench.cli.main import main
from tests.conftest import held_by_another_process

GRID = dict(name="links", dataset="synthetic", noise="case3", r=[0.0, 0.4], seeds=[0], epochs=1, epochs_warmup=1,
            resources={"cpu": 1}, methods={"ce": {}})
# Folders whose files have names no one can know before a run (Ray's time stamps, MLflow's run ids): the link goes
# in the folder's place.
LINKED_FOLDERS = ("ray", "mlartifacts/links", "checkpoints", "warmstart", "damaged", "report/plots")


@pytest.fixture(scope="module")
def reference(ray_session, tmp_path_factory) -> tuple[Path, Path]:
    """The grid run once into a folder without links, MLflow on, and its report: every path bench writes."""
    root = tmp_path_factory.mktemp("reference")
    config = root / "grid.yaml"
    config.write_text(yaml.safe_dump(GRID, sort_keys=False))
    results = root / "results"
    assert main(["run", str(config), "--results", str(results)]) == 0
    assert main(["report", str(results)]) == 0
    return config, results


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A user's file outside anything bench writes, which a link planted in bench's way points to."""
    target = tmp_path / "elsewhere.txt"
    target.write_text("mine\n")
    return target


def planted(link: Path, target: Path) -> Path:
    """`link` (its folder made) pointing to `target`."""
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=target.is_dir())
    return link


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every entry under `folder`: a file's bytes, None for a folder."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes()) for p in sorted(folder.rglob("*"))}


def plant(reference: Path, results: Path, outside: Path, keep: tuple[str, ...] = ()) -> list[Path]:
    """A link at every path the reference run wrote (and at the folders of unforeseeable names), each pointing
    outside at a file (or folder) of its own, whose contents `snapshot(outside)` records; the top folders named in
    `keep` are copied as they are instead. Returns the links."""
    links = []
    for folder in LINKED_FOLDERS:
        target = outside / "folders" / folder.replace("/", "_")
        target.mkdir(parents=True)
        (target / "kept.txt").write_text(f"the folder behind {folder}\n")
        links.append(results / folder)
    for path in sorted(reference.rglob("*")):
        name = path.relative_to(reference)
        if name.parts[0] in keep:
            if path.is_file():
                (results / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, results / name)
            continue
        if path.is_dir() or any(str(name).startswith(f + "/") for f in LINKED_FOLDERS):
            continue
        links.append(results / name)
    for extra in ("mlflow.db-journal", "mlflow.db-wal", "mlflow.db-shm"):  # sqlite's files beside the store
        links.append(results / extra)
    for n, link in enumerate(links):
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.name in LINKED_FOLDERS or str(link.relative_to(results)) in LINKED_FOLDERS:
            link.symlink_to(outside / "folders" / str(link.relative_to(results)).replace("/", "_"),
                            target_is_directory=True)
        else:
            target = outside / "files" / f"{n:03d}-{link.name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f"not bench's: {link.relative_to(results)}\n".encode())
            link.symlink_to(target)
    return links


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("bench: error:")]


@pytest.mark.parametrize("keep", [(), ("trials", "epochs")], ids=["every-path-linked", "rows-real-rest-linked"])
def test_no_command_writes_through_a_link_planted_in_the_results_folder(reference, tmp_path, capsys, keep):
    """`bench run`, `bench sync-mlflow` and `bench report` on a folder with a link at every path bench writes
    (`.bench.lock`, `mlflow.db`, `logs/<id>.log`, `report/leaderboard.md`, the rows, the curves, ...): what each
    link points to is unchanged byte for byte. With the rows real, sync-mlflow and report have rows to work on."""
    config, ref = reference
    results, outside = tmp_path / "results", tmp_path / "outside"
    links = plant(ref, results, outside, keep)
    assert {results / ".bench.lock", results / "report" / "leaderboard.md"} <= set(links)
    assert any(p.parent.name == "logs" for p in links)
    before = snapshot(outside)
    codes = [main(["run", str(config), "--results", str(results)])]
    run_errors = error_lines(capsys)
    codes.append(main(["sync-mlflow", str(results)]))
    sync_errors = error_lines(capsys)
    codes.append(main(["report", str(results)]))
    report_errors = error_lines(capsys)
    assert snapshot(outside) == before
    names = {str(p.relative_to(results)) for p in links}
    # a refusal is one line, exit 2, naming one of the planted links
    for code, errors in zip(codes, (run_errors, sync_errors, report_errors), strict=True):
        if code != 0:
            assert code == 2 and len(errors) == 1, errors
            if "no result rows" not in errors[0]:
                assert "link" in errors[0] and any(f" {n} " in errors[0] for n in names), errors[0]
    assert codes[0] == 2
    if keep:  # rows to sync and to report: the links are named, nothing is logged through them
        assert codes[1] == 2 and "link" in sync_errors[0]
    assert all(p.is_symlink() or not p.exists() for p in links if "report" not in p.parts)


# -- each write point on its own (what the folder check would stop first) ---------------------------------------
def test_a_unit_log_planted_as_a_link_is_not_appended_to(tmp_path, elsewhere):
    from bench.grid.runner import UnitLog

    log = planted(tmp_path / "logs" / "abc.log", elsewhere)
    with UnitLog(log) as write:
        write("a line of bench's")
    assert elsewhere.read_text() == "mine\n" and write.warning and str(log) in write.warning
    real = tmp_path / "real"
    real.mkdir()
    planted(tmp_path / "linked", real)  # a logs/ folder that is a link
    with UnitLog(tmp_path / "linked" / "abc.log") as write:
        write("a line of bench's")
    assert list(real.iterdir()) == [] and write.warning


def test_the_folder_lock_and_the_cache_locks_never_open_a_link(tmp_path, elsewhere):
    from bench.config import UserError
    from bench.store.folder import Store

    results = tmp_path / "results"
    planted(results / ".bench.lock", elsewhere)
    with pytest.raises(UserError, match=r"results folder .* holds a symbolic link .*: \.bench\.lock -> "):
        with Store(results).hold():
            pass
    planted(results / "warmstart" / "key.lock", elsewhere)
    with pytest.raises(OSError, match="symbolic link"):
        with Store(results).lock("warmstart/key"):
            pass
    assert elsewhere.read_text() == "mine\n"


def test_a_written_file_replaces_a_link_in_its_place_and_leaves_no_temporary_file(tmp_path, elsewhere):
    from bench.store.folder import replace_file

    path = planted(tmp_path / "out" / "leaderboard.md", elsewhere)
    replace_file(path, lambda tmp: tmp.write_text("bench's\n"))
    assert not path.is_symlink() and path.read_text() == "bench's\n" and elsewhere.read_text() == "mine\n"
    with pytest.raises(ZeroDivisionError):
        replace_file(path, lambda tmp: 1 / 0)
    assert sorted(p.name for p in path.parent.iterdir()) == ["leaderboard.md"]


def test_an_output_file_never_destroys_a_file_named_like_its_temporary_one(ray_session, reference, tmp_path, capsys):
    """`bench results --out X.csv`, the executor table and `bench calibrate --figures X.csv` write a temporary file
    beside X.csv: an unrelated X.tmp there is kept."""
    from bench.grid.executor_table import Choice, read_table, write_rows

    _, results = reference
    for out in (tmp_path / "rows.csv", tmp_path / "rows.parquet"):
        out.with_suffix(".tmp").write_text("someone's notes\n")
        assert main(["results", str(results), "--out", str(out)]) == 0
        assert out.with_suffix(".tmp").read_text() == "someone's notes\n" and out.stat().st_size > 0
    table = tmp_path / "executors.csv"
    table.with_suffix(".tmp").write_text("someone's notes\n")
    choice = Choice(model="resnet18", device="cpu", executor="solo", trials=1)
    write_rows([choice], table)
    assert table.with_suffix(".tmp").read_text() == "someone's notes\n"
    assert [(c.model, c.device) for c in read_table(table)] == [("resnet18", "cpu")]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == ["executors.tmp", "rows.tmp"]


# -- list files of the image sets ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dataset", ["webvision_mini", "red_mini_imagenet"])
@pytest.mark.parametrize("key", ["/etc/hostname", "../../../../etc/hostname", "google/../../../x.jpg"])
def test_a_list_file_key_outside_the_dataset_folder_is_one_line_naming_the_file_and_line(tmp_path, capsys, dataset,
                                                                                         key):
    from tests.datasets.test_realworld import write_red, write_webvision

    if dataset == "webvision_mini":
        write_webvision(tmp_path)
        listing, args = tmp_path / "webvision" / "info" / "train_filelist_google.txt", ["--noise", "real"]
    else:
        write_red(tmp_path)
        listing, args = tmp_path / "mini-imagenet" / "split" / "red_noise_nl_0.2", ["--noise", "red"]
    lines = listing.read_text().splitlines()
    lines.insert(3, f"{key} 1")
    listing.write_text("\n".join(lines) + "\n")
    code = main(["trial", "--dataset", dataset, "--method", "ce", *args, "--r", "0.2", "--epochs-warmup", "0",
                 "--epochs", "0", "--data-root", str(tmp_path), "--results", str(tmp_path / "results")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"{listing}, line 4" in err[0] and repr(key) in err[0] and "outside the dataset's folder" in err[0]
    assert not (tmp_path / "results" / "trials").exists()


def test_image_files_refuse_a_key_that_leaves_their_folder(tmp_path):
    from bench.config import UserError
    from bench.datasets.image_files import ImageFiles

    assert len(ImageFiles(tmp_path, ["a/b.jpg", "c..d.jpg", "..e.jpg"], 32, "someset")) == 3
    for key in ("/etc/hostname", "..", "a/../../b.jpg", "a/..", "a\0b"):
        with pytest.raises(UserError, match=r"someset: the image key .* names a file outside"):
            ImageFiles(tmp_path, ["ok.jpg", key], 32, "someset")


# -- a damaged or half-made MLflow store heals ---------------------------------------------------------------------
def half_made(path: Path, reference_db: Path, kind: str) -> None:
    """An `mlflow.db` as a disk that filled while MLflow made or wrote it leaves one."""
    import sqlite3

    if kind == "some-tables":  # sqlite reads it; MLflow's tables are half there
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT)")
            db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
    elif kind == "truncated":
        path.write_bytes(reference_db.read_bytes()[: reference_db.stat().st_size // 2])
    else:  # the first bytes of its header only
        path.write_bytes(reference_db.read_bytes()[:40])


def trial_runs(results: Path) -> list[str]:
    """The trial ids of the complete trial runs in the folder's MLflow store."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("links").experiment_id], "tags.`bench.kind` = 'trial'")
    return sorted(r.data.tags["bench.trial_id"] for r in runs if r.data.tags.get("bench.complete") == "true")


@pytest.mark.parametrize("kind", ["some-tables", "truncated", "header-only"])
@pytest.mark.parametrize("command", ["sync-mlflow", "run"])
def test_a_half_made_mlflow_store_is_set_aside_and_refilled_from_the_rows(reference, tmp_path, capsys, kind, command):
    """The next `bench sync-mlflow` (or `bench run`, here with every trial done) sets the store aside under a name
    that says so, in one line, and ends with one MLflow run per trial row, exit 0."""
    config, ref = reference
    results = tmp_path / "results"
    for table in ("trials", "epochs"):
        shutil.copytree(ref / table, results / table)
    half_made(results / "mlflow.db", ref / "mlflow.db", kind)
    damaged = (results / "mlflow.db").read_bytes()
    args = ["sync-mlflow", str(results)] if command == "sync-mlflow" else ["run", str(config), "--results",
                                                                           str(results)]
    assert main(args) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if line.startswith("bench: warning:")]
    (aside,) = results.glob("mlflow.db.damaged-*")
    assert len(warned) == 1 and aside.name in warned[0] and "Traceback" not in err, err
    if kind == "some-tables":  # MLflow's attempt wrote into it (its migrations): the old store, none of the new runs
        import sqlite3

        with sqlite3.connect(aside) as db:
            assert db.execute("SELECT count(*) FROM experiments WHERE name = 'links'").fetchone() == (0,)
    else:  # set aside before MLflow opened it
        assert aside.read_bytes() == damaged
    assert trial_runs(results) == sorted(p.stem for p in (results / "trials").glob("*.parquet"))


# -- the store's lock, through filelock (issue #44) ---------------------------------------------------------------
def test_a_refused_launch_leaves_the_holder_named_and_the_lock_is_released_after(tmp_path):
    """The first holder's line survives a second launch's attempt (a lock that truncates its file on open would
    erase it), and once the holder is gone the folder can be held again."""
    from bench.config import UserError
    from bench.store.folder import Store

    results = tmp_path / "results"
    with held_by_another_process(results) as holder:
        for _ in range(2):
            with pytest.raises(UserError, match=rf"in use by `bench` pid {holder} on "):
                with Store(results).hold():
                    pass
        assert (results / ".bench.lock").read_text().startswith(f"`bench` pid {holder} on ")
    with Store(results).hold():
        assert (results / ".bench.lock").read_text().startswith(f"`bench` pid {os.getpid()} on ")


def test_a_full_disk_when_the_holder_is_named_is_one_line(tmp_path, monkeypatch):
    import errno

    from bench.config import UserError
    from bench.store import folder

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(folder, "_name_holder", full)
    with pytest.raises(UserError, match=r"results folder .* cannot be written \(OSError: No space left on device\); "
                                        r"free space there"):
        with folder.Store(tmp_path / "results").hold():
            pass


def test_the_cache_lock_lets_one_holder_in_at_a_time(tmp_path):
    """Two threads (as two members of a pack would) that want one warm start: the second waits for the first."""
    import threading
    import time

    from bench.store.folder import Store

    store, inside, overlaps = Store(tmp_path), [], []

    def hold() -> None:
        with store.lock("warmstart/key"):
            inside.append(1)
            overlaps.append(len(inside))
            time.sleep(0.3)
            inside.pop()

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [1, 1, 1]


# -- links made during a run (issue #54) --------------------------------------------------------------------------
@pytest.mark.parametrize("linked", ["trials", "epochs", "checkpoints", "warmstart"])
def test_a_link_made_after_the_lock_is_refused_as_one_at_launch(tmp_path, monkeypatch, linked):
    """The launch's check has passed and the lock is held; then `linked` is made a link to a folder outside, before
    bench makes that folder: a real trial (the synthetic set, with checkpoints and the warm-start cache) writes
    nothing through it, and the refusal names the link."""
    from bench.config import UserError
    from bench.exec.trainer import run_trial
    from bench.exec.warmstart import WarmStartCache
    from bench.store.folder import Checkpoints, Store
    from bench.trial import TrialConfig

    monkeypatch.setenv("BENCH_UNSAVED", str(tmp_path / "unsaved"))
    results, outside = tmp_path / "results", tmp_path / "outside"
    outside.mkdir()
    (outside / "kept.txt").write_text("not bench's\n")
    config = TrialConfig("synthetic", "dmi", "case3", 0.4, seed=0, epochs=2, epochs_warmup=1)
    lines: list[str] = []
    with Store(results).hold():
        (results / linked).symlink_to(outside, target_is_directory=True)
        try:
            run_trial(config, "unused", results=str(results), log=lines.append,
                      checkpoints=Checkpoints(results, config.trial_id, lines.append),
                      warm_cache=WarmStartCache(str(results)))
        except UserError as e:  # the row's folder: the row kept in $BENCH_UNSAVED, and the link named
            lines.append(str(e))
    assert sorted(p.name for p in outside.iterdir()) == ["kept.txt"]
    said = [line for line in lines if "symbolic link" in line]
    assert said and str(results / linked) in said[0], lines


def test_a_damaged_file_is_never_set_aside_through_a_link(tmp_path):
    """`damaged/` made a link after the launch's check: setting a damaged row aside is refused naming it, and the
    folder it points to stays as it was (pyarrow's move followed the link)."""
    from bench.store.folder import Store

    results, outside = tmp_path / "results", tmp_path / "outside"
    (results / "trials").mkdir(parents=True)
    outside.mkdir()
    (results / "trials" / "0123456789abcdef.parquet").write_bytes(b"not parquet")
    store = Store(results)
    with store.hold():
        (results / "damaged").symlink_to(outside, target_is_directory=True)
        with pytest.raises(OSError, match="symbolic link") as refused:
            store.set_aside_damaged()
    assert str(results / "damaged") in str(refused.value) and list(outside.iterdir()) == []
    assert (results / "trials" / "0123456789abcdef.parquet").read_bytes() == b"not parquet"
