"""Observation attacks on agents: perturb what the policy sees inside an L∞ or L2 ball.

Every gradient attack is one :mod:`attacks` call with an RL objective (DESIGN.md §7); there is
no second PGD loop here. Each attack is a pure, seeded batch function
``obs [B, d] float32 -> obs_adv [B, d] float32`` that also runs inside a ``tf.function``:

* ``random``: uniform noise in the ball (the baseline).
* ``action``: PGD (FGSM with ``steps=1``) away from the clean action. Discrete: untargeted
  cross-entropy away from the greedy action (Huang et al. 2017); continuous: maximise
  ``‖μ(ŝ) − μ(s)‖²``.
* ``mad``: maximal action difference, ``KL(π(·|s) ‖ π(·|ŝ))`` with the clean distribution under
  ``tf.stop_gradient``; 10 steps of ``eps/10`` by default (Zhang et al., "Robust deep
  reinforcement learning against adversarial perturbations on state observations",
  NeurIPS 2020). DQN's policy is taken as ``softmax(Q)``. :func:`sgld_mad_attack` maximises
  the same KL by SA-PPO's stochastic gradient Langevin dynamics (the inner maximiser of its
  ``sgld`` variant; not an attack name of the evaluation).
* ``critic``: minimise the agent's own ``V(ŝ)``; DQN: drive the greedy action to the action of
  lowest ``Q(s, ·)`` (targeted cross-entropy on the Q-values).
* ``rs``: minimise ``Q^π(s, π(ŝ))`` with ``Q^π`` learned by Robust Sarsa
  (:mod:`agents.robustness.robust_sarsa`; Zhang et al. 2020).

Units. When the agent normalises observations the ball lives inside the normaliser:
``ŝ = s + δ · std`` with ``‖δ‖ ≤ eps`` (eps in standard deviations, as the papers); otherwise
raw units. ``scale=`` overrides this: ``"raw"`` forces raw units, an array ``[d]`` scales eps
per dimension (e.g. the observation std of a raw-unit agent). Observations are not clipped to
the observation space's bounds: the perturbation is what the agent *sees*.

>>> import numpy as np, agents
>>> agent = agents.PPO(env="CartPole-v1", seed=0, num_envs=1, n_steps=32)
>>> obs = np.zeros([4, 4], np.float32)
>>> adv = mad_attack(agent, obs, eps=0.1, seed=0)
>>> bool(np.abs(adv - obs).max() <= 0.1 + 1e-6), tuple(adv.shape)
(True, (4, 4))
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import tensorflow as tf

import attacks
from agents.core.base import Agent
from agents.robustness._victim import (  # noqa: F401  (perturbation_* re-exported: public names of this module)
    _in_scaled_space,
    _surface,
    _victim,
    perturbation_norms,
    perturbation_scale,
)
from agents.robustness.robust_sarsa import QPi, fit_q_pi
from robustgrad import checks as _checks

__all__ = [
    "ATTACK_NAMES",
    "ObservationAttack",
    "action_attack",
    "attack_observations",
    "check_attack_name",
    "check_box_observations",
    "critic_attack",
    "mad_attack",
    "perturbation_scale",
    "perturbation_norms",
    "random_attack",
    "rs_attack",
    "sgld_mad_attack",
    "step_seed",
]

ATTACK_NAMES = ("random", "action", "mad", "critic", "rs")
NORMS = ("linf", "l2")
SGLD_TEMPERATURE = 1e-5
"""``1 / beta`` of :func:`sgld_mad_attack`'s Langevin noise (SA-PPO's value: the KL's gradients
with respect to the observation are small, so the noise is too)."""


# -- checks -------------------------------------------------------------------------------------
def check_attack_name(name: str, argument: str = "attack") -> str:
    """``name`` if it is one of :data:`ATTACK_NAMES`, else ``ValueError`` naming ``argument``."""
    return _checks.choice(name, argument, ATTACK_NAMES)


def check_box_observations(space: gym.spaces.Space, argument: str = "env") -> None:
    """``ValueError`` naming ``argument`` unless ``space`` is a 1-D ``gymnasium.spaces.Box``."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ValueError(f"{argument} must have a 1-D Box observation space (observation "
                         f"attacks perturb real vectors), got {space}")


def _has_critic(agent) -> bool:
    # an actor-critic whose value loss has weight 0 never trains its value network: its
    # surface declares no critic
    return _surface(agent).has_critic


