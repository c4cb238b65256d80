"""The one iterative attack engine: projected steepest ascent with restarts, in one graph.

:func:`iterative_loop` builds the loop of PGD, BIM and MIM (Madry et al. 2018; Kurakin et al.
2017; Dong et al. 2018) over a *value function* ``value_fn(x_adv, y, y_true) -> (objective [B],
success [B] bool)``. It validates nothing and converts nothing, so it can be called inside another
``tf.function`` (adversarial training crafts with it inside ``train_step``).
:func:`compile_iterative` wraps it in a ``tf.function`` with a relaxed batch dimension for the
public attacks, which validate their arguments eagerly first (:func:`attacks._base.prepare`).

The per-example helpers used by several attacks live here too: :func:`expand_rows` (a ``[B]``
vector shaped to broadcast against ``x [B, ...]``) and :func:`keep_best` (the worst case per
example across restarts: success first, then the higher objective).

>>> import tensorflow as tf
>>> w = tf.constant([[1.0], [-2.0]])
>>> def value_fn(xa, y, y_true):  # maximise the linear score; never "successful"
...     return tf.reshape(xa @ w, [-1]), tf.zeros([tf.shape(xa)[0]], tf.bool)
>>> loop = iterative_loop(value_fn, norm="linf", steps=3, rand_init=False)
>>> x = tf.constant([[0.5, 0.5]])
>>> x_adv, grad_rows, forward_rows = loop(x, tf.zeros([1], tf.int64), tf.zeros([1], tf.int64),
...                                       0.1, 0.05, tf.constant(0.0), tf.constant(1.0),
...                                       tf.constant([0, 0]))
>>> [round(float(v), 3) for v in x_adv[0]], int(grad_rows), int(forward_rows)
([0.6, 0.4], 3, 0)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad.convolution import forward_input_gradients
from robustgrad.input_gradients import zero_gradient_message

from ._base import relaxed_spec
from .norms import clip_to_bounds, project, random_in_ball, steepest_ascent

__all__ = ["compile_iterative", "expand_rows", "iterative_loop", "keep_best", "warn_zero_gradient",
           "zero_gradient_rows"]

ValueFn = Callable[[tf.Tensor, Any, tf.Tensor], "tuple[tf.Tensor, tf.Tensor]"]
InitFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
NoiseFn = Callable[[tf.Tensor, Any], tf.Tensor]


def expand_rows(values: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
    """A per-example ``[B]`` tensor reshaped to ``[B, 1, ..., 1]`` to broadcast against ``x``.

    >>> expand_rows(tf.constant([True, False]), tf.zeros([2, 3, 4])).shape.as_list()
    [2, 1, 1]
    """
    ones = tf.ones([tf.rank(x) - 1], tf.int32)
    return tf.reshape(values, tf.concat([tf.shape(values), ones], 0))


def keep_best(best_x: tf.Tensor, best_obj: tf.Tensor, best_succ: tf.Tensor, x_adv: tf.Tensor,
              obj: tf.Tensor, succ: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Per example, keep ``x_adv`` over ``best_x`` when it succeeds and the best did not, or
    when both agree on success and its objective is higher. Returns the new
    ``(best_x, best_obj, best_succ)``; shapes ``[B, ...]``, ``[B]``, ``[B]`` bool.

    >>> bx, bo, bs = keep_best(tf.zeros([2, 1]), tf.constant([0.0, 5.0]),
    ...                        tf.constant([False, False]), tf.ones([2, 1]),
    ...                        tf.constant([1.0, 1.0]), tf.constant([False, True]))
    >>> bx.numpy().ravel().tolist(), bo.numpy().tolist(), bs.numpy().tolist()
    ([1.0, 1.0], [1.0, 1.0], [False, True])
    """
    better = tf.logical_or(
        tf.logical_and(succ, tf.logical_not(best_succ)),
        tf.logical_and(tf.equal(succ, best_succ), obj > best_obj))
    new_x = tf.where(expand_rows(better, x_adv), x_adv, best_x)
    return new_x, tf.where(better, obj, best_obj), tf.logical_or(best_succ, succ)


def zero_gradient_rows(g: tf.Tensor) -> tf.Tensor:
    """The number of examples (rows of ``g [B, ...]``) whose gradient is identically zero, int64.

    >>> int(zero_gradient_rows(tf.constant([[0.0, 0.0], [0.0, 1.0]])))
    1
    """
    flat = tf.reshape(g, [tf.shape(g)[0], -1])
    return tf.reduce_sum(tf.cast(tf.reduce_all(tf.equal(flat, 0), axis=1), tf.int64))


