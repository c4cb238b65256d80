"""Carlini & Wagner's L2 attack, "Towards evaluating the robustness of neural networks",
IEEE S&P 2017.

Minimises ``||x_adv - x||_2^2 + c * f(x_adv)`` over ``w`` with
``x_adv = lo + (hi - lo) (tanh(w) + 1) / 2`` (the box by construction), where
``f = max(z_y - max_{j!=y} z_j + kappa, 0)`` (untargeted) or ``max(max_{j!=t} z_j - z_t + kappa, 0)``
(targeted) and ``kappa`` is the ``confidence``. Adam (``learning_rate``) runs ``steps`` iterations
for each of ``binary_search_steps`` values of ``c``, searched per example: ``c`` is halved toward
the last success or multiplied by 10 until the first. Per example the smallest-L2 successful point
(margin ``>= kappa``) is returned; examples never broken come back unchanged.

A minimum-norm attack: ``eps=None`` (default) leaves it unbounded; with ``eps`` the result is
projected onto the L2 ball so the common budget invariant holds. The whole search runs in one
compiled ``tf.while_loop`` (one trace per model, configuration and per-example shape).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad import checks as _checks
from robustgrad.transforms import scale_by_adam

from . import _validate
from ._base import (
    Attack,
    AttackResult,
    cached,
    prepare,
    relaxed_spec,
    run_in_chunks,
    spec_key,
    weak_caller,
)
from ._engine import expand_rows
from .norms import canonical_norm, clip_to_bounds, project

__all__ = ["carlini_wagner_l2", "CarliniWagnerL2"]

_ADAM = scale_by_adam(0.9, 0.999, 1e-8)
"""Carlini & Wagner's optimiser over w (Adam at its paper defaults; the direction, lr applied here)."""


def _build(p, model, training, *, targeted, steps, bsteps, jit_compile):
    model_call = weak_caller(model, training)  # weak: the cache must not keep the model
    n_steps, n_bsteps = int(steps), int(bsteps)

    def margin(logits, y):
        oh = tf.one_hot(tf.cast(y, tf.int32), tf.shape(logits)[-1], dtype=logits.dtype)
        z_y = tf.reduce_sum(oh * logits, axis=-1)
        z_o = tf.reduce_max(logits - oh * 1e9, axis=-1)
        return (z_y - z_o) if targeted else (z_o - z_y)  # >= kappa means success

    def loop(x, y, kappa, c0, lr, lo, hi):
        b = tf.shape(x)[0]
        dt = x.dtype
        rng = hi - lo
        xs = tf.clip_by_value((x - lo) / rng * 2.0 - 1.0, -1.0 + 1e-6, 1.0 - 1e-6)
        w0 = tf.atanh(xs)
        flat = lambda t: tf.reshape(t, [b, -1])  # noqa: E731

        def to_x(w):
            return lo + rng * (tf.tanh(w) + 1.0) / 2.0

        state = (tf.constant(0), tf.fill([b], c0), tf.zeros([b], dt), tf.fill([b], tf.constant(1e10, dt)),
                 tf.fill([b], tf.constant(np.inf, dt)), x, tf.constant(0, tf.int64))

        def bcond(j, c, lower, upper, best_l2, best_x, rows):
            return j < n_bsteps

        def bbody(j, c, lower, upper, best_l2, best_x, rows):
            m_state = (tf.constant(0), w0, _ADAM.init(w0), tf.zeros([b], tf.bool), best_l2, best_x,
                       rows)

            def icond(i, w, adam, succ_any, best_l2, best_x, rows):
                return i < n_steps

            def ibody(i, w, adam, succ_any, best_l2, best_x, rows):
                with tf.GradientTape() as tape:
                    tape.watch(w)
                    xa = to_x(w)
                    logits = tf.cast(model_call(xa), dt)
                    mg = margin(logits, y)
                    l2sq = tf.reduce_sum(tf.square(flat(xa - x)), axis=1)
                    loss = l2sq + c * tf.maximum(kappa - mg, 0.0)
                    total = tf.reduce_sum(loss)
                g = tape.gradient(total, w)
                rows = rows + tf.cast(b, tf.int64)
                ok = mg >= kappa
                l2 = tf.sqrt(l2sq)
                better = tf.logical_and(ok, l2 < best_l2)
                best_x = tf.where(expand_rows(better, x), xa, best_x)
                best_l2 = tf.where(better, l2, best_l2)
                succ_any = tf.logical_or(succ_any, ok)
                direction, adam = _ADAM.update(g, adam)
                w = w - lr * direction
                return i + 1, w, adam, succ_any, best_l2, best_x, rows

            _, _, _, succ_any, best_l2, best_x, rows = tf.while_loop(icond, ibody, m_state)
            upper = tf.where(succ_any, tf.minimum(upper, c), upper)
            lower = tf.where(succ_any, lower, tf.maximum(lower, c))
            c = tf.where(succ_any, (lower + upper) / 2.0,
                         tf.where(upper < 1e9, (lower + upper) / 2.0, c * 10.0))
            return j + 1, c, lower, upper, best_l2, best_x, rows

        _, _, _, _, _, best_x, rows = tf.while_loop(bcond, bbody, state)
        return best_x, rows

    sig = [relaxed_spec(p.x), relaxed_spec(p.y), tf.TensorSpec([], p.x.dtype),
           tf.TensorSpec([], p.x.dtype), tf.TensorSpec([], p.x.dtype),
           tf.TensorSpec(p.lo.shape, p.x.dtype), tf.TensorSpec(p.hi.shape, p.x.dtype)]
    return tf.function(loop, input_signature=sig, jit_compile=bool(jit_compile))


