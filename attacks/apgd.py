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

Under L1 (APGD-L1, Croce & Hein, "Mind the box: l1-APGD for sparse adversarial attacks on image
classifiers", ICML 2021, as the reference implementation runs it):

* start at a Gaussian point projected onto the L1 ball and the box (:func:`attacks.norms.project_l1_box`);
* step along the sparse direction ``sign(g)`` on the coordinates whose ``|g|`` is among the top
  ``k`` (``k`` starts at 20% of the features), normalised to unit L1 norm, of size ``eps``, then
  the exact projection onto the L1 ball and the box; no momentum;
* every ``max(0.04 N, 1)`` steps: if the best point became sparser (L0 below 95% of the last
  check's) the iterate restarts from it at step size ``eps``, else the step shrinks by 1.5 (down
  to ``eps / 10``); ``k`` becomes the best point's L0 / 1.5;
* with ``eps_schedule`` (the default, AutoAttack's choice for L1) the steps run in three stages
  at 3, 2 and 1 times eps (30%, 30%, 40% of them), each from the previous stage's best point
  projected onto the smaller ball; only the last stage's points count as adversarial.

``eot_iter > 1`` averages every gradient over that many passes (expectation over transformation,
for randomised models, as AutoAttack's ``rand`` version).

Objectives: ``"ce"`` (APGD-CE), ``"dlr"`` (APGD-DLR), ``"cw"`` or a callable. ``targeted=True``
attacks toward ``y``. With ``n_target_classes=k`` the attack is APGD-T: an untargeted attack
(misclassify ``y``) run as ``k`` targeted-DLR attacks, one per class among the top ``k`` other
logits of the clean input, keeping the worst case per example.

All restarts/targets and steps run in one compiled ``tf.while_loop``; one trace per
(model, configuration, per-example shape, dtype). ``early_stop=True`` (the default here, as in
AutoAttack) freezes examples once misclassified.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad import checks as _checks

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
from .norms import canonical_norm, clip_to_bounds, project, project_l1_box, steepest_ascent
from .objectives import targeted_dlr

__all__ = ["apgd", "APGD", "checkpoint_schedule", "l1_stages"]


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


def l1_stages(steps: int, eps_schedule: bool) -> list[tuple[float, int]]:
    """The ``(eps factor, steps)`` stages of APGD-L1: with ``eps_schedule`` 30%, 30% and the
    rest of the steps at 3, 2 and 1 times eps (the reference's ``use_largereps``, rounded up as
    it does), else all steps at eps.

    >>> l1_stages(100, True), l1_stages(10, False)
    ([(3.0, 30), (2.0, 30), (1.0, 40)], [(1.0, 10)])
    """
    if not eps_schedule:
        return [(1.0, int(steps))]
    first = math.ceil(0.3 * steps)
    return [(3.0, first), (2.0, first), (1.0, int(steps) - 2 * first)]


def _l0(delta):
    return tf.reduce_sum(tf.cast(tf.not_equal(tf.reshape(delta, [tf.shape(delta)[0], -1]), 0.0),
                                 delta.dtype), axis=1)


def _build(p, model, training, *, norm, steps, runs, multi_target, n_targets, early_stop, rho,
           alpha, jit_compile, eot_iter=1, eps_schedule=True):
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

    def vag_once(xa, y, y_true, target):
        with tf.GradientTape() as tape:
            tape.watch(xa)
            obj, succ = value_fn(xa, y, y_true, target)
            total = tf.reduce_sum(obj)
        g = tape.gradient(total, xa)
        if g is None:
            warnings.warn("the attack's objective has no gradient with respect to x (no "
                          "differentiable path from x to it): the gradient steps cannot move x",
                          UserWarning, stacklevel=2)
            g = tf.zeros_like(xa)
        return obj, succ, g

    def vag(xa, y, y_true, target):
        """Objective, success and gradient; with ``eot_iter > 1`` the gradient is averaged over
        that many passes (expectation over transformation, for randomised models) and the
        objective and success are the last pass's, as in the reference."""
        if eot_iter == 1:
            return vag_once(xa, y, y_true, target)
        obj, succ, g = vag_once(xa, y, y_true, target)

        def eot_body(j, obj, succ, g):
            o, sc, gj = vag_once(xa, y, y_true, target)
            return j + 1, o, sc, g + gj

        _, obj, succ, g = tf.while_loop(lambda j, *_: j < eot_iter, eot_body,
                                        (tf.constant(1), obj, succ, g))
        return obj, succ, g / float(eot_iter)

    n_feat = int(np.prod(p.x.shape[1:].as_list()))
    passes = tf.constant(int(eot_iter), tf.int64)

    def l1_run(x, y, y_true, target, eps, lo, hi, s, best_x, best_obj, best_succ, rows):
        """One APGD-L1 run (Croce & Hein 2021, Alg. 1): the stages of :func:`l1_stages`, each a
        sparse-step ascent projected onto the L1 ball of its radius and the box; only the last
        stage (radius eps) can break an example."""
        b = tf.shape(x)[0]
        dt = x.dtype
        stages = l1_stages(n_steps, eps_schedule)
        start = tf.random.stateless_normal(tf.shape(x), s, dtype=dt)

        def onto(point, radius):  # the ball and the box (the clip only absorbs float rounding)
            return clip_to_bounds(x + project_l1_box(point - x, radius, lo - x, hi - x), lo, hi)

        x_cur = onto(x + start, stages[0][0] * eps)
        active = tf.logical_not(best_succ) if early_stop else tf.ones([b], tf.bool)
        for index, (factor, stage_steps) in enumerate(stages):
            final = index == len(stages) - 1
            # the last radius is shrunk by 1e-6 (relative) so that rounding x + d in float32
            # never leaves the eps ball (one float32 ulp of eps=12 is already 1e-6)
            eps_s = eps * (1.0 - 1e-6) if final else factor * eps
            xk = onto(x_cur, eps_s)
            obj, succ, g = vag(xk, y, y_true, target)
            rows = rows + passes * tf.cast(b, tf.int64)
            if final:
                best_x, best_obj, best_succ = keep_best(best_x, best_obj, best_succ, xk, obj,
                                                        succ)
                if early_stop:
                    active = tf.logical_and(active, tf.logical_not(succ))
            if eps_schedule:  # a start from the previous stage: its sparsity sets top-k
                sparsity = _l0(xk - x)
                topk = sparsity / n_feat / 1.5
            else:
                sparsity = tf.fill([b], tf.constant(float(n_feat), dt))
                topk = tf.fill([b], tf.constant(0.2, dt))
            step_max = factor * eps  # the reference's alpha = 1 for L1
            check_every = max(int(0.04 * stage_steps), 1)
            state = dict(i=tf.constant(0), xk=xk, g=g, fmax=obj, xmax=xk, gmax=g,
                         step=tf.fill([b], tf.cast(step_max, dt)), topk=topk, sp_old=sparsity,
                         counter=tf.constant(0), active=active, best_x=best_x,
                         best_obj=best_obj, best_succ=best_succ, rows=rows)

            def cond(st, stage_steps=stage_steps, final=final):
                c = st["i"] < stage_steps
                if final and early_stop:
                    c = tf.logical_and(c, tf.reduce_any(st["active"]))
                return c

            def body(st, final=final, eps_s=eps_s, step_max=step_max, onto=onto,
                     check_every=check_every):
                st = dict(st)
                xk, g = st["xk"], st["g"]
                gf = tf.reshape(g, [b, -1])
                ag = tf.abs(gf)
                position = tf.cast(tf.floor((1.0 - st["topk"]) * n_feat), tf.int32)
                position = tf.clip_by_value(position, 0, n_feat - 1)
                threshold = tf.gather(tf.sort(ag, axis=1), position, batch_dims=1)
                direction = tf.sign(gf) * tf.cast(ag >= threshold[:, None], dt)
                direction = direction / (tf.reduce_sum(tf.abs(direction), axis=1,
                                                       keepdims=True) + 1e-10)
                moved = xk + expand_rows(st["step"], xk) * tf.reshape(direction, tf.shape(xk))
                x_new = onto(moved, eps_s)
                if final and early_stop:
                    x_new = tf.where(expand_rows(st["active"], xk), x_new, xk)
                obj, succ, g_new = vag(x_new, y, y_true, target)
                st["rows"] = st["rows"] + passes * tf.cast(b, tf.int64)
                if final:
                    st["best_x"], st["best_obj"], st["best_succ"] = keep_best(
                        st["best_x"], st["best_obj"], st["best_succ"], x_new, obj, succ)
                    if early_stop:
                        st["active"] = tf.logical_and(st["active"], tf.logical_not(succ))
                improved = obj > st["fmax"]
                st["xmax"] = tf.where(expand_rows(improved, xk), x_new, st["xmax"])
                st["gmax"] = tf.where(expand_rows(improved, xk), g_new, st["gmax"])
                st["fmax"] = tf.where(improved, obj, st["fmax"])
                st["xk"], st["g"] = x_new, g_new
                st["counter"] = st["counter"] + 1
                check = tf.equal(st["counter"], check_every)
                # at a checkpoint: a sparser best point restarts from it at the full step size,
                # otherwise the step shrinks by 1.5 (down to a tenth); top-k follows the sparsity
                sparsity = _l0(st["xmax"] - x)
                sparser = tf.logical_and(check, sparsity < 0.95 * st["sp_old"])
                step = tf.where(sparser, tf.cast(step_max, dt), st["step"] / 1.5)
                step = tf.clip_by_value(step, step_max / 10.0, step_max)
                st["step"] = tf.where(check, step, st["step"])
                st["topk"] = tf.where(check, sparsity / n_feat / 1.5, st["topk"])
                st["sp_old"] = tf.where(check, sparsity, st["sp_old"])
                st["xk"] = tf.where(expand_rows(sparser, xk), st["xmax"], st["xk"])
                st["g"] = tf.where(expand_rows(sparser, xk), st["gmax"], st["g"])
                st["counter"] = tf.where(check, 0, st["counter"])
                st["i"] = st["i"] + 1
                return (st,)

            (st,) = tf.while_loop(cond, body, (state,))
            best_x, best_obj, best_succ = st["best_x"], st["best_obj"], st["best_succ"]
            rows, active = st["rows"], st["active"]
            x_cur = st["xmax"]  # the next stage starts from this stage's highest objective
        return best_x, best_obj, best_succ, rows

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
            if norm == "l1":
                best_x, best_obj, best_succ, rows = l1_run(
                    x, y, y_true, target, eps, lo, hi, s, best_x, best_obj, best_succ, rows)
                return r + 1, best_x, best_obj, best_succ, rows
            x0 = proj(_random_start(x, eps, norm, s), x, eps, lo, hi)
            active = tf.logical_not(best_succ) if early_stop else tf.ones([b], tf.bool)
            obj, succ, g = vag(x0, y, y_true, target)
            rows = rows + passes * tf.cast(b, tf.int64)
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
                st["rows"] = st["rows"] + passes * tf.cast(b, tf.int64)
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
    # autograph=False: the loop is written in tf.while_loop, and converting it (and the model
    # call under it) took ~2-5 s per attack and process: most of a resumed run's start-up
    return tf.function(loop, input_signature=sig, jit_compile=bool(jit_compile), autograph=False)


@tf.autograph.experimental.do_not_convert
def _apgd_run(model, x, y=None, *, eps=None, norm="linf", clip_min=None, clip_max=None,
              targeted=False, seed=None, steps=100, restarts=1, objective="ce",
              n_target_classes=None, early_stop=True, rho=0.75, momentum=0.75, training=False,
              jit_compile=False, loss_fn=None, batch_size=None, eot_iter=1, eps_schedule=True):
    norm = canonical_norm(norm)
    _validate.check_positive_int(eot_iter, "eot_iter", maximum=_validate.MAX_RESTARTS)
    _checks.number(rho, "rho", minimum=0, maximum=1)  # a fraction of the steps (0.75)
    _checks.number(momentum, "momentum", minimum=0, maximum=1)  # 1: no new gradient
    if norm == "l1" and eps_schedule and int(steps) < 3:
        raise ValueError(f"steps: APGD-L1's eps schedule (3, 2, 1 x eps) needs >= 3 steps, got "
                         f"{steps}; pass eps_schedule=False")
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
    _validate.check_positive_int(steps, "steps", maximum=_validate.MAX_STEPS)
    _validate.check_positive_int(restarts, "restarts", maximum=_validate.MAX_RESTARTS)
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
           float(rho), float(momentum), bool(jit_compile), int(eot_iter),
           bool(eps_schedule) and norm == "l1")
    key = p.key + cfg + spec_key((p.x, p.y, p.y_true)) + (tuple(p.lo.shape.as_list()),)
    fn = cached(p.owner, key, lambda: _build(
        p, model, training, norm=norm, steps=steps, runs=runs, multi_target=multi,
        n_targets=int(n_target_classes) if multi else 1,
        early_stop=early_stop, rho=float(rho), alpha=float(momentum), jit_compile=jit_compile,
        eot_iter=int(eot_iter), eps_schedule=bool(eps_schedule)))
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
         loss_fn: Callable | None = None, batch_size: int | None = None, eot_iter: int = 1,
         eps_schedule: bool = True) -> tf.Tensor:
    """APGD (Croce & Hein 2020) under L∞, L2 or L1 (APGD-L1, Croce & Hein 2021); returns
    ``x_adv``.

    ``objective="ce"`` is APGD-CE, ``"dlr"`` APGD-DLR; ``n_target_classes=9`` is APGD-T (targeted
    DLR toward each of the top-9 other classes, untargeted goal). ``rho`` is the checkpoint
    threshold and ``momentum`` the paper's ``alpha``. Other arguments as in
    :func:`attacks.projected_gradient_descent` (``step_size`` is not needed: it starts at
    ``2 eps`` and adapts; ``batch_size``: examples per compiled call, chunk ``k`` of a larger
    ``x`` seeded ``stateless_fold_in(seed, k)``). ``eot_iter`` averages each gradient over that
    many passes (expectation over transformation, for randomised models; AutoAttack's ``rand``
    version uses 20). ``eps_schedule`` (L1 only; ignored otherwise) runs the steps in the three
    stages of :func:`l1_stages`, as AutoAttack does for L1.
    """
    return _apgd_run(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                     targeted=targeted, seed=seed, steps=steps, restarts=restarts,
                     objective=objective, n_target_classes=n_target_classes,
                     early_stop=early_stop, rho=rho, momentum=momentum, training=training,
                     jit_compile=jit_compile, loss_fn=loss_fn, batch_size=batch_size,
                     eot_iter=eot_iter, eps_schedule=eps_schedule).x_adv


class APGD(Attack):
    """Configured :func:`apgd`: ``APGD(eps=8/255, objective="dlr")(model, x, y)``."""

    name = "apgd"
    norms = ("linf", "l2", "l1")
    supports_early_stop = True
    _run = staticmethod(_apgd_run)

    def check_num_classes(self, num_classes: int) -> None:
        """DLR needs 3 classes (4 targeted, and for APGD-T): raise before any work."""
        targeted_dlr = self.config.get("n_target_classes") is not None or (
            self.config.get("targeted") and self.config.get("objective") == "dlr")
        if self.config.get("objective") == "dlr" or targeted_dlr:
            needed = 4 if targeted_dlr else 3
            if num_classes < needed:
                raise ValueError(f"objective: {'targeted ' if targeted_dlr else ''}DLR needs at "
                                 f"least {needed} classes, the model has {num_classes}")
