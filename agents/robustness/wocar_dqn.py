"""WocaR-DQN: worst-case-aware robust training of a Q-learner (``robust="wocar"`` on DQN).

The value-based variant of :mod:`agents.robustness.wocar` (Liang et al., NeurIPS 2022; its DQN
code, the RADIAL-based version): a worst-attack Q-network stepped on the replay toward the
worst-attack Bellman target over the admissible actions of the agent's own Q-network, a TD
target whose next action leans toward the worst-attack values, and an importance-weighted
worst-case term on the Q-values' bounds over the eps ball (:class:`WocaRDQNPlugin`,
:func:`worst_case_bound_loss`, its unit :func:`q_scale`). The pieces it shares with the
actor-critic plug-ins are in :mod:`agents.robustness.wocar_base`.

>>> import tensorflow as tf
>>> float(q_scale(tf.constant([30.0, -50.0])))
40.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import tensorflow as tf

from agents.robustness.certify import greedy_margin_lower_bounds, output_bounds
from agents.robustness.robust import certified_margin_hinge
from agents.robustness.wocar_base import (
    _WorstCaseWeighted,
    admissible_actions,
    state_importance,
    worst_attack_target,
)

if TYPE_CHECKING:
    from agents.algorithms.dqn_config import DQNConfig
    from agents.core.base import Agent

__all__ = ["WocaRDQNPlugin", "q_scale", "worst_case_bound_loss"]


def worst_case_bound_loss(lb: tf.Tensor, ub: tf.Tensor, q: tf.Tensor, actions: tf.Tensor,
                          target: tf.Tensor, delta: float = 1.0,
                          scale: float | tf.Tensor = 1.0) -> tf.Tensor:
    """WocaR-DQN's worst-case term per row ``[B]``: ``sum_a huber(max(|ub_a − ref_a|,
    |lb_a − ref_a|))`` with ``ref`` the TD ``target`` at the taken action and the clean
    ``q(a)`` at the others, ``[lb, ub]`` the bounds ``[B, A]`` of the Q-values over the eps
    ball: how far the ball lets each Q-value stray from what it should be. ``q [B, A]``
    (differentiable), ``actions [B]`` int, ``target [B]`` (stopped by the caller);
    ``delta``: the Huber threshold; ``scale`` (> 0, scalar, stopped by the caller): the
    residuals are measured in units of ``scale`` and the loss given back in the Q-values'
    units, ``scale · huber(x / scale)`` (on the seed axis, ``[S, B, A]`` inputs, ``scale``
    may be ``[S]``: each seed's own -> ``[S, B]``): ``scale=1`` is the paper's term; with ``scale`` the
    Q-values' size, the term is quadratic while the ball moves each Q-value by less than
    ``delta · scale`` (a gradient that vanishes with the relative spread) and linear beyond,
    the same for every reward scale (:class:`WocaRDQNPlugin`).

    >>> lb, ub = tf.constant([[0.0, 1.0]]), tf.constant([[3.0, 2.0]])
    >>> q = tf.constant([[1.0, 1.5]])
    >>> # action 0 taken, target 2: |lb - 2| = 2 -> huber 1.5; action 1: 0.5 -> 0.125
    >>> worst_case_bound_loss(lb, ub, q, tf.constant([0]), tf.constant([2.0])).numpy().tolist()
    [1.625]
    >>> # scale 4: x / 4 = 0.5 and 0.125, both quadratic: 4 * (0.125 + 0.0078125)
    >>> worst_case_bound_loss(lb, ub, q, tf.constant([0]), tf.constant([2.0]), scale=4.0
    ...                       ).numpy().tolist()
    [0.53125]
    """
    taken = tf.one_hot(actions, tf.shape(q)[-1]) > 0.5
    ref = tf.where(taken, tf.cast(target, tf.float32)[..., None], q)
    scale = tf.cast(scale, tf.float32)
    # the seed axis ([S] scales): each seed's scale, [S, 1] against its rows [S, B]
    row_scale = scale[:, None] if scale.shape.rank else scale
    x = tf.maximum(tf.abs(ub - ref), tf.abs(lb - ref)) / row_scale[..., None]
    per_action = tf.where(x <= delta, 0.5 * tf.square(x), delta * (x - 0.5 * delta))
    return row_scale * tf.reduce_sum(per_action, axis=-1)


def q_scale(target: tf.Tensor) -> tf.Tensor:
    """The Q-values' size on a batch, scalar, stopped: ``max(mean |target|, 1)`` of the TD
    ``target [B]`` (``[S]`` for ``[S, B]``: each seed's). The unit of WocaR-DQN's worst-case
    term (:func:`worst_case_bound_loss`'s ``scale``): 1 where the values are of order 1 (the
    paper's Atari rewards, clipped to [-1, 1]), their size where a return is larger (CartPole:
    up to ~1 / (1 - gamma) = 100).

    >>> float(q_scale(tf.constant([30.0, -50.0]))), float(q_scale(tf.constant([0.2, -0.1])))
    (40.0, 1.0)
    """
    size = tf.abs(tf.cast(target, tf.float32))
    # the seed axis (target [S, B]): each seed's own, [S]
    mean = tf.reduce_mean(size) if size.shape.rank == 1 else tf.reduce_mean(size, axis=-1)
    return tf.stop_gradient(tf.maximum(mean, 1.0))


class WocaRDQNPlugin(_WorstCaseWeighted):
    """``robust="wocar"`` for DQN (WocaR-DQN; the paper's DQN code, its RADIAL-based version):

    1. **the worst-attack Q-network** ``Q_w(s, a)``, one Adam step (``q_lr``, Huber) on the
       replayed minibatch of every ``q_every``-th gradient step of the agent (default 10, the
       paper's ``worst_rate``; :meth:`learn_from_replay`) toward
       :func:`worst_attack_target`: ``r + gamma · (1 −
       terminated) · min_{a' in A_adv(s')} Q_w^-(s', a')``, ``A_adv(s')`` the actions the
       attacker can make greedy for the agent's *own* Q-network within the schedule's eps
       (:func:`admissible_actions` at ``wocar_bound``), ``Q_w^-`` a Polyak-averaged target
       network (rate ``tau`` per step; the paper's code bootstraps from ``Q_w`` itself
       under ``no_grad``);
    2. **the worst-case-aware TD target**: the next action is ``argmax_a (1 − w) · S(s', a) +
       w · Q_w^-(s', a)`` (``S``: the algorithm's own scores, the online Q-values under Double
       DQN), valued by the target network (:meth:`target_action_scores`; ``w``:
       ``wocar_weight``, default 0.3, :attr:`agents.WocaR.DQN_DEFAULTS`, rising over
       ``warmup``, default 0.75);
    3. **the importance-weighted worst-case term**: the per-example loss is ``(1 − k) · TD +
       k · ω(s) · L_wc(s)`` (:meth:`q_loss`; ``k``: the schedule's ``robust_kappa``, the
       paper's ``1 − kappa_end``, 0.5 in its DQN code), ``L_wc``
       :func:`worst_case_bound_loss` from the online network's IBP bounds over the eps ball
       (the paper's; differentiable w.r.t. the weights; ``wocar_bound`` chooses the
       admissible sets' method only) measured in units of the batch's
       Q scale (:func:`q_scale`: ``max(mean |TD target|, 1)``; the paper's term where the
       values are of order 1, as its clipped Atari rewards make them; CartPole's are ~10-100:
       docs/benchmarks/robust-rl.md, "WocaR-DQN") and ``ω(s)`` the state's
       importance, the spread ``max_a Q(s, a) − min_a Q(s, a)`` of the agent's own Q-values
       normalised to mean 1 (:func:`state_importance`; the paper's definition for value-based
       agents; its DQN code weights all states alike, as ``wocar_importance=False`` does).
       ``wocar_term="margin"`` puts SA-DQN's hinge on the greedy action's certified margin
       (:func:`certified_margin_hinge`, the bounds by ``wocar_bound``) in place of ``L_wc``;
       ``wocar_term_start`` keeps the term off for that fraction of the budget
       (:meth:`before_iteration`).

    The admissible set here is the tighter of the two sound rules: ``a`` is dropped when some
    ``j`` provably beats it (``ub(Q_a − Q_j) < 0``, the differences bounded as one network);
    the paper's code drops ``a`` when ``ub(Q_a) < max_j lb(Q_j)`` (intervals of each output),
    which admits a superset.

    No inner search: the smoothness term comes from the bound engine alone (``robust_method``
    and ``robust_steps`` are not read), so one gradient step costs a few forward passes more
    than vanilla DQN's (an IBP pass and its gradient; on every ``q_every``-th step the
    admissible sets and the worst-attack network's step), against SA-DQN's ``robust_steps``
    PGD steps. Logs: ``wocar_weight``, ``wocar_q_loss`` (the worst-attack
    network's last step), ``wocar_worst_q`` (its mean ``Q_w(s, a)`` there),
    ``wocar_admissible`` (mean admissible actions per next state), ``wocar_bound_loss`` (the
    last step's mean ``L_wc``), ``wocar_td_loss`` (its mean TD Huber loss), ``wocar_width``
    (its mean ``ub − lb`` of the Q-values over the ball), ``wocar_scale`` (its
    :func:`q_scale`). The networks are in the agent's checkpoint; on the seed axis every term is
    each seed's own (:class:`_WorstCaseWeighted`)."""

    def __init__(self, agent: Agent):
        super().__init__(agent)
        self.huber_delta = float(cast("DQNConfig", agent.config).huber_delta)
        self._stats = self._stat_variables(("wocar_q_loss", "wocar_worst_q", "wocar_admissible",
                                            "wocar_bound_loss", "wocar_td_loss", "wocar_width",
                                            "wocar_scale"))
        self._replay_calls = tf.Variable(0, trainable=False, dtype=tf.int64,
                                         name="wocar_replay_calls")

    # -- the Q-learner's hooks -----------------------------------------------------------------
    def worst_attack_targets(self, batch: dict) -> tuple[tf.Tensor, tf.Tensor]:
        """``(target [B], admissible [B, A])`` of a replayed ``batch``: the worst-attack Bellman
        targets (:func:`worst_attack_target` of the target network at ``next_obs``, stopped)
        and the admissible actions there for the agent's Q-network at the schedule's eps."""
        admissible = admissible_actions(self.surface, batch["next_obs"], self.schedule.eps,
                                        self.bound)
        target = worst_attack_target(self.worst_q(batch["next_obs"]), admissible,
                                     batch["rewards"], batch["terminated"], self.gamma,
                                     self._selector(batch["next_obs"]))
        return target, admissible

    @tf.autograph.experimental.do_not_convert
    def learn_from_replay(self, batch: dict) -> None:
        """One step of the worst-attack Q-network on the replayed minibatch (class doc, 1) on
        every ``spec.q_every``-th call (the first included), nothing on the others."""
        every = self.spec.q_every
        if every <= 1:
            self._worst_step(batch)
            return
        due = tf.equal(self._replay_calls % every, 0)
        self._replay_calls.assign_add(1)
        idle = tf.zeros([] if self.num_seeds == 1 else [self.num_seeds])
        tf.cond(due, lambda: self._worst_step(batch), lambda: idle)

    def _worst_step(self, batch: dict) -> tf.Tensor:
        """One Adam step of the worst-attack Q-network toward its targets on ``batch``, the
        target copy's Polyak step and the logs; returns the loss."""
        obs, actions = batch["obs"], batch["actions"]
        target, admissible = self.worst_attack_targets(batch)
        delta = self.huber_delta
        with tf.GradientTape() as tape:
            q = tf.gather(self.worst_q(obs, target=False), actions,
                          batch_dims=actions.shape.rank)
            err = tf.abs(q - target)
            loss = self._seed_mean(tf.where(err <= delta, 0.5 * tf.square(err),
                                            delta * (err - 0.5 * delta)))  # [S]: each seed's
        self._step_critic(tape.gradient(loss, self.critic.trainable_variables))
        self._polyak()
        self._stats["wocar_q_loss"].assign(loss)
        self._stats["wocar_worst_q"].assign(self._seed_mean(q))
        self._stats["wocar_admissible"].assign(
            self._seed_mean(tf.reduce_sum(tf.cast(admissible, tf.float32), axis=-1)))
        return loss

    def before_iteration(self, steps_done: int, total: int) -> dict:
        """The schedule's eps, kappa and weight (:class:`_WorstCaseWeighted`); with
        ``spec.term_start`` the term's kappa is 0 before that fraction of ``total``, then rises
        to full at ``spec.warmup`` (at once when that has passed)."""
        out = super().before_iteration(steps_done, total)
        start = self.spec.term_start
        if start > 0:
            begin, end = start * float(total), max(self.spec.warmup, start) * float(total)
            frac = 0.0 if steps_done < begin else \
                1.0 if end <= begin else min((steps_done - begin) / (end - begin), 1.0)
            self.schedule.kappa.assign(self.schedule.target_kappa * frac)
        return out

    def target_action_scores(self, next_obs: tf.Tensor, scores: tf.Tensor) -> tf.Tensor:
        """``(1 − w) · scores + w · Q_w^-(next_obs)`` (class doc, 2), stopped."""
        worst = self.worst_q(next_obs)
        return tf.stop_gradient((1.0 - self.weight) * scores + self.weight * worst)

    @tf.autograph.experimental.do_not_convert
    def q_loss(self, per_example: tf.Tensor, obs: tf.Tensor, actions: tf.Tensor,
               q: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
        """``(1 − k) · per_example + k · ω(s) · L_wc(s)`` (class doc, 3)."""
        target = tf.stop_gradient(target)
        scale = q_scale(target)
        if self.spec.term == "margin":
            greedy = tf.argmax(tf.stop_gradient(q), axis=-1, output_type=tf.int32)
            _, margins = greedy_margin_lower_bounds(self.surface, tf.stop_gradient(obs),
                                                    self.schedule.eps, self.bound, greedy)
            wc = certified_margin_hinge(margins)
            self._stats["wocar_width"].assign(-self._seed_mean(tf.reduce_min(margins, -1)))
        else:
            lb, ub = output_bounds(self.surface, tf.stop_gradient(obs), self.schedule.eps,
                                   "ibp")
            wc = worst_case_bound_loss(lb, ub, q, actions, target, self.huber_delta, scale)
            self._stats["wocar_width"].assign(self._seed_mean(ub - lb))
        importance = state_importance(tf.stop_gradient(q)) if self.spec.importance else 1.0
        self._stats["wocar_bound_loss"].assign(self._seed_mean(wc))
        self._stats["wocar_td_loss"].assign(self._seed_mean(per_example))
        self._stats["wocar_scale"].assign(scale)
        k = self.schedule.kappa
        return (1.0 - k) * per_example + k * importance * wc
