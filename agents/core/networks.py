"""Layers as plain ``tf.Module``s: a multi-layer perceptron with orthogonal initialisation, and
the observation normalisers the models put in front of it.

This is the place of ``torch.nn.Linear`` + CleanRL's ``layer_init`` and of ``flax.linen.Dense``
with its orthogonal initialisers in PureJaxRL: the models are built from it beside the
algorithms that train them (:class:`agents.algorithms.onpolicy.ActorCritic` for REINFORCE, A2C
and PPO; :class:`agents.algorithms.dqn.QNetwork` for DQN), as CleanRL's ``Agent`` and
PureJaxRL's ``ActorCritic`` are written in their ``ppo.py``.

Plain ``tf.Variable``s (no Keras layers) keep the compiled rollout cheap, make
``tf.train.Checkpoint`` trivial and avoid a Keras 3 pitfall: its variables are not
``tf.Variable``s, so ``tf.autodiff.ForwardAccumulator`` and ``tape.watch`` need their
underlying ``.value``. Initialisation is orthogonal (Saxe et al. 2014) with the gains
of the PPO implementation details (Huang et al. 2022): ``sqrt(2)`` for hidden layers and the
output gain the model asks for (``0.01`` for a policy head, ``1`` for a value head), zero biases.

The seed axis: built with a list of seeds (``seed=[3, 4, 5]``), a layer holds ``S`` stacked
copies (every variable ``[S, ...]``, copy ``s`` initialised exactly as the layer built with
``seed=seeds[s]`` alone) and maps ``[S, B, ...]`` inputs to ``[S, B, ...]`` outputs with batched
matmuls (a batch of small products may round a last bit otherwise than each seed's matmul
alone: docs/guides/rl-agents.md says where and how much); built with one int it is the ordinary
layer (no seed axis). One code path serves both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from agents.envs import RunningMeanStd


def seed_list(seed: int | Sequence[int]) -> list[int] | None:
    """``None`` for one int seed (no seed axis), else the list of seeds (the seed axis).

    >>> seed_list(3), seed_list([3, 4])
    (None, [3, 4])
    """
    if isinstance(seed, (int, np.integer)):
        return None
    return [int(s) for s in seed]


def layer_seed(seeds: Sequence[int]) -> int | list[int]:
    """The ``seed`` of the layers of an agent of ``seeds``: the list (stacked ``[S, ...]``
    variables), or for one seed (the seed axis of one) that seed: plain variables, the shapes an
    ordinary agent checkpoints; its model takes the axis of one through them (e.g.
    :meth:`agents.algorithms.onpolicy.ActorCritic.policy_out`).

    >>> layer_seed([3]), layer_seed([3, 4])
    (3, [3, 4])
    """
    return int(seeds[0]) if len(seeds) == 1 else [int(s) for s in seeds]


def running_mean_std(shape: tuple[int, ...], num_seeds: int, clip: float = 10.0,
                     name: str | None = None) -> RunningMeanStd:
    """Statistics of ``num_seeds`` seeds: :class:`SeedRunningMeanStd`, or for one seed the plain
    :class:`agents.envs.RunningMeanStd` (its variables as an ordinary agent saves them; it folds
    and scales ``[1, B, ...]`` as ``[B, ...]``, the same ops)."""
    if num_seeds > 1:
        return SeedRunningMeanStd(shape, num_seeds, clip=clip, name=name)
    return RunningMeanStd(shape, clip=clip, name=name)


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


class ReturnNormalizer(tf.Module):
    """Rewards divided by the running standard deviation of the discounted return (gymnasium's
    ``NormalizeReward``, PureJaxRL's ``NormalizeVecReward``) of ``num_envs`` environments of each
    of ``num_seeds`` seeds. ``rms``: the return's statistics (:func:`running_mean_std`);
    ``returns`` and ``last_end``: each environment's running return and whether its last step
    ended an episode, ``[S, N]`` (one seed: ``[N]``, an ordinary agent's checkpoint).

    >>> norm = ReturnNormalizer(0.5, num_seeds=1, num_envs=2)
    >>> scaled = norm(tf.ones([3, 1, 2]), tf.zeros([3, 1, 2], tf.bool))   # [T, S, N]
    >>> norm.returns.numpy().tolist()                                     # 1, 1.5, 1.75
    [1.75, 1.75]
    """

    def __init__(self, gamma: float, num_seeds: int, num_envs: int):
        super().__init__(name="return_normalizer")
        self.gamma = float(gamma)
        self.rms = running_mean_std((), num_seeds, name="reward_rms")
        envs = ((num_seeds,) if num_seeds > 1 else ()) + (num_envs,)
        self.returns = tf.Variable(tf.zeros(envs), trainable=False, name="return_acc")
        self.last_end = tf.Variable(tf.zeros(envs, tf.bool), trainable=False, name="last_end")

    def reset(self) -> None:
        """Start every environment's return afresh (after the environments reset)."""
        self.returns.assign(tf.zeros_like(self.returns))
        self.last_end.assign(tf.zeros_like(self.last_end))

    def __call__(self, rewards: tf.Tensor, ends: tf.Tensor) -> tf.Tensor:
        """``rewards [T, S, N]`` float32 scaled, after folding the discounted returns of this
        rollout (episode ``ends [T, S, N]`` bool) into each seed's statistics."""
        gamma = self.gamma

        def body(carry, inp):
            ret, prev_end = carry
            r, end = inp
            ret = r + gamma * ret * (1.0 - tf.cast(prev_end, tf.float32))
            return ret, end

        acc, last = self.returns, self.last_end
        rets, ends_seq = tf.scan(body, (rewards, ends), initializer=(
            tf.reshape(acc, ends.shape[1:]), tf.reshape(last, ends.shape[1:])))
        acc.assign(tf.reshape(rets[-1], acc.shape))
        last.assign(tf.reshape(ends_seq[-1], last.shape))
        self.rms.update(tf.reshape(tf.transpose(rets, [1, 0, 2]), (int(ends.shape[1]), -1)))
        return self.rms.scale(rewards)


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
