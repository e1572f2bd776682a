"""One trial of the paper's protocol, in-process: a pure function of its `TrialConfig`.

    load the dataset -> inject seeded noise into train and validation -> CE warm start (selected on the noisy
    validation CE; cacheable) -> the method stage (the method's own loss; optimiser state kept across epochs)
    -> select the epoch with the lowest method loss on the whole noisy validation set (the warm-started model
    counts as epoch 0, as in the paper's Algorithm 1) -> clean test accuracy at the selected and the last epoch.

Small datasets live as tensors on the training device and are batched by index (no DataLoader workers);
a dataset that gives a `torch.utils.data.Dataset` is streamed through a DataLoader. Python, numpy and torch are
seeded from the trial seed; the method stage is re-seeded on its own, so a cached warm start gives the same
numbers as a fresh one.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.config import UserError
from bench.exec.events import Events
from bench.exec.member import finish, measure, new_method, set_up_method
from bench.exec.prepare import (
    Prepared,
    build_model,
    method_seed,
    prepare,
    script_loader_draw,
    seed_everything,
    warm_seed,
    warm_start_key,
)
from bench.exec.stage import (
    ALONE,
    Checkpoints,
    Log,
    SoloStage,
    Stopped,
    Turns,
    accuracy,
    predict,
    run_stage,
)
from bench.exec.warmstart import WarmStart, WarmStarts
from bench.methods import Batch, get_method
from bench.store.columns import Outcome
from bench.store.rows import make_row
from bench.trial import TrialConfig


def _ce_step(nets: list[nn.Module], batch: Batch) -> torch.Tensor:
    return F.cross_entropy(nets[0](batch.x), batch.y)


def _ce_summed_step(nets: list[nn.Module], batch: Batch) -> torch.Tensor:
    """The script's CE (`ce_summed`): summed over the batch."""
    return F.cross_entropy(nets[0](batch.x), batch.y, reduction="sum")


# Where a warm start's state carries torch's global generators as its stage left them (`script_stream`): the CPU
# one (data order, loader draws, dropout on a CPU) and, on CUDA, the device's (dropout there). The method stage
# continues that stream, whether the warm start was trained here or loaded from the cache.
STREAM_KEY, CUDA_STREAM_KEY = "torch_rng_after_warm_start", "cuda_rng_after_warm_start"


def stream_state(device: torch.device) -> dict[str, torch.Tensor]:
    """Torch's global generators' states now, as a warm start's state carries them (`STREAM_KEY`)."""
    state = {STREAM_KEY: torch.get_rng_state()}
    if device.type == "cuda":
        state[CUDA_STREAM_KEY] = torch.cuda.get_rng_state(device)
    return state


def continue_stream(stream: dict[str, torch.Tensor], device: torch.device) -> None:
    """Put torch's global generators back where a warm start left them (`stream_state`)."""
    torch.set_rng_state(stream[STREAM_KEY])
    if CUDA_STREAM_KEY in stream:
        torch.cuda.set_rng_state(stream[CUDA_STREAM_KEY], device)


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


def warm_start(p: Prepared, net_index: int, log: Log, diagnose_seconds: list[float] | None = None,
               events: Events | None = None, turns: Turns = ALONE) -> WarmStart:
    """Train one network with CE on the noisy labels; return the state with the lowest noisy-validation CE and the
    stage's epoch rows (the cache keeps both, so that a trial's record does not depend on who trained its warm
    start). The seconds its diagnostics took go to `diagnose_seconds`."""
    seed = warm_seed(p, net_index)
    seed_everything(seed)
    net = build_model(p)
    stage = SoloStage(p, [net], p.warmup, seed, _ce_summed_step if p.protocol.on("ce_summed") else _ce_step, _ce,
                      turns=turns, script_passes=p.protocol.script_passes("warmup_epoch"))
    name = f"warmup{net_index}" if net_index else "warmup"
    result = run_stage(stage, name, p.warmup.epochs, log, initial_is_candidate=False, events=events,
                       selection=p.protocol.warmup_selection())
    if diagnose_seconds is not None:
        diagnose_seconds.append(result.diagnose_seconds)
    if p.protocol.on("script_stream"):
        return {**stage.best_state, **stream_state(p.device)}, result.epochs[0]
    return stage.best_state, result.epochs[0]


