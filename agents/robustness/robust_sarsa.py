"""Robust Sarsa: learn ``Q^π`` of a *fixed* victim policy, for the ``rs`` observation attack.

Zhang et al., "Robust deep reinforcement learning against adversarial perturbations on state
observations", NeurIPS 2020 (appendix: the Robust Sarsa attack). The victim is frozen; its
action-value function is fitted by TD on its own rollouts:

    L(θ) = E[(r + γ (1 − terminated) Q_θ̄(s', π(s')) − Q_θ(s, a))²]
           + λ E[max_{‖â − a‖∞ ≤ ε_a} (Q_θ(s, â) − Q_θ(s, a))²]

``π(s')`` is the victim's deterministic action (the policy under evaluation); the transitions
come from the victim's *stochastic* policy so that every action is visited (TD(0) evaluation
of the deterministic policy from that behaviour data). ``θ̄`` is a target copy refreshed every
``target_every`` updates. The robustness term (continuous actions only: a discrete ``Q(s, ·)``
is a table, and the attack on it is linear in ``π(·|ŝ)``) makes ``Q^π`` smooth in the action,
so that the attack's minimisation over ``π(ŝ)`` finds real weaknesses instead of fitting
errors; its inner maximisation is an :func:`attacks.projected_gradient_descent` call.
Truncated episodes bootstrap from the final observation.

>>> import agents
>>> victim = agents.PPO(env="CartPole-v1", seed=0, num_envs=1, n_steps=32)
>>> q_pi = fit_q_pi(victim, steps=200, updates=20, seed=0)
>>> q_pi.q_table(np.zeros([3, 4], np.float32)).shape
TensorShape([3, 2])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

import attacks
from agents.core._step import make_adam_step
from agents.core.networks import MLP
from agents.envs import make_vec_env
from robustgrad import checks as _checks

if TYPE_CHECKING:
    from agents.core.base import Agent

__all__ = ["QPi", "collect_transitions", "fit_q_pi"]


class QPi(tf.Module):
    """``Q^π(s, a)`` of a fixed victim. Discrete: ``s -> [A]``; continuous: ``(s, a) -> []``.

    Observations are standardised with the statistics of the training data (stored here).
    """

    def __init__(self, obs_dim: int, n_actions_or_dim: int, discrete: bool,
                 hidden: tuple[int, ...] = (64, 64), seed: int = 0,
                 obs_mean: np.ndarray | None = None, obs_std: np.ndarray | None = None):
        super().__init__(name="q_pi")
        self.discrete = discrete
        in_dim = obs_dim if discrete else obs_dim + n_actions_or_dim
        out_dim = n_actions_or_dim if discrete else 1
        self.net = MLP(in_dim, tuple(hidden), out_dim, "tanh", 1.0, seed, name="q_pi_mlp")
        self.obs_mean = tf.constant(np.zeros(obs_dim) if obs_mean is None else obs_mean,
                                    tf.float32)
        self.obs_std = tf.constant(np.ones(obs_dim) if obs_std is None else obs_std, tf.float32)
        # stable callables (one identity each) for the attacks' compiled-loop cache
        self.negative_q_of_action = _NegativeQ(self)

    def _x(self, obs):
        return (tf.convert_to_tensor(obs, tf.float32) - self.obs_mean) / self.obs_std

    def q_table(self, obs: tf.Tensor) -> tf.Tensor:
        """``Q^π(s, ·)`` ``[B, A]`` (discrete actions)."""
        return self.net(self._x(obs))

    def q(self, obs: tf.Tensor, actions: tf.Tensor) -> tf.Tensor:
        """``Q^π(s, a)`` ``[B]``; ``actions`` int ``[B]`` (discrete) or ``[B, k]``."""
        if self.discrete:
            return tf.gather(self.q_table(obs), tf.cast(actions, tf.int32), batch_dims=1)
        a = tf.cast(actions, tf.float32)
        return tf.squeeze(self.net(tf.concat([self._x(obs), a], -1)), -1)


class _NegativeQ:
    """``objective(mean_action, obs) = −Q^π(obs, mean_action)`` for the ``rs`` attack."""

    def __init__(self, q_pi):
        self.q_pi = q_pi

    def __call__(self, actions, obs):
        return -self.q_pi.q(obs, actions)


class _Identity:
    def __call__(self, x, training=False):
        return x


class _ActionGap:
    """``objective(â, (s, q_sa)) = (Q(s, â) − Q(s, a))²``: the robustness term's inner max."""

    def __init__(self, q_pi):
        self.q_pi = q_pi

    def __call__(self, actions, target):
        obs, q_sa = target
        return tf.square(self.q_pi.q(obs, actions) - q_sa)