@tf.autograph.experimental.do_not_convert
def _cw_run(model, x, y=None, *, eps=None, norm="l2", clip_min=None, clip_max=None,
            targeted=False, seed=None, steps=100, binary_search_steps=5, confidence=0.0,
            initial_const=1.0, learning_rate=None, training=False, jit_compile=False,
            batch_size=None):
    if canonical_norm(norm) != "l2":
        raise ValueError(f"norm: carlini_wagner_l2 is an L2 attack, got {norm!r}")
    if clip_min is None or clip_max is None:
        raise ValueError("clip_min/clip_max: carlini_wagner_l2 needs finite bounds (tanh box)")
    p = prepare(model, x, y, eps=eps, clip_min=clip_min, clip_max=clip_max, targeted=targeted,
                objective="cw", training=training, allow_none_eps=True, batch_size=batch_size)
    _validate.check_positive_int(steps, "steps", maximum=_validate.MAX_STEPS)
    _validate.check_positive_int(binary_search_steps, "binary_search_steps",
                                maximum=_validate.MAX_RESTARTS)
    _validate.check_nonnegative(confidence, "confidence")
    _validate.check_nonnegative(initial_const, "initial_const")
    if learning_rate is not None:  # NaN returned x unchanged in silence
        _checks.number(learning_rate, "learning_rate", minimum=0, min_inclusive=False)
    if not bool(tf.reduce_all(p.hi > p.lo)):
        raise ValueError("clip_min/clip_max: carlini_wagner_l2 needs clip_min < clip_max "
                         "on every feature")
    dt = p.x.dtype
    if learning_rate is None:
        learning_rate = 0.01 * 2.0  # Adam step in tanh space; the box has width 2 there
    cfg = ("cw", bool(targeted), int(steps), int(binary_search_steps), bool(jit_compile))
    key = p.key + cfg + spec_key((p.x, p.y)) + (tuple(p.lo.shape.as_list()),)
    fn = cached(p.owner, key, lambda: _build(p, model, training, targeted=targeted, steps=steps,
                                             bsteps=binary_search_steps,
                                             jit_compile=jit_compile))
    kappa, c0, lr = tf.cast(confidence, dt), tf.cast(initial_const, dt), tf.cast(learning_rate, dt)

    def attack_chunk(xc, yc, ytc, k):
        x_adv, rows = fn(xc, yc, kappa, c0, lr, p.lo, p.hi)
        if eps is not None:
            x_adv = clip_to_bounds(xc + project(x_adv - xc, tf.cast(eps, dt), "l2"), p.lo, p.hi)
        return x_adv, rows

    x_adv, (rows,) = run_in_chunks(p, attack_chunk)
    return AttackResult(x_adv, rows, p.forward_passes)


@tf.autograph.experimental.do_not_convert
def carlini_wagner_l2(model: Any, x: Any, y: Any = None, *, eps: Any = None, norm: Any = "l2", clip_min: Any,
                      clip_max: Any, targeted: bool = False, seed: Any = None, steps: int = 100,
                      binary_search_steps: int = 5, confidence: float = 0.0, initial_const: float = 1.0,
                      learning_rate: float | None = None, training: Any = False,
                      jit_compile: bool = False, batch_size: int | None = None) -> tf.Tensor:
    """Carlini–Wagner L2 (2017); returns ``x_adv`` (unchanged where no success was found).

    ``confidence`` is kappa: a success needs ``margin >= kappa``. ``initial_const`` is the first
    ``c``; ``binary_search_steps`` searches ``c`` per example; ``steps`` Adam iterations per ``c``
    with ``learning_rate`` (default 0.02 in tanh space). ``eps`` (optional) bounds the L2 norm
    of the output by projection. ``seed`` is accepted for the common signature (deterministic).
    ``batch_size`` (default 1024) examples per compiled call; the result does not depend on it.
    """
    return _cw_run(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                   targeted=targeted, seed=seed, steps=steps,
                   binary_search_steps=binary_search_steps, confidence=confidence,
                   initial_const=initial_const, learning_rate=learning_rate, training=training,
                   jit_compile=jit_compile, batch_size=batch_size).x_adv


class CarliniWagnerL2(Attack):
    """Configured :func:`carlini_wagner_l2`."""

    name = "cw"
    norms = ("l2",)
    _run = staticmethod(_cw_run)
