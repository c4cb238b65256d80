"""Small networks as plain ``tf.Module``s, and tensorflow-probability policy heads.

Plain ``tf.Variable``s (no Keras layers) keep the compiled rollout cheap, make
``tf.train.Checkpoint`` trivial and avoid a Keras 3 pitfall: its variables are not
``tf.Variable``s, so ``tf.autodiff.ForwardAccumulator`` and ``tape.watch`` need their
underlying ``.value``. Initialisation is orthogonal (Saxe et al. 2014) with the gains
of the PPO implementation details (Huang et al. 2022): ``sqrt(2)`` for hidden layers,
``0.01`` for the policy head, ``1`` for the value head, zero biases.

The seed axis: built with a list of seeds (``seed=[3, 4, 5]``), a network holds ``S`` stacked
copies (every variable ``[S, ...]``, copy ``s`` initialised exactly as the network built with
``seed=seeds[s]`` alone) and maps ``[S, B, ...]`` inputs to ``[S, B, ...]`` outputs with batched
matmuls; built with one int it is the ordinary network (no seed axis). One code path serves both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from agents.envs import RunningMeanStd

tfd = tfp.distributions


def seed_list(seed: int | Sequence[int]) -> list[int] | None:
    """``None`` for one int seed (no seed axis), else the list of seeds (the seed axis).

    >>> seed_list(3), seed_list([3, 4])
    (None, [3, 4])
    """
    if isinstance(seed, (int, np.integer)):
        return None
    return [int(s) for s in seed]


def _shifted(seed, k: int):
    """``seed + k`` for an int, or for every seed of a list."""
    seeds = seed_list(seed)
    return seed + k if seeds is None else [s + k for s in seeds]


def orthogonal(shape: tuple[int, int], gain: float, rng: np.random.Generator) -> np.ndarray:
    """An orthogonal ``(fan_in, fan_out)`` matrix scaled by ``gain`` (QR of a Gaussian).

    >>> w = orthogonal((3, 2), 2.0, np.random.default_rng(0))
    >>> w.dtype, np.allclose(w.T @ w, 4.0 * np.eye(2), atol=1e-5)
    (dtype('float32'), True)
    """
    rows, cols = shape
    a = rng.standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(a)
    q *= np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return (gain * q[:rows, :cols]).astype(np.float32)


_ACTIVATIONS = {"tanh": tf.tanh, "relu": tf.nn.relu}


class MLP(tf.Module):
    """A multi-layer perceptron on flattened inputs; orthogonal init, zero biases.

    ``seed``: an int (inputs ``[B, ...]`` -> ``[B, out_dim]``) or a list of ``S`` seeds (stacked
    weights ``[S, in, out]``; inputs ``[S, B, ...]`` -> ``[S, B, out_dim]``, batched matmuls).

    >>> net = MLP(3, (8,), 2, "tanh", 1.0, seed=[0, 1])
    >>> net(tf.ones([2, 5, 3])).shape.as_list()
    [2, 5, 2]
    >>> alone = MLP(3, (8,), 2, "tanh", 1.0, seed=1)   # copy 1 is the network of seed 1
    >>> bool(np.allclose(net(tf.ones([2, 5, 3]))[1], alone(tf.ones([5, 3]))))
    True
    """

    def __init__(self, in_dim: int, hidden: tuple[int, ...], out_dim: int, activation: str,
                 out_gain: float, seed: int | Sequence[int], name: str | None = None):
        super().__init__(name=name)
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation: expected one of {sorted(_ACTIVATIONS)}, got "
                             f"{activation!r}")
        seeds = seed_list(seed)
        alone: list[int | Sequence[int]] = [seed]
        rngs = [np.random.default_rng(s) for s in (seeds or alone)]
        self.num_seeds = None if seeds is None else len(seeds)
        self.in_dim = in_dim
        self.activation = _ACTIVATIONS[activation]
        sizes = [in_dim, *hidden, out_dim]
        lead = () if seeds is None else (len(seeds),)
        self.weights_ = []
        self.biases = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            gain = out_gain if i == len(sizes) - 2 else np.sqrt(2.0)
            w = np.stack([orthogonal((a, b), gain, rng) for rng in rngs])
            self.weights_.append(tf.Variable(w.reshape(lead + (a, b)), name=f"w{i}"))
            self.biases.append(tf.Variable(tf.zeros(lead + (b,)), name=f"b{i}"))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        if self.num_seeds is None:
            x = tf.reshape(x, (tf.shape(x)[0], -1))
        else:
            x = tf.reshape(x, (self.num_seeds, -1, self.in_dim))
        n = len(self.weights_)
        for i, (w, b) in enumerate(zip(self.weights_, self.biases)):
            x = tf.matmul(x, w) + (b if self.num_seeds is None else b[:, None, :])
            if i < n - 1:
                x = self.activation(x)
        return x


class SeedRunningMeanStd(RunningMeanStd):
    """:class:`agents.envs.RunningMeanStd` of ``S`` seeds at once: ``mean``, ``var`` ``[S, *shape]``
    and ``count`` ``[S]`` float64; seed ``s`` keeps the statistics it would keep alone.

    ``update(x)`` takes ``x [S, B, *shape]``; ``normalize(x)`` too; ``scale(x)`` divides
    ``x [..., S, B]`` by each seed's standard deviation (rewards, time-major).

    >>> rms = SeedRunningMeanStd((), 2)
    >>> rms.update(tf.constant([[1.0, 3.0], [10.0, 30.0]]))
    >>> np.round(rms.mean.numpy(), 2).tolist()   # (the count starts at 1e-4, as alone)
    [2.0, 20.0]
    """

    def __init__(self, shape: tuple[int, ...], num_seeds: int, epsilon: float = 1e-8,
                 clip: float = 10.0, name: str | None = None):
        tf.Module.__init__(self, name=name)
        lead = (int(num_seeds),)
        self.num_seeds = int(num_seeds)
        self.mean = tf.Variable(tf.zeros(lead + tuple(shape), tf.float64), trainable=False,
                                name="mean")
        self.var = tf.Variable(tf.ones(lead + tuple(shape), tf.float64), trainable=False,
                               name="var")
        self.count = tf.Variable(tf.fill(lead, tf.constant(1e-4, tf.float64)), trainable=False,
                                 name="count")
        self.epsilon = epsilon
        self.clip = clip
        self.shape = tuple(shape)

    def _per_seed(self, x):
        return tf.reshape(x, (self.num_seeds,) + (1,) * len(self.shape))

    def update(self, x: tf.Tensor | np.ndarray) -> None:
        """Fold ``x [S, B, *shape]`` into each seed's statistics (non-finite rows skipped)."""
        x = tf.reshape(tf.cast(x, tf.float64), (self.num_seeds, -1) + self.shape)
        rows = tf.reduce_all(tf.reshape(tf.math.is_finite(x), (self.num_seeds, tf.shape(x)[1], -1)),
                             axis=2)
        w = tf.reshape(tf.cast(rows, tf.float64), (self.num_seeds, -1) + (1,) * len(self.shape))
        x = tf.where(w > 0, x, 0.0)
        n = tf.reduce_sum(tf.cast(rows, tf.float64), axis=1)  # [S]
        n_b = self._per_seed(n)
        batch_mean = tf.math.divide_no_nan(tf.reduce_sum(w * x, 1), n_b)
        batch_var = tf.math.divide_no_nan(
            tf.reduce_sum(w * tf.square(x - batch_mean[:, None]), 1), n_b)
        delta = batch_mean - self.mean
        tot = self.count + n
        tot_b, count_b = self._per_seed(tot), self._per_seed(self.count)
        self.mean.assign(self.mean + delta * n_b / tot_b)
        m2 = self.var * count_b + batch_var * n_b + tf.square(delta) * count_b * n_b / tot_b
        self.var.assign(m2 / tot_b)
        self.count.assign(tot)

    def normalize(self, x: tf.Tensor) -> tf.Tensor:
        """``x [S, B, *shape]`` normalised by each seed's statistics, clipped to ``±clip``."""
        mean = tf.cast(self.mean, x.dtype)[:, None]
        std = tf.cast(tf.sqrt(self.var + self.epsilon), x.dtype)[:, None]
        return tf.clip_by_value((x - mean) / std, -self.clip, self.clip)

    def scale(self, x: tf.Tensor) -> tf.Tensor:
        """``x [..., S, B]`` divided by each seed's standard deviation (``shape == ()``)."""
        return x / tf.cast(tf.sqrt(self.var + self.epsilon), x.dtype)[:, None]


