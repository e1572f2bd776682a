"""The `bench` command line. Bad input prints one line starting with "bench: error:" and exits with code 2,
having written nothing."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

from bench.config import EXIT_USAGE, TrialConfig, UserError, default_data_root, freeze_params


def _add_data_root(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-root", type=Path, default=None,
        help="folder holding the data sets (default: $BENCH_DATA, else ~/.cache/bench/data)",
    )


def _data_root(args: argparse.Namespace) -> Path:
    return args.data_root if args.data_root is not None else default_data_root()


def _parse_params(method: str, items: list[str]) -> dict[str, object]:
    """--param key=value pairs, each value converted to the type the method declares for it and checked."""
    from bench.methods import check_params, get_method

    params: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--param expects key=value, got {item!r}")
        params[key.strip()] = value.strip()
    return check_params(get_method(method), params, from_text=True)


def cmd_trial(args: argparse.Namespace) -> int:
    from bench import noise
    from bench.trainer import run_trial
    from bench.validate import check_data, check_results, check_trial

    transition = None
    noise_name = args.noise
    if args.transition is not None:
        transition = tuple(tuple(float(v) for v in row) for row in noise.read_transition_file(args.transition))
        noise_name = "transition"
    elif noise_name == "transition":
        raise UserError("--noise transition needs --transition FILE (a CSV or JSON matrix)")
    config = TrialConfig(
        dataset=args.dataset, method=args.method, noise=noise_name, r=args.r, seed=args.seed, lr=args.lr,
        batch_size=args.batch_size, epochs=args.epochs, epochs_warmup=args.epochs_warmup,
        method_params=freeze_params(_parse_params(args.method, args.param)), transition=transition,
        train_subset=args.train_subset, device=args.device, experiment=args.experiment,
    )
    check_trial(config)
    check_results(args.results)
    check_data([config.dataset], _data_root(args))
    row = run_trial(config, _data_root(args), results=args.results, log=lambda s: print(s, flush=True))
    print()
    print(f"trial {row['trial_id']}  status {row['status']}")
    print(f"  selected epoch {row['best_epoch']} (lowest noisy-validation {args.method} loss {row['val_loss']:.4f})")
    print(f"  clean test accuracy {row['test_acc']:.2f}%  (balanced {row['test_bal_acc']:.2f}%)  "
          f"last epoch {row['last_test_acc']:.2f}%  warm start {row['warmup_test_acc']:.2f}%")
    print(f"  realised noise rate {100 * row['noise_rate']:.2f}%  noise hash {row['noise_hash']}")
    if row["estimated_transition"]:
        print(f"  estimated T {row['estimated_transition']}")
    print(f"  wall {row['wall_s']:.1f}s on {row['device']}")
    print(f"  result row: {Path(args.results) / 'trials' / (row['trial_id'] + '.parquet')}")
    return 0


def cmd_datasets(args: argparse.Namespace) -> int:
    from bench.data import get_dataset, registry

    root = _data_root(args)
    if args.download:
        for name in args.download:
            get_dataset(name)(root).download()
            print(f"{name}: files present and verified under {root}")
        return 0
    print(f"data root: {root}")
    for name, cls in registry().items():
        ds = cls(root)
        train, val, test = cls.split_sizes
        print(f"{name:15s} {ds.status():28s} C={cls.num_classes:<3d} {train}/{val}/{test}  model {cls.model}  "
              f"noise {', '.join(cls.noise_patterns) or '-'}")
        for line in ds.describe():
            print(f"{'':15s} {line}")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from bench.methods import describe_params, registry

    width = max(map(len, registry())) + 1
    for name, cls in registry().items():
        flags = "  [uses the true T: privileged diagnostic]" if cls.uses_true_transition else ""
        packs = "  [packs on a GPU]" if cls(2).packable() else ""
        print(f"{name:{width}s} {cls.title}{flags}{packs}")
        print(f"{'':{width}s} {cls.paper}")
        for line in describe_params(cls):
            print(f"{'':{width}s} {line}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench",
        description="Benchmark learning with noisy labels: the L_DMI paper's protocol, grids on Ray Tune, "
        "results in parquet and MLflow.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("trial", help="run one trial in-process (no Ray) and write its result row")
    p.add_argument("--dataset", required=True, help="dataset name (see `bench datasets`)")
    p.add_argument("--method", required=True, help="method name (see `bench methods`)")
    p.add_argument("--noise", required=True,
                   help="noise pattern: uniform, symmetric, the dataset's own (e.g. case3), or transition")
    p.add_argument("--r", type=float, required=True, help="noise level in [0, 1]")
    p.add_argument("--seed", type=int, default=0, help="seeds the noise, the model and the data order")
    p.add_argument("--transition", type=Path, default=None,
                   help="explicit transition matrix T (CSV rows or a JSON list of rows; rows = true class)")
    p.add_argument("--epochs-warmup", type=int, default=None, help="CE warm-start epochs (default: the paper's)")
    p.add_argument("--epochs", type=int, default=None, help="method-stage epochs (default: the paper's)")
    p.add_argument("--lr", type=float, default=None, help="method-stage learning rate (default: the paper's)")
    p.add_argument("--batch-size", type=int, default=None, help="method-stage batch size (default: the paper's)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a method hyper-parameter (repeatable), e.g. --param q=0.7")
    p.add_argument("--train-subset", type=int, default=None, help="use only the first N training examples")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--results", default="results", help="results folder (default: ./results)")
    p.add_argument("--experiment", default="adhoc", help="experiment name recorded in the row")
    _add_data_root(p)
    p.set_defaults(func=cmd_trial)

    p = sub.add_parser("datasets", help="list the datasets and whether their files are present")
    p.add_argument("--download", nargs="+", metavar="NAME", default=None,
                   help="download these datasets' published files (needs internet) and verify checksums")
    _add_data_root(p)
    p.set_defaults(func=cmd_datasets)

    p = sub.add_parser("methods", help="list the methods with their papers and hyper-parameters (default, type, "
                       "range or choices)")
    _add_data_root(p)
    p.set_defaults(func=cmd_methods)

    for register in EXTRA_COMMANDS:
        register(sub, _add_data_root)
    return parser


# Commands contributed by other modules (the Ray runner, reports): each adds its sub-parser.
EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction, Callable[[argparse.ArgumentParser], None]], None]] = []


def _load_extra_commands() -> None:
    import importlib

    EXTRA_COMMANDS.clear()  # main() may run more than once in a process (tests)
    for module in ("bench.runner", "bench.report", "bench.labels"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            # On a bare GPU box (torch and numpy only) `bench trial`, `datasets` and `methods` still work; the
            # commands that need Ray, MLflow or polars are simply not offered.
            if e.name != module and (e.name or "").split(".")[0] not in {"ray", "mlflow", "polars", "scipy",
                                                                         "matplotlib"}:
                raise
            continue
        if mod.add_commands not in EXTRA_COMMANDS:  # main() may run more than once in a process (tests)
            EXTRA_COMMANDS.append(mod.add_commands)


def main(argv: list[str] | None = None) -> int:
    _load_extra_commands()
    parser = build_parser()
    args = parser.parse_args(argv)
    if hasattr(args, "data_root") and args.data_root is None:
        args.data_root = default_data_root()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            return int(args.func(args) or 0)
    except UserError as e:
        print(f"bench: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `bench datasets | head`: the reader left; say nothing more
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        return 0


if __name__ == "__main__":
    sys.exit(main())
