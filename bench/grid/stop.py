"""How `bench run` stops on a signal: SIGTERM (what Slurm, Kubernetes, a spot preemption or `timeout` sends) and
SIGINT (Ctrl-C) end a grid cleanly, and a second signal ends it at once.

The driver holds both signals from the start of the run (`GridStop`). Before Ray Tune runs the grid, the first signal
raises `Interrupted` (a KeyboardInterrupt: `bench.cli.main` turns it into exit 128 + the signal's number), so nothing
is half-done: every file is written atomically and the folder's lock is released on the way out. While Ray Tune runs
the grid, the first signal only sets a flag that the grid's stopper (`stopper`) hands to Ray Tune, which stops every
unit in flight: a unit is cut at its last epoch checkpoint (the method stage checkpoints after every epoch, and the
warm start is cached per cell), so the next `bench run` resumes it there. The runner then counts the rows on disk
(a unit may have written its rows while the grid stopped), prints the summary, shuts Ray down and exits 143 (SIGTERM)
or 130 (SIGINT).

Ray installs its own handlers in the driver: Python's for SIGTERM (`ray.init`, which exits 1) and a C++ one that
prints a stack dump ("*** SIGTERM received ..."), and Ray Tune one for SIGINT while it runs; `GridStop.hold` takes
both signals back after Ray has started, and `TUNE_DISABLE_SIGINT_HANDLER` keeps Ray Tune's away.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_GRACE = 10.0  # seconds Ray Tune has to stop the grid after a signal (a group signal may have killed Ray itself)
os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")  # the driver's handler stops the grid (GridStop)


class Interrupted(KeyboardInterrupt):
    """The run was stopped by `signum` before its grid started (exit status 128 + signum)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def say(line: str) -> None:
    """One line on stderr from a signal handler: below Python's buffers, and never an error of its own."""
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class GridStop:
    """The driver's hold on SIGINT and SIGTERM for one run (a context manager). `signum` is the first signal
    received (None: none); `deferred` says whether the grid is running (the flag stops it) or not (the signal
    raises `Interrupted`)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.since = 0.0  # when the signal came (time.monotonic)
        self.deferred = False
        self.abandoned = False  # Ray did not stop within STOP_GRACE: the driver leaves it (bench.cli.run exits)
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> GridStop:
        self.hold()
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def hold(self) -> None:
        """Take both signals (again: Ray's start installs its own); only the main thread can (a grid run from
        another thread leaves them as they are)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            previous = signal.signal(sig, self._handle)
            self._previous.setdefault(sig, previous)

    def stop_requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # the second signal: at once, Ray's processes go with the driver
            say(f"bench: {signal_name(signum)} again: stopped at once; run the same command again to finish the grid")
            os._exit(128 + signum)
        self.signum, self.since = signum, time.monotonic()
        if not self.deferred:
            raise Interrupted(signum)
        say(f"bench: {signal_name(signum)}: stopping the grid at the trials' last checkpoints (send it again to stop "
            "at once)")

    def run(self, grid: Callable[[], Any]) -> None:
        """Run the grid (Ray Tune's fit) in a thread, this one waiting for signals: after the first, the grid has
        STOP_GRACE seconds to stop (a signal sent to the whole process group, as `timeout` and Ctrl-C do, or to every
        process, as Slurm does, reaches Ray's own processes too, and Ray Tune may then wait minutes on a dead Ray); past
        that the driver leaves it (`abandoned`)."""
        outcome: dict[str, BaseException] = {}

        def target() -> None:
            try:
                grid()
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                outcome["error"] = e

        thread = threading.Thread(target=target, name="bench-grid", daemon=True)
        self.deferred = True
        thread.start()
        try:
            while thread.is_alive():
                thread.join(0.2)
                if self.signum is not None and time.monotonic() - self.since > STOP_GRACE:
                    self.abandoned = True
                    return
        finally:
            self.deferred = False
        if "error" in outcome and self.signum is None:
            raise outcome["error"]

    def stopper(self, halted: Callable[[], bool]) -> Any:
        """A Ray Tune stopper that ends the grid once a signal came, or once `halted()` (a full disk)."""
        from ray import tune

        hold = self

        class OnSignal(tune.Stopper):
            def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
                return False

            def stop_all(self) -> bool:
                return hold.stop_requested() or halted()

        return OnSignal()