def check_agent(agent: Any) -> None:
    """``TypeError`` unless ``agent`` is an :class:`agents.Agent` (a path or ``None`` is named).

    >>> check_agent("runs/ppo")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: agent must be an agents.Agent (...), got str (a path: load it first with ...)
    """
    if not isinstance(agent, Agent):
        hint = (" (a path: load it first with agents.load(path))"
                if isinstance(agent, (str, os.PathLike)) else "")
        raise TypeError(f"agent must be an agents.Agent (PPO, A2C, REINFORCE, DQN), got "
                        f"{type(agent).__name__}{hint}")


def check_attack(agent: Agent, name: str, eps: float, norm: str = "linf", argument: str = "attack"
                 ) -> tuple[str, float, str]:
    """Validate an attack request against ``agent`` before any work; returns the canonical
    ``(name, eps, norm)``."""
    check_agent(agent)
    name = check_attack_name(name, argument)
    eps = float(_checks.nonnegative(eps, "eps"))
    norm = _checks.norm_name(norm)
    _checks.choice(norm, "norm", NORMS)
    check_box_observations(agent.env.single_observation_space, "agent")
    if name == "critic" and not _has_critic(agent):
        raise ValueError(f"{argument}: 'critic' needs an agent with a trained critic; "
                         f"{type(agent).__name__} has no value function (vf_coef=0)")
    return name, eps, norm


def step_seed(seed: int | tf.Tensor, step: int | tf.Tensor) -> tf.Tensor:
    """The stateless seed ``[2]`` int32 of ``step`` for base ``seed`` (an int or ``[2]``)."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        seed = tf.constant([int(seed) % (2**31 - 1), 0], tf.int32)
    return tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int32),
                                                    tf.cast(step, tf.int32))


# -- objectives (module-level: stable identities for the compiled-loop cache) -------------------
def _kl_categorical(logits, clean_logp):
    """KL(π_clean ‖ π(·|ŝ)) per row; ``clean_logp`` are the clean log-probabilities."""
    return tf.reduce_sum(tf.exp(clean_logp) * (clean_logp - tf.nn.log_softmax(logits)), -1)


def _weighted_square_distance(mean, target):
    """``Σ w (μ − μ_clean)²``: the Gaussian KL for ``w = 1/(2σ²)``, ``‖Δμ‖²`` for ``w = 1``."""
    clean_mean, w = target
    return tf.reduce_sum(w * tf.square(mean - clean_mean), -1)


def _negative_expected_q(logits, q_clean):
    """``−Σ_a π(a|ŝ) Q(s, a)``: minimises the critic's value of the action taken at ŝ."""
    return -tf.reduce_sum(tf.nn.softmax(logits) * q_clean, -1)


def _kl_categorical_of_target(logits, y):
    """:func:`_kl_categorical` with the clean log-probabilities in ``y["target"]``."""
    return _kl_categorical(logits, y["target"])


def _weighted_square_distance_of_target(mean, y):
    """:func:`_weighted_square_distance` with its ``(clean mean, w)`` in ``y["target"]``."""
    return _weighted_square_distance(mean, y["target"])


def _langevin_noise(step, y):
    """The gradient noise of engine step ``step``: ``y["noise"][:, step]`` of the per-example
    draws ``[B, steps + 1, d]`` (carried in ``y`` so they are chunked with the batch)."""
    return y["noise"][:, step]


# -- the attacks --------------------------------------------------------------------------------
def _prepare(agent, obs, eps, norm, scale):
    _surface(agent)  # first: a victim without a policy surface is named before anything else
    eps = _checks.nonnegative(eps, "eps") if not isinstance(eps, (tf.Tensor, tf.Variable)) \
        else eps
    norm = _checks.choice(_checks.norm_name(norm), "norm", NORMS)
    check_box_observations(agent.env.single_observation_space, "agent")
    return _victim(agent, scale), tf.cast(eps, tf.float32), norm


def _pgd(model, u, y, objective, eps, norm, steps, step_size, seed, targeted=False,
         loss_fn=None):
    if steps == 1 and not loss_fn and objective == "ce":
        return attacks.fast_gradient_method(model, u, y, eps=eps, norm=norm, clip_min=None,
                                            clip_max=None, targeted=targeted)
    return attacks.projected_gradient_descent(
        model, u, y, objective=objective, loss_fn=loss_fn, eps=eps, norm=norm, clip_min=None,
        clip_max=None, steps=steps, step_size=step_size, seed=seed, targeted=targeted)


