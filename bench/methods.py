"""The method interface every learning-with-noisy-labels method implements, and the registry that finds them.

A method is one class in one file (L_DMI in `bench/dmi.py`, every comparison method in `baselines/`). The
trainer runs the CE warm start, then calls the method's hooks:

* `setup(stage)` once after the warm start (FW estimates T here from the warm-started model; LCCN initialises its
  transition counts; a method with two networks copies the first);
* `train_loss(nets, batch)` for each training step; the default is `logits_loss(net(x), batch)`. VAT overrides
  it to perturb the input, LCCN to sample latent labels, Co-teaching to exchange small-loss samples between nets;
* `logits_loss(logits, batch)`: the training loss from the logits alone; the default is `loss(logits, y)`
  (peer loss overrides it to draw its random peers);
* `loss(logits, labels)` is the method's own objective; the trainer applies it to the whole noisy validation
  set to select the checkpoint (the paper's protocol: the method's loss, not accuracy);
* `end_epoch(epoch)` after each epoch (MentorNet moves its threshold, LCCN its counts);
* `network_optimizer(epoch)`: an optimiser of the method's own that trains the networks in that epoch instead of
  the stage's (T-revision's revision phase: Adam over the network and its slack); None, the default: the stage's;
* `lr_factor(epoch)` and `max_grad_norm()`, what a method asks of the stage's optimiser: a factor on the learning
  rate of an epoch (peer loss and CORES² divide it by 1 + their weight, as their code does) and a bound on the norm
  of the networks' gradient, clipped before each step (NCE+RCE's configs);
* `judged_noisy(logits, labels, epoch, index)`, for methods that flag or down-weight examples (Co-teaching's
  small-loss selection, MentorNet's weights, LCCN's latent labels, DivideMix's division, CORES²'s sieve):
  per-example noise scores and flags over the diagnostics' training sample, scored against the true flips in the
  epochs table (`bench.exec.diagnostics`).

Before any of that, when a trial or a grid is checked, `refuses(dataset, noise)` may say why the method cannot run
on that noise (FW with the true T on real noise, which has none).

A method whose step is "logits -> `logits_loss`" is `packable()`: many trials of it train as one stacked model
(`bench.exec.packed`). Its `loss` and `logits_loss` then take logits (..., B, C) and labels (..., B) with leading member
dimensions and return one loss per member (...); per-member state tensors (FW's T) are named in `member_state`
and stacked along the same leading dimension (`stack`). State the steps move (MentorNet's threshold) lives in the
stacked tensor, and goes back to each member after each epoch (`unstack`), where the diagnostics and checkpoints
read it.

Hyper-parameters are declared as data: `defaults` (the method's own paper's values; the type of each default is the
parameter's type), `dataset_defaults` (where the method's reference sets a parameter per dataset, e.g. VAT's eps:
dataset name -> the values that replace `defaults` there), `ranges` (interval notation for numeric ones, e.g.
"(0, 1]") and `choices` (the allowed values of categorical ones). A dataset's file may declare a method's defaults on
it too (`Dataset.method_defaults`: CIFAR-100, ours to adapt, gathers the references' CIFAR-100 settings there).
`defaults_on` merges them, lowest first: `defaults`, the method's `dataset_defaults`, the dataset's
`method_defaults`; an explicit value wins over all three. They arrive as keyword
arguments and are checked against that declaration (unknown name, wrong type, out of range: one line naming the
method, the parameter, the value and what is allowed), the same declaration `bench methods` prints. A `FromTrial`
default is the trial's to supply, at `setup` (Co-teaching's forget rate: the trial's noise rate, unless one is given).

Every method keeps its fidelity record as data: `reference`, the released code it was checked against ("owner/repo,
path/file.py, commit <sha>", several joined by "; "), and `differences`, each difference that remains ("what — why");
a method checked against no released code (bench's own, or one whose authors released none) says so, `original =
True`, and names no reference. `bench methods --references` prints the record; docs/fidelity.md is its Markdown form
(`--markdown`), tested to match.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from bench.config import Schedule, UserError, discover, integer, lookup, number
from bench.data import protocol_record
from bench.data import registry as dataset_registry
from bench.protocol import Protocol
from bench.schema import Interval

if TYPE_CHECKING:
    from bench.data import Dataset


@dataclass
class Batch:
    """One training step's data on the training device."""

    x: torch.Tensor  # model input, already transformed/augmented
    y: torch.Tensor  # noisy labels (int64)
    index: torch.Tensor  # positions of these examples in the training split (int64), for per-example state
    epoch: int  # 0-based epoch of the method stage
    # A pack's members' own generators (one per member, on the device); None in a solo trial (torch's default).
    generators: list[torch.Generator] | None = None

    def randint(self, high: int) -> torch.Tensor:
        """Uniform integers in [0, high), shaped like `y`: each member of a pack draws from its own generator, so
        its draws do not depend on its pack-mates; a solo trial draws from torch's default generator."""
        n = self.y.shape[-1]
        if self.generators is None:
            return torch.randint(high, (n,), device=self.y.device)
        return torch.stack([torch.randint(high, (n,), device=self.y.device, generator=g) for g in self.generators])


