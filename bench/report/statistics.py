"""Intervals and paired tests over plain numbers (numpy and SciPy, no frames).

The statistics of the report, over plain numbers (numpy and scipy, no frames): the 95% Student-t interval of a
mean over seeds (`t_half_width`; an accuracy's clipped to [0, 100], where its mean lies: `accuracy_interval`), the
mean paired difference of two methods over the seeds both hold (`paired_difference`), and the paired significance
test with its marker (`paired_test`, `marker`). `bench.report.analysis` applies them to the cells it selects and
aggregates; the panels call them for their own paired comparisons. Kept apart from the analysis so that each
number's test or interval is stated once, away from how rows are loaded, selected and grouped.

Seeds share noisy labels across methods, so L_DMI is compared with each baseline per cell as paired samples
matched on seed: Wilcoxon signed-rank from `WILCOXON_MIN_PAIRS` pairs (below that it cannot reach p < 0.05),
else a paired t-test. No interval is given under `MIN_CI_SEEDS` seeds.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

ALPHA = 0.05
WILCOXON_MIN_PAIRS = 6  # with 5 pairs the smallest two-sided exact Wilcoxon p-value is 0.0625
MIN_CI_SEEDS = 3  # below this a t-interval says little (n = 2: t = 12.7 times the standard error); none is given


def t_half_width(std: float | None, n: int) -> float | None:
    """The half-width of the 95% Student-t interval of a mean over n samples of sample std `std`; None under 2
    samples (no std) or without a std."""
    if n < 2 or std is None or math.isnan(std):
        return None
    # The t quantile from scipy.special (what `scipy.stats.t.ppf` computes, the same digits): a grid's summary takes
    # an interval, and scipy.stats' import (0.5 s of CPU more) waits for a paired test.
    return float(special.stdtrit(n - 1, 0.975) * std / math.sqrt(n))


def accuracy_interval(mean: float | None, std: float | None, n: int) -> tuple[float | None, float | None]:
    """The 95% t-interval of a mean accuracy over n seeds, clipped to [0, 100]: the mean of an accuracy lies there,
    so the clipped interval covers it whenever the t-interval does. (None, None) under `MIN_CI_SEEDS` seeds."""
    half = t_half_width(std, n)
    if n < MIN_CI_SEEDS or mean is None or half is None:
        return None, None
    return max(0.0, mean - half), min(100.0, mean + half)


def paired_difference(a: dict[int, float], b: dict[int, float]) -> tuple[int, float | None, float | None]:
    """(shared seeds, mean over them of b − a, half-width of that mean's 95% t-interval): a seed only one arm holds
    has no partner and is left out. Under `MIN_CI_SEEDS` pairs no interval, as in the accuracy tables: with 2, t is
    12.7 and any control passes."""
    seeds = sorted(a.keys() & b.keys())
    if not seeds:
        return 0, None, None
    diffs = np.array([b[s] - a[s] for s in seeds])
    std = float(diffs.std(ddof=1)) if len(diffs) > 1 else None
    half = t_half_width(std, len(seeds)) if len(seeds) >= MIN_CI_SEEDS else None
    return len(seeds), float(diffs.mean()), half


def paired_test(ours: np.ndarray, theirs: np.ndarray) -> tuple[str, float | None]:
    """(test name, two-sided p-value) for paired samples; ("none", None) under two pairs."""
    ours, theirs = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    diff = ours - theirs
    if len(diff) < 2:
        return "none", None
    name = "wilcoxon" if len(diff) >= WILCOXON_MIN_PAIRS else "paired t"
    if np.all(diff == 0):
        return name, 1.0
    from scipy import stats

    if name == "wilcoxon":
        return name, float(stats.wilcoxon(ours, theirs).pvalue)
    if np.all(diff == diff[0]):  # a constant non-zero difference: zero variance, the t statistic is infinite
        return name, 0.0
    return name, float(stats.ttest_rel(ours, theirs).pvalue)


def marker(p: float | None) -> str:
    """The tables' significance marker of a p-value: *** under 0.001, ** under 0.01, * under `ALPHA`."""
    if p is None:
        return ""
    return "***" if p < 0.001 else "**" if p < 0.01 else "*" if p < ALPHA else ""
