"""The policy as arrays: an agent's weights, and the state a copy of it collects with.

``Agent.get_weights`` / ``Agent.set_weights`` snapshot the *policy* (what ``act``,
``distribution`` and ``q_values`` compute: network weights and observation statistics), not the
training state: optimiser moments, replay buffer and RNG are left out (``Agent.save`` writes
those). ``Agent.policy_state`` / ``Agent.load_policy_state`` add what a copy of the agent (a Ray
rollout worker, :mod:`agents.backends.distributed`) needs to collect as the agent would: the
training random stream and, with robust training, the schedule's current radius.

>>> import numpy as np, tensorflow as tf
>>> v = [tf.Variable([1.0, 2.0]), tf.Variable(3.0)]
>>> w = read_weights(v); w[0][0] = 9.0          # copies: the variables are untouched
>>> float(v[0][0].numpy())
1.0
>>> assign_weights(v, [np.array([4.0, 5.0]), np.array(6.0)]); v[0].numpy().tolist()
[4.0, 5.0]
>>> state = policy_state(read_weights(v), tf.random.Generator.from_seed(0), None)
>>> sorted(state)
['rng_state', 'weights']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["assign_weights", "load_policy_state", "policy_state", "read_weights"]


def read_weights(variables: Sequence[tf.Variable]) -> list[np.ndarray]:
    """Copies of ``variables`` as numpy arrays, in order (what ``Agent.get_weights`` returns).

    Example::

        w = agent.get_weights(); agent.learn(10_000); agent.set_weights(w)
    """
    return [v.numpy().copy() for v in variables]


def assign_weights(variables: Sequence[tf.Variable], weights: Sequence[np.ndarray]) -> None:
    """Assign ``weights`` (from :func:`read_weights` of an agent with the same algorithm and
    network shapes) to ``variables``; their number and each shape are checked before anything
    is assigned (a ``ValueError`` naming the array)."""
    weights = list(weights)
    if len(weights) != len(variables):
        raise ValueError(f"weights: expected {len(variables)} arrays, got {len(weights)}")
    for i, (v, w) in enumerate(zip(variables, weights)):
        if tuple(np.shape(w)) != tuple(v.shape):
            raise ValueError(f"weights: array {i} ({v.name}) has shape {np.shape(w)}, "
                             f"expected {tuple(v.shape)}")
    for v, w in zip(variables, weights):
        v.assign(np.asarray(w, v.dtype.as_numpy_dtype))


def policy_state(weights: list[np.ndarray], rng: tf.random.Generator, schedule: Any) -> dict:
    """What a copy of an agent needs to collect as it would: ``weights`` (``get_weights()``),
    ``rng_state`` (a copy of the training stream ``rng``'s state) and, when ``schedule`` (robust
    training's :class:`agents.robustness.robust.RobustSchedule`, or ``None``) is given,
    ``robust_eps`` (its current radius)."""
    state = {"weights": weights, "rng_state": rng.state.numpy().copy()}
    if schedule is not None:
        state["robust_eps"] = float(schedule.eps.numpy())
    return state


def load_policy_state(state: dict, stream: int, set_weights: Callable[[list], None],
                      rng: tf.random.Generator, schedule: Any) -> None:
    """Load a :func:`policy_state`: the weights through ``set_weights``, the random stream into
    ``rng`` with its Philox key offset by ``stream`` (rollout worker ``k`` samples from stream
    ``k``), the radius into ``schedule`` (when both have one)."""
    set_weights(state["weights"])
    value = np.array(state["rng_state"], np.int64)
    value[-1] += int(stream)  # Philox state: [counter, counter, key]
    rng.reset(value)
    if schedule is not None and "robust_eps" in state:
        schedule.eps.assign(state["robust_eps"])
