"""What a trial's MLflow run holds, from its result row alone (`bench.store.mirror` logs it): its name, its cell,
its params (every input that changes its numbers, derived from the trial's effective configuration, never listed by
hand) and its start and end times (the trial's own, so that MLflow's Duration is the trial's wall time).
"""

from __future__ import annotations

import calendar
import hashlib
import json
import time
from typing import Any

from bench.config import UserError
from bench.store.columns import MLFLOW_PARAMS, ROW


def cell_of(row: dict[str, Any]) -> str:
    return f"{row['dataset']}/{row['noise']}/r={float(row['r']):g}"


def run_name(row: dict[str, Any]) -> str:
    """A trial's MLflow run name: its method, hyper-parameters, noise, r and seed, so that `mlflow runs list` tells
    the trials of two cells apart."""
    params = json.loads(row.get("method_params") or "{}")
    extra = "".join(f" {k}={v}" for k, v in sorted(params.items()))
    return (f"{row['method']} lr={row['lr']:g} bs={row['batch_size']}{extra} {row['noise']} r={float(row['r']):g} "
            f"seed={row['seed']}")


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    """A nested configuration as dotted keys (`warmup.lr`); a list of [key, value] pairs as a mapping."""
    if isinstance(value, list) and all(isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) for v in value) \
            and (value or not prefix):  # an empty list of pairs at the top (no method parameter): nothing
        value = dict(value)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out |= _flat(f"{prefix}.{k}" if prefix else str(k), v)
        return out
    return {prefix: json.dumps(value) if isinstance(value, list) else value}


def _selection(row: dict[str, Any]) -> dict[str, str]:
    """The checkpoint-selection rules the trial's protocol implies for its method (the method stage's and the warm
    start's), from the dataset's declared switches; nothing for a dataset or protocol not registered (any more)."""
    try:
        from bench.data import get_dataset  # the dataset registry imports torch: `bench sync-mlflow` loads it late

        proto = get_dataset(row["dataset"]).protocol(row.get("protocol") or ROW["protocol"].default)
        return {"selection": repr(proto.selection(row["method"])), "warmup_selection": repr(proto.warmup_selection())}
    except (UserError, KeyError, ValueError):
        return {}


def trial_params(row: dict[str, Any]) -> dict[str, str]:
    """A trial's MLflow params: every input that changes its numbers. The row's configuration columns
    (`MLFLOW_PARAMS`, `protocol`, `switches`), then its effective configuration (`config_json`, whose hash is the
    trial id: the warm start's and the method stage's schedules as `warmup.*` and `method_stage.*`, every method
    parameter with its default filled in, by its own name as the method declares it, the train subset, the model,
    the switches' settings as `switches.*`, ...), and the selection rules its protocol implies. Derived from the row,
    never listed by hand, so a new input is a new param."""
    params: dict[str, Any] = {k: row.get(k) for k in MLFLOW_PARAMS}
    params |= {k: row.get(k) or ROW[k].default for k in ("protocol", "switches")}
    config = json.loads(row.get("config_json") or "{}")
    method_params = config.pop("method_params", None)
    if method_params is None:  # a row written before config_json: the parameters it recorded
        method_params = row.get("method_params")
    if isinstance(method_params, str):  # the row's column, or a configuration that recorded the column's JSON text
        method_params = json.loads(method_params or "{}")
    for key, value in _flat("", config).items():
        params.setdefault(key, value)  # the row's column (rounded, typed) where both have it
    for key, value in _flat("", method_params).items():
        params[key if key not in params else f"method.{key}"] = value
    params |= _selection(row)
    # An input left unset is a value too ("none": the whole training set, no explicit T): two runs that differ there
    # must not look equal.
    return {k: _param_value("none" if v is None else str(v)) for k, v in params.items()}


PARAM_LIMIT = 6000  # MLflow's longest param value (`mlflow.utils.validation.MAX_PARAM_VAL_LENGTH`)


def _param_value(text: str) -> str:
    """A param value MLflow takes: a longer one (a large matrix) cut, with the hash of the whole, so that two
    different values never read equal."""
    if len(text) <= PARAM_LIMIT:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return text[:PARAM_LIMIT - 40] + f"... (sha256 {digest})"


def trial_times(row: dict[str, Any]) -> tuple[int, int] | None:
    """The trial's start and end in ms since the epoch: it ended at its row's `finished_at` and ran `wall_s`
    seconds; None where the row lacks either."""
    if not row.get("finished_at") or row.get("wall_s") is None:
        return None
    try:
        end = calendar.timegm(time.strptime(row["finished_at"], "%Y-%m-%dT%H:%M:%SZ")) * 1000
    except ValueError:
        return None
    return end - round(float(row["wall_s"]) * 1000), end
