"""What a results folder of 1,000 / 10,000 / 50,000 rows costs the commands that read it (issue #56).

    python benchmarks/scale.py [--rows 1000,10000,50000] [--rounds 2] [--work DIR]
                               [--before OTHER/.venv/bin/bench] [--before-rows 10000] [--sync-rows 1000]
                               [--commands results,leaderboard,report,dry-run,sync-mlflow]

Builds, once (kept under --work, reused by later runs), results folders of N rows: two real trials (CE and L_DMI on
the synthetic set, 1 + 1 epochs, `bench.exec.trainer.run_trial`: `bench.store.rows.make_row`'s rows and curves) give
the rows' shape, and each of the N rows is one of them with the identity of another trial of a grid of 3 noise cases
x 10 r x 5 methods x 5 seeds x as many (lr, batch size) settings as N needs (its trial id that trial's, `TrialConfig`),
written by the store's own writer (`Store.write_trial`: the declared types, its row and its curves). Schema-true rows
of a realistic grid, without training N trials.

Then, per round, interleaved (the arms' order alternating): `bench results`, `bench leaderboard` and `bench report`
on each folder, `bench run GRID --dry-run` of a 60-trial grid into the largest folder of at most 10,000 rows and
into an empty one, and `bench sync-mlflow` of the folders of at most --sync-rows rows into a new store (its sqlite
file and the folder's `mlartifacts/` removed before each), each as a whole process (`bench` beside this interpreter;
with --before, also another checkout's `bench`: the code before the change, on folders up to --before-rows).
Printed per command: CPU seconds (user + system of the process and its children), wall seconds and peak RSS, the
best of the rounds; CPU per row; the ratios of the arms; the issue's targets (at 10,000 rows each command at most
10 s of CPU and 1 GB; the dry run into 10,000 rows at most 2x the empty folder's; sync-mlflow of 1,000 rows at most
10 s of CPU); and, with --before, whether `bench report` wrote the same report in both arms (each arm's report under
--work/report-out/<rows>-<arm>: the files both wrote compared byte for byte, the page's generation time aside, and
the files only one wrote).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NOISES, RS, METHODS, SEEDS = ("case1", "case2", "case3"), [round(0.1 * i, 1) for i in range(10)], \
    ("ce", "dmi", "fw", "gce", "lccn"), range(5)
DRY_GRID = """name: scale_dry
dataset: synthetic
noise: case3
r: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
seeds: [0, 1, 2, 3, 4]
epochs: 1
epochs_warmup: 1
device: cpu
resources: {cpu: 1, gpu: 0}
methods:
  ce: {}
  dmi: {}
