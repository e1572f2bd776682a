"""What logging one result row to MLflow costs the process that logs it (issue #56, item 2).

    python benchmarks/mirror_cost.py RESULTS [--rounds 3] [--baseline-python OTHER/.venv/bin/python]

Per round, interleaved (the arms' order rotating), each arm a process of its own: the rows of the results folder
RESULTS (its trials/ and epochs/), copied into a scratch folder, each read back (`Store.read_row`) and logged with
`Mirror.log_row` into a new embedded store (the first row's store opening and first run left out of the figures). With
--baseline-python, the same by another interpreter (another checkout's venv, PYTHONPATH dropped). Printed per arm and
round: the CPU milliseconds (user + sys of the process) a row to read and to log, and the wall a row; then each arm's
best (least) of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(results: str) -> None:
    from bench.store.folder import Store
    from bench.store.mirror import open_mirror

    store = Store(results)
    ids = [Path(p).name.removesuffix(".parquet") for p in store._paths("trials")]
    mirror = open_mirror(results, None)
    mirror.log_row(*store.read_row(ids[0]))
    started, before = time.perf_counter(), cpu()
    rows = [store.read_row(trial_id) for trial_id in ids[1:]]
    read = cpu()
    logged = sum(mirror.log_row(row, epochs) for row, epochs in rows)
    if logged != len(rows) or not mirror.ok:
        sys.exit(f"mirror_cost: {logged} of {len(rows)} rows logged ({mirror.failed})")
    n = len(rows)
    print(json.dumps({"read": 1000 * (read - before) / n, "log": 1000 * (cpu() - read) / n,
                      "wall": 1000 * (time.perf_counter() - started) / n, "rows": n}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-python", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.results)
        return
    arms = {"this": (sys.executable, dict(os.environ))}
    if args.baseline_python:
        arms["baseline"] = (args.baseline_python, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    scratch = Path(tempfile.mkdtemp(prefix="mirror-cost-"))
    best: dict[str, dict[str, float]] = {}
    for round_ in range(args.rounds):
        names = list(arms)[round_ % len(arms):] + list(arms)[:round_ % len(arms)]
        for name in names:
            python, env = arms[name]
            folder = scratch / f"{name}-{round_}"
            for table in ("trials", "epochs"):
                shutil.copytree(Path(args.results) / table, folder / table)
            proc = subprocess.run([python, __file__, "--child", str(folder)], env={**env, "OMP_NUM_THREADS": "1"},
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"mirror_cost: arm {name} failed:\n{proc.stderr[-3000:]}")
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"round {round_ + 1} {name:8s} {got['rows']} rows: read {got['read']:5.1f} ms CPU a row, log "
                  f"{got['log']:5.1f} ms CPU a row, wall {got['wall']:6.1f} ms a row (load {os.getloadavg()[0]:.1f})",
                  flush=True)
            best[name] = {k: min(v, best.get(name, got)[k]) for k, v in got.items()}
    for name, got in best.items():
        print(f"best of {args.rounds}: {name:8s} read {got['read']:5.1f} ms, log {got['log']:5.1f} ms CPU a row, "
              f"wall {got['wall']:6.1f} ms a row")


if __name__ == "__main__":
    main()
