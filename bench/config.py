"""The ground floor: `UserError`, plug-in discovery, the data root, a stage's `Schedule`, reading a user's file.

The ground floor every other module stands on: the one error users see (`UserError`, exit code 2), plug-in
discovery and lookup, the data root, a stage's optimiser schedule (`Schedule`), reading a user's text file.
A trial's configuration and identity are `bench.trial`'s."""

from __future__ import annotations

import dataclasses
import difflib
import errno
import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class UserError(Exception):
    """Bad input (unknown name, impossible value, missing data): shown as one line, exit code 2."""


class FolderFull(UserError):
    """The results folder's disk is full (or its quota spent): `bench run` ends the grid."""


FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(error: BaseException | None) -> bool:
    """Whether `error` (or an error it was raised from) is a full disk or an exceeded quota, also as pyarrow words it
    (the errno in the message only). Never curable by a retry: the next write fails the same way."""
    for _ in range(8):  # an error of Ray's or Ray Tune's may wrap it
        if error is None:
            return False
        if isinstance(error, OSError) and (error.errno in FULL or any(os.strerror(c) in str(error) for c in FULL)):
            return True
        error = error.__cause__ or error.__context__
    return False


EXIT_USAGE = 2

# [0-9], never \d: a str pattern's \d is every Unicode digit, as int() and float() take them ('٣' is 3 to both) and
# str.isdigit() says '²' is one (which int() then refuses with a traceback).
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)",
                     re.IGNORECASE)


def integer(text: str) -> int:
    """The one way bench reads an integer a user wrote (a flag, a list file's label, an environment variable, a
    table's count): ASCII digits with an optional sign, blanks around them aside; else ValueError. (int() alone also
    takes '٣', '1_0' and 5,000-digit numbers.) Named for argparse, which says "invalid integer value"."""
    if not isinstance(text, str) or not _INTEGER.fullmatch(text.strip()):
        raise ValueError(f"not an integer in ASCII digits: {str(text)[:40]!r}")
    return int(text)


def number(text: str) -> float:
    """The one way bench reads a real number a user wrote: ASCII digits, a point, an exponent (or the words inf and
    nan, so that the caller's own check names them: "must be finite"); else ValueError."""
    if not isinstance(text, str) or not _NUMBER.fullmatch(text.strip()):
        raise ValueError(f"not a number in ASCII digits: {str(text)[:40]!r}")
    return float(text)


def whole_number(value: object, what: str, low: int, high: int, fix: str = "") -> int:
    """A count or a size the user gave (text, or an int read from YAML) as an int in [low, high], else one
    `UserError` naming `what`, the bounds and `fix`."""
    try:
        n = value if isinstance(value, int) and not isinstance(value, bool) else integer(value)  # type: ignore[arg-type]
    except ValueError:
        n = None
    if n is None or not low <= n <= high:
        raise UserError(f"{what} must be a whole number from {low:,} to {high:,} in ASCII digits, got "
                        f"{str(value)[:40]!r}" + (f"; {fix}" if fix else ""))
    return n


def discover(base: type, places: tuple[str, ...]) -> dict[str, Any]:
    """The one plug-in mechanism (methods, datasets, models): every subclass of `base` with a `name`, defined in
    one of `places` (a module, or a package: each of its modules) or in a plug-in file, by name. Adding a method,
    a dataset or a model is adding one file: under `baselines/` or `datasets/`, or in a folder named by
    `$BENCH_PLUGINS` (folders separated by the path separator, every `*.py` in them is read)."""
    import importlib
    import pkgutil

    modules = []
    for place in places:
        module = importlib.import_module(place)
        modules.append(module)
        if hasattr(module, "__path__"):  # a package: its modules
            modules += [importlib.import_module(f"{place}.{m.name}") for m in pkgutil.iter_modules(module.__path__)]
    modules += plugin_modules((base.__module__, *places))
    found: dict[str, Any] = {}
    for module in modules:
        for obj in vars(module).values():
            # Defined here, not imported (CIFAR-10N imports CIFAR-10's class, fw_oracle FW's).
            if isinstance(obj, type) and issubclass(obj, base) and obj.name and obj.__module__ == module.__name__:
                if obj.name in found and found[obj.name] is not obj:
                    raise UserError(f"two plug-ins are named {obj.name!r}: {found[obj.name].__module__} and "
                                    f"{module.__name__}; rename one")
                found[obj.name] = obj
    return dict(sorted(found.items()))


