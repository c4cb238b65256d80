"""Hypergradients: hypergradient-descent optimisers and hyper-parameter optimisation by
differentiating through unrolled training.

1. **Hypergradient descent** -- Baydin, Cornish, Martinez Rubio, Schmidt & Wood, *Online Learning
   Rate Adaptation with Hypergradient Descent*, ICLR 2018. The learning rate is itself updated by
   gradient descent on the training loss, using the dot product of consecutive update directions:

   * :class:`SGDHD`: ``alpha_t = alpha_{t-1} + beta * g_t . g_{t-1}``;
     ``theta_t = theta_{t-1} - alpha_t g_t``.
   * :class:`AdamHD`: ``alpha_t = alpha_{t-1} + beta * g_t . u_{t-1}`` with ``u`` the previous
     bias-corrected Adam direction ``m_hat / (sqrt(v_hat) + eps)``; then an Adam step with
     ``alpha_t``.

   Both are Keras 3 optimisers (subclasses of ``keras.optimizers.Optimizer``): use them in
   ``model.compile(optimizer=...)`` or with ``apply_gradients``. The dot product is global (over
   all variables), as in the paper; the current rate is ``optimizer.learning_rate``.

2. **Unrolled hyper-parameter optimisation** -- Maclaurin, Duvenaud & Adams, *Gradient-based
   Hyperparameter Optimization through Reversible Learning*, ICML 2015 (here by plain reverse-mode
   through a stored unroll, i.e. Domke 2012 / Franceschi et al. 2017 "reverse-mode hypergradient").
   :func:`unrolled_loss` runs ``T`` SGD steps with learning rate ``exp(log_lr)`` and weight decay
   ``exp(log_wd)`` inside one ``tf.function`` (a ``tf.range`` loop whose inner gradient is taken
   under the outer tape, so the outer gradient is second order), and returns the validation loss;
   :func:`hypergradient` differentiates it with respect to the hyper-parameters;
   :class:`UnrolledHyperOptimizer` does gradient descent on them.

Example::

    >>> import numpy as np, keras
    >>> from robustgrad import hyper
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer=hyper.SGDHD(learning_rate=0.01, hypergradient_lr=1e-3), loss="mse")
    >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    >>> _ = model.fit(x, x.sum(1, keepdims=True), epochs=3, verbose=0)
    >>> float(model.optimizer.learning_rate) != 0.01     # the rate adapted online
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from robustgrad.checks import nonnegative, number, positive_int, scalar_output
from robustgrad.data import load_digits
from robustgrad.meta import FunctionalModel, mlp
from robustgrad.tape import unrecorded

__all__ = [
    "SGDHD",
    "AdamHD",
    "HyperParams",
    "make_batches",
    "unrolled_loss",
    "hypergradient",
    "UnrolledHyperOptimizer",
    "digits_problem",
]


# --------------------------------------------------------------------------------------------
# Hypergradient-descent optimisers
# --------------------------------------------------------------------------------------------
class _HDMixin:
    """Shared machinery: a global hypergradient step on the learning-rate variable before the
    per-variable updates."""

    # given by keras.optimizers.Optimizer, the optimiser's __init__ and its build()
    _learning_rate: Any
    _prev_directions: list[Any]
    _last_hypergradient: Any
    hypergradient_lr: float
    _get_variable_index: Callable[[Any], int]
    update_step: Callable[..., Any]

    def _check_lr_variable(self):
        if not isinstance(self._learning_rate, keras.Variable):
            raise TypeError(
                f"{type(self).__name__} adapts its learning rate, so learning_rate must be a "
                "float, not a schedule or a callable")

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        del learning_rate
        h = tf.constant(0.0, tf.float32)
        for g, v in zip(grads, trainable_variables):
            prev = self._prev_directions[self._get_variable_index(v)]
            h += tf.cast(tf.reduce_sum(tf.cast(g, prev.dtype) * prev), tf.float32)
        new_lr = tf.cast(self._learning_rate, tf.float32) + self.hypergradient_lr * h
        self._learning_rate.assign(new_lr)
        self._last_hypergradient.assign(-h)
        for g, v in zip(grads, trainable_variables):
            self.update_step(g, v, new_lr)

    @property
    def hypergradient(self) -> Any:
        """The last hypergradient ``d f(theta_{t-1}) / d alpha`` (a scalar variable)."""
        return self._last_hypergradient


class SGDHD(_HDMixin, keras.optimizers.Optimizer):
    """SGD with hypergradient descent on the learning rate (SGD-HD, Baydin et al. 2018, alg. 2).

    Args:
      learning_rate: initial rate alpha_0 (float).
      hypergradient_lr: beta, the hypergradient step size (paper: 1e-3 for SGD-HD).
      **kwargs: Keras optimiser keywords (``weight_decay``, ``clipnorm``, ``name``...).

    Per step: ``alpha_t = alpha_{t-1} + beta * <g_t, g_{t-1}>`` (global dot product, float32),
    ``theta_t = theta_{t-1} - alpha_t g_t``. With ``hypergradient_lr=0`` it is plain SGD.
    """

    def __init__(self, learning_rate: float = 0.01, hypergradient_lr: float = 1e-3,
                 name: str = "sgd_hd", **kwargs: Any):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.hypergradient_lr = nonnegative(hypergradient_lr, "hypergradient_lr")
        self._check_lr_variable()

    def build(self, variables: list[tf.Variable]) -> None:
        """Create the slots for ``variables`` (once): each one's previous gradient and the last
        hypergradient."""
        if self.built:
            return
        super().build(variables)
        self._prev_directions = self.add_optimizer_variables(variables, "prev_gradient")
        self._last_hypergradient = self.add_variable((), name="hypergradient")

    def update_step(self, gradient: tf.Tensor, variable: tf.Variable, learning_rate: tf.Tensor) -> None:
        """``variable -= learning_rate * gradient``; keeps ``gradient`` for the next hypergradient."""
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        self.assign_sub(variable, ops.multiply(gradient, lr))
        self.assign(self._prev_directions[self._get_variable_index(variable)], gradient)

    def get_config(self) -> dict[str, Any]:
        """Keras' optimizer config plus ``hypergradient_lr``."""
        config = super().get_config()
        config.update({"hypergradient_lr": self.hypergradient_lr})
        return config


