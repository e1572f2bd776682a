"""The dataset interface, the registry that finds dataset modules, and the file helpers they share.

A dataset is one class in one file under `datasets/` (installed as `bench.datasets`). It declares, as data: its
name, classes, the paper's split sizes, default model, its own noise patterns (name -> how T is built from r), which
of its cells are the rows of the paper's tables, the paper's training schedules (the warm start's, the method stage's,
and a method's own where the paper's code trains it with one), and the published files it reads (with md5 checksums
and download addresses). It implements `load`, which reads
those files under the data root into `Splits`. Small sets load as tensors that the trainer keeps on the
training device; a set too big for memory gives a `torch.utils.data.Dataset` instead and the trainer streams it.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from bench import noise, protocol
from bench.config import Schedule, UserError, did_you_mean, discover, lookup
from bench.download import fetch, file_md5, unpack


@dataclass
class Split:
    """One split: inputs (a tensor of all examples, or a map-style dataset yielding one input tensor per index)
    and clean labels."""

    x: torch.Tensor | torch.utils.data.Dataset
    y: np.ndarray  # clean labels, int64

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, n: int) -> Split:
        if isinstance(self.x, torch.Tensor):
            return Split(self.x[:n], self.y[:n])
        return Split(torch.utils.data.Subset(self.x, range(n)), self.y[:n])


@dataclass
class Splits:
    train: Split
    val: Split
    test: Split
    # Real human noise (CIFAR-10N): pattern -> (noisy train labels, noisy validation labels).
    human_labels: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    model_args: dict[str, Any] = field(default_factory=dict)  # e.g. the vocabulary size for WordCNN
    notes: list[str] = field(default_factory=list)  # said to the user (e.g. "subset: proportional splits")
    # The per-epoch diagnostics' training sample of the first n training examples ((n, sample size) -> split),
    # gathered once and shared by the trials that share these splits: a pack of 256 Fashion-MNIST members held 256
    # copies (8 GB).
    samples: dict[tuple[int, int], Split] = field(default_factory=dict, repr=False)
    # The noisy labels drawn on these splits, by (noise, r, seed, explicit T): a pack's members that share a label
    # cell draw them once (an idn draw projects every input: 0.6 s for CIFAR-10, per member before).
    noisy_labels: dict[tuple[Any, ...], noise.NoisyLabels] = field(default_factory=dict, repr=False)
    # Real noise whose images differ by level (Red Mini-ImageNet: each level's file lists its own training images):
    # (pattern, r) -> that cell's splits, its own training and validation images and labels (`for_noise`).
    noise_splits: Mapping[tuple[str, float], Splits] = field(default_factory=dict, repr=False)

    def for_noise(self, pattern: str, r: float) -> Splits:
        """The splits a trial of noise `pattern` at `r` trains on: that level's own (`noise_splits`; an r the dataset
        did not publish was refused before, `Dataset.check_level`), else these."""
        return self.noise_splits.get((pattern, round(float(r), 6)), self)


def check_splits(dataset: Dataset, splits: Splits) -> Splits:
    """Every split holds examples: a file too small (or crafted) leaves none to train on, select by or test on."""
    sizes = {"training": len(splits.train), "validation": len(splits.val), "test": len(splits.test)}
    if empty := [name for name, n in sizes.items() if n == 0]:
        counts = ", ".join(f"{name} {n}" for name, n in sizes.items())
        raise UserError(f"{dataset.name} under {dataset.root}: the {empty[0]} split is empty ({counts} examples; the "
                        f"paper's: {' / '.join(map(str, dataset.split_sizes))}): its files hold too few examples; use "
                        "the official files")
    return splits


class Dataset:
    """Base class of every dataset module."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    num_classes: ClassVar[int] = 0
    class_names: ClassVar[tuple[str, ...]] = ()
    split_sizes: ClassVar[tuple[int, int, int]] = (0, 0, 0)  # the paper's train / validation / test
    model: ClassVar[str] = ""
    # The dataset's own noise patterns, on top of `noise.GENERIC_PATTERNS`: name -> how T is built from (r, C)
    # (`noise.flip`, `noise.uniform` or any function); None for real noise, whose labels come from the files.
    noise_patterns: ClassVar[dict[str, noise.Builder | None]] = {}
    # The paper's table for this dataset: its rows (dataset = `name`, noise_r = r) in bench/report/reference_results.csv
    # are our cells (this pattern, r); None where the paper has no table for it.
    paper_noise: ClassVar[str | None] = None
    # A real-noise pattern published at fixed levels r, each its own label file (Red Mini-ImageNet's red): pattern ->
    # those r; another r is refused before anything runs (`check_level`).
    noise_levels: ClassVar[dict[str, tuple[float, ...]]] = {}
    warmup: ClassVar[Schedule]  # the CE warm start
    method_stage: ClassVar[Schedule]  # the method stage of a method without its own schedule in `method_stages`
    # A method's own method-stage schedule on this dataset (method name -> schedule), where the paper's code trains
    # that method with one (e.g. its CIFAR-10/FW.py); `stage_schedule` picks it.
    method_stages: ClassVar[dict[str, Schedule]] = {}
    # A method's hyper-parameters on this dataset where its reference sets them for it (method name -> parameter ->
    # value), declared here when the dataset is ours to adapt (CIFAR-100): they replace the method's `defaults` and
    # its own `dataset_defaults` for this dataset, an explicit value still wins (`bench.methods.defaults_on`).
    method_defaults: ClassVar[dict[str, dict[str, Any]]] = {}
    # Bumped when a change to this file changes a trial's numbers (a split, a reading): part of trial identity.
    version: ClassVar[int] = 1
    # Published files, relative to `folder` under the data root: path -> md5 (None: not checked).
    files: ClassVar[dict[str, str | None]] = {}
    folder: ClassVar[str] = ""
    # The published files' sizes, path -> (bytes, bytes of its longest line; None for a binary file), where the dataset
    # declares them: a file far over its size, or with a line far over the longest (`FAR`), is not the published one,
    # checksums off too (`wrong_files`). The longest line, not the average: a file whose first 300 KB lost their line
    # ends kept an average within bounds, and its one huge sentence padded every other to its length (4.35 GB).
    published_sizes: ClassVar[dict[str, tuple[int, int | None]]] = {}
    # Download addresses: url -> path of the downloaded file relative to `folder` (archives are unpacked).
    urls: ClassVar[dict[str, str]] = {}
    archive_md5: ClassVar[dict[str, str]] = {}  # md5 of downloaded archives (path relative to `folder`)
    source: ClassVar[str] = ""  # where a user gets the files by hand
    # Evaluate the test set and a sample of the training set (`diagnostics.train_sample`) after every epoch (test
    # accuracy per epoch, memorisation, detection quality): cheap for the small sets; BENCH_EPOCH_EVAL=1, 0 or full
    # (the whole training set) overrides it.
    epoch_eval: ClassVar[bool] = True
    # Whether instance-dependent noise (`noise.INSTANCE_DEPENDENT`) can be drawn: it reads every training and
    # validation input (`noise_features`) and needs every clean label.
    instance_noise: ClassVar[bool] = True
    # Whether every training and validation example's clean label is known: synthetic noise (a T, or instance-dependent
    # noise) is drawn from it. False for a set of real noise whose clean labels are unknown (-1) or known only to be
    # wrong (`noise.WRONG`): it offers its own noise alone (`accepted_noise`).
    clean_labels: ClassVar[bool] = True
    # Options of its network that a local file named by an environment variable sets (option -> variable): Food-101N's
    # and Clothing1M's ResNet-50 start from $BENCH_RESNET50_WEIGHTS. The file's md5 is part of the trial's identity
    # and its row (`bench.trial.TrialConfig.weights`); `load` hands the path to the network (`Splits.model_args`).
    weights_env: ClassVar[dict[str, str]] = {}
    # The choices of the paper's scripts on this dataset (`bench.protocol`): the `authors` protocol turns them all on,
    # `bench+NAME` one alone. Each cites the script's file and line.
    authors_protocol: ClassVar[tuple[protocol.Switch, ...]] = ()
    # What `authors` still does otherwise than the scripts, each "what — why" (docs/fidelity.md lists them).
    authors_differences: ClassVar[tuple[str, ...]] = ()

    def __init__(self, data_root: str | Path, verify: bool | None = None,
                 trial_protocol: protocol.Protocol | None = None) -> None:
        self.root = Path(data_root).expanduser() / self.folder
        # The protocol of the trials that read this data (bench's where none is given): a switch that changes the
        # data (`script_transform`'s inputs, MR's `vocabulary_order`) is read from it by `load` and the transforms.
        self.trial_protocol = trial_protocol or protocol.Protocol()
        # Checksums of the published files are verified on load unless BENCH_VERIFY_CHECKSUMS=0 (or verify=False,
        # as the tests do for their small files in the published formats).
        self.verify = verify if verify is not None else os.environ.get("BENCH_VERIFY_CHECKSUMS", "1") != "0"

    @classmethod
    def accepted_noise(cls) -> tuple[str, ...]:
        if not cls.clean_labels:  # nothing to draw synthetic noise from: its own (real) noise only
            return tuple(p for p in cls.noise_patterns if cls.is_real_noise(p))
        generic = noise.GENERIC_PATTERNS if cls.instance_noise else \
            tuple(p for p in noise.GENERIC_PATTERNS if not noise.is_instance_dependent(p))
        return tuple(cls.noise_patterns) + generic

    @classmethod
    def check_noise(cls, pattern: str) -> None:
        """Refuse a pattern the dataset does not offer, in one line that lists those it does."""
        if pattern in cls.accepted_noise():
            return
        choose = f"choose from {', '.join(cls.accepted_noise())}"
        if not cls.clean_labels and (pattern in noise.GENERIC_PATTERNS or pattern in cls.noise_patterns):
            raise UserError(f"{cls.name} has no clean training labels (they are unknown, or known only to be wrong) "
                            f"to draw synthetic noise {pattern!r} from; it offers its own noise: {choose}")
        if noise.is_instance_dependent(pattern):
            raise UserError(f"{cls.name} offers no instance-dependent noise ({pattern!r}): it needs every input in "
                            f"memory and every clean label; {choose}")
        raise UserError(f"unknown noise {pattern!r} for {cls.name}{did_you_mean(pattern, cls.accepted_noise())}; "
                        f"{choose}")

    @classmethod
    def check_level(cls, pattern: str, r: float) -> None:
        """Refuse, in one line, an r at which a pattern with published levels (`noise_levels`) was not published."""
        levels = cls.noise_levels.get(pattern)
        if levels and round(float(r), 6) not in levels:
            raise UserError(f"{cls.name}: noise {pattern!r} comes at its published levels only: r = "
                            f"{', '.join(f'{level:g}' for level in levels)}; got r = {r:g}")

    @classmethod
    def protocol(cls, spec: str) -> protocol.Protocol:
        """The switches a protocol spec turns on here, or one line saying what is wrong."""
        if spec == protocol.BENCH:
            return protocol.Protocol()
        return protocol.resolve(spec, cls.switches(), cls.name)

    @classmethod
    def switches(cls) -> dict[str, protocol.Switch]:
        """The switches this dataset's own file declares (not inherited: CIFAR-10N's scripts are not CIFAR-10's)."""
        return {s.name: s for s in cls.__dict__.get("authors_protocol", ())}

    @classmethod
    def has_transition(cls, pattern: str) -> bool:
        """Whether a T generates the pattern's noise: not for real (human) noise, nor for instance-dependent noise."""
        return not cls.is_real_noise(pattern) and not noise.is_instance_dependent(pattern)

    @classmethod
    def stage_schedule(cls, method: str, **explicit: Any) -> Schedule:
        """The schedule a method stage trains with: the method's own on this dataset (else the dataset's method
        stage), with the lr, batch size and epochs a trial sets explicitly (`explicit`; None: not set)."""
        return cls.method_stages.get(method, cls.method_stage).with_overrides(**explicit)

    @classmethod
    def is_real_noise(cls, pattern: str) -> bool:
        """Real (human) noise: the noisy labels come from the dataset's own files, and there is no T."""
        return pattern in cls.noise_patterns and cls.noise_patterns[pattern] is None

    @classmethod
    def transition(cls, pattern: str, r: float, explicit: np.ndarray | None = None) -> np.ndarray:
        """The checked T of one of the dataset's own or the generic patterns at r (`explicit` for `transition`)."""
        own = {name: build for name, build in cls.noise_patterns.items() if build is not None}
        return noise.transition_matrix(pattern, r, cls.num_classes, {**own, **noise.GENERIC}, explicit)

    def expected_files(self) -> list[str]:
        """Every file and folder the dataset reads: its `files`, and those of the layout present where it reads
        more than one (Red Mini-ImageNet's image folders)."""
        return list(self.files)

    def missing_files(self) -> list[str]:
        return [rel for rel in self.expected_files() if not (self.root / rel).exists()]

    def wrong_files(self) -> list[str]:
        """What makes present files unusable whatever their checksums say, one line each: a folder where a file
        belongs or a file where a folder belongs (a name in `files` ending in "/"), or a size in bytes or line length
        far over the published one (`published_sizes`)."""
        problems = []
        for rel in self.files:
            path, folder = self.root / rel, rel.endswith("/")
            if path.exists() and path.is_dir() != folder:
                problems.append(f"{path} is a {'file' if folder else 'folder'}, not the published "
                                f"{'folder' if folder else 'file'}")
            elif rel in self.published_sizes and path.is_file():  # smaller copies stay (tests; the loaders note them)
                size, longest = self.published_sizes[rel]
                if (got := path.stat().st_size) > size * FAR:
                    problems.append(f"{path} holds {got:,} bytes, over {FAR:g} times the published file's {size:,}")
                elif longest and (long := _longest_line(path))[1] > longest * FAR:
                    problems.append(f"{path}, line {long[0]:,}: {long[1]:,} bytes on one line, where the published "
                                    f"file's longest holds {longest:,}: were its line ends lost?")
        return problems

    def damaged_files(self) -> list[str]:
        """Present files whose md5 checksum fails (none checked when checksums are off)."""
        if not self.verify:
            return []
        return [rel for rel, md5 in self.files.items()
                if md5 and (self.root / rel).is_file() and file_md5(self.root / rel) != md5]

    def check_files(self) -> None:
        """Raise a `UserError` naming missing or corrupt files and where to get them."""
        missing = self.missing_files()
        if missing:
            raise UserError(
                f"{self.name}: missing {', '.join(missing)} under {self.root}; {self.how_to_get()}"
            )
        for problem in self.wrong_files()[:1]:
            raise UserError(f"{self.name}: {problem}; delete it and {self.how_to_get()}")
        for rel in self.damaged_files()[:1]:
            raise UserError(self.md5_mismatch(rel))

    def md5_mismatch(self, rel: str) -> str:
        """What `check_files` says of a present file that fails its md5: corrupt, unless the dataset knows better (a
        file of an earlier release, say)."""
        return f"{self.name}: {self.root / rel} is corrupt (md5 mismatch); delete it and {self.how_to_get()}"

    def how_to_get(self) -> str:
        if self.urls:
            return f"run `bench datasets --download {self.name}` or get them from {self.source}"
        return f"get them from {self.source}"

    def download(self) -> None:
        """Fetch the published files (needs internet), verify their checksums, and unpack the archives among them
        (`bench.download.unpack`): an archive with a published md5 is checked before it is unpacked, also one already
        in place; the members with a published md5 (`files`) are checked before they are moved into place, which is
        all there is to check of an archive published without one (MR's)."""
        if not self.urls:
            raise UserError(f"{self.name} cannot be downloaded automatically; {self.how_to_get()}")
        self.root.mkdir(parents=True, exist_ok=True)
        for url, rel in self.urls.items():
            target = self.root / rel
            expected = self.files.get(rel) or self.archive_md5.get(rel)
            if not target.exists():
                try:
                    fetch(url, target)
                except UserError as e:
                    raise UserError(f"{self.name}: {e}; without internet, point BENCH_DATA (or --data-root) at a "
                                    f"copy you already have (`BENCH_DATA=/path/to/data make demo`), or put "
                                    f"{', '.join(self.files)} under {self.root} by hand (from {self.source})") from None
                if expected and file_md5(target) != expected:
                    target.unlink()
                    raise UserError(f"{self.name}: {url} arrived corrupt (md5 mismatch); removed it, try again")
            elif expected and self.verify and file_md5(target) != expected:
                raise UserError(f"{self.name}: {target} is not the published file (md5 mismatch); delete it and run "
                                f"`bench datasets --download {self.name}` again")
            if target.suffix in {".gz", ".tgz", ".zip"} and rel not in self.files:
                unpack(target, self.root, {k: md5 for k, md5 in self.files.items() if md5} if self.verify else None)
        self.check_files()

    def prepare(self, source: Path) -> list[str]:
        """`bench datasets --prepare NAME --from SOURCE`: assemble under the data root what the owners publish only
        as parts to put together (images from a list of URLs, images to sort into folders), from `source`; lines
        saying what was done. Only the datasets that need it have one."""
        raise UserError(f"{self.name} has nothing to prepare: {self.how_to_get()}")

    def load(self) -> Splits:
        raise NotImplementedError

    # -- A stand-in: the dataset's files in their published format, holding random examples, so that `bench calibrate`
    # (for a model whose data is absent) and the tests run without the real data. It is the dataset's own file's
    # (not inherited: CIFAR-10N's class is CIFAR-10's, and reads a label file that CIFAR-10's stand-in does not write).
    @classmethod
    def offers_stand_in(cls) -> bool:
        return "stand_in" in cls.__dict__

    @classmethod
    def stand_in(cls, data_root: str | Path, n: int, seed: int = 0) -> None:
        """Write under `data_root` (where the dataset's `folder` then lies, as under a real data root) its files in
        the published format, random examples in them: `n` or more in the training split that `load` reads, and
        the held-out splits in the published proportions (at least one example each). Read them with
        `verify=False`: their checksums are not the published files'."""
        raise NotImplementedError(f"{cls.name} offers no stand-in: its data cannot be generated")

    @property
    def script_transform(self) -> Any:
        """The `script_transform` switch's setting where the trial's protocol turns it on (None: the dataset's own
        inputs): `load` and the transforms then build the inputs as the scripts' torchvision pipeline did."""
        return self.trial_protocol.setting("script_transform")

    # Transforms run on the training device on a batch of `Split.x`; augmentation only in `train_transform`, its
    # random draws from `generator` (None: torch's default generator of x's device): a pack hands each member its own.
    def eval_transform(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def train_transform(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.eval_transform(x)

    def noise_features(self, split: Split) -> np.ndarray:
        """Each example's features for instance-dependent noise (N x F): its input as `load` stores it, flattened
        (the pixel bytes of CIFAR and Dogs vs Cats, as Xia et al. project them; Fashion-MNIST stores bytes / 255)."""
        if not isinstance(split.x, torch.Tensor):
            raise UserError(f"{self.name}: instance-dependent noise reads every input, and {self.name} streams them")
        return split.x.reshape(len(split.x), -1).cpu().numpy()

    def describe(self) -> list[str]:
        """Extra lines for `bench datasets`: what is missing or damaged, and where to get it."""
        missing = self.missing_files()
        if missing:
            return [f"missing: {', '.join(missing)}", f"get: {self.how_to_get()}"]
        if wrong := self.wrong_files():
            return [f"not the published files: {'; '.join(wrong)}", f"delete them and {self.how_to_get()}"]
        damaged = self.damaged_files()
        return [f"damaged (md5 mismatch): {', '.join(damaged)}", f"delete them and {self.how_to_get()}"] \
            if damaged else []

    def status(self) -> str:
        """`ready` (present and, unless checksums are off, intact), `missing ...` or `damaged ...`."""
        missing = self.missing_files()
        if missing:
            return f"missing {len(missing)} of {len(self.expected_files())} files"
        if wrong := self.wrong_files():
            return f"damaged: {len(wrong)} of {len(self.files)} files not the published ones"
        damaged = self.damaged_files()
        return f"damaged: {len(damaged)} of {len(self.files)} files" if damaged else "ready"


def worker_message(e: UserError) -> str:
    """A streamed input's `UserError` (a missing or damaged file) in its own one line: a DataLoader worker's error
    comes back with the worker's traceback before it."""
    last = str(e).strip().splitlines()[-1]
    return last.split("UserError: ", 1)[1] if "UserError: " in last else last


def _longest_line(path: Path) -> tuple[int, int]:
    """(number, bytes) of a text file's longest line, its lines as `bytes.splitlines` cuts them (the loaders' way);
    the file is at most `FAR` times a published size here."""
    lines = path.read_bytes().splitlines() or [b""]
    at = max(range(len(lines)), key=lambda i: len(lines[i]))
    return at + 1, len(lines[at])


FAR = 10.0  # a file over ten times its published size, or its lines' length, is not the published one


def deterministic_permutation(n: int, key: str) -> np.ndarray:
    """A fixed permutation for dataset splits: the same on every machine, independent of trial seeds."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).permutation(n)


def protocol_record() -> list[str]:
    """The Markdown section of docs/fidelity.md on the two protocols: each dataset's switches (what its scripts do,
    file and line) and what `authors` still does otherwise, with the reason."""
    lines = ["# Protocols: `bench` and `authors`", "",
             "`bench` is the paper's protocol done right; `authors` runs a dataset as the paper's scripts ran it, "
             "each of their choices a switch (`bench.protocol`; `--protocol authors`, `bench+SWITCH`, "
             "`authors-SWITCH`). What each switch changes:", ""]
    lines += [f"- `{name}`: {kind.what}" for name, kind in protocol.SWITCHES.items()]
    for name, cls in registry().items():
        switches = cls.switches()
        if not switches:
            continue
        lines += ["", f"## `{name}` under `authors`", "", "| switch | what the script does | where |", "|---|---|---|"]
        lines += [f"| `{s.name}` | {s.what.replace('|', chr(92) + '|')} | {s.cite} |" for s in switches.values()]
        if cls.authors_differences:
            lines += ["", "Remaining differences from the scripts:", ""]
            lines += [f"- {difference}" for difference in cls.authors_differences]
    return lines + [""]


@functools.cache
def registry() -> dict[str, type[Dataset]]:
    """Every dataset by name: one class per file in `datasets/` or in a plug-in folder (`$BENCH_PLUGINS`)."""
    return discover(Dataset, ("bench.datasets",))


def paper_datasets() -> list[str]:
    """The registered datasets that have a table in the paper."""
    return [name for name, dataset in registry().items() if dataset.paper_noise]


def get_dataset(name: str) -> type[Dataset]:
    return lookup(registry(), "dataset", name)
