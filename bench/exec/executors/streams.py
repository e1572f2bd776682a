"""The executor of several trials in threads of one process, each on a CUDA stream of its own.

Several trials in one process, each in a thread of its own on a CUDA stream of its own, so that one member's
kernels run on the GPU while the next member's Python launches its step (issue #30 item 1: on an H200 one
ResNet-34 trial at batch 128 reaches 12-14k images/s, 12-17% of the GPU's bound; packs and processes sharing the GPU
did not help, processes take turns and their kernels do not overlap). Each member is its solo trial, trained by the
unchanged solo code path (`bench.exec.trainer.run_trial`); only the turns are this module's.

Turns. A baton: only its holder's thread runs Python (the others wait on a condition), and the holder hands it on,
round robin among the members still training, after each optimiser step (the member's `MemberTurns`, handed down to
its training loop through `run_trial`, `bench.exec.stage.Turns`), while it waits for a warm start another member is
training, and when it ends. On a GPU a member's step is launched, not finished, when it hands on, so the steps of K
members are in flight on K streams at once.

Random state. Trials seed and draw from torch's, numpy's and Python's global generators (seed_everything, init,
dropout). At each hand-over the leaving member's global generator states (torch's CPU one, torch's CUDA one for the
unit's device, numpy's, Python's) are kept and the arriving member's put back, so each member draws exactly what its
solo trial draws: on a CPU a member's row and curves are bit-equal to its solo trial's in the same process (at the
same thread count; tests/exec/test_streams.py). Each member starts from the generator states the unit started in.

Checkpoints, per member (`bench.store.folder.Checkpoints` under the member's trial id, the name its solo trial's
would have), where the unit has checkpoints and a results folder: a retried unit resumes each member from its own
last epoch (and takes the row of a member that finished in an earlier attempt); a member's checkpoint is cleared
once its row is written. Warm starts: a member that needs a warm start another member is training passes its turns
until that one has stored it, then reads it from the cache (`bench.exec.warmstart.WarmStartCache`, whose file lock
would block the baton's holder); without a cache, each member trains its own. Failures: a member's deterministic
error ends that member (its failed row, as `run_trial` writes it) and the others go on; an error a retry may cure
stops the others at their next turn and is raised after they stopped, so that Ray retries the unit and it resumes
from the members' checkpoints; a `UserError` (bad input) is raised after the others finished. Each member's log
lines carry its index ("[m2] "); its events go to the unit's `events` as they are.

Nothing here has run on a GPU yet. What a GPU session must measure (benchmarks/README.md has the commands):
1. The `streams K` arm of `benchmarks/big_models.py --device cuda` for K = 2, 4, 8 against `solo fp32` and the packs,
   ResNet-34 and VGG-16-BN, fp32: aggregate images/s. Worth the table only where it beats one trial clearly; then
   `--write-table` records the best arm per network.
2. Whether the kernels overlap: a `torch.profiler` (or `nsys`) trace of the arm, kernels of two streams running at
   once. If they do not, the members' launches are the bottleneck (one Python thread at a time): the CPU time of one
   member's step against its GPU time says how many members one launching thread can keep busy.
3. The hand-over's cost: 0.2-0.3 ms on a loaded 2-core CPU, most of it copying numpy's and Python's generator
   states (`streams 1` skips it: a lone member exchanges nothing). Against a ResNet-34 step of ~10 ms it is a few
   percent of the launching thread's time; where launches bound the arm, exchange only torch's generators for
   methods that draw nothing from numpy or Python during training.
4. Memory: every member holds its own copy of the data and its own caching-allocator pool per stream
   (`torch.cuda.max_memory_allocated` per K); and a whole trial through `bench run` with the table row set, its rows
   within the rounding of a training of its solo trial's (bit-equality is not claimed on a GPU: cuDNN's choice of
   algorithm and atomic sums may differ between runs).
The route to CUDA graphs, once launches are shown to bound the arm: capture each member's whole step (forward, loss,
backward, optimiser step; `torch.cuda.graphs.make_graphed_callables` or a `torch.cuda.CUDAGraph` per member on its
own stream, static input and label buffers the loader copies into, `capturable=True` Adam) after the untimed
warm-up steps, and replay it in place of the step, one launch per member and step. A method whose step reads a
value back to the host or changes shape (`.item()`, boolean indexing) stays uncaptured: check each method's step
under capture first, on the GPU. The baton stays (one replay per turn); random draws inside a graph advance the CUDA
generator by captured offsets, so each member's generator state must be registered with its graph
(`CUDAGraph.register_generator_state` in recent torch) for the exchange to keep each member's draws its own.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from bench.config import UserError
from bench.exec.executor import Arm, Bundle, Executor, UnitContext, half_each, retry_may_cure, solo_epoch
from bench.exec.prepare import Prepared
from bench.exec.stage import Stopped, Turns
from bench.exec.trainer import failed_row
from bench.exec.warmstart import WarmStart, WarmStarts
from bench.store.folder import Checkpoints, Store
from bench.trial import TrialConfig

RngStates = tuple[torch.Tensor, torch.Tensor | None, Any, Any]  # torch CPU, torch CUDA (or None), numpy, Python


def rng_states(device: torch.device) -> RngStates:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda, np.random.get_state(legacy=False), random.getstate()  # a dict: faster


def set_rng_states(states: RngStates, device: torch.device) -> None:
    cpu, cuda, numpy_state, python_state = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)
    np.random.set_state(numpy_state)
    random.setstate(python_state)


def ends_unit(error: BaseException) -> bool:
    """Whether a member's error ends the whole unit, to be retried: what a retry may cure (`retry_may_cure`, the
    runner's rule too), and anything that is not an Exception (an interrupt)."""
    return not isinstance(error, Exception) or retry_may_cure(error)