def train(
    p: Prepared,
    log: Log = print,
    warm_cache: WarmStarts | None = None,
    events: Events | None = None,
    checkpoints: Checkpoints | None = None,
    executor: str = "solo",
    turns: Turns = ALONE,
) -> Outcome:
    """Warm start, method stage, selection on the noisy validation set, clean test accuracy.

    With `checkpoints`, the method stage saves its whole state after each epoch (networks, optimiser, scheduler
    position, method state, random generators, selection so far) and resumes from the last one it finds, with the
    same numbers as an uninterrupted run. `executor`: the kind of unit it trains in, for its row; `turns`: what
    its training loops call after each step (`bench.exec.stage.Turns`)."""
    method = new_method(p)
    started = time.perf_counter()
    nets, epochs, warm_diagnose_s, stream = warm_started_nets(p, type(method).networks, log, warm_cache, events,
                                                              turns)
    warmup_s = time.perf_counter() - started
    warmup_test_acc, _, _ = accuracy(predict(nets[0], p.test), p.test.labels, p.dataset.num_classes)
    log(f"warm start done: clean test acc {warmup_test_acc:.2f}%  ({warmup_s:.1f}s)")

    seed_everything(method_seed(p))
    if stream:  # `script_stream`: torch's global generators go on where the warm start left them
        continue_stream(stream, p.device)
        for _ in range(p.protocol.script_passes("method_start")):
            script_loader_draw()  # the script's test pass of the warm-started model
    set_up_method(method, p, nets, lambda i: torch.softmax(predict(nets[i], p.train_eval), dim=1))
    stage = SoloStage(p, nets, p.method_stage, method_seed(p), method.train_loss, method.validation_loss,
                      method, turns)
    result = run_stage(stage, "method", p.method_stage.epochs, log, initial_is_candidate=True,
                       checkpoints=checkpoints, events=events, selection=p.protocol.selection(p.config.method))
    last_logits = predict(nets[0], p.test)
    nets[0].load_state_dict(stage.best_state)
    return measure(p, method, result, 0, predict(nets[0], p.test), last_logits, warmup_test_acc,
                   epochs + result.epochs[0], warmup_s, result.seconds,
                   warm_diagnose_s + result.diagnose_seconds, pack_size=1, executor=executor)


def warm_started_nets(p: Prepared, networks: int, log: Log, warm_cache: WarmStarts | None,
                      events: Events | None = None, turns: Turns = ALONE,
                      ) -> tuple[list[nn.Module], list[dict[str, Any]], float, dict[str, torch.Tensor]]:
    """The method's networks, each loaded with its CE warm start (from the cache, or trained and cached): (the
    networks, the warm starts' epoch rows, the seconds their diagnostics took where trained here, the global
    generators' states the first warm start left, where it carries them: `stream_state`; else empty)."""
    nets, epochs, diagnose_seconds, streams = [], [], [], []
    for i in range(networks):
        def fresh(i: int = i) -> WarmStart:
            return warm_start(p, i, log, diagnose_seconds, events, turns)

        state, rows = warm_cache(warm_start_key(p, i), fresh) if warm_cache else fresh()
        epochs.extend(rows)
        streams.append({k: v for k, v in state.items() if k in (STREAM_KEY, CUDA_STREAM_KEY)})
        net = build_model(p)
        net.load_state_dict({k: v for k, v in state.items() if k not in streams[-1]})
        nets.append(net)
    return nets, epochs, sum(diagnose_seconds), streams[0] if streams else {}


def run_trial(
    config: TrialConfig,
    data_root: str | os.PathLike[str],
    results: str | os.PathLike[str] | None = None,
    log: Log = print,
    warm_cache: WarmStarts | None = None,
    events: Events | None = None,
    checkpoints: Checkpoints | None = None,
    executor: str = "solo",
    turns: Turns = ALONE,
) -> dict[str, Any]:
    """Run one trial and return its result row; with `results`, also write it there. `executor`: the kind of unit
    it runs in, for its row: "solo" for a trial run on its own; a unit's executor passes its name
    (`bench.exec.executor.Executor.run_trial`); `turns`: the hook its training loops call after each step.

    Bad input raises `UserError` before anything is written. A crash during training writes a row with
    status "failed" and the error, then re-raises; a trial its unit stopped (`Stopped`) writes none.
    """
    started = time.perf_counter()
    p = prepare(config, data_root, log=log)
    log(f"trial {config.trial_id}: {config.dataset} / {config.method} / {config.noise} r={config.r} "
        f"seed={config.seed}  realised noise rate {100 * p.labels.noise_rate:.1f}%  on {p.device}")
    try:
        outcome = train(p, log=log, warm_cache=warm_cache, events=events, checkpoints=checkpoints, executor=executor,
                        turns=turns)
    except (UserError, Stopped):
        raise
    except Exception as e:
        finish(p, None, time.perf_counter() - started, results, error=f"{type(e).__name__}: {e}")
        raise
    return finish(p, outcome, time.perf_counter() - started, results)


def failed_row(config: TrialConfig, error: str, wall_s: float = 0.0) -> dict[str, Any]:
    """The row of a trial that stopped on `error` wherever it was (even before its data loaded): its configuration,
    status failed and the error."""
    warm, stage = config.schedules()
    return make_row(config=config, model=config.model_label(), labels=None, outcome=None,
                    wall_s=wall_s, lr=stage.lr, batch_size=stage.batch_size, epochs=stage.epochs,
                    epochs_warmup=warm.epochs, privileged=get_method(config.method).uses_true_transition, error=error)
