"""Sanity checks of a robustness evaluation: signs that the attacks, not the model, failed.

AutoAttack's lesson (Croce & Hein 2020; its ``checks.py``) and Carlini et al.'s "On evaluating
adversarial robustness" (2019): an evaluation should check itself for gradient masking. Each
check returns its warning message (or ``None`` / an empty list when all is well), and
:func:`attacks.evaluate` adds the messages to the report and emits them with :mod:`warnings`:

* :func:`probability_warning`: the model outputs probabilities (rows summing to one), not logits;
* :func:`randomness_warning`: forward passes on the same inputs disagree (a randomised model: use
  ``autoattack-rand``, which averages gradients over passes);
* :func:`input_gradient_warnings`: input gradients that are missing, zero or non-finite;
* :func:`budget_warnings`: an attack output outside its budget or the bounds; a gradient-free
  attack breaking examples the gradient attacks could not; examples broken at a smaller eps that
  survive a larger one;
* :func:`non_monotone_warning`: worst-case robust accuracy increasing with eps;
* :func:`unbounded_attack_check`: an attack with eps = the whole input range failing to bring
  accuracy down to chance.

>>> non_monotone_warning({0.1: 0.4, 0.2: 0.3}) is None
True
>>> non_monotone_warning({0.1: 0.4, 0.2: 0.5})[:51]
'worst-case robust accuracy increases with eps: the '
>>> probability_warning(np.array([[0.25, 0.75], [0.5, 0.5]]))[:37]
'model outputs look like probabilities'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad import checks as _checks
from robustgrad.input_gradients import ZERO_GRADIENT_FRACTION  # one threshold for both

from ._base import call_model
from .cascade import BudgetOutcome, predict_labels

__all__ = [
    "UnboundedCheck",
    "budget_warnings",
    "input_gradient_warnings",
    "non_monotone_warning",
    "outside_budget_warning",
    "probability_warning",
    "randomness_warning",
    "unbounded_attack_check",
]


GRADIENT_FREE_MARGIN = 0.002
"""A gradient-free attack breaking more than this fraction of the examples (and at least one)
that the gradient attacks before it could not is a sign of gradient masking (AutoAttack's
``check_square_sr``: Square lowering robust accuracy by more than 0.2 points)."""

RANDOMNESS_PASSES = 5
RANDOMNESS_TOLERANCE = 1e-4
"""Forward passes of :func:`randomness_warning` and the largest L2 distance between two passes'
L2-normalised logits of an example that still counts as equal (AutoAttack's
``check_randomized``)."""

CHANCE_MARGIN = 0.05
"""Accuracy under the unbounded attack above chance + this margin means masking or a bug."""


def probability_warning(logits: np.ndarray) -> str | None:
    """A warning if ``logits`` ``[N, C]`` look like softmax outputs (checks the first 256 rows)."""
    if _checks.looks_like_probabilities(np.asarray(logits)[:256]):
        return ("model outputs look like probabilities (rows sum to 1): attack logits, not a "
                "softmax (gradient masking)")
    return None


def randomness_warning(model: Callable, x: np.ndarray, y: np.ndarray, batch_size: int,
                       passes: int = RANDOMNESS_PASSES) -> str | None:
    """A warning if ``passes`` forward passes on the first ``batch_size`` examples disagree: the
    number of correct predictions differs, or an example's L2-normalised logits move by more
    than :data:`RANDOMNESS_TOLERANCE` between two passes. A randomised model makes gradient
    attacks follow noise; AutoAttack's ``rand`` version (``"autoattack-rand"``) averages each
    gradient over 20 passes instead.

    >>> randomness_warning(lambda x, training=False: x, np.eye(3, dtype=np.float32),
    ...                    np.arange(3), 8) is None
    True
    """
    passes = _checks.positive_int(passes, "passes", minimum=2)
    inputs = tf.constant(x[: min(len(x), batch_size)])
    labels = np.asarray(y[: len(inputs)])
    outputs, correct = [], set()
    for _ in range(passes):
        logits = tf.cast(call_model(model, inputs, False), tf.float64).numpy()
        correct.add(int(np.sum(logits.argmax(1) == labels)))
        norms = np.linalg.norm(logits, axis=1, keepdims=True)
        outputs.append(logits / (norms + 1e-10))
    spread = max(float(np.linalg.norm(a - b, axis=1).max())
                 for i, a in enumerate(outputs) for b in outputs[i + 1:])
    if len(correct) > 1 or spread > RANDOMNESS_TOLERANCE:
        return ("the model's outputs differ between forward passes on the same inputs (a "
                "randomised model): gradient attacks follow noise and overestimate robustness; "
                "evaluate with attacks='autoattack-rand' (gradients averaged over 20 passes)")
    return None


def input_gradient_warnings(model: Callable, x: np.ndarray, y: np.ndarray,
                            batch_size: int) -> list[str]:
    """Warnings about the cross-entropy's input gradient on the first ``batch_size`` examples.

    Missing (the loss does not depend on ``x``), non-finite on any example, or exactly zero on
    more than :data:`ZERO_GRADIENT_FRACTION` of them (saturation or deliberate masking).
    """
    inputs = tf.constant(x[: min(len(x), batch_size)])
    labels = tf.constant(np.asarray(y[: len(inputs)]).astype(np.int32))
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        logits = call_model(model, inputs, False)
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=tf.cast(logits, tf.float32)))
    gradient = tape.gradient(loss, inputs)
    if gradient is None:
        return ["the loss has no gradient with respect to the input (disconnected model)"]
    rows = gradient.numpy().reshape(len(inputs), -1)
    messages = []
    finite_rows = np.isfinite(rows).all(axis=1)
    if not finite_rows.all():
        messages.append(f"non-finite input gradients on {int(np.sum(~finite_rows))} of "
                        f"{len(rows)} examples: gradient attacks cannot be trusted")
    zero_fraction = np.mean(np.all(rows == 0, axis=1))
    if zero_fraction > ZERO_GRADIENT_FRACTION:
        messages.append(f"input gradients are exactly zero on {zero_fraction:.0%} of examples "
                        "(saturation or gradient masking): gradient attacks will underestimate "
                        "vulnerability")
    return messages


def outside_budget_warning(label: str, eps: float) -> str:
    """The message for an attack whose outputs left its ball or the bounds."""
    return f"{label} returned points outside the eps={eps:g} ball or the bounds (bug)"


def budget_warnings(outcome: BudgetOutcome, gradient_free: Mapping[str, bool], n: int, *,
                    cascade: bool, sanity_checks: bool = True) -> list[str]:
    """The warnings of one eps of the cascade (:class:`attacks.cascade.BudgetOutcome`).

    ``gradient_free`` maps each attack label to its attack's ``gradient_free`` flag; ``n`` is the
    number of examples. Outputs outside the budget are reported even without ``sanity_checks``.
    """
    eps = outcome.eps
    messages = [outside_budget_warning(label, eps) for label in outcome.outside_budget]
    if not sanity_checks:
        return messages
    if not cascade and outcome.regressed:
        messages.append(f"eps={eps:g}: {outcome.regressed} examples broken at a smaller eps "
                        "survived every attack at this larger eps (the attacks are not "
                        "converging: more steps or restarts)")
    if cascade and outcome.broken_by_gradient_free > 0 and \
            outcome.broken_by_gradient_free > GRADIENT_FREE_MARGIN * n:
        messages.append(f"eps={eps:g}: a gradient-free attack broke "
                        f"{outcome.broken_by_gradient_free} examples the gradient attacks could "
                        "not: a sign of gradient masking, trust the worst case, not the "
                        "white-box numbers")
    if not cascade:
        white_box = [r.robust_accuracy for r in outcome.records if not gradient_free[r.attack]]
        black_box = [r.robust_accuracy for r in outcome.records if gradient_free[r.attack]]
        if white_box and black_box and min(black_box) < min(white_box) - GRADIENT_FREE_MARGIN:
            messages.append(f"eps={eps:g}: a gradient-free attack beats every gradient attack "
                            f"({min(black_box):.3f} < {min(white_box):.3f}): a sign of gradient "
                            "masking")
    return messages


def non_monotone_warning(worst_case: Mapping[float, float]) -> str | None:
    """A warning if the worst-case robust accuracy (eps -> accuracy) rises anywhere with eps."""
    accuracies = [worst_case[e] for e in sorted(worst_case)]
    if any(larger > smaller + 1e-9 for smaller, larger in zip(accuracies, accuracies[1:])):
        return ("worst-case robust accuracy increases with eps: the attacks are not converging "
                "(more steps/restarts) or gradients are masked")
    return None


@dataclasses.dataclass
class UnboundedCheck:
    """The result of :func:`unbounded_attack_check`: its warning (or ``None``), the eps it used
    and the example-rows it spent."""

    message: str | None
    eps: float
    gradient_passes: int
    forward_passes: int


def unbounded_attack_check(model: Callable, x: np.ndarray, y: np.ndarray, correct: np.ndarray,
                           *, norm: str, clip_min: Any, clip_max: Any, num_classes: int,
                           batch_size: int = 256, seed: int = 0,
                           max_examples: int = 200) -> UnboundedCheck:
    """PGD-40 on the CW margin with eps = the whole input range, on up to ``max_examples``
    correctly classified examples: accuracy should fall to chance (``1 / num_classes``) or below.

    Skipped (no message, nothing spent) when no example is correct or a bound is infinite.
    """
    from .pgd import run_iterative

    max_examples = _checks.positive_int(max_examples, "max_examples")
    num_classes = _checks.positive_int(num_classes, "num_classes", minimum=2)
    norm = _checks.norm_name(norm)
    chosen = np.flatnonzero(correct)[:max_examples]
    low = np.broadcast_to(np.asarray(clip_min, np.float64), x.shape[1:])
    high = np.broadcast_to(np.asarray(clip_max, np.float64), x.shape[1:])
    extent = high - low
    if len(chosen) == 0 or not np.all(np.isfinite(extent)):
        return UnboundedCheck(None, float("nan"), 0, 0)
    eps = {"linf": float(extent.max()), "l2": float(np.sqrt(np.sum(extent ** 2))),
           "l1": float(np.sum(extent))}[norm]
    result = run_iterative(model, x[chosen], y[chosen], eps=eps, norm=norm, clip_min=clip_min,
                           clip_max=clip_max, seed=seed, steps=40, step_size=eps / 10.0,
                           early_stop=True, objective="cw")
    predicted = predict_labels(model, np.asarray(result.x_adv), batch_size)
    accuracy = float(np.mean(predicted == y[chosen]))
    chance = 1.0 / num_classes
    message = None
    if accuracy > chance + CHANCE_MARGIN:
        message = (f"an unbounded attack (eps={eps:g}, the full input range) leaves accuracy "
                   f"{accuracy:.3f} on {len(chosen)} correctly classified examples, above chance "
                   f"({chance:.3f}): gradients are likely masked or the attack is broken")
    return UnboundedCheck(message, eps, int(result.gradient_passes),
                          int(result.forward_passes) + len(chosen))