@dataclass
class StageContext:
    """What a method may look at before its stage starts (after the CE warm start)."""

    nets: list[nn.Module]  # nets[0] is the warm-started model
    num_classes: int
    noisy_train: torch.Tensor  # noisy labels of the training split, on the device
    predict_train: Callable[[], torch.Tensor]  # softmax outputs of nets[0] on the (unaugmented) training split
    true_transition: np.ndarray | None  # privileged: only methods with `uses_true_transition` may read it
    device: torch.device
    epochs: int  # length of the method stage
    # softmax outputs of nets[i] on the (unaugmented) training split: DivideMix divides each epoch by both nets
    predict_train_of: Callable[[int], torch.Tensor] | None = None
    # A fresh augmented view of the training examples at these indices (the dataset's `train_transform` drawn
    # again, on the device); None where the dataset does not augment or streams its inputs. DivideMix's two views.
    augment_train: Callable[[torch.Tensor], torch.Tensor] | None = None
    schedule: Schedule | None = None  # the method stage's (VolMinNet's T follows its learning-rate milestones)
    # The fraction of training labels the noise corrupts (`bench.noise.NoisyLabels.expected_rate`; NaN: unknown):
    # privileged, what Co-teaching's and JoCoR's authors call the noise rate and forget.
    noise_rate: float = math.nan
    # The trial's protocol (`bench.protocol`): the switches of the authors' scripts it turns on (None: bench's).
    protocol: Protocol | None = None


@dataclass(frozen=True)
class FromTrial:
    """A default the trial supplies when the method is set up (`StageContext`), for a parameter of type `kind`; an
    explicit value replaces it. Shown (and hashed into trial identities) as `words`."""

    kind: type
    words: str

    def __str__(self) -> str:
        return self.words


