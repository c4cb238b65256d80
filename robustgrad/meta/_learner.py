"""Meta-learners (MAML, first-order MAML, Reptile) and the pre-train / fine-tune baseline.

* ``"maml"`` -- Finn, Abbeel & Levine, *Model-Agnostic Meta-Learning for Fast Adaptation of Deep
  Networks*, ICML 2017: the outer gradient flows through the inner SGD steps (second order).
* ``"fomaml"`` -- the first-order approximation from the same paper.
* ``"reptile"`` -- Nichol, Achiam & Schulman, *On First-Order Meta-Learning Algorithms*, 2018: the
  meta-"gradient" is ``params - adapted_params`` averaged over tasks.

>>> from robustgrad.meta import SinusoidTasks, mlp
>>> learner = reptile(mlp([1, 8, 1], seed=0), inner_steps=2)
>>> out = learner.meta_step(SinusoidTasks(seed=0).sample(4))
>>> sorted(out), learner.trace_count
(['grad_norm', 'loss', 'pre_loss'], 1)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad.checks import choice, nonnegative, number, positive_int
from robustgrad.meta._adapt import (
    adapted_query_losses,
    batched_mse,
    batched_sgd_steps,
    check_grads,
    resolve_loss,
    sgd_steps,
    task_loss,
    tiled,
    vectorised,
)
from robustgrad.meta._models import FunctionalModel
from robustgrad.meta._tasks import Tasks, check_tasks

__all__ = ["METHODS", "MetaLearner", "finetune_mse", "first_order_maml", "maml", "pretrain",
           "reptile"]

METHODS = ("maml", "fomaml", "reptile")


def _default_adam():
    import keras

    return keras.optimizers.Adam(1e-3)


class MetaLearner(tf.Module):
    """MAML / first-order MAML / Reptile over a :class:`FunctionalModel`.

    Args:
      model: the learner (:class:`FunctionalModel`; :func:`mlp` or :func:`from_keras`).
      method: ``"maml"`` (second order), ``"fomaml"`` or ``"reptile"``.
      inner_lr: step size of the inner SGD (alpha; 0.01 in the MAML paper's sinusoid runs).
      inner_steps: inner SGD steps during meta-training (>= 1).
      outer_optimizer: a Keras optimizer for the meta-update (default ``Adam(1e-3)``).
      loss: ``"mse"`` or ``loss(pred, y) -> scalar``.

    Shapes: a meta-batch is :class:`Tasks` -- ``x_support [T, K, d]``, ``y_support [T, K, o]``,
    ``x_query [T, Q, d]``, ``y_query [T, Q, o]``, float32.

    Methods: ``adapt(x, y, steps)`` -> fast weights; ``meta_step(tasks)`` -> dict of scalar
    tensors (``loss``: mean query loss after adaptation, ``pre_loss``: before);
    ``fit(tasks_source, iterations, meta_batch_size)`` -> history; ``evaluate(tasks, steps)``.
    The inner loop is :func:`robustgrad.meta._adapt.sgd_steps` (or its task-batched twin when the
    model has a ``batched_apply`` and the loss is MSE); each public step is one ``tf.function``,
    traced once per input signature (``trace_count`` counts the meta-step's traces).
    """

    def __init__(self, model: FunctionalModel, method: str = "maml", inner_lr: float = 0.01,
                 inner_steps: int = 1, outer_optimizer: Any = None,
                 loss: str | Callable = "mse"):
        if not isinstance(model, FunctionalModel):
            raise TypeError("model must be a FunctionalModel (see meta.mlp / meta.from_keras), "
                            f"got {type(model).__name__}")
        choice(method, "method", METHODS)
        super().__init__(name=f"meta_{method}")
        self.model = model
        self.method = method
        self.inner_lr = number(inner_lr, "inner_lr", minimum=0, min_inclusive=False)
        self.inner_steps = positive_int(inner_steps, "inner_steps")
        self.loss_fn = resolve_loss(loss)
        self.outer_optimizer = _default_adam() if outer_optimizer is None else outer_optimizer
        self.outer_optimizer.build(self.model.params)
        self.trace_count = 0  # incremented at each trace of the compiled meta-step
        self._meta_step_fn = tf.function(self._meta_step_impl, reduce_retracing=True)
        self._adapt_fn = tf.function(self._adapt_impl, reduce_retracing=True)
        self._eval_fn = tf.function(self._eval_impl, reduce_retracing=True)
        self._grads_fn: Callable | None = None

    # -- adaptation ----------------------------------------------------------------------------
    def _adapt_impl(self, x, y, steps, lr):
        return sgd_steps(self.model, self.loss_fn, self.model.params, x, y, steps, lr)

    def adapt(self, x_support: Any, y_support: Any, steps: int | None = None,
              lr: float | None = None) -> list[tf.Tensor]:
        """Fast weights after ``steps`` SGD steps on one task (``x [K, d]``, ``y [K, o]``).

        Returns a list of tensors shaped like ``model.params``; evaluate them with
        ``model.apply(fast, x)``.
        """
        steps = self.inner_steps if steps is None else positive_int(steps, "steps")
        lr = self.inner_lr if lr is None else nonnegative(lr, "lr")
        return self._adapt_fn(tf.convert_to_tensor(x_support), tf.convert_to_tensor(y_support),
                              tf.constant(steps), tf.constant(lr, tf.float32))

    # -- meta step -----------------------------------------------------------------------------
    def _meta_grads_vectorised(self, xs, ys, xq, yq):
        model, meta = self.model, self.model.params
        n_tasks = tf.shape(xs)[0]
        pre = tf.reduce_mean(batched_mse(model, tiled(model, n_tasks), xq, yq))
        if self.method == "reptile":
            fast = batched_sgd_steps(model, tiled(model, n_tasks), xs, ys, self.inner_steps,
                                     self.inner_lr)
            q_loss = tf.reduce_mean(batched_mse(model, fast, xq, yq))
            grads = [v - tf.reduce_mean(f, axis=0) for v, f in zip(meta, fast)]
        else:
            with tf.GradientTape() as outer:
                fast = batched_sgd_steps(model, tiled(model, n_tasks), xs, ys, self.inner_steps,
                                         self.inner_lr, second_order=self.method == "maml")
                q_loss = tf.reduce_mean(batched_mse(model, fast, xq, yq))
            grads = outer.gradient(q_loss, meta)
            check_grads(grads, model.names, "the query loss after adaptation")
        return list(grads), {"loss": tf.cast(q_loss, tf.float32),
                             "pre_loss": tf.cast(pre, tf.float32)}

    def _meta_grads(self, xs, ys, xq, yq):
        if vectorised(self.model, self.loss_fn):
            return self._meta_grads_vectorised(xs, ys, xq, yq)
        model, loss_fn, meta = self.model, self.loss_fn, self.model.params
        n_tasks = tf.shape(xs)[0]
        acc = [tf.zeros_like(v) for v in meta]
        loss_sum = tf.constant(0.0)
        pre_sum = tf.constant(0.0)
        second = self.method == "maml"
        for t in tf.range(n_tasks):
            if self.method == "reptile":
                start = [tf.convert_to_tensor(v) for v in meta]
                fast = sgd_steps(model, loss_fn, start, xs[t], ys[t], self.inner_steps,
                                 self.inner_lr)
                q_loss = task_loss(model, loss_fn, fast, xq[t], yq[t])
                grads = [s - f for s, f in zip(start, fast)]
            else:
                with tf.GradientTape() as outer:
                    start = [tf.identity(v) for v in meta]
                    fast = sgd_steps(model, loss_fn, start, xs[t], ys[t], self.inner_steps,
                                     self.inner_lr, second_order=second)
                    q_loss = task_loss(model, loss_fn, fast, xq[t], yq[t])
                grads = outer.gradient(q_loss, meta)
                check_grads(grads, model.names, "the query loss after adaptation")
            pre = task_loss(model, loss_fn, [tf.convert_to_tensor(v) for v in meta], xq[t], yq[t])
            acc = [a + tf.cast(g, a.dtype) for a, g in zip(acc, grads)]
            loss_sum += tf.cast(q_loss, tf.float32)
            pre_sum += tf.cast(pre, tf.float32)
        n = tf.cast(n_tasks, tf.float32)
        meta_grads = [a / tf.cast(n, a.dtype) for a in acc]
        return meta_grads, {"loss": loss_sum / n, "pre_loss": pre_sum / n}

    def _meta_step_impl(self, xs, ys, xq, yq):
        self.trace_count += 1
        meta_grads, out = self._meta_grads(xs, ys, xq, yq)
        self.outer_optimizer.apply_gradients(zip(meta_grads, self.model.params))
        out["grad_norm"] = tf.cast(tf.linalg.global_norm(meta_grads), tf.float32)
        return out

    def meta_gradient(self, tasks: Tasks) -> list[tf.Tensor]:
        """The meta-gradient (list shaped like ``model.params``) on a meta-batch, without applying
        it: for ``"maml"`` the exact gradient of the mean post-adaptation query loss."""
        t = check_tasks(tasks)
        if self._grads_fn is None:
            self._grads_fn = tf.function(lambda *a: self._meta_grads(*a)[0],
                                         reduce_retracing=True)
        return self._grads_fn(t.x_support, t.y_support, t.x_query, t.y_query)

    def meta_step(self, tasks: Tasks) -> dict[str, tf.Tensor]:
        """One meta-update on a meta-batch; returns scalar tensors ``loss``, ``pre_loss``,
        ``grad_norm``."""
        t = check_tasks(tasks)
        return self._meta_step_fn(t.x_support, t.y_support, t.x_query, t.y_query)

    def fit(self, tasks_source: Any, iterations: int, meta_batch_size: int = 25,
            log_every: int = 0) -> dict[str, np.ndarray]:
        """Meta-train for ``iterations`` meta-steps on batches from ``tasks_source(num_tasks)``
        (e.g. a :class:`SinusoidTasks`). Returns ``{"loss": [...], "pre_loss": [...]}`` (numpy)."""
        iterations = positive_int(iterations, "iterations")
        meta_batch_size = positive_int(meta_batch_size, "meta_batch_size")
        log_every = positive_int(log_every, "log_every", minimum=0)
        sample = tasks_source.sample if hasattr(tasks_source, "sample") else tasks_source
        hist: dict[str, list] = {"loss": [], "pre_loss": []}
        for i in range(iterations):
            out = self.meta_step(sample(meta_batch_size))
            hist["loss"].append(out["loss"])
            hist["pre_loss"].append(out["pre_loss"])
            if log_every and (i + 1) % log_every == 0:
                print(f"[{self.method}] iter {i + 1}: query loss after adaptation "
                      f"{float(out['loss']):.4f} (before {float(out['pre_loss']):.4f})")
        return {k: np.array([float(v) for v in vals]) for k, vals in hist.items()}

    # -- evaluation ----------------------------------------------------------------------------
    def _eval_impl(self, xs, ys, xq, yq, steps, lr):
        return adapted_query_losses(self.model, self.loss_fn, xs, ys, xq, yq, steps, lr)

    def evaluate(self, tasks: Tasks, steps: int = 1, lr: float | None = None,
                 per_task: bool = False) -> tf.Tensor:
        """Query loss after ``steps`` (>= 0) inner SGD steps on each task's support set; the mean
        over tasks (or the ``[T]`` vector with ``per_task=True``). Meta-parameters unchanged."""
        steps = positive_int(steps, "steps", minimum=0)
        lr = self.inner_lr if lr is None else nonnegative(lr, "lr")
        losses = _query_losses(self._eval_fn, tasks, steps, lr)
        return losses if per_task else tf.reduce_mean(losses)


def _query_losses(compiled: Callable, tasks: Tasks, steps: int, lr: float) -> tf.Tensor:
    t = check_tasks(tasks)
    return compiled(t.x_support, t.y_support, t.x_query, t.y_query,
                    tf.constant(steps), tf.constant(lr, tf.float32))


def maml(model: FunctionalModel, inner_lr: float = 0.01, inner_steps: int = 1,
         outer_optimizer: Any = None, loss: str | Callable = "mse") -> MetaLearner:
    """Second-order MAML (Finn et al., 2017). See :class:`MetaLearner`."""
    return MetaLearner(model, "maml", inner_lr, inner_steps, outer_optimizer, loss)


def first_order_maml(model: FunctionalModel, inner_lr: float = 0.01, inner_steps: int = 1,
                     outer_optimizer: Any = None, loss: str | Callable = "mse") -> MetaLearner:
    """First-order MAML (Finn et al., 2017, section 5.2). See :class:`MetaLearner`."""
    return MetaLearner(model, "fomaml", inner_lr, inner_steps, outer_optimizer, loss)


def reptile(model: FunctionalModel, inner_lr: float = 0.01, inner_steps: int = 5,
            outer_optimizer: Any = None, loss: str | Callable = "mse") -> MetaLearner:
    """Reptile (Nichol et al., 2018). See :class:`MetaLearner`."""
    return MetaLearner(model, "reptile", inner_lr, inner_steps, outer_optimizer, loss)


# --------------------------------------------------------------------------------------------
# Baseline: pre-train on all tasks, fine-tune per task
# --------------------------------------------------------------------------------------------
def pretrain(model: FunctionalModel, tasks_source: Any, iterations: int, batch_tasks: int = 25,
             optimizer: Any = None, loss: str | Callable = "mse") -> np.ndarray:
    """The MAML paper's baseline: regress on points pooled from ``batch_tasks`` random tasks per
    step (no adaptation), for ``iterations`` steps. Returns the loss history."""
    iterations = positive_int(iterations, "iterations")
    batch_tasks = positive_int(batch_tasks, "batch_tasks")
    loss_fn = resolve_loss(loss)
    optimizer = _default_adam() if optimizer is None else optimizer
    sample = tasks_source.sample if hasattr(tasks_source, "sample") else tasks_source

    @tf.function(reduce_retracing=True)
    def step(x, y):
        x = tf.reshape(x, [-1] + x.shape[2:].as_list())
        y = tf.reshape(y, [-1] + y.shape[2:].as_list())
        with tf.GradientTape() as tape:
            value = task_loss(model, loss_fn, model.params, x, y)
        grads = tape.gradient(value, model.params)
        check_grads(grads, model.names, "the pre-training loss")
        optimizer.apply_gradients(zip(grads, model.params))
        return value

    hist = []
    for _ in range(iterations):
        t = sample(batch_tasks)
        hist.append(step(tf.concat([t.x_support, t.x_query], 1),
                         tf.concat([t.y_support, t.y_query], 1)))
    return np.array([float(h) for h in hist])


def finetune_mse(model: FunctionalModel, tasks: Tasks, steps: int = 1, lr: float = 0.01,
                 loss: str | Callable = "mse", per_task: bool = False) -> tf.Tensor:
    """Query loss of ``model`` after ``steps`` SGD steps of size ``lr`` on each support set
    (the evaluation used for both the meta-learned and the pre-trained model). The same inner
    loop as :meth:`MetaLearner.evaluate`; ``model`` is not changed.

    >>> from robustgrad.meta import SinusoidTasks, mlp
    >>> tasks = SinusoidTasks(seed=0).sample(4)
    >>> model = mlp([1, 8, 1], seed=0)
    >>> bool(finetune_mse(model, tasks, steps=0) == finetune_mse(model, tasks, steps=0, lr=1.0))
    True
    """
    if not isinstance(model, FunctionalModel):
        raise TypeError("model must be a FunctionalModel (see meta.mlp / meta.from_keras), "
                        f"got {type(model).__name__}")
    steps = positive_int(steps, "steps", minimum=0)
    lr = nonnegative(lr, "lr")
    loss_fn = resolve_loss(loss)

    def losses(xs, ys, xq, yq, n_steps, step_size):
        return adapted_query_losses(model, loss_fn, xs, ys, xq, yq, n_steps, step_size)

    out = _query_losses(tf.function(losses), tasks, steps, lr)
    return out if per_task else tf.reduce_mean(out)