class AdamHD(_HDMixin, keras.optimizers.Optimizer):
    """Adam with hypergradient descent on the learning rate (Adam-HD, Baydin et al. 2018, alg. 4).

    Args:
      learning_rate: initial rate alpha_0 (float).
      hypergradient_lr: beta (the paper uses 1e-7 with alpha_0 = 1e-3 on its CNN/MLP problems;
        larger values adapt faster).
      beta_1, beta_2, epsilon: Adam's constants.
      **kwargs: Keras optimiser keywords.

    Per step: ``alpha_t = alpha_{t-1} + beta * <g_t, u_{t-1}>`` with
    ``u = m_hat / (sqrt(v_hat) + epsilon)`` the previous Adam direction, then
    ``theta_t = theta_{t-1} - alpha_t u_t``.
    """

    def __init__(self, learning_rate: float = 0.001, hypergradient_lr: float = 1e-7,
                 beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7,
                 name: str = "adam_hd", **kwargs: Any):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.hypergradient_lr = nonnegative(hypergradient_lr, "hypergradient_lr")
        self.beta_1 = number(beta_1, "beta_1", minimum=0, maximum=1, max_inclusive=False)
        self.beta_2 = number(beta_2, "beta_2", minimum=0, maximum=1, max_inclusive=False)
        self.epsilon = number(epsilon, "epsilon", minimum=0, min_inclusive=False)
        self._check_lr_variable()

    def build(self, variables: list[tf.Variable]) -> None:
        """Create the slots for ``variables`` (once): each one's Adam moments and previous
        direction, and the last hypergradient."""
        if self.built:
            return
        super().build(variables)
        self._momentums, self._velocities, self._prev_directions = self.add_optimizer_variables(
            variables, ["momentum", "velocity", "prev_direction"])
        self._last_hypergradient = self.add_variable((), name="hypergradient")

    def update_step(self, gradient: tf.Tensor, variable: tf.Variable, learning_rate: tf.Tensor) -> None:
        """One Adam step of ``variable`` at ``learning_rate``; keeps its direction ``u`` for the
        next hypergradient."""
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        step = ops.cast(self.iterations + 1, dtype)
        b1p = ops.power(ops.cast(self.beta_1, dtype), step)
        b2p = ops.power(ops.cast(self.beta_2, dtype), step)
        i = self._get_variable_index(variable)
        m, v = self._momentums[i], self._velocities[i]
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        m_hat = ops.divide(m, 1 - b1p)
        v_hat = ops.divide(v, 1 - b2p)
        direction = ops.divide(m_hat, ops.add(ops.sqrt(v_hat), self.epsilon))
        self.assign_sub(variable, ops.multiply(lr, direction))
        self.assign(self._prev_directions[i], direction)

    def get_config(self) -> dict[str, Any]:
        """Keras' optimizer config plus ``hypergradient_lr``, ``beta_1``, ``beta_2``, ``epsilon``."""
        config = super().get_config()
        config.update({"hypergradient_lr": self.hypergradient_lr, "beta_1": self.beta_1,
                       "beta_2": self.beta_2, "epsilon": self.epsilon})
        return config


