"""Running sums of per-step statistics inside compiled loops (one home for the bookkeeping
PPO's minibatch loop and DQN's gradient-step loop share).

:func:`seed_logs` turns an iteration's per-seed statistics into its logs (PPO's and DQN's).

The sums are a ``dict`` of scalar tensors, a loop variable AutoGraph carries through
``for _ in tf.range(...)``; adding in loop order keeps the results bit-identical to
hand-written ``s += x`` lines.

>>> import tensorflow as tf
>>> s = zeros(("loss", "kl"))
>>> s = add(s, {"loss": tf.constant(2.0), "kl": tf.constant(0.5)})
>>> s = add(s, {"loss": tf.constant(4.0), "kl": tf.constant(0.25)})
>>> {k: float(v) for k, v in means(s, 2.0).items()}
{'loss': 3.0, 'kl': 0.375}
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import tensorflow as tf


def zeros(names: Iterable[str], shape: tuple = ()) -> dict:
    """``{name: 0.0}`` as float32 tensors of ``shape`` (scalars; ``(S,)``: one per seed)."""
    return {name: tf.zeros(shape) for name in names}


def add(sums: dict, values: dict, weight=None) -> dict:
    """``sums[k] + values[k]`` (times ``weight``, e.g. a per-seed 0/1 mask, if given) for every
    key of ``sums`` (``values`` must have them all)."""
    if weight is None:
        return {k: s + values[k] for k, s in sums.items()}
    return {k: s + values[k] * weight for k, s in sums.items()}


def means(sums: dict, n) -> dict:
    """``sums[k] / n`` for every key."""
    return {k: s / n for k, s in sums.items()}


def seed_logs(stats: dict, num_seeds: int) -> dict:
    """An iteration's logs from its per-seed statistics ``{name: [S]}`` (tensors or arrays):
    each one's mean over the seeds (a float), and with several seeds each seed's value under
    ``"per_seed"`` (one seed's logs are an ordinary agent's; the mean of one float64 value is
    that value).

    >>> seed_logs({"loss": [1.0, 3.0]}, 2)
    {'loss': 2.0, 'per_seed': {'loss': [1.0, 3.0]}}
    >>> seed_logs({"loss": [1.5]}, 1)
    {'loss': 1.5}
    """
    per_seed = {k: np.asarray(v, np.float64).tolist() for k, v in stats.items()}
    logs: dict[str, float | dict[str, list[float]]] = {
        k: float(np.mean(v)) for k, v in per_seed.items()}
    if num_seeds > 1:
        logs["per_seed"] = per_seed
    return logs
