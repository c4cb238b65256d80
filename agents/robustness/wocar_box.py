"""WocaR's admissible actions and worst-action search for Gaussian policies on Box actions.

The continuous half of :mod:`agents.robustness.wocar` (Liang et al., NeurIPS 2022, Section 4
and its MuJoCo code): an attacker who moves the observation within ``s ± eps · scale`` moves
the Gaussian policy's *mean* ``mu(s_hat)``, and the actions it can induce are taken as the box
of that mean's bounds over the ball, from :mod:`robustgrad.bounds`
(:func:`admissible_box`, sound: the tests sample the ball), clipped to the action space's
bounds as the environment clips the actions it receives. The worst-attack critic's target
needs ``min_{a in box} Q_w(s, a)``, found by :func:`worst_action_in_box`: the box's ``2^k``
corners when ``k <= MAX_CORNER_DIMS`` action dimensions, then ``steps`` projected sign-gradient
steps on ``Q_w`` (the paper's code: 100 steps of ``(ub − lb) / 100`` from the mean), keeping
each row's lowest value seen, the clean mean included, so the result is never above
``Q_w`` at the clean action. The cost per state: ``2^k + 1`` forward passes of ``Q_w`` and
``steps`` forward and backward passes; :func:`q_spread_in_box` runs it twice (a min and a max)
for the state importance ``ω(s)`` over the whole action space.

On a Pendulum agent at eps 0.2 (standard deviations; docs/benchmarks/robust-rl.md, "WocaR-PPO
on Box actions") the mean's sampled range is 0.52 wide, the IBP box 2.71 (1.7 ms per 2048-state
rollout), CROWN-IBP's 1.09 (48 ms), CROWN's 0.69 (247 ms); the box and the search together
(IBP) 15.7 ms per rollout.

The seed axis (``num_seeds = S > 1``): every function here also takes each ``[B, ...]`` as
``[S, B, ...]`` (a seed-axis surface's observations, each seed's rows bounded through its own
network by one bound call; the search's rows are independent, so seed ``s``'s are what it finds
alone).

>>> import tensorflow as tf
>>> q = lambda a: tf.reduce_sum(tf.square(a - 0.3), -1)        # lowest at a = 0.3
>>> a, v = worst_action_in_box(q, tf.constant([[-1.0]]), tf.constant([[1.0]]),
...                            tf.constant([[0.9]]), steps=20)
>>> round(float(a[0, 0]), 1), float(v[0]) < 0.01
(0.3, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from agents.robustness.certify import output_bounds

if TYPE_CHECKING:
    from agents.core.policy import PolicySurface

__all__ = ["MAX_CORNER_DIMS", "SEARCH_STEPS", "action_to_unit", "admissible_box", "box_corners",
           "q_spread_in_box", "worst_action_in_box"]

MAX_CORNER_DIMS = 4
"""Up to this many action dimensions, :func:`worst_action_in_box` also evaluates the box's
``2^k`` corners (16 forward passes at most) before its gradient steps."""


SEARCH_STEPS = 10
"""The projected sign steps of WocaR-PPO's worst-action search (:func:`worst_action_in_box`;
the default of ``wocar_search_steps``, :attr:`agents.WocaR.DEFAULTS`; the paper's code: 100
steps of ``(ub − lb) / 100``; with the corners first, 10 steps of ``(ub − lb) / 10`` reach
every point of the box)."""


def admissible_box(surface: PolicySurface, obs: tf.Tensor, eps: float | tf.Tensor,
                   method: str = "ibp") -> tuple[tf.Tensor, tf.Tensor]:
    """``(lower, upper)`` ``[B, k]`` float32, stopped: the box of the Gaussian mean
    ``mu(s_hat)`` over the ball ``obs ± eps · scale`` (``obs [B, d]`` raw; ``method``
    ``"ibp"``, ``"crown"`` or ``"crown-ibp"``, :func:`agents.robustness.certify.output_bounds`),
    clipped to the surface's action bounds (the environment clips what it receives, so an
    action beyond them is the bound itself). Contains ``mu(s_hat)`` (clipped) for every
    ``s_hat`` in the ball. Unchecked (runs inside the compiled update).

    >>> import agents
    >>> agent = agents.PPO(env="Pendulum-v1", num_envs=2, n_steps=8, preset=None)
    >>> lo, hi = admissible_box(agent.policy_surface(), tf.constant([[0.1, 0.9, 0.3]]), 0.0)
    >>> bool(tf.reduce_all(tf.abs(hi - lo) < 1e-5))    # eps 0: the (clipped) mean itself
    True
    >>> obs = tf.constant([[0.1, 0.9, 0.3]])
    >>> lo, hi = admissible_box(agent.policy_surface(), obs, 0.5)
    >>> mean = agent.policy_surface().deterministic_actions(obs)
    >>> bool(tf.reduce_all((lo <= mean) & (mean <= hi) & (hi - lo > 0.0)))
    True
    """
    obs = tf.stop_gradient(tf.convert_to_tensor(obs, tf.float32))
    lb, ub = output_bounds(surface, obs, eps, method)
    low, high = surface.action_low, surface.action_high
    if low is not None and high is not None:
        lb, ub = tf.clip_by_value(lb, low, high), tf.clip_by_value(ub, low, high)
    return tf.stop_gradient(lb), tf.stop_gradient(ub)


def action_to_unit(actions: tf.Tensor, low: np.ndarray, high: np.ndarray) -> tf.Tensor:
    """Actions ``[B, k]`` clipped to ``[low, high]`` and mapped affinely to ``[-1, 1]`` (the
    worst-attack critic's action input; ``low``, ``high`` finite ``[k]``).

    >>> action_to_unit(tf.constant([[-2.0], [1.0], [5.0]]), np.array([-2.0]), np.array([2.0])
    ...                ).numpy().ravel().tolist()
    [-1.0, 0.5, 1.0]
    """
    low32, high32 = np.asarray(low, np.float32), np.asarray(high, np.float32)
    a = tf.clip_by_value(tf.cast(actions, tf.float32), low32, high32)
    return (a - 0.5 * (low32 + high32)) / (0.5 * (high32 - low32))


def box_corners(lower: tf.Tensor, upper: tf.Tensor) -> tf.Tensor:
    """The ``2^k`` corners ``[2^k, B, k]`` of the boxes ``[lower, upper]`` ``[B, k]`` (``k``
    static).

    >>> box_corners(tf.constant([[0.0, 1.0]]), tf.constant([[2.0, 3.0]]))[:, 0].numpy().tolist()
    [[0.0, 1.0], [0.0, 3.0], [2.0, 1.0], [2.0, 3.0]]
    """
    k = int(lower.shape[-1])
    bits = np.array([[(i >> (k - 1 - j)) & 1 for j in range(k)] for i in range(2 ** k)],
                    np.float32)  # [2^k, k]
    # [2^k, 1, ..., 1, k] against [2^k, (S,) B, k]; exact bounds (no lower + (upper - lower))
    pick = tf.reshape(tf.constant(bits > 0.5), [2 ** k] + [1] * (lower.shape.rank - 1) + [k])
    shape = tf.concat([[2 ** k], tf.shape(lower)], 0)
    return tf.where(pick, tf.broadcast_to(upper[None], shape),
                    tf.broadcast_to(lower[None], shape))


def worst_action_in_box(q: Callable[[tf.Tensor], tf.Tensor], lower: tf.Tensor,
                        upper: tf.Tensor, start: tf.Tensor, steps: int = 10,
                        sign: float = 1.0) -> tuple[tf.Tensor, tf.Tensor]:
    """``(action [B, k], value [B])``, stopped: the lowest ``q(action)`` found in the boxes
    ``[lower, upper]`` ``[B, k]`` (``sign=-1``: the highest, its value returned as ``q``'s).
    ``q``: actions ``[B, k]`` -> values ``[B]`` (the states fixed inside it). Candidates: ``start``
    (clipped into the box; the clean mean), the box's corners when ``k <= MAX_CORNER_DIMS``;
    from the best of them ``steps`` sign-gradient steps of ``(upper − lower) / steps``,
    projected on the box; each row keeps its best value over every point evaluated, so
    ``value <= q(clip(start))`` (``sign=1``) always. Unchecked (runs inside the compiled update).
    """
    lower = tf.stop_gradient(tf.cast(lower, tf.float32))
    upper = tf.stop_gradient(tf.cast(upper, tf.float32))
    sign = float(sign)

    def score(a):  # lower is better
        return sign * tf.cast(q(a), tf.float32)

    best_a = tf.clip_by_value(tf.stop_gradient(tf.cast(start, tf.float32)), lower, upper)
    best_v = score(best_a)
    if int(lower.shape[-1]) <= MAX_CORNER_DIMS:
        corners = box_corners(lower, upper)  # [C, B, k]
        for c in range(int(corners.shape[0])):
            v = score(corners[c])
            better = v < best_v
            best_a = tf.where(better[..., None], corners[c], best_a)
            best_v = tf.minimum(v, best_v)
    if steps > 0:
        size = (upper - lower) / float(steps)

        def body(i, a, ba, bv):
            with tf.GradientTape() as tape:
                tape.watch(a)
                v = score(a)
            g = tape.gradient(v, a)
            better = v < bv
            ba = tf.where(better[..., None], a, ba)
            bv = tf.minimum(v, bv)
            a = tf.clip_by_value(a - size * tf.sign(g), lower, upper)
            return i + 1, tf.stop_gradient(a), ba, bv

        _, a, best_a, best_v = tf.while_loop(lambda i, *_: i < steps, body,
                                             (tf.constant(0), best_a, best_a, best_v))
        v = score(a)  # the last step's point
        better = v < best_v
        best_a = tf.where(better[..., None], a, best_a)
        best_v = tf.minimum(v, best_v)
    return tf.stop_gradient(best_a), tf.stop_gradient(sign * best_v)


def q_spread_in_box(q: Callable[[tf.Tensor], tf.Tensor], lower: tf.Tensor, upper: tf.Tensor,
                    start: tf.Tensor, steps: int = 10) -> tf.Tensor:
    """``max_a q(a) − min_a q(a)`` ``[B]`` over the boxes ``[lower, upper]`` ``[B, k]``, each
    extreme from :func:`worst_action_in_box` (so an inner estimate: never above the true
    spread, never negative); stopped.

    >>> q = lambda a: tf.reduce_sum(tf.square(a), -1)
    >>> round(float(q_spread_in_box(q, tf.constant([[-1.0]]), tf.constant([[2.0]]),
    ...                             tf.constant([[0.5]]))[0]), 1)   # 4 - min(a^2) ~ 0.01
    4.0
    """
    _, low = worst_action_in_box(q, lower, upper, start, steps, sign=1.0)
    _, high = worst_action_in_box(q, lower, upper, start, steps, sign=-1.0)
    return tf.stop_gradient(tf.maximum(high - low, 0.0))
