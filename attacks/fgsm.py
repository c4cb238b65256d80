"""The fast gradient method (FGSM for L∞, FGM for L2 and L1).

Goodfellow, Shlens & Szegedy, "Explaining and harnessing adversarial examples", ICLR 2015:
one step of size ``eps`` along the steepest-ascent direction of the objective's input gradient,
``x_adv = clip(x + eps * d)`` with ``d = sign(g)`` (L∞), ``g / ||g||_2`` (L2) or the sparse L1
direction (all mass on the largest ``|g_i|``). On a linear model the L∞ step is exactly
``eps * sign(w)`` and the L2 perturbation has norm exactly ``eps`` (before clipping).

The step runs in a cached ``tf.function`` (one trace per model, configuration and per-example
shape). See :mod:`attacks.pgd` for ``objective``/``loss_fn`` reuse.

>>> import tensorflow as tf
>>> w = tf.constant([[1.0], [-2.0]])
>>> model = lambda x, training=False: tf.concat([x @ w, -(x @ w)], axis=1)
>>> x = tf.constant([[0.5, 0.5]])
>>> x_adv = fast_gradient_method(model, x, tf.constant([1]), eps=0.1, clip_min=0.0, clip_max=1.0)
>>> [round(float(v), 3) for v in x_adv[0]]
[0.6, 0.4]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from ._base import Attack, AttackResult, cached, prepare, relaxed_spec, run_in_chunks, spec_key
from ._engine import warn_zero_gradient, zero_gradient_rows
from .norms import canonical_norm, clip_to_bounds, steepest_ascent

__all__ = ["fast_gradient_method", "FGSM", "FGM"]


def _build(p, norm, l1_top_k, jit_compile):
    value_fn = p.value_fn

    def step(x, y, y_true, eps, lo, hi):
        with tf.GradientTape() as tape:
            tape.watch(x)
            obj, _ = value_fn(x, y, y_true)
            total = tf.reduce_sum(obj)
        g = tape.gradient(total, x)
        if g is None:
            g = tf.zeros_like(x)
        d = steepest_ascent(g, norm, l1_top_k=l1_top_k if norm == "l1" else None)
        return clip_to_bounds(x + eps * d, lo, hi), zero_gradient_rows(g)

    sig = [relaxed_spec(p.x), tf.nest.map_structure(relaxed_spec, p.y), relaxed_spec(p.y_true),
           tf.TensorSpec([], p.x.dtype), tf.TensorSpec(p.lo.shape, p.x.dtype),
           tf.TensorSpec(p.hi.shape, p.x.dtype)]
    return tf.function(step, input_signature=sig, jit_compile=bool(jit_compile))


@tf.autograph.experimental.do_not_convert
def _fgm_run(model, x, y=None, *, eps=None, norm="linf", clip_min=None, clip_max=None,
             targeted=False, seed=None, objective="ce", training=False, jit_compile=False,
             l1_top_k=None, loss_fn=None, batch_size=None):
    norm = canonical_norm(norm)
    p = prepare(model, x, y, eps=eps, clip_min=clip_min, clip_max=clip_max, targeted=targeted,
                objective=objective, training=training, loss_fn=loss_fn, batch_size=batch_size)
    key = p.key + ("fgm", norm, l1_top_k, bool(jit_compile)) + spec_key((p.x, p.y, p.y_true)) \
        + (tuple(p.lo.shape.as_list()),)
    fn = cached(p.owner, key, lambda: _build(p, norm, l1_top_k, jit_compile))
    eps_t = tf.cast(eps, p.x.dtype)
    x_adv, (zero,) = run_in_chunks(p, lambda xc, yc, ytc, k: fn(xc, yc, ytc, eps_t, p.lo, p.hi))
    n = int(p.x.shape[0]) if p.eager else tf.shape(p.x)[0]
    if p.eager:
        warn_zero_gradient(zero, n, stacklevel=3)
    return AttackResult(x_adv, n, p.forward_passes)


@tf.autograph.experimental.do_not_convert
def fast_gradient_method(model: Any, x: Any, y: Any = None, *, eps: Any, norm: Any = "linf", clip_min: Any,
                         clip_max: Any, targeted: bool = False, seed: Any = None, objective: Any = "ce",
                         training: Any = False, jit_compile: bool = False, l1_top_k: Any = None,
                         loss_fn: Callable | None = None, batch_size: int | None = None) -> tf.Tensor:
    """One steepest-ascent step of size ``eps``: FGSM (L∞), FGM (L2, L1); returns ``x_adv``.

    Arguments as in :func:`attacks.projected_gradient_descent`; ``seed`` is accepted for the
    common signature (the method is deterministic). ``l1_top_k=None`` is the exact L1 direction
    (ties share the mass); an int spreads the step over the top-k coordinates. ``batch_size``
    (default 1024) examples go through each compiled call; the result does not depend on it.
    """
    return _fgm_run(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                    targeted=targeted, seed=seed, objective=objective, training=training,
                    jit_compile=jit_compile, l1_top_k=l1_top_k, loss_fn=loss_fn,
                    batch_size=batch_size).x_adv


class FGM(Attack):
    """Configured :func:`fast_gradient_method`: ``FGM(eps=0.1, norm="l2")(model, x, y)``."""

    name = "fgm"
    _run = staticmethod(_fgm_run)


class FGSM(FGM):
    """:class:`FGM` under the L∞ norm (the default)."""

    name = "fgsm"
    norms = ("linf",)
