"""Meta-batches of regression tasks: :class:`Tasks`, :class:`SinusoidTasks`, :func:`split_tasks`.

>>> tasks = SinusoidTasks(k_shot=5, k_query=7, seed=0).sample(3)
>>> tuple(tasks.x_support.shape), tuple(tasks.y_query.shape)
((3, 5, 1), (3, 7, 1))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from robustgrad.checks import number, positive_int

__all__ = ["SinusoidTasks", "Tasks", "split_tasks"]


class Tasks(NamedTuple):
    """A meta-batch of regression tasks.

    ``x_support [T, K, d]``, ``y_support [T, K, o]``, ``x_query [T, Q, d]``, ``y_query [T, Q, o]``
    (float32); ``amplitude``/``phase`` ``[T]`` when the tasks are sinusoids (else None).
    """

    x_support: tf.Tensor
    y_support: tf.Tensor
    x_query: tf.Tensor
    y_query: tf.Tensor
    amplitude: tf.Tensor | None = None
    phase: tf.Tensor | None = None


def _interval_pair(value: Any, name: str) -> tuple[float, float]:
    try:
        low, high = value
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be a (low, high) pair with low <= high, got {value!r}") from None
    low = number(low, f"{name}[0]")
    return low, number(high, f"{name}[1]", minimum=low)


class SinusoidTasks:
    """The sinusoid few-shot regression benchmark of Finn et al. (2017), section 5.1.

    A task is ``y = A sin(x - phi)`` with ``A ~ U[amplitude]``, ``phi ~ U[phase]``; the support set
    has ``k_shot`` points and the query set ``k_query`` points, ``x ~ U[x_range]``.

    Args:
      k_shot: support points per task (K; the paper uses 5 and 10).
      k_query: query points per task.
      amplitude: ``(low, high)``, default ``(0.1, 5.0)``.
      phase: ``(low, high)``, default ``(0, pi)``.
      x_range: ``(low, high)``, default ``(-5, 5)``.
      seed: seed of the ``tf.random.Generator`` (same seed, same task stream).

    ``sample(num_tasks)`` returns :class:`Tasks` with shapes ``[T, K, 1]`` / ``[T, Q, 1]``; it can
    be called eagerly or inside a ``tf.function``.
    """

    def __init__(self, k_shot: int = 10, k_query: int = 10,
                 amplitude: tuple[float, float] = (0.1, 5.0),
                 phase: tuple[float, float] = (0.0, math.pi),
                 x_range: tuple[float, float] = (-5.0, 5.0), seed: int = 0):
        self.k_shot = positive_int(k_shot, "k_shot")
        self.k_query = positive_int(k_query, "k_query")
        self.amplitude = _interval_pair(amplitude, "amplitude")
        self.phase = _interval_pair(phase, "phase")
        self.x_range = _interval_pair(x_range, "x_range")
        self.generator = tf.random.Generator.from_seed(seed)

    def sample(self, num_tasks: int, k_shot: int | None = None,
               k_query: int | None = None) -> Tasks:
        """``num_tasks`` new tasks (the generator advances: the next call gives other tasks)."""
        k = self.k_shot if k_shot is None else int(k_shot)
        q = self.k_query if k_query is None else int(k_query)
        g = self.generator
        amp = g.uniform([num_tasks], *self.amplitude)
        ph = g.uniform([num_tasks], *self.phase)
        xs = g.uniform([num_tasks, k, 1], *self.x_range)
        xq = g.uniform([num_tasks, q, 1], *self.x_range)

        def f(x):
            return amp[:, None, None] * tf.sin(x - ph[:, None, None])

        return Tasks(xs, f(xs), xq, f(xq), amp, ph)

    def __call__(self, num_tasks: int) -> Tasks:
        return self.sample(num_tasks)


def split_tasks(x: Any, y: Any, num_tasks: int, k_shot: int) -> Tasks:
    """Reshape flat data ``x [N, d]``, ``y [N, o]`` into ``num_tasks`` tasks of ``k_shot`` support
    points and ``N/num_tasks - k_shot`` query points (rows of a task are consecutive).

    Raises ``ValueError`` naming ``num_tasks``/``k_shot`` when ``N`` does not divide into the
    task shape.

    >>> t = split_tasks(tf.reshape(tf.range(12.0), [6, 2]), tf.zeros([6, 1]), 2, 1)
    >>> t.x_support.numpy().tolist(), tuple(t.x_query.shape)
    ([[[0.0, 1.0]], [[6.0, 7.0]]], (2, 2, 2))
    """
    num_tasks = positive_int(num_tasks, "num_tasks")
    k_shot = positive_int(k_shot, "k_shot")
    x = tf.convert_to_tensor(x)
    y = tf.convert_to_tensor(y)
    n = int(x.shape[0])
    if int(y.shape[0]) != n:
        raise ValueError(f"x and y must have the same number of rows, got {n} and {y.shape[0]}")
    if n % num_tasks:
        raise ValueError(
            f"num_tasks={num_tasks} does not divide the batch of {n} rows into equal tasks")
    per = n // num_tasks
    if not k_shot < per:
        raise ValueError(f"k_shot={k_shot} must be in [1, {per - 1}] for tasks of {per} rows")
    xt = tf.reshape(x, [num_tasks, per] + x.shape[1:].as_list())
    yt = tf.reshape(y, [num_tasks, per] + y.shape[1:].as_list())
    return Tasks(xt[:, :k_shot], yt[:, :k_shot], xt[:, k_shot:], yt[:, k_shot:])


def check_tasks(tasks: Tasks | Sequence) -> Tasks:
    """``tasks`` as :class:`Tasks` of tensors, with every shape agreement checked (by name)."""
    if not isinstance(tasks, Tasks):
        if len(tasks) != 4:
            raise TypeError("tasks must be a Tasks tuple (x_support, y_support, x_query, y_query)")
        tasks = Tasks(*tasks)
    xs, ys, xq, yq = (tf.convert_to_tensor(t) for t in tasks[:4])
    for name, t in (("x_support", xs), ("y_support", ys), ("x_query", xq), ("y_query", yq)):
        if t.shape.rank is None or t.shape.rank < 3:
            raise ValueError(
                f"{name} must have shape [num_tasks, points, features...], got {t.shape}")
    if xs.shape[:2] != ys.shape[:2]:
        raise ValueError(
            f"x_support {xs.shape} and y_support {ys.shape} disagree on [num_tasks, points]")
    if xq.shape[:2] != yq.shape[:2]:
        raise ValueError(f"x_query {xq.shape} and y_query {yq.shape} disagree on "
                         "[num_tasks, points]")
    if xs.shape[0] != xq.shape[0]:
        raise ValueError(f"x_support has {xs.shape[0]} tasks but x_query has {xq.shape[0]}")
    if xs.shape[2:] != xq.shape[2:]:
        raise ValueError(f"x_support features {xs.shape[2:]} != x_query features {xq.shape[2:]}")
    return Tasks(xs, ys, xq, yq, tasks.amplitude, tasks.phase)