"""


def trials(n: int) -> list[object]:
    """The first `n` trials of the grid, every cell and seed of one setting before the next setting."""
    from bench.trial import TrialConfig

    settings = ((10 ** (-2 - k / 8), bs) for k in itertools.count() for bs in (128, 256))
    cells = list(itertools.product(SEEDS, NOISES, RS, METHODS))
    out = []
    for lr, bs in settings:
        for seed, noise, r, method in cells:
            out.append(TrialConfig("synthetic", method, noise, r, seed=seed, lr=lr, batch_size=bs, epochs=1,
                                   epochs_warmup=1, experiment="scale"))
            if len(out) == n:
                return out
    return out


def build(folder: Path, n: int) -> None:
    """`folder` holding `n` rows (see the module's docstring); a folder already complete is kept."""
    if (folder / "complete").exists():
        return
    import json

    from bench.exec.trainer import run_trial  # torch, in this process only where a folder is built: a child's peak
    from bench.store.folder import Store  # RSS would count the parent's pages it was forked with
    shapes = {}
    with tempfile.TemporaryDirectory() as scratch:
        for method in ("ce", "dmi"):
            config = trials(2)[method == "dmi"]
            row = run_trial(config, scratch, results=scratch, log=lambda s: None)
            shapes[method] = (row, Store(scratch).read_row(row["trial_id"])[1].drop("trial_id").to_dicts())
    store, started = Store(folder), time.perf_counter()
    for i, t in enumerate(trials(n)):
        row, curves = shapes["ce" if t.method == "ce" else "dmi"]
        row = row | dict(trial_id=t.trial_id, method=t.method, noise=t.noise, r=float(t.r), seed=int(t.seed),
                         lr=float(t.lr), batch_size=int(t.batch_size), val_loss=row["val_loss"] + i % 97 / 1000,
                         test_acc=row["test_acc"] - i % 89 / 100, config_json=json.dumps(t.identity(), sort_keys=True,
                                                                                        default=str))
        store.write_trial(row, curves)
    (folder / "complete").write_text(f"{n} rows in {time.perf_counter() - started:.0f} s\n")


def measure(command: list[str], cwd: Path) -> tuple[float, float, float]:
    """(CPU seconds of the process and its children, wall seconds, peak RSS in MB) of one whole process."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"scale: {' '.join(command)} exited {proc.returncode}:\n{err[-3000:]}")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1000,10000,50000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-scale")
    parser.add_argument("--before", help="another checkout's `bench` (its .venv/bin/bench): the code before")
    parser.add_argument("--before-rows", type=int, default=10000, help="the largest folder the --before arm reads")
    parser.add_argument("--sync-rows", type=int, default=1000, help="the largest folder sync-mlflow logs")
    parser.add_argument("--commands", default="results,leaderboard,report,dry-run,sync-mlflow")
    args = parser.parse_args()
    sizes = [int(n) for n in args.rows.split(",")]
    wanted = args.commands.split(",")
    for n in sizes:
        print(f"building {n} rows under {args.work}/rows-{n} ...", flush=True)
        build(args.work / f"rows-{n}", n)
    (args.work / "empty").mkdir(exist_ok=True)
    grid = args.work / "scale_dry.yaml"
    grid.write_text(DRY_GRID)
    after = str(Path(sys.executable).with_name("bench"))
    # "cold": the code after, its compact copy of the rows (`index/`, `bench.store.dataset`) removed first, so that
    # every file is read (the first command after rows landed by other means than a reader).
    arms = {"after": after, "cold": after} | ({"before": args.before} if args.before else {})
    jobs = []  # (label, rows, arm, command)
    for n in sizes:
        where = str(args.work / f"rows-{n}")
        for name in ("results", "leaderboard", "report"):
            if name in wanted:
                # Each arm's report in a folder of its own, for `compare_reports`.
                jobs += [(name, n, arm, [bench, name, where] + (["--out", str(args.work / "report-out" / f"{n}-{arm}")]
                                                                 if name == "report" else []))
                         for arm, bench in arms.items() if arm != "before" or n <= args.before_rows]
    if "sync-mlflow" in wanted:
        for n in (n for n in sizes if n <= args.sync_rows):
            store = f"sqlite:///{args.work / f'sync-{n}.db'}"
            jobs += [("sync-mlflow", n, arm, [bench, "sync-mlflow", str(args.work / f"rows-{n}"), "--mlflow-uri",
                                              store]) for arm, bench in arms.items() if arm != "cold"]
    if "dry-run" in wanted:
        full = max((n for n in sizes if n <= 10000), default=None)
        for n, where in ((0, args.work / "empty"), *(((full, args.work / f"rows-{full}"),) if full else ())):
            jobs += [("dry run 60", n, arm, [bench, "run", str(grid), "--results", str(where), "--dry-run"])
                     for arm, bench in arms.items() if (arm != "cold" or n) and (arm != "before" or
                                                                                 n <= args.before_rows)]
    best: dict[tuple[str, int, str], tuple[float, float, float]] = {}
    for round_ in range(args.rounds):
        for label, n, arm, command in (jobs if round_ % 2 == 0 else jobs[::-1]):
            if arm == "cold":
                shutil.rmtree(args.work / f"rows-{n}" / "index", ignore_errors=True)
            if label == "sync-mlflow":  # a new store, every run logged
                (args.work / f"sync-{n}.db").unlink(missing_ok=True)
                shutil.rmtree(args.work / f"rows-{n}" / "mlartifacts", ignore_errors=True)
            cpu, wall, rss = measure(command, args.work)
            print(f"round {round_ + 1}: {label:12s} {n:>6} rows  {arm:6s}  cpu {cpu:7.2f} s  wall {wall:7.2f} s  "
                  f"peak {rss:7.0f} MB", flush=True)
            key = (label, n, arm)
            old = best.get(key)
            best[key] = (min(cpu, old[0]), min(wall, old[1]), min(rss, old[2])) if old else (cpu, wall, rss)
    report(best, arms)
    for n in sizes:
        if "report" in wanted and "before" in arms and n <= args.before_rows:
            print(compare_reports(args.work / "report-out" / f"{n}-before", args.work / "report-out" / f"{n}-after",
                                  n))


def compare_reports(before: Path, after: Path, n: int) -> str:
    """Whether the two arms wrote the same report: the files both wrote byte for byte (report.html's generation time
    aside, an SVG's ids renamed in order: matplotlib salts them at random), and the files only one wrote."""
    def files(folder: Path) -> dict[str, bytes]:
        return {str(f.relative_to(folder)): _comparable(f) for f in sorted(folder.rglob("*")) if f.is_file()}
    old, new = files(before), files(after)
    same = [name for name in old.keys() & new.keys() if old[name] == new[name]]
    differ = sorted(name for name in old.keys() & new.keys() if old[name] != new[name])
    return (f"report at {n:,} rows, after against before: {len(same)} files the same byte for byte; differing: "
            f"{', '.join(differ) or 'none'}; only before: {', '.join(sorted(old.keys() - new.keys())) or 'none'}; "
            f"only after: {', '.join(sorted(new.keys() - old.keys())) or 'none'}")


def _comparable(path: Path) -> bytes:
    data = re.sub(rb"Generated [0-9-]+ [0-9:]+ UTC", b"", path.read_bytes())
    if path.suffix != ".svg":
        return data
    ids: dict[bytes, bytes] = {}
    for found in re.finditer(rb'id="([^"]+)"', data):
        ids.setdefault(found.group(1), b"id%d" % len(ids))
    return re.sub(rb'(?<=id=")[^"]+|(?<=#)[A-Za-z0-9_]+', lambda m: ids.get(m.group(0), m.group(0)), data)


def report(best: dict[tuple[str, int, str], tuple[float, float, float]], arms: dict[str, str]) -> None:
    print("\nbest of the rounds:")
    print(f"{'command':12s} {'rows':>6}  {'arm':6s} {'CPU s':>8} {'wall s':>8} {'peak MB':>8} {'CPU ms/row':>11}"
          f" {'CPU before/after':>17}")
    for (label, n, arm), (cpu, wall, rss) in sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        per_row = f"{1000 * cpu / n:11.2f}" if n else f"{'-':>11}"
        ratio = ""
        if arm != "before" and (label, n, "before") in best:
            ratio = f"{best[(label, n, 'before')][0] / cpu:16.1f}x"
        print(f"{label:12s} {n:>6}  {arm:6s} {cpu:8.2f} {wall:8.2f} {rss:8.0f} {per_row} {ratio}")
    print("\ntargets (after):")
    for label in ("results", "leaderboard", "report"):
        if (label, 10000, "after") in best:
            cpu, _, rss = best[(label, 10000, "after")]
            print(f"  {label} at 10,000 rows: {cpu:.2f} s CPU (<= 10), {rss:.0f} MB peak (<= 1024): "
                  f"{'met' if cpu <= 10 and rss <= 1024 else 'NOT met'}")
    if ("sync-mlflow", 1000, "after") in best:
        cpu = best[("sync-mlflow", 1000, "after")][0]
        print(f"  sync-mlflow of 1,000 rows: {cpu:.2f} s CPU (<= 10): {'met' if cpu <= 10 else 'NOT met'}")
    full = max((n for (label, n, _) in best if label == "dry run 60"), default=0)
    for arm in arms:
        if full and ("dry run 60", 0, arm) in best and ("dry run 60", full, arm) in best:
            ratio = best[("dry run 60", full, arm)][0] / best[("dry run 60", 0, arm)][0]
            print(f"  dry run of 60 trials into {full:,} rows / into an empty folder, {arm}: {ratio:.2f}x CPU "
                  f"(after: <= 2)")


if __name__ == "__main__":
    main()
