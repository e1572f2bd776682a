"""How much device memory a pack takes, and so how many members fit on a GPU (`bench run --executor auto`).

The estimate is measured, not modelled: a pack of two members like the real ones takes one training step and two
evaluation passes while every tensor torch creates is tracked until it is freed (`PeakBytes`), so it holds for any
model and whatever layout copies `vmap` makes. To those peaks it adds what a member keeps all along (parameters,
optimiser state, best state, labels, logits). The planner sizes packs by it against $BENCH_PACK_MEMORY_GB where
that is set (the driver opens no GPU), and each pack checks it against its own GPU before anything trains. It errs
on the safe side: `tests/exec/test_packed.py` checks it against what a real pack allocates, counted by the profiler.
Imports only torch (and the pack's own modules).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from bench.config import UserError, number
from bench.exec.packed import EVAL_IMAGES, PackedStage, device_generator
from bench.exec.prepare import Prepared, build_model
from bench.exec.stage import Log

GIB = 2**30
# Held back from a CUDA device's memory for what torch's allocator does not see or cannot reuse: the CUDA context,
# cuDNN's workspaces, fragmentation between blocks.
CUDA_RESERVE = 1 * GIB
CUDA_USABLE = 0.9
# The measured peaks are taken this much larger: workspaces that operators allocate inside themselves (cuDNN's,
# oneDNN's) are not seen by `PeakBytes` (on a CPU the profiler counted 1.2x its bytes in a WordCNN evaluation pass,
# and a real MR pack of 3 peaked 2% above the estimate made with 1.25).
WORKSPACE = 1.5
EVAL_CHUNK = 256  # member-examples of the smaller of the two measured evaluation passes


MIN_BUDGET_GIB = 1 / 1024  # 1 MiB: less is a typo (no network of ours fits in it)
MAX_BUDGET_GIB = 1_048_576  # 1 PiB: more than any GPU (or node) holds; a larger value is a typo


def memory_budget() -> int | None:
    """$BENCH_PACK_MEMORY_GB in bytes, the memory a pack may take on any GPU (one shared with other work); None
    when unset. It is all the planner knows of the GPUs: the driver opens none (`device_memory` does)."""
    if not (value := os.environ.get("BENCH_PACK_MEMORY_GB", "")):
        return None
    try:
        gib = number(value)
    except ValueError:
        gib = -1.0
    if not (gib > 0 and math.isfinite(gib)):
        raise UserError(f"BENCH_PACK_MEMORY_GB must be a positive number of GiB, got {value[:40]!r}: set it to the GiB "
                        "a pack may take on a GPU (e.g. 20), or unset it")
    if gib < MIN_BUDGET_GIB:  # 1e-300 GiB is 0 bytes: no pack, and no solo trial either
        raise UserError(f"BENCH_PACK_MEMORY_GB must be at least {MIN_BUDGET_GIB:g} GiB (1 MiB), got {value[:40]!r}: "
                        "set it to the GiB a pack may take on a GPU (e.g. 20), or unset it")
    if gib > MAX_BUDGET_GIB:  # in bytes it would overflow (1.7e299 and up) or mean nothing
        raise UserError(f"BENCH_PACK_MEMORY_GB must be at most {MAX_BUDGET_GIB:,} GiB (1 PiB, more than any GPU "
                        f"holds), got {value[:40]!r}: set it to the GiB a pack may take on a GPU (e.g. 20), or "
                        "unset it")
    return int(gib * GIB)


def device_memory(device: torch.device | str) -> int | None:
    """Bytes a pack may take on `device`: `memory_budget()` if set, else 90% of the CUDA device's memory less
    `CUDA_RESERVE`; None where nothing bounds it (a CPU, or no GPU visible). Reading a CUDA device's memory
    creates a CUDA context: this runs where the pack trains, on its GPU, never in the driver."""
    device = torch.device(device)
    if (budget := memory_budget()) is not None:
        return budget
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    total = torch.cuda.get_device_properties(device.index or 0).total_memory
    return int(CUDA_USABLE * total) - CUDA_RESERVE


class PeakBytes(TorchDispatchMode):
    """While active, the bytes of the tensors created in it that are still alive, and their peak (`peak`).
    A storage counts from the operation that creates it to the moment its last reference goes."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.live = {ptr: ref for ptr, ref in self.live.items() if not ref[0].expired()}
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.live:
                storage = t.untyped_storage()
                self.live[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return out


@dataclass(frozen=True)
class PackMemory:
    """Estimated device memory of a pack of K members (`pack_memory`): the splits' inputs (once), what K members
    keep all along, and the larger of what comes and goes: K members' training step, or one evaluation chunk
    (K members x at most `chunk // K` examples each)."""

    inputs: int
    per_member: int  # kept all along
    step: int  # a member's training step at its peak: activations, their gradients, the parameters' gradients
    eval_member: int  # what an evaluation pass takes per member whatever the chunk (e.g. a copy of its weights)
    eval_example: int  # and per member-example of the chunk
    eval_split: int  # a member's largest evaluated split, in examples
    chunk: int  # member-examples per evaluation chunk (`bench.exec.packed.EVAL_IMAGES`)

    def bytes(self, members: int) -> int:
        evaluation = members * self.eval_member + min(self.chunk, members * self.eval_split) * self.eval_example
        return self.inputs + members * self.per_member + max(members * self.step, evaluation)

    def members(self, capacity: int) -> int:
        """The most members that fit in `capacity` bytes (0: not even one)."""
        low, high = 0, 1
        while self.bytes(high) <= capacity:
            low, high = high, 2 * high
        while high - low > 1:  # bytes() grows with the member count: bisect between a fit and a miss
            mid = (low + high) // 2
            low, high = (mid, high) if self.bytes(mid) <= capacity else (low, mid)
        return low

    def describe(self, capacity: int) -> str:
        return (f"{(self.per_member + self.step) / 2**20:,.1f} MiB a member + {self.inputs / GIB:.2f} GiB of "
                f"inputs; {capacity / GIB:.1f} GiB usable: {self.members(capacity):,} members fit")


def pack_memory(p: Prepared) -> PackMemory:
    """The device memory of a pack of trials like `p` (same data, model and stage shapes), measured on p's device
    with a pack of two members (see the module docstring).

    Kept all along by a member: its stacked parameters, its best state, the optimiser's slots, the solo network it
    was stacked from and its warm-start state (6 parameter copies with Adam); its labels (int64: noisy train
    twice, the stacked copy, the batch orders, validation twice, test, the diagnostics' sample three times) and its
    logits of the evaluated splits (with FW's softmax over the training set, the last and the best test pass).
    Its step: the measured peak of a forward and backward pass, at least its gradients and the optimiser step's
    temporaries (3 copies of the largest parameter)."""
    b = min(max(p.warmup.batch_size, p.method_stage.batch_size), p.train.size)
    schedule = dataclasses.replace(p.method_stage, batch_size=b)
    stage = PackedStage([p, p], [build_model(p) for _ in range(2)],
                        [device_generator(p.device, 0) for _ in range(2)], schedule, [schedule.lr] * 2, [0, 0])
    with PeakBytes() as training:
        stage.batch_losses(torch.arange(b, device=p.device).expand(2, b), 0).sum().backward()
    # Evaluation passes of two chunk sizes, as large as a real pack's (256 a member at K = 256 on CUDA): what a
    # pass takes per member and per member-example.
    n = max(1, min(EVAL_CHUNK, p.val.size // 2))
    peaks = []
    for examples in (n, 2 * n):
        with PeakBytes() as evaluation:
            stage.predict(p.val.x[:examples])
        peaks.append(evaluation.peak / 2)
    eval_example = max(0.0, (peaks[1] - peaks[0]) / n)

    sizes = [t[0].numel() * t.element_size() for t in stage.params.values()]
    slots = max(2 if s.optimizer == "adam" else int(bool(s.momentum)) for s in (p.warmup, p.method_stage))
    n_train, n_val, n_test, n_diag = p.train.size, p.val.size, p.test.size, p.diag_train.size
    per_member = (
        (4 + slots) * sum(sizes)
        + 8 * (4 * n_train + 2 * n_val + n_test + 3 * n_diag)
        + 4 * p.dataset.num_classes * (2 * n_train + n_val + 3 * n_test + n_diag)
    )
    inputs = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
              for t in (p.train.x, p.val.x, p.test.x, p.diag_train.x) if isinstance(t, torch.Tensor)}
    return PackMemory(
        inputs=sum(inputs.values()), per_member=per_member,
        step=int(max(WORKSPACE * training.peak / 2, sum(sizes) + 3 * max(sizes))),
        eval_member=int(WORKSPACE * max(0.0, peaks[0] - n * eval_example)),
        eval_example=math.ceil(WORKSPACE * eval_example), eval_split=max(n_train, n_val, n_test),
        chunk=EVAL_IMAGES.get(p.device.type, 2048),
    )


def check(p: Prepared, members: int, log: Log) -> None:
    """Before anything trains: stop with the pack size that fits where a pack of `members` trials like `p`
    would not fit in its device's memory (`device_memory`; not checked where nothing bounds it, as on a CPU)."""
    capacity = device_memory(p.device)
    if capacity is None:
        return
    estimate = pack_memory(p)
    need = estimate.bytes(members)
    log(f"memory: about {need / GIB:.2f} GiB for {members} members ({estimate.describe(capacity)})")
    if need > capacity:
        fit = estimate.members(capacity)
        fix = (f"run with --pack {fit}" if fit else "not even one member fits: free the GPU, or raise "
               "BENCH_PACK_MEMORY_GB if it is set too low")
        raise UserError(f"a pack of {members} trials needs about {need / GIB:.1f} GiB on {p.device}, where "
                        f"{capacity / GIB:.1f} GiB are usable: {fix}")
