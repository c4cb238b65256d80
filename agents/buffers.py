"""Replay storage for off-policy agents, held in ``tf.Variable``s so that writing and sampling
run inside compiled functions (and under XLA) and ``tf.train.Checkpoint`` saves the contents.

:class:`ReplayBuffer` is a ring buffer of transitions ``(obs, action, reward, next_obs,
terminated)`` with optional proportional prioritised sampling (Schaul et al. 2016,
"Prioritized Experience Replay", section 3.3): transition ``i`` is drawn with probability
``P(i) = p_i / sum_k p_k`` and weighted by ``(N P(i)) ** -beta / max_j (N P(j)) ** -beta``.
Sampling is stratified: the ``B`` draws fall one in each of ``B`` equal slices of the
cumulative priority (a float64 ``cumsum`` and ``searchsorted``), which compiles under XLA.
New transitions enter at the highest priority seen so far; a non-finite TD error gives
priority 0, so that transition is not drawn again.

Example:

>>> import tensorflow as tf
>>> buf = ReplayBuffer(capacity=4, obs_shape=(2,), num_envs=2)
>>> buf.add(tf.ones([2, 2]), tf.constant([0, 1]), tf.constant([1.0, 2.0]), tf.zeros([2, 2]),
...         tf.constant([False, True]))
>>> int(buf.size), int(buf.pos)
(2, 2)
>>> idx, weights = buf.sample(tf.random.Generator.from_seed(0), 3)
>>> sorted(buf.gather(idx)), weights is None
(['actions', 'next_obs', 'obs', 'rewards', 'terminated'], True)
"""

from __future__ import annotations

import math

import tensorflow as tf

from robustgrad._checks import positive_int
from robustgrad.memory import check_allocation

_FIELDS = ("obs", "next_obs", "actions", "rewards", "terminated")


class ReplayBuffer(tf.Module):
    """A ring buffer of ``capacity`` transitions written ``num_envs`` at a time.

    Variables (their names are the checkpoint keys): ``obs``/``next_obs`` ``[capacity,
    *obs_shape]`` float32, ``actions`` ``[capacity]`` int32, ``rewards`` and ``terminated``
    ``[capacity]`` float32, ``priority`` ``[capacity]`` float32 (0 for empty slots),
    ``max_priority`` float32, ``pos`` (next slot) and ``size`` (filled slots) int64.
    """

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], num_envs: int = 1,
                 prioritized: bool = False, name: str = "replay"):
        super().__init__(name=name)
        self.capacity = positive_int(capacity, "capacity")
        self.num_envs = positive_int(num_envs, "num_envs")
        self.prioritized = bool(prioritized)
        cap, z = self.capacity, tf.zeros
        obs_shape = tuple(obs_shape)
        check_allocation(cap, 8 * math.prod(obs_shape) + 16, argument="buffer_size",
                         what=f"a replay buffer of {obs_shape} float32 observations")
        self.obs = tf.Variable(z((cap,) + obs_shape), trainable=False)
        self.next_obs = tf.Variable(z((cap,) + obs_shape), trainable=False)
        self.actions = tf.Variable(z([cap], tf.int32), trainable=False)
        self.rewards = tf.Variable(z([cap]), trainable=False)
        self.terminated = tf.Variable(z([cap]), trainable=False)
        self.priority = tf.Variable(z([cap]), trainable=False)
        self.max_priority = tf.Variable(1.0, trainable=False)
        self.pos = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.size = tf.Variable(0, dtype=tf.int64, trainable=False)

    def add(self, obs: tf.Tensor, actions: tf.Tensor, rewards: tf.Tensor, next_obs: tf.Tensor,
            terminated: tf.Tensor) -> None:
        """Write one transition per environment (``[num_envs, ...]`` each) at ``pos``,
        overwriting the oldest ones once full. ``terminated`` is bool or float."""
        n, cap = self.num_envs, self.capacity
        idx = tf.reshape((self.pos + tf.range(n, dtype=tf.int64)) % cap, [-1, 1])
        self.obs.scatter_nd_update(idx, obs)
        self.next_obs.scatter_nd_update(idx, next_obs)
        self.actions.scatter_nd_update(idx, actions)
        self.rewards.scatter_nd_update(idx, rewards)
        self.terminated.scatter_nd_update(idx, tf.cast(terminated, tf.float32))
        if self.prioritized:
            self.priority.scatter_nd_update(idx, tf.fill([n], self.max_priority))
        self.pos.assign((self.pos + n) % cap)
        self.size.assign(tf.minimum(self.size + n, cap))

    def sample(self, rng: tf.random.Generator, batch_size: int, beta: float | tf.Tensor = 1.0
               ) -> tuple[tf.Tensor, tf.Tensor | None]:
        """``(indices [B] int64, weights [B] float32 or None)``: uniform over the filled slots,
        or (prioritised) stratified proportional to ``priority`` with importance weights
        ``(N P(i)) ** -beta`` divided by their batch maximum."""
        n, size = batch_size, self.size
        if not self.prioritized:
            return rng.uniform([n], 0, size, dtype=tf.int64), None
        filled = tf.range(self.capacity, dtype=tf.int64) < size
        cdf = tf.cumsum(tf.where(filled, tf.cast(self.priority, tf.float64), 0.0))
        total = cdf[-1]
        u = (tf.cast(rng.uniform([n]), tf.float64) + tf.range(n, dtype=tf.float64)) / n
        idx = tf.searchsorted(cdf, u * total, side="right", out_type=tf.int64)
        idx = tf.minimum(idx, size - 1)
        prob = tf.cast(tf.gather(self.priority, idx), tf.float64) / total
        w = tf.pow(tf.cast(size, tf.float64) * prob, -tf.cast(beta, tf.float64))
        return idx, tf.cast(w / tf.reduce_max(w), tf.float32)

    def gather(self, idx: tf.Tensor) -> dict[str, tf.Tensor]:
        """The transitions at ``idx``: ``{"obs", "actions", "rewards", "next_obs",
        "terminated"}``."""
        return {name: tf.gather(getattr(self, name), idx) for name in _FIELDS}

    def update_priorities(self, idx: tf.Tensor, td_errors: tf.Tensor, alpha: float, eps: float
                          ) -> None:
        """Priorities ``(|td| + eps) ** alpha`` at ``idx`` (0 where non-finite); raises
        ``max_priority`` to the largest new one."""
        p = tf.pow(tf.abs(td_errors) + eps, alpha)
        p = tf.where(tf.math.is_finite(p), p, 0.0)
        self.priority.scatter_nd_update(tf.reshape(idx, [-1, 1]), p)
        self.max_priority.assign(tf.maximum(self.max_priority, tf.reduce_max(p)))
