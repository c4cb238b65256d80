"""The victim of an observation attack seen through the attack's coordinates.

An observation attack perturbs ``u = s / scale``, where ``scale [d]`` is the unit of eps: the
normaliser's std when the agent normalises observations (eps in standard deviations, as Zhang
et al., NeurIPS 2020), ones otherwise, or what ``scale=`` gives (``"raw"`` or an array ``[d]``).
:class:`_Victim` holds the agent's policy, value and greedy actions as callables of ``u``
(cached per agent and scale, so the compiled attack loops keyed on them trace once), and
:func:`_in_scaled_space` maps a batch in and out: ``ŝ = s + δ · scale`` with ``‖δ‖ ≤ eps``.
Public names are re-exported by :mod:`agents.observation_attacks`.

>>> import numpy as np
>>> perturbation_norms(np.zeros([2, 3]), np.array([[0.1, -0.2, 0.0], [0.0, 0.0, 0.3]]),
...                    np.array([1.0, 2.0, 1.0], np.float32)).numpy().round(3)
array([0.1, 0.3], dtype=float32)
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

import attacks
from robustgrad import _checks

if TYPE_CHECKING:
    from agents.base import Agent

__all__ = ["perturbation_norms", "perturbation_scale"]


class _Victim:
    """Callables over *scaled* observations ``u = s / scale`` of one agent (cached per agent,
    so the compiled attack loops keyed on them trace once)."""

    def __init__(self, agent, scale):
        self._agent = weakref.ref(agent)
        self.discrete = bool(agent.discrete)
        self.is_dqn = hasattr(agent, "q_values")
        self.fixed_scale = None if scale is None else tf.constant(scale, tf.float32)
        self.policy = _Bound(self, "policy_outputs")
        self.neg_value = _Bound(self, "negative_value")

    @property
    def agent(self):
        a = self._agent()
        if a is None:  # pragma: no cover
            raise RuntimeError("the agent of this attack was garbage-collected")
        return a

    def scale(self):
        """Per-dimension scale ``[d]``: the given one, else the normaliser's std, else ones."""
        if self.fixed_scale is not None:
            return self.fixed_scale
        rms = self.agent._obs_rms()
        if rms is None:
            return tf.ones(self.agent.obs_shape, tf.float32)
        return tf.cast(tf.sqrt(rms.var + rms.epsilon), tf.float32)

    def outputs(self, obs):
        """Logits (discrete on-policy), Q-values (DQN) or the Gaussian mean, of raw ``obs``."""
        agent = self.agent
        if self.is_dqn:
            return agent.q(obs)
        return agent.model.policy_net(agent.model.obs_norm(obs))

    def policy_outputs(self, u):
        return self.outputs(u * self.scale())

    def negative_value(self, u):
        return -self.agent.model.value(u * self.scale())

    def deterministic_actions(self, obs):
        """What ``agent.act(obs, deterministic=True)`` returns: the greedy action (int32) or
        the Gaussian mean clipped to the action bounds."""
        out = self.outputs(obs)
        if self.discrete:
            return tf.argmax(out, axis=-1, output_type=tf.int32)
        env = self.agent.env
        return tf.clip_by_value(out, env.action_low, env.action_high)

    def inverse_two_variance(self, batch):
        """``1 / (2σ²)`` of the Gaussian policy, broadcast to ``[batch, action_dim]``."""
        log_std = self.agent.model.log_std
        w = 0.5 * tf.exp(-2.0 * tf.cast(log_std, tf.float32))
        return tf.broadcast_to(w[None], [batch, tf.shape(log_std)[0]])


class _Bound:
    """A stable callable ``f(u)`` for the attacks' compiled-loop cache (one per victim)."""

    def __init__(self, victim, method):
        self._victim = victim
        self._method = method

    def __call__(self, u, training=False):
        return getattr(self._victim, self._method)(u)


_VICTIMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _victim(agent, scale) -> _Victim:
    if isinstance(scale, str):
        _checks.choice(scale, "scale", ("raw",))
        scale = np.ones(agent.obs_shape, np.float32)
    key = None
    if scale is not None:
        scale = np.asarray(scale, np.float32)
        if scale.shape != tuple(agent.obs_shape):
            raise ValueError(f"scale must be 'raw', None or positive finite values of shape "
                             f"{tuple(agent.obs_shape)}, got shape {scale.shape}")
        bad = ~np.isfinite(scale) | (scale <= 0)
        if bad.any():
            i = int(np.flatnonzero(bad.reshape(-1))[0])
            raise ValueError(f"scale must hold positive finite values, got {float(scale.reshape(-1)[i])}"
                             f" at index {i}")
        key = scale.tobytes()
    table = _VICTIMS.setdefault(agent, {})
    if key not in table:
        table[key] = _Victim(agent, scale)
    return table[key]


def perturbation_scale(agent: Agent, scale: str | np.ndarray | None = None) -> np.ndarray:
    """The per-dimension unit of eps for ``agent`` (see the module doc), as ``[d]`` float32."""
    return _victim(agent, scale).scale().numpy()


def perturbation_norms(obs: tf.Tensor | np.ndarray, obs_adv: tf.Tensor | np.ndarray,
                       scale: tf.Tensor | np.ndarray, norm: str = "linf") -> tf.Tensor:
    """``‖(obs_adv − obs) / scale‖`` per row: the perturbation in the units of eps. ``[B]``."""
    delta = (tf.cast(obs_adv, tf.float32) - tf.cast(obs, tf.float32)) / scale
    if _checks.norm_name(norm) == "linf":
        return tf.reduce_max(tf.abs(delta), axis=-1)
    return tf.norm(delta, axis=-1)


def _in_scaled_space(victim, obs, eps, norm, run):
    """Map ``obs`` to ``u = obs / scale``, attack ``u`` with ``run(u)``, project the step onto
    the ball and map back: ``ŝ = obs + δ · scale`` with ``‖δ‖ ≤ eps``."""
    obs = tf.convert_to_tensor(obs, tf.float32)
    scale = victim.scale()
    u = obs / scale
    u_adv = run(u)
    delta = attacks.norms.project(tf.cast(u_adv, tf.float32) - u, eps, norm)
    return obs + delta * scale
