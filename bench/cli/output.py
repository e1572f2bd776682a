"""Standard output and standard error that cannot be used: closed (`>&-`, `2>&-`), or refusing writes (`> /dev/full`).

`prepared()` runs before a command: a closed stream's file descriptor is pointed at /dev/null, so that nothing fails on
it (Ray's start enables faulthandler on stderr, and fails where there is none), and bench's own error line goes to the
channel that works (stderr, else stdout: `errors`). Standard output is wrapped (`Guarded`) so that a write it refuses
is `Unwritable`, not an OSError deep in a command: `bench run` goes on without printing (as where its reader left,
`bench.cli.run.Lines`), every other command ends in one line on stderr, exit 2."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class Unwritable(Exception):
    """Standard output refused a write (a full device, a closed or bad descriptor); `error` is why."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error.strerror or str(error))
        self.error = error


class Guarded:
    """A text stream whose refused writes raise `Unwritable` (a reader that left stays a BrokenPipeError, which
    callers already handle); everything else is the stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise Unwritable(e) from None

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise Unwritable(e) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _reopen(fd: int) -> TextIO:
    """The closed descriptor `fd` pointed at /dev/null, as a text stream."""
    null = os.open(os.devnull, os.O_WRONLY)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)
    return open(fd, "w", closefd=False)  # noqa: SIM115 - the process's stream from here on


@contextmanager
def prepared() -> Iterator[TextIO | None]:
    """Usable streams for one command; yields the channel for its error line (None: neither works). Standard
    output is restored afterwards (the command line may be called again in one process, as tests do)."""
    closed = {name: getattr(sys, name) is None for name in ("stdout", "stderr")}
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if closed[name]:
            setattr(sys, name, _reopen(fd))
    before = sys.stdout
    if not isinstance(before, Guarded):
        sys.stdout = Guarded(before)
    try:
        yield None if all(closed.values()) else sys.stdout if closed["stderr"] else sys.stderr
    finally:
        if isinstance(sys.stdout, Guarded) and sys.stdout.stream is before:
            sys.stdout = before


def silence_stdout() -> None:
    """Standard output goes nowhere from here on (the interpreter's last flush included)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stdout from here on


def refused(error: Unwritable, errors: TextIO | None) -> None:
    """Standard output refused a write: stop printing there, and say so in one line where that can go."""
    silence_stdout()
    if errors is None or isinstance(errors, Guarded):  # stderr is closed, and stdout refuses: nowhere to say it
        return
    try:
        print(f"bench: error: standard output cannot be written ({error}); send it to a file or a pipe that takes it",
              file=errors, flush=True)
    except OSError:
        pass
