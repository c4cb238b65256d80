"""Each seed's own random stream: what makes seed ``s`` of an ``S``-seed agent re-runnable alone.

An agent draws every training random number (action sampling, PPO's minibatch order, DQN's
exploration and replay sampling) from one ``tf.random.Generator``, ``rng``
(``Generator.from_seed(seed)``). On the seed axis (``num_seeds = S > 1``) :class:`SeedStreams`
holds ``S`` generators, seed ``s``'s built as the agent of seed ``s`` alone builds its ``rng``,
and every draw is made once per seed, in the order the agent alone makes it, and stacked
(``[S, ...]``): seed ``s`` of a sweep draws exactly the numbers of its own run. Without the axis
the one stream *is* the agent's ``rng`` and a draw is the plain draw (the same op: a one-seed run
keeps its bits).

>>> import tensorflow as tf
>>> alone = [tf.random.Generator.from_seed(s) for s in (3, 4)]
>>> streams = SeedStreams(None, seeds=[3, 4])
>>> draws = streams.draw(lambda g: g.uniform([2]))          # [S, 2]: one draw per seed
>>> bool(tf.reduce_all(draws == tf.stack([g.uniform([2]) for g in alone])))
True
>>> one = SeedStreams(tf.random.Generator.from_seed(3))     # no seed axis: the agent's rng
>>> one.keys(5).shape.as_list(), streams.keys(5).shape.as_list()
([2, 5], [2, 2, 5])
>>> scale = tf.constant([1.0, 10.0])                        # a per-seed argument, sliced
>>> stateless_per_seed(lambda key, c: c * tf.random.stateless_uniform([3], key),
...                    streams.keys(), scale, axis=True).shape.as_list()
[2, 3]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf


class SeedStreams:
    """The training random streams of an agent (module doc): ``rng`` alone, or with ``seeds``
    (the seed axis) one ``tf.random.Generator.from_seed(s)`` per seed. ``generators`` lists
    them; :func:`agents.backends.seed_axis.export_seed` and ``import_seed`` carry seed ``s``'s
    state to and from the agent of seed ``s`` alone (its ``rng``)."""

    def __init__(self, rng: tf.random.Generator | None, seeds: Sequence[int] | None = None):
        if (rng is None) == (seeds is None):
            raise ValueError("SeedStreams: give either rng (one seed) or seeds (the seed axis)")
        self.axis = seeds is not None
        self.generators = ([tf.random.Generator.from_seed(int(s)) for s in seeds]
                           if seeds is not None else [rng])

    @classmethod
    def of(cls, rng: tf.random.Generator, seeds: Sequence[int]) -> SeedStreams:
        """The streams of an agent of ``seeds`` on the seed axis, one seed included: ``S > 1``
        seeds each draw from their own stream; one seed is the axis of one over the agent's own
        ``rng`` (its draws are the plain draws, ``[1, ...]``: a one-seed run keeps its bits, its
        checkpoint's ``rng`` and its Ray workers' streams).

        >>> one = SeedStreams.of(tf.random.Generator.from_seed(3), [3])
        >>> one.keys(5).shape.as_list()
        [1, 2, 5]
        """
        if len(seeds) > 1:
            return cls(None, seeds)
        streams = cls(rng)
        streams.axis = True
        return streams

    def draw(self, fn: Callable[..., tf.Tensor], *args: Any) -> tf.Tensor:
        """``fn(rng, *args)`` of the one stream, or ``[S, ...]``: ``fn(rng_s, *(a[s] for a in
        args))`` of each seed's stream ``rng_s`` (each of ``args`` has a leading ``[S]``),
        stacked."""
        if not self.axis:
            return fn(self.generators[0], *args)
        return tf.stack([fn(g, *(a[s] for a in args)) for s, g in enumerate(self.generators)])

    def keys(self, count: int | tf.Tensor | None = None) -> tf.Tensor:
        """Fresh stateless keys (int32): ``[2]`` (``count=None``: as ``Agent._seed()`` draws
        one) or ``[2, count]`` (as ``rng.make_seeds(count)``); ``[S, ...]`` with the axis."""
        if count is None:
            return self.draw(lambda g: tf.cast(g.make_seeds(1)[:, 0], tf.int32))
        return self.draw(lambda g: tf.cast(g.make_seeds(count), tf.int32))


def stateless_per_seed(fn: Callable[..., tf.Tensor], keys: tf.Tensor, *args: Any, axis: bool
                       ) -> tf.Tensor:
    """``fn(keys, *args)`` (one stateless ``[2]`` key), or with the seed ``axis``
    ``fn(keys[s], *(a[s] for a in args))`` for each seed (``keys [S, 2]``; each of ``args`` has a
    leading ``[S]``, a tensor or a TFP distribution), stacked ``[S, ...]``: each seed's draw as
    that seed alone makes it."""
    if not axis:
        return fn(keys, *args)
    return tf.stack([fn(keys[s], *(a[s] for a in args)) for s in range(int(keys.shape[0]))])


__all__ = ["SeedStreams", "stateless_per_seed"]
