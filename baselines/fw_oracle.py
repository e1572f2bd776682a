"""FW with the true T: forward correction handed the transition matrix that generated the noise.

Patrini, Rozza, Menon, Nock, Qu. Making Deep Neural Networks Robust to Label Noise: a Loss Correction Approach.
CVPR 2017 (their "FW with known T" rows).

    l(h(x), y~) = -log sum_i softmax(h(x))_i T[i, y~]        with T the true noise transition

It reads privileged information (`uses_true_transition`): a diagnostic upper reference for FW, flagged in the
result row, never a competitor. It trains on FW's method stage wherever the paper's code gives FW one (CIFAR-10,
CIFAR-100, Dogs vs Cats, MR: their `method_stages`), so that the two differ in T alone.

Reference: giorgiop/loss-correction, experiment.py and loss.py (commit 15a79de): the "forward" loss with the true
P, which the L_DMI paper does not run.

Differences (`ForwardOracle.differences`):
- Trained after the CE warm start — Patrini's 'forward' with the true P trains from scratch (their estimated-T runs,
  like ours, go on from the cross-entropy model).
- The loss -log (p T)[y~] in log space without clipping p — Patrini's Keras loss clips p to [1e-7, 1 - 1e-7] first
  (the loss is bounded below by 0 either way).
"""

from __future__ import annotations

import torch

from bench.baselines.fw import Forward
from bench.config import UserError
from bench.data import Dataset
from bench.methods import StageContext


class ForwardOracle(Forward):
    """Forward correction with the true T (privileged diagnostic)."""

    name = "fw_oracle"
    title = "FW with the true T (oracle)"
    uses_true_transition = True
    defaults = {}
    ranges = {}  # no anchor points to estimate: the true T needs no quantile
    reference = "giorgiop/loss-correction, experiment.py and loss.py, commit 15a79de"
    differences = (
        "Trained after the CE warm start — Patrini's 'forward' with the true P trains from scratch (their "
        "estimated-T runs, like ours, go on from the cross-entropy model).",
        "The loss -log (p T)[y~] in log space without clipping p — Patrini's Keras loss clips p to [1e-7, 1 - 1e-7] "
        "first "
        "(the loss is bounded below by 0 either way).",
    )

    @classmethod
    def refuses(cls, dataset: type[Dataset], noise: str) -> str | None:
        if dataset.is_real_noise(noise):
            return f"it needs the true T, and {dataset.name}'s {noise!r} labels are real noise with no known T"
        if not dataset.has_transition(noise):
            return f"it needs the true T, and {noise!r} noise has none: each noisy label depends on its example"
        return None

    def setup(self, stage: StageContext) -> None:
        if stage.true_transition is None:
            raise UserError("fw_oracle needs the true transition matrix; human and instance-dependent noise have none")
        self.transition = torch.as_tensor(stage.true_transition, dtype=torch.float64, device=stage.device)
