"""The two protocols (`bench`, `authors`) and every switch that separates them.

Two protocols: `bench` (the paper's protocol done right, the default) and `authors` (the paper as its authors'
scripts ran it), and every choice that separates them as a named switch.

Each dataset declares, in its own file (`Dataset.authors_protocol`), the switches its scripts make and where they
make them (`Switch`: file and line); `authors` is all of them. A protocol is written as a spec:

    bench                                    no switch (today's protocol)
    authors                                  every switch the dataset declares
    bench+first_batch_selection              bench with the named switches on (one or more, joined by '+')
    authors-fixed_torch_seed                 authors with the named switches off (joined by '-')

so that each choice can be measured alone (on top of `bench`) or left out (from `authors`). A trial's identity holds
the switches it resolves to (none for `bench`: its trial ids are those it always had), and its row holds the spec and
the switches. What each switch does is the training core's (`bench.exec`), what it means is `SWITCHES` below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.config import UserError

if TYPE_CHECKING:  # imported where a tensor is scored: a dataset's declared switches are read without torch
    import torch

BENCH, AUTHORS = "bench", "authors"

# Where a switch acts: on the CE warm start, on the method stage, or on both. A switch acting on the warm start is part
# of its cache key and of the planner's cell (both from `bench.trial.TrialConfig.warm_start_cell`); one
# acting on the method stage alone leaves a trial sharing bench's cached warm start.
WARM, METHOD, BOTH = "warm start", "method stage", "both"


@dataclass(frozen=True)
class SwitchKind:
    """What a switch changes (`what`, in words) and where it acts (`acts`: WARM, METHOD or BOTH)."""

    acts: str
    what: str

    def __post_init__(self) -> None:
        if self.acts not in (WARM, METHOD, BOTH):
            raise ValueError(f"SwitchKind.acts is WARM, METHOD or BOTH, got {self.acts!r}")

    @property
    def on_warm_start(self) -> bool:
        return self.acts != METHOD


# Every switch a dataset may declare: name -> where it acts and what it changes (the setting each dataset gives it
# is its own).
SWITCHES = {
    "warmup_by_accuracy": SwitchKind(WARM, (
        "the CE warm start keeps the epoch of the best accuracy on the whole noisy validation set, ties to the "
        "later epoch (>=); its first epoch always counts (bench: the lowest CE)")),
    "first_batch_selection": SwitchKind(METHOD, (
        "the method stage keeps its epoch by the rule the method's script uses (`Selection` per method: the first "
        "validation batch in split order, loss or accuracy, strict; or CE of the softmax outputs; or, an oracle the"
        " row flags, clean test accuracy); the warm-started model competes as epoch 0 where the script saves it "
        "(bench: the lowest method loss on the whole noisy validation set)")),
    "optimizer_per_epoch": SwitchKind(BOTH, (
        "the optimiser is created anew at every epoch of every stage, its state (Adam's moments and step, SGD's "
        "momentum) lost (bench: one optimiser per stage; a method's own optimiser, T-revision's, is kept)")),
    "fixed_torch_seed": SwitchKind(BOTH, (
        "one torch seed (the setting) for initial weights, data order and dropout in every trial; `seed` draws only"
        " the noise (bench: the seed varies all of them)")),
    "script_noise": SwitchKind(BOTH, (
        "noisy labels drawn as the scripts draw them: NumPy's legacy RandomState(seed), one uniform per example in "
        "list order, training then validation (bench: a generator keyed by the cell)")),
    "script_model": SwitchKind(BOTH, (
        "the network as the scripts build it (the setting names the model; bench: the dataset's)")),
    "ce_is_warm_start": SwitchKind(METHOD, (
        "the CE row is the warm start itself, no CE method stage (bench: warm start + a CE stage)")),
    "dmi_script_form": SwitchKind(METHOD, (
        "L_DMI as the script computes it, -log(|det M| + 1e-3) in float32, M = onehot^T softmax summed ('sum') or "
        "averaged ('mean') over the batch (bench: -log|det U| in float64)")),
    "warmup_batch_size": SwitchKind(WARM, (
        "the warm start's batch size as the script sets it (bench: the paper's stated 128)")),
    "script_transform": SwitchKind(BOTH, (
        "the inputs as the scripts' torchvision transforms make them (the setting, per dataset: fixed normalisation"
        " constants, padding before normalising, resizing, rotation; bench: the dataset's own)")),
    "vocabulary_order": SwitchKind(BOTH, (
        "the vocabulary numbered as the script's dictionary numbers it (the setting: 'alphabetical', the script's "
        "spelling of each word), so that each word gets the script's embedding row (bench: by frequency)")),
    "ce_summed": SwitchKind(WARM, (
        "the CE warm start's loss summed over the batch, not averaged (bench: the mean)")),
    "script_stream": SwitchKind(BOTH, (
        "data order, dropout and every loader's draws taken from torch's one global generator as the script's "
        "DataLoaders take them (each iterator a base-seed draw, a shuffled one also its sampler's seed), the method "
        "stage continuing the stream the warm start left, as the script runs its stages in one process, its test "
        "passes drawing too (the setting: how many, where); the stream starts from the torch seed itself, where a "
        "script seeds nothing the seed its run needs, declared; such a trial trains alone, not in a pack (bench: the "
        "order from the stage's own generator, the warm start seeded from 1000 x seed, the method stage re-seeded)")),
    "full_float32": SwitchKind(BOTH, (
        "on CUDA, float32 convolutions and matrix products in full float32 (TF32 off for both: torch.backends.cuda."
        "matmul and cudnn), L_DMI's float32 product included, as the scripts' GPUs computed them; on a CPU nothing "
        "changes (bench: TF32 on unless BENCH_TF32=0)")),
}


@dataclass(frozen=True)
class Selection:
    """How a stage keeps its epoch: by the method's `loss` (lowest), by `accuracy` (highest) or by `softmax_ce`
    (lowest: cross entropy applied to the softmax outputs, as CIFAR-10's LCCN.py validates, summed over batches of
    `batch` as its loop sums batch means; None: one mean), on the noisy validation set (`on="validation"`, its first
    `first` examples in split order, None: the whole set) or on the clean test set (`on="test"`: an oracle, which a
    row flags), ties to the later epoch or not (`ties`); `initial`: whether the warm-started model competes as epoch
    0. `bench`: the lowest loss on the whole validation set, strict, the warm-started model competing."""

    by: str = "loss"
    first: int | None = None
    ties: bool = False
    on: str = "validation"
    initial: bool = True
    batch: int | None = None

    def __post_init__(self) -> None:
        if self.by not in ("loss", "accuracy", "softmax_ce"):
            raise ValueError(f"Selection.by is 'loss', 'accuracy' or 'softmax_ce', got {self.by!r}")
        if self.on not in ("validation", "test"):
            raise ValueError(f"Selection.on is 'validation' or 'test', got {self.on!r}")

    def __repr__(self) -> str:
        """As the dataclass's, with `on`, `initial` and `batch` only where they are not their defaults: a setting's
        repr is part of a trial's identity, which the fields added later must not change."""
        later = {"on": "validation", "initial": True, "batch": None}
        shown = ["by", "first", "ties"] + [k for k, default in later.items() if getattr(self, k) != default]
        return f"Selection({', '.join(f'{k}={getattr(self, k)!r}' for k in shown)})"

    @property
    def oracle(self) -> bool:
        """Whether the rule reads the clean test set: its accuracy is then no result, and the row says so."""
        return self.on == "test"

    @property
    def own_pass(self) -> bool:
        """Whether the rule needs a pass of its own (test set, softmax CE), beyond the validation loss and accuracy
        every stage computes."""
        return self.oracle or self.by == "softmax_ce"

    def score(self, loss: np.ndarray, acc: np.ndarray) -> np.ndarray:
        """What the stage minimises: the loss, or minus the accuracy."""
        return np.asarray(loss if self.by != "accuracy" else -np.asarray(acc, dtype=float), dtype=float)

    def logit_score(self, logits: torch.Tensor, labels: torch.Tensor) -> float:
        """The score of an `own_pass` rule from one network's logits on its split (N x C) and their labels."""
        if self.first is not None:
            logits, labels = logits[: self.first], labels[: self.first]
        if self.by == "accuracy":
            return -100.0 * float((logits.argmax(1) == labels).double().mean())
        if self.by != "softmax_ce":
            raise ValueError(f"Selection.logit_score: by {self.by!r} is the method's loss, which the stage computes")
        import torch
        import torch.nn.functional as F

        probs = torch.softmax(logits.double(), dim=1)
        step = self.batch or len(labels)
        return sum(float(F.cross_entropy(probs[s : s + step], labels[s : s + step]))
                   for s in range(0, len(labels), step))

    def improves(self, score: np.ndarray, best: np.ndarray) -> np.ndarray:
        return score <= best if self.ties else score < best

    def words(self) -> str:
        what = {"loss": "lowest loss", "accuracy": "highest accuracy",
                "softmax_ce": "lowest CE of the softmax outputs"}[self.by]
        split = "clean test" if self.oracle else "validation"
        where = f"the first {self.first} {split} examples" if self.first else f"the whole {split} set"
        where += " (an oracle)" if self.oracle else ""
        start = "" if self.initial else ", the warm-started model not a candidate"
        return f"{what} on {where}, {'ties to the later epoch' if self.ties else 'strict'}{start}"