def random_attack(agent: Agent, obs: tf.Tensor | np.ndarray, *, eps: float | tf.Tensor,
                  norm: str = "linf", seed: int | tf.Tensor = 0,
                  scale: str | np.ndarray | None = None) -> tf.Tensor:
    """Uniform noise in the ball of radius ``eps`` (in the agent's units, see module doc)."""
    victim, eps, norm = _prepare(agent, obs, eps, norm, scale)
    seed = step_seed(seed, 0) if isinstance(seed, (int, np.integer)) else seed
    return _in_scaled_space(victim, obs, eps, norm, lambda u: u + attacks.norms.random_in_ball(
        tf.shape(u), eps, norm, seed))


def action_attack(agent: Agent, obs: tf.Tensor | np.ndarray, *, eps: float | tf.Tensor,
                  norm: str = "linf", steps: int = 10, step_size: float | None = None,
                  seed: int | tf.Tensor = 0, scale: str | np.ndarray | None = None) -> tf.Tensor:
    """PGD (``steps=1``: FGSM) away from the clean action: cross-entropy away from the greedy
    action (discrete) or ``‖μ(ŝ) − μ(s)‖²`` (continuous, from a random start)."""
    victim, eps, norm = _prepare(agent, obs, eps, norm, scale)
    steps = _checks.positive_int(steps, "steps")

    def run(u):
        clean = tf.stop_gradient(victim.policy_outputs(u))
        if victim.discrete:
            return _pgd(victim.policy, u, tf.argmax(clean, -1), "ce", eps, norm, steps,
                        step_size, seed)
        target = (clean, tf.ones_like(clean))
        return _pgd(victim.policy, u, target, _weighted_square_distance, eps, norm, steps,
                    step_size, seed)

    return _in_scaled_space(victim, obs, eps, norm, run)


def mad_attack(agent: Agent, obs: tf.Tensor | np.ndarray, *, eps: float | tf.Tensor,
               norm: str = "linf", steps: int = 10, step_size: float | None = None,
               seed: int | tf.Tensor = 0, scale: str | np.ndarray | None = None) -> tf.Tensor:
    """Maximal action difference: maximise ``KL(π(·|s) ‖ π(·|ŝ))`` (Zhang et al. 2020) by
    ``steps`` PGD steps of ``step_size`` (default ``eps / steps``) from a random start."""
    victim, eps, norm = _prepare(agent, obs, eps, norm, scale)
    steps = _checks.positive_int(steps, "steps")
    step_size = eps / float(steps) if step_size is None else step_size

    def run(u):
        clean = tf.stop_gradient(victim.policy_outputs(u))
        if victim.discrete:
            return _pgd(victim.policy, u, tf.nn.log_softmax(clean), _kl_categorical, eps, norm,
                        steps, step_size, seed)
        target = (clean, tf.stop_gradient(victim.inverse_two_variance(tf.shape(u)[0])))
        return _pgd(victim.policy, u, target, _weighted_square_distance, eps, norm, steps,
                    step_size, seed)

    return _in_scaled_space(victim, obs, eps, norm, run)


