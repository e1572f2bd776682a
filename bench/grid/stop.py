"""How `bench run` stops on SIGTERM or SIGINT: cleanly, and at once on a second signal.

How `bench run` stops on a signal: SIGTERM (what Slurm, Kubernetes, a spot preemption or `timeout` sends) and
SIGINT (Ctrl-C) end a grid cleanly, and a second signal ends it at once.

The driver holds both signals from the start of the run (`GridStop`). Before Ray Tune runs the grid, the first signal
stops the run (`Interrupted`, a KeyboardInterrupt: `bench.cli.main` turns it into exit 128 + the signal's number), so
nothing is half-done: every file is written atomically and the folder's lock is released on the way out. While the
driver is one thread the signal raises it at once; once threads run beside it (MLflow opening, Ray Tune's import) it
only notes the signal, and the run raises it at its next safe point (`check`): an exception raised by a handler can
come out of any line, between a lock's acquire and its `try`, and a lock left held so deadlocked the driver (4 of 14
SIGTERMs during Ray's start with MLflow on: the main thread waited in an import for a module lock that MLflow's
thread held, which waited for the logging lock the main thread's cut-short call had left held). While Ray Tune runs
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
import subprocess
import threading
import time
from collections import defaultdict
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
        self.at_once = False  # the command exits without the interpreter's exit hooks (`bench.cli.main`)


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
        self.noting = False  # threads run beside the driver's: a signal is noted, raised at the next `check`
        self.abandoned = False  # Ray did not stop within STOP_GRACE: the driver leaves it (bench.cli.run exits)
        self._previous: dict[int, Any] = {}
        self.others: set[int] = set()  # Ray processes under this driver before it started its own (`start`)

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

    def beside_threads(self) -> None:
        """From now on threads run beside the driver's: a signal is only noted, and raised at the next `check`."""
        self.noting = True

    def check(self) -> None:
        """A safe point: the noted signal, if one came, stops the run here."""
        if self.signum is not None:
            raise Interrupted(self.signum)

    def start(self, start: Callable[[], bool]) -> bool:
        """Start Ray (`start`, which says whether it started one), then take both signals back. A signal while it
        starts is the same stop as before the grid (`Interrupted`), raised once Ray's start has returned: Ray's own
        SIGTERM handlers, which `ray.init` and its node install, would end the driver with `sys.exit` from wherever
        it was (exit 15, no line, what it had started left running, or a deadlock: the module docstring); here each
        is replaced by ours, and Ray is shut down and its processes ended before the stop goes on."""
        self.others = set(ray_processes())  # a Ray of someone else's in this process's tree (a test's cluster)
        try:
            with self._noting_ray_handlers():
                started = start()
            self.hold()
            if self.signum is None:
                return started
            signum = self.signum
        except SystemExit:  # a handler of Ray's that was not replaced (one installed otherwise) ended with sys.exit
            if self.signum is None:
                raise
            signum = self.signum
        except Interrupted as e:  # ours, where the driver was still one thread
            signum = e.signum
        self.hold()
        self.signum = signum
        self.end_ray()
        stopped = Interrupted(signum)
        stopped.at_once = True  # Ray's core, cut short while it connected, may abort in the interpreter's exit
        raise stopped

    @contextlib.contextmanager
    def _noting_ray_handlers(self) -> Any:
        """While Ray starts, each SIGTERM handler it installs (`ray._private.utils.set_sigterm_handler`: ray.init's,
        then its node's) is ours instead: the signal is noted, and `start` acts on it once Ray's start returns."""
        from ray._private import utils

        install = utils.set_sigterm_handler

        def noting(handler: Callable[[int, FrameType | None], Any]) -> None:
            install(self._handle)

        utils.set_sigterm_handler = noting
        try:
            yield
        finally:
            utils.set_sigterm_handler = install

    def ray_processes(self) -> list[int]:
        """The processes of the Ray this driver started (`ray_processes`, less those that were there before)."""
        return [pid for pid in ray_processes() if pid not in self.others]

    def end_ray(self) -> None:
        """Shut down the Ray this driver started (where `ray.init` got that far), then end its processes that are
        still there: its agents, and what a start cut short had launched."""
        import ray

        pids = self.ray_processes()
        with contextlib.suppress(Exception):
            ray.shutdown()
        end_processes(pids)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # the second signal: at once, Ray's processes (its agents too) with the driver
            say(f"bench: {signal_name(signum)} again: stopped at once; run the same command again to finish the grid")
            end_processes(self.ray_processes())
            os._exit(128 + signum)
        self.signum, self.since = signum, time.monotonic()
        if not self.deferred:
            if not self.noting:
                raise Interrupted(signum)
            return  # noted: raised at the next `check` (the module docstring says why not here)
        say(f"bench: {signal_name(signum)}: stopping the grid at the trials' last checkpoints (send it again to stop "
            "at once)")

    def run(self, grid: Callable[[], Any], lost: Callable[[], bool] = lambda: False) -> None:
        """Run the grid (Ray Tune's fit) in a thread, this one waiting for signals: after the first, the grid has
        STOP_GRACE seconds to stop (a signal sent to the whole process group, as `timeout` and Ctrl-C do, or to every
        process, as Slurm does, reaches Ray's own processes too, and Ray Tune may then wait minutes on a dead Ray); past
        that the driver leaves it (`abandoned`). Once `lost()` (the cluster's head is gone), the driver leaves the
        grid at once: Ray Tune would wait on the dead head until Ray's client ends the process."""
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
                if lost():
                    return
        finally:
            self.deferred = False
        if "error" in outcome and self.signum is None and not lost():
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


def ray_processes() -> list[int]:
    """The Ray processes this driver started: its descendants whose command line names Ray (the GCS, the raylet, the
    workers `ray::...`, and the dashboard and runtime-env agents, which the raylet starts). Taken before Ray stops:
    the agents outlived the driver by 53 s to 2 min, each waiting to notice that its raylet was gone, and once the
    raylet is gone they are nobody's descendants. Whole command lines (`ps -ww`: a $COLUMNS would cut them). Another
    Ray on the machine (another user's) is never among them; one that this process had started before
    (`GridStop.others`) is left out by the caller."""
    try:
        table = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True,
                               timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    children: dict[int, list[int]] = defaultdict(list)
    args: dict[int, str] = {}
    for line in table.splitlines():
        fields = line.split(None, 2)
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
            children[int(fields[1])].append(int(fields[0]))
            args[int(fields[0])] = fields[2] if len(fields) > 2 else ""
    found, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            if "ray" in args[child]:
                found.append(child)
    return found


def end_processes(pids: list[int]) -> None:
    """SIGKILL each of `pids` that is still there."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)

