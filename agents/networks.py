"""Small networks as plain ``tf.Module``s, and tensorflow-probability policy heads.

Plain ``tf.Variable``s (no Keras layers) keep the compiled rollout cheap, make
``tf.train.Checkpoint`` trivial and avoid a Keras 3 pitfall: its variables are not
``tf.Variable``s, so ``tf.autodiff.ForwardAccumulator`` and ``tape.watch`` need their
underlying ``.value``. Initialisation is orthogonal (Saxe et al. 2014) with the gains
of the PPO implementation details (Huang et al. 2022): ``sqrt(2)`` for hidden layers,
``0.01`` for the policy head, ``1`` for the value head, zero biases.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from agents.envs import RunningMeanStd

tfd = tfp.distributions


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
    """A multi-layer perceptron on flattened inputs; orthogonal init, zero biases."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], out_dim: int, activation: str,
                 out_gain: float, seed: int, name: str | None = None):
        super().__init__(name=name)
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation: expected one of {sorted(_ACTIVATIONS)}, got "
                             f"{activation!r}")
        rng = np.random.default_rng(seed)
        self.activation = _ACTIVATIONS[activation]
        sizes = [in_dim, *hidden, out_dim]
        self.weights_ = []
        self.biases = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            gain = out_gain if i == len(sizes) - 2 else np.sqrt(2.0)
            self.weights_.append(tf.Variable(orthogonal((a, b), gain, rng), name=f"w{i}"))
            self.biases.append(tf.Variable(tf.zeros([b]), name=f"b{i}"))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        x = tf.reshape(x, (tf.shape(x)[0], -1))
        n = len(self.weights_)
        for i, (w, b) in enumerate(zip(self.weights_, self.biases)):
            x = tf.matmul(x, w) + b
            if i < n - 1:
                x = self.activation(x)
        return x


class ObsNormalizer(tf.Module):
    """Optional observation normalisation inside the model, differentiable w.r.t. raw obs."""

    def __init__(self, obs_shape: tuple[int, ...], enabled: bool, clip: float = 10.0):
        super().__init__(name="obs_norm")
        self.enabled = enabled
        self.rms = RunningMeanStd(obs_shape, clip=clip, name="obs_rms")

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
    state-independent variable.
    """

    def __init__(self, obs_shape: tuple[int, ...], n_actions_or_dim: int, discrete: bool,
                 hidden: tuple[int, ...] = (64, 64), activation: str = "tanh",
                 normalize_obs: bool = False, log_std_init: float = 0.0, seed: int = 0):
        super().__init__(name="actor_critic")
        in_dim = int(np.prod(obs_shape))
        self.discrete = discrete
        self.obs_norm = ObsNormalizer(tuple(obs_shape), normalize_obs)
        self.policy_net = MLP(in_dim, tuple(hidden), n_actions_or_dim, activation, 0.01,
                              seed, name="policy")
        self.value_net = MLP(in_dim, tuple(hidden), 1, activation, 1.0, seed + 1, name="value")
        if not discrete:
            self.log_std = tf.Variable(tf.fill([n_actions_or_dim], float(log_std_init)),
                                       name="log_std")

    def distribution(self, obs: tf.Tensor) -> tfd.Distribution:
        """The policy at raw observations ``obs [B, *obs_shape]``: a ``Categorical`` over the
        actions, or a diagonal ``Normal`` (event shape ``[action_dim]``)."""
        x = self.obs_norm(obs)
        out = self.policy_net(x)
        if self.discrete:
            return tfd.Categorical(logits=out)
        std = tf.exp(self.log_std) * tf.ones_like(out)
        return tfd.Independent(tfd.Normal(out, std), reinterpreted_batch_ndims=1)

    def value(self, obs: tf.Tensor) -> tf.Tensor:
        """The state values ``V(obs)``, ``[B] float32``."""
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
    """Action values ``Q(s, .)`` for discrete actions."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int,
                 hidden: tuple[int, ...] = (120, 84), activation: str = "relu",
                 normalize_obs: bool = False, seed: int = 0, name: str = "q"):
        super().__init__(name=name)
        in_dim = int(np.prod(obs_shape))
        self.obs_norm = ObsNormalizer(tuple(obs_shape), normalize_obs)
        self.net = MLP(in_dim, tuple(hidden), n_actions, activation, 1.0, seed, name="mlp")

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        return self.net(self.obs_norm(obs))

    @property
    def trainable(self) -> list[tf.Variable]:
        """The variables the optimiser updates (the observation statistics are not)."""
        return list(self.net.trainable_variables)