class ObsNormalizer(tf.Module):
    """Optional observation normalisation inside the model, differentiable w.r.t. raw obs
    (per seed with ``num_seeds``: observations ``[S, B, ...]``)."""

    def __init__(self, obs_shape: tuple[int, ...], enabled: bool, clip: float = 10.0,
                 num_seeds: int | None = None):
        super().__init__(name="obs_norm")
        self.enabled = enabled
        self.rms = (RunningMeanStd(obs_shape, clip=clip, name="obs_rms") if num_seeds is None
                    else SeedRunningMeanStd(obs_shape, num_seeds, clip=clip, name="obs_rms"))

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        obs = tf.convert_to_tensor(obs, tf.float32)
        return self.rms.normalize(obs) if self.enabled else obs

    def update(self, obs: tf.Tensor | np.ndarray) -> None:
        """Fold a batch of raw observations into the statistics (nothing when disabled)."""
        if self.enabled:
            self.rms.update(obs)


class ActorCritic(tf.Module):
    """Separate policy and value networks over a shared observation normaliser.

    Discrete actions: ``Categorical(logits)``. Continuous actions: a diagonal Normal
    (``Independent(Normal(mean, exp(log_std)), 1)``) whose ``log_std`` is a
    state-independent variable. ``seed``: an int, or a list of ``S`` seeds for ``S`` stacked
    actor-critics (observations ``[S, B, ...]``, distributions of batch shape ``[S, B]``).

    >>> ac = ActorCritic((4,), 2, True, seed=[0, 1])
    >>> ac.distribution(tf.zeros([2, 3, 4])).batch_shape.as_list(), ac.value(tf.zeros([2, 3, 4])).shape
    ([2, 3], TensorShape([2, 3]))
    """

    def __init__(self, obs_shape: tuple[int, ...], n_actions_or_dim: int, discrete: bool,
                 hidden: tuple[int, ...] = (64, 64), activation: str = "tanh",
                 normalize_obs: bool = False, log_std_init: float = 0.0,
                 seed: int | Sequence[int] = 0):
        super().__init__(name="actor_critic")
        in_dim = int(np.prod(obs_shape))
        seeds = seed_list(seed)
        self.num_seeds = None if seeds is None else len(seeds)
        self.discrete = discrete
        self.obs_norm = ObsNormalizer(tuple(obs_shape), normalize_obs, num_seeds=self.num_seeds)
        self.policy_net = MLP(in_dim, tuple(hidden), n_actions_or_dim, activation, 0.01,
                              seed, name="policy")
        self.value_net = MLP(in_dim, tuple(hidden), 1, activation, 1.0, _shifted(seed, 1),
                             name="value")
        if not discrete:
            lead = () if seeds is None else (len(seeds),)
            self.log_std = tf.Variable(tf.fill(lead + (n_actions_or_dim,), float(log_std_init)),
                                       name="log_std")

    def distribution(self, obs: tf.Tensor) -> tfp.distributions.Distribution:
        """The policy at raw observations ``obs [B, *obs_shape]``: a ``Categorical`` over the
        actions, or a diagonal ``Normal`` (event shape ``[action_dim]``)."""
        x = self.obs_norm(obs)
        out = self.policy_net(x)
        if self.discrete:
            return tfd.Categorical(logits=out)
        log_std = self.log_std if self.num_seeds is None else self.log_std[:, None, :]
        std = tf.exp(log_std) * tf.ones_like(out)
        return tfd.Independent(tfd.Normal(out, std), reinterpreted_batch_ndims=1)

    def value(self, obs: tf.Tensor) -> tf.Tensor:
        """The state values ``V(obs)``, ``[B] float32`` (``[S, B]`` with the seed axis)."""
        return tf.squeeze(self.value_net(self.obs_norm(obs)), -1)

    def mode(self, obs: tf.Tensor) -> tf.Tensor:
        """The most likely action at each observation (the deterministic policy)."""
        d = self.distribution(obs)
        return d.mode()

    @property
    def trainable(self) -> list[tf.Variable]:
        """The variables the optimiser updates: both networks and, continuous, ``log_std``."""
        v = list(self.policy_net.trainable_variables) + list(self.value_net.trainable_variables)
        if not self.discrete:
            v.append(self.log_std)
        return v


