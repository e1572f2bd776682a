"""Turns: what the training loop calls after each optimiser step, handed down from the unit's executor to
`bench.exec.stage.train_epoch` through `run_trial` (never found by the loop on its own). A trial alone takes no turns
(`ALONE`); the members of a streams unit (`bench.exec.executors.streams`) hand the thread on to the next member
there, so that it launches its step while this one's runs on the GPU.

A member may learn at its turn that its unit has ended (another member met an error a retry may cure): `after_step`
then raises `Stopped`, an ordinary exception that `run_trial` lets through as it lets `UserError` through, writing
no failed row, since the member did not fail: it resumes from its checkpoint when the unit is retried.
"""

from __future__ import annotations


class Turns:
    """The hook of a trial that trains alone: after each step, nothing."""

    def after_step(self) -> None:
        return None


ALONE = Turns()


class Stopped(Exception):  # noqa: N818 - not the trial's error: its unit ended it at its turn
    """Raised at a trial's turn once its unit has ended; the trial writes no row (`run_trial`) and resumes from its
    checkpoint when the unit is retried."""
