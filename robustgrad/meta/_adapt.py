"""The inner loop of meta-learning: ``steps`` SGD steps from given parameters, as functions.

Both :class:`~robustgrad.meta.MetaLearner` (adaptation during meta-training and evaluation) and
:func:`~robustgrad.meta.finetune_mse` (the fine-tuning baseline) adapt through these functions.
Each loop is a ``tf.range`` loop: inside a ``tf.function`` it becomes one ``tf.while_loop``, so the
graph does not grow with the number of steps. With ``second_order=True`` the inner gradients stay
on the caller's outer tape (MAML); otherwise they are wrapped in ``tf.stop_gradient``.

>>> import tensorflow as tf
>>> from robustgrad.meta import mlp
>>> model = mlp([1, 1], seed=0)
>>> x, y = tf.ones((4, 1)), tf.ones((4, 1))
>>> fast = sgd_steps(model, mse, model.params, x, y, steps=50, lr=0.1)
>>> round(float(mse(model.apply(fast, x), y)), 4)        # fits y = 1 exactly
0.0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from robustgrad.checks import scalar_output

if TYPE_CHECKING:
    from robustgrad.meta._models import FunctionalModel

__all__ = ["adapted_query_losses", "batched_mse", "batched_sgd_steps", "check_grads", "mse",
           "resolve_loss", "sgd_steps", "tiled"]


def mse(pred: tf.Tensor, y: Any) -> tf.Tensor:
    """Mean squared error, a float scalar in ``pred``'s dtype."""
    return tf.reduce_mean(tf.square(pred - tf.cast(y, pred.dtype)))


def resolve_loss(loss: str | Callable | None) -> Callable:
    """``"mse"`` (or None) -> :func:`mse`; a callable ``loss(pred, y) -> scalar`` unchanged."""
    if loss is None or (isinstance(loss, str) and loss == "mse"):
        return mse
    if not callable(loss):
        raise TypeError(f"loss must be 'mse' or a callable loss(pred, y) -> scalar, got {loss!r}")
    return loss


def check_grads(grads: Sequence[Any], names: Sequence[str], what: str) -> None:
    """Raise ``ValueError`` naming every parameter whose gradient is None."""
    missing = [n for g, n in zip(grads, names) if g is None]
    if missing:
        raise ValueError(
            f"{what} is not differentiable with respect to parameter(s) {missing}: the gradient "
            "is None (a non-differentiable op such as argmax/round/cast, or a parameter the "
            "model does not use)")


def task_loss(model: FunctionalModel, loss_fn: Callable, params: Sequence[Any], x: tf.Tensor,
              y: tf.Tensor, what: str = "loss") -> tf.Tensor:
    """``loss_fn(model.apply(params, x), y)``, checked to be a floating scalar."""
    return scalar_output(loss_fn(model.apply(params, x), y), what)


def _sgd_loop(model: FunctionalModel, loss_of: Callable, params: list, steps: int | tf.Tensor,
              lr: float | tf.Tensor, second_order: bool) -> list[tf.Tensor]:
    """``steps`` SGD steps on ``loss_of(params)``; first order stops the inner gradients."""
    for _ in tf.range(steps):
        with tf.GradientTape() as tape:
            tape.watch(params)
            loss = loss_of(params)
        grads = tape.gradient(loss, params)
        check_grads(grads, model.names, "the inner loss")
        if not second_order:
            grads = [tf.stop_gradient(g) for g in grads]
        params = [p - tf.cast(lr, p.dtype) * g for p, g in zip(params, grads)]
    return params


def sgd_steps(model: FunctionalModel, loss_fn: Callable, params: Sequence[Any], x: tf.Tensor,
              y: tf.Tensor, steps: int | tf.Tensor, lr: float | tf.Tensor,
              second_order: bool = False) -> list[tf.Tensor]:
    """Fast weights after ``steps`` SGD steps of size ``lr`` from ``params`` on one task.

    ``params``: tensors shaped like ``model.params``; ``x [K, d]``, ``y [K, o]``; ``steps`` an int
    (or int32 scalar tensor), ``lr`` a float. Returns a list shaped like ``params``.
    """
    params = [tf.convert_to_tensor(p) for p in params]
    return _sgd_loop(model, lambda ps: task_loss(model, loss_fn, ps, x, y, "loss"), params,
                     steps, lr, second_order)


def tiled(model: FunctionalModel, n_tasks: int | tf.Tensor) -> list[tf.Tensor]:
    """``model.params`` repeated along a new leading task axis: ``[T, *v.shape]`` each."""
    return [tf.repeat(tf.convert_to_tensor(v)[None], n_tasks, axis=0) for v in model.params]


def batched_mse(model: FunctionalModel, params: Sequence[Any], x: tf.Tensor,
                y: tf.Tensor) -> tf.Tensor:
    """Per-task MSE ``[T]`` of ``model.batched_apply(params, x)`` (task axis first everywhere)."""
    if model.batched_apply is None:
        raise ValueError(f"batched_mse needs a model with a batched_apply (as mlp builds), got "
                         f"{model.name!r}")
    pred = model.batched_apply(params, x)
    err = tf.square(pred - tf.cast(y, pred.dtype))
    return tf.reduce_mean(tf.reshape(err, [tf.shape(err)[0], -1]), axis=1)


def batched_sgd_steps(model: FunctionalModel, params: Sequence[Any], x: tf.Tensor, y: tf.Tensor,
                      steps: int | tf.Tensor, lr: float | tf.Tensor,
                      second_order: bool = False) -> list[tf.Tensor]:
    """:func:`sgd_steps` on every task of a meta-batch at once, for the MSE loss.

    ``params [T, *v.shape]`` (see :func:`tiled`), ``x [T, K, d]``, ``y [T, K, o]``; the loss is
    the sum of the per-task MSEs, whose gradient with respect to task t's slice is task t's own.
    """
    params = list(params)
    return _sgd_loop(model, lambda ps: tf.reduce_sum(batched_mse(model, ps, x, y)), params,
                     steps, lr, second_order)


def vectorised(model: FunctionalModel, loss_fn: Callable) -> bool:
    """Whether a meta-batch can be adapted in one batched loop (a ``batched_apply`` and MSE)."""
    return model.batched_apply is not None and loss_fn is mse


def adapted_query_losses(model: FunctionalModel, loss_fn: Callable, xs: tf.Tensor, ys: tf.Tensor,
                         xq: tf.Tensor, yq: tf.Tensor, steps: int | tf.Tensor,
                         lr: float | tf.Tensor) -> tf.Tensor:
    """Per-task query loss ``[T]`` after ``steps`` first-order SGD steps on each support set,
    starting from the model's current variables (which are not changed)."""
    n_tasks = tf.shape(xs)[0]
    if vectorised(model, loss_fn):
        fast = batched_sgd_steps(model, tiled(model, n_tasks), xs, ys, steps, lr)
        return batched_mse(model, fast, xq, yq)
    out = tf.TensorArray(model.params[0].dtype, size=n_tasks)
    for t in tf.range(n_tasks):
        fast = sgd_steps(model, loss_fn, model.params, xs[t], ys[t], steps, lr)
        out = out.write(t, tf.cast(task_loss(model, loss_fn, fast, xq[t], yq[t]), out.dtype))
    return out.stack()
