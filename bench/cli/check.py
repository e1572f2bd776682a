"""`bench check [PATH ...]`: every plug-in's contract, checked as a user would meet it.

A plug-in is whole when it is registered under its name, described, runs (a method or a dataset trains a tiny trial,
an executor a tiny unit, a panel builds a tiny report), its row reads back from parquet as written and its MLflow
params as the mirror derives them, and it obeys the layers (a plug-in file imports only the interfaces; the
checkout's modules pass `lint-imports`). PATH is a plug-in folder (read as `$BENCH_PLUGINS` is), a file of the
checkout (its plug-ins alone: `baselines/taylor_ce.py`, `bench/report/seeds.py`; `bench/protocol.py` stands for the
switches, `bench/store/columns.py` for the columns) or the checkout itself; none: the `$BENCH_PLUGINS` folders, else
the checkout. A broken contract is one line, `KIND NAME: CONTRACT: what is wrong`; the tests call the same contracts
(`CONTRACTS`).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import math
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench import models, noise
from bench.config import PLUGIN_INTERFACES, PLUGINS_ENV, UserError
from bench.data import registry as datasets
from bench.exec.executor import UnitContext, executors
from bench.exec.trainer import run_trial
from bench.methods import registry as methods
from bench.protocol import BOTH, METHOD, SWITCHES, WARM
from bench.report.build import build_report
from bench.report.panel import panels
from bench.store.columns import ROW
from bench.store.folder import read_table
from bench.store.mirror import TAG, open_mirror, trial_params
from bench.trial import TrialConfig

CHECKOUT = Path(__file__).resolve().parents[2]
# What a plug-in file may import from bench beyond the interfaces (`PLUGIN_INTERFACES`): its registry's own package.
OWN_PACKAGE = {"executor": ("bench.exec",), "panel": ("bench.report",)}
LEVELS = [i / 10 for i in range(11)]
QUIET = dict(log=lambda *_: None)


class Broken(Exception):
    """A contract that does not hold: its one line."""


def tiny(dataset: str, method: str, seed: int = 0, train_subset: int | None = 512) -> TrialConfig:
    """A trial that trains in seconds: one warm-start epoch and one method epoch on a few hundred examples."""
    cls = datasets()[dataset]
    pattern = next((p for p, build in cls.noise_patterns.items() if build is not None), "uniform")
    return TrialConfig(dataset, method, pattern, 0.2, seed=seed, epochs=1, epochs_warmup=1, train_subset=train_subset)


def trains(config: TrialConfig, work: Path, run: Callable[..., dict] | None = None) -> dict[str, Any]:
    """The tiny trial's row, after the checks that it trained to a finite loss and reads back as written."""
    return trains_and_logs(config, work, run)[0]


def trains_and_logs(config: TrialConfig, work: Path, run: Callable[..., dict] | None = None) -> tuple[dict, Any]:
    """`trains`, with the MLflow run its row was logged as."""
    results = work / "results"
    row = (run or run_trial)(config, work / "data", results=results, **QUIET)
    if row["status"] != "ok" or not math.isfinite(row["val_loss"] or math.nan):
        raise Broken(f"trains a tiny trial: its status is {row['status']} with validation loss {row['val_loss']} "
                     f"({(row.get('error') or 'no error recorded').splitlines()[0][:200]})")
    return row, round_trips(row, results)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def round_trips(row: dict[str, Any], results: Path) -> Any:
    """Its parquet row holds every declared column as written, and its MLflow run the params derived from it; the
    run."""
    table = read_table(results)
    stored = table.filter(table["trial_id"] == row["trial_id"]).row(0, named=True)
    if changed := [c for c in ROW if c in row and not same(row[c], stored.get(c))]:
        raise Broken(f"round-trips its row: {', '.join(changed[:5])} read back changed from parquet")
    mirror = open_mirror(results, None, warn=lambda *_: None)
    if mirror is None or not mirror.log_row(stored):
        raise Broken("round-trips its MLflow params: its row could not be logged to MLflow")
    (run,) = mirror.client.search_runs([mirror.experiment_id(stored["experiment"] or "adhoc")],
                                       f"tags.`{TAG}trial_id` = '{row['trial_id']}'")
    if run.data.params != trial_params(stored):
        lost = sorted(set(trial_params(stored).items()) ^ set(run.data.params.items()))[:3]
        raise Broken(f"round-trips its MLflow params: they differ from its row's ({lost})")
    return run