class QNetwork(tf.Module):
    """Action values ``Q(s, .)`` for discrete actions. ``seed``: an int (``[B, ...]`` ->
    ``[B, n_actions]``) or a list of ``S`` seeds (``S`` stacked networks with per-seed observation
    statistics: ``[S, B, ...]`` -> ``[S, B, n_actions]``).

    >>> q = QNetwork((4,), 2, (8,), seed=[0, 1])
    >>> q(tf.zeros([2, 3, 4])).shape.as_list()
    [2, 3, 2]
    """

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int,
                 hidden: tuple[int, ...] = (120, 84), activation: str = "relu",
                 normalize_obs: bool = False, seed: int | Sequence[int] = 0, name: str = "q"):
        super().__init__(name=name)
        in_dim = int(np.prod(obs_shape))
        seeds = seed_list(seed)
        self.num_seeds = None if seeds is None else len(seeds)
        self.obs_norm = ObsNormalizer(tuple(obs_shape), normalize_obs, num_seeds=self.num_seeds)
        self.net = MLP(in_dim, tuple(hidden), n_actions, activation, 1.0, seed, name="mlp")

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        return self.net(self.obs_norm(obs))

    @property
    def trainable(self) -> list[tf.Variable]:
        """The variables the optimiser updates (the observation statistics are not)."""
        return list(self.net.trainable_variables)
