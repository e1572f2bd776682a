"""The results store: one results folder (a local path or a pyarrow filesystem URI) and every file kept in it.

    trials/<trial_id>.parquet   one row per trial (`bench.store.rows.make_row`), written last: its presence means done
    epochs/<trial_id>.parquet   the per-epoch curves of the same trial
    checkpoints/<unit>.pt       a running trial's (or pack's) state after its last finished epoch; gone once its
                                rows are written
    warmstart/<key>.pt          the CE warm-start cache (`bench.exec.warmstart`)
    logs/<unit>.log             each Ray trial's log (a local folder; on a URI it stays in the trial's Ray folder)
    ray/                        Ray Tune's own storage
    mlflow.db, mlartifacts/     the embedded MLflow store (`bench.store.mirror`)
    damaged/                    unreadable result files that `bench run` set aside
    index/<table>.parquet       a compact copy of each table's rows, by file, that readers keep and check against
                                the listing (`bench.store.dataset`): a cache, never the truth
    grids/<experiment>.yaml     each grid `bench run` ran, as its experiment file, and the trials it expands to
    grids/<experiment>.json     (`bench.store.grids`): the readers say which of them have no row
    .bench.lock                 held by the one driver writing into the folder (local folders only)

A local results folder holds no links: results folders travel between people (a tarball unpacked), and a link where
a file of ours belongs would make bench write through it, outside the folder. `bench run` and `bench sync-mlflow`
refuse a folder that holds one (`refuse_links`), in one line naming it, before anything is written; the files
themselves are written so that a link in their place is replaced, never written through (`replace_file`, the
temporary name and rename of every store file), and the files bench appends to or locks are opened without following
a link (`open_append`, `open_no_link`). A link planted during a run, after that check (`trials` made a link once the
lock is held, before bench makes the folder), is refused as one at launch: the store's files are written and deleted
relative to a descriptor of their folder, each folder from the root down opened without following a link
(`folder_fd`), so a link anywhere on the way is an error naming it, never a way out.

Whether a location is a local folder or an object store is decided here (`is_local`) and nowhere else. Every file is
written to a temporary name and renamed, so a reader never sees half a file; parquet is the source of truth, MLflow
mirrors it.

Faults: a file that cannot be read (a disk error, a copy cut short), or that reads but is not one of ours
(`bench.store.columns.not_ours`: another schema, a trial_id that is not its file name, a name field that could not be
a file name: results folders travel between people) is skipped with one warning naming it, never a lock-out of the
folder; `bench run` moves it aside to `damaged/` and re-runs its trial. A row that cannot be written where it
belongs is kept in `~/.cache/bench/unsaved` (a results folder of its own) and the error says so. A write that fails
half-way leaves no temporary file behind.

pyarrow, polars, torch and filelock are imported where files are read, written or locked, not by importing this
module: the training core writes its rows, checkpoints and warm starts through the store and must import on a bare
GPU box.
"""

from __future__ import annotations

import errno
import io
import os
import re
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from bench.config import FolderFull, UserError, disk_full
from bench.store import dataset
from bench.store.columns import arrow_tables

TABLES = ("trials", "epochs")


def is_local(results: str | os.PathLike[str]) -> bool:
    """A folder on this machine (a path or a file:// URI), as opposed to an object store (s3://, gs://, ...)."""
    return "://" not in str(results) or str(results).startswith("file://")


def local_path(results: str | os.PathLike[str]) -> Path:
    return Path(str(results).removeprefix("file://")).expanduser().resolve()


def absolute(results: str | os.PathLike[str]) -> str:
    """The location as workers must see it (they run in their own folders): an absolute path, or the URI."""
    return str(local_path(results)) if is_local(results) else str(results)


def links_under(root: Path) -> list[Path]:
    """Every symbolic link inside the local folder `root` (not `root` itself), in name order, found without following
    any (a link to a folder is one entry, not a folder to walk)."""
    found: list[Path] = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in entries:
        if entry.is_symlink():
            found.append(Path(entry.path))
        elif entry.is_dir(follow_symlinks=False):
            found.extend(links_under(Path(entry.path)))
    return found


def refuse_links(root: Path, what: str) -> None:
    """A `UserError` in one line naming the first link inside `root` (a `what`, e.g. "results folder") and how many
    there are: bench writes only its own files there, never through a link, and checks before writing anything."""
    links = links_under(root)
    if not links:
        return
    first = links[0]
    more = f" (and {len(links) - 1} more)" if len(links) > 1 else ""
    raise UserError(f"{what} {root} holds a symbolic link where bench writes its own files: "
                    f"{first.relative_to(root)} -> {os.readlink(first)}{more}; bench never writes through a link: "
                    "remove the links (or put a copy of what each points to in its place) and run again")


