"""The attack cascade of :func:`attacks.evaluate`: spend effort only on points still robust.

As in AutoAttack (Croce & Hein 2020, "Reliable evaluation of adversarial robustness with an
ensemble of diverse parameter-free attacks"), the attacks run in order and each one only attacks
the examples every earlier attack failed on, so a strong first attack makes the rest cheap and
the last row is the per-example worst case over the ensemble. Attacks that declare
``supports_early_stop`` also freeze each example once it is broken.

Budgets run in increasing order, and an example broken at a smaller eps counts as broken at every
larger one (its adversarial example lies in the larger ball too): the worst case at eps is over
every budget up to eps, and the cascade does not attack such an example again.

``cascade=False`` runs every attack on every correctly classified example instead (each row is
then that attack's own robust accuracy) and takes the worst case from the final predictions.

A linear two-class model whose margins are 0.1 and 0.8 (FGSM with budget eps lowers a margin by
``2 eps``): the first example breaks at eps 0.1, the second only at 0.5, where the first is
carried over and not attacked again.

>>> import numpy as np, tensorflow as tf
>>> from attacks import FGM
>>> weights = tf.constant([[1.0, -1.0], [-1.0, 1.0]])
>>> model = lambda x, training=False: tf.matmul(x, weights)
>>> x = np.array([[0.55, 0.45], [0.9, 0.1]], np.float32)
>>> y = np.array([0, 0])
>>> outcomes = run_cascade(model, x, y, [("fgsm", FGM())], [0.1, 0.5], norm="linf",
...                        clip_min=0.0, clip_max=1.0)
>>> [(o.eps, o.records[0].attacked, o.carried, o.robust_accuracy) for o in outcomes]
[(0.1, 2, 0, 0.5), (0.5, 1, 1, 0.0)]
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad import checks as _checks

from ._base import Attack, call_model
from .norms import norm as batch_norm
from .report import AttackRecord

__all__ = ["CARRIED", "MISCLASSIFIED", "ROBUST", "AttackRun", "BudgetOutcome", "attack_subset",
           "predict_labels", "predict_logits", "run_cascade"]

_TOLERANCE = 1e-6  # slack of the budget and bounds test of every attack's output

ROBUST, CARRIED, MISCLASSIFIED = -1, -2, -3
"""Values of :attr:`BudgetOutcome.broken_by` for examples no attack broke at that eps."""


def predict_logits(model: Callable, x: np.ndarray, batch_size: int) -> np.ndarray:
    """``model(x, training=False)`` in batches of ``batch_size``, as a NumPy ``[N, C]`` array."""
    out = [tf.convert_to_tensor(call_model(model, tf.constant(x[i:i + batch_size]), False)).numpy()
           for i in range(0, len(x), batch_size)]
    return np.concatenate(out, axis=0)


def predict_labels(model: Callable, x: np.ndarray, batch_size: int) -> np.ndarray:
    """The predicted classes ``[N]`` (argmax of :func:`predict_logits`)."""
    return predict_logits(model, x, batch_size).argmax(1)


@dataclasses.dataclass
class AttackRun:
    """One attack run on a subset of the examples, in batches (arrays follow the subset's order).

    Attributes:
      x_adv: ``[M, ...]`` the attack's outputs.
      predicted: ``[M]`` the model's classes on ``x_adv``.
      distances: ``[M]`` ``‖x_adv - x‖`` in the threat model's norm.
      gradient_passes, forward_passes: example-rows the attack itself spent (as it reports them).
      seconds: wall time of the attack calls and the predictions.
      outside_budget: whether any output left the eps ball or the bounds (a bug in the attack).
    """

    x_adv: np.ndarray
    predicted: np.ndarray
    distances: np.ndarray
    gradient_passes: int
    forward_passes: int
    seconds: float
    outside_budget: bool


@dataclasses.dataclass
class BudgetOutcome:
    """The cascade's result at one eps.

    Attributes:
      eps: the budget.
      records: one :class:`AttackRecord` per attack, in the attacks' order.
      robust: ``[N]`` bool, correctly classified and not broken at this eps or a smaller one.
      x_worst: ``[N, ...]`` the worst-case adversarial inputs (``x`` where none was found).
      carried: examples broken at a smaller eps, counted as broken here.
      broken_by_gradient_free: (cascade) examples a gradient-free attack broke after at least
        one earlier attack had failed on them.
      regressed: (``cascade=False``) examples broken at a smaller eps that survived every attack
        at this one.
      outside_budget: labels of the attacks whose outputs left the ball or the bounds.
      gradient_passes, forward_passes: example-rows spent at this eps, predictions included.
      broken_by: ``[N]`` int, per example the position of the first attack that broke it at this
        eps, or :data:`ROBUST` (-1), :data:`CARRIED` (-2: broken at a smaller eps),
        :data:`MISCLASSIFIED` (-3: wrong on the clean input).
      tallies: per record, the integer counts it was computed from (``robust``,
        ``attacked_correct``, ``hits``) and its successful distances' ``distance_sum``,
        ``distance_count``, ``distance_max``: what merging the outcomes of several chunks needs
        (:mod:`attacks.results`).
    """

    eps: float
    records: list[AttackRecord]
    robust: np.ndarray
    x_worst: np.ndarray
    carried: int
    broken_by_gradient_free: int
    regressed: int
    outside_budget: list[str]
    gradient_passes: int
    forward_passes: int
    broken_by: np.ndarray | None = None
    tallies: list[dict[str, float]] = dataclasses.field(default_factory=list)

    @property
    def robust_accuracy(self) -> float:
        """The per-example worst case over the ensemble and over every budget up to eps."""
        return float(self.robust.mean())


def budget_tolerance(x: np.ndarray, norm: str) -> float:
    """The slack of the budget test of outputs near ``x`` ``[M, ...]``: ``1e-6`` plus the
    rounding of ``x + delta`` in ``x``'s float type, which grows with the values' magnitude (one
    float32 ulp at 255 is 1.5e-5, so pixels in 0-255 moved by exactly eps measured up to eps +
    8e-6) and with the coordinates the norm sums (``sqrt(d)`` for L2, ``d`` for L1)."""
    if not len(x):
        return _TOLERANCE
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float32
    d = int(np.prod(x.shape[1:]))
    terms = {"linf": 1.0, "l2": float(np.sqrt(d))}.get(norm, float(d))
    return _TOLERANCE + 2.0 * float(np.finfo(dtype).eps) * float(np.max(np.abs(x))) * terms


def attack_subset(model: Callable, attack: Attack, x: np.ndarray, y: np.ndarray, *, eps: float,
                  norm: str, clip_min: Any, clip_max: Any, batch_size: int,
                  seed: int) -> AttackRun:
    """Run ``attack`` on ``x`` ``[M, ...]`` with labels (or targets) ``y`` ``[M]`` in batches.

    Batch ``b`` gets the seed ``seed + b``. Early stopping is requested from attacks that declare
    ``supports_early_stop``.
    """
    start = time.perf_counter()
    early_stop = {"early_stop": True} if getattr(attack, "supports_early_stop", False) else {}
    outputs, gradient_passes, forward_passes = [], 0, 0
    for batch_index, first in enumerate(range(0, len(x), batch_size)):
        result = attack.run(model, x[first:first + batch_size], y[first:first + batch_size],
                            eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                            seed=seed + batch_index, **early_stop)
        outputs.append(np.asarray(result.x_adv))
        gradient_passes += int(result.gradient_passes)
        forward_passes += int(result.forward_passes)
    x_adv = np.concatenate(outputs, axis=0) if outputs else np.zeros_like(x)
    predicted = (predict_labels(model, x_adv, batch_size) if len(x_adv)
                 else np.zeros(0, np.int64))
    distances = batch_norm(tf.constant(x_adv - x), norm).numpy() if len(x) else np.zeros(0)
    outside = bool(np.any(distances > eps + budget_tolerance(x, norm))
                   or np.any(x_adv < np.asarray(clip_min) - _TOLERANCE)
                   or np.any(x_adv > np.asarray(clip_max) + _TOLERANCE))
    return AttackRun(x_adv=x_adv, predicted=predicted, distances=distances,
                     gradient_passes=gradient_passes, forward_passes=forward_passes,
                     seconds=time.perf_counter() - start, outside_budget=outside)


def _record(label: str, attack: Attack, eps: float, norm: str, run: AttackRun, *,
            robust_accuracy: float, attacked_correct: np.ndarray, hits: np.ndarray,
            broken: int, successful_distances: np.ndarray, targeted: bool) -> AttackRecord:
    attacked = len(run.predicted)
    return AttackRecord(
        attack=label, eps=eps, norm=norm, robust_accuracy=robust_accuracy,
        success_rate=float(hits[attacked_correct].mean()) if attacked_correct.any() else 0.0,
        attacked=attacked, broken=broken,
        mean_norm=float(successful_distances.mean()) if len(successful_distances) else float("nan"),
        max_norm=float(successful_distances.max()) if len(successful_distances) else float("nan"),
        gradient_passes=run.gradient_passes, forward_passes=run.forward_passes,
        seconds=run.seconds,
        images_per_second=attacked / run.seconds if run.seconds > 0 else float("inf"),
        targeted=targeted)


def _attack_budget(model, x, y, targets, correct, attacks, eps, eps_index, previously_broken,
                   previous_worst, *, norm, clip_min, clip_max, batch_size, cascade, seed,
                   progress, progress_offset) -> BudgetOutcome:
    """Every attack at one eps (see :func:`run_cascade`)."""
    n = len(x)
    still_robust = correct & ~previously_broken if cascade else correct.copy()
    x_worst = previous_worst.copy()
    broken_by_any = np.zeros(n, bool)
    broken_by_gradient_free = 0
    records, outside_budget, tallies = [], [], []
    broken_by = np.full(n, ROBUST, np.int64)
    broken_by[~correct] = MISCLASSIFIED
    broken_by[correct & previously_broken] = CARRIED
    gradient_passes = forward_passes = 0
    for attack_index, (label, attack) in enumerate(attacks):
        if progress is not None:
            progress(progress_offset + attack_index, f"{label} eps={eps:g}")
        targeted = bool(attack.config.get("targeted", False))
        attacked = np.flatnonzero(still_robust) if cascade else np.arange(n)
        goal = targets if targeted else y
        run = attack_subset(model, attack, x[attacked], goal[attacked], eps=eps, norm=norm,
                            clip_min=clip_min, clip_max=clip_max, batch_size=batch_size,
                            seed=int(seed) * 1_000_003 + eps_index * 10007 + attack_index * 101)
        if run.outside_budget:
            outside_budget.append(label)
        misclassified = np.zeros(n, bool)
        misclassified[attacked] = run.predicted != y[attacked]
        newly_broken = misclassified & still_robust
        x_worst[attacked[newly_broken[attacked]]] = run.x_adv[newly_broken[attacked]]
        broken_by_any |= misclassified
        broken = int(newly_broken.sum())
        broken_by[newly_broken & (broken_by == ROBUST)] = attack_index
        if attack.gradient_free and cascade and attack_index > 0:
            broken_by_gradient_free += broken
        if cascade:
            still_robust &= ~misclassified
            robust_accuracy = float(still_robust.mean())
        else:
            robust_accuracy = float((correct & ~misclassified).mean())
        hits = run.predicted == targets[attacked] if targeted else misclassified[attacked]
        successful = run.distances[misclassified[attacked] & correct[attacked]]
        records.append(_record(
            label, attack, eps, norm, run, robust_accuracy=robust_accuracy,
            attacked_correct=correct[attacked], hits=hits, broken=broken,
            successful_distances=successful, targeted=targeted))
        robust_count = still_robust if cascade else correct & ~misclassified
        tallies.append({
            "robust": int(robust_count.sum()), "attacked_correct": int(correct[attacked].sum()),
            "hits": int(hits[correct[attacked]].sum()),
            "distance_sum": float(successful.sum()), "distance_count": len(successful),
            "distance_max": float(successful.max()) if len(successful) else float("nan")})
        gradient_passes += run.gradient_passes
        forward_passes += run.forward_passes + len(attacked)
    regressed = 0
    if not cascade:  # the worst case: broken by any attack or at a smaller eps
        still_robust = correct & (predict_labels(model, x_worst, batch_size) == y)
        forward_passes += n
        regressed = int((previously_broken & correct & ~broken_by_any).sum())
    return BudgetOutcome(eps=eps, records=records, robust=still_robust, x_worst=x_worst,
                         carried=int(previously_broken.sum()),
                         broken_by_gradient_free=broken_by_gradient_free, regressed=regressed,
                         outside_budget=outside_budget, gradient_passes=gradient_passes,
                         forward_passes=forward_passes, broken_by=broken_by, tallies=tallies)


def run_cascade(model: Callable, x: np.ndarray, y: np.ndarray,
                attacks: Sequence[tuple[str, Attack]], eps: Sequence[float], *, norm: str,
                clip_min: Any, clip_max: Any, correct: np.ndarray | None = None,
                targets: np.ndarray | None = None, batch_size: int = 256, cascade: bool = True,
                seed: int = 0,
                progress: Callable[[int, str], None] | None = None) -> list[BudgetOutcome]:
    """Attack ``x`` ``[N, ...]`` (labels ``y`` ``[N]``) with ``attacks`` at each budget in ``eps``.

    Args:
      model: ``model(x, training=False) -> logits [N, C]``.
      attacks: ``(label, Attack)`` pairs (see :func:`attacks.registry.parse_attacks`), cheap
        first: the order of the cascade.
      eps: budgets, run in increasing order (sorted here).
      norm, clip_min, clip_max: the threat model given to every attack.
      correct: ``[N]`` bool, the correctly classified examples (computed when ``None``).
      targets: ``[N]`` target classes for attacks configured with ``targeted=True``.
      batch_size: examples per attack call and per prediction.
      cascade: attack only the still-robust examples; ``False`` attacks every example.
      seed: base seed; the attack at position ``a``, budget ``e`` and batch ``b`` gets
        ``seed * 1000003 + e * 10007 + a * 101 + b`` (the same evaluation is reproducible).
      progress: called as ``progress(done, description)`` before each attack at each eps, with
        ``done`` the number of (attack, eps) units finished.

    Returns:
      one :class:`BudgetOutcome` per eps, in increasing eps.
    """
    batch_size = _checks.positive_int(batch_size, "batch_size")
    norm = _checks.norm_name(norm)
    budgets = sorted(_checks.nonnegative(e, "eps") for e in eps)
    x = np.asarray(x)
    y = np.asarray(y)
    if y.shape != (len(x),):
        raise ValueError(f"y must be {len(x)} labels (one per example of x), got shape {y.shape}")
    for label, attack in attacks:  # an attack that cannot run here: before any of them runs
        try:
            attack.check_example_shape(tuple(x.shape[1:]))
        except ValueError as error:
            raise ValueError(f"attacks: {label}: {error}") from None
    if correct is None:
        correct = predict_labels(model, x, batch_size) == y
    correct = np.asarray(correct, bool)
    if correct.shape != y.shape:
        raise ValueError(f"correct must be {len(x)} booleans, got shape {correct.shape}")
    if targets is None and any(a.config.get("targeted", False) for _, a in attacks):
        raise ValueError("targets: a targeted attack needs target classes, got None")
    outcomes: list[BudgetOutcome] = []
    previously_broken = np.zeros(len(x), bool)
    previous_worst = x.copy()
    for eps_index, budget in enumerate(budgets):
        outcome = _attack_budget(
            model, x, y, targets, correct, attacks, budget, eps_index, previously_broken,
            previous_worst, norm=norm, clip_min=clip_min, clip_max=clip_max,
            batch_size=batch_size, cascade=cascade, seed=seed, progress=progress,
            progress_offset=eps_index * len(attacks))
        outcomes.append(outcome)
        previously_broken = correct & ~outcome.robust
        previous_worst = outcome.x_worst
    return outcomes