def warn_zero_gradient(zero: int, total: int, stacklevel: int = 2) -> None:
    """Warn (:func:`robustgrad.input_gradients.zero_gradient_message`) when ``zero`` of
    ``total`` examples had an identically zero input gradient: the one check of the gradient
    attacks (the iterative loop here, FGSM/FGM), called eagerly with the counts."""
    message = zero_gradient_message(int(zero), int(total))
    if message:
        warnings.warn(message, UserWarning, stacklevel=stacklevel + 1)


def iterative_loop(value_fn: ValueFn, *, norm: str, steps: int, restarts: int = 1,
                   rand_init: bool = True, init: InitFn | None = None, early_stop: bool = False,
                   momentum: float | None = None, l1_top_k: Any = None,
                   gradient_noise: NoiseFn | None = None, count_zero: bool = False) -> Callable:
    """The PGD/BIM/MIM loop as a plain graph-building function (no validation, no tracing).

    Returns ``loop(x, y, y_true, eps, step_size, lo, hi, seed) -> (x_adv, grad_rows,
    forward_rows)``: ``x [B, ...]`` floating, ``y``/``y_true`` passed through to ``value_fn``,
    ``eps`` and ``step_size`` scalars in ``x``'s dtype, ``lo``/``hi`` bounds broadcasting to
    ``x``, ``seed`` a stateless ``[2]`` int32 seed (restart ``r`` starts from
    ``stateless_fold_in(seed, r)``). ``grad_rows`` / ``forward_rows`` (int64) count the example
    rows pushed through a forward+backward / forward-only pass.

    ``norm`` is a canonical name (``"linf"``, ``"l2"``, ``"l1"``); ``steps`` and ``restarts``
    Python ints. The start of each restart is ``init(x, seed_r)`` when given, else a uniform
    point of the ball (``rand_init``), else ``x``. ``momentum`` (MIM) accumulates
    L1-normalised gradients. ``gradient_noise(i, y)`` (step ``i`` an int32 scalar from 0, ``y``
    as given to the loop) is added to each step's gradient before anything else uses it, so the
    step follows ``dir(grad + noise)`` (stochastic gradient Langevin dynamics, as SA-PPO's
    inner maximiser). With ``early_stop`` examples freeze at the first iterate where
    ``value_fn`` reports success and the loops exit once every example has succeeded. Across
    restarts (or with ``early_stop``) the final iterates are scored once each and the worst case
    per example is kept (:func:`keep_best`); otherwise the last iterate is returned as is.

    A gradient the method needs and cannot have is never a silent zero: when the objective has
    no gradient path to ``x`` at all, tracing warns (the loop then leaves ``x`` where its start
    put it). With ``count_zero`` the loop returns a fourth output, the number of examples (int64)
    whose gradient at the first step is identically zero (saturation, a piecewise-constant
    layer: gradient masking whatever the output layer), for the caller to warn about.
    """
    n_steps = int(steps)
    n_restarts = int(restarts)
    score_final = n_restarts > 1 or early_stop

    def grad_of(xa, y, y_true):
        with tf.GradientTape() as tape:
            tape.watch(xa)
            obj, succ = value_fn(xa, y, y_true)
            total = tf.reduce_sum(obj)
        g = tape.gradient(total, xa)
        if g is None:
            warnings.warn("the attack's objective has no gradient with respect to x (no "
                          "differentiable path from x to it): the gradient steps cannot move x",
                          UserWarning, stacklevel=2)
            g = tf.zeros_like(xa)
        return succ, g

    def loop(x, y, y_true, eps, step_size, lo, hi, seed):
        b = tf.shape(x)[0]
        dtype = x.dtype
        if norm == "linf":  # the ball and the box in one clip
            lo_e = tf.maximum(x - eps, lo)
            hi_e = tf.minimum(x + eps, hi)
        best_x = x
        best_obj = tf.fill([b], tf.constant(-np.inf, dtype))
        best_succ = tf.zeros([b], tf.bool)
        rows = tf.constant(0, tf.int64)
        frows = tf.constant(0, tf.int64)
        zero = tf.constant(0, tf.int64)

        def restart_cond(r, best_x, best_obj, best_succ, rows, frows, zero):
            c = r < n_restarts
            if early_stop:
                c = tf.logical_and(c, tf.reduce_any(tf.logical_not(best_succ)))
            return c

        def restart_body(r, best_x, best_obj, best_succ, rows, frows, zero):
            s = tf.random.experimental.stateless_fold_in(seed, r)
            if init is not None:
                xa = init(x, s)
            elif rand_init:
                delta = random_in_ball(tf.shape(x), eps, norm, s, dtype=dtype)
                xa = clip_to_bounds(x + delta, lo, hi)
            else:
                xa = x
            active = tf.logical_not(best_succ) if early_stop else tf.ones([b], tf.bool)
            acc = tf.zeros_like(x)

            def step_cond(i, xa, acc, active, rows, zero):
                c = i < n_steps
                if early_stop:
                    c = tf.logical_and(c, tf.reduce_any(active))
                return c

            def step_body(i, xa, acc, active, rows, zero):
                succ, g = grad_of(xa, y, y_true)
                rows = rows + tf.cast(b, tf.int64)
                if count_zero:  # at the first step of the first restart
                    first = tf.logical_and(tf.equal(i, 0), tf.equal(r, 0))
                    zero = tf.where(first, zero_gradient_rows(g), zero)
                if gradient_noise is not None:
                    g = g + tf.cast(gradient_noise(i, y), g.dtype)
                if momentum is not None:
                    l1 = tf.reduce_sum(tf.abs(tf.reshape(g, [b, -1])), axis=1)
                    g = momentum * acc + g / expand_rows(tf.maximum(l1, 1e-12), g)
                    acc = g
                if norm == "linf":
                    x_new = tf.clip_by_value(xa + step_size * tf.sign(g), lo_e, hi_e)
                else:
                    if norm == "l1":  # coordinates at a bound that the step would push out
                        blocked = tf.logical_or(tf.logical_and(xa >= hi, g > 0),
                                                tf.logical_and(xa <= lo, g < 0))
                        g = tf.where(blocked, tf.zeros_like(g), g)
                    d = steepest_ascent(g, norm, l1_top_k=l1_top_k if norm == "l1" else None)
                    x_new = clip_to_bounds(x + project(xa + step_size * d - x, eps, norm), lo, hi)
                if early_stop:  # freeze broken examples where they broke
                    active = tf.logical_and(active, tf.logical_not(succ))
                    x_new = tf.where(expand_rows(active, x), x_new, xa)
                return i + 1, x_new, acc, active, rows, zero

            _, xa, _, _, rows, zero = tf.while_loop(step_cond, step_body,
                                                    (tf.constant(0), xa, acc, active, rows, zero))
            if score_final:
                obj, succ = value_fn(xa, y, y_true)
                frows = frows + tf.cast(b, tf.int64)
                best_x, best_obj, best_succ = keep_best(best_x, best_obj, best_succ, xa, obj, succ)
            else:
                best_x = xa
            return r + 1, best_x, best_obj, best_succ, rows, frows, zero

        _, best_x, _, _, rows, frows, zero = tf.while_loop(
            restart_cond, restart_body,
            (tf.constant(0), best_x, best_obj, best_succ, rows, frows, zero))
        return (best_x, rows, frows, zero) if count_zero else (best_x, rows, frows)

    return loop


