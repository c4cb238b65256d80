"""Projected gradient descent and its relatives: PGD, BIM and MIM.

* :func:`projected_gradient_descent` — Madry et al., "Towards deep learning models resistant to
  adversarial attacks", ICLR 2018: random start in the ball, ``steps`` steepest-ascent steps of
  size ``step_size`` each projected back onto the ball and the box; ``restarts`` random starts
  keep the worst case *per example*.
* :func:`basic_iterative_method` — Kurakin et al. 2017: PGD without the random start.
* :func:`momentum_iterative_method` — Dong et al., "Boosting adversarial attacks with momentum",
  CVPR 2018: the step follows an accumulated, L1-normalised gradient (decay ``decay_factor``).

The whole loop (restarts and steps) runs inside one ``tf.function`` built from
``tf.while_loop``; it is traced once per (model, configuration, per-example shape, dtype) and
reused for every batch size, eps, step size, bound and seed. Each restart ends at its last
iterate (Madry et al.); across restarts the attack keeps, per example, the worst case: a
successful final point (misclassified, or at the target) before an unsuccessful one, then the
one with the highest objective. With ``early_stop=True`` examples freeze at the first iterate
where they are broken, and the loop exits when every example is broken.

For reuse beyond classifiers (RL observations, sensitivity analysis), pass either a callable
``objective(outputs, y) -> [B]`` (``y`` may be anything with a leading batch dimension, e.g. clean
action probabilities) or ``model=None, loss_fn=f`` with ``f(x_adv) -> [B]`` any differentiable
function of the input; the attack maximises it. Compiled loops are cached per model and per
objective / ``loss_fn`` object: pass the same callable across calls (not a fresh lambda each
time) to reuse the trace. ``loss_fn`` is probed once, eagerly, on the first rows of ``x``.

>>> import tensorflow as tf
>>> w = tf.constant([[1.0], [-2.0]])
>>> model = lambda x, training=False: tf.concat([x @ w, -(x @ w)], axis=1)
>>> x = tf.constant([[0.5, 0.5]])
>>> x_adv = projected_gradient_descent(model, x, tf.constant([1]), eps=0.1, clip_min=0.0,
...                                    clip_max=1.0, steps=5, seed=0)
>>> [round(float(v), 3) for v in x_adv[0]]
[0.6, 0.4]
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from . import _validate as V
from ._base import Attack, AttackResult, cached, finish, prepare, relaxed_spec, seed_tensor, \
    spec_key
from .norms import canonical_norm, clip_to_bounds, project, random_in_ball, steepest_ascent

__all__ = [
    "projected_gradient_descent",
    "basic_iterative_method",
    "momentum_iterative_method",
    "PGD",
    "BIM",
    "MIM",
]

DEFAULT_L1_TOP_K = 0.01  # fraction of coordinates moved per L1 step (SLIDE-style)


def _best_update(best_x, best_obj, best_succ, xa, obj, succ):
    better = tf.logical_or(
        tf.logical_and(succ, tf.logical_not(best_succ)),
        tf.logical_and(tf.equal(succ, best_succ), obj > best_obj))
    shape = tf.concat([tf.shape(better), tf.ones([tf.rank(xa) - 1], tf.int32)], 0)
    bx = tf.where(tf.reshape(better, shape), xa, best_x)
    return bx, tf.where(better, obj, best_obj), tf.logical_or(best_succ, succ)


def _rows(mask, x):
    return tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([tf.rank(x) - 1], tf.int32)], 0))


def build_iterative(p, *, norm, steps, restarts, rand_init, early_stop, momentum, l1_top_k,
                    jit_compile):
    """Compile the PGD/BIM/MIM loop for the prepared call ``p`` (see :func:`prepare`).

    The step loop does the minimum per iteration (one forward+backward pass, the step, the
    projection; plus the success mask with ``early_stop``): PGD-k costs k gradient passes and,
    only when there is a choice to make (restarts or early stop), one forward pass per restart
    to score its final iterate per example.
    """
    value_fn = p.value_fn
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

        def restart_cond(r, best_x, best_obj, best_succ, rows, frows):
            c = r < n_restarts
            if early_stop:
                c = tf.logical_and(c, tf.reduce_any(tf.logical_not(best_succ)))
            return c

        def restart_body(r, best_x, best_obj, best_succ, rows, frows):
            if rand_init:
                s = tf.random.experimental.stateless_fold_in(seed, r)
                delta = random_in_ball(tf.shape(x), eps, norm, s, dtype=dtype)
                xa = clip_to_bounds(x + delta, lo, hi)
            else:
                xa = x
            active = tf.logical_not(best_succ) if early_stop else tf.ones([b], tf.bool)
            acc = tf.zeros_like(x)

            def step_cond(i, xa, acc, active, rows):
                c = i < n_steps
                if early_stop:
                    c = tf.logical_and(c, tf.reduce_any(active))
                return c

            def step_body(i, xa, acc, active, rows):
                succ, g = grad_of(xa, y, y_true)
                rows = rows + tf.cast(b, tf.int64)
                if momentum is not None:
                    l1 = tf.reduce_sum(tf.abs(tf.reshape(g, [b, -1])), axis=1)
                    g = momentum * acc + g / _rows(tf.maximum(l1, 1e-12), g)
                    acc = g
                if norm == "linf":
                    x_new = tf.clip_by_value(xa + step_size * tf.sign(g), lo_e, hi_e)
                else:
                    if norm == "l1":
                        blocked = tf.logical_or(tf.logical_and(xa >= hi, g > 0),
                                                tf.logical_and(xa <= lo, g < 0))
                        g = tf.where(blocked, tf.zeros_like(g), g)
                    d = steepest_ascent(g, norm, l1_top_k=l1_top_k if norm == "l1" else None)
                    x_new = clip_to_bounds(x + project(xa + step_size * d - x, eps, norm), lo, hi)
                if early_stop:  # freeze broken examples where they broke
                    active = tf.logical_and(active, tf.logical_not(succ))
                    x_new = tf.where(_rows(active, x), x_new, xa)
                return i + 1, x_new, acc, active, rows

            _, xa, _, _, rows = tf.while_loop(step_cond, step_body,
                                              (tf.constant(0), xa, acc, active, rows))
            if score_final:
                obj, succ = value_fn(xa, y, y_true)
                frows = frows + tf.cast(b, tf.int64)
                best_x, best_obj, best_succ = _best_update(best_x, best_obj, best_succ, xa, obj,
                                                           succ)
            else:
                best_x = xa
            return r + 1, best_x, best_obj, best_succ, rows, frows

        _, best_x, _, _, rows, frows = tf.while_loop(
            restart_cond, restart_body,
            (tf.constant(0), best_x, best_obj, best_succ, rows, frows))
        return best_x, rows, frows

    sig = [relaxed_spec(p.x), tf.nest.map_structure(relaxed_spec, p.y), relaxed_spec(p.y_true),
           tf.TensorSpec([], p.x.dtype), tf.TensorSpec([], p.x.dtype),
           tf.TensorSpec(p.lo.shape, p.x.dtype), tf.TensorSpec(p.hi.shape, p.x.dtype),
           tf.TensorSpec([2], tf.int32)]
    return tf.function(loop, input_signature=sig, jit_compile=bool(jit_compile),
                       reduce_retracing=False)


def _check_iter_args(steps, restarts, step_size, early_stop, p):
    V.check_positive_int(steps, "steps")
    V.check_positive_int(restarts, "restarts")
    if step_size is not None:
        V.check_nonnegative(step_size, "step_size")
    if early_stop and not p.has_success:
        raise ValueError("early_stop: needs integer class labels to decide when an example is "
                         "broken; not available with loss_fn or a non-label y")


@tf.autograph.experimental.do_not_convert
def run_iterative(model, x, y=None, *, eps, norm="linf", clip_min, clip_max, targeted=False,
                  seed=None, steps=10, step_size=None, restarts=1, rand_init=True,
                  early_stop=False, objective="ce", training=False, jit_compile=False,
                  momentum=None, l1_top_k=DEFAULT_L1_TOP_K, loss_fn=None, kind="pgd"):
    norm = canonical_norm(norm)
    p = prepare(model, x, y, eps=eps, clip_min=clip_min, clip_max=clip_max, targeted=targeted,
                objective=objective, training=training, loss_fn=loss_fn)
    _check_iter_args(steps, restarts, step_size, early_stop, p)
    if momentum is not None:
        V.check_nonnegative(momentum, "decay_factor")
    dtype = p.x.dtype
    eps_t = tf.cast(eps, dtype)
    if step_size is None:
        step_size = eps_t * (1.0 if kind != "pgd" else 2.5) / float(steps)
    if l1_top_k is not None and isinstance(l1_top_k, float) and l1_top_k >= 1:
        l1_top_k = int(l1_top_k)
    cfg = (kind, norm, int(steps), int(restarts), bool(rand_init), bool(early_stop),
           None if momentum is None else float(momentum), l1_top_k, bool(jit_compile))
    key = p.key + cfg + spec_key((p.x, p.y, p.y_true)) + (tuple(p.lo.shape.as_list()),)
    fn = cached(p.owner, key, lambda: build_iterative(
        p, norm=norm, steps=steps, restarts=restarts, rand_init=rand_init,
        early_stop=early_stop, momentum=None if momentum is None else float(momentum), l1_top_k=l1_top_k,
        jit_compile=jit_compile))
    x_adv, rows, frows = fn(p.x, p.y, p.y_true, eps_t, tf.cast(step_size, dtype), p.lo, p.hi,
                            seed_tensor(seed))
    if p.eager:
        rows, frows = int(rows), int(frows) + p.forward_passes
    return AttackResult(finish(p, x_adv), rows, frows)


@tf.autograph.experimental.do_not_convert
def projected_gradient_descent(model, x, y=None, *, eps, norm="linf", clip_min, clip_max,
                               targeted=False, seed=None, steps=10, step_size=None, restarts=1,
                               rand_init=True, early_stop=False, objective="ce", training=False,
                               jit_compile=False, l1_top_k=DEFAULT_L1_TOP_K, loss_fn=None):
    """PGD (Madry et al. 2018) under the L∞, L2 or L1 norm; returns ``x_adv``.

    Args:
      model: callable ``model(x, training=False) -> logits`` (a Keras model is one), or ``None``
        with ``loss_fn``.
      x: float batch ``[B, ...]`` inside ``[clip_min, clip_max]``; never modified.
      y: integer labels ``[B]``; ``None`` uses the model's predictions. With ``targeted=True``
        the target labels. With a callable ``objective`` anything it accepts.
      eps: radius of the ball (same units as ``x``); ``0`` returns ``x``.
      norm: ``"linf"`` (``np.inf``), ``"l2"`` (``2``) or ``"l1"`` (``1``).
      clip_min, clip_max: bounds of the input domain, scalars or per feature; ``None`` is
        unbounded. Required, nothing assumes ``[0, 1]``.
      targeted: maximise toward ``y`` instead of away from it.
      seed: int, ``tf.random.Generator`` or ``None`` (random) for the random starts.
      steps: gradient steps per restart. step_size: defaults to ``2.5 * eps / steps``.
      restarts: random starts; the worst case is kept per example.
      rand_init: start uniformly in the ball (``False`` starts at ``x``).
      early_stop: freeze examples once broken and stop when all are.
      objective: ``"ce"``, ``"cw"``, ``"dlr"`` or ``objective(logits, y) -> [B]`` to maximise.
      training: the mode the model is called in (default inference).
      jit_compile: compile the loop with XLA (often slower on CPU for small models).
      l1_top_k: L1 only: coordinates moved per step, an int or a fraction of the dimension.
      loss_fn: instead of a model, any differentiable ``loss_fn(x_adv) -> [B]`` to maximise.
    """
    return run_iterative(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                         targeted=targeted, seed=seed, steps=steps, step_size=step_size,
                         restarts=restarts, rand_init=rand_init, early_stop=early_stop,
                         objective=objective, training=training, jit_compile=jit_compile,
                         l1_top_k=l1_top_k, loss_fn=loss_fn, kind="pgd").x_adv


@tf.autograph.experimental.do_not_convert
def basic_iterative_method(model, x, y=None, *, eps, norm="linf", clip_min, clip_max,
                           targeted=False, seed=None, steps=10, step_size=None,
                           early_stop=False, objective="ce", training=False, jit_compile=False,
                           l1_top_k=DEFAULT_L1_TOP_K, loss_fn=None):
    """BIM (Kurakin et al. 2017): PGD from ``x`` without random start; step ``eps / steps``."""
    return run_iterative(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                         targeted=targeted, seed=seed, steps=steps, step_size=step_size,
                         restarts=1, rand_init=False, early_stop=early_stop, objective=objective,
                         training=training, jit_compile=jit_compile, l1_top_k=l1_top_k,
                         loss_fn=loss_fn, kind="bim").x_adv


@tf.autograph.experimental.do_not_convert
def momentum_iterative_method(model, x, y=None, *, eps, norm="linf", clip_min, clip_max,
                              targeted=False, seed=None, steps=10, step_size=None,
                              decay_factor=1.0, early_stop=False, objective="ce",
                              training=False, jit_compile=False, l1_top_k=DEFAULT_L1_TOP_K,
                              loss_fn=None):
    """MIM (Dong et al. 2018): ``g <- mu g + grad / ||grad||_1``, step along ``g``'s direction."""
    return run_iterative(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                         targeted=targeted, seed=seed, steps=steps, step_size=step_size,
                         restarts=1, rand_init=False, early_stop=early_stop, objective=objective,
                         training=training, jit_compile=jit_compile,
                         momentum=float(decay_factor), l1_top_k=l1_top_k,
                         loss_fn=loss_fn, kind="mim").x_adv


