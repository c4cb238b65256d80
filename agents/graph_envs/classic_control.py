"""gymnasium's five classic-control tasks as TensorFlow ops over a batch of environments.

Each task is a :class:`Dynamics` record of three pure functions over a batch of ``N``
environments, and the facts :mod:`agents.graph_envs.core` needs to wrap them:

* ``sample(key, n, dtype) -> physics [n, k]``: the reset distribution of gymnasium 1.x,
  drawn from Philox bits (:func:`uniform01`, the same numbers with and without XLA) of
  ``key`` (a ``[2]`` int64 seed);
* ``transition(physics, actions, ew=TF_ELEMENTWISE) -> (next_physics [N, k], reward [N],
  terminated [N] bool)``: one step of the dynamics (``actions`` is ``[N]``: int for discrete
  tasks, float for the ``Box(shape=(1,))`` ones); rewards are in the physics dtype; ``sin`` and
  ``cos`` are ``ew``'s (:class:`Elementwise`);
* ``observe(physics, ew=TF_ELEMENTWISE) -> obs [N, obs_dim] float32``.

The equations follow the gymnasium sources (``gymnasium/envs/classic_control``); they are
written here as batched tensor expressions, not copied:

* CartPole-v1 (Barto, Sutton & Anderson 1983): explicit Euler with ``tau = 0.02``, force
  ``+10`` for action 1 and ``-10`` otherwise, termination at ``|x| > 2.4`` or
  ``|theta| > 12 degrees``, reward 1 on every step including the terminating one.
* Acrobot-v1 (Sutton 1996, "book" dynamics): torque ``action - 1``, one RK4 step of
  ``dt = 0.2`` with the torque held constant, angles wrapped into ``[-pi, pi]``, velocities
  clipped to ``4 pi`` / ``9 pi``; terminated when the tip height ``-cos t1 - cos(t1 + t2) > 1``;
  reward -1 per step, 0 on the terminating one.
* MountainCar-v0 (Moore 1990): velocity clipped to ``0.07``, position to ``[-1.2, 0.6]`` and
  the velocity zeroed at the left wall; goal ``position >= 0.5`` (and velocity >= 0).
* MountainCarContinuous-v0: force ``clip(a, -1, 1) * 0.0015``, goal at 0.45, reward
  ``100 * goal - 0.1 * a**2`` with the *unclipped* action, as gymnasium computes it.
* Pendulum-v1: torque clipped to ``[-2, 2]``, cost ``normalise(theta)**2 + 0.1 thetadot**2 +
  0.001 u**2`` with ``normalise(x) = ((x + pi) mod 2 pi) - pi``, semi-implicit Euler with
  ``dt = 0.05``, angular velocity clipped to 8, ``g = 10``; never terminates.

Like gymnasium, actions outside the action space are not rejected here: CartPole treats any
action other than 1 as "left", Acrobot and MountainCar use ``action - 1`` as the torque or push.
The stateful adapter (:class:`agents.graph_envs.GraphVecEnv`) validates actions.

>>> import tensorflow as tf
>>> physics = tf.constant([[0.0, 0.0, 0.0, 0.0]], tf.float64)
>>> nxt, reward, terminated = CARTPOLE.transition(physics, tf.constant([1]))
>>> [round(float(v), 4) for v in nxt[0]], float(reward[0]), bool(terminated[0])
([0.0, 0.1951, 0.0, -0.2927], 1.0, False)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import tensorflow as tf

RNG_ALG = "philox"
"""Named explicitly: the default ``"auto_select"`` may pick another generator on another device."""


class Elementwise(NamedTuple):
    """The elementwise functions of the dynamics whose CPU kernels round by where an element
    sits in its tensor: ``sin`` and ``cos`` (Eigen's vectorised polynomial on whole SIMD packets,
    the C library's function on the rest). The tasks call them through this record
    (:data:`TF_ELEMENTWISE` by default: ``tf.sin``, ``tf.cos``) so that the seed axis can apply
    them to all seeds' environments in a few ops and still round each seed's block as that seed
    alone does (:mod:`agents.backends.seed_axis`). Every other op of the dynamics rounds each
    element on its own (``+ - * /``, ``sqrt``, ``floormod``, ``ceil``, comparisons)."""

    sin: Callable[[tf.Tensor], tf.Tensor]
    cos: Callable[[tf.Tensor], tf.Tensor]


TF_ELEMENTWISE = Elementwise(sin=tf.sin, cos=tf.cos)
"""TensorFlow's own ``sin`` and ``cos``: what the dynamics use unless told otherwise."""


class Dynamics(NamedTuple):
    """One task: its id, time limit, spaces and three pure batched functions (module doc;
    ``transition`` and ``observe`` take an optional :class:`Elementwise` last)."""

    env_id: str
    max_episode_steps: int
    observation_space: gym.spaces.Box
    action_space: gym.spaces.Discrete | gym.spaces.Box
    sample: Callable[[tf.Tensor, tf.Tensor, tf.DType], tf.Tensor]
    transition: Callable[..., tuple]  # (physics, actions[, Elementwise])
    observe: Callable[..., tf.Tensor]  # (physics[, Elementwise])


def uniform01(key: tf.Tensor, shape: tf.Tensor | tuple[int, ...], dtype: tf.DType) -> tf.Tensor:
    """Uniform draws in ``[0, 1)`` from raw Philox bits: the top 24 (float32) or 53 (float64) bits
    of each integer, times ``2**-24`` / ``2**-53``.

    Built from integer draws because ``tf.random.stateless_uniform``'s float conversion differs
    under XLA on CPU (its integer draws do not), so a rollout gives the same numbers compiled with
    and without ``jit_compile``.

    >>> u = uniform01(tf.constant([1, 2], tf.int64), [1000], tf.float32)
    >>> u.dtype, bool(tf.reduce_min(u) >= 0.0), bool(tf.reduce_max(u) < 1.0)
    (tf.float32, True, True)
    """
    if dtype == tf.float64:
        bits = tf.random.stateless_uniform(shape, key, minval=None, maxval=None, dtype=tf.uint64,
                                           alg=RNG_ALG)
        return tf.cast(tf.bitwise.right_shift(bits, tf.constant(11, tf.uint64)), dtype) * 2.0 ** -53
    bits = tf.random.stateless_uniform(shape, key, minval=None, maxval=None, dtype=tf.uint32, alg=RNG_ALG)
    return tf.cast(tf.bitwise.right_shift(bits, tf.constant(8, tf.uint32)), dtype) * 2.0 ** -24


def _uniform(key, n, low, high, dtype):
    """``[n, len(low)]`` uniform draws in ``[low, high)`` per column."""
    low = tf.constant(low, dtype)
    high = tf.constant(high, dtype)
    return low + (high - low) * uniform01(key, tf.stack([n, tf.size(low)]), dtype)


def _as_float32(physics, ew=TF_ELEMENTWISE):
    return tf.cast(physics, tf.float32)


# --- CartPole-v1 ------------------------------------------------------------------------------
_CP_GRAVITY, _CP_MASS_CART, _CP_MASS_POLE, _CP_HALF_LENGTH = 9.8, 1.0, 0.1, 0.5
_CP_FORCE, _CP_TAU, _CP_X_LIMIT = 10.0, 0.02, 2.4
_CP_THETA_LIMIT = 12 * 2 * math.pi / 360


def _cartpole_transition(physics, actions, ew=TF_ELEMENTWISE):
    x, x_dot, theta, theta_dot = tf.unstack(physics, axis=1)
    dtype = physics.dtype
    force = tf.where(tf.equal(actions, 1), tf.constant(_CP_FORCE, dtype), tf.constant(-_CP_FORCE, dtype))
    total_mass = _CP_MASS_POLE + _CP_MASS_CART
    pole_mass_length = _CP_MASS_POLE * _CP_HALF_LENGTH
    cos, sin = ew.cos(theta), ew.sin(theta)
    temp = (force + pole_mass_length * tf.square(theta_dot) * sin) / total_mass
    theta_acc = (_CP_GRAVITY * sin - cos * temp) / (
        _CP_HALF_LENGTH * (4.0 / 3.0 - _CP_MASS_POLE * tf.square(cos) / total_mass))
    x_acc = temp - pole_mass_length * theta_acc * cos / total_mass
    nxt = tf.stack([x + _CP_TAU * x_dot, x_dot + _CP_TAU * x_acc,
                    theta + _CP_TAU * theta_dot, theta_dot + _CP_TAU * theta_acc], axis=1)
    new_x, new_theta = nxt[:, 0], nxt[:, 2]
    terminated = ((new_x < -_CP_X_LIMIT) | (new_x > _CP_X_LIMIT)
                  | (new_theta < -_CP_THETA_LIMIT) | (new_theta > _CP_THETA_LIMIT))
    return nxt, tf.ones_like(x), terminated


_cp_high = np.array([_CP_X_LIMIT * 2, np.inf, _CP_THETA_LIMIT * 2, np.inf], np.float32)
CARTPOLE = Dynamics(
    env_id="CartPole-v1", max_episode_steps=500,
    observation_space=gym.spaces.Box(-_cp_high, _cp_high, dtype=np.float32),
    action_space=gym.spaces.Discrete(2),
    sample=lambda key, n, dtype: _uniform(key, n, [-0.05] * 4, [0.05] * 4, dtype),
    transition=_cartpole_transition, observe=_as_float32)


# --- Acrobot-v1 -------------------------------------------------------------------------------
_AC_DT, _AC_G = 0.2, 9.8
_AC_L1, _AC_M1, _AC_M2, _AC_LC1, _AC_LC2, _AC_I1, _AC_I2 = 1.0, 1.0, 1.0, 0.5, 0.5, 1.0, 1.0
_AC_MAX_VEL_1, _AC_MAX_VEL_2 = 4 * math.pi, 9 * math.pi


def _acrobot_derivatives(s, torque, ew=TF_ELEMENTWISE):
    """``d/dt [t1, t2, dt1, dt2]`` of the book dynamics, ``s`` of shape ``[N, 4]``."""
    theta1, theta2, dtheta1, dtheta2 = tf.unstack(s, axis=1)
    m2, l1, lc1, lc2 = _AC_M2, _AC_L1, _AC_LC1, _AC_LC2
    d1 = (_AC_M1 * lc1 ** 2 + m2 * (l1 ** 2 + lc2 ** 2 + 2 * l1 * lc2 * ew.cos(theta2))
          + _AC_I1 + _AC_I2)
    d2 = m2 * (lc2 ** 2 + l1 * lc2 * ew.cos(theta2)) + _AC_I2
    phi2 = m2 * lc2 * _AC_G * ew.cos(theta1 + theta2 - math.pi / 2.0)
    phi1 = (-m2 * l1 * lc2 * tf.square(dtheta2) * ew.sin(theta2)
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * ew.sin(theta2)
            + (_AC_M1 * lc1 + m2 * l1) * _AC_G * ew.cos(theta1 - math.pi / 2) + phi2)
    ddtheta2 = ((torque + d2 / d1 * phi1 - m2 * l1 * lc2 * tf.square(dtheta1) * ew.sin(theta2) - phi2)
                / (m2 * lc2 ** 2 + _AC_I2 - tf.square(d2) / d1))
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return tf.stack([dtheta1, dtheta2, ddtheta1, ddtheta2], axis=1)


def _wrap(x, low, high):
    """Shift ``x`` by whole periods ``high - low`` into ``[low, high]`` (values inside stay)."""
    period = high - low
    x = tf.where(x > high, x - period * tf.math.ceil((x - high) / period), x)
    return tf.where(x < low, x + period * tf.math.ceil((low - x) / period), x)


def _acrobot_transition(physics, actions, ew=TF_ELEMENTWISE):
    torque = tf.cast(actions, physics.dtype) - 1.0
    f = lambda s: _acrobot_derivatives(s, torque, ew)
    k1 = f(physics)
    k2 = f(physics + _AC_DT / 2.0 * k1)
    k3 = f(physics + _AC_DT / 2.0 * k2)
    k4 = f(physics + _AC_DT * k3)
    s = physics + _AC_DT / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
    theta1, theta2, dtheta1, dtheta2 = tf.unstack(s, axis=1)
    nxt = tf.stack([_wrap(theta1, -math.pi, math.pi), _wrap(theta2, -math.pi, math.pi),
                    tf.clip_by_value(dtheta1, -_AC_MAX_VEL_1, _AC_MAX_VEL_1),
                    tf.clip_by_value(dtheta2, -_AC_MAX_VEL_2, _AC_MAX_VEL_2)], axis=1)
    terminated = -ew.cos(nxt[:, 0]) - ew.cos(nxt[:, 1] + nxt[:, 0]) > 1.0
    reward = tf.where(terminated, tf.zeros_like(theta1), -tf.ones_like(theta1))
    return nxt, reward, terminated


def _acrobot_observe(physics, ew=TF_ELEMENTWISE):
    theta1, theta2, dtheta1, dtheta2 = tf.unstack(physics, axis=1)
    obs = tf.stack([ew.cos(theta1), ew.sin(theta1), ew.cos(theta2), ew.sin(theta2), dtheta1, dtheta2],
                   axis=1)
    return tf.cast(obs, tf.float32)


_ac_high = np.array([1.0, 1.0, 1.0, 1.0, _AC_MAX_VEL_1, _AC_MAX_VEL_2], np.float32)
ACROBOT = Dynamics(
    env_id="Acrobot-v1", max_episode_steps=500,
    observation_space=gym.spaces.Box(-_ac_high, _ac_high, dtype=np.float32),
    action_space=gym.spaces.Discrete(3),
    # gymnasium draws the reset state in float64 and rounds it to float32
    sample=lambda key, n, dtype: tf.cast(tf.cast(
        _uniform(key, n, [-0.1] * 4, [0.1] * 4, dtype), tf.float32), dtype),
    transition=_acrobot_transition, observe=_acrobot_observe)


# --- MountainCar-v0 and MountainCarContinuous-v0 ------------------------------------------------
_MC_MIN_POS, _MC_MAX_POS, _MC_MAX_SPEED, _MC_GRAVITY = -1.2, 0.6, 0.07, 0.0025


def _mountain_car_move(physics, push, goal_position, ew=TF_ELEMENTWISE):
    """Shared hill dynamics: ``push`` is the velocity change from the action; returns next
    physics and the goal flag."""
    position, velocity = tf.unstack(physics, axis=1)
    velocity = velocity + (push - _MC_GRAVITY * ew.cos(3 * position))  # gymnasium's order of sums
    velocity = tf.clip_by_value(velocity, -_MC_MAX_SPEED, _MC_MAX_SPEED)
    position = tf.clip_by_value(position + velocity, _MC_MIN_POS, _MC_MAX_POS)
    at_wall = tf.equal(position, tf.constant(_MC_MIN_POS, physics.dtype)) & (velocity < 0)
    velocity = tf.where(at_wall, tf.zeros_like(velocity), velocity)
    goal = (position >= goal_position) & (velocity >= 0)
    return tf.stack([position, velocity], axis=1), goal


def _mountain_car_transition(physics, actions, ew=TF_ELEMENTWISE):
    push = (tf.cast(actions, physics.dtype) - 1.0) * 0.001
    nxt, goal = _mountain_car_move(physics, push, 0.5, ew)
    return nxt, -tf.ones_like(nxt[:, 0]), goal


def _continuous_mountain_car_transition(physics, actions, ew=TF_ELEMENTWISE):
    action = tf.cast(actions, physics.dtype)
    nxt, goal = _mountain_car_move(physics, tf.clip_by_value(action, -1.0, 1.0) * 0.0015, 0.45,
                                   ew)
    reward = 100.0 * tf.cast(goal, physics.dtype) - 0.1 * tf.square(action)
    return nxt, reward, goal


def _mountain_car_sample(key, n, dtype):
    position = _uniform(key, n, [-0.6], [-0.4], dtype)
    return tf.concat([position, tf.zeros_like(position)], axis=1)


_mc_low = np.array([_MC_MIN_POS, -_MC_MAX_SPEED], np.float32)
_mc_high = np.array([_MC_MAX_POS, _MC_MAX_SPEED], np.float32)
MOUNTAIN_CAR = Dynamics(
    env_id="MountainCar-v0", max_episode_steps=200,
    observation_space=gym.spaces.Box(_mc_low, _mc_high, dtype=np.float32),
    action_space=gym.spaces.Discrete(3),
    sample=_mountain_car_sample, transition=_mountain_car_transition, observe=_as_float32)
MOUNTAIN_CAR_CONTINUOUS = Dynamics(
    env_id="MountainCarContinuous-v0", max_episode_steps=999,
    observation_space=gym.spaces.Box(_mc_low, _mc_high, dtype=np.float32),
    action_space=gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32),
    sample=_mountain_car_sample, transition=_continuous_mountain_car_transition,
    observe=_as_float32)


