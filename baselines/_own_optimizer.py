"""Parameters a method owns beside the networks (VolMinNet's T, T-revision's slack, SOP's u and v), each with the
optimiser its paper gives them.

The trainer builds one optimiser for the networks and runs `loss.backward()` then `step()`; the method's own
parameters receive their gradients in that same backward pass. Nothing reads those parameters between the
backward pass and the method's next hook, so stepping them at the start of the next `train_loss` (and in
`end_epoch`, before validation) is the same update as stepping them right after the backward pass.
"""

from __future__ import annotations

import torch


def step_pending(optimizer: torch.optim.Optimizer | None) -> None:
    """Apply the gradients the last backward pass left on the method's own parameters, then clear them."""
    if optimizer is None:
        return
    if any(p.grad is not None for group in optimizer.param_groups for p in group["params"]):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