BENCH_SELECTION = Selection()
WARMUP_BY_ACCURACY = Selection(by="accuracy", ties=True)


@dataclass(frozen=True)
class Switch:
    """One choice of the authors' scripts on one dataset: the switch's `name` (a key of `SWITCHES`), where the
    scripts make it (`cite`: "Newbeeer/L_DMI, MR/main.py:190-203, commit 7d5e4bc"), what it does there (`what`), and
    its setting there (a `Selection` per method for first_batch_selection, "*" for the others; a seed; a model name;
    the L_DMI form; a (mean, std); a batch size)."""

    name: str
    cite: str
    what: str
    setting: Any = None

    def __post_init__(self) -> None:
        if self.name not in SWITCHES:
            raise ValueError(f"unknown switch {self.name!r}; known: {', '.join(SWITCHES)}")


def titan_xp_float32(cite: str) -> Switch:
    """The `full_float32` switch of a dataset the L_DMI scripts ran on CUDA (`cite`: where the script puts its model
    and L_DMI's product on the GPU): the paper ran them all on NVIDIA TITAN Xp GPUs (its section 5), which have no
    TF32 units, nor had the torch of 2019 (TF32 came with NVIDIA's Ampere GPUs and torch 1.7, both of 2020)."""
    return Switch("full_float32", cite,
                  "the script trains on CUDA, on the paper's NVIDIA TITAN Xp GPUs (Pascal; section 5: 'conduct all "
                  "experiments on NVIDIA TITAN Xp GPUs'): every float32 convolution and product, L_DMI's onehot^T "
                  "softmax included, in full float32, no TF32")


