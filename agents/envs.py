"""Vector environments with same-step autoreset semantics, and running normalisation.

gymnasium 1.x vector environments autoreset in one of three modes
(:class:`gymnasium.vector.AutoresetMode`). With ``NEXT_STEP`` (the default of
``gymnasium.make_vec``) the observation returned on the step that ends an episode is
the *final* observation, and the *next* call to ``step`` ignores the action and resets
that sub-environment (reward 0, not done). Treating that reset step as a transition is
a classic silent bug. :class:`VecEnv` hides the modes behind one contract, the
``SAME_STEP`` one:

* ``step(actions)`` returns ``obs`` (already reset where an episode ended),
  ``reward``, ``terminated``, ``truncated`` and ``final_obs``: the observation the
  transition really led to (the final observation where an episode ended, ``obs``
  elsewhere). Truncated transitions bootstrap from the value of ``final_obs``.
* ``NEXT_STEP``/``DISABLED`` vector environments are converted by resetting the
  finished sub-environments immediately with ``reset(options={"reset_mask": done})``.

It also records raw episode returns and lengths (before any reward normalisation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import tensorflow as tf
from gymnasium.vector import AutoresetMode

from robustgrad.checks import positive_int
from robustgrad.errors import ConfigError

EnvSpec = Any  # a gymnasium id (str) or a factory returning a gymnasium.Env


def check_env_id(env: EnvSpec, argument: str = "env") -> None:
    """Raise ``ValueError`` naming ``argument`` if ``env`` is neither a known id nor callable.

    >>> check_env_id("CartPole-v1")
    >>> check_env_id("NoSuchEnv-v0")
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: env: unknown gymnasium environment id 'NoSuchEnv-v0' (...)
    """
    if callable(env):
        return
    if not isinstance(env, str) or not env:
        raise ConfigError(f"{argument}: expected a gymnasium id or an env factory, got {env!r}")
    try:
        gym.spec(env)
    except gym.error.Error as exc:
        raise ConfigError(f"{argument}: unknown gymnasium environment id {env!r} ({exc})") from None


def make_vec_env(env: EnvSpec, num_envs: int, seed: int | None = 0,
                 async_envs: bool = False) -> VecEnv:
    """A :class:`VecEnv` of ``num_envs`` copies of ``env`` (an id or a factory).

    The vector env is created in ``SAME_STEP`` autoreset mode; ``async_envs`` uses
    subprocesses (``AsyncVectorEnv``) instead of a loop in this process. A factory with a
    ``make_vector_env(num_envs, async_envs)`` attribute builds its own (same-step autoreset)
    vector env, whose copies step together (the learned adversary's MDP,
    :class:`agents.robustness.adversary.AdversaryVectorEnv`, calls its victim once per vector step).
    """
    check_env_id(env)
    num_envs = positive_int(num_envs, "num_envs")
    kwargs = {"autoreset_mode": AutoresetMode.SAME_STEP}
    make_vector = getattr(env, "make_vector_env", None)
    if make_vector is not None:  # a factory that steps its copies together (agents.robustness.adversary)
        vec = make_vector(num_envs, async_envs)
        if _autoreset_mode(vec) != AutoresetMode.SAME_STEP:
            raise ConfigError(f"env: make_vector_env must build a same-step autoreset vector env, "
                             f"got {_autoreset_mode(vec)}")
    elif isinstance(env, str):
        try:
            vec = gym.make_vec(env, num_envs=num_envs,
                               vectorization_mode="async" if async_envs else "sync",
                               vector_kwargs=kwargs)
        except gym.error.DependencyNotInstalled as exc:  # Box2D, MuJoCo, ...: say how to fix
            raise ImportError(f"env {env!r} needs an optional dependency that is not installed: "
                              f"{' '.join(str(exc).split())}") from None
    else:
        cls = gym.vector.AsyncVectorEnv if async_envs else gym.vector.SyncVectorEnv
        vec = cls([env] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)  # = kwargs
    return VecEnv(vec, seed=seed)


def graph_env_step(step_fn: Callable, actions: tf.Tensor, num_envs: int, obs_shape: tuple[int, ...]
                   ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """Call the numpy ``step_fn(actions)`` of a :class:`VecEnv` from inside a ``tf.function``
    (``tf.numpy_function``, stateful) and give the results their static shapes.

    Returns ``obs [N, *obs_shape] float32, reward [N] float32, terminated [N] bool,
    truncated [N] bool, final_obs [N, *obs_shape] float32`` (``N = num_envs``).

    >>> import numpy as np, tensorflow as tf
    >>> def fake_step(a):
    ...     n = a.shape[0]
    ...     z = np.zeros((n, 3), np.float32)
    ...     return z, np.ones(n, np.float32), np.zeros(n, bool), np.zeros(n, bool), z
    >>> out = tf.function(lambda a: graph_env_step(fake_step, a, 2, (3,)))(tf.constant([0, 1]))
    >>> [tuple(t.shape) for t in out]
    [(2, 3), (2,), (2,), (2,), (2, 3)]
    """
    obs, reward, terminated, truncated, final_obs = tf.numpy_function(
        step_fn, [actions], [tf.float32, tf.float32, tf.bool, tf.bool, tf.float32],
        stateful=True)
    shape = (num_envs,) + tuple(obs_shape)
    obs.set_shape(shape)
    final_obs.set_shape(shape)
    for t in (reward, terminated, truncated):
        t.set_shape((num_envs,))
    return obs, reward, terminated, truncated, final_obs


def episodes_split_evenly(n_episodes: int, num_envs: int) -> np.ndarray:
    """How many of ``n_episodes`` each of ``num_envs`` sub-environments runs (as SB3 does), so
    that short episodes are not over-represented.

    >>> episodes_split_evenly(10, 4).tolist()
    [2, 2, 3, 3]
    """
    return np.array([(n_episodes + i) // num_envs for i in range(num_envs)])


def take_finished_episodes(env: VecEnv, done: np.ndarray, counts: np.ndarray,
                           targets: np.ndarray, returns: list, lengths: list) -> None:
    """After a vector step with ``done [N]``: append the finished episodes of the sub-envs that
    still owe episodes (``counts < targets``) to ``returns`` / ``lengths``, counting them."""
    if not done.any():
        return
    for i, (ret, length) in zip(np.nonzero(done)[0], env.drain_episodes()):
        if counts[i] < targets[i]:
            returns.append(ret)
            lengths.append(length)
            counts[i] += 1


def run_episodes(act: Callable[[np.ndarray], np.ndarray], env: EnvSpec, n_episodes: int,
                 num_envs: int, seed: int | None) -> tuple[list[float], list[int]]:
    """``n_episodes`` full episodes of ``act(obs [num_envs, ...]) -> actions`` on a fresh vector
    env of ``num_envs`` copies of ``env`` seeded with ``seed``, split evenly over the
    sub-environments (:func:`episodes_split_evenly`); returns their returns and lengths.

    >>> returns, lengths = run_episodes(lambda obs: np.zeros(len(obs), int), "CartPole-v1", 3, 2, 0)
    >>> len(returns), all(r == n for r, n in zip(returns, lengths))
    (3, True)
    """
    vec = make_vec_env(env, num_envs, seed=seed)
    targets = episodes_split_evenly(n_episodes, num_envs)
    counts = np.zeros(num_envs, int)
    returns: list[float] = []
    lengths: list[int] = []
    try:
        obs = vec.reset()
        while (counts < targets).any():
            obs, _r, term, trunc, _f = vec.step(act(obs))
            take_finished_episodes(vec, term | trunc, counts, targets, returns, lengths)
    finally:
        vec.close()
    return returns, lengths


def evaluate_episodes(act: Callable[[np.ndarray], np.ndarray], env: EnvSpec, n_episodes: int,
                      num_envs: int | None, seed: int | None) -> dict:
    """``Agent.evaluate``: ``n_episodes`` (an int >= 1) full episodes of ``act`` on a fresh vector
    env of ``num_envs`` copies (``None``: ``min(n_episodes, 8)``) of ``env`` seeded with ``seed``
    (:func:`run_episodes`); returns ``mean_return``, ``std_return``, ``returns`` and ``lengths``.

    >>> out = evaluate_episodes(lambda obs: np.zeros(len(obs), int), "CartPole-v1", 3, None, 0)
    >>> len(out["returns"]), out["mean_return"] == float(np.mean(out["lengths"]))
    (3, True)
    """
    if isinstance(n_episodes, bool) or not isinstance(n_episodes, (int, np.integer)) \
            or n_episodes <= 0:
        raise ValueError(f"n_episodes: must be a positive integer, got {n_episodes!r}")
    if num_envs is not None and (isinstance(num_envs, bool) or not isinstance(
            num_envs, (int, np.integer)) or num_envs <= 0):
        raise ValueError(f"num_envs: must be a positive integer or None, got {num_envs!r}")
    k = int(min(int(n_episodes), 8) if num_envs is None else num_envs)
    returns, lengths = run_episodes(act, env, int(n_episodes), k, seed)
    return {"mean_return": float(np.mean(returns)), "std_return": float(np.std(returns)),
            "returns": returns, "lengths": lengths}


def _autoreset_mode(vec: gym.vector.VectorEnv) -> AutoresetMode:
    mode = vec.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if isinstance(mode, str):
        mode = AutoresetMode(mode)
    return mode


class VecEnv:
    """A gymnasium vector env seen through same-step autoreset semantics (see module doc)."""

    def __init__(self, vec: gym.vector.VectorEnv, seed: int | list[int | None] | None = 0):
        # seed: of the first reset, one for the copies (copy i from seed + i) or one per copy
        self.vec = vec
        self.num_envs = int(vec.num_envs)
        self.mode = _autoreset_mode(vec)
        self.single_observation_space = vec.single_observation_space
        self.single_action_space = vec.single_action_space
        if not isinstance(self.single_observation_space, gym.spaces.Box):
            raise ConfigError(
                "env: only Box observation spaces are supported, got "
                f"{self.single_observation_space}")
        self.obs_shape = tuple(self.single_observation_space.shape)
        space = self.single_action_space
        self.discrete = isinstance(space, gym.spaces.Discrete)
        if not self.discrete and not isinstance(space, gym.spaces.Box):
            raise ConfigError(f"env: action space {space} is not supported (Discrete or Box)")
        if not isinstance(space, gym.spaces.Box):  # discrete (checked above: Discrete or Box)
            self.action_low = self.action_high = None
        else:
            self.action_low = np.asarray(space.low, np.float32)
            self.action_high = np.asarray(space.high, np.float32)
        self._seed = seed
        self._ep_return = np.zeros(self.num_envs, np.float64)
        self._ep_length = np.zeros(self.num_envs, np.int64)
        self.episodes: list[tuple[float, int]] = []  # finished (return, length), drained by owner
        self.error: BaseException | None = None  # last exception raised inside step()
        self.obs: np.ndarray | None = None

    # -- gymnasium-like API ----------------------------------------------------------------
    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset every sub-environment; returns the observations ``[N, *obs_shape] float32``.
        Only the first reset uses the constructor's ``seed`` (unless ``seed`` is given)."""
        first = self._seed if seed is None else seed
        # gymnasium's VectorEnv.reset annotates int | None; its vector envs take a list per copy
        obs, _ = self.vec.reset(seed=first)  # type: ignore[arg-type]
        self._seed = None  # seed only the first reset, later resets continue the RNG streams
        self._ep_return[:] = 0
        self._ep_length[:] = 0
        self.obs = np.asarray(obs, np.float32)
        return self.obs

    def step(self, actions: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step all sub-environments; returns ``obs, reward, terminated, truncated, final_obs``.

        An exception raised by the environment is stored in :attr:`error` (so that the
        caller can save a checkpoint) and re-raised.
        """
        try:
            obs, reward, terminated, truncated, info = self.vec.step(actions)
            obs = np.asarray(obs, np.float32)
            terminated = np.asarray(terminated, bool)
            truncated = np.asarray(truncated, bool)
            done = terminated | truncated
            final_obs = obs.copy()
            if done.any():
                if self.mode == AutoresetMode.SAME_STEP:
                    mask = info.get("_final_obs", done)
                    for i in np.nonzero(mask)[0]:
                        final_obs[i] = info["final_obs"][i]
                else:  # NEXT_STEP / DISABLED: obs is the final obs; reset those envs now
                    reset_obs, _ = self.vec.reset(options={"reset_mask": done})
                    obs = np.where(done.reshape((-1,) + (1,) * len(self.obs_shape)),
                                   np.asarray(reset_obs, np.float32), obs)
        except BaseException as exc:  # noqa: BLE001 - stored, then re-raised unchanged
            self.error = exc
            raise
        reward = np.asarray(reward, np.float64)
        self._ep_return += reward
        self._ep_length += 1
        if done.any():
            for i in np.nonzero(done)[0]:
                self.episodes.append((float(self._ep_return[i]), int(self._ep_length[i])))
            self._ep_return[done] = 0
            self._ep_length[done] = 0
        self.obs = obs
        return obs, reward.astype(np.float32), terminated, truncated, final_obs

    def drain_episodes(self) -> list[tuple[float, int]]:
        """The ``(return, length)`` of the episodes finished since the last call, emptied."""
        out, self.episodes = self.episodes, []
        return out

    def close(self) -> None:
        """Close the underlying gymnasium vector env (and its subprocesses)."""
        self.vec.close()


class RunningMeanStd(tf.Module):
    """Running mean and variance of vectors (parallel algorithm of Chan et al. 1979).

    ``normalize`` is differentiable with respect to its input, so gradients of a policy
    reach the *raw* observation. Rows containing a non-finite value are ignored by
    ``update`` so a NaN observation cannot corrupt the statistics.
    """

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-8, clip: float = 10.0,
                 name: str | None = None):
        super().__init__(name=name)
        self.mean = tf.Variable(tf.zeros(shape, tf.float64), trainable=False, name="mean")
        self.var = tf.Variable(tf.ones(shape, tf.float64), trainable=False, name="var")
        self.count = tf.Variable(tf.constant(1e-4, tf.float64), trainable=False, name="count")
        self.epsilon = epsilon
        self.clip = clip
        self.shape = tuple(shape)

    def update(self, x: tf.Tensor | np.ndarray) -> None:
        """Fold the rows of ``x`` (``[..., *shape]``, any float dtype) into the statistics;
        rows holding a non-finite value are skipped."""
        x = tf.reshape(tf.cast(x, tf.float64), (-1,) + self.shape)
        rows = tf.reduce_all(tf.reshape(tf.math.is_finite(x), (tf.shape(x)[0], -1)), axis=1)
        w = tf.reshape(tf.cast(rows, tf.float64), (-1,) + (1,) * len(self.shape))
        x = tf.where(w > 0, x, 0.0)  # masks, not boolean_mask: static shapes (XLA-friendly)
        n = tf.reduce_sum(w)
        batch_mean = tf.math.divide_no_nan(tf.reduce_sum(w * x, 0), n)
        batch_var = tf.math.divide_no_nan(tf.reduce_sum(w * tf.square(x - batch_mean), 0), n)
        delta = batch_mean - self.mean
        tot = self.count + n
        self.mean.assign(self.mean + delta * n / tot)
        m2 = self.var * self.count + batch_var * n + tf.square(delta) * self.count * n / tot
        self.var.assign(m2 / tot)
        self.count.assign(tot)

    def normalize(self, x: tf.Tensor) -> tf.Tensor:
        """``(x - mean) / sqrt(var + epsilon)`` clipped to ``[-clip, clip]``, in ``x``'s dtype."""
        mean = tf.cast(self.mean, x.dtype)
        std = tf.cast(tf.sqrt(self.var + self.epsilon), x.dtype)
        return tf.clip_by_value((x - mean) / std, -self.clip, self.clip)

    def scale(self, x: tf.Tensor) -> tf.Tensor:
        """Divide by the running standard deviation only (reward scaling)."""
        return x / tf.cast(tf.sqrt(self.var + self.epsilon), x.dtype)

    def numpy_state(self) -> dict[str, np.ndarray]:
        """The statistics as numpy arrays: ``mean``, ``var`` and ``count`` (float64)."""
        return {"mean": self.mean.numpy(), "var": self.var.numpy(), "count": self.count.numpy()}


EnvFactory = Callable[[], gym.Env]
