"""Several on-policy iterations per compiled call (``iterations_per_call = K > 1``, graph
backend; PureJaxRL compiles its whole training into one call), a mixin of
:class:`agents.algorithms.onpolicy.OnPolicyAgent`.

``_iterations(lrs, failures)`` runs ``n <= K`` iterations
in a ``tf.while_loop`` inside one compiled call (XLA too), each as ``_iteration``, with its
learning rate from ``lrs [L]`` (the annealing schedule, computed in Python as for ``K = 1``;
NaN past the ``n``-th). The loop's length ``L <= K`` is the most iterations a call of this agent
has used (what the budget can use), never ``K`` itself: ``K = 10**6`` with a 4-iteration budget
allocates for 4.
Per iteration it keeps the statistics (packed in a ``TensorArray``, read once per call) and the
count of finished episodes (so that each iteration's episodes go to its own ``history``
entry); it stops early when a seed reaches ``max_nonfinite_updates`` consecutive fully rejected
updates, where ``K = 1`` stops. ``n`` is cut so that the call ends with the budget and where a
checkpoint is due; weights, optimiser state and history are bit-identical to ``K = 1``, and
callbacks run at call boundaries (:meth:`agents.Agent.learn`).

>>> import agents
>>> agent = agents.PPO(env="CartPole-v1", backend="graph", n_steps=8, num_envs=2,
...                    n_minibatches=1, n_epochs=1, iterations_per_call=4, seed=0)
>>> _ = agent.learn(48)  # 3 iterations of 16 env steps: one compiled call
>>> int(agent.num_timesteps.numpy()), len(agent.history), agent.trace_counts["iterations"]
(48, 3, 1)
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

import tensorflow as tf

if TYPE_CHECKING:  # the mixin's host: OnPolicyAgent (its MRO puts Agent after the mixin)
    from collections.abc import Callable

    from agents.core.base import Agent
    from agents.core.collectors import GraphCollector
    from agents.core.config import OnPolicyConfig

    _Host = Agent
else:
    _Host = object

MAX_STATS = 32
"""Room for an iteration's statistics in the packed per-call record of ``_iterations``."""


class IterationsPerCall(_Host):
    """The ``K > 1`` path of :meth:`agents.Agent.learn`'s ``_train_call`` (module doc): the
    compiled loop (``_iterations_graph``, compiled as ``_iterations`` by the agent) and the
    Python side that cuts ``K`` and hands each iteration's logs and episodes back in order."""

    if TYPE_CHECKING:  # given by OnPolicyAgent
        config: OnPolicyConfig
        collector: GraphCollector  # K > 1 runs on the graph backend
        trace_counts: collections.Counter[str]
        _lead: tuple[int, ...]
        _stat_keys: list[str]
        _iterations_pad: int
        _iterations: Callable[[tf.Tensor, tf.Tensor], tuple]  # _iterations_graph compiled

        def _train_graph(self, batch: dict) -> dict: ...

        def _rollout_graph(self) -> dict: ...

        def _learning_rate(self, steps_done: int, total: int) -> float: ...

        def _stats_logs(self, stats: dict, lr: float) -> dict: ...

    def _iterations_graph(self, lrs, failures):
        """``n`` iterations (rollout, targets, update), ``lrs [L]`` float32 their learning rates
        (NaN past the ``n``-th, ``1 <= n <= L <= K``), ``failures [(S,)]`` int32 the consecutive
        fully rejected updates so far: stops after an iteration that brings a seed to
        ``max_nonfinite_updates``. Returns the packed
        statistics ``[L, MAX_STATS, (S,)]`` (names in ``_stat_keys``), the collector's episode
        count after each iteration ``[L]`` int64 and the number of iterations run."""
        self.trace_counts["iterations"] += 1
        size = lrs.shape[0]
        packed = tf.TensorArray(tf.float32, size=size, element_shape=(MAX_STATS,) + self._lead)
        counts = tf.TensorArray(tf.int64, size=size, element_shape=())
        limit = self.config.max_nonfinite_updates
        ran = tf.constant(0)
        # n from lrs: an int32 argument n made XLA compile the call again for each n
        n = tf.reduce_sum(tf.cast(tf.math.is_finite(lrs), tf.int32))
        for i in tf.range(size):
            self.optimizer.learning_rate.assign(lrs[i])
            stats = self._train_graph(self._rollout_graph())
            packed = packed.write(i, self._pack_stats(stats))
            counts = counts.write(i, self.collector.episode_count())
            failed = (stats["updates_tried"] > 0) & (stats["updates_applied"] == 0)
            failures = tf.where(failed, failures + 1, 0)
            ran = i + 1
            if tf.logical_or(tf.reduce_any(failures >= limit), i + 1 >= n):
                break
        return packed.stack(), counts.stack(), ran

    def _pack_stats(self, stats):
        """An iteration's statistics as one ``[MAX_STATS, (S,)]`` float32 tensor (zero-padded;
        the names, sorted, in ``_stat_keys``)."""
        keys = sorted(stats)
        if len(keys) > MAX_STATS:
            raise ValueError(f"an iteration reports {len(keys)} statistics, more than "
                             f"MAX_STATS = {MAX_STATS}")
        self._stat_keys = keys
        rows = [tf.broadcast_to(tf.cast(stats[k], tf.float32), self._lead) for k in keys]
        return tf.stack(rows + [tf.zeros(self._lead)] * (MAX_STATS - len(keys)))

    def _train_call(self, steps_done, total, until, failures):
        """``iterations_per_call = K > 1`` (module doc): up to ``K`` iterations in one compiled
        call, the last one the first to reach ``until`` env steps; their logs in order."""
        cfg = self.config
        k_max = cfg.iterations_per_call
        if k_max == 1:
            return super()._train_call(steps_done, total, until, failures)
        n = cfg.n_steps * cfg.num_envs
        k = max(1, min(k_max, -(-until // n)))
        # the loop's length: what the budget can use, never K itself (K = 10**6 for a 4-iteration
        # budget allocated by K); kept across calls so that a shorter call does not trace again
        self._iterations_pad = max(self._iterations_pad, k)
        lrs = [self._learning_rate(steps_done + i * n, total) for i in range(k)]
        packed, counts, ran = self._iterations(
            tf.constant(lrs + [float("nan")] * (self._iterations_pad - k), tf.float32),
            tf.reshape(tf.constant(failures, tf.int32), self._lead))
        ran = int(ran)
        packed, counts = packed.numpy(), counts.numpy()
        steps = int(self.num_timesteps.numpy())
        self.num_timesteps.assign_add(n * ran)
        self.num_updates.assign_add(ran)
        # each iteration's finished episodes (the count is cumulative since the last drain)
        episodes = self.collector.drain_seed_episodes()
        lost = int(counts[ran - 1]) - len(episodes)  # beyond the ring buffer's capacity
        bounds = [0] + [max(int(c) - lost, 0) for c in counts[:ran]]
        self._queued_episodes = [episodes[a:b] for a, b in zip(bounds, bounds[1:])]
        results = []
        for i in range(ran):
            logs = self._stats_logs(dict(zip(self._stat_keys, packed[i])), lrs[i])
            logs["steps"] = steps + (i + 1) * n
            results.append((logs, n))
        return results