def folder_fd(root: Path, folders: list[str], make: bool) -> int:
    """A descriptor of `root/folders...`, each folder opened relative to the one above without following a link (and
    made first where `make`): a link on the way, planted at any moment, is an `OSError` (ELOOP) naming it. The root
    itself is the user's choice of place, a link or not."""
    if make:
        root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for n, folder in enumerate(folders):
        try:
            if make:
                with suppress(FileExistsError):
                    os.mkdir(folder, dir_fd=fd)
            inner = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as e:
            os.close(fd)
            where = str(root.joinpath(*folders[:n + 1]))
            if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(where):
                raise OSError(errno.ELOOP, "a symbolic link where bench keeps its own folder", where) from None
            raise
        os.close(fd)
        fd = inner
    return fd


def open_no_link(path: Path, flags: int) -> int:
    """`os.open(path, flags | O_NOFOLLOW)` (mode 0o666 less the umask for a new file), after checking that the folder
    holding it is not a link either: a link in either place is an `OSError` (ELOOP) naming `path`, never opened."""
    if path.parent.is_symlink():
        raise OSError(errno.ELOOP, "its folder is a symbolic link", str(path))
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link where bench writes its own file", str(path)) from None
        raise


def open_append(path: Path) -> io.TextIOWrapper:
    """`path` opened to append lines (created if missing, line-buffered), never through a link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_no_link(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return open(fd, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - the caller closes it


def replace_file(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> None:
    """Write a local file whole: `write(tmp)` into a new file of a unique name beside `path` (created here, so it
    never meets another file, `X.tmp` included), then renamed over `path`. A reader never sees half a file, a link in
    `path`'s place is replaced rather than written through, and a write that fails leaves no temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    os.close(open_no_link(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_probe(where: Path) -> OSError | None:
    """Write and remove a probe file in the folder `where`: None where this process can write there, else why not."""
    probe = where / f".bench-probe-{uuid.uuid4().hex}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        return e
    return None


def check_output(path: str | os.PathLike[str], what: str, fix: str, kind: str = "folder") -> Path:
    """Before anything is written: a local output (`kind` "folder" or "file") that this process can create or
    replace, checked by writing a probe file where it would go (into its nearest existing folder); else a
    `UserError` naming what is wrong, ending in `fix`. Returns the absolute path."""
    path = Path(path).expanduser().absolute()
    if kind == "folder" and path.exists() and not path.is_dir():
        raise UserError(f"{what} {path} is a file, not a folder; {fix}")
    if kind == "file" and path.is_dir():
        raise UserError(f"{what} {path} is a folder, not a file; {fix}")
    where = path if kind == "folder" else path.parent
    while not where.exists() and where.parent != where:
        where = where.parent
    if not where.is_dir():
        raise UserError(f"{what} {path}: {where} is a file, not a folder; {fix}")
    if e := write_probe(where):
        raise UserError(f"{what} {path} cannot be written ({e.strerror or e} in {where}); {fix}")
    if kind == "file" and path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{what} {path} is read-only; {fix}")
    return path


