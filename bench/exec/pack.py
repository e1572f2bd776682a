"""A pack's protocol: several trials trained as one stacked model on one device (`bench.exec.packed.PackedStage`).

The members' CE warm starts train as one pack (or come from the cache), then the method stage, then each member's
result row, exactly as its solo trial would write it. `run_pack` refuses trials that may not share a pack
(`bench.exec.packed.why_solo`, `pack_key`) and a pack that does not fit its device (`bench.exec.memory.check`),
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
from bench.exec.packed import PackedStage, compile_mode, device_generator, member_order, pack_key, why_solo
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
from bench.exec.trainer import Outcome, row_args
from bench.methods import StageContext, get_method
from bench.store.rows import make_row, write_trial
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
    warm_cache: warmstart.WarmStartCache | None = None,
    checkpoints: Checkpoints | None = None,
    events: Events | None = None,
) -> list[dict[str, Any]]:
    """Train several trials as one pack; return their result rows (in the order given), and with `results`
    write each row where its solo trial would have written it."""
    try:
        return _run_pack(configs, data_root, results, log, warm_cache, checkpoints, events)
    except torch.OutOfMemoryError:
        raise UserError(f"a pack of {len(configs)} trials does not fit in the memory of {configs[0].device}: "
                        f"run with a smaller pack, e.g. --pack {max(1, len(configs) // 2)}") from None


def _run_pack(
    configs: list[TrialConfig],
    data_root: str | os.PathLike[str],
    results: str | os.PathLike[str] | None,
    log: Log,
    warm_cache: warmstart.WarmStartCache | None,
    checkpoints: Checkpoints | None,
    events: Events | None = None,
) -> list[dict[str, Any]]:
    started = time.perf_counter()
    for c in configs:
        reason = why_solo(c)
        if reason:
            raise UserError(f"trial {c.trial_id} cannot be packed: {reason}")
    if len({pack_key(c) for c in configs}) != 1:
        raise UserError("a pack's trials must share dataset, model, device and stage shapes")
    # Members with the same method and hyper-parameters side by side: their losses are computed together.
    order = member_order(configs)
    data = load_data(configs[0], data_root)
    ps = [prepare(configs[i], data_root, data=data, log=log) for i in order]
    ds, k = ps[0].dataset, len(ps)
    log(f"pack of {k} trials on {ps[0].device}: "
        + ", ".join(f"{n} {m}" for m, n in sorted(Counter(p.config.method for p in ps).items())))
    memory.check(ps[0], k, log)

    # Warm starts: from the cache where present, the missing cells trained together, then cached.
    keys = [warm_start_key(p, 0) for p in ps]
    states: dict[str, dict[str, torch.Tensor]] = {}
    warm_epochs: dict[str, list[dict]] = {}
    for key in dict.fromkeys(keys):
        found = warm_cache.get(key) if warm_cache is not None else None
        if found is not None:
            states[key], warm_epochs[key] = found
    missing = [key for key in dict.fromkeys(keys) if key not in states]
    warmup_s = warm_diagnose_s = 0.0
    if missing:
        cells = [ps[keys.index(key)] for key in missing]
        trained, rows, warmup_s, warm_diagnose_s = train_warm_starts(cells, log, events)
        for key, state, member_rows in zip(missing, trained, rows, strict=True):
            states[key], warm_epochs[key] = state, member_rows
            if warm_cache is not None:
                warm_cache.put(key, state, member_rows, warmup_s / len(missing))

    # The method stage: each member's method set up on its own warm-started model, then the stack trained.
    nets, generators = [], []
    for p, key in zip(ps, keys, strict=True):
        net = build_model(p)
        net.load_state_dict(states[key])
        nets.append(net)
        seed_everything(method_seed(p))
        generators.append(device_generator(p.device, method_seed(p)))
    stage = PackedStage(ps, nets, generators, ps[0].method_stage, [p.method_stage.lr for p in ps],
                        [method_seed(p) for p in ps], compile=compile_mode(ps[0].device))
    test_x, test_y = ps[0].test.x, ps[0].test.labels
    warm_logits = stage.predict(test_x)
    warm_test = [accuracy(warm_logits[m], test_y, ds.num_classes)[0] for m in range(k)]
    train_probs: list[torch.Tensor] = []

    def predict_train(m: int) -> torch.Tensor:
        if not train_probs:  # every member's, once, when the first method asks (FW's anchor points)
            train_probs.append(torch.softmax(stage.predict(ps[0].train_eval.x), dim=-1))
        return train_probs[0][m]

    methods = []
    for m, p in enumerate(ps):
        method_cls = get_method(p.config.method)
        method = method_cls(ds.num_classes, dataset=p.config.dataset, **p.config.params)
        method.setup(StageContext(
            nets=[nets[m]], num_classes=ds.num_classes, noisy_train=p.train.labels,
            predict_train=lambda m=m: predict_train(m),
            true_transition=p.labels.transition if method_cls.uses_true_transition else None,
            device=p.device, epochs=p.method_stage.epochs, noise_rate=p.labels.expected_rate, protocol=p.protocol,
        ))
        methods.append(method)
    train_probs.clear()
    stage.set_methods(methods)
    result = run_stage(stage, "method", ps[0].method_stage.epochs, log, initial_is_candidate=True,
                       checkpoints=checkpoints, events=events, selection=ps[0].protocol.selection(ps[0].config.method))

    last = stage.predict(test_x)
    best = stage.predict(test_x, stage.best)
    wall = time.perf_counter() - started
    rows: list[dict[str, Any]] = [{}] * k
    for m, p in enumerate(ps):
        test_acc, test_bal, confusion = accuracy(best[m], test_y, ds.num_classes)
        last_acc, last_bal, _ = accuracy(last[m], test_y, ds.num_classes)
        outcome = Outcome(
            status=result.status[m], best_epoch=int(result.best_epoch[m]), val_loss=float(result.best_loss[m]),
            warmup_test_acc=float(warm_test[m]), test_acc=test_acc, test_bal_acc=test_bal, last_test_acc=last_acc,
            last_test_bal_acc=last_bal, confusion=confusion, estimated_transition=methods[m].estimated_transition(),
            epochs=warm_epochs.get(keys[m], []) + result.epochs[m], warmup_s=warmup_s / max(len(missing), 1),
            method_s=result.seconds / k, error=result.errors[m], pack_size=k,
            diagnostics_s=(warm_diagnose_s + result.diagnose_seconds) / k,  # an even share, as wall_s
        )
        row = make_row(outcome=outcome, wall_s=wall / k, pack_wall_s=wall, **row_args(p))
        if results is not None:
            write_trial(results, row, outcome.epochs)
        rows[order[m]] = row
    log(f"pack of {k} done in {wall:.1f}s ({wall / k:.2f}s per trial)")
    return rows