@dataclass(frozen=True)
class Protocol:
    """A trial's protocol: the spec as written and the switches it resolves to on the trial's dataset."""

    spec: str = BENCH
    switches: dict[str, Switch] = field(default_factory=dict)

    def on(self, name: str) -> bool:
        return name in self.switches

    def setting(self, name: str, default: Any = None) -> Any:
        return self.switches[name].setting if name in self.switches else default

    def selection(self, method: str) -> Selection:
        """The method stage's selection rule for `method`."""
        rules = self.setting("first_batch_selection")
        if rules is None:
            return BENCH_SELECTION
        return rules.get(method, rules.get("*", BENCH_SELECTION))

    def oracle(self, method: str) -> bool:
        """Whether `method`'s stage selects on the clean test set (`Selection.oracle`)."""
        return self.selection(method).oracle

    def warmup_selection(self) -> Selection:
        return WARMUP_BY_ACCURACY if self.on("warmup_by_accuracy") else BENCH_SELECTION

    def script_passes(self, where: str) -> int:
        """How many loader passes beyond its validation the script makes `where` ("warmup_epoch": after each CE
        epoch; "method_start": before the method stage's first validation), each an unshuffled loader's iterator
        taking its one base-seed draw from torch's global generator: its test passes (`script_stream`'s setting)."""
        return int((self.setting("script_stream") or {}).get(where, 0))

    def torch_seed(self, seed: int) -> int:
        """The seed of initial weights, data order and dropout: the trial's, or the script's fixed one."""
        return int(self.setting("fixed_torch_seed", seed))

    def names(self) -> list[str]:
        return sorted(self.switches)

    def warm_start_switches(self) -> list[str]:
        """The switches that change the CE warm start (part of its cache key, `SwitchKind.acts`): a trial with only
        method-stage switches shares bench's cached warm start."""
        return [name for name in self.names() if SWITCHES[name].on_warm_start]


_SPEC = re.compile(r"(bench|authors)((?:[+-][a-z][a-z0-9_]*)*)")


def resolve(spec: str, declared: dict[str, Switch], dataset: str) -> Protocol:
    """The switches `spec` turns on for a dataset declaring `declared`, or one line saying what is wrong."""
    spec = str(spec).strip()
    match = _SPEC.fullmatch(spec)
    if not match:
        raise UserError(f"protocol {spec!r}: write bench, authors, bench+SWITCH[+SWITCH...] or "
                        f"authors-SWITCH[-SWITCH...]; switches: {', '.join(SWITCHES)}")
    base, rest = match.groups()
    names = re.findall(r"([+-])([a-z][a-z0-9_]*)", rest)
    if base == AUTHORS and not declared:
        raise UserError(f"protocol {spec!r}: {dataset} declares no switches of its authors' scripts; use bench")
    chosen = dict(declared) if base == AUTHORS else {}
    for sign, name in names:
        if name not in SWITCHES:
            raise UserError(f"protocol {spec!r}: unknown switch {name!r}; switches: {', '.join(SWITCHES)}")
        if name not in declared:
            have = ", ".join(declared) or "none"
            raise UserError(f"protocol {spec!r}: {dataset}'s scripts make no {name!r} choice; its switches: {have}")
        if (sign == "+") != (base == BENCH):
            raise UserError(f"protocol {spec!r}: switches are added to bench with '+' and taken from authors with '-'")
        if sign == "+":
            chosen[name] = declared[name]
        else:
            chosen.pop(name, None)
    return Protocol(spec=spec, switches=chosen)


def canonical(spec: str) -> str:
    """The spec with its switches sorted (`bench+b+a` is `bench+a+b`): one name for one protocol in reports."""
    match = _SPEC.fullmatch(str(spec).strip())
    if not match:
        return str(spec)
    base, rest = match.groups()
    names = sorted(set(re.findall(r"[+-]([a-z][a-z0-9_]*)", rest)))
    sign = "+" if base == BENCH else "-"
    return base + "".join(sign + n for n in names)