def lookup(found: dict[str, Any], kind: str, name: str) -> Any:
    """`found[name]` from a registry (`discover`'s result), or one line naming the choices."""
    if name not in found:
        raise UserError(f"unknown {kind} {name!r}{did_you_mean(name, found)}; choose from {', '.join(found)}")
    return found[name]


def did_you_mean(name: str, allowed: Iterable[str]) -> str:
    """" (did you mean 'X'?)" for the allowed name closest to a mistyped `name` (difflib's), else nothing:
    every "unknown ..." line, of a flag's value or an experiment file's key, says it the same way."""
    close = difflib.get_close_matches(name, list(allowed), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def read_text_file(path: Path, what: str) -> str:
    """A text file the user names (an experiment file, a transition matrix), or one line saying what is wrong."""
    if not path.is_file():
        raise UserError(f"{what}: no such file: {path}")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                        "save it as UTF-8") from None

PLUGINS_ENV = "BENCH_PLUGINS"
# What a plug-in (a method, a dataset) may import from bench: the interfaces, and the plug-in folders' shared helpers.
PLUGIN_INTERFACES = ("bench.methods", "bench.data", "bench.models", "bench.dmi", "bench.noise", "bench.schema",
                     "bench.protocol", "bench.download", "bench.config", "bench.baselines", "bench.datasets")


def imported_modules(file: Path) -> set[str]:
    """The absolute module names a Python file imports, read from its syntax without running it (`from a.b import c`
    names both `a.b` and `a.b.c`: c may be a module)."""
    import ast

    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (SyntaxError, ValueError) as e:
        raise UserError(f"${PLUGINS_ENV}: {file} is not valid Python ({e}); fix or remove it") from None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def plugin_files(kind: tuple[str, ...] = ()) -> list[Path]:
    """The files of the plug-in folders in `$BENCH_PLUGINS`; with `kind` (the module defining a registry's base
    class, e.g. "bench.report.panel", and the registry's own places), only those that import one of them or a module
    inside one, told from their syntax (`plugin_modules` imports them; `bench.declarations` reads them unrun)."""
    files = []
    for folder in filter(None, os.environ.get(PLUGINS_ENV, "").split(os.pathsep)):
        path = Path(folder).expanduser().absolute()
        if not path.is_dir():
            raise UserError(f"${PLUGINS_ENV}: {path} is not a folder of plug-in files")
        files += [file for file in sorted(path.glob("*.py"))
                  if not kind or any(m == k or m.startswith(k + ".") for m in imported_modules(file) for k in kind)]
    return files


def plugin_module_name(file: Path) -> str:
    """The module name a plug-in file is imported under: derived from its path, so that two folders may hold files
    of the same name."""
    return f"bench_plugin_{hashlib.sha256(str(file).encode()).hexdigest()[:8]}_{file.stem}"


def plugin_modules(kind: tuple[str, ...] = ()) -> list[Any]:
    """The modules of `plugin_files(kind)`, each file imported once (under `plugin_module_name`). With `kind`, only
    the files of that kind: a plug-in is imported by the registry of the kind it defines alone, so a report panel
    (polars, scipy) never loads in the training core."""
    import importlib.util
    import sys

    modules = []
    for file in plugin_files(kind):
        name = plugin_module_name(file)
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # before running it: dataclasses and pickling look the module up
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        modules.append(sys.modules[name])
    return modules


def default_data_root() -> Path:
    """`$BENCH_DATA`, else `~/.cache/bench/data`."""
    env = os.environ.get("BENCH_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "bench" / "data"


@dataclass(frozen=True)
class Schedule:
    """One training stage's optimiser and learning-rate schedule (the paper's per-dataset settings)."""

    optimizer: str  # "adam" or "sgd"
    lr: float
    epochs: int
    batch_size: int
    momentum: float = 0.0
    weight_decay: float = 0.0
    milestones: tuple[int, ...] = ()  # epochs (0-based) at which lr is multiplied by gamma
    gamma: float = 0.1

    def with_overrides(self, **overrides: Any) -> Schedule:
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})