def compile_iterative(p: Any, *, norm: str, steps: int, restarts: int, rand_init: bool,
                      early_stop: bool, momentum: float | None, l1_top_k: Any,
                      jit_compile: bool, gradient_noise: NoiseFn | None = None) -> Callable:
    """:func:`iterative_loop` for a prepared call ``p`` (:class:`attacks._prepared.Prepared`) as a
    ``tf.function`` with a relaxed batch dimension: one trace per configuration and
    per-example shape, reused for every batch size, eps, step size, bound and seed.

    Called eagerly, it warns (:func:`robustgrad.input_gradients.zero_gradient_message`) when
    the gradient at the first step is identically zero on more than a tenth of the examples.
    The step loop does the minimum per iteration (one forward+backward pass, the step, the
    projection; plus the success mask with ``early_stop``): PGD-k costs k gradient passes and,
    only when there is a choice to make (restarts or early stop), one forward pass per restart.
    """
    loop = iterative_loop(p.value_fn, norm=norm, steps=steps, restarts=restarts,
                          rand_init=rand_init, early_stop=early_stop, momentum=momentum,
                          l1_top_k=l1_top_k, gradient_noise=gradient_noise, count_zero=True)
    sig = [relaxed_spec(p.x), tf.nest.map_structure(relaxed_spec, p.y), relaxed_spec(p.y_true),
           tf.TensorSpec([], p.x.dtype), tf.TensorSpec([], p.x.dtype),
           tf.TensorSpec(p.lo.shape, p.x.dtype), tf.TensorSpec(p.hi.shape, p.x.dtype),
           tf.TensorSpec([2], tf.int32)]

    def traced(*args):
        # Keras Conv2D layers traced here take their input gradient by a forward convolution
        # (robustgrad.convolution: same values, about twice as fast on Eigen's CPU kernels)
        with forward_input_gradients():
            return loop(*args)

    compiled = tf.function(traced, input_signature=sig, jit_compile=bool(jit_compile),
                           reduce_retracing=False, autograph=False)  # see apgd.py

    def call(*args):
        x_adv, rows, frows, zero = compiled(*args)
        if tf.executing_eagerly():
            warn_zero_gradient(int(zero), int(args[0].shape[0]), stacklevel=3)
        return x_adv, rows, frows

    call.__dict__["compiled"] = compiled  # the tf.function (its traces), as call.compiled
    return call
