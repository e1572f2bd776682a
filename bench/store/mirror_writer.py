"""The MLflow mirror's writer: reads result rows by trial id and logs them in batches, from a thread of its own
(`MirrorWriter`), and, for `bench run`, from a process of its own (`main`). It decides when a batch is written: once
`GATHER_ROWS` rows are waiting, or `GATHER_S` seconds after the first of them arrived, or at a flush or the end;
`bench.store.mlflow_batches` writes it (an sqlite store: one transaction a batch; a server: run by run).

A grid's driver starts the process once (`python -m bench.store.mirror_writer`, `bench.grid.mlflow_callback`'s
`MirrorProcess`) and feeds it trial ids through a pipe, so that MLflow's import, its store and each run's sqlite
commits take none of the driver's CPU. What it is told and what it answers are JSON lines:

    stdin   first {"results": R, "uri": U or null, "done": [ids], "grid": [ids]}, then one list of trial ids a line;
            end of file: log what is queued and end
    stdout  {"say": line} a line for the driver's output, {"warn": text} a warning, {"logged": n} runs logged,
            {"end": {"uri", "failed", "embedded", "backfilled"}} the mirror as the grid leaves it

`done` are the folder's finished trials, which the writer backfills once the store is open (runs MLflow lacks);
`grid` the grid's, which a store that failed during the grid gets when it ends. The process ignores SIGINT and
SIGTERM: a Ctrl-C (sent to the whole foreground group) or a group signal stops the driver, which then hands it the
rows that landed during the stop and waits for it (bounded). Its own output goes to stderr; stdout is the pipe's.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

from bench.store import mlflow_batches
from bench.store.folder import Store
from bench.store.mirror import Mirror, open_mirror

# A row's run is written at most GATHER_S seconds after its id reaches the writer (plus the write itself, and the
# writes queued before it); sooner once GATHER_ROWS rows wait. A batch is one transaction whatever its size: waiting
# for a few rows shares its fixed cost (a wake-up, a commit) on a machine whose cores the trials keep busy.
GATHER_S = 2.0
GATHER_ROWS = mlflow_batches.BATCH


class MirrorWriter:
    """Logs the rows of the trial ids it is given (`put`), from a daemon thread of its own: it gathers the ids of a
    batch (`GATHER_S`, `GATHER_ROWS`), reads their rows and logs them (`mlflow_batches.Runs`), counting them in
    `counts.mlflow_logged` (the grid's `Tally`, or anything with that attribute and `mlflow_backfilled`) and telling
    `logged` how many each batch logged. `ready` returns the mirror once open (None: it
    could not be): the thread waits for it first (the store's import, a fresh store's tables, the backfill of the
    folder's finished trials: `opened`). `close` logs what is left and, where the store failed during the grid, tries
    it once more. The thread sets no signal handler."""

    def __init__(self, counts: Any, results: str, ready: Callable[[], Mirror | None],
                 trial_ids: Iterable[str] = (), warn: Callable[[str], None] | None = None,
                 logged: Callable[[int], None] = lambda n: None) -> None:
        self.counts, self.results, self.ready, self.logged = counts, results, ready, logged
        self.warn = warn or (lambda text: print(f"bench: warning: {text}", file=sys.stderr, flush=True))
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

    def close(self, timeout: float | None) -> bool:
        """Log what is queued, then wait at most `timeout` seconds (None: as long as it takes) for the writer to end;
        whether it ended (if not, the rows it had not logged are in parquet, and `bench sync-mlflow` backfills them)."""
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            self.mirror = mirror = self.ready()
        except Exception as e:  # noqa: BLE001 - the mirror is a view of the rows: its failure must not end the grid
            self.warn(f"the MLflow mirror could not start ({type(e).__name__}: {e}); no result is lost: "
                      f"`bench sync-mlflow {self.results}` backfills it")
            mirror = None
        runs = mlflow_batches.Runs(mirror)
        try:
            while True:
                batch = self._gathered()
                trial_ids = [t for item in batch if isinstance(item, list) for t in item]
                if mirror is not None:
                    self._log(runs, trial_ids)
                for item in batch:
                    if isinstance(item, threading.Event):
                        item.set()
                if None in batch:
                    break
            if mirror is not None and not mirror.ok:
                # A store that failed during the grid (a server restarted, a network cut) is tried once more: the
                # grid's rows it lacks are backfilled (a partial run of a trial is replaced, never doubled); where it
                # fails again, the summary says how to backfill.
                mirror.retry()
                self.counts.mlflow_backfilled = mlflow_batches.sync(mirror, self.results, trial_ids=self.grid)
        finally:
            runs.close()

    def _gathered(self) -> list[list[str] | threading.Event | None]:
        """The next batch's queue items: from the first, those that come within `GATHER_S` seconds, until
        `GATHER_ROWS` rows, a flush or the end."""
        batch = [self._queue.get()]
        deadline, rows = time.monotonic() + GATHER_S, len(batch[0]) if isinstance(batch[0], list) else 0
        while isinstance(batch[-1], list) and rows < GATHER_ROWS:
            try:
                batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
            rows += len(batch[-1]) if isinstance(batch[-1], list) else 0
        return batch

    def _log(self, runs: mlflow_batches.Runs, trial_ids: list[str]) -> None:
        # Each row as it is on disk: a unit that a worker's check refused may still have written some (the streams
        # executor's members that finished before one met bad input).
        rows = [(row, epochs) for row, epochs in map(self.store.read_row, trial_ids) if row is not None]
        if count := runs.log(rows):
            self.counts.mlflow_logged += count
            self.logged(count)


def opened(results: str, uri: str | None, done: Iterable[str], warn: Callable[[str], None],
           say: Callable[[str], None]) -> Mirror | None:
    """The mirror on the run's store (`open_mirror`), the folder's finished trials (`done`) it lacks logged to it."""
    mirror = open_mirror(results, uri, warn=warn)
    if mirror is not None and (done := set(done)) and (backfilled := mlflow_batches.sync(mirror, results, done)):
        say(f"MLflow: backfilled {backfilled} runs of finished trials")
    return mirror


def main() -> None:
    """The writer process (the module docstring): ids from stdin, JSON lines to the driver on stdout."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # whatever MLflow or a library prints goes to stderr, not into the pipe
    lock = threading.Lock()

    def send(message: dict[str, Any]) -> None:
        # A driver that is gone (ended at once by a second signal, or killed) reads nothing more: the rows it handed
        # over are logged all the same.
        with lock, contextlib.suppress(OSError, ValueError):
            answers.write(json.dumps(message) + "\n")
            answers.flush()

    start = json.loads(sys.stdin.readline() or "null")
    if start is None:  # the driver ended before it said anything
        return
    results, uri = start["results"], start["uri"]
    warn = lambda text: send({"warn": text})  # noqa: E731 - a one-line sink
    counts = SimpleNamespace(mlflow_logged=0, mlflow_backfilled=0)
    writer = MirrorWriter(counts, results, lambda: opened(results, uri, start["done"], warn,
                                                          lambda line: send({"say": line})),
                          start["grid"], warn=warn, logged=lambda n: send({"logged": n}))
    given = False
    for line in sys.stdin:
        writer.put(json.loads(line))
        given = True
    if not given:  # the driver ended before any trial did: nothing is owed (the next run backfills the rest)
        send({"end": None})
        return
    writer.close(None)  # the driver bounds the wait, and ends this process past it
    mirror = writer.mirror
    send({"end": None if mirror is None else {"uri": mirror.uri, "failed": mirror.failed,
                                              "embedded": mirror.embedded, "backfilled": counts.mlflow_backfilled}})


if __name__ == "__main__":
    main()
