"""The victim of an observation attack: one :class:`Victim` over the agent's declared surface.

The victim is the agent's declared :class:`agents.PolicySurface` (``agent.policy_surface()``,
read once per agent); nothing else of the agent is read. Every user in the robustness wing (the
observation attacks, the SA regularisers, certification, the learned adversaries' MDP, ATLA)
sees it through :class:`Victim`, the one adapter. An observation attack perturbs
``u = s / scale``, where ``scale [d]`` is the unit of eps: the normaliser's std when the agent
normalises observations (eps in standard deviations, as Zhang et al., NeurIPS 2020), ones
otherwise, or what ``scale=`` gives (``"raw"`` or an array ``[d]``).
:class:`Victim` holds the surface's policy, value and greedy actions as callables of ``u``
(cached per agent and scale, so the compiled attack loops keyed on them trace once), and
:func:`_in_scaled_space` maps a batch in and out: ``ŝ = s + δ · scale`` with ``‖δ‖ ≤ eps``.
Public names are re-exported by :mod:`agents.robustness.observation_attacks`.

The seed axis (an agent of ``num_seeds=S > 1`` in robust training, DESIGN.md sections 7-8): its
surface declares ``num_seeds`` and observations come as ``[S, B, d]``. One engine call attacks
every seed: :func:`_in_scaled_space` scales each seed's rows by that seed's own unit (its
normaliser's std) and flattens them to ``S * B`` examples, and the victim's callables reshape the
examples back to ``[S, B, d]`` so that seed ``s``'s rows go through seed ``s``'s network (the
stacked weights, batched matmuls). Such an attack runs in graph mode (inside the compiled update;
an eager call is traced on the spot): the engine's eager probe and chunks would split the seeds.

>>> import numpy as np
>>> perturbation_norms(np.zeros([2, 3]), np.array([[0.1, -0.2, 0.0], [0.0, 0.0, 0.3]]),
...                    np.array([1.0, 2.0, 1.0], np.float32)).numpy().round(3)
array([0.1, 0.3], dtype=float32)
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import tensorflow as tf

import attacks
from agents.core.base import Agent
from agents.core.policy import PolicySurface, surface_of
from robustgrad import checks as _checks

__all__ = ["Victim", "perturbation_norms", "perturbation_scale"]


class Victim:
    """An agent's declared :class:`agents.PolicySurface` as the robustness wing attacks it: the
    one victim of the observation attacks, the SA regularisers, the learned adversaries and ATLA.

    ``surface``: the agent's surface (``agent.policy_surface()``, or ``seed_axis_surface()`` with
    a seed axis of ``S`` seeds: examples are then ``S`` seed-major blocks of rows). ``scale``: the
    unit of eps ``[d]`` when given (``"raw"`` units: ones), else the surface's (the normaliser's
    std, or ones). Two faces, one victim:

    * in the attack's coordinates ``u = s / scale`` (inside compiled code): :meth:`policy_outputs`,
      :meth:`negative_value` and their stable callables ``policy`` and ``neg_value`` (the attack
      engine's compiled loops are keyed on them: a victim is cached per agent and scale, so they
      trace once), :meth:`scale`, :meth:`row_scale`, :meth:`deterministic_actions`;
    * to an environment stepping it (a learned adversary's MDP, NumPy): :meth:`act` (the
      deterministic actions of ``[rows, d]``, one call of a concrete graph function; with a seed
      axis ``rows = S * envs_per_seed``, block ``s`` answered by seed ``s``) and :attr:`units`
      (the unit of eps per row, read once and cached: :meth:`refresh` re-reads it after the victim
      trained, as ATLA's phase does), ``env_id``, ``algo``, :attr:`clip`.
    """

    def __init__(self, surface: PolicySurface, scale: np.ndarray | None = None, *,
                 env_id: Any = None, algo: str | None = None, envs_per_seed: int = 1):
        self.surface = surface
        self.discrete = surface.discrete
        self.is_dqn = surface.kind == "q_values"
        self.fixed_scale = None if scale is None else tf.constant(scale, tf.float32)
        self.num_seeds = surface.num_seeds  # None, or S: examples are S blocks of rows
        self.obs_shape = surface.obs_shape
        self.env_id, self.algo = env_id, algo
        self.envs_per_seed = int(envs_per_seed)
        self.policy = _Bound(self, "policy_outputs")
        self.neg_value = _Bound(self, "negative_value")
        self._act: Any = None  # the concrete function of act(), built on first use
        self._units: np.ndarray | None = None

    # -- in the attack's coordinates (tensors) -----------------------------------------------
    def scale(self) -> tf.Tensor:
        """Per-dimension scale ``[d]``: the given one, else the surface's (the normaliser's std,
        or ones; ``[S, d]`` with a seed axis)."""
        if self.fixed_scale is not None:
            return self.fixed_scale
        return self.surface.obs_scale()

    def outputs(self, obs: tf.Tensor) -> tf.Tensor:
        """Logits (discrete on-policy), Q-values (DQN) or the Gaussian mean, of raw ``obs``."""
        return self.surface.outputs(obs)

    def row_scale(self) -> tf.Tensor:
        """The scale broadcasting over a batch: ``[d]``, or ``[S, 1, d]`` (each seed's rows)."""
        scale = self.scale()
        if self.num_seeds is None:
            return scale
        return tf.broadcast_to(scale, [self.num_seeds] + list(self.obs_shape))[:, None]

    def _seeds_of(self, u: tf.Tensor) -> tf.Tensor:
        """Flat examples ``u [S * B, d]`` -> ``[S, B, d]`` raw observations (seed-major)."""
        return tf.reshape(u, [self.num_seeds, -1, *self.obs_shape]) * self.row_scale()

    def policy_outputs(self, u: tf.Tensor) -> tf.Tensor:
        """The policy's outputs ``[B, k]`` at ``u`` (flat seed-major examples with a seed axis)."""
        if self.num_seeds is None:
            return self.outputs(u * self.scale())
        out = self.outputs(self._seeds_of(u))
        return tf.reshape(out, [-1, out.shape[-1]])

    def negative_value(self, u: tf.Tensor) -> tf.Tensor:
        """``-V`` ``[B]`` of the critic at ``u`` (the ``critic`` attack's loss)."""
        value = self.surface.value
        assert value is not None  # the critic attack checks for a critic before it runs
        if self.num_seeds is None:
            return -value(u * self.scale())
        return -tf.reshape(value(self._seeds_of(u)), [-1])

    def deterministic_actions(self, obs: tf.Tensor) -> tf.Tensor:
        """What ``agent.act(obs, deterministic=True)`` returns: the greedy action (int32) or
        the Gaussian mean clipped to the action bounds."""
        return self.surface.deterministic_actions(obs)

    def inverse_two_variance(self, batch: int | tf.Tensor) -> tf.Tensor:
        """``1 / (2σ²)`` of the Gaussian policy, broadcast to ``[batch, action_dim]`` (with a seed
        axis ``batch = S * B`` flat examples, each seed's σ over its block)."""
        if self.num_seeds is None:
            return self.surface.inverse_two_variance(batch)
        w = self.surface.inverse_two_variance(batch // self.num_seeds)
        return tf.reshape(w, [-1, w.shape[-1]])

    # -- to an environment stepping it (NumPy) -------------------------------------------------
    @property
    def clip(self) -> float | None:
        """The observation normaliser's clip in std, or ``None`` without a normaliser."""
        stats = self.surface.obs_statistics()
        return None if stats is None else float(stats[2])

    def refresh(self) -> None:
        """Re-read the unit of eps (after the victim's normaliser moved)."""
        scale = self.scale().numpy()
        if self.num_seeds is not None:
            scale = np.repeat(scale.reshape((self.num_seeds, -1)), self.envs_per_seed, axis=0)
        self._units = scale

    @property
    def units(self) -> np.ndarray:
        """The unit of eps ``[d]`` float32 (``[S * envs_per_seed, d]`` with a seed axis: each row
        its seed's), as last read (:meth:`refresh`)."""
        if self._units is None:
            self.refresh()
        return self._units  # type: ignore[return-value]

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions for raw observations ``[rows, d]`` (with a seed axis the rows are
        ``S`` seed-major blocks, each answered by its own seed; one call)."""
        if self._act is None:  # a concrete function skips tf.function's signature matching
            lead = (None,) if self.num_seeds is None else (self.num_seeds, None)
            self._act = tf.function(self.surface.deterministic_actions).get_concrete_function(
                tf.TensorSpec(lead + self.obs_shape, tf.float32))
        obs = np.asarray(obs, np.float32)
        if self.num_seeds is None:
            return self._act(obs).numpy()
        out = self._act(obs.reshape((self.num_seeds, -1) + self.obs_shape)).numpy()
        return out.reshape((obs.shape[0],) + out.shape[2:])

    def __repr__(self):
        return f"Victim({self.surface!r}, env={self.env_id!r})"


class _Bound:
    """A stable callable ``f(u)`` for the attacks' compiled-loop cache (one per victim)."""

    def __init__(self, victim, method):
        self._victim = victim
        self._method = method

    def __call__(self, u, training=False):
        return getattr(self._victim, self._method)(u)


_VICTIMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SURFACES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _surface(agent):
    """``agent.policy_surface()``, read once per agent (a clear error without one); an agent
    with a seed axis gives its ``seed_axis_surface()`` (robust training on the axis)."""
    surface = _SURFACES.get(agent)
    if surface is None:
        if getattr(agent, "num_seeds", 1) > 1:
            surface = agent.seed_axis_surface()
        else:
            surface = surface_of(agent)
        _SURFACES[agent] = surface
    return surface


def _victim(agent, scale) -> Victim:
    surface = _surface(agent)
    if isinstance(scale, str):
        _checks.choice(scale, "scale", ("raw",))
        scale = np.ones(surface.obs_shape, np.float32)
    key = None
    if scale is not None:
        scale = np.asarray(scale, np.float32)
        if scale.shape != surface.obs_shape:
            raise ValueError(f"scale must be 'raw', None or positive finite values of shape "
                             f"{surface.obs_shape}, got shape {scale.shape}")
        bad = ~np.isfinite(scale) | (scale <= 0)
        if bad.any():
            i = int(np.flatnonzero(bad.reshape(-1))[0])
            raise ValueError(f"scale must hold positive finite values, got {float(scale.reshape(-1)[i])}"
                             f" at index {i}")
        key = scale.tobytes()
    table = _VICTIMS.setdefault(agent, {})
    if key not in table:
        table[key] = Victim(surface, scale)
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
    the ball and map back: ``ŝ = obs + δ · scale`` with ``‖δ‖ ≤ eps``. A seed-axis victim
    (module doc): ``obs [S, B, d]``, flattened to ``S * B`` examples for ``run``."""
    obs = tf.convert_to_tensor(obs, tf.float32)
    if victim.num_seeds is not None:
        return _seed_axis_scaled_space(victim, obs, eps, norm, run)
    scale = victim.scale()
    u = obs / scale
    u_adv = run(u)
    delta = attacks.norms.project(tf.cast(u_adv, tf.float32) - u, eps, norm)
    return obs + delta * scale


def _seed_axis_scaled_space(victim, obs, eps, norm, run):
    """:func:`_in_scaled_space` for ``obs [S, B, d]``: one ``run`` on the ``S * B`` flat
    examples, each seed's rows in its own units."""
    lead = [victim.num_seeds]
    shape = list(victim.surface.obs_shape)
    if obs.shape.rank != 2 + len(shape) or obs.shape[0] != lead[0] or \
            obs.shape.as_list()[2:] != shape:
        raise ValueError(f"obs: an agent with a seed axis of {lead[0]} seeds is attacked on "
                         f"observations [{lead[0]}, B, {', '.join(map(str, shape))}] (each "
                         f"seed's rows), got shape {obs.shape.as_list()}")
    scale = victim.row_scale()
    u = tf.reshape(obs / scale, [-1, *shape])
    if tf.executing_eagerly():  # graph mode: no eager probe or chunks that split the seeds
        u_adv = tf.function(run, autograph=False)(u)
    else:
        u_adv = run(u)
    delta = attacks.norms.project(tf.cast(u_adv, tf.float32) - u, eps, norm)
    return obs + tf.reshape(delta, tf.shape(obs)) * scale
