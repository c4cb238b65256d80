"""Auto-PGD (APGD): step-size-free PGD with momentum, Croce & Hein, "Reliable evaluation of
adversarial robustness with an ensemble of diverse parameter-free attacks", ICML 2020.

Algorithm 1 of the paper, per example, under L∞ or L2:

* start ``x0`` at a random point of the ball's sphere/corner, step size ``eta = 2 eps``;
* ``z = P(x_k + eta * d(grad))``, ``x_{k+1} = P(x_k + alpha (z - x_k) + (1 - alpha)(x_k - x_{k-1}))``
  with momentum ``alpha = 0.75`` (``1`` on the first step);
* at checkpoints ``w_j`` (the first after ``0.22 N`` steps, then intervals shrinking by ``0.03 N``
  down to ``0.06 N``) the step size is halved and the iterate reset to the best point when
  (1) the objective increased in at most ``rho = 75%`` of the steps since the last checkpoint, or
  (2) the step size was not reduced at the last checkpoint and the best objective did not
  improve since then.

Objectives: ``"ce"`` (APGD-CE), ``"dlr"`` (APGD-DLR), ``"cw"`` or a callable. ``targeted=True``
attacks toward ``y``. With ``n_target_classes=k`` the attack is APGD-T: an untargeted attack
(misclassify ``y``) run as ``k`` targeted-DLR attacks, one per class among the top ``k`` other
logits of the clean input, keeping the worst case per example.

All restarts/targets and steps run in one compiled ``tf.while_loop``; one trace per
(model, configuration, per-example shape, dtype). ``early_stop=True`` (the default here, as in
AutoAttack) freezes examples once misclassified.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from . import _validate
from ._base import (
    Attack,
    AttackResult,
    cached,
    chunk_seed,
    prepare,
    relaxed_spec,
    run_in_chunks,
    seed_tensor,
    spec_key,
    weak_caller,
)
from ._engine import expand_rows, keep_best
from .norms import canonical_norm, clip_to_bounds, project, steepest_ascent
from .objectives import targeted_dlr

__all__ = ["apgd", "APGD", "checkpoint_schedule"]


def checkpoint_schedule(steps: int) -> list[int]:
    """The iterations (1-based counts of steps) at which APGD checks its step size.

    Follows the reference implementation's discretisation of ``p_0 = 0, p_1 = 0.22``,
    ``p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06)``.
    """
    first = max(int(0.22 * steps), 1)
    decr = max(int(0.03 * steps), 1)
    kmin = max(int(0.06 * steps), 1)
    out, k, at = [], first, 0
    while at + k <= steps:
        at += k
        out.append(at)
        k = max(k - decr, kmin)
    return out


def _random_start(x, eps, norm, seed):
    if norm == "linf":
        u = tf.random.stateless_uniform(tf.shape(x), seed, -1.0, 1.0, dtype=x.dtype)
        return x + eps * u
    t = tf.random.stateless_normal(tf.shape(x), seed, dtype=x.dtype)
    n = tf.sqrt(tf.reduce_sum(tf.square(tf.reshape(t, [tf.shape(x)[0], -1])), axis=1))
    return x + eps * t / expand_rows(tf.maximum(n, 1e-12), x)


def _build(p, model, training, *, norm, steps, runs, multi_target, n_targets, early_stop, rho,
           alpha, jit_compile):
    model_call = weak_caller(model, training)  # weak: the cache must not keep the model
    base_value_fn = p.value_fn
    n_steps = int(steps)
    first = max(int(0.22 * steps), 1)
    decr = max(int(0.03 * steps), 1)
    kmin = max(int(0.06 * steps), 1)

    def value_fn(xa, y, y_true, target):
        if multi_target:
            logits = model_call(xa)
            v = targeted_dlr(logits, y, target)
            succ = tf.not_equal(tf.argmax(logits, axis=-1), y)
            return tf.cast(v, xa.dtype), succ
        return base_value_fn(xa, y, y_true)

    def vag(xa, y, y_true, target):
        with tf.GradientTape() as tape:
            tape.watch(xa)
            obj, succ = value_fn(xa, y, y_true, target)
            total = tf.reduce_sum(obj)
        g = tape.gradient(total, xa)
        return obj, succ, (tf.zeros_like(xa) if g is None else g)

    def proj(xa, x, eps, lo, hi):
        return clip_to_bounds(x + project(xa - x, eps, norm), lo, hi)

    def loop(x, y, y_true, eps, lo, hi, seed):
        b = tf.shape(x)[0]
        dt = x.dtype
        if multi_target:
            clean = model_call(x)
            order = tf.argsort(clean, axis=-1, direction="DESCENDING", stable=True)
        best_x = x
        best_obj = tf.fill([b], tf.constant(-np.inf, dt))
        best_succ = tf.zeros([b], tf.bool)
        rows = tf.constant(0, tf.int64)

        def run_cond(r, best_x, best_obj, best_succ, rows):
            c = r < runs
            if early_stop:
                c = tf.logical_and(c, tf.reduce_any(tf.logical_not(best_succ)))
            return c

        def run_body(r, best_x, best_obj, best_succ, rows):
            if multi_target:
                target = tf.gather(order, r % n_targets + 1, axis=1)
                # a fresh objective: the previous run's values are for another target
                best_obj = tf.where(best_succ, best_obj, tf.fill([b], tf.constant(-np.inf, dt)))
            else:
                target = y
            s = tf.random.experimental.stateless_fold_in(seed, r)
            x0 = proj(_random_start(x, eps, norm, s), x, eps, lo, hi)
            active = tf.logical_not(best_succ) if early_stop else tf.ones([b], tf.bool)
            obj, succ, g = vag(x0, y, y_true, target)
            rows = rows + tf.cast(b, tf.int64)
            best_x, best_obj, best_succ = keep_best(best_x, best_obj, best_succ, x0, obj, succ)
            if early_stop:
                active = tf.logical_and(active, tf.logical_not(succ))
            eta = tf.fill([b], 2.0 * eps)
            # run state: current point, previous point, gradient at current point, per-run max
            xk, xprev = x0, x0
            fmax, xmax, gmax = obj, x0, g
            fprev = obj
            state = dict(
                i=tf.constant(0), xk=xk, xprev=xprev, g=g, fprev=fprev, fmax=fmax, xmax=xmax,
                gmax=gmax, eta=eta, n_inc=tf.zeros([b], dt), counter=tf.constant(0),
                k=tf.constant(first), fmax_last=fmax, reduced_last=tf.ones([b], tf.bool),
                active=active, best_x=best_x, best_obj=best_obj, best_succ=best_succ, rows=rows)

            def cond(st):
                c = st["i"] < n_steps
                if early_stop:
                    c = tf.logical_and(c, tf.reduce_any(st["active"]))
                return c

            def body(st):
                st = dict(st)
                xk, g = st["xk"], st["g"]
                a = tf.where(st["i"] > 0, tf.constant(alpha, dt), tf.constant(1.0, dt))
                d = steepest_ascent(g, norm)
                z = proj(xk + expand_rows(st["eta"], xk) * d, x, eps, lo, hi)
                x_new = proj(xk + a * (z - xk) + (1.0 - a) * (xk - st["xprev"]), x, eps, lo, hi)
                act = expand_rows(st["active"], xk)
                x_new = tf.where(act, x_new, xk)
                obj, succ, g_new = vag(x_new, y, y_true, target)
                st["rows"] = st["rows"] + tf.cast(b, tf.int64)
                st["best_x"], st["best_obj"], st["best_succ"] = keep_best(
                    st["best_x"], st["best_obj"], st["best_succ"], x_new, obj, succ)
                if early_stop:
                    st["active"] = tf.logical_and(st["active"], tf.logical_not(succ))
                st["n_inc"] = st["n_inc"] + tf.cast(obj > st["fprev"], dt)
                improved = obj > st["fmax"]
                st["xmax"] = tf.where(expand_rows(improved, xk), x_new, st["xmax"])
                st["gmax"] = tf.where(expand_rows(improved, xk), g_new, st["gmax"])
                st["fmax"] = tf.where(improved, obj, st["fmax"])
                st["xprev"], st["xk"], st["g"], st["fprev"] = xk, x_new, g_new, obj
                st["counter"] = st["counter"] + 1
                check = tf.equal(st["counter"], st["k"])
                kf = tf.cast(st["k"], dt)
                osc = st["n_inc"] <= kf * rho
                no_impr = tf.logical_and(tf.logical_not(st["reduced_last"]),
                                         st["fmax_last"] >= st["fmax"])
                red = tf.logical_and(check, tf.logical_or(osc, no_impr))
                st["eta"] = tf.where(red, st["eta"] / 2.0, st["eta"])
                st["xk"] = tf.where(expand_rows(red, xk), st["xmax"], st["xk"])
                st["g"] = tf.where(expand_rows(red, xk), st["gmax"], st["g"])
                st["reduced_last"] = tf.where(check, tf.logical_or(osc, no_impr),
                                              st["reduced_last"])
                st["fmax_last"] = tf.where(check, st["fmax"], st["fmax_last"])
                st["n_inc"] = tf.where(check, tf.zeros_like(st["n_inc"]), st["n_inc"])
                st["k"] = tf.where(check, tf.maximum(st["k"] - decr, kmin), st["k"])
                st["counter"] = tf.where(check, 0, st["counter"])
                st["i"] = st["i"] + 1
                return (st,)

            (st,) = tf.while_loop(cond, body, (state,))
            return r + 1, st["best_x"], st["best_obj"], st["best_succ"], st["rows"]

        _, best_x, _, _, rows = tf.while_loop(
            run_cond, run_body, (tf.constant(0), best_x, best_obj, best_succ, rows))
        return best_x, rows

    sig = [relaxed_spec(p.x), tf.nest.map_structure(relaxed_spec, p.y), relaxed_spec(p.y_true),
           tf.TensorSpec([], p.x.dtype), tf.TensorSpec(p.lo.shape, p.x.dtype),
           tf.TensorSpec(p.hi.shape, p.x.dtype), tf.TensorSpec([2], tf.int32)]
    return tf.function(loop, input_signature=sig, jit_compile=bool(jit_compile))


@tf.autograph.experimental.do_not_convert
def _apgd_run(model, x, y=None, *, eps=None, norm="linf", clip_min=None, clip_max=None,
              targeted=False, seed=None, steps=100, restarts=1, objective="ce",
              n_target_classes=None, early_stop=True, rho=0.75, momentum=0.75, training=False,
              jit_compile=False, loss_fn=None, batch_size=None):
    norm = canonical_norm(norm)
    if norm not in ("linf", "l2"):
        raise ValueError(f"norm: APGD supports 'linf' and 'l2', got {norm!r}")
    multi = n_target_classes is not None
    if multi:
        _validate.check_positive_int(n_target_classes, "n_target_classes")
        if targeted:
            raise ValueError("targeted: APGD-T (n_target_classes) is an untargeted attack that "
                             "cycles over target classes; pass targeted=False")
        if loss_fn is not None:
            raise ValueError("n_target_classes: not available with loss_fn")
    p = prepare(model, x, y, eps=eps, clip_min=clip_min, clip_max=clip_max, targeted=targeted,
                objective="ce" if multi else objective, training=training, loss_fn=loss_fn,
                batch_size=batch_size)
    _validate.check_positive_int(steps, "steps")
    _validate.check_positive_int(restarts, "restarts")
    if early_stop and not p.has_success:
        raise ValueError("early_stop: needs integer class labels; pass early_stop=False")
    runs = int(restarts)
    if multi:
        if p.num_classes is not None:
            if p.num_classes < 4:
                raise ValueError("n_target_classes: APGD-T's targeted DLR needs >= 4 classes")
            n_target_classes = min(int(n_target_classes), p.num_classes - 1)
        runs = int(n_target_classes) * int(restarts)
    cfg = ("apgd", norm, int(steps), runs, int(n_target_classes or 0), bool(early_stop),
           float(rho), float(momentum), bool(jit_compile))
    key = p.key + cfg + spec_key((p.x, p.y, p.y_true)) + (tuple(p.lo.shape.as_list()),)
    fn = cached(p.owner, key, lambda: _build(
        p, model, training, norm=norm, steps=steps, runs=runs, multi_target=multi,
        n_targets=int(n_target_classes) if multi else 1,
        early_stop=early_stop, rho=float(rho), alpha=float(momentum), jit_compile=jit_compile))
    eps_t, seed_t = tf.cast(eps, p.x.dtype), seed_tensor(seed)
    x_adv, (rows,) = run_in_chunks(p, lambda xc, yc, ytc, k: fn(
        xc, yc, ytc, eps_t, p.lo, p.hi, chunk_seed(seed_t, k)))
    fwd = p.forward_passes + (int(p.x.shape[0]) if multi and p.eager else 0)
    return AttackResult(x_adv, rows, fwd)


@tf.autograph.experimental.do_not_convert
def apgd(model: Any, x: Any, y: Any = None, *, eps: Any, norm: Any = "linf", clip_min: Any, clip_max: Any,
         targeted: bool = False, seed: Any = None, steps: int = 100, restarts: int = 1, objective: Any = "ce",
         n_target_classes: int | None = None, early_stop: bool = True, rho: float = 0.75,
         momentum: Any = 0.75, training: Any = False, jit_compile: bool = False,
         loss_fn: Callable | None = None, batch_size: int | None = None) -> tf.Tensor:
    """APGD (Croce & Hein 2020) under L∞ or L2; returns ``x_adv``.

    ``objective="ce"`` is APGD-CE, ``"dlr"`` APGD-DLR; ``n_target_classes=9`` is APGD-T (targeted
    DLR toward each of the top-9 other classes, untargeted goal). ``rho`` is the checkpoint
    threshold and ``momentum`` the paper's ``alpha``. Other arguments as in
    :func:`attacks.projected_gradient_descent` (``step_size`` is not needed: it starts at
    ``2 eps`` and adapts; ``batch_size``: examples per compiled call, chunk ``k`` of a larger
    ``x`` seeded ``stateless_fold_in(seed, k)``).
    """
    return _apgd_run(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                     targeted=targeted, seed=seed, steps=steps, restarts=restarts,
                     objective=objective, n_target_classes=n_target_classes,
                     early_stop=early_stop, rho=rho, momentum=momentum, training=training,
                     jit_compile=jit_compile, loss_fn=loss_fn, batch_size=batch_size).x_adv


class APGD(Attack):
    """Configured :func:`apgd`: ``APGD(eps=8/255, objective="dlr")(model, x, y)``."""

    name = "apgd"
    norms = ("linf", "l2")
    supports_early_stop = True
    _run = staticmethod(_apgd_run)
