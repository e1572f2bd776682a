"""A pack's protocol: several trials trained as one stacked model on one device (`bench.exec.packed.PackedStage`).

The members' CE warm starts train as one pack (or come from the cache), then the method stage, then each member's
result row, exactly as its solo trial would write it. `run_pack` refuses trials that may not share a pack
(`bench.exec.packing.why_solo`, `pack_key`) and a pack that does not fit its device (`bench.exec.memory.check`),
before anything trains.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import torch

from bench.config import UserError
from bench.exec import memory, warmstart
from bench.exec.events import Events
from bench.exec.member import finish, measure, new_method, set_up_method
from bench.exec.packed import PackedStage, compile_mode, device_generator
from bench.exec.packing import member_order, pack_key, why_solo
from bench.exec.prepare import (
    Prepared,
    build_model,
    load_data,
    method_seed,
    prepare,
    seed_everything,
    warm_seed,
    warm_start_key,
)
from bench.exec.stage import Checkpoints, Log, accuracy, run_stage
from bench.methods import Method
from bench.trial import TrialConfig


# -- a whole pack: warm starts, the method stage, rows ----------------------------------------------------------
def train_warm_starts(ps: list[Prepared], log: Log, events: Events | None = None
                      ) -> tuple[list[dict[str, torch.Tensor]], list[dict], float, float]:
    """CE warm starts of several cells as one pack: (best state per member, epoch rows per member, seconds,
    seconds of those spent on the per-epoch diagnostics)."""
    nets, generators, seeds = [], [], []
    for p in ps:
        seed = warm_seed(p, 0)
        seed_everything(seed)
        nets.append(build_model(p))
        generators.append(device_generator(p.device, seed))
        seeds.append(seed)
    schedule = ps[0].warmup
    stage = PackedStage(ps, nets, generators, schedule, [schedule.lr] * len(ps), seeds)
    log(f"packed warm start: {len(ps)} CE warm starts, {schedule.epochs} epochs")
    result = run_stage(stage, "warmup", schedule.epochs, log, initial_is_candidate=False, events=events,
                       selection=ps[0].protocol.warmup_selection())
    return [stage.member_state(k) for k in range(len(ps))], result.epochs, result.seconds, result.diagnose_seconds


def run_pack(
    configs: list[TrialConfig],
    data_root: str | os.PathLike[str],
    results: str | os.PathLike[str] | None = None,
    log: Log = print,
    warm_cache: warmstart.WarmStarts | None = None,
    checkpoints: Checkpoints | None = None,
    events: Events | None = None,
    executor: str = "pack",
) -> list[dict[str, Any]]:
    """Train several trials as one pack; return their result rows (in the order given), and with `results`
    write each row where its solo trial would have written it. `executor`: the kind of unit, for the rows."""
    try:
        return _run_pack(configs, data_root, results, log, warm_cache, checkpoints, events, executor)
    except torch.OutOfMemoryError:
        raise UserError(f"a pack of {len(configs)} trials does not fit in the memory of {configs[0].device}: "
                        f"run with a smaller pack, e.g. --pack {max(1, len(configs) // 2)}") from None


def _run_pack(
    configs: list[TrialConfig],
    data_root: str | os.PathLike[str],
    results: str | os.PathLike[str] | None,
    log: Log,
    warm_cache: warmstart.WarmStarts | None,
    checkpoints: Checkpoints | None,
    events: Events | None,
    executor: str,
) -> list[dict[str, Any]]:
    started = time.perf_counter()
    order, ps = prepare_pack(configs, data_root, log)
    k = len(ps)
    warm = PackWarmStarts(ps, log, warm_cache, events)
    stage, methods, warm_test = method_stage(ps, warm)
    result = run_stage(stage, "method", ps[0].method_stage.epochs, log, initial_is_candidate=True,
                       checkpoints=checkpoints, events=events, selection=ps[0].protocol.selection(ps[0].config.method))

    last = stage.predict(ps[0].test.x)
    best = stage.predict(ps[0].test.x, stage.best)
    wall = time.perf_counter() - started
    rows: list[dict[str, Any]] = [{}] * k
    for m, p in enumerate(ps):
        outcome = measure(p, methods[m], result, m, best[m], last[m], warm_test[m],
                          warm.epochs[warm.keys[m]] + result.epochs[m], warm.seconds_each, result.seconds / k,
                          (warm.diagnose_s + result.diagnose_seconds) / k,  # an even share, as wall_s
                          pack_size=k, executor=executor)
        rows[order[m]] = finish(p, outcome, wall / k, results, pack_wall_s=wall)
    log(f"pack of {k} done in {wall:.1f}s ({wall / k:.2f}s per trial)")
    return rows


def prepare_pack(configs: list[TrialConfig], data_root: str | os.PathLike[str], log: Log,
                 ) -> tuple[list[int], list[Prepared]]:
    """The members prepared on one copy of the data, those with the same method and hyper-parameters side by side
    (their losses are computed together), after the checks that they may share a pack and that it fits its device:
    (the members' order among `configs`, the prepared members). Every member's values are checked first, before the
    shared data loads (`TrialConfig.check`; `prepare` asks again, as it does for a solo trial)."""
    checked: set = set()  # a pack's members share their noise matrices: each is checked once
    for c in configs:
        c.check(checked)
    for c in configs:
        reason = why_solo(c)
        if reason:
            raise UserError(f"trial {c.trial_id} cannot be packed: {reason}")
    if len({pack_key(c) for c in configs}) != 1:
        raise UserError("a pack's trials must share dataset, model, device and stage shapes")
    order = member_order(configs)
    data = load_data(configs[0], data_root)
    ps = [prepare(configs[i], data_root, data=data, log=log) for i in order]
    log(f"pack of {len(ps)} trials on {ps[0].device}: "
        + ", ".join(f"{n} {m}" for m, n in sorted(Counter(p.config.method for p in ps).items())))
    memory.check(ps[0], len(ps), log)
    return order, ps


class PackWarmStarts:
    """The members' CE warm starts: from the cache where present, the missing cells trained together as one pack,
    then cached. `states[key]` and `epochs[key]` per warm-start cell, `keys[m]` member m's cell."""

    def __init__(self, ps: list[Prepared], log: Log, warm_cache: warmstart.WarmStarts | None,
                 events: Events | None = None) -> None:
        self.keys = [warm_start_key(p, 0) for p in ps]
        self.states: dict[str, dict[str, torch.Tensor]] = {}
        self.epochs: dict[str, list[dict]] = {}
        for key in dict.fromkeys(self.keys):
            found = warm_cache.get(key) if warm_cache is not None else None
            if found is not None:
                self.states[key], self.epochs[key] = found
        missing = [key for key in dict.fromkeys(self.keys) if key not in self.states]
        seconds = self.diagnose_s = 0.0
        if missing:
            cells = [ps[self.keys.index(key)] for key in missing]
            trained, rows, seconds, self.diagnose_s = train_warm_starts(cells, log, events)
            for key, state, member_rows in zip(missing, trained, rows, strict=True):
                self.states[key], self.epochs[key] = state, member_rows
                if warm_cache is not None:
                    warm_cache.put(key, state, member_rows, seconds / len(missing))
        self.seconds_each = seconds / max(len(missing), 1)  # each member's share: its cell's


def method_stage(ps: list[Prepared], warm: PackWarmStarts) -> tuple[PackedStage, list[Method], list[float]]:
    """The method stage of a pack: each member's network loaded with its warm start, its own generator and method
    set up, stacked: (the stage, the members' methods, their warm-started models' clean test accuracy)."""
    nets, generators = [], []
    for p, key in zip(ps, warm.keys, strict=True):
        net = build_model(p)
        net.load_state_dict(warm.states[key])
        nets.append(net)
        seed_everything(method_seed(p))
        generators.append(device_generator(p.device, method_seed(p)))
    stage = PackedStage(ps, nets, generators, ps[0].method_stage, [p.method_stage.lr for p in ps],
                        [method_seed(p) for p in ps], compile=compile_mode(ps[0].device))
    warm_logits = stage.predict(ps[0].test.x)
    warm_test = [accuracy(warm_logits[m], ps[0].test.labels, ps[0].dataset.num_classes)[0] for m in range(len(ps))]
    train_probs: list[torch.Tensor] = []

    def predict_train(m: int) -> torch.Tensor:
        if not train_probs:  # every member's, once, when the first method asks (FW's anchor points)
            train_probs.append(torch.softmax(stage.predict(ps[0].train_eval.x), dim=-1))
        return train_probs[0][m]

    methods = []
    for m, p in enumerate(ps):
        method = new_method(p)
        set_up_method(method, p, [nets[m]], lambda i, m=m: predict_train(m))
        methods.append(method)
    train_probs.clear()
    stage.set_methods(methods)
    return stage, methods, warm_test