def described(cls: type, *fields: str) -> None:
    if missing := [f for f in ("name", *fields) if not str(getattr(cls, f, "") or "").strip()]:
        raise Broken(f"is described: it declares no {', '.join(missing)}")


# -- the contracts, by kind -------------------------------------------------------------------------------------------
def method_described(name: str, work: Path) -> None:
    cls = methods()[name]
    described(cls, "title", "paper")
    for dataset in datasets().values():
        for pattern in dataset.accepted_noise():
            reason = cls.refuses(dataset, pattern)
            if not (reason is None or (isinstance(reason, str) and reason.strip())):
                raise Broken(f"answers refuses: on {dataset.name} {pattern} it gives {reason!r}, not None or a reason")


def method_trains(name: str, work: Path) -> None:
    trains(tiny("synthetic", name), work)


def dataset_described(name: str, work: Path) -> None:
    cls = datasets()[name]
    described(cls, "title", "model")
    if cls.num_classes < 2 or len(cls.class_names) != cls.num_classes:
        raise Broken(f"is described: {cls.num_classes} classes and {len(cls.class_names)} class names")
    if cls.model not in models.registry():
        raise Broken(f"is described: its network {cls.model!r} is not registered")


def dataset_noise(name: str, work: Path) -> None:
    """Its patterns give C x C row-stochastic matrices for every r, the identity at r = 0, none shadowing a generic."""
    cls = datasets()[name]
    if shadowed := sorted(set(cls.noise_patterns) & set(noise.GENERIC_PATTERNS)):
        raise Broken(f"declares its noise: its pattern {shadowed[0]!r} shadows the generic one")
    generic = [p for p in noise.GENERIC_PATTERNS if cls.instance_noise or not noise.is_instance_dependent(p)]
    accepted = cls.accepted_noise()
    if not len(set(accepted)) == len(accepted) == len(cls.noise_patterns) + (len(generic) if cls.clean_labels else 0):
        raise Broken(f"declares its noise: it accepts {accepted}, not its own patterns once and the generic ones "
                     "(none without clean labels)")
    for pattern in accepted:
        if pattern == "transition" or not cls.has_transition(pattern):
            continue
        for r in LEVELS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # det T = 0 at some r: a warning, by design
                t = np.asarray(cls.transition(pattern, r))
            c = cls.num_classes
            if t.shape != (c, c) or (t < 0).any() or not np.allclose(t.sum(axis=1), 1.0):
                raise Broken(f"declares its noise: {pattern} at r={r:g} is no {c} x {c} row-stochastic T")
            if r == 0 and not np.array_equal(t, np.eye(c)):
                raise Broken(f"declares its noise: {pattern} at r=0 flips labels")


def reads_files(cls: type) -> bool:
    """Whether the dataset reads published files (CIFAR-10's lie at the data root itself: no `folder`)."""
    return bool(cls.files or cls.folder)


def trains_here(cls: type) -> bool:
    """Whether a tiny trial of the dataset can train here: it needs no files, or it writes a stand-in of them."""
    return not reads_files(cls) or cls.offers_stand_in()


@contextlib.contextmanager
def on_its_files(cls: type, work: Path) -> Iterator[None]:
    """The dataset's files under `work / "data"`: its stand-in (random examples in the published format) for one
    read from files."""
    if not reads_files(cls):
        yield
        return
    cls.stand_in(work / "data", 64)
    os.environ["BENCH_VERIFY_CHECKSUMS"] = "0"  # a stand-in's checksums are not the published files'
    try:
        yield
    finally:
        os.environ.pop("BENCH_VERIFY_CHECKSUMS")


def dataset_trains(name: str, work: Path) -> None:
    """Its splits hold labels of its classes (all of them in training) and a tiny trial of CE trains on them. A
    dataset read from files trains on its stand-in (random examples in the published format), where it offers one."""
    cls = datasets()[name]
    if not trains_here(cls):
        return  # read from published files, and no stand-in to write: nothing to train on here
    with on_its_files(cls, work):
        splits = cls(work / "data").load()
        c = cls.num_classes
        for split_name, split in (("training", splits.train), ("validation", splits.val), ("test", splits.test)):
            y = np.asarray(split.y)
            outside = y[(y < 0) | (y >= c)] if split_name != "training" or cls.clean_labels else y[:0]
            if outside.size:
                raise Broken(f"labels its classes: its {split_name} split holds label {outside.flat[0]}, outside "
                             f"[0, {c})")
        if cls.clean_labels and (absent := sorted(set(range(c)) - set(np.asarray(splits.train.y).tolist()))):
            raise Broken(f"labels its classes: no training example of class {absent[0]} "
                         f"({cls.class_names[absent[0]]})")
        trains(tiny_on(cls, "ce"), work)


