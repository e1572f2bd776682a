"""The parser: every command's arguments (but `calibrate`'s), and the bodies of `bench trial` and `bench datasets`.

The `bench` command line: every command's arguments are defined here (but `calibrate`'s, with its body in
`bench.cli.calibrate`), with the bodies of `trial` and `datasets`; the others' bodies are modules of their own in
`bench.cli` (`run`; `report`: report and leaderboard; `mlflow`: sync-mlflow and ui; `labels`; `methods`; `results`),
each a thin call into its layer. Each is imported only when its command runs, so that `bench --help`, `trial`,
`datasets` and `methods` stay light and work on a bare GPU box (torch and numpy only).
Bad input prints one line starting with "bench: error:" and exits with code 2, having written nothing."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import math
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn, TextIO

from bench import __version__, numerics  # numerics: the standard library only, so `bench --help` stays quick
from bench.cli import output
from bench.cli.calibrate import add_calibrate
from bench.config import EXIT_USAGE, UserError, default_data_root, integer, number, read_text_file
from bench.grid.stop import Interrupted  # the standard library only: `bench --help` stays quick
from bench.schema import GRID_LIMIT, METHOD_STAGE, WHOLE_EXPERIMENT

# What `bench run`, `report`, `results`, `sync-mlflow` and `ui` need beyond the training core; each command names
# its own (`needs`), checked before it starts.
OPTIONAL = {"ray", "mlflow", "polars", "pyarrow", "scipy", "matplotlib", "yaml"}


def _add_data_root(parser: argparse.ArgumentParser) -> None:
    """Only on the commands that read data: trial, run, labels, datasets."""
    parser.add_argument(
        "--data-root", type=Path, default=None,
        help="folder holding the data sets (default: $BENCH_DATA, else ~/.cache/bench/data)",
    )


def _data_root(args: argparse.Namespace) -> Path:
    return args.data_root if args.data_root is not None else default_data_root()


def _parse_params(method: str, items: list[str]) -> dict[str, object]:
    """--param key=value pairs, each value converted to the type the method declares for it and checked."""
    # torch loads with the commands that need it: `bench --help` and a mistyped flag answer at once
    from bench.methods import check_params, get_method

    return check_params(get_method(method), _param_texts(method, items), from_text=True)


def _param_texts(method: str, items: list[str]) -> dict[str, str]:
    """--param key=value pairs as texts; a pair that is not one, or that names a setting of the trial (which has a
    flag of its own: --lr, not --param lr=), is one line. Needs no import: `bench trial` checks it first."""
    params: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--param expects key=value, got {item!r}")
        if key.strip() in (*METHOD_STAGE, *WHOLE_EXPERIMENT):
            raise UserError(f"{key.strip()} is a setting of the trial, not a parameter of method {method!r}: give "
                            f"--{key.strip().replace('_', '-')} {value.strip()}")
        params[key.strip()] = value.strip()
    return params


def _parse_model_args(items: list[str]) -> dict[str, object]:
    """--model-arg key=value pairs; a value in ASCII digits is an integer (image_size=224), any other text stays text
    (the model's own check refuses it where it wants a number)."""
    pairs = [(key.strip(), sep, value.strip()) for key, sep, value in (item.partition("=") for item in items)]
    if bad := next((item for item, (key, sep, _) in zip(items, pairs, strict=True) if not sep or not key), None):
        raise UserError(f"--model-arg expects key=value, got {bad!r}")
    return {key: _integer_or_text(value) for key, _, value in pairs}


def _integer_or_text(value: str) -> int | str:
    try:
        return integer(value)
    except ValueError:
        return value


def cmd_trial(args: argparse.Namespace) -> int:
    # The trial's float-order pins before torch loads (`bench.numerics`): torch picks its kernels once per process.
    if args.numerics in numerics.NUMERICS and not numerics.machine_problem(args.numerics):
        numerics.set_pins(args.numerics, args.device)
    # torch loads with the commands that need it: `bench --help` and a mistyped flag answer at once
    from bench import noise
    from bench.exec.trainer import run_trial
    from bench.grid.validate import check_data, check_results
    from bench.trial import TrialConfig, freeze_params

    noise_name, transition = noise.from_flags(args.noise, args.transition)
    config = TrialConfig(
        dataset=args.dataset, method=args.method, noise=noise_name, r=args.r, seed=args.seed, lr=args.lr,
        batch_size=args.batch_size, epochs=args.epochs, epochs_warmup=args.epochs_warmup,
        method_params=freeze_params(_parse_params(args.method, args.param)), transition=transition,
        train_subset=args.train_subset, device=args.device, experiment=args.experiment, protocol=args.protocol,
        precision=args.precision, model=args.model, model_args=freeze_params(_parse_model_args(args.model_arg)),
        numerics=args.numerics, threads=args.threads,
    )
    config.check()
    check_results(args.results)
    check_data([config.dataset], _data_root(args), [config])
    row = run_trial(config, _data_root(args), results=args.results, log=lambda s: print(s, flush=True))
    print()
    print(f"trial {row['trial_id']}  status {row['status']}")
    rule = config.resolved_protocol().selection(config.method).words()
    print(f"  selected epoch {row['best_epoch']} ({rule}; noisy-validation {args.method} loss {row['val_loss']:.4f})")
    if row["switches"]:
        print(f"  protocol {row['protocol']}: {row['switches']}")
    print(f"  clean test accuracy {row['test_acc']:.2f}%  (balanced {row['test_bal_acc']:.2f}%)  "
          f"last epoch {row['last_test_acc']:.2f}%  warm start {row['warmup_test_acc']:.2f}%")
    if row["oracle"]:
        print("  oracle: its epoch was kept by clean test accuracy, as the authors' script did: no result")
    print(f"  realised noise rate {100 * row['noise_rate']:.2f}%  noise hash {row['noise_hash']}")
    if row["estimated_transition"]:
        print(f"  estimated T {row['estimated_transition']}")
    print(f"  wall {row['wall_s']:.1f}s on {row['device']}" + (f" at {row['precision']}" if row["precision"] != "fp32"
                                                                  else ""))
    pinned = " (pinned by the environment)" if row["pins"] and row["numerics"] != "portable" else ""
    print(f"  float order: {row['numerics']} numerics at {row['threads']} thread{'s' * (row['threads'] != 1)}: ATen "
          f"{row['cpu_capability']}, MKL {row['mkl_cbwr'] or '-'}{pinned}")
    print(f"  result row: {Path(args.results) / 'trials' / (row['trial_id'] + '.parquet')}")
    return 0


def cmd_datasets(args: argparse.Namespace) -> int:
    # torch loads with the commands that need it: `bench --help` and a mistyped flag answer at once
    from bench.data import get_dataset, registry

    root = _data_root(args)
    if args.prepare:
        if args.source is None:
            raise UserError(f"--prepare {args.prepare} needs --from PATH: what to prepare it from (see `bench "
                            "datasets`'s source line for the dataset)")
        for line in get_dataset(args.prepare)(root).prepare(Path(args.source).expanduser()):
            print(line)
        return 0
    if args.download:
        for name in args.download:
            get_dataset(name)(root).download()
            print(f"{name}: files present and verified under {root}")
        return 0
    print(f"data root: {root}")
    width = max(map(len, registry()))
    for name, cls in registry().items():
        ds = cls(root)
        train, val, test = cls.split_sizes
        print(f"{name:{width}s} {ds.status():28s} C={cls.num_classes:<3d} {train}/{val}/{test}  model {cls.model}  "
              f"noise {', '.join(cls.noise_patterns) or '-'}")
        for line in ds.describe():
            print(f"{'':{width}s} {line}")
    return 0


def _metric(value: str) -> str:
    """`leaderboard --metric`: selected or last. The old name `best` is refused: it reads as the oracle rule."""
    if value == "best":
        raise argparse.ArgumentTypeError(
            "'best' is now called 'selected' (the checkpoint selected on the noisy validation set; the best-test "
            "epoch, an oracle, is in `bench report`'s selection_rules.csv)")
    if value not in ("selected", "last"):
        raise argparse.ArgumentTypeError(f"expected selected or last, got {value!r}")
    return value


class _later:  # noqa: N801 - read as a function at each command's `set_defaults`
    """The command `name` of `module`, imported only when the command runs (`load`, while signals are held)."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def load(self) -> Callable[[argparse.Namespace], int]:
        return getattr(importlib.import_module(self.module), self.name)


# The manual's pages (docs/NAME.md) each command's --help names for depth; others name the index, docs/README.md.
HELP_PAGES = {"trial": ("running", "protocol"), "datasets": ("datasets",), "methods": ("methods", "fidelity"),
              "run": ("running", "cluster", "failures"), "labels": ("reports",), "results": ("running", "reports"),
              "status": ("running",),
              "report": ("reports",), "leaderboard": ("reports",), "sync-mlflow": ("running",), "ui": ("running",),
              "calibrate": ("calibrate", "running"), "verify": ("fidelity", "running"), "check": ("extending",)}


def _name_pages(sub: argparse._SubParsersAction) -> None:
    for name, command in sub.choices.items():
        pages = ", ".join(f"docs/{page}.md" for page in HELP_PAGES.get(name, ("README",)))
        command.epilog = f"More in the repository's manual: {pages}."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench",
        description="Benchmark learning with noisy labels: the L_DMI paper's protocol, grids on Ray Tune, "
        "results in parquet and MLflow.",
        epilog="The README is the tour; the manual is docs/README.md in the repository, and `bench COMMAND --help` "
        "names the page for each command.",
    )
    parser.add_argument("--version", action="version", version=f"bench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_trial(sub)
    p = sub.add_parser("datasets", help="list the datasets and whether their files are present")
    p.add_argument("--download", nargs="+", metavar="NAME", default=None,
                   help="download these datasets' published files (needs internet) and verify checksums")
    p.add_argument("--prepare", metavar="NAME", default=None,
                   help="assemble what a dataset's owners publish only as parts (red_mini_imagenet: its web images "
                        "from the URL list; webvision_mini_ilsvrc12: ILSVRC-2012's validation images sorted by class)")
    p.add_argument("--from", dest="source", metavar="PATH", default=None,
                   help="with --prepare: red_mini_imagenet: mini-imagenet-annotations.json; webvision_mini_ilsvrc12: "
                        "the folder of ILSVRC2012_val_*.JPEG and ILSVRC2012_devkit_t12/")
    _add_data_root(p)
    p.set_defaults(func=cmd_datasets)

    p = sub.add_parser("methods", help="list the methods with their papers and hyper-parameters (default, type, "
                       "range or choices)")
    p.add_argument("--references", action="store_true",
                   help="print each method's fidelity record instead: the released code it was checked against "
                        "and every remaining difference")
    p.add_argument("--markdown", action="store_true", help="with --references: as Markdown (docs/fidelity.md)")
    p.add_argument("--update", type=Path, metavar="PAGE",
                   help="with --references: rewrite the generated part of PAGE (docs/fidelity.md) and keep what is "
                        "written by hand below its marker")
    p.set_defaults(func=_later("bench.cli.methods", "cmd_methods"))

    _add_run(sub)
    add_calibrate(sub, _add_data_root)
    _add_labels(sub)
    _add_results_commands(sub)
    _name_pages(sub)
    return parser


def _add_trial(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trial", help="run one trial in-process (no Ray) and write its result row")
    p.add_argument("--dataset", required=True, help="dataset name (see `bench datasets`)")
    p.add_argument("--method", required=True, help="method name (see `bench methods`)")
    p.add_argument("--noise", required=True,
                   help="noise pattern: uniform, symmetric, idn (instance-dependent), the dataset's own (e.g. "
                        "case3), or transition")
    p.add_argument("--r", type=number, required=True, help="noise level in [0, 1]")
    p.add_argument("--seed", type=integer, default=0, help="seeds the noise, the model and the data order")
    p.add_argument("--transition", type=Path, default=None,
                   help="explicit transition matrix T (CSV rows or a JSON list of rows; rows = true class)")
    p.add_argument("--epochs-warmup", type=integer, default=None, help="CE warm-start epochs (default: the paper's)")
    p.add_argument("--epochs", type=integer, default=None, help="method-stage epochs (default: the paper's)")
    p.add_argument("--lr", type=number, default=None, help="method-stage learning rate (default: the paper's)")
    p.add_argument("--batch-size", type=integer, default=None, help="method-stage batch size (default: the paper's)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a method hyper-parameter (repeatable), e.g. --param q=0.7")
    p.add_argument("--train-subset", type=integer, default=None, help="use only the first N training examples")
    p.add_argument("--model", help="the network, where not the dataset's: e.g. linear_probe (a linear head on a "
                   "frozen torchvision backbone's cached features)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help="an option of --model "
                   "(repeatable): e.g. backbone=resnet18, weights=/path/resnet18.pth (or weights=random)")
    p.add_argument("--protocol", default="bench",
                   help="bench (default: the paper's protocol done right), authors (as the paper's scripts ran it), "
                        "bench+SWITCH[+SWITCH...] or authors-SWITCH[-SWITCH...] (docs/fidelity.md lists each "
                        "dataset's switches)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--precision", default="fp32",
                   help="fp32 (default; TF32 matrix units on CUDA) or bf16 (forward passes under bf16 autocast)")
    p.add_argument("--numerics", default="native",
                   help="native (default: the kernels this CPU picks) or portable (AVX2 kernels and MKL's "
                        "COMPATIBLE branch, pinned before torch loads: the same bits on any x86-64 CPU; "
                        "docs/fidelity.md)")
    p.add_argument("--threads", type=integer, default=1,
                   help="the trial's intra-op threads (default 1; part of its float order and its identity: a "
                        "grid gives each trial its resources.cpu)")
    p.add_argument("--results", default="results", help="results folder (default: ./results)")
    p.add_argument("--experiment", default="adhoc", help="experiment name recorded in the row")
    _add_data_root(p)
    p.set_defaults(func=cmd_trial, first=lambda args: _param_texts(args.method, args.param))


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run an experiment grid (tune_configs/*.yaml) with Ray Tune",
                       description="Run the trials of an experiment file that have no result row yet.")
    p.add_argument("config", help="experiment file, e.g. tune_configs/demo.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="change a key of the file, the value in YAML (repeatable): --set r=[0.2,0.4] "
                        "--set methods.dmi.lr=1e-5; a grid changed this way gets its own name (<name>-<hash>, "
                        "or --set name=NAME) and results folder")
    p.add_argument("--methods", default=None, metavar="A,B",
                   help="run only these methods (the file's settings where it has them, else the defaults)")
    p.add_argument("--seeds", default=None, metavar="S,S", help="run these seeds, e.g. --seeds 0,1")
    p.add_argument("--results", default=None, help="results folder or pyarrow URI (default: results/<name>)")
    p.add_argument("--address", default=None, help="Ray cluster address (default: start Ray locally)")
    p.add_argument("--dry-run", action="store_true", help="print the grid, the trials and the work; run nothing")
    p.add_argument("--max-concurrent", type=integer, default=None, help="at most N trials at once")
    p.add_argument("--mlflow-uri", default=None,
                   help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite inside the results folder)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow (parquet only)")
    p.add_argument("--cpus-per-trial", type=number, default=None,
                   help="override resources.cpu (each trial's CPUs and intra-op threads: another float order, so "
                        "other trial ids)")
    p.add_argument("--numerics", default=None, choices=numerics.NUMERICS,
                   help="the grid's numerics, as --set numerics=...: native (the file's default) or portable (the "
                        "same bits on any x86-64 CPU: its own grid name and trial ids)")
    p.add_argument("--gpus-per-trial", type=number, default=None,
                   help="override resources.gpu (> 0 runs on cuda, 0 on the CPU); fractions share a GPU")
    p.add_argument("--retries", type=integer, default=None,
                   help="retries of a trial whose worker died (a lost node, an out-of-memory kill; default 2); an "
                        "error in a trial's code is not retried: its row is failed, with the reason")
    p.add_argument("--num-cpus", type=integer, default=None, help="CPUs of the local Ray (default: all)")
    p.add_argument("--executor", default=None, metavar="auto|solo|pack[:K]|streams[:K]|NAME[:K]",
                   help="how trials train together: auto (default: the executor and trials a unit "
                        "that the executor table gives for the model and GPU kind: on CUDA, packs that fill every "
                        "GPU Ray counts, at most 256 a pack; solo on a CPU), solo, or an executor by name (pack, "
                        "streams, or a $BENCH_PLUGINS one) with at most K trials a unit (no K: as many as its "
                        "memory estimate allows)")
    p.add_argument("--pack", default=None,
                   help="--executor's older name: auto, off (= solo) or N (= pack:N)")
    p.add_argument("--yes", action="store_true",
                   help=f"run a grid of more than {GRID_LIMIT:,} trials (without it such a grid is refused)")
    p.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)  # Ray Tune's habit: `_run_flags`
    _add_data_root(p)
    p.set_defaults(func=_later("bench.cli.run", "cmd_run"), needs=("ray", "pyarrow", "polars"), leaves_at_once=True,
                   first=_run_flags)


def _run_flags(args: argparse.Namespace) -> None:
    """`bench run`'s flags and file, as far as they are checked without the registries, Ray or torch: a mistake
    answers in a fraction of a second. `--resume` (a Ray Tune habit): one line that a relaunch resumes; the counts
    and shares, each one line when out of range; the experiment file, readable."""
    if args.resume:
        raise UserError("bench run has no --resume: run the same command again and it resumes (trials with a result "
                        "row are skipped, those cut off continue from their last epoch checkpoint); drop --resume")
    for flag, value in (("--max-concurrent", args.max_concurrent), ("--retries", args.retries)):
        if value is not None and value < (1 if flag == "--max-concurrent" else 0):
            raise UserError(f"{flag} must be {'>= 1' if flag == '--max-concurrent' else '>= 0'}, got {value}")
    if args.cpus_per_trial is not None and not (math.isfinite(args.cpus_per_trial) and args.cpus_per_trial > 0):
        raise UserError(f"--cpus-per-trial must be a finite number > 0, got {args.cpus_per_trial}")
    if args.gpus_per_trial is not None and not (math.isfinite(args.gpus_per_trial) and args.gpus_per_trial >= 0):
        raise UserError(f"--gpus-per-trial must be a finite number >= 0, got {args.gpus_per_trial}")
    if args.num_cpus is not None and args.num_cpus < 1:
        raise UserError(f"--num-cpus must be >= 1, got {args.num_cpus}")
    read_text_file(Path(args.config), "experiment file")  # the one line `bench.grid.files` would give, seconds later


def _add_labels(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "labels", help="write the exact noisy train and validation labels of a (dataset, noise, r, seed) as parquet, "
        "with the hash the result rows record")
    p.add_argument("--dataset", required=True, help="dataset name (see `bench datasets`)")
    p.add_argument("--noise", required=True, help="noise pattern (as for `bench trial`)")
    p.add_argument("--r", type=number, required=True, help="noise level in [0, 1]")
    p.add_argument("--seed", type=integer, default=0, help="the trial seed (it seeds the noise)")
    p.add_argument("--transition", type=Path, default=None,
                   help="explicit transition matrix T (CSV rows or a JSON list of rows; rows = true class)")
    p.add_argument("--protocol", default="bench",
                   help="whose labels: bench (default: drawn by a generator keyed by the cell) or authors (as the "
                        "paper's scripts draw them, where the dataset has script_noise), as for `bench trial`")
    p.add_argument("--out", required=True, help="the parquet file to write")
    _add_data_root(p)
    p.set_defaults(func=_later("bench.cli.labels", "cmd_labels"), needs=("pyarrow",))


def _add_results_commands(sub: argparse._SubParsersAction) -> None:
    """The commands that read a results folder (and no data)."""
    p = sub.add_parser("results", help="print the merged result table, or write it to one parquet file")
    p.add_argument("results", help="results folder")
    p.add_argument("--wide", action="store_true",
                   help="every column of the rows, one line per trial, texts cut at 40 characters (default: the "
                        "columns that fit a terminal; --out FILE keeps every value whole)")
    p.add_argument("--out", default=None, help="write all rows to this .parquet (or .csv) file")
    p.add_argument("--by-node", action="store_true",
                   help="one line per node and device that ran trials: how many, their statuses, mean wall time and "
                        "test accuracy (to find a bad node)")
    p.set_defaults(func=_later("bench.cli.results", "cmd_results"), needs=("pyarrow", "polars"))

    p = sub.add_parser("status", help="each grid of a results folder: its trials with a row, failed and to go, "
                       "the ETA of a running `bench run` and who runs it (from any shell that sees the folder)")
    p.add_argument("results", help="results folder")
    p.set_defaults(func=_later("bench.cli.results", "cmd_status"), needs=("pyarrow", "polars"))

    p = sub.add_parser(
        "report", help="leaderboards (Markdown, LaTeX, CSV, one HTML page), plots, paper vs measured, and the "
        "diagnostics: three checkpoint rules, memorisation curves, detection quality, cost, label hashes")
    p.add_argument("results", nargs="+", help="results folder (holds trials/*.parquet); several: one report over "
                   "their rows, a trial found in two of them once (two different rows of one trial are refused)")
    p.add_argument("--out", default=None, help="output folder (default: RESULTS/report; needed for several folders)")
    p.set_defaults(func=_later("bench.cli.report", "cmd_report"), needs=("polars", "scipy", "matplotlib"))

    p = sub.add_parser("leaderboard", help="print the leaderboard as an aligned terminal table")
    p.add_argument("results", help="results folder (holds trials/*.parquet)")
    p.add_argument("--metric", type=_metric, default="selected",  # the keys of bench.report.analysis.METRICS
                   help="accuracy at the checkpoint selected on the noisy validation set (selected, default) or "
                        "at the last epoch (last)")
    p.set_defaults(func=_later("bench.cli.report", "cmd_leaderboard"), needs=("polars", "scipy"))

    p = sub.add_parser("sync-mlflow", help="log the result rows that MLflow lacks (idempotent)")
    p.add_argument("results", help="results folder")
    p.add_argument("--mlflow-uri", default=None, help="MLflow store (default as for `bench run`)")
    p.set_defaults(func=_later("bench.cli.mlflow", "cmd_sync_mlflow"), needs=("mlflow", "polars"))

    p = sub.add_parser("verify", help="re-run trials from their rows and compare every figure bit for bit, naming "
                       "the first that differs and the provenance (CPU kernels, pins, threads, versions) that does")
    p.add_argument("results", help="results folder")
    p.add_argument("--trial", action="append", default=[], metavar="ID",
                   help="verify this trial (repeatable; default: every row of the folder)")
    _add_data_root(p)
    p.set_defaults(func=_later("bench.cli.verify", "cmd_verify"), needs=("pyarrow", "polars"))

    p = sub.add_parser("check", help="check plug-ins' contracts: registered, described, a tiny trial, unit or report, "
                       "their rows and MLflow params read back, the layers")
    p.add_argument("paths", nargs="*", metavar="PATH", help="a plug-in folder, a file of the checkout, or the checkout "
                   "(default: the $BENCH_PLUGINS folders, else the checkout)")
    p.set_defaults(func=_later("bench.cli.check", "cmd_check"), needs=("mlflow", "polars"))

    p = sub.add_parser("ui", help="serve the MLflow UI of a results folder on 127.0.0.1")
    p.add_argument("results", help="results folder")
    p.add_argument("--port", type=integer, default=5000)
    p.add_argument("--mlflow-uri", default=None, help="MLflow store (default as for `bench run`)")
    p.set_defaults(func=_later("bench.cli.mlflow", "cmd_ui"), needs=("mlflow",))


def main(argv: list[str] | None = None) -> int:
    with output.prepared() as errors, _terminable():  # closed or refusing stdout / stderr: bench.cli.output
        try:
            return _main(argv, errors)
        except output.Unwritable as e:  # `> /dev/full`: one line where it can go (`bench run` goes on instead)
            output.refused(e, errors)
            return EXIT_USAGE
        except KeyboardInterrupt as e:  # while the command line was read
            return _interrupted(e, errors)


def _interrupted(e: KeyboardInterrupt, errors: TextIO | None) -> int:
    signum = getattr(e, "signum", signal.SIGINT)
    print(f"bench: interrupted ({signal.Signals(signum).name}); run the same command again to go on", file=errors)
    if getattr(e, "at_once", False):  # a Ray start cut short: its C++ core may abort at the interpreter's exit
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(128 + signum)
    return 128 + signum


@contextlib.contextmanager
def _terminable() -> Iterator[None]:
    """SIGTERM stops every command as Ctrl-C does (`KeyboardInterrupt`: one line, exit 143), not by its default
    action (no line, and a `bench trial` or a dry run cut wherever it was); `bench run` and `bench ui` hold it in
    their own way while they run (bench.grid.stop, bench.store.mirror.serve)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# The signals `_terminated` saw in this command (a KeyboardInterrupt it raised can be lost, below), and, while the
# command's modules import (`_holding_signals`), those it holds instead of raising.
_seen: list[int] = []
_held: list[int] | None = None


def _terminated(signum: int, frame: object) -> None:
    _seen.append(signum)
    if _held is not None:
        _held.append(signum)
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def _holding_signals() -> Iterator[None]:
    """SIGTERM and SIGINT while the command's modules import are held, then raised once the imports are done. Raised
    inside a C extension's module init (Cython's, where it patches collections.abc), the KeyboardInterrupt was written
    as "Exception ignored" and lost, and the command ran to its end with exit 0 (a dry run printed its plan;
    tests/grid/test_signals_at_every_moment.py). `_main` keeps a check for signals lost elsewhere."""
    global _held
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _terminated) if main_thread else None
    _held = []
    try:
        yield
    finally:
        held, _held = _held, None
        if main_thread:
            signal.signal(signal.SIGINT, previous)
    if held:
        raise Interrupted(held[0])