@tf.autograph.experimental.do_not_convert
def _pgd_run(model, x, y=None, *, eps=None, norm="linf", clip_min=None, clip_max=None,
             targeted=False, seed=None, steps=10, step_size=None, restarts=1, rand_init=True,
             early_stop=False, objective="ce", training=False, jit_compile=False,
             l1_top_k=DEFAULT_L1_TOP_K, loss_fn=None):
    return run_iterative(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                         targeted=targeted, seed=seed, steps=steps, step_size=step_size,
                         restarts=restarts, rand_init=rand_init, early_stop=early_stop,
                         objective=objective, training=training, jit_compile=jit_compile,
                         l1_top_k=l1_top_k, loss_fn=loss_fn, kind="pgd")


@tf.autograph.experimental.do_not_convert
def _bim_run(model, x, y=None, *, eps=None, norm="linf", clip_min=None, clip_max=None,
             targeted=False, seed=None, steps=10, step_size=None, early_stop=False,
             objective="ce", training=False, jit_compile=False, l1_top_k=DEFAULT_L1_TOP_K,
             loss_fn=None):
    return run_iterative(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                         targeted=targeted, seed=seed, steps=steps, step_size=step_size,
                         restarts=1, rand_init=False, early_stop=early_stop, objective=objective,
                         training=training, jit_compile=jit_compile, l1_top_k=l1_top_k,
                         loss_fn=loss_fn, kind="bim")


@tf.autograph.experimental.do_not_convert
def _mim_run(model, x, y=None, *, eps=None, norm="linf", clip_min=None, clip_max=None,
             targeted=False, seed=None, steps=10, step_size=None, decay_factor=1.0,
             early_stop=False, objective="ce", training=False, jit_compile=False,
             l1_top_k=DEFAULT_L1_TOP_K, loss_fn=None):
    return run_iterative(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                         targeted=targeted, seed=seed, steps=steps, step_size=step_size,
                         restarts=1, rand_init=False, early_stop=early_stop, objective=objective,
                         training=training, jit_compile=jit_compile,
                         momentum=float(decay_factor), l1_top_k=l1_top_k,
                         loss_fn=loss_fn, kind="mim")


class PGD(Attack):
    """Configured :func:`projected_gradient_descent`: ``PGD(eps=0.1, steps=20)(model, x, y)``."""

    name = "pgd"
    _run = staticmethod(_pgd_run)


class BIM(Attack):
    """Configured :func:`basic_iterative_method`."""

    name = "bim"
    _run = staticmethod(_bim_run)


class MIM(Attack):
    """Configured :func:`momentum_iterative_method`."""

    name = "mim"
    _run = staticmethod(_mim_run)
