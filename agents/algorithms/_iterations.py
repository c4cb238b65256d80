"""Several on-policy iterations per compiled call (``iterations_per_call = K > 1``, graph
backend; PureJaxRL compiles its whole training into one call): :class:`IterationLoop`, which an
:class:`agents.algorithms.onpolicy.OnPolicyAgent` holds when ``K > 1`` (``iteration_loop``).

The loop runs ``n <= K`` iterations (each the agent's own rollout, targets and update, handed
in as ``iteration``) in a ``tf.while_loop`` inside one compiled call (XLA too), each with its
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
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from agents.core.compiled import own_function
from agents.core.limits import EPISODE_SLOT_BYTES
from robustgrad.checks import positive_int
from robustgrad.errors import ConfigError
from robustgrad.memory import check_allocation

MAX_ITERATIONS_PER_CALL = 4096
"""The largest ``iterations_per_call``: Python's share of a call is already negligible at 32
(one CartPole seed at 0.94x PureJaxRL's steps per CPU second, ``docs/benchmarks/agents.md``), and a
larger ``K`` only moves callbacks, checkpoints and interrupts further apart. ``learn`` never runs
more iterations per call than its budget has (the compiled loop is sized by that)."""

MAX_STATS = 32
"""Room for an iteration's statistics in the packed per-call record of the loop."""


def check_iterations_per_call(config: Any) -> int:
    """``config.iterations_per_call`` checked (a :class:`agents.algorithms.onpolicy.OnPolicyConfig`
    whose ``n_steps``, ``num_envs`` and ``num_seeds`` are checked): at most
    :data:`MAX_ITERATIONS_PER_CALL`; above 1 only on ``backend="graph"``, without robust
    training, and with room for the record of the episodes one call can finish. ``ConfigError``
    otherwise."""
    k = positive_int(config.iterations_per_call, "iterations_per_call")
    if k > MAX_ITERATIONS_PER_CALL:
        raise ConfigError(f"iterations_per_call must be at most {MAX_ITERATIONS_PER_CALL} "
                          f"(Python's share of a call is already negligible at 32), got {k}")
    if k > 1 and config.backend != "graph":
        raise ConfigError(f"iterations_per_call: several iterations per compiled call need "
                          f"backend='graph' (the environments inside the call); got "
                          f"iterations_per_call={k} with backend={config.backend!r}")
    if k > 1 and config.robust is not None:
        raise ConfigError(f"iterations_per_call: robust training ({config.robust!r}) updates its "
                          f"eps/kappa schedule (and ATLA its adversary) in Python between "
                          f"iterations; use iterations_per_call=1, got {k}")
    if k > 1:  # the graph env's ring buffer of finished episodes
        envs = config.num_envs * config.num_seeds
        try:
            check_allocation(k, EPISODE_SLOT_BYTES * config.n_steps * envs,
                             argument="iterations_per_call",
                             what=f"the record of the episodes one call can finish ("
                                  f"{config.n_steps} steps x {envs} envs per iteration)")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return k


class IterationLoop:
    """Up to ``K`` iterations in one compiled call (module doc).

    ``iteration()``: one iteration's statistics ``{name: [(S,)]}`` (graph code: rollout,
    targets, update); ``learning_rate``: the ``tf.Variable`` the update reads; ``episode_count()``:
    the collector's finished episodes since the last drain (int64, in the graph); ``lead``: ``()``
    or ``(S,)``; ``max_failures``: ``max_nonfinite_updates``; ``trace_counts``: the agent's
    (``"iterations"`` counts this loop's traces).
    """

    def __init__(self, iteration: Callable[[], dict], learning_rate: tf.Variable,
                 episode_count: Callable[[], tf.Tensor], lead: tuple[int, ...],
                 max_failures: int, jit_compile: bool,
                 trace_counts: collections.Counter[str]):
        self._iteration = iteration
        self._learning_rate = learning_rate
        self._episode_count = episode_count
        self._lead = lead
        self._max_failures = max_failures
        self._trace_counts = trace_counts
        self.stat_keys: list[str] = []  # the statistics' names, set when the loop traces
        self.pad = 1  # the length of the loop: the most iterations a call has used
        self.compiled = tf.function(own_function(self._loop_graph), jit_compile=jit_compile)

    def _loop_graph(self, lrs, failures):
        """``n`` iterations, ``lrs [L]`` float32 their learning rates (NaN past the ``n``-th,
        ``1 <= n <= L <= K``), ``failures [(S,)]`` int32 the consecutive fully rejected updates
        so far: stops after an iteration that brings a seed to ``max_failures``. Returns the
        packed statistics ``[L, MAX_STATS, (S,)]`` (names in ``stat_keys``), the episode count
        after each iteration ``[L]`` int64 and the number of iterations run."""
        self._trace_counts["iterations"] += 1
        size = lrs.shape[0]
        packed = tf.TensorArray(tf.float32, size=size, element_shape=(MAX_STATS,) + self._lead)
        counts = tf.TensorArray(tf.int64, size=size, element_shape=())
        ran = tf.constant(0)
        # n from lrs: an int32 argument n made XLA compile the call again for each n
        n = tf.reduce_sum(tf.cast(tf.math.is_finite(lrs), tf.int32))
        for i in tf.range(size):
            self._learning_rate.assign(lrs[i])
            stats = self._iteration()
            packed = packed.write(i, self._pack(stats))
            counts = counts.write(i, self._episode_count())
            failed = (stats["updates_tried"] > 0) & (stats["updates_applied"] == 0)
            failures = tf.where(failed, failures + 1, 0)
            ran = i + 1
            if tf.logical_or(tf.reduce_any(failures >= self._max_failures), i + 1 >= n):
                break
        return packed.stack(), counts.stack(), ran

    def _pack(self, stats):
        """An iteration's statistics as one ``[MAX_STATS, (S,)]`` float32 tensor (zero-padded;
        the names, sorted, in ``stat_keys``)."""
        keys = sorted(stats)
        if len(keys) > MAX_STATS:
            raise ValueError(f"an iteration reports {len(keys)} statistics, more than "
                             f"MAX_STATS = {MAX_STATS}")
        self.stat_keys = keys
        rows = [tf.broadcast_to(tf.cast(stats[k], tf.float32), self._lead) for k in keys]
        return tf.stack(rows + [tf.zeros(self._lead)] * (MAX_STATS - len(keys)))

    def __call__(self, lrs: list[float], failures: list[int], drain: Callable[[], list]
                 ) -> tuple[list[dict[str, np.ndarray]], list[list]]:
        """Run ``len(lrs)`` iterations or fewer (the failure stop) with those learning rates;
        returns each iteration's statistics and its finished episodes, from ``drain()`` (the
        collector's episodes since the last drain, in order)."""
        k = len(lrs)
        # kept across calls so that a shorter call does not trace again
        self.pad = max(self.pad, k)
        packed, counts, ran = self.compiled(
            tf.constant(lrs + [float("nan")] * (self.pad - k), tf.float32),
            tf.reshape(tf.constant(failures, tf.int32), self._lead))
        ran = int(ran)
        packed = packed.numpy()
        counts = counts.numpy()[:ran]  # cumulative since the last drain
        episodes = drain()
        lost = int(counts[-1]) - len(episodes)  # beyond the ring buffer's capacity
        bounds = [0] + [max(int(c) - lost, 0) for c in counts]
        return ([dict(zip(self.stat_keys, packed[i])) for i in range(ran)],
                [episodes[a:b] for a, b in zip(bounds, bounds[1:])])