def _main(argv: list[str] | None, errors: TextIO | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if hasattr(args, "data_root") and args.data_root is None:
        args.data_root = default_data_root()
    _seen.clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            if first := getattr(args, "first", None):  # a command's checks that need no import: a typo answers at once
                first(args)
            with _holding_signals():
                for package in getattr(args, "needs", ()):  # before anything is written
                    importlib.import_module(package)
                command = args.func.load() if isinstance(args.func, _later) else args.func
            code = int(command(args) or 0)
            if code == 0 and _seen:  # a signal whose KeyboardInterrupt some library swallowed: the command was stopped
                raise Interrupted(_seen[0])
            if argv is None and getattr(args, "leaves_at_once", False):  # this process is the command: `leave`
                leave(code)
            return code
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if missing not in OPTIONAL:
            raise
        print(f"bench: error: `bench {args.command}` needs {missing}, which is not installed here; install bench with "
              "its dependencies (pip install -e .)", file=errors)
        return EXIT_USAGE
    except UserError as e:
        print(f"bench: error: {e}", file=errors)
        return EXIT_USAGE
    except KeyboardInterrupt as e:  # Ctrl-C, or a signal `bench run` holds (bench.grid.stop.Interrupted)
        return _interrupted(e, errors)
    except BrokenPipeError:  # `bench datasets | head`: the reader left; say nothing more
        output.silence_stdout()  # keeps the interpreter's final flush quiet
        return 0


def leave(code: int) -> NoReturn:
    """End the process with `code` once everything it wrote is out: its lines flushed, its threads joined and its exit
    hooks run (Ray's, MLflow's, logging's), as at the interpreter's own exit, but without what follows them: the
    teardown of every module and object, which with torch, Ray, MLflow and polars loaded took up to 7 s after a grid's
    last line on the 2-core machine (benchmarks/README.md, `grid_overhead.py`). Every file of a run is closed
    before its command returns (rows and MLflow are written by then; `tests/cli/test_run_exit.py`), so nothing is lost.
    Only for a command this process was started for (`main()` without arguments): in-process callers, as tests,
    get the code back."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or refusing stream (bench.cli.output): its lines are lost
            stream.flush()
    threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter runs first at exit: joins threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
