"""Label noise, the generic machinery: builders of T (uniform, symmetric, pair flips), the validation of T, seeded
vectorised sampling, and what the noisy labels realised. Which named patterns a dataset accepts, and how each builds
T from r, is declared by the dataset (`Dataset.noise_patterns`, in its file under datasets/).

T is C x C and row-stochastic; rows are the true class, columns the noisy class (the paper's T_{Y -> Y~}).
Instance-dependent noise (`INSTANCE_DEPENDENT`, `inject_instance_dependent`) has no T: each example's noisy label
is drawn from a distribution computed from the example itself; only its realised per-class T is recorded.
Noise is sampled by a generator keyed by (dataset, pattern, r, seed) alone, so every method and every
hyper-parameter of a seed sees the very same noisy labels (paired comparisons). It is applied to the training
and validation splits; the test split is never touched.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.config import UserError, did_you_mean, number, read_text_file

# How a pattern builds T from the noise level r and the number of classes C. A dataset declares its own patterns
# (name -> builder, in its file under datasets/); the generic ones below are accepted by every dataset.
Builder = Callable[[float, int], np.ndarray]


def uniform(r: float, c: int) -> np.ndarray:
    """Replace the label by one drawn uniformly from all C classes (it may stay the same): T = (1-r) I + r/C."""
    return (1 - r) * np.eye(c) + r / c * np.ones((c, c))


def symmetric(r: float, c: int) -> np.ndarray:
    """Flip to one of the *other* C-1 classes uniformly: diagonal 1-r, off-diagonal r/(C-1)."""
    return (1 - r) * np.eye(c) + r / (c - 1) * (np.ones((c, c)) - np.eye(c))


def flip(pairs: dict[int, int]) -> Builder:
    """T where true class `a` is relabelled `b` with probability r, for each (a, b); other classes stay."""

    def build(r: float, c: int) -> np.ndarray:
        t = np.eye(c)
        for a, b in pairs.items():
            t[a, a], t[a, b] = 1 - r, r
        return t

    return build


GENERIC: dict[str, Builder] = {"uniform": uniform, "symmetric": symmetric}
# Patterns whose noisy label depends on the example, not only on its class: no T generates them.
INSTANCE_DEPENDENT = ("idn",)
# The names every dataset accepts: the generic builders, an explicit matrix (`transition`) and, where the dataset
# holds its inputs in memory (`Dataset.instance_noise`), instance-dependent noise.
GENERIC_PATTERNS = (*GENERIC, "transition", *INSTANCE_DEPENDENT)
# The standard deviation of the per-example flip rate around r (Xia et al.'s `norm_std`, 0.1 in all their runs).
IDN_STD = 0.1


def is_instance_dependent(pattern: str) -> bool:
    return pattern in INSTANCE_DEPENDENT


def validate_transition(t: np.ndarray, num_classes: int, source: str = "T") -> np.ndarray:
    """Check that T is a C x C row-stochastic matrix; warn where T is singular (det T = 0: L_DMI's assumption 3.2
    fails)."""
    t = np.asarray(t, dtype=np.float64)
    if t.ndim != 2 or t.shape[0] != t.shape[1]:
        raise UserError(f"{source}: a transition matrix must be square, got shape {t.shape}")
    if t.shape[0] != num_classes:
        raise UserError(f"{source}: the dataset has {num_classes} classes but T is {t.shape[0]} x {t.shape[1]}")
    if not np.all(np.isfinite(t)) or (t < -1e-12).any():
        raise UserError(f"{source}: T must hold finite, non-negative probabilities")
    sums = t.sum(axis=1)
    if not np.allclose(sums, 1.0, atol=1e-6):
        bad = int(np.argmax(np.abs(sums - 1)))
        raise UserError(f"{source}: T must be row-stochastic; row {bad} sums to {sums[bad]:.6g}, not 1")
    # Singular by its smallest singular value, not by det T: the det of an invertible 100 x 100 T is far below any
    # fixed threshold ((1 - r)^99 for uniform noise), while T's largest singular value is at least 1 (T 1 = 1), so
    # 1e-10 sits far above SVD's rounding (~C x 1e-16) and far below any T a pattern means to be invertible.
    if np.linalg.svd(t, compute_uv=False)[-1] < 1e-10:
        warnings.warn(
            f"{source}: det T = 0, the noisy labels carry no information about some classes "
            "(L_DMI's assumption 3.2 fails); results at this r are not meaningful for any method",
            stacklevel=2,
        )
    return np.clip(t, 0.0, None)


def from_flags(pattern: str, transition_file: str | Path | None) -> tuple[str, tuple[tuple[float, ...], ...] | None]:
    """The (noise pattern, explicit T) of a command's `--noise` and `--transition FILE` (a file makes the pattern
    "transition")."""
    if transition_file is not None:
        return "transition", tuple(tuple(float(v) for v in row) for row in read_transition_file(transition_file))
    if pattern == "transition":
        raise UserError("--noise transition needs --transition FILE (a CSV or JSON matrix)")
    return pattern, None


def read_transition_file(path: str | Path) -> np.ndarray:
    """An explicit T from a CSV file (one row a line) or a JSON file (a list of rows)."""
    path = Path(path)
    text = read_text_file(path, "--transition")
    try:
        if path.suffix.lower() == ".json":
            return np.asarray(json.loads(text), dtype=np.float64)
        rows = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        return np.asarray([[number(v) for v in line.split(",")] for line in rows], dtype=np.float64)
    except (ValueError, TypeError) as e:
        raise UserError(f"--transition {path}: not a matrix of numbers ({e})") from None


def transition_matrix(
    pattern: str,
    r: float,
    num_classes: int,
    patterns: Mapping[str, Builder] = GENERIC,
    explicit: np.ndarray | None = None,
) -> np.ndarray:
    """The C x C matrix T of pattern `pattern` of `patterns` (a dataset's own and the generic ones) at noise level r,
    or the explicit one for `transition`; checked by `validate_transition`."""
    if not 0.0 <= r <= 1.0:
        raise UserError(f"noise level r must lie in [0, 1], got {r}")
    if pattern == "transition":
        if explicit is None:
            raise UserError("noise 'transition' needs an explicit matrix (--transition FILE)")
        return validate_transition(explicit, num_classes, "--transition")
    if pattern not in patterns:
        allowed = ", ".join([*patterns, "transition"])
        raise UserError(f"unknown noise pattern {pattern!r} for this dataset{did_you_mean(pattern, patterns)}; "
                        f"choose from {allowed}")
    return validate_transition(patterns[pattern](r, num_classes), num_classes, f"noise {pattern!r}")


def noise_generator(dataset: str, pattern: str, r: float, seed: int) -> np.random.Generator:
    """A generator keyed by (dataset, pattern, r, seed) alone: independent of the method and the model seed."""
    key = f"{dataset}|{pattern}|{round(float(r), 10)!r}|{int(seed)}"
    digest = hashlib.sha256(key.encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))


def check_labels(labels: np.ndarray, num_classes: int, what: str) -> np.ndarray:
    """The one check every label passes where labels are drawn (`inject`, `inject_as_script`, instance-dependent noise
    and `summarise`, which every noisy label reaches): a label outside [0, C) is refused in one line. A clean label
    outside it (-1 unknown, `WRONG`) would index T's rows from the end and draw a wrong label silently; a noisy one
    would train on a class that does not exist."""
    labels = np.asarray(labels)
    outside = (labels < 0) | (labels >= num_classes)
    if outside.any():
        raise UserError(f"{what}: {int(outside.sum()):,} of {len(labels):,} labels lie outside [0, {num_classes}) "
                        f"(first: {int(labels[outside][0])}; -1 is unknown, {WRONG} known wrong): no label is drawn "
                        "from or trained on them; a set without clean labels offers its own noise only")
    return labels


def sample_noisy_labels(labels: np.ndarray, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draw y~ ~ T[y, :] for every example at once (inverse-CDF on each example's row)."""
    labels = np.asarray(labels, dtype=np.int64)
    cdf = np.cumsum(t, axis=1)
    cdf[:, -1] = 1.0  # guard against rounding leaving the last bin unreachable
    u = rng.random(labels.shape[0])
    return (u[:, None] >= cdf[labels]).sum(axis=1).astype(np.int64)


def empirical_transition(clean: np.ndarray, noisy: np.ndarray, num_classes: int) -> np.ndarray:
    """Row-normalised counts of (true, noisy) pairs; a class with no example gives a row of zeros."""
    counts = np.zeros((num_classes, num_classes), dtype=np.float64)
    np.add.at(counts, (np.asarray(clean), np.asarray(noisy)), 1.0)
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def labels_hash(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class NoisyLabels:
    """The noisy training and validation labels of one (dataset, pattern, r, seed) and what they realised."""

    train: np.ndarray
    val: np.ndarray
    transition: np.ndarray | None  # the T they were drawn from (None for human noise)
    empirical: np.ndarray  # empirical T on the training split
    noise_rate: float  # realised fraction of changed training labels
    noise_hash: str
    # The fraction of training labels the noise is expected to change, sum_i pi_i (1 - T_ii) with pi the training
    # split's clean class frequencies (human noise, with no T: the realised rate). What Co-teaching's and JoCoR's
    # authors call the noise rate: r for their symmetric and pair-flip noise, r / 2 for JoCoR's asymmetric noise.
    expected_rate: float = float("nan")


# A clean label known only to differ from the noisy one (Food-101N's verification label 0, a Red Mini-ImageNet web
# image annotated as wrong): it counts as flipped in the noise rate, and as unknown everywhere else (< 0).
WRONG = -2


def summarise(
    clean_train: np.ndarray,
    noisy_train: np.ndarray,
    noisy_val: np.ndarray,
    num_classes: int,
    t: np.ndarray | None,
) -> NoisyLabels:
    """What the noisy labels realised. A clean label < 0 is unknown (Clothing1M's noisy training set): the empirical
    T counts only the examples whose clean label is known, the noise rate those and the examples whose label is known
    to be wrong (`WRONG`: a human verified it so, without naming the right class) (NaN when there are none)."""
    clean_train = np.asarray(clean_train)
    noisy_train = check_labels(noisy_train, num_classes, "noisy training labels")
    check_labels(noisy_val, num_classes, "noisy validation labels")
    known = clean_train >= 0
    clean_known, noisy_known = clean_train[known], noisy_train[known]
    wrong = int(np.sum(clean_train == WRONG))
    if wrong:
        noise_rate = float((np.sum(noisy_known != clean_known) + wrong) / (len(clean_known) + wrong))
    elif known.any():
        noise_rate = float(np.mean(noisy_known != clean_known))
    else:
        noise_rate = float("nan") if len(clean_train) else 0.0
    if t is not None and known.any():
        prior = np.bincount(clean_known, minlength=num_classes) / len(clean_known)
        expected_rate = float(prior @ (1.0 - np.diag(t)))
    else:
        expected_rate = noise_rate
    return NoisyLabels(
        train=noisy_train,
        val=noisy_val,
        transition=t,
        empirical=empirical_transition(clean_known, noisy_known, num_classes),
        noise_rate=noise_rate,
        noise_hash=labels_hash(noisy_train, noisy_val),
        expected_rate=expected_rate,
    )


def inject(
    dataset: str,
    pattern: str,
    r: float,
    seed: int,
    clean_train: np.ndarray,
    clean_val: np.ndarray,
    t: np.ndarray,
) -> NoisyLabels:
    """Sample noisy training then validation labels from T with the (dataset, pattern, r, seed) generator."""
    check_labels(clean_train, t.shape[0], f"{dataset}: noise {pattern!r} on the clean training labels")
    check_labels(clean_val, t.shape[0], f"{dataset}: noise {pattern!r} on the clean validation labels")
    rng = noise_generator(dataset, pattern, r, seed)
    noisy_train = sample_noisy_labels(clean_train, t, rng)
    noisy_val = sample_noisy_labels(clean_val, t, rng)
    return summarise(clean_train, noisy_train, noisy_val, t.shape[0], t)


def inject_as_script(
    seed: int,
    clean_train: np.ndarray,
    clean_val: np.ndarray,
    t: np.ndarray,
    validation: str = "reseed",
    float32: bool = False,
) -> NoisyLabels:
    """Noisy labels drawn as the paper's scripts draw them (the `authors` protocol's `script_noise`): NumPy's legacy
    generator seeded with `seed`, then for each example in list order `np.random.choice(C, 1, p=T[label])`, which
    takes one `random_sample()` u and returns the first class whose normalised cumulative probability exceeds u.
    The validation split's draws follow the training split's (`validation="continue"`: Fashion-MNIST's script seeds
    once) or start again from `seed` ("reseed": MR's and CIFAR-10's build each split with `np.random.seed(seed)`).
    `float32`: T's rows are float32 (CIFAR-10's script keeps T in a float32 torch tensor)."""
    if validation not in ("reseed", "continue"):
        raise ValueError(f"inject_as_script: validation is 'reseed' or 'continue', got {validation!r}")
    rows = np.asarray(t, dtype=np.float32 if float32 else np.float64).astype(np.float64)
    cdf = np.cumsum(rows, axis=1)
    cdf /= cdf[:, -1:]  # np.random.choice's normalisation

    def draw(clean: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
        u = rng.random_sample(len(clean))
        # searchsorted(cdf[label], u, side="right"), for every example at once
        return (cdf[np.asarray(clean)] <= u[:, None]).sum(axis=1).astype(np.int64)

    check_labels(clean_train, len(rows), "the scripts' noise on the clean training labels")
    check_labels(clean_val, len(rows), "the scripts' noise on the clean validation labels")
    rng = np.random.RandomState(seed % 2**32)
    noisy_train = draw(clean_train, rng)
    noisy_val = draw(clean_val, rng if validation == "continue" else np.random.RandomState(seed % 2**32))
    return summarise(clean_train, noisy_train, noisy_val, t.shape[0], np.asarray(t, dtype=np.float64))


# -- instance-dependent noise ------------------------------------------------------------------------------------------
def truncated_normal(mean: float, std: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """n draws of N(mean, std^2) conditioned on [0, 1] (the law of scipy's `truncnorm` on that interval), by
    rejection: at least half of the draws land in [0, 1] for any mean in it, so a few rounds suffice."""
    if not 0.0 <= mean <= 1.0:  # outside, rejection may not end
        raise ValueError(f"truncated_normal: the mean must lie in [0, 1], got {mean}")
    out = np.empty(n, dtype=np.float64)
    filled = 0
    while filled < n:
        draw = rng.normal(mean, std, size=2 * (n - filled) + 16)
        keep = draw[(draw >= 0.0) & (draw <= 1.0)][: n - filled]
        out[filled : filled + len(keep)] = keep
        filled += len(keep)
    return out


def instance_dependent_probabilities(
    parts: list[tuple[np.ndarray, np.ndarray]], r: float, num_classes: int, rng: np.random.Generator,
    chunk_elements: int = 1 << 24,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Xia et al.'s instance-dependent noise (NeurIPS 2020, `get_instance_noisy_label`): for each (features N x F,
    clean labels N) part, every example's distribution of the noisy label (N x C) and its flip rate (N).

    Example i of class y gets a flip rate q_i drawn from N(r, 0.1^2) truncated to [0, 1]; its features are projected
    to class scores s = x_i W_y by a standard normal F x C matrix W_y of its class; the true class's score is masked,
    and the noisy label is y with probability 1 - q_i, else class k != y with probability q_i softmax(s)_k. Draws,
    in order: the flip rates of every part's examples, then W_0 .. W_{C-1} (F the widest part's width; a narrower
    part's missing columns count as zeros). Scores are float64 sums of the features as given, a class and a chunk of
    rows at a time. With C = 2 the projection has no effect: the other class takes all of q_i, so the noise is
    instance-independent in law, symmetric at the mean flip rate."""
    for _, y in parts:  # a row of p would be 0
        check_labels(y, num_classes, "instance-dependent noise on the clean labels")
    sizes = [len(y) for _, y in parts]
    rates = np.split(truncated_normal(r, IDN_STD, sum(sizes), rng), np.cumsum(sizes)[:-1])
    probs = [np.zeros((n, num_classes), dtype=np.float64) for n in sizes]
    width = max((x.shape[1] for x, _ in parts), default=0)
    rows = max(1, chunk_elements // max(width, 1))
    for c in range(num_classes):
        w = rng.standard_normal((width, num_classes))  # drawn for every class, examples or not: a fixed draw order
        for (x, y), q, p in zip(parts, rates, probs, strict=True):
            members = np.flatnonzero(y == c)
            for start in range(0, len(members), rows):
                idx = members[start : start + rows]
                scores = x[idx].reshape(len(idx), -1).astype(np.float64) @ w[: x.shape[1]]  # absent columns: 0
                scores[:, c] = -np.inf
                scores = np.exp(scores - scores.max(axis=1, keepdims=True))
                p[idx] = q[idx, None] * scores / scores.sum(axis=1, keepdims=True)
                p[idx, c] = 1.0 - q[idx]
    return probs, rates


def sample_rows(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One class per row of the N x C matrix p of distributions (inverse CDF on each row)."""
    cdf = np.cumsum(p, axis=1)
    cdf[:, -1] = 1.0
    u = rng.random(len(p))
    return (u[:, None] >= cdf).sum(axis=1).astype(np.int64)


def inject_instance_dependent(
    dataset: str,
    pattern: str,
    r: float,
    seed: int,
    train: tuple[np.ndarray, np.ndarray],
    val: tuple[np.ndarray, np.ndarray],
    num_classes: int,
) -> NoisyLabels:
    """Instance-dependent noisy training then validation labels from (features, clean labels) of each split, with the
    (dataset, pattern, r, seed) generator. No T generated them (`transition` is None); the realised per-class T is
    `empirical`, and `expected_rate` the mean flip rate of the training examples."""
    rng = noise_generator(dataset, pattern, r, seed)
    (p_train, p_val), (q_train, _) = instance_dependent_probabilities([train, val], r, num_classes, rng)
    noisy_train, noisy_val = sample_rows(p_train, rng), sample_rows(p_val, rng)
    labels = summarise(train[1], noisy_train, noisy_val, num_classes, None)
    return dataclasses.replace(labels, expected_rate=float(q_train.mean()) if len(q_train) else 0.0)