# --- Pendulum-v1 --------------------------------------------------------------------------------
_PD_MAX_SPEED, _PD_MAX_TORQUE, _PD_DT, _PD_G, _PD_M, _PD_L = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0


def _angle_normalize(x):
    return tf.math.floormod(x + math.pi, 2 * math.pi) - math.pi


def _pendulum_transition(physics, actions, ew=TF_ELEMENTWISE):
    theta, theta_dot = tf.unstack(physics, axis=1)
    u = tf.clip_by_value(tf.cast(actions, physics.dtype), -_PD_MAX_TORQUE, _PD_MAX_TORQUE)
    cost = tf.square(_angle_normalize(theta)) + 0.1 * tf.square(theta_dot) + 0.001 * tf.square(u)
    new_theta_dot = theta_dot + (3 * _PD_G / (2 * _PD_L) * ew.sin(theta)
                                 + 3.0 / (_PD_M * _PD_L ** 2) * u) * _PD_DT
    new_theta_dot = tf.clip_by_value(new_theta_dot, -_PD_MAX_SPEED, _PD_MAX_SPEED)
    nxt = tf.stack([theta + new_theta_dot * _PD_DT, new_theta_dot], axis=1)
    return nxt, -cost, tf.zeros_like(theta, tf.bool)


def _pendulum_observe(physics, ew=TF_ELEMENTWISE):
    theta, theta_dot = tf.unstack(physics, axis=1)
    return tf.cast(tf.stack([ew.cos(theta), ew.sin(theta), theta_dot], axis=1), tf.float32)


_pd_high = np.array([1.0, 1.0, _PD_MAX_SPEED], np.float32)
PENDULUM = Dynamics(
    env_id="Pendulum-v1", max_episode_steps=200,
    observation_space=gym.spaces.Box(-_pd_high, _pd_high, dtype=np.float32),
    action_space=gym.spaces.Box(-_PD_MAX_TORQUE, _PD_MAX_TORQUE, shape=(1,), dtype=np.float32),
    sample=lambda key, n, dtype: _uniform(key, n, [-math.pi, -1.0], [math.pi, 1.0], dtype),
    transition=_pendulum_transition, observe=_pendulum_observe)


DYNAMICS = {d.env_id: d for d in (CARTPOLE, ACROBOT, MOUNTAIN_CAR, PENDULUM, MOUNTAIN_CAR_CONTINUOUS)}
