"""Checks made in the driver before any training: every value of every trial, names that become paths, the data
files' integrity, the results folder, and the size of a grid.

Each failure is a `UserError`: one line saying what is wrong and how to fix it (exit code 2), raised before
anything is written, so that a bad value never reaches a Ray worker (where it would be retried and logged there).
`bench trial` and `bench run` (including `--dry-run`) call the same checks; the trainer repeats the cheap ones.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench import models
from bench.config import UserError
from bench.data import get_dataset
from bench.methods import check_params, get_method
from bench.models import get_model
from bench.schema import GRID_LIMIT, TRIAL_FLAGS, check_name
from bench.store.folder import is_local, write_probe
from bench.trial import TrialConfig


def check_trial(config: TrialConfig, transitions: dict[tuple[Any, ...], None] | None = None) -> None:
    """Every value of one trial: names, method hyper-parameters (by the method's declaration), r, seed, lr,
    batch size, epochs, the training subset and the transition matrix. `transitions` remembers the matrices
    already checked (a grid repeats them)."""

    check_name("experiment", config.experiment)
    dataset = get_dataset(config.dataset)
    method = get_method(config.method)
    check_params(method, config.params)
    dataset.check_noise(config.noise)
    dataset.check_level(config.noise, config.r)
    model = config.network()  # an unknown protocol spec or switch: one line
    models.check_args(model, dict(config.model_args))  # an unknown network or option: one line
    if (method.uses_embeddings and hasattr(get_model(dataset.model), "forward_embedded")
            and not hasattr(get_model(model), "forward_embedded")):
        raise UserError(f"method {config.method} cannot run on {config.dataset} under protocol {config.protocol}: it "
                        f"perturbs word embeddings (forward_embedded), which the scripts' model {model} does not "
                        f"offer; use --protocol bench, or take script_model out (authors-script_model)")
    refusal = method.refuses(dataset, config.noise)
    if refusal:
        raise UserError(f"method {config.method} cannot run on noise {config.noise!r} of {config.dataset}: {refusal}")
    # Named by the `bench trial` flags; an experiment file's own values were checked (with its keys) on loading.
    for name, (flag, value) in TRIAL_FLAGS.items():
        given = getattr(config, name)
        if given is not None:  # None: the dataset's paper default
            problem = value.problem(given, dataset.split_sizes[0] if name == "train_subset" else None)
            if problem:
                raise UserError(f"{flag} {problem}")
    key = (config.dataset, config.noise, round(config.r, 10), config.transition)
    if dataset.has_transition(config.noise) and (transitions is None or key not in transitions):
        explicit = None if config.transition is None else _matrix(config.transition)
        dataset.transition(config.noise, config.r, explicit)
        if transitions is not None:
            transitions[key] = None


def _matrix(rows: tuple[tuple[float, ...], ...]) -> Any:
    import numpy as np

    return np.asarray(rows, dtype=np.float64)


def check_trials(trials: Iterable[TrialConfig]) -> None:
    seen: dict[tuple[Any, ...], None] = {}
    for trial in trials:
        check_trial(trial, seen)


def check_data(datasets: Iterable[str], data_root: str | os.PathLike[str],
               networks: Iterable[TrialConfig] = ()) -> None:
    """The data files of each dataset: present, and intact (their md5 checksums, unless BENCH_VERIFY_CHECKSUMS=0);
    and the files the trials' networks read (`networks`: a frozen-feature probe's weights)."""

    for name in sorted(set(datasets)):
        get_dataset(name)(data_root).check_files()
    for network, args in {(t.network(), t.model_args) for t in networks}:
        models.get_model(network).check_files(dict(args))


def check_results(results: str) -> None:
    """A local results folder must be a folder this process can write (checked by writing a probe file into it,
    or into its nearest existing parent), so that no finished trial loses its row to a late write error."""

    if not is_local(results):
        return  # an object store: credentials and buckets are checked by the first write
    try:
        results.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"results folder {results!r} is not valid UTF-8; choose another --results") from None
    path = Path(results.removeprefix("file://")).expanduser().absolute()
    probe_in = path
    while not probe_in.exists():
        if probe_in.is_symlink() or probe_in.parent == probe_in:
            break
        probe_in = probe_in.parent
    for sub in ("", "trials", "epochs"):
        folder = probe_in / sub if probe_in == path else probe_in
        if folder.exists() and not folder.is_dir():
            raise UserError(f"results folder {path}: {folder} is a file, not a folder; choose another --results")
    if e := write_probe(probe_in):
        raise UserError(f"results folder {path} is not writable ({e.strerror or e} in {probe_in}); choose another "
                        "--results")


def check_grid_size(size: int, yes: bool) -> None:
    if size > GRID_LIMIT and not yes:
        raise UserError(f"the grid has {size:,} trials (more than {GRID_LIMIT:,}); check seeds, r and the method "
                        "grids, or pass --yes to run it anyway (--dry-run summarises it)")
