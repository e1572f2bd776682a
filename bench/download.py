"""A dataset's published files fetched (atomic, with progress on stderr) and checked against their md5.

A dataset's published files fetched, checked and unpacked: the download (atomic, with its progress on stderr), the
md5 a file is checked against, and the one unpack of a published archive (`unpack`: plain files and folders only,
nothing written outside the dataset's folder). `bench.data.Dataset.download` and the datasets that verify releases
use them; `fetch_many` fetches the many images a dataset publishes as a list of URLs (`Dataset.prepare`),
resumably. What a server sends is what others made: every download goes through one bounded stream (`_stream`:
http and https only, redirects included; `Limits` on time and bytes; Content-Length honoured)."""

from __future__ import annotations

import functools
import hashlib
import http.client
import os
import re
import shutil
import stat
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from bench.config import UserError


def file_digest(path: Path, algorithm: str = "md5", chunk: int = 1 << 20) -> str:
    """The hex digest of a file's bytes, read in chunks (a weights file or an image set's archive is gigabytes)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_md5(path: Path) -> str:
    return file_digest(path, "md5")


def weights_md5(path: str | Path) -> str:
    """The md5 of a weights file, computed once per (file, size, modification time) in a process: a grid names the
    same 100 MB file in every trial's identity. "missing" where there is none (refused later, in one line)."""
    path = Path(path).expanduser()
    try:
        stat = path.resolve().stat()
    except OSError:
        return "missing"
    return _md5_of(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _md5_of(path: str, size: int, mtime_ns: int) -> str:
    return file_md5(Path(path))


def fetch(url: str, target: Path, limits: Limits | None = None) -> None:
    """Download `url` (http or https) to `target` atomically within `limits` (`ARCHIVE_LIMITS`: a dataset's published
    file), showing its progress on stderr."""
    limits = limits or ARCHIVE_LIMITS
    target.parent.mkdir(parents=True, exist_ok=True)
    shown: list[DownloadProgress] = []

    def progress(n: int, total: int | None) -> None:
        if not shown:
            shown.append(DownloadProgress(target.name, total or 0))
        shown[0].add(n)

    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False, suffix=".part") as tmp:
        try:
            _stream(url, tmp, limits, time.monotonic() + limits.command_seconds, progress)
        except FetchFailed as e:
            Path(tmp.name).unlink(missing_ok=True)
            raise UserError(f"download of {url} failed: {FAILURE_KINDS[e.kind]} ({e})") from None
        finally:
            for show in shown:
                show.close()
    Path(tmp.name).replace(target)


