"""An agent's compiled functions, each traced and counted on its own: :func:`own_function`.

An agent compiles its methods with ``tf.function(own_function(self.method))`` (the rollout, the
update, DQN's collection and training steps, several iterations per call): the same as
``tf.function(self.method)``, except for how TensorFlow counts traces (below).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["own_function"]


class _OwnFunction:
    """A callable that calls ``method``; no ``__code__``, so ``tf.function`` keys its tracing
    statistics on this object itself (see :func:`own_function`)."""

    __slots__ = ("__name__", "__weakref__", "_method")

    def __init__(self, method: Callable):
        self._method = method
        self.__name__ = getattr(method, "__name__", "call")

    def __call__(self, *args):
        return self._method(*args)


def own_function(method: Callable) -> Callable:
    """``method`` behind a callable of its own, to give to ``tf.function``: one trace per agent,
    and each agent's compiled function counted on its own.

    TensorFlow counts traces for its retracing warning per *code object* of the Python function
    it compiles (``Function._get_key_for_call_stats``: the ``__code__`` of the function, or of a
    bound method's function, or of a closure -- equal for every closure made by one ``def``).
    The methods of many agents in one process (repeated ``train_many`` calls, ``--resume``,
    a sweep), one trace each, would all count as one function tracing again and again, and
    print "5 out of the last 5 calls ... triggered tf.function retracing". The object returned
    here has no ``__code__``, so TensorFlow counts it alone (weakly: the count goes with it).

    >>> import tensorflow as tf
    >>> class Scale:
    ...     def __init__(self, k):
    ...         self.fn = tf.function(own_function(self.call))
    ...         self.k = k
    ...     def call(self, x):
    ...         return x * self.k
    >>> [float(Scale(k).fn(tf.constant(2.0))) for k in range(3)]
    [0.0, 2.0, 4.0]
    """
    return _OwnFunction(method)