def sgld_mad_attack(agent: Agent, obs: tf.Tensor | np.ndarray, *, eps: float | tf.Tensor,
                    norm: str = "linf", steps: int = 10, step_size: float | None = None,
                    temperature: float = SGLD_TEMPERATURE, seed: int | tf.Tensor = 0,
                    scale: str | np.ndarray | None = None) -> tf.Tensor:
    """Maximise ``KL(π(·|s) ‖ π(·|ŝ))`` by stochastic gradient Langevin dynamics, SA-PPO's
    ``sgld`` inner maximiser (Zhang et al. 2020, their code's schedule).

    Start at ``s + step_size · sign(ξ)`` (``ξ`` Gaussian: a random corner of the step's box);
    then ``steps`` times ``ŝ <- Π(ŝ + step_size · dir(∇KL + σ_i ξ_i))`` with
    ``σ_i = sqrt(2 · step_size · temperature) / (i + 2)`` (noise shrinking every step; ``dir`` is
    the sign for L∞, the unit vector for L2) and ``Π`` the projection onto the ball of radius
    ``eps`` around ``s``. ``step_size`` defaults to ``eps / steps``, ``temperature`` is ``1/β``.
    The whole maximisation is one call of the :mod:`attacks` PGD engine with its
    ``gradient_noise`` hook: ``steps + 1`` steps from ``s`` itself, the first with noise
    ``ξ_0`` of scale 1, where the KL's gradient vanishes (``ŝ = s`` is its minimum), so the first
    step is the random start ``s + step_size · dir(ξ_0)`` (the noise is drawn once, ``[B,
    steps + 1, d]``, and carried in the objective's ``y``). ``obs [B, d]`` -> ``[B, d]``
    float32, deterministic for a given ``seed``.

    >>> import numpy as np, agents
    >>> agent = agents.PPO(env="CartPole-v1", seed=0, num_envs=1, n_steps=32)
    >>> obs = np.zeros([4, 4], np.float32)
    >>> adv = sgld_mad_attack(agent, obs, eps=0.1, seed=0)
    >>> bool(np.abs(adv - obs).max() <= 0.1 + 1e-6), bool(np.all(adv == sgld_mad_attack(
    ...     agent, obs, eps=0.1, seed=0)))
    (True, True)
    """
    victim, eps, norm = _prepare(agent, obs, eps, norm, scale)
    steps = _checks.positive_int(steps, "steps")
    if not isinstance(temperature, (tf.Tensor, tf.Variable)):
        temperature = _checks.nonnegative(temperature, "temperature")
    step_size = eps / float(steps) if step_size is None else tf.cast(step_size, tf.float32)
    base = step_seed(seed, 0) if isinstance(seed, (int, np.integer)) else tf.cast(seed, tf.int32)
    scale0 = tf.sqrt(2.0 * step_size * tf.cast(temperature, tf.float32))

    def run(u):
        clean = tf.stop_gradient(victim.policy_outputs(u))
        if victim.discrete:
            target, objective = tf.nn.log_softmax(clean), _kl_categorical_of_target
        else:
            target = (clean, tf.stop_gradient(victim.inverse_two_variance(tf.shape(u)[0])))
            objective = _weighted_square_distance_of_target
        scales = [1.0] + [scale0 / float(i + 2) for i in range(steps)]  # the start, then sigma_i
        noise = tf.stack([tf.random.stateless_normal(tf.shape(u), seed=step_seed(base, j)) * sc
                          for j, sc in enumerate(scales)], axis=1)
        return attacks.projected_gradient_descent(
            victim.policy, u, {"target": target, "noise": tf.stop_gradient(noise)},
            objective=objective, eps=eps, norm=norm, clip_min=None, clip_max=None,
            steps=steps + 1, step_size=step_size, rand_init=False, gradient_noise=_langevin_noise)

    return _in_scaled_space(victim, obs, eps, norm, run)


def critic_attack(agent: Agent, obs: tf.Tensor | np.ndarray, *, eps: float | tf.Tensor,
                  norm: str = "linf", steps: int = 10, step_size: float | None = None,
                  seed: int | tf.Tensor = 0, scale: str | np.ndarray | None = None) -> tf.Tensor:
    """Minimise the agent's own critic: ``V(ŝ)`` (actor-critics), or for DQN make the greedy
    action at ŝ the action of lowest ``Q(s, ·)``."""
    check_attack(agent, "critic", 0.0, norm)
    victim, eps, norm = _prepare(agent, obs, eps, norm, scale)
    steps = _checks.positive_int(steps, "steps")

    def run(u):
        if victim.is_dqn:
            worst = tf.argmin(tf.stop_gradient(victim.policy_outputs(u)), -1)
            return _pgd(victim.policy, u, worst, "ce", eps, norm, steps, step_size, seed,
                        targeted=True)
        return _pgd(None, u, None, None, eps, norm, steps, step_size, seed,
                    loss_fn=victim.neg_value)

    return _in_scaled_space(victim, obs, eps, norm, run)


def rs_attack(agent: Agent, obs: tf.Tensor | np.ndarray, q_pi: QPi, *, eps: float | tf.Tensor,
              norm: str = "linf", steps: int = 10, step_size: float | None = None,
              seed: int | tf.Tensor = 0, scale: str | np.ndarray | None = None) -> tf.Tensor:
    """Robust Sarsa attack: minimise ``Q^π(s, π(ŝ))`` (discrete: the expectation under
    ``π(·|ŝ)``; continuous: at the mean action), ``q_pi`` a :class:`agents.robustness.robust_sarsa.QPi`."""
    victim, eps, norm = _prepare(agent, obs, eps, norm, scale)
    steps = _checks.positive_int(steps, "steps")
    obs_t = tf.convert_to_tensor(obs, tf.float32)

    def run(u):
        if victim.discrete:
            q_clean = tf.stop_gradient(q_pi.q_table(obs_t))
            return _pgd(victim.policy, u, q_clean, _negative_expected_q, eps, norm, steps,
                        step_size, seed)
        return _pgd(victim.policy, u, obs_t, q_pi.negative_q_of_action, eps, norm, steps,
                    step_size, seed)

    return _in_scaled_space(victim, obs_t, eps, norm, run)


