"""Tolerances for tests that compare two computations of one number: each derived here from float rounding.

A tolerance read off one machine's output fails on the next, whose vector width, kernels or thread count sum in
another order (an AVX2 CPU gave a packed member's loss 3.7e-5 away from its solo trial's; AVX-512 gave 1e-7). So the
tests compare exactly what must be bit-equal (ids, hashes, labels, counts, a resumed run against an uninterrupted
one in the same process), and bound the rest with the rules below.

Rounding. Float32 rounds each operation to a relative U32 = 2**-24 (6.0e-8). A sum of n terms, in whatever order
(threads, vector lanes, blocking), is off by at most (n - 1) U32 sum|x_i| (Higham, Accuracy and Stability of
Numerical Algorithms, 2nd ed., eq. 4.4). A result built from `terms` same-sign terms of `ops` rounded operations
each (exp, log, a division, a short sum over classes) is then within (terms + ops) U32 of the exact value: `f32`.
The references are float64 computations (U64 = 2**-53) on the same float32 inputs: exact at that scale. Where terms
cancel (a difference of means), the bound is relative to the magnitudes, so it is used as an absolute tolerance
times them. pytest.approx's default (rel 1e-6) stays where `f32` of the computation is below it (at most about
eight terms and operations) or both sides are float64.

Training. Two float orders of one training (a packed member and its solo trial: grouped against single
convolutions) start from bit-equal weights, data order, dropout masks and labels, and part two ways:
- rounding carried along: each step's gradient differs by its rounding, about sqrt(n) U32 for a reduction of n
  terms (rounding errors add like a random walk: Higham §2.8), at most 6e-6 for the n <= 1e4 of these tests'
  models; Adam's step m / sqrt(v) is scale-free, so a relative error in the gradient goes into the step without
  growing: after k <= 200 steps, within 200 x 6e-6 = 1.2e-3;
- kinks: a ReLU or max-pool input within rounding of its kink takes the other branch in one of the two runs (about
  one input in 10^7: two or so per hundred steps of these models), which changes at most one example's share (1/B)
  of one step; a step moves these tests' losses by at most 3% (B = 16; 1% at B = 128), so two such events move
  a loss by at most 2 x 3% / 16 = 3.8e-3.
Together TRAINED_REL = 5e-3 of a trained loss (seen: 3e-7 with AVX-512 kernels at 1, 2 and 4 threads; 1e-4 with
AVX2 ones, after a kink). A member trained with anything but its own randomness or learning rate parts from its
solo trial by percents (a learning rate 1% off: 8e-3; 10% off: 3e-2, which the packed test checks it catches).
An accuracy moves only where an example's margin lies within that distance of zero: for the few hundred to thousand
test examples here, whose margins spread over units, one example at most (`ACCURACY_EXAMPLES`). A selection (the
epoch of least validation loss) is the same unless two epochs' losses lie within TRAINED_REL of each other
(`same_selection`).

bf16 (precision bf16: forward passes under autocast, `bench.exec.prepare.autocast`). A product of bf16 inputs is
accumulated in float32 and rounded to bf16, of unit roundoff U_BF16 = 2**-8 (8 bits of significand). One forward
pass against its exact value: `bf16_linear` bounds a linear layer whose inputs, weights and output are rounded to
bf16. Two float orders of one bf16 training (a packed member and its solo trial) round the same float32
accumulations to bf16: their results are equal except where the two accumulations, about sqrt(n) U32 apart (n <= 128
here: 7e-7 relative), lie on either side of a bf16 rounding boundary, which happens to a value with probability
sqrt(n) U32 / (2 U_BF16) = 1.4e-4, and then differ by one bf16 step, 2 U_BF16 = 7.8e-3 of the value. These tests' MLP
(B = 128, 10 -> 32 -> 2) rounds per step about B x 34 x 2 = 8,700 activations and their gradients, and 400 weight
gradients: 1.2 and 0.06 such flips a step, 290 and 14 over the 240 steps of 8 epochs. An activation's flip moves one
example's share (1/B) of one step by 7.8e-3, and a step moves a loss by at most 1% at B = 128: 6e-7 a flip; a weight
gradient's flip moves one parameter's step by 7.8e-3 of itself (Adam's step is scale-free), at most 1% x 7.8e-3 =
7.8e-5 of the loss. At twice those counts (a Poisson count of 14 exceeds 28 with probability 5e-4), 2 x (290 x 6e-7 +
14 x 7.8e-5) = 2.5e-3, on top of float32's own part and the kinks (TRAINED_REL: accumulation and the master weights
stay float32): BF16_TRAINED_REL = 7.5e-3 (seen: 3.5e-4 at 1, 2 and 4 threads). An accuracy is not bounded the same
way: a logit rounded to bf16 moves by up to U_BF16 of itself (0.02 at the logits of 5 here), and the synthetic set's
noisy-label models put 5 to 10 of 1,000 test examples' margins that close to zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

U32 = 2.0**-24
U64 = 2.0**-53
U_BF16 = 2.0**-8
TRAINED_REL = 5e-3
BF16_TRAINED_REL = 7.5e-3
ACCURACY_EXAMPLES = 1


def f32(terms: int, ops: int = 0) -> float:
    """Relative bound on a float32 result made of `terms` same-sign terms of `ops` rounded operations each, against
    its exact value, whatever the order of its sums."""
    return (terms + ops) * U32


def within(got: object, want: object, rel: float = 0.0, atol: float = 0.0) -> bool:
    """|got - want| <= rel |want| + atol, elementwise: a relative and an absolute rounding bound add up (where
    pytest.approx would take the larger of the two)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return bool(np.all(np.abs(got - want) <= rel * np.abs(want) + atol))


