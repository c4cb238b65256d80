"""PA-AD: a director that learns a direction in the victim's policy space, an actor that
realises it with a gradient attack.

Sun, Zhang, Liang, Zhang, Huang, "Who is the strongest enemy? Towards optimal and efficient
evasion attacks in deep RL", ICLR 2022. The ``optimal`` adversary (:mod:`agents.robustness.adversary`)
searches the whole ball with RL; PA-AD splits the job. The *director*, a PPO in the same
adversary MDP, chooses a direction ``h = tanh(a)`` in policy space: ``[A]`` over the actions
for a discrete victim (mass to move toward actions with large ``h``), ``[k]`` over the action
dimensions of a Gaussian victim (where to move its mean). The *actor* finds the observation
that moves the policy that way, inside the ball: ``steps`` PGD steps of the project's attack
engine (:func:`attacks.projected_gradient_descent`, no random start, step ``2.5 r / steps``)
maximising ``⟨π(·|ŝ), h⟩`` (discrete) or ``⟨μ(ŝ), h⟩`` (continuous), in the victim's units
(``ŝ = s + δ · scale``, ``‖δ‖∞ ≤ r``). The paper's actor maximises the cosine between
``π(ŝ) − π(s)`` and ``h``; the inner product used here has the same first-order direction and
needs no normalisation of a zero change at the start (a simplification, stated).

The director's action has the victim's action size, not the observation's: on CartPole 2
numbers instead of 4, on MuJoCo a few instead of ~11-376, which is the paper's point.

>>> import numpy as np, agents
>>> from agents.robustness.adversary import victim_surface
>>> victim = agents.PPO(env="CartPole-v1", seed=0, num_envs=1, n_steps=32)
>>> perturb, k = director_perturbation(victim, victim_surface(victim))
>>> obs = np.zeros([2, 4], np.float32)
>>> seen = perturb(obs, np.array([[3.0, -3.0], [-3.0, 3.0]], np.float32), 0.1)
>>> k, seen.shape, bool(np.abs(seen - obs).max() <= 0.1 + 1e-6)
(2, (2, 4), True)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

import attacks
from agents.core.base import Agent
from agents.robustness._victim import Victim, _victim
from robustgrad import checks as _checks

__all__ = ["director_perturbation", "policy_direction_objective"]


def _toward_probabilities(logits, direction):
    """``⟨softmax(logits), h⟩`` per row (discrete victims)."""
    return tf.reduce_sum(tf.nn.softmax(logits) * direction, -1)


def _toward_mean(mean, direction):
    """``⟨μ, h⟩`` per row (Gaussian victims, and DQN's Q-values taken as logits)."""
    return tf.reduce_sum(mean * direction, -1)


def policy_direction_objective(discrete: bool) -> Callable:
    """The actor's objective ``f(policy outputs [B, A], h [B, A]) -> [B]`` to maximise."""
    return _toward_probabilities if discrete else _toward_mean


def _policy_in_units(victim: Agent):
    """The victim's policy outputs as a function of ``u = s / scale`` and ``scale [d]``: the
    one place PA-AD reaches into the victim (the policy surface's adapter)."""
    v = _victim(victim, None)
    return v.policy, v.scale()


def director_perturbation(victim: Agent, surface: Victim, pgd_steps: int = 10
                          ) -> tuple[Callable, int]:
    """``(perturb, k)``: PA-AD's actor as the adversary MDP's perturbation
    ``perturb(obs [B, d], a [B, k], radius) -> ŝ [B, d]`` float32, and the director's action
    size ``k`` (the victim's number of actions, or its action dimension)."""
    pgd_steps = _checks.positive_int(pgd_steps, "pgd_steps")
    space = victim.env.single_action_space
    k = int(space.n) if surface.discrete else int(space.shape[0])
    objective = policy_direction_objective(surface.discrete and not hasattr(victim, "q_values"))

    @tf.function(input_signature=[tf.TensorSpec([None, *surface.obs_shape], tf.float32),
                                  tf.TensorSpec([None, k], tf.float32),
                                  tf.TensorSpec([], tf.float32)])
    def realise(obs, action, radius):  # one compiled call per step (eager: 2x the CPU)
        policy, scale = _policy_in_units(victim)
        u = obs / scale
        u_adv = attacks.projected_gradient_descent(
            policy, u, tf.tanh(action), objective=objective, eps=radius, norm="linf",
            clip_min=None, clip_max=None, steps=pgd_steps, step_size=2.5 * radius / pgd_steps,
            rand_init=False)
        delta = attacks.norms.project(u_adv - u, radius, "linf")
        return obs + delta * scale

    def perturb(obs, action, radius):
        return realise(np.asarray(obs, np.float32), np.asarray(action, np.float32),
                       np.float32(radius)).numpy()

    return perturb, k