def tiny_on(cls: type, method: str) -> TrialConfig:
    """`tiny` on the dataset's own split sizes (a stand-in holds a few examples)."""
    return tiny(cls.name, method, train_subset=None if reads_files(cls) else min(512, cls.split_sizes[0]))


def executor_runs(name: str, work: Path) -> None:
    """A tiny unit of two trials: their rows in their order, each naming this kind, each written and read back."""
    kind = executors()[name]()
    trials = [tiny("synthetic", "ce", seed=s) for s in (0, 1)]
    described(type(kind))
    if kind.why_not(trials[0]):
        return  # a kind that takes no CPU trial (a GPU's): nothing it trains here
    if not isinstance(kind.describe(trials), str) or not isinstance(kind.unit_id(trials), str):
        raise Broken("is described: its describe and unit_id are not text")
    if not all(v >= 0 for b in kind.resources(trials, 1, 0) for v in b.values()):
        raise Broken("asks Ray for resources: a bundle asks a negative share")
    rows = kind.run(trials, UnitContext(work / "data", results=work / "results", **QUIET))
    if [r["trial_id"] for r in rows] != [t.trial_id for t in trials] or {r["executor"] for r in rows} != {name}:
        raise Broken("runs a tiny unit: its rows are not its trials' in their order, each naming the kind")
    trains(trials[0], work, run=lambda *a, **k: rows[0])


def panel_builds(name: str, work: Path) -> None:
    """A tiny report over two trials: it runs, and writes nothing outside the report's folder."""
    results, out = work / "results", work / "report"
    for config in (tiny("synthetic", "ce"), tiny("synthetic", "dmi")):
        run_trial(config, work / "data", results=results, **QUIET)
    before = {p for p in work.rglob("*")}
    written: dict[str, set[Path]] = {}
    current = [""]

    def log(line: str) -> None:  # the report names each panel as it starts: what appeared since is the previous's
        if line.startswith("panel: "):
            new = {p for p in work.rglob("*") if not p.is_relative_to(out)} - before
            written.setdefault(current[0], set()).update(new)
            before.update(new)
            current[0] = line.removeprefix("panel: ").removesuffix(" ...")

    cwd = os.getcwd()
    os.chdir(work)  # a relative path lands in the sandbox, where it is seen
    try:
        build_report(results, out, log=log)
    finally:
        os.chdir(cwd)
    written.setdefault(current[0], set()).update({p for p in work.rglob("*") if not p.is_relative_to(out)} - before)
    if outside := sorted(written.get(name, ())):
        raise Broken(f"writes only inside the report folder: it wrote {outside[0].relative_to(work)} beside it")


def switches_declared(name: str, work: Path) -> None:
    kind = SWITCHES[name]
    if kind.acts not in (WARM, METHOD, BOTH) or not str(kind.what).strip():
        raise Broken(f"is declared: acts on {kind.acts!r} (not one of {WARM!r}, {METHOD!r}, {BOTH!r}) or says nothing")
    for dataset in datasets().values():
        for switch in getattr(dataset, "authors_protocol", ()):
            if switch.name not in SWITCHES:
                raise Broken(f"is declared: {dataset.name} declares the unknown switch {switch.name!r}")


def column_declared(name: str, work: Path) -> None:
    column = ROW[name]
    if column.mlflow and column.mlflow not in ("param", "metric"):
        raise Broken(f"is declared: it is logged as {column.mlflow!r}, neither param nor metric")


_written: dict[str, Any] = {}  # one tiny trial's row and MLflow run, for every column of one `check`


def column_written(name: str, work: Path) -> None:
    """A tiny trial's row holds the column (made, and read back as written: `trains`), and its MLflow run logs it as
    declared: a param where it is one, a metric where it is one and the row has a value."""
    if not _written:
        with tempfile.TemporaryDirectory(prefix="bench-check-columns-") as folder:
            try:
                _written["row"], _written["run"] = trains_and_logs(tiny("synthetic", "dmi"), Path(folder))
            except KeyError as e:  # `make_row` makes every declared column, and names the one it cannot make
                _written["unmade"] = e.args[0]
    if _written.get("unmade") == name:
        raise Broken("is written: no trial's row makes it (bench.store.rows.make_row)")
    if "row" not in _written:
        return  # no row to read it in: the column that no row makes is the line
    row, run, column = _written["row"], _written["run"], ROW[name]
    logged = {"param": run.data.params, "metric": run.data.metrics}.get(column.mlflow, {})
    if column.mlflow and row[name] is not None and name not in logged:
        raise Broken(f"is logged as declared: a trial's MLflow run holds no {column.mlflow} {name}")