# --------------------------------------------------------------------------------------------
# Unrolled hyper-parameter optimisation
# --------------------------------------------------------------------------------------------
class HyperParams(NamedTuple):
    """Log-parametrised hyper-parameters (positive after ``exp``): scalar float tensors."""

    log_lr: tf.Tensor
    log_wd: tf.Tensor


def make_batches(num_examples: int, batch_size: int, steps: int, seed: int = 0) -> np.ndarray:
    """A fixed ``[steps, batch_size]`` int32 array of minibatch indices (epochs of random
    permutations), so that the unrolled loss is a deterministic function of the hyper-parameters.

    >>> b = make_batches(5, 2, 3, seed=0)
    >>> b.shape, b.dtype, sorted(b[:2].ravel().tolist()) == sorted(set(b[:2].ravel().tolist()))
    ((3, 2), dtype('int32'), True)
    """
    steps = positive_int(steps, "steps")
    batch_size = positive_int(batch_size, "batch_size")
    if batch_size > num_examples:
        raise ValueError(f"batch_size={batch_size} exceeds the {num_examples} training examples")
    rng = np.random.default_rng(seed)
    per_epoch = num_examples // batch_size
    out: list[np.ndarray] = []
    while len(out) < steps:
        perm = rng.permutation(num_examples)
        out += [perm[i * batch_size:(i + 1) * batch_size] for i in range(per_epoch)]
    return np.asarray(out[:steps], np.int32)


def _xent(logits, y):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(y, tf.int32), logits=logits))