def per_example_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross entropy of each example, for logits (..., B, C) and labels (..., B): shape (..., B)."""
    flat = torch.nn.functional.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), reduction="none")
    return flat.view(labels.shape)


def at_label(values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """values[..., i, labels[..., i]]: each example's entry at its label."""
    return values.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def one_hot(labels: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """One-hot rows by comparison (F.one_hot reads the labels' maximum back to the host: a sync per step)."""
    return (labels.unsqueeze(-1) == torch.arange(num_classes, device=labels.device)).to(dtype)


class Method:
    """Base class: subclasses set `name`, `title`, `paper`, `defaults` and implement `loss`."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""  # its label in listings
    paper: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    dataset_defaults: ClassVar[dict[str, dict[str, Any]]] = {}  # dataset name -> defaults its reference sets there
    ranges: ClassVar[dict[str, str]] = {}  # numeric parameter -> interval, e.g. "(0, 1]", "[0, inf)"
    choices: ClassVar[dict[str, tuple[Any, ...]]] = {}  # categorical parameter -> its allowed values
    networks: ClassVar[int] = 1  # how many networks the trainer builds (Co-teaching: 2)
    uses_true_transition: ClassVar[bool] = False  # privileged information: flagged in results
    member_state: ClassVar[tuple[str, ...]] = ()  # tensor attributes that differ between members of a pack
    # On text, the method perturbs or mixes word embeddings through the model's `forward_embedded` (VAT, DivideMix):
    # a text model without one (the scripts' MR WordCNN) is refused before training.
    uses_embeddings: ClassVar[bool] = False
    # Bumped when a change to the method changes a trial's numbers with its parameters unchanged: part of trial
    # identity, so that rows made by the old code do not count as done.
    version: ClassVar[int] = 1
    reference: ClassVar[str] = ""  # "owner/repo, path/file.py, commit <sha>"; several joined by "; "
    differences: ClassVar[tuple[str, ...]] = ()  # every remaining difference from `reference`: "what — why"
    original: ClassVar[bool] = False  # True: no released code to cite, said explicitly rather than by a placeholder

    def __init__(self, num_classes: int, dataset: str = "", **params: Any) -> None:
        """`dataset`: the trial's dataset, whose defaults apply (`defaults_on`); `params`: the explicit values."""
        self.num_classes = num_classes
        self.params = {**defaults_on(type(self), dataset), **check_params(type(self), params)}
        for key, value in self.params.items():
            setattr(self, key, value)

    @classmethod
    def refuses(cls, dataset: type[Dataset], noise: str) -> str | None:
        """Why the method cannot run on this noise pattern of this dataset (None: it can). Asked when a trial or a
        grid is checked, before any warm start trains, so that `bench trial` and `bench run --dry-run` say so."""
        return None

    def setup(self, stage: StageContext) -> None:
        """Called once after the warm start, before the method stage."""

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def validation_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The checkpoint-selection criterion on the whole noisy validation set: by default the method's loss."""
        return self.loss(logits, labels)

    def logits_loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The training loss of a batch from its logits (leading member dimensions allowed when packable)."""
        return self.loss(logits, batch.y)

    def train_loss(self, nets: list[nn.Module], batch: Batch) -> torch.Tensor:
        return self.logits_loss(nets[0](batch.x), batch)

    def packable(self) -> bool:
        """Whether a training step is "logits of one network -> `logits_loss`", so that many trials can train as
        one stacked model. Methods with extra passes, two networks or per-example state say no."""
        return self.networks == 1 and type(self).train_loss is Method.train_loss \
            and type(self).network_optimizer is Method.network_optimizer

    def network_optimizer(self, epoch: int) -> torch.optim.Optimizer | None:
        """The optimiser that trains the networks in this epoch of the stage, where the method brings its own (it
        must hold the networks' parameters, and is saved in `state_dict`); None: the stage's."""
        return None

    @classmethod
    def stack(cls, members: list[Method]) -> Method:
        """One instance that computes the losses of several members (same class and hyper-parameters) at once:
        the first member with each `member_state` tensor stacked along a new leading dimension."""
        import copy

        group = copy.copy(members[0])
        for name in cls.member_state:
            setattr(group, name, torch.stack([getattr(m, name) for m in members]))
        return group

    def unstack(self, members: list[Method]) -> None:
        """The reverse of `stack`, on the group: each member's slice of the `member_state` the pack's steps have
        moved (MentorNet's threshold), given back to it, for what reads the members (diagnostics, checkpoints)."""
        for name in self.member_state:
            stacked = getattr(self, name)
            for i, member in enumerate(members):
                setattr(member, name, stacked[i])

    def end_epoch(self, epoch: int) -> None:
        """Called after each epoch of the method stage."""

    def lr_factor(self, epoch: int) -> float:
        """The factor on the stage's scheduled learning rate during method-stage epoch `epoch` (0-based)."""
        return 1.0

    def max_grad_norm(self) -> float | None:
        """A bound on the norm of the networks' gradient, clipped to it before each step (None: not clipped)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Per-run state beyond the networks (LCCN's counts, MentorNet's threshold), for checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""

    def estimated_transition(self) -> np.ndarray | None:
        """The method's estimate of T, where it makes one (FW, LCCN); recorded in the result row."""
        return None

    def judged_noisy(self, logits: torch.Tensor, labels: torch.Tensor, epoch: int,
                     index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Which training examples the method now judges noisy: (score, flagged), each (N,), from nets[0]'s
        evaluation-mode logits (N, C) on the unaugmented examples `index` of the training split (the diagnostics'
        sample, `bench.exec.diagnostics.train_sample`) and their noisy labels (N,), after `epoch` method-stage epochs
        (0: the warm-started state). A higher score means more likely noisy; `flagged` is the method's own decision
        (dropped, down-weighted or relabelled); per-example state is read at `index`. None: it judges none."""
        return None


# -- hyper-parameter declarations: type from `defaults`, bounds from `ranges`, allowed values from `choices` ------
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _kind(default: Any) -> type:
    if isinstance(default, FromTrial):
        return default.kind
    return bool if isinstance(default, bool) else type(default)


def _from_text(kind: type, text: str) -> Any:
    """A `--param key=value` string converted to the parameter's declared type (ValueError if it is not one)."""
    if kind is bool:
        if text.strip().lower() in _TRUE:
            return True
        if text.strip().lower() in _FALSE:
            return False
        raise ValueError
    if kind is int:
        return integer(text)
    if kind is float:
        return number(text)
    return text


def _type_name(kind: type) -> str:
    return {bool: "true or false", int: "an integer", float: "a number", str: "text"}.get(kind, kind.__name__)


def _declaration(cls: type[Method], key: str) -> str:
    """What a parameter allows, in words: its type and its range or choices."""
    kind = _kind(cls.defaults[key])
    if key in cls.choices:
        return "one of " + ", ".join(str(c) for c in cls.choices[key])
    if key in cls.ranges:
        return f"{_type_name(kind)} in {cls.ranges[key]}"
    return _type_name(kind)


def _check_param(cls: type[Method], key: str, value: Any, from_text: bool) -> Any:
    if key not in cls.defaults:
        allowed = ", ".join(sorted(cls.defaults)) or "none"
        raise UserError(f"method {cls.name!r} has no parameter {key} (allowed: {allowed})")
    kind = _kind(cls.defaults[key])
    problem = f"method {cls.name!r}: parameter {key}={value!r} is not allowed; expected {_declaration(cls, key)}"
    if from_text and isinstance(value, str):
        try:
            value = _from_text(kind, value)
        except ValueError:
            raise UserError(problem) from None
    # bool is an int to Python: accept it only where a bool is declared; a float parameter takes an int too.
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise UserError(problem)
    if key in cls.choices and value not in cls.choices[key]:
        raise UserError(problem)
    if key in cls.ranges and value not in Interval.parse(cls.ranges[key]):
        raise UserError(problem)
    if kind is float and not math.isfinite(value) and key not in cls.ranges:
        raise UserError(problem)
    return float(value) if kind is float else value  # as declared: `eps: 2` and the default 2.0 are one member group


def check_params(cls: type[Method], params: dict[str, Any], from_text: bool = False) -> dict[str, Any]:
    """The parameters checked against the method's declaration; with `from_text`, strings (from `--param
    key=value`) are first converted to the declared type ("false" -> False, "abc" for a number -> error)."""
    return {key: _check_param(cls, key, value, from_text) for key, value in params.items()}


def declared_by_dataset(cls: type[Method], dataset: str) -> dict[str, Any]:
    """The defaults a registered dataset's file declares for this method (`Dataset.method_defaults`), checked like
    explicit values; none for a name no dataset is registered under."""
    found = dataset_registry().get(dataset) if dataset else None
    return check_params(cls, found.method_defaults.get(cls.name, {})) if found is not None else {}


def defaults_on(cls: type[Method], dataset: str) -> dict[str, Any]:
    """The defaults a method runs with on a dataset, lowest first: its `defaults`, those its reference sets there
    (`dataset_defaults`), those the dataset's file declares for it (`declared_by_dataset`). The one home of that
    merge: `Method.__init__` and `TrialConfig.effective_params` both read it."""
    return {**cls.defaults, **cls.dataset_defaults.get(dataset, {}), **declared_by_dataset(cls, dataset)}


def describe_params(cls: type[Method]) -> list[str]:
    """One 'name=default (what it allows)' per parameter, as `bench methods` prints them, with the datasets that
    set it otherwise (the method's `dataset_defaults` and the datasets' `method_defaults`)."""
    def per_dataset(key: str) -> str:
        values = [f"{name}: {given[key]}" for name in dataset_registry()
                  if key in (given := {**cls.dataset_defaults.get(name, {}), **declared_by_dataset(cls, name)})]
        return f"; {', '.join(values)}" if values else ""

    return [f"{key}={cls.defaults[key]} ({_declaration(cls, key)}{per_dataset(key)})" for key in cls.defaults]


def fidelity_record(markdown: bool = False) -> str:
    """Every registered method's label, reference and remaining differences: plain text for the terminal, or the
    Markdown page docs/fidelity.md."""
    if not markdown:
        lines = []
        for name, cls in registry().items():
            lines += [f"{name}  {cls.title}", f"    reference: {cls.reference or _no_reference(cls)}"]
            lines += [f"    - {difference}" for difference in cls.differences]
        return "\n".join(lines) + "\n"
    lines = ["# Fidelity record", "",
             "Each method, the released code it was checked against, and every difference that remains, with its "
             "reason, then the two protocols' switches per dataset, then what they measured.",
             "Generated from the methods' `reference` and `differences` and the datasets' `authors_protocol`: "
             "`bench methods --references --update docs/fidelity.md` (a test checks that it is current), up to the "
             "marker before the measured figures, which it keeps.", ""]
    for name, cls in registry().items():
        lines += [f"## `{name}`: {cls.title}", "", f"Paper: {cls.paper}", "",
                  f"Reference: {cls.reference or _no_reference(cls)}", ""]
        unchecked = "Original: no released code to check it against." if cls.original else \
            "Not yet checked against released code."
        lines += [f"- {difference}" for difference in cls.differences] or ["No difference." if cls.reference
                                                                            else unchecked]
        lines.append("")
    return "\n".join(lines + protocol_record())


def _no_reference(cls: type[Method]) -> str:
    return "(none: original)" if cls.original else "(none)"


@functools.cache
def registry() -> dict[str, type[Method]]:
    """Every method by name: L_DMI (`bench/dmi.py`), one class per file in `baselines/` and the plug-in folders
    (`$BENCH_PLUGINS`)."""
    return discover(Method, ("bench.dmi", "bench.baselines"))


def get_method(name: str) -> type[Method]:
    return lookup(registry(), "method", name)