def imports_interfaces(kind: str, file: Path) -> None:
    """A plug-in file imports from bench only the interfaces (and its registry's own package)."""
    allowed = PLUGIN_INTERFACES + OWN_PACKAGE.get(kind, ())
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"bench.{a.name}" for a in node.names] if node.module == "bench" else [node.module]
        else:
            continue
        for module in names:
            if module.split(".")[0] == "bench" and not any(module == a or module.startswith(a + ".") for a in allowed):
                raise Broken(f"obeys the layers: it imports {module}, not an interface")


CONTRACTS: dict[str, list[Callable[[str, Path], None]]] = {
    "method": [method_described, method_trains], "dataset": [dataset_described, dataset_noise, dataset_trains],
    "executor": [executor_runs], "panel": [panel_builds], "switch": [switches_declared],
    "column": [column_declared, column_written]}


def registered() -> dict[str, dict[str, Path]]:
    """Every plug-in by kind and name, with the file that defines it."""
    def where(thing: Any) -> Path:
        return Path(inspect.getfile(thing if isinstance(thing, type) else type(thing))).resolve()
    return {"method": {n: where(c) for n, c in methods().items()},
            "dataset": {n: where(c) for n, c in datasets().items()},
            "executor": {n: where(c) for n, c in executors().items()},
            "panel": {p.name: where(p) for p in panels()},
            "switch": dict.fromkeys(SWITCHES, CHECKOUT / "bench" / "protocol.py"),
            "column": dict.fromkeys(ROW, CHECKOUT / "bench" / "store" / "columns.py")}


def selected(paths: list[Path]) -> dict[str, dict[str, Path]]:
    """The plug-ins defined in `paths` (files or folders)."""
    return {kind: {n: f for n, f in found.items() if any(f == p or f.is_relative_to(p) for p in paths)}
            for kind, found in registered().items()}


def lint_checkout() -> str | None:
    """`lint-imports` on the checkout: None, or its first broken contract."""
    lint = Path(sys.executable).with_name("lint-imports")
    if not (CHECKOUT / "pyproject.toml").is_file() or not lint.is_file():
        return None
    done = subprocess.run([str(lint), "--no-cache"], cwd=CHECKOUT, capture_output=True, text=True, timeout=600)
    if done.returncode == 0:
        return None
    broken = [line for line in done.stdout.splitlines() if "BROKEN" in line or "not listed" in line.lower()]
    return (broken or done.stdout.strip().splitlines()[-1:] or ["lint-imports failed"])[0].strip()


def check(paths: list[str]) -> list[str]:
    """The broken contracts of the plug-ins under `paths`, one line each (none: all hold)."""
    resolved = [Path(p).expanduser().resolve() for p in paths]
    if missing := [str(p) for p in resolved if not p.exists()]:
        raise UserError(f"bench check: {missing[0]} does not exist: give a plug-in folder or a file of the checkout")
    folders = [p for p in resolved if p.is_dir() and not (p == CHECKOUT or p.is_relative_to(CHECKOUT))]
    if not resolved:
        folders = [Path(f).expanduser().resolve() for f in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if f]
        resolved = folders or [CHECKOUT]
    if folders:
        os.environ[PLUGINS_ENV] = os.pathsep.join(map(str, folders))
        for registry in (methods, datasets, models.registry, executors):  # each registry found anew, with them
            registry.cache_clear()
    failures = []
    _written.clear()
    for kind, found in selected(resolved).items():
        for name, file in found.items():
            for contract in CONTRACTS[kind]:
                with tempfile.TemporaryDirectory(prefix="bench-check-") as work:
                    try:
                        contract(name, Path(work))
                        if kind not in ("switch", "column") and not file.is_relative_to(CHECKOUT / "bench"):
                            imports_interfaces(kind, file)
                    except Broken as e:
                        failures.append(f"{kind} {name}: {e}")
                        break
    if any(p == CHECKOUT or p.is_relative_to(CHECKOUT) for p in resolved) and (lint := lint_checkout()):
        failures.append(f"layers: obeys the layers: lint-imports: {lint}")
    return failures


def cmd_check(args: Any) -> int:
    failures = check(args.paths)
    for line in failures:
        print(f"bench check: {line}")
    if not failures:
        print("bench check: every contract holds")
    return 1 if failures else 0
