"""State-adversarial regularisers and adversarial observations for robust RL training.

Zhang, Chen, Xiao, Li, Liu, Boning, Hsieh, "Robust deep reinforcement learning against
adversarial perturbations on state observations", NeurIPS 2020:

* **SA-PPO / SA-A2C**: ``loss += kappa * mean_s max_{s_hat in B(s, eps)} KL(pi(.|s) || pi(.|s_hat))``.
  The inner max (``robust_method``) is the ``mad`` attack of :mod:`agents.robustness.observation_attacks`
  (``"pgd"``: the :mod:`attacks` PGD engine, 10 steps of ``eps / 10`` by default, random start)
  or its Langevin version (``"sgld"``: :func:`agents.robustness.observation_attacks.sgld_mad_attack`, the
  paper's SA-PPO (SGLD) rows; gradient-sign steps of ``eps / 10`` with Gaussian noise of scale
  ``sqrt(2 * step / beta) / (i + 2)``, ``1 / beta = 1e-5``, one engine call through PGD's
  ``gradient_noise`` hook); the clean distribution is under ``tf.stop_gradient``, ``s_hat`` too,
  so the gradient reaches the policy only through ``pi(.|s_hat)``.
* **convex** (``robust_method="convex"``, the papers' convex-relaxation variant): no inner search;
  the policy's outputs are bounded over the whole ball by CROWN-IBP (:mod:`agents.robustness.certify`, the
  core's :mod:`robustgrad.bounds`), an upper bound of the inner maximum that is differentiable
  w.r.t. the weights. DQN: :func:`convex_margin_hinge`, SA-DQN's hinge below on the *bounded*
  margin ``max_{a != a*} ub(Q(a) - Q(a*))``; SA-PPO/SA-A2C bound the same KL the search methods
  maximise: Gaussian policies :func:`convex_gaussian_kl`,
  ``sum_k max(ub_k - mu_k, mu_k - lb_k)^2 / (2 sigma_k^2)`` (the mean's deviation scaled by the
  std), categorical ones :func:`convex_categorical_kl` (from bounds of the logit differences).
* **SA-DQN** (PGD variant): ``loss += kappa * mean_s max(max_{a != a*} Q(s_hat, a) - Q(s_hat, a*), -c)``
  with ``a* = argmax_a Q(s, a)`` and ``s_hat`` found by the ``action`` attack (PGD on the
  cross-entropy away from ``a*``); ``c`` is :data:`HINGE_MARGIN`.
* **adversarial observation training** (``robust="adv"``): the on-policy agents act on, store
  and learn from observations attacked by ``robust_attack`` during the rollout (the agent lives
  in the perturbed MDP, as Kos & Song 2017 and Pattanaik et al. 2018); DQN's update uses the
  attacked ``s`` in ``Q(s, a)`` (its replay buffer keeps clean observations).

The seed axis (``num_seeds=S > 1``, DESIGN.md sections 7-8): every function here takes the
observations of an ``S``-seed agent as ``[S, B, d]`` and returns each seed's regulariser ``[S]``
(its mean over its own rows). Seed ``s``'s observations are attacked against seed ``s``'s own
policy, in seed ``s``'s own normaliser units, by one engine call for all seeds (the ``S * B`` rows
as examples of a model that keeps each seed's weights, :mod:`agents.robustness._victim`); the convex bounds
of all seeds are one bound call on the block-diagonal network of the ``S`` stacked ones
(:mod:`agents.robustness.certify`; no weight couples two blocks).

eps and kappa rise linearly from 0 over ``robust_eps_warmup`` of the ``learn`` budget
(:class:`RobustSchedule`, held in ``tf.Variable`` so the compiled update traces once). Budgets
are in the attack's units: standard deviations inside the normaliser when the agent normalises
observations, raw units otherwise.

>>> import tensorflow as tf
>>> q = tf.constant([[1.0, 3.0, 2.0]])
>>> float(q_margin_hinge(q, tf.constant([1]), 1.0)[0])  # max(2 - 3, -1)
-1.0
>>> float(q_margin_hinge(q, tf.constant([2]), 1.0)[0])  # max(3 - 2, -1)
1.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tensorflow as tf
import tensorflow_probability as tfp

from agents.core.plugin import RobustnessPlugin, register_robustness
from agents.core.schedules import linear
from agents.robustness import observation_attacks as oa
from agents.robustness._victim import _surface
from agents.robustness.certify import difference_upper_bounds, greedy_margin_lower_bounds, output_bounds

if TYPE_CHECKING:
    from agents.algorithms.onpolicy import ActorCritic
    from agents.core.base import Agent
    from agents.core.policy import PolicySurface

tfd = tfp.distributions

__all__ = ["CONVEX_BOUND", "HINGE_MARGIN", "INNER_METHODS", "AdversarialPlugin", "RobustSchedule",
           "SAPlugin", "ScheduledPlugin", "adversarial_observations", "attacked_q_margin",
           "certified_margin_hinge",
           "clean_distribution", "convex_categorical_kl", "convex_gaussian_kl",
           "convex_margin_hinge", "convex_policy_regularizer", "policy_kl", "q_margin_hinge",
           "sa_dqn_observations", "sa_observations", "sa_policy_regularizer"]

INNER_METHODS = ("pgd", "sgld", "convex")
"""Inner maximisers of the SA-PPO/SA-A2C regulariser (``robust_method``); SA-DQN takes ``"pgd"``
or ``"convex"``."""

CONVEX_BOUND = "crown-ibp"
"""The bound method of the ``"convex"`` regulariser (the SA papers' CROWN-IBP)."""

HINGE_MARGIN = 1.0
"""``c`` of SA-DQN's hinge ``max(margin, -c)``: margins below ``-c`` contribute no gradient."""


def _batch_mean(x: tf.Tensor) -> tf.Tensor:
    """The mean of ``x [..., B]`` over its last axis: a scalar, or ``[S]`` per seed."""
    return tf.reduce_mean(x) if x.shape.rank == 1 else tf.reduce_mean(x, axis=-1)


class RobustSchedule(tf.Module):
    """eps and kappa of the current update, ramped linearly from 0 (``tf.Variable`` scalars
    read inside the compiled update; :meth:`update` before each iteration).

    >>> s = RobustSchedule(eps=0.2, kappa=0.5, warmup=0.75)
    >>> s.update(375, 1000); round(float(s.eps), 6), round(float(s.kappa), 6)
    (0.1, 0.25)
    >>> s.update(900, 1000); round(float(s.eps), 6)
    0.2
    """

    def __init__(self, eps: float, kappa: float, warmup: float):
        super().__init__(name="robust_schedule")
        self.target_eps, self.target_kappa, self.warmup = float(eps), float(kappa), float(warmup)
        self.eps = tf.Variable(0.0 if warmup > 0 else self.target_eps, trainable=False,
                               name="robust_eps")
        self.kappa = tf.Variable(0.0 if warmup > 0 else self.target_kappa, trainable=False,
                                 name="robust_kappa")

    def update(self, steps_done: int, total: int) -> None:
        """Set eps and kappa for an update at ``steps_done`` of a ``total``-step budget."""
        if self.warmup <= 0:
            frac = 1.0
        else:
            frac = linear(0.0, 1.0, float(steps_done), self.warmup * float(total))
        self.eps.assign(self.target_eps * frac)
        self.kappa.assign(self.target_kappa * frac)


def clean_distribution(policy: ActorCritic | PolicySurface, obs: tf.Tensor
                       ) -> tfp.distributions.Distribution:
    """``pi(.|obs)`` of ``policy`` (an :class:`agents.PolicySurface` or an
    :class:`agents.algorithms.onpolicy.ActorCritic`: anything with ``distribution(obs)``) with every
    parameter under ``tf.stop_gradient`` (the fixed side of the KL)."""
    d = policy.distribution(obs)
    if isinstance(d, tfd.Categorical):
        return tfd.Categorical(logits=tf.stop_gradient(d.logits))
    normal = d.distribution
    return tfd.Independent(tfd.Normal(tf.stop_gradient(normal.loc),
                                      tf.stop_gradient(normal.scale)),
                           reinterpreted_batch_ndims=1)


def policy_kl(policy: ActorCritic | PolicySurface, obs: tf.Tensor, obs_adv: tf.Tensor
              ) -> tf.Tensor:
    """``KL(pi(.|obs) || pi(.|obs_adv))`` per row ``[B]``, the clean side stopped, the
    perturbed side differentiable w.r.t. the policy's variables (``policy`` as in
    :func:`clean_distribution`)."""
    return tfd.kl_divergence(clean_distribution(policy, obs), policy.distribution(obs_adv))


def sa_observations(agent: Agent, obs: tf.Tensor, eps: float | tf.Tensor, steps: int,
                    seed: tf.Tensor, method: str = "pgd") -> tf.Tensor:
    """``s_hat`` maximising ``KL(pi(.|s) || pi(.|s_hat))`` in the eps-ball, under
    ``tf.stop_gradient``, ``[B, d]``: ``method="pgd"`` the ``mad`` attack (PGD with ``steps``
    steps of ``eps / steps``), ``"sgld"`` :func:`agents.robustness.observation_attacks.sgld_mad_attack`
    (the same steps with SA-PPO's Langevin noise)."""
    attack = {"pgd": oa.mad_attack, "sgld": oa.sgld_mad_attack}[method]
    # the attack functions hold no tensor-dependent Python control flow and call the engine
    # (itself not converted): AutoGraph need not convert them inside the compiled updates
    search = tf.autograph.experimental.do_not_convert(attack)
    return tf.stop_gradient(search(agent, tf.stop_gradient(obs), eps=eps, steps=steps,
                                   seed=seed))


def sa_policy_regularizer(agent: Agent, obs: tf.Tensor, obs_adv: tf.Tensor) -> tf.Tensor:
    """The SA-PPO/SA-A2C regulariser (before kappa): mean over the batch of
    :func:`policy_kl` at the attack's ``obs_adv``; scalar (``[S]`` per seed with the seed axis:
    ``obs``, ``obs_adv`` ``[S, B, d]``)."""
    return _batch_mean(policy_kl(_surface(agent), obs, obs_adv))


def q_margin_hinge(q_adv: tf.Tensor, greedy: tf.Tensor, margin: float = HINGE_MARGIN
                   ) -> tf.Tensor:
    """SA-DQN's hinge per row ``[B]``: ``max(max_{a != a*} Q(s_hat, a) - Q(s_hat, a*), -margin)``.

    ``q_adv [B, A]`` float, ``greedy [B]`` int (``a*``, the greedy action at the clean state);
    with the seed axis ``[S, B, A]`` and ``[S, B]`` -> ``[S, B]``.
    """
    q_adv = tf.convert_to_tensor(q_adv, tf.float32)
    greedy = tf.convert_to_tensor(greedy)
    n_actions = tf.shape(q_adv)[-1]
    mask = tf.one_hot(greedy, n_actions) > 0.5
    q_star = tf.gather(q_adv, greedy, batch_dims=greedy.shape.rank)
    q_other = tf.reduce_max(tf.where(mask, tf.constant(-float("inf")), q_adv), axis=-1)
    return tf.maximum(q_other - q_star, -float(margin))


def sa_dqn_observations(agent: Agent, obs: tf.Tensor, eps: float | tf.Tensor, steps: int,
                        seed: tf.Tensor, method: str = "pgd") -> tuple[tf.Tensor, tf.Tensor]:
    """SA-DQN's inner max: ``(s_hat, a*)`` with ``a* = argmax_a Q(s, a)`` ``[B]`` int32 and
    ``s_hat`` ``[B, d]`` from ``steps`` PGD steps of ``eps / steps`` on the cross-entropy away
    from ``a*`` (the ``action`` attack); both stopped. ``method="convex"`` searches nothing:
    ``s_hat`` is ``obs`` (the centre of the ball :func:`convex_margin_hinge` bounds)."""
    obs = tf.stop_gradient(obs)
    greedy = tf.argmax(tf.stop_gradient(_surface(agent).outputs(obs)), axis=-1,
                       output_type=tf.int32)
    if method == "convex":
        return obs, greedy
    search = tf.autograph.experimental.do_not_convert(oa.action_attack)  # as in sa_observations
    obs_adv = tf.stop_gradient(search(agent, obs, eps=eps, steps=steps,
                                      step_size=eps / float(steps), seed=seed))
    return obs_adv, greedy


def attacked_q_margin(agent: Agent, obs_adv: tf.Tensor, greedy: tf.Tensor,
                      margin: float = HINGE_MARGIN) -> tf.Tensor:
    """SA-DQN's regulariser (before kappa): the mean :func:`q_margin_hinge` of the online
    network at ``s_hat`` (from :func:`sa_dqn_observations`); scalar (``[S]`` per seed),
    differentiable."""
    return _batch_mean(q_margin_hinge(_surface(agent).outputs(obs_adv), greedy, margin))


def certified_margin_hinge(margins: tf.Tensor, margin: float = HINGE_MARGIN) -> tf.Tensor:
    """SA-DQN's hinge on the greedy action's certified margin per row ``[B]`` (its convex form:
    :func:`convex_margin_hinge`'s rows; WocaR-DQN's ``"margin"`` term): ``max(−min_j lb_j,
    −margin)`` of the lower bounds ``margins [B, A − 1]`` of ``Q(a*) − Q(j)`` over the ball
    (:func:`agents.robustness.certify.greedy_margin_lower_bounds`; ``[S, B, A − 1]`` ->
    ``[S, B]`` on the seed axis), which stops pulling once the greedy action is certified by
    ``margin`` (Q units).

    >>> certified_margin_hinge(tf.constant([[-0.5], [2.0], [0.25]])).numpy().tolist()
    [0.5, -1.0, -0.25]
    """
    return tf.maximum(-tf.reduce_min(tf.cast(margins, tf.float32), axis=-1), -float(margin))


def convex_margin_hinge(agent: Agent, obs: tf.Tensor, eps: float | tf.Tensor,
                        greedy: tf.Tensor | None = None, margin: float = HINGE_MARGIN,
                        method: str = CONVEX_BOUND) -> tf.Tensor:
    """The convex SA regulariser of a discrete policy or DQN (before kappa), scalar: the batch
    mean of ``max(max_{a != a*} ub(out(a) - out(a*)), -margin)`` over the ball of radius ``eps``
    around each ``obs [B, d]``, ``a*`` the greedy action at ``obs`` (stopped; or ``greedy``), the
    margin bounds by ``method`` with the margin merged into the last layer. An upper bound of
    SA-DQN's hinge at any ``s_hat`` in the ball; differentiable w.r.t. the weights."""
    _, lb = greedy_margin_lower_bounds(_surface(agent), tf.stop_gradient(obs), eps, method,
                                       greedy)
    return _batch_mean(certified_margin_hinge(lb, margin))


def convex_gaussian_kl(agent: Agent, obs: tf.Tensor, eps: float | tf.Tensor,
                       method: str = CONVEX_BOUND) -> tf.Tensor:
    """The convex SA regulariser of a Gaussian policy (before kappa), scalar: the batch mean of
    ``sum_k max(ub_k - mu_k(s), mu_k(s) - lb_k)^2 / (2 sigma_k^2)`` with ``[lb, ub]`` the bounds of
    the mean over the ball of radius ``eps`` around ``obs [B, d]`` and ``mu(s)`` stopped: an upper
    bound of ``max_{s_hat} KL(pi(.|s) || pi(.|s_hat))`` (both sides share sigma). Differentiable
    w.r.t. the policy's weights and ``log_std``."""
    surface = _surface(agent)
    obs = tf.stop_gradient(obs)
    lb, ub = output_bounds(surface, obs, eps, method)
    mean = tf.stop_gradient(surface.outputs(obs))
    deviation = tf.maximum(ub - mean, mean - lb)
    w = 0.5 * tf.exp(-2.0 * tf.cast(surface.per_row(surface.log_std), tf.float32))
    return _batch_mean(tf.reduce_sum(w * tf.square(deviation), axis=-1))


def convex_categorical_kl(agent: Agent, obs: tf.Tensor, eps: float | tf.Tensor,
                          method: str = CONVEX_BOUND) -> tf.Tensor:
    """The convex SA regulariser of a categorical policy (before kappa), scalar: the batch mean of
    ``sum_a p_a (log p_a + logsumexp_j ub(z_j - z_a))``, ``p = softmax(z(s))`` stopped and
    ``ub(z_j - z_a)`` the bounds of every logit difference over the ball of radius ``eps`` (each
    difference merged into the last layer). Since ``log pi(a|s_hat) = -logsumexp_j (z_j - z_a)``,
    this is an upper bound of ``max_{s_hat} KL(pi(.|s) || pi(.|s_hat))``, exact at ``eps = 0``;
    differentiable w.r.t. the policy's weights."""
    surface = _surface(agent)
    obs = tf.stop_gradient(obs)
    logp = tf.stop_gradient(tf.nn.log_softmax(surface.outputs(obs)))
    ub = difference_upper_bounds(surface, obs, eps, method)  # [(S,) B, A, A]: ub(z_j - z_a) at [a, j]
    return _batch_mean(tf.reduce_sum(tf.exp(logp) * (logp + tf.reduce_logsumexp(ub, -1)), -1))


def convex_policy_regularizer(agent: Agent, obs: tf.Tensor, eps: float | tf.Tensor,
                              method: str = CONVEX_BOUND) -> tf.Tensor:
    """The convex SA-PPO/SA-A2C regulariser: :func:`convex_categorical_kl` (discrete) or
    :func:`convex_gaussian_kl` (Gaussian), both upper bounds of the KL the ``pgd``/``sgld``
    methods maximise by search."""
    if _surface(agent).discrete:
        return convex_categorical_kl(agent, obs, eps, method)
    return convex_gaussian_kl(agent, obs, eps, method)


def adversarial_observations(agent: Agent, obs: tf.Tensor, attack: str, eps: float | tf.Tensor,
                             steps: int, seed: tf.Tensor) -> tf.Tensor:
    """``obs`` attacked by ``attack`` (``random``/``action``/``mad``/``critic``) at radius
    ``eps``; non-finite rows of ``obs`` are passed through unchanged (the non-finite guard of
    the update must still see them). Stopped. ``[B, d]``."""
    obs = tf.convert_to_tensor(obs, tf.float32)
    finite = tf.math.is_finite(obs)
    safe = tf.where(finite, obs, tf.zeros_like(obs))
    kw = {} if attack == "random" else {"steps": steps, "step_size": eps / float(steps)}
    search = tf.autograph.experimental.do_not_convert(oa.attack_observations)  # as above
    adv = search(agent, safe, attack, eps=eps, seed=seed, **kw)
    return tf.stop_gradient(tf.where(finite, adv, obs))


class ScheduledPlugin(RobustnessPlugin):
    """A robust training method with an eps/kappa schedule (:class:`RobustSchedule`, from the
    config's ``robust_eps``, ``robust_kappa``, and ``warmup``, default ``robust_eps_warmup``),
    updated before each iteration; the iteration's logs carry ``robust_eps`` and
    ``robust_kappa``."""

    agent: Agent  # the methods of the robustness wing serve the agents of the algorithms

    def __init__(self, agent: Agent, warmup: float | None = None):
        super().__init__(agent)
        cfg = agent.config
        self.schedule = RobustSchedule(cfg.robust_eps, cfg.robust_kappa,
                                       cfg.robust_eps_warmup if warmup is None else warmup)

    def before_iteration(self, steps_done: int, total: int) -> dict:
        self.schedule.update(steps_done, total)
        return {}

    def after_iteration(self, logs: dict, extra: dict) -> None:
        extra = dict(extra)
        per_seed = extra.pop("per_seed", None)  # a method's own values for each seed
        logs.update(extra)
        if per_seed is not None:
            logs["per_seed"].update(per_seed)
        logs["robust_eps"] = float(self.schedule.eps.numpy())
        logs["robust_kappa"] = float(self.schedule.kappa.numpy())


class SAPlugin(ScheduledPlugin):
    """``robust="sa"``: the state-adversarial regulariser (module doc) in the loss, ``kappa``
    times SA-PPO/SA-A2C's KL at the inner maximiser ``robust_method`` (its convex bound for
    ``"convex"``), or SA-DQN's hinge for a Q-learner."""

    def regularizer_inputs(self, obs: tf.Tensor) -> Any:
        agent, cfg = self.agent, self.agent.config
        if agent.value_based:
            return sa_dqn_observations(agent, obs, self.schedule.eps, cfg.robust_steps,
                                       agent.draw_seed(), cfg.robust_method)
        if cfg.robust_method == "convex":  # no search: the bound covers the ball
            return tf.stop_gradient(obs)
        return sa_observations(agent, obs, self.schedule.eps, cfg.robust_steps, agent.draw_seed(),
                               cfg.robust_method)

    def regularizer(self, obs: tf.Tensor, inputs: Any) -> tuple[tf.Tensor, tf.Tensor]:
        if inputs is None:
            return super().regularizer(obs, inputs)
        agent, convex = self.agent, self.agent.config.robust_method == "convex"
        if agent.value_based:  # SA-DQN (Zhang et al. 2020)
            obs_adv, greedy = inputs
            term = convex_margin_hinge(agent, obs, self.schedule.eps, greedy) if convex \
                else attacked_q_margin(agent, obs_adv, greedy)
        else:
            term = convex_policy_regularizer(agent, obs, self.schedule.eps) if convex \
                else sa_policy_regularizer(agent, obs, inputs)
        return self.schedule.kappa * term, term


class AdversarialPlugin(ScheduledPlugin):
    """``robust="adv"``: the agent lives in the perturbed MDP of ``robust_attack`` (module doc):
    an on-policy agent acts on, stores and learns from attacked rollout observations; a
    Q-learner's update sees attacked ``s`` in ``Q(s, a)`` (its replay buffer stays clean)."""

    def perceive(self, obs: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        cfg = self.agent.config
        return adversarial_observations(self.agent, obs, cfg.robust_attack, self.schedule.eps,
                                        cfg.robust_steps,
                                        tf.random.experimental.stateless_fold_in(seed, 1))

    def learner_observations(self, obs: tf.Tensor) -> tf.Tensor:
        cfg = self.agent.config
        return adversarial_observations(self.agent, obs, cfg.robust_attack, self.schedule.eps,
                                        cfg.robust_steps, self.agent.draw_seed())


register_robustness("sa", SAPlugin)
register_robustness("adv", AdversarialPlugin)