class Store:
    """One results folder. `root` is the folder's path on its filesystem (`fs`, pyarrow's, opened when first used)."""

    def __init__(self, results: str | os.PathLike[str]) -> None:
        self.location = str(results)
        self.local = is_local(results)
        if self.local:
            self.root = str(local_path(results))
            self._fs: Any = None
        else:
            import pyarrow.fs as pafs

            self._fs, self.root = pafs.FileSystem.from_uri(self.location)

    @property
    def fs(self) -> Any:
        if self._fs is None:
            import pyarrow.fs as pafs

            self._fs = pafs.LocalFileSystem()
        return self._fs

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(path).type == pafs.FileType.File

    def delete(self, path: str) -> None:
        if not self.local:
            if self.exists(path):
                self.fs.delete_file(path)
            return
        *folders, name = self._parts(path)
        try:
            fd = folder_fd(Path(self.root), folders, make=False)
        except FileNotFoundError:
            return
        try:
            os.unlink(name, dir_fd=fd)
        except (FileNotFoundError, IsADirectoryError):  # a file's only
            pass
        finally:
            os.close(fd)

    def _parts(self, path: str) -> list[str]:
        """A local store path's names below the root."""
        return list(Path(path).relative_to(self.root).parts)

    def log_path(self, unit: str) -> Path:
        """Where a Ray trial logs: `logs/<unit>.log` in a local folder, else `trial.log` in the trial's own folder
        under Ray's storage (which Ray syncs to the URI)."""
        return Path(self.path("logs", f"{unit}.log")) if self.local else Path("trial.log")

    def ray_storage(self) -> str:
        """Ray Tune's own storage, `ray/`: a local folder (created here) or a URI, which Ray Tune takes as it is."""
        if not self.local:
            return f"{self.location}/ray"
        Path(self.path("ray")).mkdir(parents=True, exist_ok=True)
        return self.path("ray")

    def logs_hint(self) -> str:
        return self.path("logs") if self.local else "each trial's folder under results/ray"

    # -- files of bytes and of tensors --------------------------------------------------------------------------
    def write_bytes(self, path: str, data: bytes) -> None:
        """Atomically: to a temporary name in the same folder, then renamed."""
        self._atomically(path, lambda out: out.write(data))

    def _atomically(self, path: str, write: Callable[[Any], Any]) -> None:
        """`write(stream)` into a temporary file beside `path`, then renamed to `path`; if anything fails (a full
        disk), the temporary file goes and the error stays. In a local folder, relative to its folder's descriptor
        (`folder_fd`): never through a link, whenever it was made."""
        if not self.local:
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            try:
                with self.fs.open_output_stream(tmp) as out:
                    write(out)
                self.fs.move(tmp, path)
            except BaseException:
                try:
                    self.delete(tmp)
                except Exception:  # noqa: BLE001, S110 - the first error is the one to report
                    pass
                raise
            return
        *folders, name = self._parts(path)
        fd = folder_fd(Path(self.root), folders, make=True)
        tmp = f".{name}.{uuid.uuid4().hex}.tmp"
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666, dir_fd=fd),
                      "wb") as out:
                write(out)
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise
        finally:
            os.close(fd)

    def read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return f.read()

    def save_tensors(self, path: str, obj: Any) -> None:
        import torch

        buffer = io.BytesIO()
        torch.save(obj, buffer)
        self.write_bytes(path, buffer.getvalue())

    def load_tensors(self, path: str) -> Any:
        """A file written by `save_tensors`; loading never unpickles code (weights_only)."""
        import torch

        return torch.load(io.BytesIO(self.read_bytes(path)), map_location="cpu", weights_only=True)

    # -- result rows --------------------------------------------------------------------------------------------
    def write_trial(self, row: dict[str, Any], epochs: list[dict[str, Any]]) -> str:
        """Write the trial's curves, then its row (the declared types: `bench.store.columns`); return the row's path.

        If the folder refuses the write (full, read-only, gone), the finished trial is not lost: its row and curves
        go to `unsaved_folder()` and the `UserError` says where, and how to move them back. A row that does not fit
        its declared columns is a `ValueError` (or an arrow error) before anything is written."""
        import pyarrow as pa

        tables = arrow_tables(row, epochs)
        try:
            return self._write_trial(*tables)
        except (OSError, pa.ArrowException) as e:
            problem = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
            trial_id = row["trial_id"]
            try:  # no curves without their row
                self.delete(self.path("epochs", f"{trial_id}.parquet"))
            except (OSError, pa.ArrowException):
                pass
            for keep in (unsaved_folder(), Path(tempfile.gettempdir()) / "bench-unsaved"):
                try:
                    Store(keep)._write_trial(*tables)
                except (OSError, pa.ArrowException):
                    continue
                error = FolderFull if disk_full(e) else UserError
                raise error(f"could not write the row of trial {trial_id} to {self.location} ({problem}); kept "
                                f"it in {keep}/trials: move {keep}/trials/{trial_id}.parquet and "
                                f"{keep}/epochs/{trial_id}.parquet into the results folder") from None
            raise (FolderFull if disk_full(e) else UserError)(
                f"could not write the row of trial {trial_id} to {self.location} ({problem}), nor to "
                f"{unsaved_folder()}: the trial's result is lost") from None

    def _write_trial(self, trial_id: str, row: Any, epochs: Any) -> str:
        self._write_parquet(self.path("epochs", f"{trial_id}.parquet"), epochs)
        path = self.path("trials", f"{trial_id}.parquet")
        self._write_parquet(path, row)
        return path

    def _write_parquet(self, path: str, table: Any) -> None:
        import pyarrow.parquet as pq

        self._atomically(path, lambda out: pq.write_table(table, out))

    def _read(self, path: str) -> Any:
        """One parquet file as a polars frame; None (with one warning per file and process) if it is unreadable or
        not one of ours."""
        frame, problem = dataset.read_one(self.fs, path)
        _warn({path: problem} if problem else {})
        return frame

    def scan(self, table: str = "trials", columns: Sequence[str] | None = None) -> tuple[Any, dict[str, str]]:
        """All rows of `trials` or `epochs` as one polars frame (empty if none), of the `columns` the files hold (all
        for None), read as one dataset (`bench.store.dataset`), and each file that is unreadable or not one of ours
        with what is wrong with it (no warning: the caller says what it does with them)."""
        return dataset.read(self, table, columns)

    def read_table(self, table: str = "trials", columns: Sequence[str] | None = None) -> Any:
        """All rows of `trials` or `epochs`, as one polars frame (empty if none), of the `columns` the files hold
        (all for None: a command names those it uses); unreadable files are skipped with one warning each."""
        frame, problems = self.scan(table, columns)
        _warn(problems)
        return frame

    def read_row(self, trial_id: str, curves: bool = True) -> tuple[dict[str, Any] | None, Any]:
        """One trial's row and its curves (None where missing or unreadable, or not asked for: `curves`)."""
        def read(table: str) -> Any:
            path = self.path(table, f"{trial_id}.parquet")
            return self._read(path) if self.exists(path) else None

        row, epochs = read("trials"), read("epochs") if curves else None
        return (row.row(0, named=True) if row is not None and row.height else None), epochs

    def statuses(self) -> dict[str, str]:
        """trial_id -> status of every result row."""
        table = self.read_table(columns=("trial_id", "status"))
        if table.is_empty():
            return {}
        return dict(zip(table["trial_id"].to_list(), table["status"].to_list(), strict=True))

    def set_aside_damaged(self) -> list[tuple[str, str]]:
        """Move every result file that is unreadable or not one of ours to `damaged/` (so that its trial runs again
        and the file stays for inspection); return (where each went, what was wrong). A trial whose curves are
        damaged has its row set aside too: its row alone would mark it done, and its curves would never come back.
        Reads only what the check needs, each file once."""
        moved = []
        for table in ("epochs", "trials"):  # curves first: their rows follow them
            for path, problem in sorted(self.scan(table, columns=())[1].items()):
                moved.append((self._set_aside(table, path), problem))
                row = self.path("trials", Path(path).name)
                if table == "epochs" and self.exists(row):
                    moved.append((self._set_aside("trials", row), "its curves (epochs/) were damaged"))
        return moved

    def _set_aside(self, table: str, path: str) -> str:
        target = self.path("damaged", f"{table}-{Path(path).name}.{time.strftime('%Y%m%d-%H%M%S')}")
        if not self.local:
            self.fs.create_dir(self.path("damaged"), recursive=True)
            self.fs.move(path, target)
            return target
        *folders, name = self._parts(path)
        source, damaged = folder_fd(Path(self.root), folders, make=False), None
        try:
            damaged = folder_fd(Path(self.root), ["damaged"], make=True)
            os.replace(name, Path(target).name, src_dir_fd=source, dst_dir_fd=damaged)
        finally:
            os.close(source)
            if damaged is not None:
                os.close(damaged)
        return target

    @contextmanager
    def hold(self) -> Iterator[None]:
        """One driver per results folder: an exclusive lock of the operating system on `.bench.lock` (`filelock`:
        `flock` on Linux and macOS, `LockFileEx` on Windows), a file that names its holder. A second holder gets a
        `UserError` naming the first. The system drops the lock when its process dies. The folder holds no link
        (`refuse_links`), and the lock file is opened without following one. Object stores have no lock (one driver
        per folder is then the user's rule)."""
        if not self.local:
            yield
            return
        from filelock import FileLock, Timeout

        refuse_links(Path(self.root), "results folder")
        path = Path(self.root) / ".bench.lock"
        lock = FileLock(path, timeout=0, thread_local=False, preserve_lock_file=True, on_acquired=_name_holder)
        try:
            Path(self.root).mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except Timeout:
            raise UserError(f"results folder {self.root} is in use by {_holder(path)}; wait for it to finish (or stop "
                            "it), or use another --results") from None
        except OSError as e:
            if e.errno == errno.ELOOP:  # a link planted after the check above
                raise UserError(f"results folder {self.root}: {path.name} is a symbolic link; bench never writes "
                                "through a link: remove it and run again") from None
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and not disk_full(e):
                # a read-only folder (sync-mlflow to a server): nobody else can write into it either
                yield
                return
            raise UserError(f"results folder {self.root} cannot be written ({type(e).__name__}: "
                            f"{e.strerror or e}); free space there (or use another --results)") from None
        try:
            yield
        finally:
            lock.release()

    def driver(self) -> str | None:
        """Who holds the folder (`hold`), as its lock file names it, for a reader in another shell; None where no
        lock file names one, or its holder is a process of this host that is gone. Reads only: taking the lock to
        test it would refuse a driver starting at that moment. A holder on another host is taken at its word."""
        if not self.local:
            return None
        holder = _holder(Path(self.root) / ".bench.lock")
        found = re.fullmatch(r"`bench` pid (\d+) on (\S+) since .*", holder)
        if found is None:
            return None
        if found[2] == socket.gethostname():
            try:
                os.kill(int(found[1]), 0)
            except ProcessLookupError:
                return None
            except PermissionError:  # alive, another user's
                pass
        return holder

    @contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """An exclusive lock on `<name>.lock` (waits for it) in a local folder, never through a link; on an object
        store, none."""
        if not self.local:
            yield
            return
        from filelock import FileLock

        path = Path(self.path(f"{name}.lock"))
        try:
            os.close(folder_fd(Path(self.root), self._parts(str(path))[:-1], make=True))
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise UserError(f"results folder {self.root}: {e.filename} is a symbolic link; bench never writes "
                            "through a link: remove it and run again") from None
        with FileLock(path, thread_local=False, preserve_lock_file=True):  # O_NOFOLLOW: a link is an OSError
            yield


