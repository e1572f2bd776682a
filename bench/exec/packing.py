"""Which trials can train in one pack, and with whom.

Which trials can train in one pack, and with whom: the pack's membership rules, read by the planner's side (the
pack executor's `why_not` and `group_key`), by a pack as it orders its members (`bench.exec.pack`) and by the stacked
stage as it groups their losses (`bench.exec.packed.PackedStage`). Rules about configurations only: no tensors.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from bench import models
from bench.config import Schedule
from bench.data import get_dataset
from bench.methods import get_method
from bench.numerics import NATIVE
from bench.trial import FP32, TrialConfig


def why_solo(c: TrialConfig) -> str | None:
    """Why this trial cannot train in a pack (None: it can)."""

    ds, proto = get_dataset(c.dataset), c.resolved_protocol()
    if proto.on("script_stream"):
        return "script_stream (its data order and dropout come from torch's one global generator, as the script's)"
    model = c.network()
    if not models.get_model(model).packable:
        return f"model {model} (its members' state or random draws cannot be kept apart)"
    if "generator" not in inspect.signature(ds.train_transform).parameters:
        return f"{c.dataset} augments at random from torch's shared generator (its train_transform takes no generator)"
    if (rule := proto.selection(c.method)).own_pass:
        return f"its selection rule ({rule.words()}) needs a pass of its own, which only a solo trial makes"
    if not get_method(c.method)(ds.num_classes, dataset=c.dataset, **c.params).packable():
        return f"method {c.method} (extra passes, two networks or per-example state)"
    return None


def _shape(s: Schedule) -> tuple[Any, ...]:
    return (s.optimizer, s.epochs, s.batch_size, s.momentum, s.weight_decay, s.milestones, s.gamma)


def pack_key(c: TrialConfig) -> tuple[Any, ...]:
    """What members of one pack must share: data, model, device, the shape of both stages (not the lr), the
    protocol's switches (a stage's selection rule and optimiser life are the pack's) and the precision (one stacked
    forward pass). An fp32 trial's key is the one it had before precisions existed."""

    warmup, method_stage = c.schedules()
    proto = c.resolved_protocol()
    model = c.model_label()  # the network and its options (a frozen-feature probe's backbone: its data)
    key = (c.dataset, model, c.train_subset, c.device, _shape(warmup), _shape(method_stage))
    # A pack's members share their protocol and their method stage's selection rule (it can differ by method).
    if proto.switches:
        key += (tuple(proto.names()), proto.selection(c.method))
    # One process, one float order (`bench.numerics`): native at one thread keeps the key it always had.
    order = (c.numerics, c.threads) if (c.numerics, c.threads) != (NATIVE, 1) else ()
    return key + ((c.precision,) if c.precision != FP32 else ()) + order


def member_order(configs: list[TrialConfig]) -> list[int]:
    """A pack's members in the order that puts members of one loss group (`group_key`) side by side."""
    return sorted(range(len(configs)), key=lambda i: group_key(configs[i].method, configs[i].effective_params()))


def group_key(method: str, params: dict[str, Any]) -> str:
    """Members whose losses are computed together: the same method with the same effective hyper-parameters, the
    method's and its dataset's defaults filled in (`Method.params`, `TrialConfig.effective_params`), so that an
    omitted default and an explicit one agree."""
    return method + json.dumps(params, sort_keys=True, default=str)