_FUNCTIONS: dict[str, Callable[..., tf.Tensor]] = {
    "random": random_attack, "action": action_attack, "mad": mad_attack,
    "critic": critic_attack, "rs": rs_attack}


def attack_observations(agent: Agent, obs: tf.Tensor | np.ndarray, attack: str, *,
                        eps: float | tf.Tensor, norm: str = "linf", seed: int | tf.Tensor = 0,
                        scale: str | np.ndarray | None = None, q_pi: QPi | None = None,
                        **kwargs: Any) -> tf.Tensor:
    """Dispatch to the attack called ``attack`` (one of :data:`ATTACK_NAMES`)."""
    name = check_attack_name(attack)
    if name == "rs":
        if q_pi is None:
            raise ValueError("q_pi: the 'rs' attack needs a learned Q^π "
                             "(agents.robustness.robust_sarsa.fit_q_pi(agent))")
        return rs_attack(agent, obs, q_pi, eps=eps, norm=norm, seed=seed, scale=scale, **kwargs)
    return _FUNCTIONS[name](agent, obs, eps=eps, norm=norm, seed=seed, scale=scale, **kwargs)


class ObservationAttack:
    """A configured observation attack: ``ObservationAttack(agent, "mad", eps=0.1)(obs, seed)``.

    Holds the attack's name, budget, norm, units and keyword arguments (``steps``,
    ``step_size``); ``rs`` learns its ``Q^π`` on first use (``rs_steps`` victim steps, or pass
    ``q_pi``). Calls run one compiled function per attack object (eps and the seed are tensor
    arguments: changing them does not retrace).
    """

    def __init__(self, agent: Agent, attack: str, eps: float, norm: str = "linf", *,
                 scale: str | np.ndarray | None = None, q_pi: QPi | None = None,
                 rs_steps: int = 20_000, **kwargs: Any):
        self.name, self.eps, self.norm = check_attack(agent, attack, eps, norm)
        self.agent = agent
        self.scale = scale
        _victim(agent, scale)  # validates scale
        self.q_pi = q_pi
        self.rs_steps = _checks.positive_int(rs_steps, "rs_steps")
        self.kwargs = dict(kwargs)
        self._compiled = None

    def _fn(self):
        if self._compiled is None:
            if self.name == "rs" and self.q_pi is None:
                self.q_pi = fit_q_pi(self.agent, steps=self.rs_steps)
            name, agent, norm, scale, q_pi, kw = (self.name, self.agent, self.norm, self.scale,
                                                  self.q_pi, self.kwargs)

            def attack(obs, eps, seed):
                return attack_observations(agent, obs, name, eps=eps, norm=norm, seed=seed,
                                           scale=scale, q_pi=q_pi, **kw)

            victim = _victim(agent, scale)

            def step(obs, eps, seed):
                adv = attack(obs, eps, seed)
                return (adv, perturbation_norms(obs, adv, victim.scale(), norm),
                        victim.deterministic_actions(adv), victim.deterministic_actions(obs))

            self._compiled = tf.function(attack, reduce_retracing=True)
            self._compiled_step = tf.function(step, reduce_retracing=True)
        return self._compiled

    def _args(self, obs, seed, eps):
        eps = self.eps if eps is None else float(_checks.nonnegative(eps, "eps"))
        obs = tf.convert_to_tensor(np.asarray(obs, np.float32))
        s = step_seed(seed, 0) if isinstance(seed, (int, np.integer)) else tf.cast(seed, tf.int32)
        return obs, tf.constant(eps, tf.float32), s

    def __call__(self, obs: np.ndarray | tf.Tensor, seed: int | tf.Tensor = 0,
                 eps: float | None = None) -> tf.Tensor:
        """``obs [B, d]`` -> ``obs_adv [B, d]`` (float32); ``seed`` an int or ``[2]`` tensor."""
        return self._fn()(*self._args(obs, seed, eps))

    def step(self, obs: np.ndarray | tf.Tensor, seed: int | tf.Tensor = 0, eps: float | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One compiled call for a rollout step: ``(obs_adv, norms [B], actions at obs_adv,
        actions at obs)``, norms in eps units, actions deterministic (as ``agent.act``)."""
        args = self._args(obs, seed, eps)
        self._fn()
        return tuple(t.numpy() for t in self._compiled_step(*args))

    def units(self) -> np.ndarray:
        """The per-dimension unit of eps (see :func:`perturbation_scale`)."""
        return perturbation_scale(self.agent, self.scale)

    def __repr__(self):
        return f"ObservationAttack({self.name!r}, eps={self.eps}, norm={self.norm!r})"