def _name_holder(fd: int) -> None:
    """Write who holds the folder into the lock file just locked (below Python's buffers: a full disk fails here)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"`bench` pid {os.getpid()} on {socket.gethostname()} since "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)


def _holder(path: Path) -> str:
    """Who holds the lock at `path`, as its file says (read without following a link)."""
    try:
        fd = open_no_link(path, os.O_RDONLY)
    except OSError:
        return "another process"
    with open(fd, "rb") as f:
        return f.read(500).decode("utf-8", "replace").strip() or "another process"


def _warn(problems: dict[str, str]) -> None:
    """One warning for each file of `problems` (path -> what is wrong) not yet named in this process."""
    for path, problem in sorted(problems.items()):
        if path not in _WARNED:
            _WARNED.add(path)
            print(f"bench: warning: skipping the result file {path} ({problem}); `bench run` sets it aside and "
                  "runs its trial again", file=sys.stderr, flush=True)


_WARNED: set[str] = set()  # unreadable files already named in this process


class Checkpoints:
    """`checkpoints/<unit>.pt`: a trial's (or a pack's) method-stage state after its last finished epoch, so that a
    trial retried by Ray, or re-run after the driver was killed, resumes where it stopped. Cleared once the unit's
    rows are written. An unreadable checkpoint is ignored (the unit starts over)."""

    def __init__(self, results: str | os.PathLike[str], unit: str, log: Callable[[str], None]) -> None:
        self.store, self.log = Store(results), log
        self.path = self.store.path("checkpoints", f"{unit}.pt")
        self.off = False  # set when a save failed: the unit goes on without checkpoints
        self.warning: str | None = None  # why (for the driver)

    def load(self) -> dict[str, Any] | None:
        if not self.store.exists(self.path):
            return None
        try:
            return self.store.load_tensors(self.path)
        except Exception as e:  # noqa: BLE001 - a bad checkpoint costs a restart, never the trial
            self.log(f"ignoring the unreadable checkpoint {self.path}: {type(e).__name__}: {e}")
            return None

    def save(self, state: dict[str, Any]) -> None:
        """Save the state after an epoch; a checkpoint is an optimisation, so a write that fails (a full disk) is
        one warning, no file, and no more checkpoints for this unit: the training goes on."""
        if self.off:
            return
        try:
            self.store.save_tensors(self.path, state)
        except OSError as e:
            self.off = True  # an older checkpoint stays valid: it resumes from its own epoch, with the same numbers
            self.warning = (f"could not write the checkpoint {self.path} ({type(e).__name__}: "
                            f"{' '.join(str(e).split())[:160]}); training goes on without checkpoints (a retry starts "
                            "this unit over)")
            self.log(f"bench: warning: {self.warning}")

    def clear(self) -> None:
        self.store.delete(self.path)


def unsaved_folder() -> Path:
    """Where a row goes when its results folder refuses it: `$BENCH_UNSAVED`, else ~/.cache/bench/unsaved."""
    env = os.environ.get("BENCH_UNSAVED")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "bench" / "unsaved"


def read_table(results: str | os.PathLike[str], table: str = "trials", columns: Sequence[str] | None = None) -> Any:
    """`Store(results).read_table(table, columns)`: all rows of `trials` or `epochs` as one polars frame."""
    return Store(results).read_table(table, columns)
