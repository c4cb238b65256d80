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

The seed axis (``num_seeds=S``, one seed included: :class:`agents.DQN` holds its buffer on it):
``add`` takes the ``S * num_envs`` transitions of all seeds' environments (the collector's layout,
seed-major), ``sample`` draws ``[S, B]`` indices, each seed from its own transitions and
priorities with its own generator, ``gather`` returns ``[S, B, ...]`` and ``update_priorities``
takes ``[S, B]``. ``pos`` and ``size`` are shared (every seed writes ``num_envs`` transitions per
step). The variables of ``S > 1`` seeds have a leading ``[S]`` (``priority [S, capacity]``,
``max_priority [S]``); one seed's are an ordinary buffer's (``priority [capacity]``, a scalar
``max_priority``: the checkpoint of before), indexed through the axis of one (``_slots``,
``_take``), so its ops are the plain ops.

Example:

>>> import tensorflow as tf
>>> buf = ReplayBuffer(capacity=4, obs_shape=(2,), num_envs=2)
>>> buf.add(tf.ones([2, 2]), tf.constant([0, 1]), tf.constant([1.0, 2.0]), tf.zeros([2, 2]),
...         tf.constant([False, True]))
>>> int(buf.size), int(buf.pos)
(2, 2)
>>> idx, weights = buf.sample(tf.random.Generator.from_seed(0), 3)   # the seed axis of one
>>> idx.shape.as_list(), sorted(buf.gather(idx)), weights is None
([1, 3], ['actions', 'next_obs', 'obs', 'rewards', 'terminated'], True)
>>> two = ReplayBuffer(capacity=4, obs_shape=(2,), num_envs=1, num_seeds=2)
>>> two.add(tf.constant([[0.0, 0.0], [1.0, 1.0]]), tf.constant([0, 1]), tf.ones([2]),
...         tf.zeros([2, 2]), tf.constant([False, False]))   # seed 0's env, then seed 1's
>>> idx, _ = two.sample([tf.random.Generator.from_seed(s) for s in (0, 1)], 3)  # one per seed
>>> two.gather(idx)["obs"][..., 0].numpy().tolist()    # each seed draws its own transitions
[[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tensorflow as tf

from robustgrad.checks import positive_int
from robustgrad.memory import check_allocation

_FIELDS = ("obs", "next_obs", "actions", "rewards", "terminated")


class ReplayBuffer(tf.Module):
    """A ring buffer of ``capacity`` transitions written ``num_envs`` at a time (per seed).

    Variables (their names are the checkpoint keys): ``obs``/``next_obs`` ``[capacity,
    *obs_shape]`` float32, ``actions`` ``[capacity]`` int32, ``rewards`` and ``terminated``
    ``[capacity]`` float32, ``priority`` ``[capacity]`` float32 (0 for empty slots),
    ``max_priority`` float32, ``pos`` (next slot) and ``size`` (filled slots) int64. With
    ``num_seeds=S > 1`` every variable but ``pos`` and ``size`` has a leading ``[S]`` (module
    doc); every method works on the seed axis ``[S, ...]``, one seed included.
    ``jit_compile``: the buffer is read inside XLA-compiled functions (picks the seed axis'
    gather, see ``_take``).
    """

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], num_envs: int = 1,
                 prioritized: bool = False, name: str = "replay", num_seeds: int = 1,
                 jit_compile: bool = False):
        super().__init__(name=name)
        self.jit_compile = bool(jit_compile)  # read by _take (the seed axis' gather)
        self.capacity = positive_int(capacity, "capacity")
        self.num_envs = positive_int(num_envs, "num_envs")
        self.num_seeds = positive_int(num_seeds, "num_seeds")
        self.prioritized = bool(prioritized)
        self._lead = (self.num_seeds,)  # the seed axis of every method's tensors
        # the variables' own leading shape: one seed's are an ordinary buffer's
        lead = self._lead if self.num_seeds > 1 else ()
        cap, z = self.capacity, tf.zeros
        obs_shape = tuple(obs_shape)
        self.obs_shape = obs_shape
        check_allocation(cap * self.num_seeds, 8 * math.prod(obs_shape) + 16,
                         argument="buffer_size",
                         what=f"a replay buffer of {obs_shape} float32 observations"
                         + (f" for {self.num_seeds} seeds" if lead else ""))
        self.obs = tf.Variable(z(lead + (cap,) + obs_shape), trainable=False)
        self.next_obs = tf.Variable(z(lead + (cap,) + obs_shape), trainable=False)
        self.actions = tf.Variable(z(lead + (cap,), tf.int32), trainable=False)
        self.rewards = tf.Variable(z(lead + (cap,)), trainable=False)
        self.terminated = tf.Variable(z(lead + (cap,)), trainable=False)
        self.priority = tf.Variable(z(lead + (cap,)), trainable=False)
        self.max_priority = tf.Variable(tf.ones(lead), trainable=False)
        self.pos = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.size = tf.Variable(0, dtype=tf.int64, trainable=False)

    def _slots(self, idx: tf.Tensor) -> tf.Tensor:
        """Scatter/gather indices of positions ``idx [S, n]`` int64 in the variables: ``[S, n,
        2]`` (seed, position); for one seed (plain variables) ``[1, n, 1]`` (the position)."""
        if self.num_seeds == 1:
            return idx[..., None]
        seed = tf.broadcast_to(tf.range(self.num_seeds, dtype=tf.int64)[:, None], tf.shape(idx))
        return tf.stack([seed, idx], axis=-1)

    def _per_seed(self, x: tf.Tensor) -> tf.Tensor:
        """``[S * num_envs, ...]`` (the envs' layout, seed-major) -> ``[S, num_envs, ...]``."""
        return tf.reshape(x, self._lead + (self.num_envs,) + tuple(x.shape[1:]))

    def _max_priority(self) -> tf.Tensor:
        """``max_priority`` as ``[S]`` (one seed's variable is a scalar)."""
        return tf.reshape(self.max_priority, self._lead)

    def add(self, obs: tf.Tensor, actions: tf.Tensor, rewards: tf.Tensor, next_obs: tf.Tensor,
            terminated: tf.Tensor) -> None:
        """Write one transition per environment (``[S * num_envs, ...]`` each, seed ``s``'s
        environments in block ``s``; ``[num_envs, ...]`` for one seed) at ``pos``, overwriting
        the oldest ones once full. ``terminated`` is bool or float."""
        n, cap = self.num_envs, self.capacity
        pos = (self.pos + tf.range(n, dtype=tf.int64)) % cap
        idx = self._slots(tf.broadcast_to(pos, self._lead + (n,)))
        self.obs.scatter_nd_update(idx, self._per_seed(obs))
        self.next_obs.scatter_nd_update(idx, self._per_seed(next_obs))
        self.actions.scatter_nd_update(idx, self._per_seed(actions))
        self.rewards.scatter_nd_update(idx, self._per_seed(rewards))
        self.terminated.scatter_nd_update(idx, self._per_seed(tf.cast(terminated, tf.float32)))
        if self.prioritized:
            self.priority.scatter_nd_update(
                idx, tf.broadcast_to(self._max_priority()[:, None], self._lead + (n,)))
        self.pos.assign((self.pos + n) % cap)
        self.size.assign(tf.minimum(self.size + n, cap))

    def sample(self, rng: tf.random.Generator | Sequence[tf.random.Generator], batch_size: int,
               beta: float | tf.Tensor = 1.0) -> tuple[tf.Tensor, tf.Tensor | None]:
        """``(indices [S, B] int64, weights [S, B] float32 or None)``, seed ``s`` from its own
        slots: uniform over the filled slots, or (prioritised) stratified proportional to
        ``priority`` with importance weights ``(N P(i)) ** -beta`` divided by their batch
        maximum. ``rng``: one generator for all seeds' draws, or one per seed (seed ``s`` draws
        from ``rng[s]`` what a one-seed buffer draws from its own)."""
        n, size = batch_size, self.size
        if not isinstance(rng, tf.random.Generator) and len(rng) != self.num_seeds:
            raise ValueError(f"rng: expected a tf.random.Generator or one per seed "
                             f"({self.num_seeds}), got {len(rng)}")

        def uniform(*args, **kwargs):
            if isinstance(rng, tf.random.Generator):
                return rng.uniform(self._lead + (n,), *args, **kwargs)
            return tf.stack([g.uniform((n,), *args, **kwargs) for g in rng])

        if not self.prioritized:
            return uniform(0, size, dtype=tf.int64), None
        filled = tf.range(self.capacity, dtype=tf.int64) < size
        priority = tf.reshape(self.priority, self._lead + (self.capacity,))
        cdf = tf.cumsum(tf.where(filled, tf.cast(priority, tf.float64), 0.0), axis=-1)
        total = cdf[..., -1:]
        u = (tf.cast(uniform(), tf.float64) + tf.range(n, dtype=tf.float64)) / n
        idx = tf.searchsorted(cdf, u * total, side="right", out_type=tf.int64)
        idx = tf.minimum(idx, size - 1)
        prob = tf.cast(self._take(self.priority, idx), tf.float64) / total
        w = tf.pow(tf.cast(size, tf.float64) * prob, -tf.cast(beta, tf.float64))
        return idx, tf.cast(w / tf.reduce_max(w, axis=-1, keepdims=True), tf.float32)

    def gather(self, idx: tf.Tensor) -> dict[str, tf.Tensor]:
        """The transitions at ``idx [S, B]``: ``{"obs", "actions", "rewards", "next_obs",
        "terminated"}`` ``[S, B, ...]``, each seed's from its own slots."""
        return {name: self._take(getattr(self, name), idx) for name in _FIELDS}

    def _take(self, var: tf.Variable, idx: tf.Tensor) -> tf.Tensor:
        """``var`` at ``idx [S, B]``, each seed at its own: ``[S, B, ...]``. Once scattered into,
        a variable is in copy-on-read mode: a ``batch_dims`` gather then copies it whole (1.5 ms
        for 8 seeds' 100k observations), ``gather_nd`` on the variable reads only the rows but
        has no XLA kernel; so ``gather_nd`` in graph mode, the ``batch_dims`` gather under XLA.
        One seed's plain variable is read by the plain gather (rows only, any mode) of the
        positions, which carry the axis of one."""
        if self.num_seeds == 1:
            return tf.gather(var, idx)
        if self.jit_compile:
            return tf.gather(var, idx, axis=1, batch_dims=1)
        return tf.gather_nd(var, self._slots(idx))

    def update_priorities(self, idx: tf.Tensor, td_errors: tf.Tensor, alpha: float, eps: float
                          ) -> None:
        """Priorities ``(|td| + eps) ** alpha`` at ``idx`` (``[S, B]`` each; 0 where
        non-finite); raises each seed's ``max_priority`` to its largest new one."""
        p = tf.pow(tf.abs(td_errors) + eps, alpha)
        p = tf.where(tf.math.is_finite(p), p, 0.0)
        self.priority.scatter_nd_update(self._slots(idx), p)
        new = tf.maximum(self._max_priority(), tf.reduce_max(p, axis=-1))
        self.max_priority.assign(tf.reshape(new, self.max_priority.shape))