def trained_close(a: float, b: float) -> bool:
    """Two float orders of one training agree on a trained loss (see the module's docstring)."""
    return math.isclose(a, b, rel_tol=TRAINED_REL)


def bf16_trained_close(a: float, b: float) -> bool:
    """Two float orders of one bf16 training agree on a trained loss (see the module's docstring)."""
    return math.isclose(a, b, rel_tol=BF16_TRAINED_REL)


def bf16_linear(x: np.ndarray, w: np.ndarray, b: np.ndarray, x_error: np.ndarray) -> np.ndarray:
    """Absolute bound on each output of a linear layer x @ w.T + b under bf16 autocast, against its exact value on the
    exact inputs x (float64 arrays). `x_error` bounds each input's distance, as the layer reads it in bf16, from x:
    U_BF16 |x| for a float32 input, an earlier layer's bound for its bf16 output. The weights and the bias are rounded
    to bf16 (U_BF16 each), the products of bf16 numbers are exact in float32, their float32 sum with the bias is off
    by at most f32(n + 1) of the terms' magnitudes, and the sum is rounded to bf16 (U_BF16 of itself):
    |s - y| <= (1 + U_BF16) |w| x_error + U_BF16 (|w| |x| + |b|) before the float32 sum, and the last rounding adds
    U_BF16 (|y| + the error so far)."""
    aw = np.abs(w).T
    magnitudes = np.abs(x) @ aw + np.abs(b)  # >= |y|
    error = (1 + U_BF16) * (x_error @ aw) + U_BF16 * magnitudes
    error += f32(x.shape[-1] + 1) * (1 + U_BF16) * ((np.abs(x) + x_error) @ aw + np.abs(b))
    return error * (1 + U_BF16) + U_BF16 * magnitudes


def same_accuracy(a: float, b: float, examples: int) -> bool:
    """Accuracies in percent over `examples` examples that differ by at most `ACCURACY_EXAMPLES` of them."""
    return abs(a - b) <= 100 * ACCURACY_EXAMPLES / examples + 1e-9


def same_selection(best_a: int, best_b: int, val_losses_b: Sequence[float]) -> bool:
    """Two runs select the same epoch, or epochs whose losses in run b are within rounding of training apart (a tie
    that either order may break); `val_losses_b[e]` is run b's validation loss after epoch e."""
    return best_a == best_b or trained_close(val_losses_b[best_a], val_losses_b[best_b])


def f32_log_softmax(max_logit: float, classes: int) -> float:
    """Absolute bound on a float32 log-softmax entry against its exact value, for logits within +-max_logit: the
    shift by the largest logit rounds by U32 2 max_logit, the sum of C exponentials by (C + 2) U32, the log and the
    last subtraction by U32 (2 max_logit + log C); (C + 4) U32 (2 max_logit + log C) bounds them together."""
    return (classes + 4) * U32 * (2 * max_logit + math.log(classes))

