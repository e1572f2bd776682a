"""The CE warm-start cache: each (data, noise, seed, warm-start settings) cell trains its warm start once.

Every method and hyper-parameter of a grid cell starts from the same CE warm-started network, so the runner trains
it once and stores it as `RESULTS/warmstart/<key>.pt` (the key is `bench.exec.prepare.warm_start_key`), with the epoch
rows of its training: a trial that loads it records them as its own, so a trial's epochs table is the same whether
it trained its warm start, loaded it, shared it in a pack or resumed after a crash. A file is written
to a temporary name and renamed, so a reader never sees half a file. On a local results folder an exclusive
lock on `<key>.lock` (`bench.store.folder.Store.lock`) makes concurrent trials that want the same warm start train
it once: the first trains, the others wait and load. The system drops the lock when a holder dies, so a killed trial
never blocks the grid. On an object-store URI there is no lock: two trials may then train the same warm start at
once (same numbers, wasted compute, still correct).

A cache file that cannot be loaded (damaged, truncated, or not a tensor file: loading never unpickles code) is
renamed aside to `<key>.pt.damaged-<time>`, logged with its path, and the warm start is trained again once.
Files, atomic writes and locks are the results store's (`bench.store.folder`).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import torch

from bench.store.folder import Store

State = dict[str, torch.Tensor]
WarmStart = tuple[State, list[dict[str, Any]]]  # the state and its stage's epoch rows


class WarmStarts(Protocol):
    """What an executor needs of a warm-start cache (`WarmStartCache` is one): a solo trial calls it with (key, a
    function that trains it) and gets the warm start, trained once; a pack looks its cells up (`get`), trains the
    missing ones together and stores them (`put`)."""

    def __call__(self, key: str, train_fn: Callable[[], WarmStart]) -> WarmStart: ...

    def get(self, key: str) -> WarmStart | None: ...

    def put(self, key: str, state: State, epochs: list[dict[str, Any]], seconds: float) -> None: ...


class WarmStartCache:
    """The results folder's warm starts (`WarmStarts`): call it with (key, train_fn) to get the warm start (state,
    epoch rows)."""

    def __init__(self, results: str | os.PathLike[str], log: Callable[[str], None] = print) -> None:
        self.store = Store(results)
        self.log = log
        self.hits = 0  # warm starts loaded instead of trained
        self.misses = 0  # warm starts trained here
        self.saved_s = 0.0  # the training seconds that the hits did not spend
        self.trained_s = 0.0
        self.warning: str | None = None  # why the cache could not keep a warm start (for the driver), once

    def path(self, key: str) -> str:
        return self.store.path("warmstart", f"{key}.pt")

    def __call__(self, key: str, train_fn: Callable[[], WarmStart]) -> WarmStart:
        found = self.get(key)
        if found is not None:
            return found
        with self.store.lock(f"warmstart/{key}"):
            found = self.get(key)  # another trial may have trained it while this one waited
            if found is not None:
                return found
            started = time.perf_counter()
            state, epochs = train_fn()
            self._store(key, state, epochs, time.perf_counter() - started)
        return state, epochs

    def get(self, key: str) -> WarmStart | None:
        """The cached warm start of `key`, or None (a packed grid looks up all its cells first, then trains the
        missing ones together and `put`s them)."""
        found = self._load(key)
        return None if found is None else self._hit(found)

    def put(self, key: str, state: State, epochs: list[dict[str, Any]], seconds: float) -> None:
        """Store a warm start trained elsewhere (in a pack); `seconds` is its share of the training time."""
        with self.store.lock(f"warmstart/{key}"):
            self._store(key, state, epochs, seconds)

    def _store(self, key: str, state: State, epochs: list[dict[str, Any]], seconds: float) -> None:
        """Keep a trained warm start. The cache is an optimisation: where the write fails (a full disk), the trial
        goes on with the warm start it trained, and the cells that share it train it again."""
        self.misses += 1
        try:
            self.store.save_tensors(self.path(key), {"state": {k: v.detach().cpu() for k, v in state.items()},
                                                     "epochs": epochs, "seconds": seconds, "created": time.time()})
        except OSError as e:
            if self.warning is None:
                self.warning = (f"could not write the warm start {self.path(key)} ({type(e).__name__}: "
                                f"{' '.join(str(e).split())[:160]}); the trials go on, training it again where "
                                "they need it")
                self.log(f"bench: warning: {self.warning}")
            return
        self.trained_s += seconds
        # once a cell: tests/grid/test_multinode.py checks
        self.log(f"warm-start cache: trained {key} in {seconds:.1f}s")

    def _hit(self, entry: dict[str, Any]) -> WarmStart:
        self.hits += 1
        self.saved_s += float(entry.get("seconds", 0.0))
        return entry["state"], list(entry["epochs"])

    def _load(self, key: str) -> dict[str, Any] | None:
        path = self.path(key)
        if not self.store.exists(path):
            return None
        try:
            entry = self.store.load_tensors(path)
            # An entry written before warm starts carried their epoch rows is trained again: a trial that loaded
            # it would record no warm-up epochs.
            return entry if "epochs" in entry else None
        except Exception as e:  # noqa: BLE001 - any unreadable entry is retrained, never fatal to its cell
            aside = f"{path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
            try:
                self.store.fs.move(path, aside)
            except OSError:  # another trial set it aside first
                pass
            # Only the first sentence: PyTorch's own advice (weights_only=False) would execute a planted pickle.
            reason = " ".join(str(e).split()).split(". ")[0][:160]
            self.log(f"warm-start cache: {path} could not be loaded ({type(e).__name__}: {reason}); set it aside as "
                     f"{aside} and training this warm start again")
            return None

    def stats(self) -> dict[str, float]:
        return dict(warm_hits=self.hits, warm_misses=self.misses, warm_saved_s=self.saved_s,
                    warm_trained_s=self.trained_s)
