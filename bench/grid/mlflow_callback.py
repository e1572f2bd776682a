"""The grid's MLflow mirror, off the trials' path: a Ray Tune callback hands each finished unit's trial ids to a writer
thread (`MirrorWriter`), which reads their result rows and logs them to MLflow (`bench.store.mirror.Mirror`) in
batches, while Ray Tune's loop goes on. Parquet is the record and MLflow a view of it, so this sink stands apart from
the driver's lines (`bench.grid.progress`): a store that is slow costs the writer only, one that is down costs the
mirror only, and `bench sync-mlflow` backfills it from the rows.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from bench.grid.progress import Tally
from bench.store.folder import Store
from bench.store.mirror import Mirror


class MirrorWriter:
    """Logs the rows of the trial ids it is given (`put`), from a daemon thread of its own: each time it wakes it takes
    every id queued so far, reads their rows and logs them, counting them in `Tally.mlflow_logged` for the closing
    summary. `ready` returns the mirror once open (None: it could not be): the thread waits for it first (the store's
    import, a fresh store's tables, the backfill of the folder's finished trials: `bench.grid.runner.mirror_ready`),
    so that none of that is on the grid's path. `close` logs what is left and, where the store failed during the grid,
    tries it once more; the runner calls it, with a bound, before the summary. The thread sets no signal handler."""

    def __init__(self, tally: Tally, results: str, ready: Callable[[], Mirror | None],
                 trial_ids: Iterable[str] = ()) -> None:
        self.tally, self.results, self.ready = tally, results, ready
        self.grid = set(trial_ids)  # the grid's trials: those a store that failed during the grid gets at its end
        self.store = Store(results)
        self.mirror: Mirror | None = None
        # Trial ids to log; an event, set once what came before it is logged (`flush`); None: the end (`close`).
        self._queue: queue.SimpleQueue[list[str] | threading.Event | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="bench-mlflow-writer", daemon=True)
        self._thread.start()

    def put(self, trial_ids: Iterable[str]) -> None:
        """Log these trials' rows (as they are on disk when the writer reads them)."""
        self._queue.put(list(trial_ids))

    def flush(self, timeout: float) -> bool:
        """Wait at most `timeout` seconds for the ids queued so far to be logged; whether they were."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self, timeout: float) -> bool:
        """Log what is queued, then wait at most `timeout` seconds for the writer to end; whether it ended (if not,
        the rows it had not logged are in parquet, and `bench sync-mlflow` backfills them)."""
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            self.mirror = mirror = self.ready()
        except Exception as e:  # noqa: BLE001 - the mirror is a view of the rows: its failure must not end the grid
            print(f"bench: warning: the MLflow mirror could not start ({type(e).__name__}: {e}); no result is lost: "
                  f"`bench sync-mlflow {self.results}` backfills it", file=sys.stderr, flush=True)
            mirror = None
        while True:
            batch = [self._queue.get()]
            while not self._queue.empty():  # every id queued meanwhile: one pass over them
                batch.append(self._queue.get())
            trial_ids = [t for item in batch if isinstance(item, list) for t in item]
            if mirror is not None:
                self._log(mirror, trial_ids)
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()
            if None in batch:
                break
        if mirror is not None and not mirror.ok:
            # A store that failed during the grid (a server restarted, a network cut) is tried once more: the grid's
            # rows it lacks are backfilled (a partial run of a trial is replaced, never doubled); where it fails
            # again, the summary says how to backfill.
            mirror.retry()
            self.tally.mlflow_backfilled = mirror.sync(self.results, trial_ids=self.grid)

    def _log(self, mirror: Mirror, trial_ids: list[str]) -> None:
        # Each row as it is on disk: a unit that a worker's check refused may still have written some (the streams
        # executor's members that finished before one met bad input).
        for trial_id in trial_ids:
            row, epochs = self.store.read_row(trial_id)
            if row is not None and mirror.log_row(row, epochs):
                self.tally.mlflow_logged += 1


class MlflowMirroring:
    """Hands the trial ids of each finished unit (a pack: each member's) to the writer, and nothing more: Ray Tune's
    loop never waits on MLflow. Shaped as Ray Tune's `LoggerCallback` (`log_trial_end`); `make_mlflow_callback` makes
    it one."""

    def __init__(self, writer: MirrorWriter, units: dict[str, list[str]]) -> None:
        self.writer, self.units = writer, units

    def __getstate__(self) -> dict[str, Any]:
        # Ray Tune pickles its callbacks into its experiment state (for `Tuner.restore`, which bench does not use: a
        # grid resumes by its rows); the writer (a thread, a queue) cannot be, and is left out.
        return {**self.__dict__, "writer": None}

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        if self.writer is not None:
            self.writer.put(self.units[trial.config["unit"]])


def make_mlflow_callback(writer: MirrorWriter, units: dict[str, list[str]]) -> Any:
    from ray.tune.logger import LoggerCallback  # Ray is the run's, not the module's (as `progress.make_callback`)

    class MirrorToMlflow(MlflowMirroring, LoggerCallback):
        pass

    return MirrorToMlflow(writer, units)