def unrolled_loss(model: FunctionalModel, params0: Any, hparams: HyperParams, x_train: Any,
                  y_train: Any, x_val: Any, y_val: Any, batches: Any,
                  loss: Callable | None = None,
                  outer_tape: tf.GradientTape | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """Validation loss after ``T = len(batches)`` SGD steps from ``params0``.

    Inner update (``lr = exp(log_lr)``, ``wd = exp(log_wd)``)::

        theta <- theta - lr * (grad L_train(theta; batch_t) + wd * theta)

    Args:
      model: a :class:`robustgrad.meta.FunctionalModel` (``apply(params, x)``).
      params0: initial parameters, list of tensors (not differentiated).
      hparams: :class:`HyperParams` of scalar tensors (watched by the caller's tape).
      x_train: ``[N, ...]`` training inputs.
      y_train: ``[N]`` int labels (or targets for a custom loss).
      x_val: validation inputs, shaped like ``x_train``.
      y_val: validation labels, like ``y_train``.
      batches: ``[T, B]`` int32 indices into the training set (see :func:`make_batches`).
      loss: ``loss(pred, y) -> scalar``; default sparse softmax cross-entropy on logits.
      outer_tape: the tape differentiating with respect to ``hparams``; the bookkeeping of the
        per-step training loss runs under :func:`robustgrad.unrecorded` (``stop_recording``) on
        it, so no outer gradient flows through it.

    Returns ``(val_loss, train_losses [T])``. Call it inside a ``tf.function`` (as
    :func:`hypergradient` does): the unroll is a ``tf.range`` loop.
    """
    loss_fn = loss or _xent
    batches = tf.convert_to_tensor(batches, tf.int32)
    lr = tf.exp(hparams.log_lr)
    wd = tf.exp(hparams.log_wd)
    params = [tf.convert_to_tensor(p) for p in params0]
    steps = tf.shape(batches)[0]
    record = tf.TensorArray(tf.float32, size=steps)
    for t in tf.range(steps):
        idx = batches[t]
        xb = tf.gather(x_train, idx)
        yb = tf.gather(y_train, idx)
        with tf.GradientTape() as inner:
            inner.watch(params)
            train_loss = scalar_output(loss_fn(model.apply(params, xb), yb), "loss")
        grads = inner.gradient(train_loss, params)
        missing = [n for g, n in zip(grads, model.names) if g is None]
        if missing:
            raise ValueError(f"the training loss is not differentiable with respect to {missing}")
        params = [p - tf.cast(lr, p.dtype) * (g + tf.cast(wd, p.dtype) * p)
                  for p, g in zip(params, grads)]
        # bookkeeping: no outer gradient may flow through the recorded training loss
        with unrecorded(*([outer_tape] if outer_tape is not None else [])):
            record = record.write(t, tf.cast(train_loss, tf.float32))
    val = scalar_output(loss_fn(model.apply(params, x_val), y_val), "loss")
    return val, record.stack()


def hypergradient(model: FunctionalModel, params0: Any, hparams: HyperParams, x_train: Any,
                  y_train: Any, x_val: Any, y_val: Any, batches: Any,
                  loss: Callable | None = None) -> tuple[tf.Tensor, HyperParams]:
    """``(val_loss, HyperParams of d val_loss / d log_lr, d log_wd)`` through the unroll.

    Not compiled by itself; :class:`UnrolledHyperOptimizer` wraps it in a ``tf.function``.
    """
    hp = HyperParams(*(tf.convert_to_tensor(h) for h in hparams))
    with tf.GradientTape() as outer:
        outer.watch(list(hp))
        val, _ = unrolled_loss(model, params0, hp, x_train, y_train, x_val, y_val, batches,
                               loss, outer_tape=outer)
    g = outer.gradient(val, list(hp))
    for name, gi in zip(HyperParams._fields, g):
        if gi is None:
            raise ValueError(f"the validation loss does not depend on {name}")
    return val, HyperParams(*g)


class UnrolledHyperOptimizer(tf.Module):
    """Gradient descent on ``log(learning_rate)`` and ``log(weight_decay)`` through ``T`` unrolled
    SGD steps of ``model`` on ``(x_train, y_train)``, minimising the loss on ``(x_val, y_val)``.

    Args:
      model: :class:`robustgrad.meta.FunctionalModel`; its current variables are the fixed
        initial parameters of every unroll (they are not modified).
      x_train, y_train, x_val, y_val: float features ``[N, ...]`` and int labels ``[N]``.
      steps: T, the unroll length (>= 1).
      batch_size: inner minibatch size.
      learning_rate, weight_decay: initial hyper-parameter values (> 0).
      outer_lr: Adam step size on the log hyper-parameters.
      seed: minibatch order.

    ``step()`` does one outer update and returns ``{"val_loss", "learning_rate", "weight_decay",
    "grad_log_lr", "grad_log_wd"}``; ``fit(n)`` runs n of them and returns the history.
    """

    def __init__(self, model: FunctionalModel, x_train: Any, y_train: Any, x_val: Any,
                 y_val: Any, *, steps: int = 20, batch_size: int = 64,
                 learning_rate: float = 0.01, weight_decay: float = 1e-3, outer_lr: float = 0.1,
                 seed: int = 0, loss: Callable | None = None):
        super().__init__(name="unrolled_hyper")
        steps = positive_int(steps, "steps")
        learning_rate = number(learning_rate, "learning_rate (optimised in log space)",
                               minimum=0, min_inclusive=False)
        weight_decay = number(weight_decay, "weight_decay (optimised in log space)",
                              minimum=0, min_inclusive=False)
        outer_lr = number(outer_lr, "outer_lr", minimum=0, min_inclusive=False)
        x_train = tf.convert_to_tensor(x_train)
        x_val = tf.convert_to_tensor(x_val)
        if int(x_train.shape[0]) != int(np.shape(y_train)[0]):
            raise ValueError(f"x_train has {x_train.shape[0]} rows but y_train has "
                             f"{np.shape(y_train)[0]}")
        if int(x_val.shape[0]) != int(np.shape(y_val)[0]):
            raise ValueError(f"x_val has {x_val.shape[0]} rows but y_val has {np.shape(y_val)[0]}")
        self.model = model
        self.data = (x_train, tf.convert_to_tensor(y_train), x_val, tf.convert_to_tensor(y_val))
        self.params0 = [tf.constant(v.numpy()) for v in model.params]
        self.batches = tf.constant(make_batches(int(x_train.shape[0]), batch_size, steps, seed))
        self.log_lr = tf.Variable(math.log(learning_rate), dtype=tf.float32, name="log_lr")
        self.log_wd = tf.Variable(math.log(weight_decay), dtype=tf.float32, name="log_wd")
        self.optimizer = keras.optimizers.Adam(outer_lr)
        self.optimizer.build([self.log_lr, self.log_wd])
        self.loss = loss
        self.trace_count = 0
        self._step = tf.function(self._step_impl)
        self._value = tf.function(self._value_impl)

    def _value_impl(self, log_lr, log_wd):
        hp = HyperParams(tf.cast(log_lr, tf.float32), tf.cast(log_wd, tf.float32))
        return unrolled_loss(self.model, self.params0, hp, *self.data, self.batches, self.loss)[0]

    def _step_impl(self):
        self.trace_count += 1
        hp = HyperParams(tf.convert_to_tensor(self.log_lr), tf.convert_to_tensor(self.log_wd))
        val, g = hypergradient(self.model, self.params0, hp, *self.data, self.batches, self.loss)
        self.optimizer.apply_gradients(zip(list(g), [self.log_lr, self.log_wd]))
        return {"val_loss": val, "grad_log_lr": g.log_lr, "grad_log_wd": g.log_wd}

    def validation_loss(self, learning_rate: float | None = None,
                        weight_decay: float | None = None) -> float:
        """Validation loss after the unroll at the given (default: current) hyper-parameters."""
        log_lr = self.log_lr if learning_rate is None else math.log(
            number(learning_rate, "learning_rate", minimum=0, min_inclusive=False))
        log_wd = self.log_wd if weight_decay is None else math.log(
            number(weight_decay, "weight_decay", minimum=0, min_inclusive=False))
        return float(self._value(tf.constant(log_lr, tf.float32), tf.constant(log_wd, tf.float32)))

    @property
    def learning_rate(self) -> float:
        """The current learning rate, ``exp(log_lr)``."""
        return float(tf.exp(self.log_lr))

    @property
    def weight_decay(self) -> float:
        """The current weight decay, ``exp(log_wd)``."""
        return float(tf.exp(self.log_wd))

    def step(self) -> dict[str, float]:
        """One outer update; returns ``val_loss``, ``grad_log_lr``, ``grad_log_wd`` (before the
        update) and the updated ``learning_rate`` and ``weight_decay``."""
        out = {k: float(v) for k, v in self._step().items()}
        out.update(learning_rate=self.learning_rate, weight_decay=self.weight_decay)
        return out

    def fit(self, iterations: int, log_every: int = 0) -> dict[str, np.ndarray]:
        """Run ``iterations`` outer updates (printing every ``log_every``, 0: never); returns the
        history of :meth:`step`'s values, one array per key."""
        iterations = positive_int(iterations, "iterations")
        hist: dict[str, list] = {}
        for i in range(iterations):
            out = self.step()
            for k, v in out.items():
                hist.setdefault(k, []).append(v)
            if log_every and (i + 1) % log_every == 0:
                print(f"[hyper] outer {i + 1}: val loss {out['val_loss']:.4f} "
                      f"lr {out['learning_rate']:.4g} wd {out['weight_decay']:.3g}")
        return {k: np.array(v) for k, v in hist.items()}


def digits_problem(hidden: int = 32, seed: int = 0, n_val: int | None = None) -> tuple[
        FunctionalModel, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The small digits problem used by the tests and benchmarks: ``(model, (x_tr, y_tr),
    (x_val, y_val))`` with a ``[64, hidden, 10]`` tanh MLP and flattened float32 inputs.
    Validation is the held-out split of :func:`robustgrad.data.load_digits`."""
    (xtr, ytr), (xva, yva) = load_digits()
    xtr = np.asarray(xtr, np.float32).reshape(len(xtr), -1)
    xva = np.asarray(xva, np.float32).reshape(len(xva), -1)
    if n_val is not None:
        xva, yva = xva[:n_val], yva[:n_val]
    model = mlp([xtr.shape[1], hidden, 10], activation="tanh", seed=seed)
    return model, (xtr, np.asarray(ytr, np.int64)), (xva, np.asarray(yva, np.int64))
