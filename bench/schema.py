"""Every key of an experiment file and every value of a trial: its type, its default, its check.

The one schema: every key of an experiment file and every value of a trial, with its type, its default and what
it allows, and the check that turns a bad value into one line naming where it came from and what is allowed.

A trial's values (r, seed, lr, batch size, epochs, training subset, device, precision, numerics, threads) are
declared once below and checked by the same code whether they come from an experiment file (`bench run`: "grid.yaml:
r: must be ...") or from a flag (`bench trial`: "--r must be ..."). Numeric ranges use the interval notation of method
hyper-parameters ("(0, 1]", "[0, inf)"), parsed by `Interval`.

Hand-written rather than pydantic (which Ray Tune installs): `bench trial` and benchmarks/pack_grid.py check trials
and read experiment files on a bare GPU box with torch, numpy and pyyaml only, so this module imports nothing
beyond the standard library; and the one-line errors are the product, which pydantic would word its own way
("Input should be greater than or equal to 0") for every key to be translated back. `TrialConfig` stays a plain
dataclass in `bench.trial` for the same reason: the training core imports only torch and numpy.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from bench.config import UserError

_INTERVAL = re.compile(r"^\s*([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])\s*$")


@dataclass(frozen=True)
class Interval:
    """A numeric range in interval notation: round brackets exclude a bound, square ones include it."""

    low: float
    high: float
    low_closed: bool
    high_closed: bool
    text: str

    @classmethod
    def parse(cls, text: str) -> Interval:
        m = _INTERVAL.match(text)
        if not m:
            raise ValueError(f"not an interval: {text!r} (write e.g. '(0, 1]' or '[0, inf)')")
        low, high = float(m.group(2)), float(m.group(3))
        if math.isnan(low) or math.isnan(high) or low > high:
            raise ValueError(f"not an interval: {text!r}")
        return cls(low, high, m.group(1) == "[", m.group(4) == "]", text.strip())

    def __contains__(self, value: float) -> bool:
        if math.isnan(value):
            return False
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return above and below


def shown(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


@dataclass(frozen=True)
class Value:
    """What one value allows: its type, and a range in interval notation (numbers) or a pattern (text);
    `words` says what is allowed where the type and range do not (text, mappings, lists)."""

    kind: type  # int, float, str, dict or list
    range: str = "(-inf, inf)"
    pattern: str | None = None
    words: str = ""

    def allowed(self, high: float | None = None) -> str:
        """In words: "an integer >= 1 and <= 4,000", "a finite number > 0.0", or `words`. `high` narrows the range
        (a training subset is at most the training split)."""
        if self.kind not in (int, float):
            return self.words
        interval = Interval.parse(self.range)
        if self.kind is float and high is None:  # as a person would say it: "positive", "in [0, 1]"
            if (interval.low, interval.low_closed, interval.high) == (0.0, False, math.inf):
                return "positive (a finite number > 0.0)"
            if math.isfinite(interval.low) and math.isfinite(interval.high):
                return f"a finite number in {interval.text}"
        top, top_closed = (high, True) if high is not None else (interval.high, interval.high_closed)

        def number(v: float) -> str:
            return f"{int(v):,}" if self.kind is int else str(float(v))

        bounds = []
        if math.isfinite(interval.low):
            bounds.append(f"{'>=' if interval.low_closed else '>'} {number(interval.low)}")
        if math.isfinite(top):
            bounds.append(f"{'<=' if top_closed else '<'} {number(top)}")
        noun = "an integer" if self.kind is int else "a finite number"
        return f"{noun} {' and '.join(bounds)}" if bounds else noun

    def problem(self, value: Any, high: float | None = None) -> str | None:
        """What is wrong with `value`, as the end of a sentence ("must be ...", "expected ..."); None if nothing."""
        if self.kind in (int, float):
            is_int = isinstance(value, int) and not isinstance(value, bool)
            if not (is_int or (self.kind is float and isinstance(value, float))):
                return f"expected {self.allowed(high) if self.kind is int else 'a number'}, got {shown(value)}"
            inside = value in Interval.parse(self.range) and (high is None or value <= high)
            if not inside or not (is_int or math.isfinite(value)):  # an int of any size: no float conversion
                return f"must be {self.allowed(high)}, got {value!r}"
            return None
        if not isinstance(value, self.kind):
            return f"expected {'text' if self.kind is str else self.words}, got {shown(value)}"
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            return f"{self.words}, got {value!r}"
        return None


@dataclass(frozen=True)
class Key:
    """One key of an experiment file: what its value allows, and whether the file must set it, may give a list
    of values (a grid axis: one value or a non-empty list of distinct ones), or else gets `default`."""

    value: Value
    required: bool = False
    axis: bool = False
    default: Any = None


# -- the values of one trial: keys of an experiment file and flags of `bench trial` alike ----------------------------
PROBABILITY = Value(float, "[0, 1]")  # a noise level r, an entry of T
# A seed is at most 2**53 - 1: exact as a float64 (YAML, JSON), and seed x 1000 + 999 (the warm start's and the
# method stage's own seeds, bench.exec.prepare) stays within torch's 64-bit generator seeds and parquet's int64.
SEED = Value(int, "[0, 9007199254740991]")
LEARNING_RATE = Value(float, "(0, inf)")
BATCH_SIZE = Value(int, "[1, inf)")
# The method stage's and the warm start's: the paper's longest schedule is 200; 10,000 is a typo's bound (1,000,000,000
# was accepted, and planned as a trial that would never end).
EPOCHS = Value(int, "[0, 10000]")
TRAIN_SUBSET = Value(int, "[1, inf)")
DEVICE = Value(str, pattern=r"cpu|cuda(:\d+)?", words="allowed: cpu, cuda (or cuda:N)")
# A name becomes a file or folder name (of at most 255 bytes), with suffixes: an experiment's gets "-<8 hex>" where
# the command line changes its grid, ".yaml", and Ray Tune's "-<date>-<time>".
NAME = Value(str, pattern=r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}",
             words="use letters, digits, '-', '_' and '.', at most 128 characters")
EXPERIMENT_NAME = Value(str, pattern=r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}",
                        words="use letters, digits, '-', '_' and '.', at most 100 characters (it names files)")
TEXT = Value(str, pattern=r".+", words="expected a non-empty string")
# The arithmetic of a trial's forward passes (`bench.trial.PRECISIONS`).
PRECISION = Value(str, pattern=r"fp32|bf16", words="must be fp32 or bf16")
# A trial's float order (`bench.numerics`): the kernels the machine picks, or the pinned ones; its intra-op threads.
NUMERICS = Value(str, pattern=r"native|portable", words="must be native or portable")
THREADS = Value(int, "[1, 1024]")

# `bench trial`: the TrialConfig field each flag sets, and what it allows.
TRIAL_FLAGS = {
    "r": ("--r", PROBABILITY),
    "seed": ("--seed", SEED),
    "lr": ("--lr", LEARNING_RATE),
    "batch_size": ("--batch-size", BATCH_SIZE),
    "epochs": ("--epochs", EPOCHS),
    "epochs_warmup": ("--epochs-warmup", EPOCHS),
    "train_subset": ("--train-subset", TRAIN_SUBSET),
    "device": ("--device", DEVICE),
    "protocol": ("--protocol", TEXT),
    "precision": ("--precision", PRECISION),
    "numerics": ("--numerics", NUMERICS),
    "threads": ("--threads", THREADS),
}

# -- an experiment file (see bench/grid/experiment.py for an example) -------------------------------------------------
EXPERIMENT = {
    "name": Key(EXPERIMENT_NAME, required=True),  # names the MLflow experiment and the default results folder
    "dataset": Key(TEXT, required=True),
    "noise": Key(TEXT, required=True, axis=True),
    "r": Key(PROBABILITY, required=True, axis=True),
    "seeds": Key(SEED, required=True, axis=True),  # or N, for seeds 0..N-1
    "methods": Key(Value(dict, words="a non-empty mapping: method name -> settings (e.g. ce: {})"), required=True),
    "epochs": Key(EPOCHS),
    "epochs_warmup": Key(EPOCHS),
    "train_subset": Key(TRAIN_SUBSET),
    "device": Key(DEVICE, default="cpu"),
    "resources": Key(Value(dict, words="a mapping {cpu: N, gpu: F}"), default={}),
    "max_concurrent": Key(Value(int, "[1, inf)")),
    "transition": Key(Value(list, words="a list of rows (a C x C matrix, rows = true class)")),
    "description": Key(Value(str, words="text"), default=""),
    # `bench.protocol`: bench (the default), authors, bench+SWITCH..., authors-SWITCH... (a grid axis)
    "protocol": Key(TEXT, axis=True, default=("bench",)),
    # fp32 (the default; TF32 matrix units on CUDA) or bf16 (forward passes under bf16 autocast); a grid axis
    "precision": Key(PRECISION, axis=True, default=("fp32",)),
    # native (the default: the kernels the machine picks) or portable (pinned: the same bits on every x86-64 CPU);
    # one for the whole grid, since its pins are set for the workers' processes (`bench.numerics`)
    "numerics": Key(NUMERICS, default="native"),
    # The network, where not the dataset's (`bench models`: e.g. linear_probe), and its options
    "model": Key(TEXT),
    "model_args": Key(Value(dict, words="a mapping: option -> value (e.g. {backbone: resnet18, weights: random})"),
                      default={}),
}
# Per trial; a fractional GPU share lets trials share a device.
RESOURCES = {"cpu": Key(Value(float, "(0, inf)"), default=1.0), "gpu": Key(Value(float, "[0, inf)"), default=0.0)}
# Per-method settings that are not the method's hyper-parameters (those are declared by the method).
METHOD_STAGE = {"lr": Key(LEARNING_RATE, axis=True), "batch_size": Key(BATCH_SIZE, axis=True),
                "epochs": Key(EPOCHS, axis=True)}
# Keys that belong to the whole experiment: they define the warm-start cell that methods share.
WHOLE_EXPERIMENT = ("epochs_warmup", "seed", "r", "noise")


def check_name(what: str, value: str) -> str:
    """A name that becomes a path component: letters, digits, '-', '_', '.', no separators and no '..'."""
    if not isinstance(value, str) or NAME.problem(value) or ".." in value:
        raise UserError(f"{what} {value!r} is not a safe name: use letters, digits, '-', '_' and '.' "
                        "(no path separators, no '..', at most 128 characters)")
    return value


# A grid this large is most likely a typo (seeds: 1000000); running it needs --yes.
GRID_LIMIT = 100_000
