"""The grids a results folder was asked to run, kept beside their rows so that a reader knows what is missing.

`bench run` records each grid it runs (`record`): `grids/<experiment>.yaml`, the experiment file as it resolved
(command-line changes applied), and `grids/<experiment>.json`, the trials it expands to, each by its trial id (the
hash of its configuration, `bench.trial.TrialConfig.trial_id`) with its cell, as the result row names them. `bench
report`, `bench leaderboard` and `bench results` read them back (`read_grids`) and compare them with the rows: a grid
stopped part-way, or a row file removed by hand, reads as the trials it lacks, not as a smaller complete grid. A
relaunch of the same experiment (grown, or run with other settings) replaces its record.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.store.folder import Store

if TYPE_CHECKING:  # a reader of the records imports no torch (the trial's module does)
    from bench.trial import TrialConfig

GRIDS = "grids"
# What a recorded trial says of itself: its id and its cell, named as the result row's columns name them.
KEYS = ("trial_id", "dataset", "noise", "r", "method", "seed", "protocol")
STAMP = "%Y-%m-%dT%H:%M:%SZ"  # UTC, as a row's `finished_at` (`bench.store.rows`): the two compare as text


@dataclass(frozen=True)
class Grid:
    name: str
    trials: tuple[dict[str, Any], ...]  # one dict of `KEYS` a trial, in the grid's order
    started_at: str = ""  # when `bench run` last started it (`STAMP`); "" in a record without it


def record(results: str | os.PathLike[str], name: str, text: str, trials: list[TrialConfig]) -> None:
    """Keep the grid `name` (its experiment file's `text` and its `trials`) in the results folder."""
    from bench import protocol  # torch: `bench run` has it already

    store = Store(results)
    listed = [dict(trial_id=t.trial_id, dataset=t.dataset, noise=t.noise, r=float(t.r), method=t.method,
                   seed=int(t.seed), protocol=protocol.canonical(t.protocol)) for t in trials]
    store.write_bytes(store.path(GRIDS, f"{name}.yaml"), text.encode())
    store.write_bytes(store.path(GRIDS, f"{name}.json"),
                      json.dumps({"experiment": name, "started_at": time.strftime(STAMP, time.gmtime()),
                                  "trials": listed}, indent=1).encode())


def read_grids(results: str | os.PathLike[str]) -> list[Grid]:
    """Every grid recorded in the folder, by name; a record that cannot be read, or is not one of ours, is skipped
    with one warning naming it (results folders travel between people)."""
    import pyarrow.fs as pafs

    store = Store(results)
    selector = pafs.FileSelector(store.path(GRIDS), allow_not_found=True)
    grids = []
    for path in sorted(i.path for i in store.fs.get_file_info(selector) if i.path.endswith(".json")):
        try:
            data = json.loads(store.read_bytes(path))
            grid = Grid(str(data["experiment"]), tuple({k: t[k] for k in KEYS} for t in data["trials"]),
                        str(data.get("started_at", "")))
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"bench: warning: skipping the grid record {path} ({type(e).__name__}: {e}); the next `bench run` "
                  "of its grid writes it again", file=sys.stderr, flush=True)
            continue
        grids.append(grid)
    return grids
