"""WocaR on Box actions: the admissible box, the worst-action search and the plug-in.

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
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from agents.robustness.certify import output_bounds
from agents.robustness.robust import sa_observations
from agents.robustness.wocar_base import (
    WocaRPlugin,
    _current_graph,
    _standardize,
    state_importance,
)

if TYPE_CHECKING:
    from agents.core.base import Agent
    from agents.core.policy import PolicySurface

__all__ = ["MAX_CORNER_DIMS", "SEARCH_STEPS", "WocaRBoxPlugin", "action_to_unit", "admissible_box",
           "box_corners", "q_spread_in_box", "worst_action_in_box"]

tfd = tfp.distributions

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


class WocaRBoxPlugin(WocaRPlugin):
    """``robust="wocar"`` for a Gaussian policy on Box actions (PPO, A2C; the paper's MuJoCo
    WocaR-PPO), the discrete plug-in's three pieces with actions in a box
    (:mod:`agents.robustness.wocar_box`):

    1. **the admissible actions** at ``s'``: the box ``[lb, ub]`` of the Gaussian mean over the
       ball (``wocar_bound``: IBP, CROWN or CROWN-IBP) clipped to the action bounds
       (:func:`agents.robustness.wocar_box.admissible_box`);
    2. **the worst-attack critic** ``Q_w(s, a)``, an MLP ``[d + k] -> [1]`` of the normalised
       observation and the action mapped to ``[-1, 1]``
       (:func:`agents.robustness.wocar_box.action_to_unit`), trained toward ``r + gamma ·
       (1 − terminated) · min(Q_w^-(s', a*), Q_w^-(s', mu(s')))``: ``a*`` the worst action of
       the box for ``Q_w^-`` (``wocar_double``: for the online ``Q_w``), searched once per
       rollout on its next states (``wocar_search_steps`` projected sign steps after the box's
       corners, default 10, :func:`agents.robustness.wocar_box.worst_action_in_box`) and revalued by the
       moving target network at each critic step; the clean mean ``mu(s')`` (clipped) is in
       the min, so the target never exceeds the clean action's (:meth:`worst_next_values`);
    3. **the objective and the regulariser**: ``n(A) + w · n(Q_w^-(s, a))`` at the rollout's
       actions ``a``, and ``kappa · mean_s ω(s) · KL(pi(.|s) || pi(.|s_hat))`` (Gaussian KL,
       the clean mean and ``log σ`` stopped), ``ω(s)`` the spread ``max_a Q_w^- − min_a Q_w^-``
       over the whole action space (two searches, :func:`agents.robustness.wocar_box.
       q_spread_in_box`) normalised to mean 1.

    Logs as the discrete plug-in's; ``wocar_admissible`` is the mean width of the admissible
    box (summed over action dimensions, in action units) at the rollout's next states. The
    cost per rollout of ``B`` states and ``k`` action dimensions (``k <= 4``): one bound pass
    of ``B`` boxes, three searches of ``2^k + 1`` forward and ``wocar_search_steps`` forward and
    backward passes of ``Q_w`` on ``B`` rows (the target's, and the importance's min and max),
    and the discrete plug-in's critic epochs."""

    def __init__(self, agent: Agent):
        super().__init__(agent)
        low, high = self.surface.action_low, self.surface.action_high
        assert low is not None and high is not None  # check_wocar_agent
        self.action_low, self.action_high = low, high

    def q_at(self, obs: tf.Tensor, actions: tf.Tensor, target: bool = True) -> tf.Tensor:
        """``Q_w(obs, actions)`` ``[B]`` of the target network (``target=False``: the critic)
        at raw ``obs [B, d]`` and actions ``[B, k]`` in the env's units (clipped to its
        bounds)."""
        net = self.target if target else self.critic
        x = self.surface.normalize(tf.convert_to_tensor(obs, tf.float32))
        a = action_to_unit(actions, self.action_low, self.action_high)
        return net(tf.concat([x, a], axis=-1))[..., 0]

    def worst_q(self, obs: tf.Tensor, target: bool = True) -> tf.Tensor:
        raise TypeError("worst_q: a Box-action worst-attack critic takes actions too; use "
                        "q_at(obs, actions)")

    def _clean_actions(self, obs: tf.Tensor) -> tf.Tensor:
        """The policy's mean at ``obs`` clipped to the action bounds, stopped."""
        return tf.stop_gradient(self.surface.deterministic_actions(obs))

    def worst_actions(self, next_obs: tf.Tensor, eps: float | tf.Tensor) -> tuple[tf.Tensor, ...]:
        """``(a* [B, k], clean [B, k], lower [B, k], upper [B, k])``: the worst action of the
        admissible box at ``next_obs`` for the target network (the critic with
        ``wocar_double``), the clean (clipped) mean and the box; stopped."""
        lower, upper = admissible_box(self.surface, next_obs, eps, self.bound)
        clean = self._clean_actions(next_obs)
        double = self.spec.double
        a_star, _ = worst_action_in_box(lambda a: self.q_at(next_obs, a, target=not double),
                                        lower, upper, clean, self.spec.search_steps)
        return a_star, clean, lower, upper

    def worst_next_values(self, next_obs: tf.Tensor, a_star: tf.Tensor,
                          clean: tf.Tensor) -> tf.Tensor:
        """``min(Q_w^-(s', a*), Q_w^-(s', clean))`` ``[B]``, stopped: never above the target
        network's value of the clean action."""
        return tf.stop_gradient(tf.minimum(self.q_at(next_obs, a_star),
                                           self.q_at(next_obs, clean)))

    def _fit_box_critic(self, batch: dict, a_star: tf.Tensor, clean: tf.Tensor) -> tf.Tensor:
        """:meth:`WocaRPlugin._critic_epochs` with :meth:`worst_next_values` in the target."""
        gamma = self.gamma

        def target(o, a, r, s2, t, w, c):
            alive = 1.0 - tf.cast(t, tf.float32)
            return tf.stop_gradient(tf.cast(r, tf.float32) + gamma * alive *
                                    self.worst_next_values(s2, w, c))

        def value(o, a, *_):
            return self.q_at(o, a, target=False)

        return self._critic_epochs((batch["obs"], batch["actions"], batch["rewards"],
                                    batch["next_obs"], batch["terminated"], a_star, clean),
                                   target, value)

    @tf.autograph.experimental.do_not_convert
    def shape_advantages(self, batch: dict, advantages: tf.Tensor) -> tf.Tensor:
        """Fit the worst-attack critic on the rollout, then ``n(A) + w · n(Q_w^-(s, a))``; the
        regulariser's inputs for the whole rollout kept (as the discrete plug-in)."""
        radius = self.schedule.eps if self.spec.admissible_eps is None else \
            self.spec.admissible_eps
        a_star, clean, lower, upper = self.worst_actions(batch["next_obs"], radius)
        loss = self._fit_box_critic(batch, a_star, clean)
        worst = tf.stop_gradient(self.q_at(batch["obs"], batch["actions"]))
        self._stats["wocar_q_loss"].assign(loss)
        self._stats["wocar_worst_q"].assign(self._seed_mean(worst))
        self._stats["wocar_admissible"].assign(
            self._seed_mean(tf.reduce_sum(upper - lower, axis=-1)))
        if self.spec.search_per_rollout and self.schedule.target_kappa > 0.0:
            self._rollout_inputs = (_current_graph(),
                                    self.rollout_regularizer_inputs(batch["obs"]))
        self._update_steps.assign(0)
        return _standardize(advantages) + self.weight * _standardize(worst)

    def regularizer_inputs(self, obs: tf.Tensor) -> Any:
        """``None`` (no term, no search) when ``kappa`` is 0; else as the discrete plug-in."""
        if self.schedule.target_kappa <= 0.0:
            return None
        return super().regularizer_inputs(obs)

    def rollout_regularizer_inputs(self, obs: tf.Tensor,
                                   q: tf.Tensor | None = None) -> tuple[tf.Tensor, ...]:
        """``(clean mean [B, k], clean log σ [k], s_hat [B, d], ω(s) [B])``, all stopped (as
        the discrete plug-in's; ``ω`` from :func:`agents.robustness.wocar_box.q_spread_in_box`
        of ``Q_w^-`` over the action space; ``q`` is not read)."""
        cfg, surface = self.agent.config, self.surface
        obs = tf.stop_gradient(obs)
        mean = tf.stop_gradient(surface.outputs(obs))
        log_std = tf.stop_gradient(tf.cast(surface.log_std, tf.float32))  # [k], or [S, k]
        obs_adv = sa_observations(self.agent, obs, self.schedule.eps, cfg.robust_steps,
                                  self._search_key(), cfg.robust_method)
        if self.spec.importance:
            ones = tf.ones_like(mean)
            spread = q_spread_in_box(lambda a: self.q_at(obs, a), ones * self.action_low,
                                     ones * self.action_high, self._clean_actions(obs),
                                     self.spec.search_steps)
            importance = state_importance(tf.stack([spread, tf.zeros_like(spread)], -1))
        else:
            importance = tf.ones(tf.shape(obs)[:-1])
        return mean, log_std, obs_adv, importance

    def smoothness_term(self, obs: tf.Tensor, inputs: Any) -> tuple[tf.Tensor, tf.Tensor]:
        """``(kappa · term, term)``, ``term`` the importance-weighted KL between the Gaussian
        policies at ``s`` and ``s_hat`` (the discrete plug-in's :meth:`regularizer` calls it)."""
        mean, log_std, obs_adv, importance = inputs
        std = tf.exp(self.surface.per_row(log_std)) * tf.ones_like(mean)
        clean = tfd.Independent(tfd.Normal(mean, std), reinterpreted_batch_ndims=1)
        kl = tfd.kl_divergence(clean, self.surface.distribution(obs_adv))
        term = self._seed_mean(importance * kl)  # [S] on the seed axis: each seed's own
        return self.schedule.kappa * term, term