def unpack(archive: Path, folder: Path, member_md5: dict[str, str] | None = None) -> None:
    """Unpack a tar or zip archive into `folder`, writing nothing outside it.

    An archive is what others made: a member with an absolute name, a `..`, or one that is a link or a device is
    refused, in one line naming it, before it is written (Python 3.11's tar extraction trusts every member:
    `../x`, `/x`, a symbolic link followed by a file under it and a hard link to an outside file all wrote outside the
    data root). The members go into a temporary folder inside `folder`; those named in `member_md5` (path -> md5)
    must match there, the others are renamed into place only then, so a refused archive leaves `folder` as it was."""
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=folder))
    try:
        _extract(archive, staging)
        for rel, md5 in (member_md5 or {}).items():
            if (staging / rel).is_file() and file_md5(staging / rel) != md5:
                raise UserError(f"{archive}: its member {rel} is not the published file (md5 mismatch): delete the "
                                "archive and download it again")
        for entry in sorted(staging.iterdir()):
            _replace(entry, folder / entry.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _extract(archive: Path, staging: Path) -> None:
    """Every member checked (`_check_member`) before it is extracted into `staging`; tar's "data" filter as a second
    guard. A refused member leaves what came before it in `staging` alone, which `unpack` removes."""
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                for info in z.infolist():
                    _check_member(archive, info.filename, _zip_kind(info))
                z.extractall(staging)
            return
        with tarfile.open(archive) as tar:
            for member in tar:  # one pass: a compressed archive read twice took 1.5 times as long
                _check_member(archive, member.name, _tar_kind(member))
                tar.extract(member, staging, filter="data")
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as e:
        raise UserError(f"{archive} is not a readable tar or zip archive ({type(e).__name__}: {e}): delete it and "
                        "get the published one") from None


def _tar_kind(member: tarfile.TarInfo) -> str:
    """What makes a tar member other than a plain file or folder ("" for those)."""
    if member.isfile() or member.isdir():
        return ""
    return ("is a symbolic link" if member.issym() else "is a hard link" if member.islnk() else
            "is a device" if member.ischr() or member.isblk() else "is a named pipe" if member.isfifo() else
            "is neither a file nor a folder")


def _zip_kind(info: zipfile.ZipInfo) -> str:
    """What makes a zip member other than a plain file or folder ("" for those): its Unix mode, where it has one."""
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    return "is a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else ""


def _check_member(archive: Path, name: str, kind: str) -> None:
    """Refuse, in one line naming it, a member that could write outside the folder it is unpacked into."""
    parts = name.replace("\\", "/").split("/")
    why = ("has an absolute name" if name.startswith(("/", "\\")) or name[1:2] == ":" else
           "has '..' in its name" if ".." in parts else kind or ("has an empty name" if not name.strip("/") else ""))
    if why:
        raise UserError(f"{archive}: member {name!r} {why}: bench unpacks only plain files and folders inside the "
                        "dataset's folder; delete the archive and get the published one")


def _replace(source: Path, target: Path) -> None:
    """Move an unpacked entry into place, in place of what stood there: a link is removed, never followed."""
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    os.replace(source, target)


class DownloadProgress:
    """A download's progress on `stream`: a bar redrawn in place on a terminal; elsewhere (a log, `make` piped to
    a file) one line per further 10% (per 10 MB when the size is unknown)."""

    def __init__(self, name: str, total: int, stream: TextIO | None = None) -> None:
        self.name, self.total, self.done = name, total, 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.shown = -1  # the last tenth (or 10 MB) written as a line

    def add(self, n: int) -> None:
        self.done += n
        mb = f"{self.done / 1e6:.1f}" + (f" of {self.total / 1e6:.1f} MB" if self.total else " MB")
        if self.tty:
            frac = self.done / self.total if self.total else 0.0
            bar = f"[{'#' * int(30 * frac):<30}] {100 * frac:3.0f}% " if self.total else ""
            self.stream.write(f"\rdownloading {self.name} {bar}{mb}")
        else:
            step = int(10 * self.done / self.total) if self.total else self.done // 10_000_000
            if step > self.shown:
                self.shown = step
                pct = f"{100 * self.done / self.total:.0f}%, " if self.total else ""
                self.stream.write(f"downloading {self.name}: {pct}{mb}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


MANIFEST = ".fetched.tsv"  # `fetch_many`'s record of what it fetched: `name<TAB>bytes<TAB>sha256` a line
_MANIFEST_LINE = re.compile(r"([^\t]+)\t([0-9]{1,18})\t([0-9a-f]{64})")  # ASCII digits: `int("²")` raised


@dataclass(frozen=True)
class Limits:
    """What one file of `fetch_many` may take: seconds from its request to its last byte (`file_seconds`; a server
    sending one byte every 10 s held the command forever), bytes (`file_bytes`; an endless body wrote 3.4 GB in
    25 s), seconds of silence (`read_seconds`); and what the whole command may take (`command_seconds`: then the
    files not yet fetched fail, for the next run to fetch)."""

    file_seconds: float = 120.0
    file_bytes: int = 50_000_000  # a web image; the published sizes are not known
    read_seconds: float = 30.0
    command_seconds: float = 4 * 3600.0


# A dataset's published file (an archive of images is gigabytes; CIFAR-10's 163 MB): bounds against a server that never
# ends or drips, not against a slow line.
ARCHIVE_LIMITS = Limits(file_seconds=6 * 3600.0, file_bytes=50_000_000_000, read_seconds=60.0,
                        command_seconds=6 * 3600.0)


class FetchFailed(Exception):
    """One file not fetched: `kind` (one of `FAILURE_KINDS`: what `bench datasets --prepare` counts) and the detail."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


# Each way a file can fail, as the one line `Fetched.lines` gives it.
FAILURE_KINDS = {
    "scheme": "not an http:// or https:// address (a redirect's target included)",
    "http": "the server answered with an HTTP error",
    "network": "no answer (connection refused or reset, or silent for the read timeout)",
    "cut": "the body ended before its Content-Length",
    "large": "over the size bound",
    "slow": "not done within the deadline per file",
    "unreadable": "not a readable file of its kind (an HTML page, say)",
    "deadline": "not fetched within the command's deadline",
}


@dataclass
class Fetched:
    """What `fetch_many` did: the names fetched, kept (present and matching) and failed (name -> failure kind)."""

    fetched: list[str]
    kept: list[str]
    failed: dict[str, str]

    def lines(self, prefix: str) -> list[str]:
        """One line per failure kind: how many, what, the first name."""
        kinds: dict[str, list[str]] = {}
        for name, kind in sorted(self.failed.items()):
            kinds.setdefault(kind, []).append(name)
        return [f"{prefix}{len(names):,} failed: {FAILURE_KINDS[kind]} (first: {names[0]})"
                for kind, names in kinds.items()]


class _HttpRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects to http:// and https:// only (urllib's own follows ftp:// too), refused as their own kind."""

    def http_error_302(self, req, fp, code, msg, headers):  # noqa: ANN001, ANN201 (urllib's signature)
        target = headers.get("location") or headers.get("uri") or ""
        if urllib.parse.urlsplit(urllib.parse.urljoin(req.full_url, target)).scheme not in ("http", "https"):
            fp.close()
            raise FetchFailed("scheme", f"redirected to {target}")
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


_OPENER = urllib.request.build_opener(_HttpRedirects)


def _stream(url: str, out: BinaryIO, limits: Limits, until: float,
            progress: Callable[[int, int | None], None] | None = None) -> None:
    """Write the body at `url` to `out` within `limits`, or raise `FetchFailed`; `until`: the command's deadline;
    `progress(bytes, Content-Length)` after each block."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise FetchFailed("scheme", url)
    stop = min(time.monotonic() + limits.file_seconds, until)
    try:
        with _OPENER.open(url, timeout=limits.read_seconds) as response:
            length = response.headers.get("Content-Length")
            length = int(length) if length and length.isascii() and length.isdigit() else None
            if length is not None and length > limits.file_bytes:
                raise FetchFailed("large", f"Content-Length {length:,} bytes, over {limits.file_bytes:,}")
            got = 0
            while block := response.read1(1 << 16):  # what has arrived: a drip is seen between its bytes
                got += len(block)
                if got > limits.file_bytes:
                    raise FetchFailed("large", f"over {limits.file_bytes:,} bytes")
                if time.monotonic() > stop:
                    raise FetchFailed("slow" if stop < until else "deadline", f"{got:,} bytes when time ran out")
                out.write(block)
                if progress is not None:
                    progress(len(block), length)
    except FetchFailed:
        raise
    except urllib.error.HTTPError as e:
        raise FetchFailed("http", f"HTTP {e.code} {e.reason}") from None
    except (OSError, ValueError, http.client.HTTPException) as e:  # URLError, timeouts, resets; a malformed URL
        raise FetchFailed("network", " ".join(str(e).split())) from None
    if length is not None and got != length:
        raise FetchFailed("cut", f"{got:,} of the {length:,} bytes its Content-Length announced")


def fetch_many(items: dict[str, str], folder: Path, workers: int = 8, limits: Limits | None = None,
               check: Callable[[Path], None] | None = None) -> Fetched:
    """Fetch many files (name in `folder` -> URL), the kind of list a dataset publishes instead of its images.

    Resumable and checked: each file is fetched within `limits`, read by `check` (an image decoded; it raises
    `UserError` for a file that is not one), written atomically, then its size and sha256 are appended to
    `folder/.fetched.tsv`; a later call keeps every file that still matches its line there and fetches the rest (not
    yet fetched, failed before, or changed since). Names must stay inside `folder`; addresses must be http or https.
    A URL that fails (the web's images disappear) is not fatal: it is counted by kind and named in
    `folder/.failed.tsv` (`name<TAB>url<TAB>error`), and the next call tries it again."""
    limits = limits or Limits()
    until = time.monotonic() + limits.command_seconds
    folder.mkdir(parents=True, exist_ok=True)
    for name in items:
        if Path(name).is_absolute() or ".." in Path(name).parts or not name:
            raise UserError(f"cannot fetch {name!r} into {folder}: a name must be a path inside the folder")
    recorded: dict[str, tuple[int, str]] = {}
    if (folder / MANIFEST).is_file():
        for line in (folder / MANIFEST).read_text(encoding="utf-8", errors="replace").splitlines():
            if match := _MANIFEST_LINE.fullmatch(line):  # any other line: its file is fetched again
                recorded[match[1]] = (int(match[2]), match[3])

    def intact(name: str) -> bool:
        path, known = folder / name, recorded.get(name)
        return known is not None and path.is_file() and path.stat().st_size == known[0] \
            and file_digest(path, "sha256") == known[1]

    result = Fetched(fetched=[], kept=[name for name in items if intact(name)], failed={})
    todo = [name for name in items if name not in set(result.kept)]
    lock = threading.Lock()
    failures: list[str] = []

    def one(name: str) -> None:
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        try:
            if time.monotonic() > until:
                raise FetchFailed("deadline", "not started")
            with open(tmp, "wb") as out:
                _stream(items[name], out, limits, until)
            if check is not None:
                try:
                    check(tmp)
                except UserError as e:
                    raise FetchFailed("unreadable", str(e)) from None
        except FetchFailed as e:
            tmp.unlink(missing_ok=True)
            with lock:
                result.failed[name] = e.kind
                failures.append(f"{name}\t{items[name]}\t{FAILURE_KINDS[e.kind]}: {' '.join(str(e).split())}")
            return
        tmp.replace(target)
        line = f"{name}\t{target.stat().st_size}\t{file_digest(target, 'sha256')}\n"
        with lock, open(folder / MANIFEST, "a", encoding="utf-8") as manifest:
            manifest.write(line)
            result.fetched.append(name)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(one, todo))
    (folder / ".failed.tsv").write_text("".join(f"{line}\n" for line in sorted(failures)), encoding="utf-8")
    return Fetched(sorted(result.fetched), sorted(result.kept), dict(sorted(result.failed.items())))
