"""The policy surface: what an agent declares of its policy to attacks and certification.

Observation attacks, the SA regularisers and certified actions need the same few things of a
victim: its policy outputs as a function of the observation, the units the policy sees (the
observation normaliser), a critic where there is one, the action bounds, discrete or not. Every
algorithm declares them in ``agent.policy_surface()``, a :class:`PolicySurface`; the attacks
use nothing else of the agent (DESIGN.md §8). A third-party agent is attacked the same way once
it returns one.

The outputs are a plain network of the *normalised* observation, ``x = normalize(s)``:

* ``kind="logits"``: a ``Categorical(logits)`` policy (PPO, A2C, REINFORCE on discrete actions);
* ``kind="gaussian_mean"``: the mean of ``Normal(mean, exp(log_std))`` (continuous actions);
* ``kind="q_values"``: ``Q(s, ·)`` of a DQN (its greedy policy; the attacks read ``softmax(Q)``).

``normalize`` is the agent's observation normaliser, ``x = clip((s − mean) / std, ±clip)``, or
the identity; :meth:`PolicySurface.obs_scale` is the unit of eps (the normaliser's ``std`` when
there is one: eps in standard deviations, as Zhang et al. 2020; ones otherwise), and
:meth:`PolicySurface.input_box` maps a box of raw observations to the box the network sees
(exact: the normaliser is monotone in each coordinate).

>>> import numpy as np, tensorflow as tf
>>> net = lambda x: tf.matmul(x, tf.constant([[1.0, -1.0], [0.0, 2.0]]))
>>> surface = PolicySurface("logits", net, obs_shape=(2,))
>>> surface.discrete, surface.normalized, surface.obs_scale().numpy().tolist()
(True, False, [1.0, 1.0])
>>> surface.outputs(np.array([[1.0, 0.5]], np.float32)).numpy().tolist()
[[1.0, 0.0]]
>>> surface.deterministic_actions(np.array([[1.0, 0.5]], np.float32)).numpy().tolist()
[0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

tfd = tfp.distributions

__all__ = ["KINDS", "PolicySurface", "actor_critic_surface", "surface_of"]

KINDS = ("logits", "gaussian_mean", "q_values")
"""What :attr:`PolicySurface.network` outputs."""

ACTIVATIONS = ("tanh", "relu")


class PolicySurface:
    """An agent's policy as attacks and certification see it (module doc).

    Args:
      kind: one of :data:`KINDS`.
      network: ``x [B, d] float32 -> outputs [B, k]`` on *normalised* observations.
      obs_shape: the shape of one raw observation.
      normalizer: an :class:`agents.envs.RunningMeanStd` (``mean``, ``var``, ``epsilon``,
        ``clip``) when the agent normalises observations, else ``None``.
      value: ``V(s) [B]`` of raw observations (the critic of an actor-critic), or ``None`` when
        the agent has no trained critic. A DQN's critic is its Q-values (``kind``).
      log_std: the state-independent ``log σ [k]`` of a Gaussian policy (``kind="gaussian_mean"``).
      action_low, action_high: ``[k]`` float32 bounds of continuous actions (``None`` for
        discrete ones, or when unbounded).
      layers: the network as ``((W [in, out], b [out]), ...)`` (``tf.Variable``s, read live),
        with ``activation`` (``"tanh"``/``"relu"``) between them and none after the last: what
        bound propagation (:mod:`agents.robustness.certify`) takes. ``None``: the network is opaque (attacks
        work, certification does not).
      num_seeds: ``S`` for the surface of an agent with a seed axis (``num_seeds=S > 1``, used by
        robust training on the seed axis, :mod:`agents.robustness.robust`): every observation batch is then
        ``[S, B, d]`` and every output ``[S, B, k]`` (seed ``s``'s rows through seed ``s``'s
        network and normaliser, a :class:`agents.core.networks.SeedRunningMeanStd`), ``log_std`` is
        ``[S, k]`` and :meth:`obs_scale` ``[S, d]``. ``layers`` is then ``None`` (certification
        takes one network) and ``seed_layers`` holds the stacked ``((W [S, in, out], b [S, out]),
        ...)`` that the convex regulariser bounds per seed. ``None``: no seed axis.
    """

    def __init__(self, kind: str, network: Callable[[tf.Tensor], tf.Tensor], *,
                 obs_shape: Sequence[int], normalizer: Any = None,
                 value: Callable[[tf.Tensor], tf.Tensor] | None = None,
                 log_std: tf.Variable | None = None, action_low: np.ndarray | None = None,
                 action_high: np.ndarray | None = None,
                 layers: Sequence[tuple[tf.Variable, tf.Variable]] | None = None,
                 activation: str | None = None, num_seeds: int | None = None,
                 seed_layers: Sequence[tuple[tf.Variable, tf.Variable]] | None = None):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if not callable(network):
            raise TypeError(f"network must be a callable of the normalised observations, got "
                            f"{type(network).__name__}")
        if (kind == "gaussian_mean") != (log_std is not None):
            raise ValueError("log_std must be given for kind='gaussian_mean' and only for it")
        if num_seeds is not None and (isinstance(num_seeds, bool) or not isinstance(
                num_seeds, (int, np.integer)) or num_seeds < 2):
            raise ValueError(f"num_seeds must be None or an int >= 2 (a seed axis), got "
                             f"{num_seeds!r}")
        if num_seeds is not None and layers is not None:
            raise ValueError("layers: a surface with a seed axis declares its stacked layers in "
                             "seed_layers, not layers")
        if (layers is not None or seed_layers is not None) and activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)} when layers "
                             f"are given, got {activation!r}")
        self.kind = kind
        self.network = network
        self.obs_shape = tuple(int(n) for n in obs_shape)
        self._rms = normalizer
        self.value = value
        self.log_std = log_std
        self.action_low = None if action_low is None else np.asarray(action_low, np.float32)
        self.action_high = None if action_high is None else np.asarray(action_high, np.float32)
        self.layers = None if layers is None else tuple((w, b) for w, b in layers)
        self.activation = activation
        self.num_seeds = None if num_seeds is None else int(num_seeds)
        self.seed_layers = None if seed_layers is None else tuple((w, b) for w, b in seed_layers)

    # -- what the policy sees ---------------------------------------------------------------
    @property
    def discrete(self) -> bool:
        """Discrete actions (``logits`` or ``q_values``)."""
        return self.kind != "gaussian_mean"

    @property
    def normalized(self) -> bool:
        """The agent normalises observations (eps is then in standard deviations)."""
        return self._rms is not None

    @property
    def has_critic(self) -> bool:
        """A trained critic exists: ``value`` (actor-critics) or the Q-values (DQN)."""
        return self.value is not None or self.kind == "q_values"

    def normalize(self, obs: tf.Tensor | np.ndarray) -> tf.Tensor:
        """The network's input ``x`` for raw observations ``obs [B, d]`` (float32)."""
        obs = tf.convert_to_tensor(obs, tf.float32)
        return self._rms.normalize(obs) if self._rms is not None else obs

    def obs_statistics(self) -> tuple[tf.Tensor, tf.Tensor, float] | None:
        """``(mean [d], std [d], clip)`` float32 of the normaliser, or ``None`` without one."""
        if self._rms is None:
            return None
        mean = tf.cast(self._rms.mean, tf.float32)
        return mean, self.obs_scale(), float(self._rms.clip)

    def obs_scale(self) -> tf.Tensor:
        """The unit of eps per dimension ``[d]`` float32: the normaliser's std, else ones."""
        if self._rms is None:
            return tf.ones(self._lead() + self.obs_shape, tf.float32)
        return tf.cast(tf.sqrt(self._rms.var + self._rms.epsilon), tf.float32)

    def _lead(self) -> tuple[int, ...]:
        """``(S,)`` with a seed axis, else ``()``."""
        return () if self.num_seeds is None else (self.num_seeds,)

    def per_row(self, x: tf.Tensor) -> tf.Tensor:
        """A per-seed ``x [S, k]`` as ``[S, 1, k]`` (broadcasting over each seed's rows); ``x``
        itself without a seed axis."""
        return x if self.num_seeds is None else x[:, None, :]

    def input_box(self, lower: tf.Tensor, upper: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The box ``[normalize(lower), normalize(upper)]`` the network sees when the raw
        observation lies in ``[lower, upper]`` (exact: the normaliser is increasing in each
        coordinate)."""
        return self.normalize(lower), self.normalize(upper)

    # -- the policy ---------------------------------------------------------------------------
    def outputs(self, obs: tf.Tensor | np.ndarray) -> tf.Tensor:
        """Logits, Gaussian means or Q-values ``[B, k]`` at raw ``obs`` (differentiable)."""
        return self.network(self.normalize(obs))

    def std(self) -> tf.Tensor:
        """``σ = exp(log_std)`` ``[k]`` of a Gaussian policy."""
        if self.log_std is None:
            raise ValueError(f"std: a {self.kind!r} policy has no Gaussian std")
        return tf.exp(tf.cast(self.log_std, tf.float32))

    def distribution(self, obs: tf.Tensor | np.ndarray) -> tfp.distributions.Distribution:
        """``π(·|obs)``: ``Categorical(logits)`` (DQN: ``Categorical(Q)``, i.e. ``softmax(Q)``)
        or ``Independent(Normal(mean, σ), 1)``; differentiable w.r.t. ``obs`` and the weights."""
        out = self.outputs(obs)
        if self.discrete:
            return tfd.Categorical(logits=out)
        std = tf.exp(self.per_row(self.log_std)) * tf.ones_like(out)
        return tfd.Independent(tfd.Normal(out, std), reinterpreted_batch_ndims=1)

    def deterministic_actions(self, obs: tf.Tensor | np.ndarray) -> tf.Tensor:
        """The greedy action ``[B]`` int32, or the Gaussian mean clipped to the action bounds
        ``[B, k]`` (what ``agent.act(obs, deterministic=True)`` returns)."""
        out = self.outputs(obs)
        if self.discrete:
            return tf.argmax(out, axis=-1, output_type=tf.int32)
        if self.action_low is None:
            return out
        return tf.clip_by_value(out, self.action_low, self.action_high)

    def inverse_two_variance(self, batch: int | tf.Tensor) -> tf.Tensor:
        """``1 / (2σ²)`` of the Gaussian policy broadcast to ``[batch, k]`` (the weights that
        make ``Σ w (μ − μ')²`` the KL between two Gaussians of the same σ); with a seed axis
        ``[S, batch, k]``, each seed's own σ over its ``batch`` rows."""
        w = 0.5 * tf.exp(-2.0 * tf.cast(self.log_std, tf.float32))
        k = tf.shape(self.log_std)[-1]
        if self.num_seeds is not None:
            return tf.broadcast_to(w[:, None, :], [self.num_seeds, batch, k])
        return tf.broadcast_to(w[None], [batch, k])

    def __repr__(self):
        seeds = "" if self.num_seeds is None else f", num_seeds={self.num_seeds}"
        return (f"PolicySurface(kind={self.kind!r}, obs_shape={self.obs_shape}, "
                f"normalized={self.normalized}, critic={self.has_critic}{seeds})")


def surface_of(agent: Any, argument: str = "agent") -> PolicySurface:
    """``agent.policy_surface()``, or a ``TypeError`` naming what is missing.

    >>> surface_of(object())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: agent: object has no policy_surface() method; attacks and certification need ...
    """
    method = getattr(agent, "policy_surface", None)
    if not callable(method):
        raise TypeError(
            f"{argument}: {type(agent).__name__} has no policy_surface() method; attacks and "
            "certification need one returning an agents.PolicySurface (the policy's outputs of "
            "the normalised observation, the normaliser, the critic, the action bounds)")
    try:
        surface = method()
    except NotImplementedError as e:
        raise TypeError(f"{argument}: {e}; attacks and certification need an "
                        "agents.PolicySurface") from None
    if not isinstance(surface, PolicySurface):
        raise TypeError(f"{argument}: {type(agent).__name__}.policy_surface() must return an "
                        f"agents.PolicySurface, got {type(surface).__name__}")
    return surface


def actor_critic_surface(model: Any, obs_shape: tuple[int, ...], discrete: bool, action_space: Any,
                         normalizer: Any, activation: str, critic: bool,
                         num_seeds: int | None = None) -> PolicySurface:
    """The surface of an actor-critic (:class:`agents.algorithms.onpolicy.ActorCritic`: ``policy_net``,
    ``value``, ``log_std``) with observations of ``obs_shape``: ``"logits"`` if ``discrete``,
    else ``"gaussian_mean"`` bounded by ``action_space.low``/``high``; ``normalizer`` the
    observation statistics (or ``None``); the critic ``model.value`` when ``critic`` (``False``:
    never trained). One seed: the plain layer stack (what bounded attacks read), unless the
    weights carry a seed axis (``[S, in, out]``); ``num_seeds = S``: all ``S`` seeds, observations
    ``[S, B, d]``, each seed's through its own network and normaliser."""
    net = model.policy_net
    stack = list(zip(net.weights_, net.biases))
    extra: dict[str, Any] = (
        {"layers": stack if net.weights_[0].shape.rank == 2 else None} if num_seeds is None
        else {"num_seeds": num_seeds, "seed_layers": stack})
    return PolicySurface(
        "logits" if discrete else "gaussian_mean", net, obs_shape=obs_shape,
        normalizer=normalizer, value=model.value if critic else None,
        log_std=None if discrete else model.log_std,
        action_low=None if discrete else action_space.low,
        action_high=None if discrete else action_space.high, activation=activation, **extra)