class Baton:
    """Whose turn it is: only the holder's thread runs, and it hands on round robin among the members still
    training, exchanging the global random generators' states as it goes (the leaving member's kept, the arriving
    member's put back)."""

    def __init__(self, members: int, device: torch.device) -> None:
        self.device = device
        self.changed = threading.Condition()
        self.running = list(range(members))
        self.holder = 0
        self.states = [rng_states(device)] * members  # each member starts from the states the unit started in
        self.cure: BaseException | None = None  # an error a retry may cure: the others stop at their next turn
        self.keys: dict[str, threading.Lock] = {}  # warm starts being trained, by cache key

    def enter(self, m: int) -> None:
        """Wait for member m's first turn."""
        with self.changed:
            self.changed.wait_for(lambda: self.holder == m)
        self._arrive(m)

    def turn(self, m: int) -> None:
        """Member m hands on to the next member still training and waits for its turn to come back."""
        if len(self.running) == 1:  # alone: no one else draws from the generators
            return
        self.states[m] = rng_states(self.device)
        with self.changed:
            self.holder = self.running[(self.running.index(m) + 1) % len(self.running)]
            self.changed.notify_all()
            self.changed.wait_for(lambda: self.holder == m)
        self._arrive(m)

    def _arrive(self, m: int) -> None:
        set_rng_states(self.states[m], self.device)
        if self.cure is not None:
            raise Stopped

    def leave(self, m: int, cure: BaseException | None = None) -> None:
        """Member m ends (its turn is the holder's): the next member still training takes over."""
        with self.changed:
            self.cure = self.cure or cure
            at = self.running.index(m)
            self.running.remove(m)
            if self.running:
                self.holder = self.running[at % len(self.running)]
            self.changed.notify_all()

    @contextlib.contextmanager
    def alone_with(self, key: str, m: int) -> Iterator[None]:
        """Member m alone with the warm start `key`: while another member trains it, m passes its turns."""
        lock = self.keys.setdefault(key, threading.Lock())  # only the holder runs: no race on the dict
        while not lock.acquire(blocking=False):
            self.turn(m)
        try:
            yield
        finally:
            lock.release()

    def run(self, jobs: list[Callable[[Turns], Any]]) -> list[Any]:
        """Call each job with its turns (`MemberTurns`) in a thread of its own, on a CUDA stream of its own; return
        what each returned, or the exception it raised (None: it was stopped). `cure` then holds an error a retry may
        cure, if any."""
        outcomes: list[Any] = [None] * len(jobs)
        threads = [threading.Thread(target=self._member, args=(m, job, outcomes), name=f"streams-m{m}")
                   for m, job in enumerate(jobs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return outcomes

    def _member(self, m: int, job: Callable[[Turns], Any], outcomes: list[Any]) -> None:
        cure = None
        try:
            self.enter(m)
            with own_stream(self.device):
                outcomes[m] = job(MemberTurns(self, m))
        except Stopped:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the caller: the member's failed row, or the unit's end
            if ends_unit(e):
                cure = e
            else:
                outcomes[m] = e
        finally:
            self.leave(m, cure)


class MemberTurns(Turns):
    """Member m's turns: after each step it hands the baton on and waits for it to come back (`Baton.turn`), which
    raises `Stopped` where the unit has ended."""

    def __init__(self, baton: Baton, m: int) -> None:
        self.baton, self.m = baton, m

    def after_step(self) -> None:
        self.baton.turn(self.m)


class Streams(Executor):
    name = "streams"

    def run(self, trials: list[TrialConfig], ctx: UnitContext) -> list[dict[str, Any]]:
        baton = Baton(len(trials), torch.device(trials[0].device))
        outcomes = baton.run([functools.partial(self.member, m, t, ctx, baton) for m, t in enumerate(trials)])
        if baton.cure is not None:
            raise baton.cure
        rejected = [o for o in outcomes if isinstance(o, UserError)]
        if rejected:
            raise rejected[0]  # bad input: the runner reports it once, as for a solo trial
        return [written_row(t, ctx, o) if isinstance(o, BaseException) else o
                for t, o in zip(trials, outcomes, strict=True)]

    def member(self, m: int, trial: TrialConfig, ctx: UnitContext, baton: Baton, turns: Turns) -> dict[str, Any]:
        """Member m's solo trial (in its thread, in its turns): its row. A retried unit (with checkpoints) takes the
        row a member wrote in an earlier attempt instead of training it again."""
        def log(line: str) -> None:
            ctx.log(f"[m{m}] {line}")

        checkpoints = None
        if ctx.checkpoints is not None and ctx.results is not None:
            row, _ = Store(ctx.results).read_row(trial.trial_id)
            if row is not None and row.get("status") == "ok":
                log(f"trial {trial.trial_id}: its row was written by an earlier attempt of this unit")
                return row
            checkpoints = Checkpoints(ctx.results, trial.trial_id, log)
        try:
            row = self.run_trial(trial, ctx, log=log, warm_cache=shared_cache(ctx.warm_cache, baton, m),
                                 checkpoints=checkpoints, turns=turns)
        except Stopped:
            raise  # not the member's error: it resumes from its checkpoint
        except Exception as e:
            if retry_may_cure(e):
                log(f"stopping the unit for a retry: {type(e).__name__}: {e}")
            elif checkpoints is not None and not isinstance(e, UserError):
                checkpoints.clear()  # its failed row is written: a new launch trains it from the start
            raise
        if checkpoints is not None:
            checkpoints.clear()
        return row

    def resources(self, trials: list[TrialConfig], cpu: float, gpu: float) -> list[Bundle]:
        """One trial's CPUs (one member launches at a time), the members' GPU shares together, at most one GPU."""
        return [{"CPU": cpu, "GPU": min(1.0, gpu * len(trials)) if gpu else 0.0}]

    def unit_id(self, trials: list[TrialConfig]) -> str:
        return "streams-" + hashlib.sha256(" ".join(sorted(t.trial_id for t in trials)).encode()).hexdigest()[:16]

    def describe(self, trials: list[TrialConfig]) -> str:
        methods = Counter(t.method for t in trials)
        return f"streams of {len(trials)} ({', '.join(f'{n} {m}' for m, n in sorted(methods.items()))})"

    def calibration_arms(self, members: list[Prepared], ks: list[int], extras: bool = False,
                         compile: str | None = None) -> list[Arm]:
        """`streams K` for each K: K solo fp32 trials taking turns on their own streams (`Baton`), as a unit runs
        them; `streams 1` is the mechanism's own cost against `solo fp32`, never a table row."""
        return [Arm(f"streams {k}", self.name, k, k > 1, streams_epoch(half_each(members, k))) for k in ks]

    def why_not(self, trial: TrialConfig) -> str | None:
        """Any trial: each member runs as its solo trial would, on the unit's device."""
        return None

    def group_key(self, trial: TrialConfig) -> tuple[Any, ...]:
        """One dataset, one network, one device: members share a process, its device and its data's files, and its
        float32 arithmetic (TF32 on or off is the process's: the `full_float32` switch) and float order."""
        key = (trial.dataset, trial.model_label(), trial.device, trial.numerics, trial.threads)
        return key + (("full_float32",) if trial.resolved_protocol().on("full_float32") else ())


def streams_epoch(ps: list[Prepared]) -> Callable[[], None]:
    """An epoch of each of the trials `ps` as their solo trials train it, in turns on their own streams (`Baton`, as
    a unit runs them); a further epoch at each call."""
    epochs = [solo_epoch(p) for p in ps]

    def epoch() -> None:
        baton = Baton(len(epochs), ps[0].device)
        failed = [o for o in baton.run(epochs) if isinstance(o, BaseException)]
        if baton.cure is not None or failed:
            raise baton.cure or failed[0]

    return epoch


def own_stream(device: torch.device) -> contextlib.AbstractContextManager:
    """A CUDA stream of the member's own (the current stream is per thread in torch); nothing on a CPU."""
    return torch.cuda.stream(torch.cuda.Stream(device)) if device.type == "cuda" else contextlib.nullcontext()


def shared_cache(cache: WarmStarts | None, baton: Baton, m: int,
                 ) -> Callable[[str, Callable[[], WarmStart]], WarmStart] | None:
    """The unit's warm-start cache as member m uses it: one member at a time per warm start, so the second reads
    what the first stored (None: no cache, each member trains its own)."""
    if cache is None:
        return None

    def warm_start(key: str, train: Callable[[], WarmStart]) -> WarmStart:
        with baton.alone_with(key, m):
            return cache(key, train)

    return warm_start


def written_row(trial: TrialConfig, ctx: UnitContext, error: BaseException) -> dict[str, Any]:
    """The failed row `run_trial` wrote for `trial`; without a results folder (or where it could not be written),
    one made from its configuration and the error."""
    if ctx.results is not None:
        row, _ = Store(ctx.results).read_row(trial.trial_id)
        if row is not None and row.get("status") == "failed":
            return row
    return failed_row(trial, f"{type(error).__name__}: {error}")
