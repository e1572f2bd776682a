"""The driver's checks beyond a trial's values, before any training: data files, results folder, grid size; every trial
through `TrialConfig.check`.

Checks made in the driver before any training, beyond a trial's values (`bench.trial.TrialConfig.check`, the
one home of those, which the worker repeats before it loads data): the data files' integrity, the results folder,
and the size of a grid.

Each failure is a `UserError`: one line saying what is wrong and how to fix it (exit code 2), raised before
anything is written, so that a bad value never reaches a Ray worker (where it would be retried and logged there).
`bench trial` and `bench run` (including `--dry-run`) call the same checks.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench import models
from bench.config import UserError
from bench.data import get_dataset
from bench.schema import GRID_LIMIT
from bench.store.folder import is_local, write_probe
from bench.trial import TrialConfig


def check_trials(trials: Iterable[TrialConfig]) -> None:
    """Each trial by the one check of a trial's values (`TrialConfig.check`), its noise matrices checked once, and
    each setting once for all its seeds: no rule but the seed's own reads the seed, so a trial whose setting (every
    field but the seed) and whose seed were both checked in other trials passes as they did."""
    transitions: set[tuple[Any, ...]] = set()
    settings: set[tuple[Any, ...]] = set()
    seeds: set[int] = set()
    for trial in trials:
        setting = tuple(getattr(trial, name) for name in SETTING_FIELDS)
        if setting in settings and trial.seed in seeds:
            continue
        trial.check(transitions)
        settings.add(setting)
        seeds.add(trial.seed)


SETTING_FIELDS = tuple(f.name for f in dataclasses.fields(TrialConfig) if f.name != "seed")


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