def collect_transitions(agent: Agent, steps: int, seed: int = 0, num_envs: int = 8
                        ) -> dict[str, np.ndarray]:
    """``steps`` transitions of the agent's stochastic policy on fresh envs of its env id:
    ``obs, actions, rewards, next_obs`` (the final observation where an episode ended),
    ``terminated`` and ``next_actions`` (the deterministic policy at ``next_obs``)."""
    steps = _checks.positive_int(steps, "steps")
    env = make_vec_env(agent.config.env, num_envs, seed=seed)
    out: dict[str, list[np.ndarray]] = {
        k: [] for k in ("obs", "actions", "rewards", "next_obs", "terminated")}
    try:
        obs = env.reset()
        for _ in range(-(-steps // num_envs)):
            a = agent.act(obs, deterministic=False)
            nobs, r, term, _trunc, final = env.step(a)
            for k, v in zip(out, (obs, a, r, final, term)):
                out[k].append(np.asarray(v))
            obs = nobs
    finally:
        env.close()
    data = {k: np.concatenate(v)[:steps] for k, v in out.items()}
    data["next_actions"] = np.asarray(agent.act(data["next_obs"], deterministic=True))
    return data


def fit_q_pi(agent: Agent, steps: int = 20_000, *, updates: int = 3000, batch_size: int = 256,
             learning_rate: float = 1e-3, gamma: float | None = None, target_every: int = 50,
             robust_coef: float = 0.1, action_eps: float = 0.05,
             hidden: tuple[int, ...] = (64, 64), seed: int = 0,
             data: dict[str, np.ndarray] | None = None) -> QPi:
    """Learn ``Q^π`` of ``agent`` by TD on ``steps`` of its rollouts (module doc).

    Args:
      steps: victim environment steps collected (the attack's training budget).
      updates: Adam steps on minibatches of ``batch_size``; ``target_every``: target refresh.
      gamma: discount (default: the agent's). robust_coef, action_eps: λ and ε_a of the
        robustness term (continuous actions; ``robust_coef=0`` disables it).
      data: transitions from :func:`collect_transitions` (then ``steps`` is not used).
    """
    updates = _checks.positive_int(updates, "updates")
    batch_size = _checks.positive_int(batch_size, "batch_size")
    target_every = _checks.positive_int(target_every, "target_every")
    gamma = agent.config.gamma if gamma is None else _checks.probability(gamma, "gamma")
    robust_coef = _checks.nonnegative(robust_coef, "robust_coef")
    action_eps = _checks.nonnegative(action_eps, "action_eps")
    if data is None:
        data = collect_transitions(agent, steps, seed=seed)
    obs = data["obs"].astype(np.float32)
    discrete = bool(agent.discrete)
    n_out = int(agent.env.single_action_space.n) if discrete \
        else int(agent.env.single_action_space.shape[0])
    q_pi = QPi(obs.shape[1], n_out, discrete, hidden, seed, obs.mean(0),
               obs.std(0) + 1e-3)
    target = QPi(obs.shape[1], n_out, discrete, hidden, seed, obs.mean(0), obs.std(0) + 1e-3)
    variables = list(q_pi.net.trainable_variables)
    target_vars = list(target.net.trainable_variables)
    # transforms.adam behind the agents' guard: a non-finite TD gradient is skipped, not applied
    gradient_step, _ = make_adam_step(variables, learning_rate)
    apply = tf.autograph.experimental.do_not_convert(gradient_step.step)
    tensors = {k: tf.constant(v) for k, v in data.items()}
    n = obs.shape[0]
    rng = tf.random.Generator.from_seed(seed)
    identity, gap = _Identity(), _ActionGap(q_pi)
    use_robust = (not discrete) and robust_coef > 0 and action_eps > 0

    def sync():
        for t, s in zip(target_vars, variables):
            t.assign(s)

    def worst_actions(obs, actions):
        """The robustness term's inner max: PGD over the ε_a-ball of actions (outside the
        tape: no gradient through the search)."""
        a = tf.cast(actions, tf.float32)
        if not use_robust:
            return a
        q_sa = tf.stop_gradient(q_pi.q(obs, actions))
        return tf.stop_gradient(attacks.projected_gradient_descent(
            identity, a, (obs, q_sa), objective=gap, eps=action_eps, norm="linf",
            clip_min=None, clip_max=None, steps=5,
            seed=tf.cast(rng.make_seeds(1)[:, 0], tf.int32)))

    @tf.function
    def train(n_updates):
        loss = tf.constant(0.0)
        for _ in tf.range(n_updates):
            idx = rng.uniform([batch_size], 0, n, dtype=tf.int32)
            b = {k: tf.gather(v, idx) for k, v in tensors.items()}
            not_done = 1.0 - tf.cast(b["terminated"], tf.float32)
            y = tf.stop_gradient(b["rewards"] + gamma * not_done
                                 * target.q(b["next_obs"], b["next_actions"]))
            a_hat = worst_actions(b["obs"], b["actions"])
            with tf.GradientTape() as tape:
                q = q_pi.q(b["obs"], b["actions"])
                loss = tf.reduce_mean(tf.square(y - q))
                if use_robust:
                    loss += robust_coef * tf.reduce_mean(
                        tf.square(q_pi.q(b["obs"], a_hat) - tf.stop_gradient(q)))
            grads = tape.gradient(loss, variables)
            apply(grads)
        return loss

    sync()
    done = 0
    while done < updates:
        k = min(target_every, updates - done)
        train(tf.constant(k))
        sync()
        done += k
    return q_pi
