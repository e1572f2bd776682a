"""The grid's MLflow mirror, off the trials' path and off the driver's CPU: a Ray Tune callback hands each finished
unit's trial ids to a writer process (`MirrorProcess`, running `bench.store.mirror_writer`), which reads their result
rows and logs them to MLflow in batches, while Ray Tune's loop goes on. Parquet is the record and MLflow a view of it,
so this sink stands apart from the driver's lines (`bench.grid.progress`): a store that is slow costs the writer only,
one that is down, or a writer that dies, costs the mirror only, and `bench sync-mlflow` backfills it from the rows.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bench.grid.progress import Tally
from bench.store.folder import is_local
from bench.store.mirror import tracking_uri


@dataclass
class MirrorOutcome:
    """The mirror as the writer process left it, for the closing summary (`bench.grid.progress.print_summary`)."""

    uri: str
    failed: str | None
    embedded: bool

    @property
    def ok(self) -> bool:
        return self.failed is None


class MirrorProcess:
    """The grid's MLflow writer, a process of its own (`bench.store.mirror_writer`, whose docstring has the pipe's
    messages), started once before Ray: MLflow's import (seconds of CPU), the store's opening, the backfill of the
    folder's finished trials (`done`) and every run's sqlite commits are its CPU, not the driver's. `put` hands it trial
    ids; a thread of the driver reads its answers: runs logged (`Tally.mlflow_logged`), its lines (`out`) and
    warnings (stderr). `close` ends its input and waits for it (bounded; past the bound it is ended), then `mirror`
    says how the store ended the grid; a writer that died says so there, in the summary's one MLflow line."""

    def __init__(self, tally: Tally, results: str, uri: str | None, done: Iterable[str], grid: Iterable[str],
                 out: Callable[[str], None]) -> None:
        self.tally, self.results, self.uri, self.out = tally, results, uri, out
        self.mirror: MirrorOutcome | None = None
        self._ended = False  # the writer said how it ended
        self._lock = threading.Lock()  # Ray Tune's thread and the driver's both hand it ids
        # The writer imports the bench the driver imports, from the driver's own path: `python -m` would put the
        # working directory first, and a `bench` folder there (another checkout) would be the code it ran.
        boot = (f"import sys, runpy; sys.path[:] = {sys.path!r}; "
                "runpy.run_module('bench.store.mirror_writer', run_name='__main__')")
        self.process = subprocess.Popen([sys.executable, "-c", boot], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, encoding="utf-8")
        self._send({"results": results, "uri": uri, "done": sorted(done), "grid": sorted(grid)})
        self._reader = threading.Thread(target=self._read, name="bench-mlflow-answers", daemon=True)
        self._reader.start()

    def put(self, trial_ids: Iterable[str]) -> None:
        """Log these trials' rows (as they are on disk when the writer reads them)."""
        self._send(list(trial_ids))

    def close(self, timeout: float) -> bool:
        """Log what is queued, then wait at most `timeout` seconds for the writer to end; whether it ended (if not,
        it is ended: the rows it had not logged are in parquet, and `bench sync-mlflow` backfills them)."""
        with self._lock, contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            self._reader.join(5)
            return False
        self._reader.join(5)
        if not self._ended:  # it died (a kill, a crash): the rows it had been given may lack their runs
            self.mirror = MirrorOutcome(self._uri(), f"the MLflow writer process ended with exit code "
                                        f"{self.process.returncode} before it had logged every row", self._embedded())
        return True

    def _send(self, message: Any) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):  # a writer that died, or closed: `close` says so
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "logged" in message:
                self.tally.mlflow_logged += message["logged"]
            elif "say" in message:
                self.out(message["say"])
            elif "warn" in message:
                print(f"bench: warning: {message['warn']}", file=sys.stderr, flush=True)
            elif "end" in message:
                self._ended = True
                if (end := message["end"]) is not None:
                    self.tally.mlflow_backfilled = end["backfilled"]
                    self.mirror = MirrorOutcome(end["uri"], end["failed"], end["embedded"])

    def _uri(self) -> str:
        with contextlib.suppress(Exception):
            return tracking_uri(self.results, self.uri) or str(self.uri)
        return str(self.uri)

    def _embedded(self) -> bool:
        return self._uri().startswith("sqlite:///") and is_local(self.results)


class MlflowMirroring:
    """Hands the trial ids of each finished unit (a pack: each member's) to the writer, and nothing more: Ray Tune's
    loop never waits on MLflow. Shaped as Ray Tune's `LoggerCallback` (`log_trial_end`); `make_mlflow_callback` makes
    it one. The writer is a `MirrorProcess` in a grid (a `bench.store.mirror_writer.MirrorWriter` does as well)."""

    def __init__(self, writer: Any, units: dict[str, list[str]]) -> None:
        self.writer, self.units = writer, units

    def __getstate__(self) -> dict[str, Any]:
        # Ray Tune pickles its callbacks into its experiment state (for `Tuner.restore`, which bench does not use: a
        # grid resumes by its rows); the writer (a thread, a queue) cannot be, and is left out.
        return {**self.__dict__, "writer": None}

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        if self.writer is not None:
            self.writer.put(self.units[trial.config["unit"]])


def make_mlflow_callback(writer: Any, units: dict[str, list[str]]) -> Any:
    from ray.tune.logger import LoggerCallback  # Ray is the run's, not the module's (as `progress.make_callback`)

    class MirrorToMlflow(MlflowMirroring, LoggerCallback):
        pass

    return MirrorToMlflow(writer, units)
