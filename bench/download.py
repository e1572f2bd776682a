"""A dataset's published files fetched and checked: the download (atomic, with its progress on stderr) and the md5
a file is checked against. `bench.data.Dataset.download` and the datasets that verify releases use them."""

from __future__ import annotations

import functools
import hashlib
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import TextIO

from bench.config import UserError


def file_md5(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


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


def fetch(url: str, target: Path) -> None:
    """Download `url` to `target` atomically, showing its progress on stderr."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False, suffix=".part") as tmp:
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                show = DownloadProgress(target.name, int(response.headers.get("Content-Length") or 0))
                while block := response.read(1 << 20):
                    tmp.write(block)
                    show.add(len(block))
                show.close()
        except OSError as e:
            Path(tmp.name).unlink(missing_ok=True)
            raise UserError(f"download of {url} failed: {e}") from None
    Path(tmp.name).replace(target)


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
