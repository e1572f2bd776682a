"""Result rows: what one trial measured, with its configuration and provenance.

A row is one dict (`make_row`) with every column of `bench.store.columns.ROW_COLUMNS`, in their order (the
`CORE_COLUMNS` first); its per-epoch curves have the `EPOCH_COLUMNS`. Where
and how rows are kept (parquet files, atomic writes, reading them back) is `bench.store.folder`'s. Making a row needs
only numpy and torch: the training core makes rows on a bare GPU box.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench import numerics, protocol
from bench.data import get_dataset
from bench.noise import NoisyLabels
from bench.store.columns import ROW, check_declared
from bench.store.folder import Store
from bench.trial import TrialConfig


@functools.cache
def git_commit() -> str:
    """The commit of the bench checkout this code runs from ("unknown" for an installed copy)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if out.returncode != 0:
        return "unknown"
    return out.stdout.strip()[:12] + ("-dirty" if dirty.stdout.strip() else "")


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return f"cpu ({platform.machine()})"


@functools.cache
def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (where there is none: what `platform` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_identity(device: str) -> tuple[str, str]:
    """The model of the device a trial ran on and, for a GPU, its UUID (as nvidia-smi prints it: GPU-...), which
    tells apart two GPUs of one model; the CPU has none ("")."""
    if device.startswith("cuda") and torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(torch.device(device))
        return properties.name, f"GPU-{properties.uuid}"
    return cpu_model(), ""


def ray_node_id() -> str:
    """The id of the Ray node this process runs in ("" outside Ray: `bench trial`). Ray is only asked where the
    process already has it: the training core runs without it."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return ""
    return ray.get_runtime_context().get_node_id() or ""


def _matrix(m: np.ndarray | None) -> str | None:
    return None if m is None else json.dumps(np.round(np.asarray(m, dtype=float), 6).tolist())


def _measured(outcome: Any | None, labels: NoisyLabels | None, wall_s: float) -> dict[str, Any]:
    """The columns a trial measured (its outcome, its labels, its cost); those of a trial that failed before it ended
    are null (its status "failed", its device-seconds its wall time)."""
    o = outcome
    return dict(
        status=o.status if o else "failed", best_epoch=o.best_epoch if o else None,
        val_loss=o.val_loss if o else None, test_acc=o.test_acc if o else None,
        test_bal_acc=o.test_bal_acc if o else None, last_test_acc=o.last_test_acc if o else None,
        noise_rate=labels.noise_rate if labels else None, noise_hash=labels.noise_hash if labels else None,
        last_test_bal_acc=o.last_test_bal_acc if o else None, warmup_test_acc=o.warmup_test_acc if o else None,
        warmup_s=o.warmup_s if o else None, method_s=o.method_s if o else None,
        transition=_matrix(labels.transition) if labels else None,
        empirical_transition=_matrix(labels.empirical) if labels else None,
        estimated_transition=_matrix(o.estimated_transition) if o else None,
        confusion=_matrix(o.confusion) if o else None,
        pack_size=o.pack_size if o else None,  # trials trained together with this one (1: solo)
        executor=o.executor if o else None,
        # Cost (bench.report.diagnostics): networks the method stage trains, epochs of its protocol (its warm start's
        # too, whoever trained it: cached, packed or resumed, the count is the same), seconds on its device without
        # the per-epoch diagnostics.
        networks=o.networks if o else None,
        epochs_trained=sum(e["train_loss"] is not None for e in o.epochs) if o else None,
        device_s=max(0.0, float(wall_s) - o.diagnostics_s) if o else float(wall_s),
        diagnostics_s=o.diagnostics_s if o else None,
    )


def make_row(
    config: TrialConfig,
    model: str,
    labels: NoisyLabels | None,
    outcome: Any | None,
    wall_s: float,
    lr: float,
    batch_size: int,
    epochs: int,
    epochs_warmup: int,
    privileged: bool = False,
    error: str = "",
    pack_wall_s: float | None = None,
) -> dict[str, Any]:
    """One trial's row: every column of `ROW_COLUMNS`, in their order. `outcome` is the trainer's `Outcome`; None for
    a trial that failed before it ended. `pack_wall_s`: the wall time of the whole pack a packed member trained in."""
    device_model, device_uuid = device_identity(config.device)
    row: dict[str, Any] = dict(
        trial_id=config.trial_id, experiment=config.experiment, dataset=config.dataset, model=model,
        method=config.method, noise=config.noise, r=float(config.r), seed=int(config.seed),
        lr=float(lr), batch_size=int(batch_size),
        wall_s=float(wall_s), device=device_name(config.device), git_commit=git_commit(),
        torch_version=torch.__version__,
        epochs=int(epochs), epochs_warmup=int(epochs_warmup),
        method_params=json.dumps(dict(config.method_params), sort_keys=True, default=str),
        # The protocol (`bench.protocol`) as written and the switches of the authors' scripts it turned on.
        protocol=protocol.canonical(config.protocol),
        switches=",".join(config.resolved_protocol().names()),
        precision=config.precision,
        train_subset=config.train_subset,
        weights=", ".join(f"{option}={md5}" for option, md5 in config.weights().items()),
        privileged=bool(privileged),
        oracle=config.resolved_protocol().oracle(config.method),
        error=(outcome.error if outcome and outcome.error else error),
        python_version=platform.python_version(),
        numpy_version=np.__version__,
        host=platform.node(), node_id=ray_node_id(), device_model=device_model, device_uuid=device_uuid,
        config_json=json.dumps(config.identity(), sort_keys=True, default=str),
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),  # the newest of two rows of a seed counts
        pack_wall_s=None if pack_wall_s is None else float(pack_wall_s),
        numerics=config.numerics,
    ) | numerics.in_force(config.device) | _measured(outcome, labels, wall_s)
    check_declared(row)  # a column made here but never declared would otherwise be dropped without a word
    return {name: row[name] for name in ROW}  # every declared column (a KeyError names one not made here)


def trial_config(row: dict[str, Any]) -> TrialConfig:
    """The trial a row records, rebuilt from its columns (`make_row`'s inverse, for `bench verify`): the effective
    schedule it ran (lr, batch size, epochs), its given hyper-parameters, its protocol, precision, float order and
    network. Its `trial_id` is the row's where the code computes the same trial (a caller compares them: a changed
    default or a plug-in's `version` makes another trial)."""
    model, _, args = str(row["model"]).partition("(")
    model_args = tuple(sorted((key.strip(), _number_or_text(value.strip())) for key, _, value in
                              (item.partition("=") for item in args.removesuffix(")").split(",") if item.strip())))
    transition = tuple(map(tuple, json.loads(row["transition"]))) if row["noise"] == "transition" else None
    params = json.loads(row["method_params"] or "{}")
    config = TrialConfig(
        dataset=row["dataset"], method=row["method"], noise=row["noise"], r=float(row["r"]), seed=int(row["seed"]),
        lr=row["lr"], batch_size=row["batch_size"], epochs=row["epochs"], epochs_warmup=row["epochs_warmup"],
        method_params=tuple(sorted(params.items())), transition=transition, train_subset=row["train_subset"],
        device=str(row["device"]).split(" ")[0], experiment=row["experiment"], protocol=row["protocol"] or "bench",
        precision=row["precision"] or "fp32", model_args=model_args, numerics=row["numerics"] or numerics.NATIVE,
        threads=int(row["threads"] or 1),
    )
    default = config.resolved_protocol().setting("script_model", get_dataset(config.dataset).model)
    return config if model == default else dataclasses.replace(config, model=model)


def _number_or_text(text: str) -> int | str:
    return int(text) if text.isascii() and text.isdigit() else text


def write_trial(results: str | os.PathLike[str], row: dict[str, Any], epochs: list[dict[str, Any]]) -> str:
    """Write a trial's curves, then its row, into the results store (`bench.store.folder`); return the row's path. The
    training core (solo and packed trials) writes its rows through here."""

    return Store(results).write_trial(row, epochs)
