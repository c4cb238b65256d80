"""DeepFool, Moosavi-Dezfooli, Fawzi & Frossard, "DeepFool: a simple and accurate method to fool
deep neural networks", CVPR 2016 (L2, and the L∞ variant of its section 3.3).

Each iteration linearises the classifier around the current point and steps to the nearest
linearised decision boundary among the ``candidates`` classes with the largest clean logits:
``r = (|f_k| + 1e-4) / ||w_k||_q^q * ...`` with ``w_k = grad z_k - grad z_y``, ``f_k = z_k - z_y``
and ``q`` the dual norm (2 for L2, 1 for L∞). The accumulated step is applied with a small
``overshoot``; examples stop once misclassified (per-example masks). Gradients of all candidate
logits come from one batched Jacobian per iteration (``candidates`` backward passes).

A minimum-norm attack: ``eps=None`` leaves it unbounded; with ``eps`` the output is projected
onto the ball. Untargeted only.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

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
from ._chunks import per_class_chunk
from ._engine import expand_rows
from .norms import canonical_norm, clip_to_bounds, project

__all__ = ["deepfool", "DeepFool"]


def _build(p, model, training, *, norm, steps, n_cand, jit_compile):
    model_call = weak_caller(model, training)  # weak: the cache must not keep the model
    n_steps = int(steps)

    def loop(x, y, overshoot, lo, hi):
        b = tf.shape(x)[0]
        dt = x.dtype
        clean = tf.cast(model_call(x), dt)
        order = tf.argsort(clean, axis=-1, direction="DESCENDING", stable=True)
        # candidates: y first, then the top other classes
        others = tf.boolean_mask(order, tf.not_equal(order, tf.cast(y[:, None], order.dtype)))
        others = tf.reshape(others, [b, -1])[:, : n_cand - 1]
        cand = tf.concat([tf.cast(y[:, None], order.dtype), others], axis=1)  # [B, K]
        r_tot = tf.zeros_like(x)
        active = tf.ones([b], tf.bool)
        rows = tf.constant(0, tf.int64)

        def cond(i, r_tot, active, rows):
            return tf.logical_and(i < n_steps, tf.reduce_any(active))

        def body(i, r_tot, active, rows):
            xa = clip_to_bounds(x + (1.0 + overshoot) * r_tot, lo, hi)
            with tf.GradientTape() as tape:
                tape.watch(xa)
                logits = tf.cast(model_call(xa), dt)
                zc = tf.gather(logits, cand, batch_dims=1)  # [B, K]
            jac = tape.batch_jacobian(zc, xa)  # [B, K, ...]
            rows = rows + tf.cast(b * tf.shape(cand)[1], tf.int64)
            pred = tf.argmax(logits, axis=-1)
            active = tf.logical_and(active, tf.equal(pred, y))
            jf = tf.reshape(jac, [b, tf.shape(cand)[1], -1])
            w = jf[:, 1:] - jf[:, :1]  # [B, K-1, D]
            f = zc[:, 1:] - zc[:, :1]  # [B, K-1]
            if norm == "l2":
                wn = tf.norm(w, axis=-1) + 1e-8
            else:
                wn = tf.reduce_sum(tf.abs(w), axis=-1) + 1e-8
            dist = tf.abs(f) / wn
            k = tf.argmin(dist, axis=1)
            wk = tf.gather(w, k, batch_dims=1)
            fk = tf.gather(f, k, batch_dims=1)
            wnk = tf.gather(wn, k, batch_dims=1)
            if norm == "l2":
                r = ((tf.abs(fk) + 1e-4) / tf.square(wnk))[:, None] * wk
            else:
                r = ((tf.abs(fk) + 1e-4) / wnk)[:, None] * tf.sign(wk)
            r = tf.reshape(r, tf.shape(x))
            r_tot = tf.where(expand_rows(active, x), r_tot + r, r_tot)
            return i + 1, r_tot, active, rows

        _, r_tot, _, rows = tf.while_loop(cond, body, (tf.constant(0), r_tot, active, rows))
        return clip_to_bounds(x + (1.0 + overshoot) * r_tot, lo, hi), rows

    sig = [relaxed_spec(p.x), relaxed_spec(p.y), tf.TensorSpec([], p.x.dtype),
           tf.TensorSpec(p.lo.shape, p.x.dtype), tf.TensorSpec(p.hi.shape, p.x.dtype)]
    return tf.function(loop, input_signature=sig, jit_compile=bool(jit_compile))


@tf.autograph.experimental.do_not_convert
def _deepfool_run(model, x, y=None, *, eps=None, norm="l2", clip_min=None, clip_max=None,
                  targeted=False, seed=None, steps=50, overshoot=0.02, candidates=10,
                  training=False, jit_compile=False, batch_size=None):
    norm = canonical_norm(norm)
    if norm not in ("l2", "linf"):
        raise ValueError(f"norm: deepfool supports 'l2' and 'linf', got {norm!r}")
    if targeted:
        raise ValueError("targeted: deepfool is untargeted")
    p = prepare(model, x, y, eps=eps, clip_min=clip_min, clip_max=clip_max, targeted=False,
                objective="ce", training=training, allow_none_eps=True, batch_size=batch_size)
    _validate.check_positive_int(steps, "steps", maximum=_validate.MAX_STEPS)
    _validate.check_positive_int(candidates, "candidates", minimum=2)
    _validate.check_nonnegative(overshoot, "overshoot")
    n_cand = int(candidates)
    if p.num_classes is not None:
        n_cand = min(n_cand, p.num_classes)
    p.batch_size = per_class_chunk(batch_size, n_cand)  # a Jacobian of n_cand logits per row
    cfg = ("deepfool", norm, int(steps), n_cand, bool(jit_compile))
    key = p.key + cfg + spec_key((p.x, p.y)) + (tuple(p.lo.shape.as_list()),)
    fn = cached(p.owner, key, lambda: _build(p, model, training, norm=norm, steps=steps,
                                             n_cand=n_cand, jit_compile=jit_compile))
    dt = p.x.dtype
    overshoot_t = tf.cast(overshoot, dt)

    def attack_chunk(xc, yc, ytc, k):
        x_adv, rows = fn(xc, yc, overshoot_t, p.lo, p.hi)
        if eps is not None:
            x_adv = clip_to_bounds(xc + project(x_adv - xc, tf.cast(eps, dt), norm), p.lo, p.hi)
        return x_adv, rows

    x_adv, (rows,) = run_in_chunks(p, attack_chunk)
    return AttackResult(x_adv, rows, p.forward_passes + (int(p.x.shape[0]) if p.eager else 0))


@tf.autograph.experimental.do_not_convert
def deepfool(model: Any, x: Any, y: Any = None, *, eps: Any = None, norm: Any = "l2", clip_min: Any,
             clip_max: Any, targeted: bool = False, seed: Any = None, steps: int = 50,
             overshoot: float = 0.02, candidates: int = 10, training: Any = False,
             jit_compile: bool = False, batch_size: int | None = None) -> tf.Tensor:
    """DeepFool (L2 or L∞); returns ``x_adv``. ``candidates`` classes are considered per step;
    ``batch_size`` (default 1024) examples per compiled call (the result does not depend on it).
    """
    return _deepfool_run(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                         targeted=targeted, seed=seed, steps=steps, overshoot=overshoot,
                         candidates=candidates, training=training,
                         jit_compile=jit_compile, batch_size=batch_size).x_adv


class DeepFool(Attack):
    """Configured :func:`deepfool`."""

    name = "deepfool"
    norms = ("l2", "linf")
    supports_targeted = False
    _run = staticmethod(_deepfool_run)
