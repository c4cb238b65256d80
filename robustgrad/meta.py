"""Gradient-based meta-learning: MAML (second order), first-order MAML and Reptile.

The learner is *functional*: its parameters are a flat list of tensors and a function
``apply(params, x) -> predictions`` evaluates it, so the inner loop can produce "fast weights"
(plain tensors) that stay differentiable with respect to the meta-parameters. A
:class:`FunctionalModel` bundles ``apply`` with its ``tf.Variable`` meta-parameters; :func:`mlp`
builds one, :func:`from_keras` wraps a Keras 3 model (through ``model.stateless_call``).

Algorithms (all in :class:`MetaLearner`, chosen with ``method``):

* ``"maml"`` -- Finn, Abbeel & Levine, *Model-Agnostic Meta-Learning for Fast Adaptation of Deep
  Networks*, ICML 2017. The outer gradient flows through the inner SGD steps (second order: the
  inner gradient is taken under an outer ``tf.GradientTape``, so Hessian-vector products appear
  in the meta-gradient).
* ``"fomaml"`` -- the first-order approximation from the same paper: inner gradients are wrapped in
  ``tf.stop_gradient``; the meta-gradient is the query gradient at the adapted parameters.
* ``"reptile"`` -- Nichol, Achiam & Schulman, *On First-Order Meta-Learning Algorithms*, 2018: the
  meta-"gradient" is ``params - adapted_params`` averaged over tasks.

The inner loop is a ``tf.range`` loop (a ``tf.while_loop``) inside one ``tf.function`` per
method; the graph does not grow with the number of inner steps or tasks, and it is traced once per
input signature. The tasks of a meta-batch are adapted together when the model provides a
``batched_apply`` (parameters with a leading task axis, as :func:`mlp` does) and the loss is MSE;
otherwise they are visited by a second ``tf.range`` loop.

Tasks: :class:`SinusoidTasks` is the few-shot regression benchmark of the MAML paper
(amplitude ~ U[0.1, 5], phase ~ U[0, pi], x ~ U[-5, 5], K support points per task).

Example::

    >>> import robustgrad.meta as meta
    >>> tasks = meta.SinusoidTasks(k_shot=10, seed=0)
    >>> model = meta.mlp([1, 40, 40, 1], seed=0)
    >>> learner = meta.MetaLearner(model, method="maml", inner_lr=0.01, inner_steps=1)
    >>> history = learner.fit(tasks, iterations=20, meta_batch_size=4)
    >>> batch = tasks.sample(8)
    >>> mse = learner.evaluate(batch, steps=1)          # query MSE after one adaptation step
    >>> float(mse) > 0
    True
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

__all__ = [
    "FunctionalModel",
    "mlp",
    "from_keras",
    "Tasks",
    "SinusoidTasks",
    "split_tasks",
    "MetaLearner",
    "maml",
    "first_order_maml",
    "reptile",
    "pretrain",
    "finetune_mse",
]

METHODS = ("maml", "fomaml", "reptile")


# --------------------------------------------------------------------------------------------
# Functional models
# --------------------------------------------------------------------------------------------
class FunctionalModel(tf.Module):
    """A model as ``apply(params, x)`` plus its meta-parameters (``tf.Variable`` list).

    Args:
      apply: ``apply(params, x) -> y``; ``params`` is a list of tensors shaped like
        ``variables``; ``x`` ``[N, ...]`` float; returns ``[N, ...]``.
      variables: the meta-parameters, a list of ``tf.Variable``.
      names: optional names used in error messages (default: the variables' names).
      batched_apply: optional ``batched_apply(params, x)`` with a leading task axis on every
        parameter (``[T, *v.shape]``) and on ``x`` (``[T, N, ...]``); when given (as by
        :func:`mlp`), :class:`MetaLearner` adapts all tasks of a meta-batch at once instead of
        looping over them (same result, several times faster).

    Calling the model, ``model(x)``, evaluates it at its current variables.
    """

    def __init__(self, apply: Callable, variables: Sequence[tf.Variable],
                 names: Sequence[str] | None = None, name: str | None = None,
                 batched_apply: Callable | None = None):
        super().__init__(name=name)
        if not callable(apply):
            raise TypeError(f"apply must be callable, got {type(apply).__name__}")
        variables = list(variables)
        if not variables:
            raise ValueError("variables must be a non-empty list of tf.Variable")
        for i, v in enumerate(variables):
            if not isinstance(v, tf.Variable):
                raise TypeError(f"variables[{i}] must be a tf.Variable, got {type(v).__name__}")
        self.apply = apply
        self.batched_apply = batched_apply
        self.params = variables
        self.names = list(names) if names is not None else [
            v.name.split(":")[0] for v in variables]

    def __call__(self, x, training=False):
        del training
        return self.apply([tf.convert_to_tensor(v) for v in self.params], x)

    def get_weights(self):
        return [v.numpy() for v in self.params]

    def set_weights(self, weights):
        for v, w in zip(self.params, weights):
            v.assign(w)


def mlp(sizes: Sequence[int], activation: str | Callable = "relu", seed: int = 0,
        dtype=tf.float32) -> FunctionalModel:
    """A fully connected network as a :class:`FunctionalModel`.

    Args:
      sizes: layer widths including input and output, e.g. ``[1, 40, 40, 1]`` (MAML's sinusoid
        network).
      activation: name of a ``tf.nn`` activation (``"relu"``, ``"tanh"``, ``"softplus"``...) or a
        callable; not applied after the last layer.
      seed: initialisation seed (He-normal weights, zero biases).
      dtype: parameter dtype.

    Returns a model whose ``apply(params, x)`` maps ``x [N, sizes[0]]`` to ``[N, sizes[-1]]``.
    """
    sizes = [int(s) for s in sizes]
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"sizes must list at least two positive widths, got {sizes}")
    act = getattr(tf.nn, activation) if isinstance(activation, str) else activation
    rng = np.random.default_rng(seed)
    variables = []
    names = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = rng.normal(0.0, math.sqrt(2.0 / a), size=(a, b))
        variables.append(tf.Variable(tf.constant(w, dtype), name=f"dense_{i}/kernel"))
        variables.append(tf.Variable(tf.zeros([b], dtype), name=f"dense_{i}/bias"))
        names += [f"dense_{i}/kernel", f"dense_{i}/bias"]
    n_layers = len(sizes) - 1

    def apply(params, x):
        h = tf.convert_to_tensor(x, dtype)
        for i in range(n_layers):
            h = tf.matmul(h, params[2 * i]) + params[2 * i + 1]
            if i < n_layers - 1:
                h = act(h)
        return h

    def batched_apply(params, x):  # params [T, ...], x [T, N, d]
        h = tf.convert_to_tensor(x, dtype)
        for i in range(n_layers):
            h = tf.matmul(h, params[2 * i]) + params[2 * i + 1][:, None, :]
            if i < n_layers - 1:
                h = act(h)
        return h

    return FunctionalModel(apply, variables, names, name="mlp", batched_apply=batched_apply)


def from_keras(model) -> FunctionalModel:
    """Wrap a built Keras 3 model (TensorFlow backend) as a :class:`FunctionalModel`.

    ``apply(params, x)`` is ``model.stateless_call(params, non_trainable, x)``; the meta-parameters
    are the model's trainable variables (their underlying ``tf.Variable``), so meta-training
    updates the Keras model in place. Non-trainable state (batch-norm statistics) is read, not
    updated.
    """
    if not getattr(model, "built", False):
        raise ValueError("model must be built (call it once or give it an Input) before from_keras")
    tvars = list(model.trainable_variables)
    if not tvars:
        raise ValueError("model has no trainable variables")
    ntv = list(model.non_trainable_variables)

    def apply(params, x):
        y, _ = model.stateless_call(list(params), [v.value for v in ntv], x, training=False)
        return y

    return FunctionalModel(apply, [v.value for v in tvars], [v.path for v in tvars],
                           name="keras_functional")


# --------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------
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

    def __init__(self, k_shot: int = 10, k_query: int = 10, amplitude=(0.1, 5.0),
                 phase=(0.0, math.pi), x_range=(-5.0, 5.0), seed: int = 0):
        for name, v in (("k_shot", k_shot), ("k_query", k_query)):
            if int(v) != v or int(v) < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name, r in (("amplitude", amplitude), ("phase", phase), ("x_range", x_range)):
            if len(r) != 2 or not r[0] <= r[1]:
                raise ValueError(f"{name} must be a (low, high) pair with low <= high, got {r!r}")
        self.k_shot, self.k_query = int(k_shot), int(k_query)
        self.amplitude, self.phase, self.x_range = tuple(amplitude), tuple(phase), tuple(x_range)
        self.generator = tf.random.Generator.from_seed(seed)

    def sample(self, num_tasks: int, k_shot: int | None = None,
               k_query: int | None = None) -> Tasks:
        k = self.k_shot if k_shot is None else int(k_shot)
        q = self.k_query if k_query is None else int(k_query)
        g = self.generator
        amp = g.uniform([num_tasks], *self.amplitude)
        ph = g.uniform([num_tasks], *self.phase)
        xs = g.uniform([num_tasks, k, 1], *self.x_range)
        xq = g.uniform([num_tasks, q, 1], *self.x_range)
        f = lambda x: amp[:, None, None] * tf.sin(x - ph[:, None, None])  # noqa: E731
        return Tasks(xs, f(xs), xq, f(xq), amp, ph)

    def __call__(self, num_tasks):
        return self.sample(num_tasks)


def split_tasks(x, y, num_tasks: int, k_shot: int) -> Tasks:
    """Reshape flat data ``x [N, d]``, ``y [N, o]`` into ``num_tasks`` tasks of ``k_shot`` support
    points and ``N/num_tasks - k_shot`` query points (rows of a task are consecutive).

    Raises ``ValueError`` naming ``num_tasks``/``k_shot`` when ``N`` does not divide into the
    task shape.
    """
    x = tf.convert_to_tensor(x)
    y = tf.convert_to_tensor(y)
    n = int(x.shape[0])
    if int(y.shape[0]) != n:
        raise ValueError(f"x and y must have the same number of rows, got {n} and {y.shape[0]}")
    if num_tasks < 1 or n % num_tasks:
        raise ValueError(
            f"num_tasks={num_tasks} does not divide the batch of {n} rows into equal tasks")
    per = n // num_tasks
    if not 1 <= k_shot < per:
        raise ValueError(f"k_shot={k_shot} must be in [1, {per - 1}] for tasks of {per} rows")
    xt = tf.reshape(x, [num_tasks, per] + x.shape[1:].as_list())
    yt = tf.reshape(y, [num_tasks, per] + y.shape[1:].as_list())
    return Tasks(xt[:, :k_shot], yt[:, :k_shot], xt[:, k_shot:], yt[:, k_shot:])


# --------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------
def _mse(pred, y):
    return tf.reduce_mean(tf.square(pred - tf.cast(y, pred.dtype)))


def _resolve_loss(loss):
    if loss in (None, "mse"):
        return _mse
    if not callable(loss):
        raise TypeError(f"loss must be 'mse' or a callable loss(pred, y) -> scalar, got {loss!r}")
    return loss


def _check_scalar(value, what="loss"):
    value = tf.convert_to_tensor(value)
    if value.shape.rank is None or value.shape.rank != 0:
        raise ValueError(
            f"{what} must return a scalar (rank-0) tensor, got shape {value.shape}; reduce it "
            "(e.g. tf.reduce_mean) before returning")
    if not value.dtype.is_floating:
        raise TypeError(f"{what} must return a floating tensor, got {value.dtype.name}")
    return value


def _check_grads(grads, names, what):
    missing = [n for g, n in zip(grads, names) if g is None]
    if missing:
        raise ValueError(
            f"{what} is not differentiable with respect to parameter(s) {missing}: the gradient "
            "is None (a non-differentiable op such as argmax/round/cast, or a parameter the "
            "model does not use)")


def _check_positive_int(name, value):
    if isinstance(value, bool) or int(value) != value or int(value) <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_tasks(tasks: Tasks | Sequence) -> Tasks:
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


# --------------------------------------------------------------------------------------------
# Meta-learner
# --------------------------------------------------------------------------------------------
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
    """

    def __init__(self, model: FunctionalModel, method: str = "maml", inner_lr: float = 0.01,
                 inner_steps: int = 1, outer_optimizer=None, loss="mse"):
        super().__init__(name=f"meta_{method}")
        if not isinstance(model, FunctionalModel):
            raise TypeError("model must be a FunctionalModel (see meta.mlp / meta.from_keras), "
                            f"got {type(model).__name__}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        inner_lr = float(inner_lr)
        if not (inner_lr > 0 and math.isfinite(inner_lr)):
            raise ValueError(f"inner_lr must be a positive finite number, got {inner_lr!r}")
        self.model = model
        self.method = method
        self.inner_lr = inner_lr
        self.inner_steps = _check_positive_int("inner_steps", inner_steps)
        self.loss_fn = _resolve_loss(loss)
        if outer_optimizer is None:
            import keras

            outer_optimizer = keras.optimizers.Adam(1e-3)
        self.outer_optimizer = outer_optimizer
        self.outer_optimizer.build(self.model.params)
        self.trace_count = 0  # incremented at each trace of the compiled meta-step
        self._meta_step_fn = tf.function(self._meta_step_impl, reduce_retracing=True)
        self._adapt_fn = tf.function(self._adapt_impl, reduce_retracing=True)
        self._eval_fn = tf.function(self._eval_impl, reduce_retracing=True)
        self._grads_fn = None

    # -- inner loop ----------------------------------------------------------------------------
    def _task_loss(self, params, x, y, what="loss"):
        return _check_scalar(self.loss_fn(self.model.apply(params, x), y), what)

    def _inner_loop(self, params, x, y, steps, lr, second_order: bool):
        """``steps`` SGD steps from ``params`` on ``(x, y)``; a tf.while_loop (tf.range)."""
        params = list(params)
        names = self.model.names
        for _ in tf.range(steps):
            with tf.GradientTape() as tape:
                tape.watch(params)
                loss = self._task_loss(params, x, y, "loss")
            grads = tape.gradient(loss, params)
            _check_grads(grads, names, "the inner loss")
            if not second_order:
                grads = [tf.stop_gradient(g) for g in grads]
            params = [p - tf.cast(lr, p.dtype) * g for p, g in zip(params, grads)]
        return params

    def _adapt_impl(self, x, y, steps, lr):
        start = [tf.convert_to_tensor(v) for v in self.model.params]
        return self._inner_loop(start, x, y, steps, lr, second_order=False)

    def adapt(self, x_support, y_support, steps: int | None = None, lr: float | None = None):
        """Fast weights after ``steps`` SGD steps on one task (``x [K, d]``, ``y [K, o]``).

        Returns a list of tensors shaped like ``model.params``; evaluate them with
        ``model.apply(fast, x)``.
        """
        steps = self.inner_steps if steps is None else _check_positive_int("steps", steps)
        lr = self.inner_lr if lr is None else float(lr)
        return self._adapt_fn(tf.convert_to_tensor(x_support), tf.convert_to_tensor(y_support),
                              tf.constant(steps), tf.constant(lr, tf.float32))

    # -- meta step -----------------------------------------------------------------------------
    def _vectorised(self) -> bool:
        return self.model.batched_apply is not None and self.loss_fn is _mse

    def _batched_losses(self, params, x, y):  # per-task MSE [T]
        pred = self.model.batched_apply(params, x)
        err = tf.square(pred - tf.cast(y, pred.dtype))
        return tf.reduce_mean(tf.reshape(err, [tf.shape(err)[0], -1]), axis=1)

    def _batched_inner_loop(self, params, x, y, steps, lr, second_order: bool):
        params = list(params)
        for _ in tf.range(steps):
            with tf.GradientTape() as tape:
                tape.watch(params)
                # the sum over tasks: the gradient w.r.t. task t's slice is task t's own gradient
                loss = tf.reduce_sum(self._batched_losses(params, x, y))
            grads = tape.gradient(loss, params)
            _check_grads(grads, self.model.names, "the inner loss")
            if not second_order:
                grads = [tf.stop_gradient(g) for g in grads]
            params = [p - tf.cast(lr, p.dtype) * g for p, g in zip(params, grads)]
        return params

    def _tiled(self, n_tasks):
        return [tf.repeat(tf.convert_to_tensor(v)[None], n_tasks, axis=0)
                for v in self.model.params]

    def _meta_grads_vectorised(self, xs, ys, xq, yq):
        meta = self.model.params
        n_tasks = tf.shape(xs)[0]
        pre = tf.reduce_mean(self._batched_losses(self._tiled(n_tasks), xq, yq))
        if self.method == "reptile":
            fast = self._batched_inner_loop(self._tiled(n_tasks), xs, ys, self.inner_steps,
                                            self.inner_lr, second_order=False)
            q_loss = tf.reduce_mean(self._batched_losses(fast, xq, yq))
            grads = [v - tf.reduce_mean(f, axis=0) for v, f in zip(meta, fast)]
        else:
            with tf.GradientTape() as outer:
                fast = self._batched_inner_loop(self._tiled(n_tasks), xs, ys, self.inner_steps,
                                                self.inner_lr,
                                                second_order=self.method == "maml")
                q_loss = tf.reduce_mean(self._batched_losses(fast, xq, yq))
            grads = outer.gradient(q_loss, meta)
            _check_grads(grads, self.model.names, "the query loss after adaptation")
        return list(grads), {"loss": tf.cast(q_loss, tf.float32),
                             "pre_loss": tf.cast(pre, tf.float32)}

    def _meta_grads(self, xs, ys, xq, yq):
        if self._vectorised():
            return self._meta_grads_vectorised(xs, ys, xq, yq)
        meta = self.model.params
        n_tasks = tf.shape(xs)[0]
        acc = [tf.zeros_like(v) for v in meta]
        loss_sum = tf.constant(0.0)
        pre_sum = tf.constant(0.0)
        second = self.method == "maml"
        for t in tf.range(n_tasks):
            if self.method == "reptile":
                start = [tf.convert_to_tensor(v) for v in meta]
                fast = self._inner_loop(start, xs[t], ys[t], self.inner_steps, self.inner_lr,
                                        second_order=False)
                q_loss = self._task_loss(fast, xq[t], yq[t], "loss")
                grads = [s - f for s, f in zip(start, fast)]
            else:
                with tf.GradientTape() as outer:
                    start = [tf.identity(v) for v in meta]
                    fast = self._inner_loop(start, xs[t], ys[t], self.inner_steps,
                                            self.inner_lr, second_order=second)
                    q_loss = self._task_loss(fast, xq[t], yq[t], "loss")
                grads = outer.gradient(q_loss, meta)
                _check_grads(grads, self.model.names, "the query loss after adaptation")
            pre = self._task_loss([tf.convert_to_tensor(v) for v in meta], xq[t], yq[t])
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

    def meta_gradient(self, tasks: Tasks):
        """The meta-gradient (list shaped like ``model.params``) on a meta-batch, without applying
        it: for ``"maml"`` the exact gradient of the mean post-adaptation query loss."""
        t = _check_tasks(tasks)
        if self._grads_fn is None:
            self._grads_fn = tf.function(lambda *a: self._meta_grads(*a)[0],
                                         reduce_retracing=True)
        return self._grads_fn(t.x_support, t.y_support, t.x_query, t.y_query)

    def meta_step(self, tasks: Tasks) -> dict:
        """One meta-update on a meta-batch; returns scalar tensors ``loss``, ``pre_loss``,
        ``grad_norm``."""
        t = _check_tasks(tasks)
        return self._meta_step_fn(t.x_support, t.y_support, t.x_query, t.y_query)

    def fit(self, tasks_source, iterations: int, meta_batch_size: int = 25,
            log_every: int = 0) -> dict:
        """Meta-train for ``iterations`` meta-steps on batches from ``tasks_source(num_tasks)``
        (e.g. a :class:`SinusoidTasks`). Returns ``{"loss": [...], "pre_loss": [...]}`` (numpy)."""
        iterations = _check_positive_int("iterations", iterations)
        meta_batch_size = _check_positive_int("meta_batch_size", meta_batch_size)
        sample = tasks_source.sample if hasattr(tasks_source, "sample") else tasks_source
        hist = {"loss": [], "pre_loss": []}
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
        n_tasks = tf.shape(xs)[0]
        if self._vectorised():
            fast = self._batched_inner_loop(self._tiled(n_tasks), xs, ys, steps, lr, False)
            return self._batched_losses(fast, xq, yq)
        out = tf.TensorArray(self.model.params[0].dtype, size=n_tasks)
        for t in tf.range(n_tasks):
            start = [tf.convert_to_tensor(v) for v in self.model.params]
            fast = self._inner_loop(start, xs[t], ys[t], steps, lr, second_order=False)
            out = out.write(t, tf.cast(self._task_loss(fast, xq[t], yq[t]), out.dtype))
        return out.stack()

    def evaluate(self, tasks: Tasks, steps: int = 1, lr: float | None = None,
                 per_task: bool = False):
        """Query loss after ``steps`` (>= 0) inner SGD steps on each task's support set; the mean
        over tasks (or the ``[T]`` vector with ``per_task=True``). Meta-parameters unchanged."""
        if isinstance(steps, bool) or int(steps) != steps or steps < 0:
            raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
        t = _check_tasks(tasks)
        lr = self.inner_lr if lr is None else float(lr)
        losses = self._eval_fn(t.x_support, t.y_support, t.x_query, t.y_query,
                               tf.constant(int(steps)), tf.constant(lr, tf.float32))
        return losses if per_task else tf.reduce_mean(losses)


def maml(model, inner_lr=0.01, inner_steps=1, outer_optimizer=None, loss="mse") -> MetaLearner:
    """Second-order MAML (Finn et al., 2017). See :class:`MetaLearner`."""
    return MetaLearner(model, "maml", inner_lr, inner_steps, outer_optimizer, loss)


def first_order_maml(model, inner_lr=0.01, inner_steps=1, outer_optimizer=None,
                     loss="mse") -> MetaLearner:
    """First-order MAML (Finn et al., 2017, section 5.2). See :class:`MetaLearner`."""
    return MetaLearner(model, "fomaml", inner_lr, inner_steps, outer_optimizer, loss)


def reptile(model, inner_lr=0.01, inner_steps=5, outer_optimizer=None,
            loss="mse") -> MetaLearner:
    """Reptile (Nichol et al., 2018). See :class:`MetaLearner`."""
    return MetaLearner(model, "reptile", inner_lr, inner_steps, outer_optimizer, loss)


# --------------------------------------------------------------------------------------------
# Baseline: pre-train on all tasks, fine-tune per task
# --------------------------------------------------------------------------------------------
def pretrain(model: FunctionalModel, tasks_source, iterations: int, batch_tasks: int = 25,
             optimizer=None, loss="mse") -> np.ndarray:
    """The MAML paper's baseline: regress on points pooled from ``batch_tasks`` random tasks per
    step (no adaptation), for ``iterations`` steps. Returns the loss history."""
    iterations = _check_positive_int("iterations", iterations)
    loss_fn = _resolve_loss(loss)
    if optimizer is None:
        import keras

        optimizer = keras.optimizers.Adam(1e-3)
    sample = tasks_source.sample if hasattr(tasks_source, "sample") else tasks_source

    @tf.function(reduce_retracing=True)
    def step(x, y):
        x = tf.reshape(x, [-1] + x.shape[2:].as_list())
        y = tf.reshape(y, [-1] + y.shape[2:].as_list())
        with tf.GradientTape() as tape:
            value = _check_scalar(loss_fn(model.apply(model.params, x), y), "loss")
        grads = tape.gradient(value, model.params)
        _check_grads(grads, model.names, "the pre-training loss")
        optimizer.apply_gradients(zip(grads, model.params))
        return value

    hist = []
    for _ in range(iterations):
        t = sample(batch_tasks)
        hist.append(step(tf.concat([t.x_support, t.x_query], 1),
                         tf.concat([t.y_support, t.y_query], 1)))
    return np.array([float(h) for h in hist])


def finetune_mse(model: FunctionalModel, tasks: Tasks, steps: int = 1, lr: float = 0.01,
                 loss="mse", per_task: bool = False):
    """Query loss of ``model`` after ``steps`` SGD steps of size ``lr`` on each support set
    (the evaluation used for both the meta-learned and the pre-trained model)."""
    return MetaLearner(model, "fomaml", inner_lr=lr, inner_steps=max(int(steps), 1),
                       outer_optimizer=_NoOpOptimizer(), loss=loss).evaluate(
        tasks, steps=steps, per_task=per_task)


class _NoOpOptimizer:
    def build(self, variables):
        pass

    def apply_gradients(self, grads_and_vars):
        pass
