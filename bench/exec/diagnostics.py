"""The per-epoch diagnostics, computed on the training device.

The per-epoch diagnostics a trial records, computed on the training device: test accuracy, memorisation of the
noisy labels (training accuracy split by flipped / kept examples) and detection quality of a method's noise flags
(precision, recall, rank-based AUROC), on a fixed sample of the training split (`train_sample`).

They go to the epochs table (`bench.store.columns.DIAGNOSTIC_COLUMNS`); `bench.report.diagnostics` reads them back
to draw the report's curves and tables.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from bench.store.columns import DIAGNOSTIC_COLUMNS

# -- per epoch: torch and numpy only -----------------------------------------------------------------------------
# Training examples the per-epoch diagnostics evaluate, at most. A share p measured on m examples drawn without
# replacement has a standard error sqrt(p (1 - p) / m) <= 0.5 / sqrt(m) (less the finite-population correction):
# 1.3 points for `train_clean_acc` on 1,500, and 0.5 / sqrt(rho * 1,500) for the flipped examples at a realised noise
# rate rho (2.4 points on MR's 450 flipped of the sample at r = 0.6). Why not more: one evaluation pass over an
# example costs about a third of a training step on it (measured on MR's CNN), so that a sample of 1,500 and MR's
# 1,067 test sentences are about a tenth of an epoch over its 7,676 training sentences (docs/reports.md).
TRAIN_SAMPLE = 1_500
WHOLE = "full"  # BENCH_EPOCH_EVAL=full: the whole training set, as before the sample


def train_sample(n: int, dataset: str, whole: bool = False) -> np.ndarray:
    """The training examples (sorted indices) the per-epoch diagnostics evaluate: all of them up to `TRAIN_SAMPLE`
    (or with `whole`), else a fixed random sample of that many, the same for every trial of the dataset, so that
    methods, seeds and r are compared on the same examples and a pack's members share one input. It is drawn from
    its own generator, seeded from the dataset's name, never from the global streams a trial trains with."""
    if whole or n <= TRAIN_SAMPLE:
        return np.arange(n)
    seed = int.from_bytes(hashlib.sha256(f"{dataset}-diagnostics".encode()).digest()[:8], "little")
    return np.sort(np.random.default_rng(seed).choice(n, TRAIN_SAMPLE, replace=False))


def _share(hits: float, total: float, scale: float) -> float | None:
    return None if total == 0 else scale * hits / total


@torch.no_grad()
def memorisation(pred: torch.Tensor, noisy: torch.Tensor, clean: torch.Tensor) -> dict[str, float | None]:
    """Accuracy (%) of predictions against the clean labels, and against the noisy labels on the flipped and on
    the kept examples. Clean labels < 0 are unknown and left out. One value comes back to the host."""
    known = clean >= 0
    flipped, kept = known & (noisy != clean), known & (noisy == clean)
    counts = torch.stack([((pred == clean) & known).sum(), known.sum(), ((pred == noisy) & flipped).sum(),
                          flipped.sum(), ((pred == noisy) & kept).sum(), kept.sum()]).tolist()
    return dict(train_clean_acc=_share(counts[0], counts[1], 100.0),
                train_noisy_acc_flipped=_share(counts[2], counts[3], 100.0),
                train_noisy_acc_kept=_share(counts[4], counts[5], 100.0))


def auroc(score: np.ndarray, positive: np.ndarray) -> float | None:
    """Area under the ROC curve of `score` for the `positive` examples: the Mann-Whitney statistic from ranks, tied
    scores sharing their average rank (a tie counts one half). None without both classes."""
    score, positive = np.asarray(score, dtype=np.float64), np.asarray(positive, dtype=bool)
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    _, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based ranks, ties averaged
    ranks = average_rank[inverse]
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def detection(score: np.ndarray, flagged: np.ndarray, flipped: np.ndarray) -> dict[str, float | None]:
    """Share flagged, precision and recall of the flags against the true flips, AUROC of the score."""
    flagged, flipped = np.asarray(flagged, dtype=bool), np.asarray(flipped, dtype=bool)
    hits = int((flagged & flipped).sum())
    return dict(det_flagged=_share(int(flagged.sum()), flagged.size, 1.0),
                det_precision=_share(hits, int(flagged.sum()), 1.0),
                det_recall=_share(hits, int(flipped.sum()), 1.0), det_auroc=auroc(score, flipped))


@torch.no_grad()
def epoch_numbers(train_logits: torch.Tensor, noisy: torch.Tensor, clean: torch.Tensor, test_logits: torch.Tensor,
                  test_labels: torch.Tensor, judged: tuple[torch.Tensor, torch.Tensor] | None) -> dict[str, Any]:
    """One member's row of `DIAGNOSTIC_COLUMNS` from its logits on the training sample (`train_sample`; its noisy
    and clean labels) and on the whole test set."""
    out: dict[str, Any] = dict.fromkeys(DIAGNOSTIC_COLUMNS)
    out["test_acc"] = _share(int((test_logits.argmax(-1) == test_labels).sum()), test_labels.numel(), 100.0)
    out.update(memorisation(train_logits.argmax(-1), noisy, clean))
    if judged is not None:
        known = (clean >= 0).cpu().numpy()
        score, flagged = (t.float().cpu().numpy()[known] for t in judged)
        out.update(detection(score, flagged, (noisy != clean).cpu().numpy()[known]))
    return out
