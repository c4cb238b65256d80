"""FAB, the fast adaptive boundary attack: Croce & Hein, "Minimally distorted adversarial examples
with a fast adaptive boundary attack", ICML 2020 — L∞, L2 and L1, untargeted and targeted.

FAB looks for the *smallest* perturbation that changes the decision. Each iteration, per example:

1. linearise the decision boundary at the current point ``x_k``: for the untargeted attack the
   class ``j != y`` whose linearised boundary ``f_j - f_y = 0`` is closest in the attack's norm
   (``|f_j - f_y| / ||grad f_j - grad f_y||_*``, the dual norm), for a targeted run the boundary
   between the target and one other class;
2. project ``x_k`` and the original ``x`` onto that hyperplane *inside the box*
   ``[clip_min, clip_max]`` (:func:`boundary_projection`, exact for each norm): ``d_k`` and ``d_0``;
3. step ``x_{k+1} = clip((1 - a)(x_k + eta d_k) + a (x + eta d_0))`` with
   ``a = min(|d_k| / (|d_k| + |d_0|), alpha_max)`` — a biased step toward the original point, and
   an overshoot ``eta``;
4. when ``x_{k+1}`` is adversarial, record it if it is the closest found so far and pull it back
   toward ``x``: ``x_{k+1} = x + beta (x_{k+1} - x)``.

Defaults are the paper's and the reference implementation's (fra31/auto-attack,
``autoattack/fab_base.py``): 100 iterations, ``alpha_max = 0.1``, ``eta = 1.05``, ``beta = 0.9``;
restart ``r > 0`` starts from a random point at distance ``eps / 2`` (uniform direction for L∞,
Gaussian for L2 and L1) clipped into the box, restart 0 from ``x`` itself.

**Untargeted, targeted, FAB-T.** ``targeted=False`` changes the decision away from ``y`` (all
classes' boundaries compete each step, one Jacobian per step). ``n_target_classes=k`` is FAB-T
(AutoAttack's ``fab-t``): still untargeted in its goal, run once per class among the ``k`` most
likely other classes of the clean input, each run linearising only the boundary between ``y``
and that class (one gradient per step); the smallest adversarial point over the runs is kept.
``targeted=True`` takes ``y`` as target classes: success is ``argmax == y``, and each step
linearises the boundary between the target and the strongest other class at the current point
(the reference's FAB-T boundary when that class is the label).

**Minimal distortion and robustness.** Without ``eps`` the attack returns the smallest
adversarial point it found (``x`` where it found none; examples already misclassified, or
already at their target, keep ``x``, distance 0). With ``eps`` it is a robustness attack, as
AutoAttack uses it: an example counts as broken only when that point lies within ``eps`` (else
``x`` is returned), examples broken within ``eps`` are not attacked by later restarts and
targets, and with ``early_stop`` the loop exits once every example is broken within ``eps``.

**Why FAB has its own loop instead of** :mod:`attacks._engine`: the engine's step is projected
steepest *ascent* of one scalar objective inside a fixed ball. FAB's step is a projection onto a
linearised decision hyperplane chosen among several classes from their Jacobian, biased toward
the original point, with no ball to project on, and its bookkeeping keeps the *closest*
adversarial point rather than the highest objective. It shares the rest: argument validation
(:func:`attacks._base.prepare`), the compiled-function cache, chunking over large batches
(:func:`attacks._base.run_in_chunks`) and the per-example masks.

Cost per iteration and example: one forward pass plus, untargeted, the Jacobian of all ``C``
logits (``tape.batch_jacobian``: counted as ``C`` gradient rows), or, targeted and FAB-T, one
gradient; and one forward pass to check success.

A linear two-class model ``logits = [x.w, -x.w]``: the closest L2 boundary point of ``x`` lies at
distance ``|x.w| / ||w||_2`` (here ``0.1 / sqrt(5) = 0.0447``):

>>> import numpy as np, tensorflow as tf
>>> w = tf.constant([[1.0], [-2.0]])
>>> model = lambda x, training=False: tf.concat([x @ w, -(x @ w)], axis=1)
>>> x = tf.constant([[0.5, 0.2]])
>>> x_adv = fab(model, x, norm="l2", clip_min=0.0, clip_max=1.0, steps=20)
>>> round(float(tf.norm(x_adv - x)), 3), int(tf.argmax(model(x_adv), 1)[0])
(0.045, 1)
"""

from __future__ import annotations

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
from ._chunks import per_class_chunk
from ._engine import expand_rows
from .norms import canonical_norm, clip_to_bounds

__all__ = ["fab", "FAB", "boundary_projection"]

_BIG = 1e30  # a multiplier larger than any useful one (finite: 0 * _BIG must stay 0)


def _flat_norm(d: tf.Tensor, norm: str) -> tf.Tensor:
    """Per-row norm of ``d [N, D]``."""
    if norm == "linf":
        return tf.reduce_max(tf.abs(d), axis=1)
    if norm == "l2":
        return tf.sqrt(tf.reduce_sum(tf.square(d), axis=1))
    return tf.reduce_sum(tf.abs(d), axis=1)


def _dual_norm(g: tf.Tensor, norm: str) -> tf.Tensor:
    """The dual norm over the last axis (L1 for L∞, L2 for L2, L∞ for L1)."""
    if norm == "linf":
        return tf.reduce_sum(tf.abs(g), axis=-1)
    if norm == "l2":
        return tf.sqrt(tf.reduce_sum(tf.square(g), axis=-1))
    return tf.reduce_max(tf.abs(g), axis=-1)


def _capped_level(weight: tf.Tensor, cap: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
    """The smallest ``lam >= 0`` with ``sum_i weight_i * min(lam, cap_i) = target`` per row
    (``weight, cap >= 0`` of shape ``[N, D]``, ``target [N]``), or ``_BIG`` when even
    ``lam = inf`` falls short. The sum is piecewise linear and nondecreasing in ``lam`` with
    breakpoints at the caps: sort them, evaluate the sum at each, solve on the right piece."""
    order = tf.argsort(cap, axis=1)
    cap_s = tf.gather(cap, order, batch_dims=1)
    weight_s = tf.gather(weight, order, batch_dims=1)
    below = tf.cumsum(weight_s * cap_s, axis=1, exclusive=True)  # caps already reached
    rest = tf.cumsum(weight_s, axis=1, reverse=True)              # weights still growing
    at_breakpoints = below + cap_s * rest
    piece = tf.reduce_sum(tf.cast(at_breakpoints < target[:, None], tf.int32), axis=1)
    feasible = piece < tf.shape(cap)[1]
    piece = tf.minimum(piece, tf.shape(cap)[1] - 1)
    lam = (target - tf.gather(below, piece, batch_dims=1)) / tf.maximum(
        tf.gather(rest, piece, batch_dims=1), 1e-30)
    return tf.where(feasible, tf.maximum(lam, 0.0), tf.cast(_BIG, cap.dtype))


def boundary_projection(point: tf.Tensor, normal: tf.Tensor, change: tf.Tensor, lo: tf.Tensor,
                        hi: tf.Tensor, norm: str) -> tf.Tensor:
    """The smallest step ``d`` (in ``norm``) with ``<normal, d> = change`` and
    ``lo <= point + d <= hi``, per row; when no step inside the box reaches the hyperplane, the
    box corner that gets closest to it (``d_i`` at its bound in the direction of ``normal_i``).

    ``point``, ``normal``, ``lo``, ``hi`` are ``[N, D]`` (``point`` inside the box), ``change``
    ``[N]``; ``norm`` a canonical name. Exact for each norm (FAB's projection, Croce & Hein 2020,
    Sec. 3, with a per-feature box): after orienting ``normal`` so that ``change >= 0``, each
    coordinate can move by at most ``cap_i`` (the room to its bound in the direction of
    ``sign(normal_i)``);

    * L∞: ``d_i = sign(n_i) min(lam, cap_i)`` with the smallest ``lam`` reaching the plane;
    * L2: ``d_i = sign(n_i) min(lam |n_i|, cap_i)`` (the KKT point ``clip(lam n, box)``);
    * L1: the coordinates of largest ``|n_i|`` first, each up to its cap, the last one partially.

    >>> d = boundary_projection(tf.constant([[0.5, 0.5]]), tf.constant([[1.0, 2.0]]),
    ...                         tf.constant([1.3]), tf.zeros([1, 2]), tf.ones([1, 2]), "l1")
    >>> [round(float(v), 3) for v in d[0]]  # the second coordinate to its bound, then the first
    [0.3, 0.5]
    """
    sign_r = tf.where(change >= 0, tf.ones_like(change), -tf.ones_like(change))
    w = normal * sign_r[:, None]
    r = tf.abs(change)
    up = tf.maximum(hi - point, 0.0)
    down = tf.maximum(point - lo, 0.0)
    cap = tf.where(w > 0, up, down)
    aw = tf.abs(w)
    direction = tf.sign(w)
    if norm == "linf":
        lam = _capped_level(aw, cap, r)
        return direction * tf.minimum(lam[:, None], cap)
    if norm == "l2":
        safe = tf.where(aw > 0, aw, tf.ones_like(aw))
        lam = _capped_level(tf.square(aw), tf.where(aw > 0, cap / safe, tf.zeros_like(cap)), r)
        return direction * tf.minimum(lam[:, None] * aw, cap)
    # L1: fill the coordinates in decreasing |w|
    order = tf.argsort(aw, axis=1, direction="DESCENDING", stable=True)
    rank = tf.argsort(order, axis=1, stable=True)
    aw_s = tf.gather(aw, order, batch_dims=1)
    filled = tf.cumsum(aw_s * tf.gather(cap, order, batch_dims=1), axis=1)
    last = tf.reduce_sum(tf.cast(filled < r[:, None], tf.int32), axis=1)  # the partial coordinate
    n = tf.shape(aw)[1]
    last_c = tf.minimum(last, n - 1)
    before = tf.gather(tf.concat([tf.zeros_like(filled[:, :1]), filled], 1), last_c, batch_dims=1)
    partial = (r - before) / tf.maximum(tf.gather(aw_s, last_c, batch_dims=1), 1e-30)
    last_col = last[:, None]
    size = tf.where(rank < last_col, cap,
                    tf.where(rank == last_col, tf.minimum(tf.maximum(partial[:, None], 0.0), cap),
                             tf.zeros_like(cap)))
    return direction * size


def _random_start(x, eps, norm, seed):
    """A point at distance ``eps / 2`` from ``x`` (before clipping), as the reference's restarts."""
    b = tf.shape(x)[0]
    if norm == "linf":
        t = tf.random.stateless_uniform(tf.shape(x), seed, -1.0, 1.0, dtype=x.dtype)
    else:
        t = tf.random.stateless_normal(tf.shape(x), seed, dtype=x.dtype)
    size = _flat_norm(tf.reshape(t, [b, -1]), norm)
    return x + 0.5 * eps * t / expand_rows(tf.maximum(size, 1e-12), x)


def _build(p, model, training, *, norm, steps, restarts, n_targets, mode, alpha_max, eta, beta,
           early_stop, minimal, jit_compile):
    """The compiled FAB loop: ``mode`` is ``"all"`` (untargeted), ``"fab-t"`` or ``"targeted"``."""
    model_call = weak_caller(model, training)  # weak: the cache must not keep the model
    runs = int(n_targets) * int(restarts)
    targeted = mode == "targeted"

    def logits_of(xa):
        return tf.cast(model_call(xa), xa.dtype)

    def success(logits, y):
        pred = tf.argmax(logits, axis=-1)
        return tf.equal(pred, y) if targeted else tf.not_equal(pred, y)

    def hyperplane(x1, y, target):
        """``(f [B], w [B, D], logits [B, C], gradient rows)``: the linearised boundary
        ``f + <w, z - x1> = 0`` at ``x1``."""
        b = tf.shape(x1)[0]
        if mode == "all":
            with tf.GradientTape() as tape:
                tape.watch(x1)
                logits = logits_of(x1)
            jac = tape.batch_jacobian(logits, x1)
            c = tf.shape(logits)[1]
            jac = tf.reshape(jac, [b, c, -1])
            df = logits - tf.gather(logits, y, batch_dims=1)[:, None]
            dg = jac - tf.gather(jac, y, batch_dims=1)[:, None, :]
            dist = tf.abs(df) / (_dual_norm(dg, norm) + 1e-12)
            dist = tf.where(tf.one_hot(y, c, on_value=True, off_value=False),
                            tf.cast(np.inf, dist.dtype), dist)
            j = tf.argmin(dist, axis=1)
            return (tf.gather(df, j, batch_dims=1), tf.gather(dg, j, batch_dims=1), logits,
                    tf.cast(b * c, tf.int64))
        with tf.GradientTape() as tape:
            tape.watch(x1)
            logits = logits_of(x1)
            if mode == "fab-t":  # the label against this run's target
                high, low = target, y
            else:  # the target against the strongest other class
                c = tf.shape(logits)[1]
                others = tf.where(tf.one_hot(y, c, on_value=True, off_value=False),
                                  tf.cast(-np.inf, logits.dtype), logits)
                high, low = y, tf.argmax(tf.stop_gradient(others), axis=1)
            diff = tf.gather(logits, high, batch_dims=1) - tf.gather(logits, low, batch_dims=1)
            total = tf.reduce_sum(diff)
        g = tape.gradient(total, x1)
        if g is None:
            g = tf.zeros_like(x1)
        return diff, tf.reshape(g, [b, -1]), logits, tf.cast(b, tf.int64)

    def loop(x, y, eps, lo, hi, seed):
        b = tf.shape(x)[0]
        dt = x.dtype
        x0 = tf.reshape(x, [b, -1])
        lo_f = tf.reshape(tf.broadcast_to(lo, tf.shape(x)), [b, -1])
        hi_f = tf.reshape(tf.broadcast_to(hi, tf.shape(x)), [b, -1])
        clean = logits_of(x)
        frows = tf.cast(b, tf.int64)
        rows = tf.constant(0, tf.int64)
        order = tf.argsort(clean, axis=-1, direction="DESCENDING", stable=True)
        best = x
        best_dist = tf.where(success(clean, y), tf.zeros([b], dt), tf.fill([b], tf.cast(np.inf, dt)))

        def done(best_dist):  # broken within eps: not attacked again (never, without eps)
            if minimal:
                return tf.zeros_like(best_dist, tf.bool)
            return best_dist <= eps

        def run_cond(r, best, best_dist, rows, frows):
            return tf.logical_and(r < runs, tf.reduce_any(tf.logical_not(done(best_dist))))

        def run_body(r, best, best_dist, rows, frows):
            target = tf.gather(order, r // restarts + 1, axis=1)
            if restarts > 1:
                s = tf.random.experimental.stateless_fold_in(seed, r)
                start = clip_to_bounds(_random_start(x, eps, norm, s), lo, hi)
                x1 = tf.where(r % restarts > 0, start, x)
            else:
                x1 = x

            def step_cond(i, x1, best, best_dist, rows, frows):
                c = i < steps
                if early_stop:
                    c = tf.logical_and(c, tf.reduce_any(tf.logical_not(done(best_dist))))
                return c

            def step_body(i, x1, best, best_dist, rows, frows):
                f, w, _, grad_rows = hyperplane(x1, y, target)
                x1f = tf.reshape(x1, [b, -1])
                d1 = boundary_projection(x1f, w, -f, lo_f, hi_f, norm)
                d0 = boundary_projection(x0, w, -f + tf.reduce_sum(w * (x1f - x0), axis=1),
                                         lo_f, hi_f, norm)
                a1 = tf.maximum(_flat_norm(d1, norm), 1e-8)
                a0 = tf.maximum(_flat_norm(d0, norm), 1e-8)
                alpha = tf.clip_by_value(a1 / (a1 + a0), 0.0, alpha_max)[:, None]
                xn = (x1f + eta * d1) * (1.0 - alpha) + (x0 + eta * d0) * alpha
                xn = tf.minimum(tf.maximum(xn, lo_f), hi_f)
                x_new = tf.reshape(xn, tf.shape(x))
                adv = success(logits_of(x_new), y)
                dist = _flat_norm(xn - x0, norm)
                closer = tf.logical_and(adv, dist < best_dist)
                best = tf.where(expand_rows(closer, x), x_new, best)
                best_dist = tf.where(closer, dist, best_dist)
                back = tf.reshape(x0 + beta * (xn - x0), tf.shape(x))
                x1 = tf.where(expand_rows(adv, x), back, x_new)
                return (i + 1, x1, best, best_dist, rows + grad_rows,
                        frows + tf.cast(b, tf.int64))

            _, _, best, best_dist, rows, frows = tf.while_loop(
                step_cond, step_body, (tf.constant(0), x1, best, best_dist, rows, frows))
            return r + 1, best, best_dist, rows, frows

        _, best, best_dist, rows, frows = tf.while_loop(
            run_cond, run_body, (tf.constant(0), best, best_dist, rows, frows))
        return best, best_dist, rows, frows

    sig = [relaxed_spec(p.x), relaxed_spec(p.y), tf.TensorSpec([], p.x.dtype),
           tf.TensorSpec(p.lo.shape, p.x.dtype), tf.TensorSpec(p.hi.shape, p.x.dtype),
           tf.TensorSpec([2], tf.int32)]
    # autograph=False: the loop is written in tf.while_loop, and converting it (and the model
    # call under it) took ~2-5 s per attack and process: most of a resumed run's start-up
    return tf.function(loop, input_signature=sig, jit_compile=bool(jit_compile), autograph=False)


@tf.autograph.experimental.do_not_convert
def _fab_run(model, x, y=None, *, eps=None, norm="linf", clip_min=None, clip_max=None,
             targeted=False, seed=None, steps=100, restarts=1, n_target_classes=None,
             alpha_max=0.1, eta=1.05, beta=0.9, early_stop=False, training=False,
             jit_compile=False, batch_size=None):
    norm = canonical_norm(norm)
    if norm not in ("linf", "l2", "l1"):
        raise ValueError(f"norm: FAB supports 'linf', 'l2' and 'l1', got {norm!r}")
    multi = n_target_classes is not None
    if multi:
        _validate.check_positive_int(n_target_classes, "n_target_classes")
        if targeted:
            raise ValueError("targeted: FAB-T (n_target_classes) is an untargeted attack that "
                             "cycles over target classes; pass targeted=False")
    _validate.check_positive_int(steps, "steps", maximum=_validate.MAX_STEPS)
    _validate.check_positive_int(restarts, "restarts", maximum=_validate.MAX_RESTARTS)
    _validate.check_nonnegative(alpha_max, "alpha_max")
    _validate.check_nonnegative(eta, "eta")
    _validate.check_nonnegative(beta, "beta")
    if not 0.0 <= float(alpha_max) <= 1.0:
        raise ValueError(f"alpha_max must be in [0, 1], got {alpha_max!r}")
    if not 0.0 < float(beta) < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta!r}")
    if float(eta) < 1.0:
        raise ValueError(f"eta must be >= 1 (an overshoot), got {eta!r}")
    if eps is None and int(restarts) > 1:
        raise ValueError("eps: FAB's random restarts start at distance eps / 2; pass eps or "
                         "restarts=1")
    if eps is None and early_stop:
        raise ValueError("early_stop: stops once an example is broken within eps; pass eps")
    p = prepare(model, x, y, eps=eps, clip_min=clip_min, clip_max=clip_max, targeted=targeted,
                objective="cw", training=training, allow_none_eps=True, batch_size=batch_size)
    p.batch_size = per_class_chunk(batch_size, p.num_classes)  # a Jacobian of every class
    if p.num_classes is not None:
        if p.num_classes < 2:
            raise ValueError("model: FAB needs at least 2 classes")
        if multi and int(n_target_classes) >= p.num_classes:
            raise ValueError(f"n_target_classes must be < the number of classes "
                             f"({p.num_classes}): at most {p.num_classes - 1} other classes to "
                             f"target, got {n_target_classes}")
    mode = "fab-t" if multi else ("targeted" if targeted else "all")
    n_targets = int(n_target_classes) if multi else 1
    cfg = ("fab", norm, mode, int(steps), int(restarts), n_targets, float(alpha_max), float(eta),
           float(beta), bool(early_stop), eps is None, bool(jit_compile))
    key = p.key + cfg + spec_key((p.x, p.y)) + (tuple(p.lo.shape.as_list()),)
    fn = cached(p.owner, key, lambda: _build(
        p, model, training, norm=norm, steps=int(steps), restarts=int(restarts),
        n_targets=n_targets, mode=mode, alpha_max=float(alpha_max), eta=float(eta),
        beta=float(beta), early_stop=bool(early_stop), minimal=eps is None,
        jit_compile=jit_compile))
    dt = p.x.dtype
    eps_t = tf.cast(np.inf if eps is None else eps, dt)
    seed_t = seed_tensor(seed)

    def attack_chunk(xc, yc, ytc, k):
        best, best_dist, rows, frows = fn(xc, yc, eps_t, p.lo, p.hi, chunk_seed(seed_t, k))
        x_adv = tf.where(expand_rows(best_dist <= eps_t, xc), best, xc)
        return x_adv, rows, frows

    x_adv, (rows, frows) = run_in_chunks(p, attack_chunk)
    if p.eager:
        frows += p.forward_passes
    return AttackResult(x_adv, rows, frows)


@tf.autograph.experimental.do_not_convert
def fab(model: Any, x: Any, y: Any = None, *, eps: Any = None, norm: Any = "linf",
        clip_min: Any, clip_max: Any, targeted: bool = False, seed: Any = None, steps: int = 100,
        restarts: int = 1, n_target_classes: int | None = None, alpha_max: float = 0.1,
        eta: float = 1.05, beta: float = 0.9, early_stop: bool = False, training: Any = False,
        jit_compile: bool = False, batch_size: int | None = None) -> tf.Tensor:
    """FAB (Croce & Hein 2020) under L∞, L2 or L1; returns ``x_adv`` (see the module docstring).

    Args:
      model: ``model(x, training=False) -> logits [B, C]``.
      x: float batch ``[B, ...]`` inside ``[clip_min, clip_max]``; never modified.
      y: integer labels ``[B]`` (``None``: the model's predictions); with ``targeted=True`` the
        target classes.
      eps: ``None`` for the minimal adversarial point found; a budget (same units as ``x``) for a
        robustness attack: points farther than ``eps`` are replaced by ``x``. Restarts start at
        distance ``eps / 2`` (needed when ``restarts > 1``).
      norm: ``"linf"``, ``"l2"`` or ``"l1"`` — the norm FAB minimises.
      clip_min, clip_max: the box, scalars or per feature.
      targeted: ``y`` holds targets; success is reaching them.
      seed: seed of the random restarts; ``batch_size`` chunk ``k`` uses
        ``stateless_fold_in(seed, k)``.
      steps: iterations per run (100). ``restarts``: runs per target (1), restart 0 from ``x``.
      n_target_classes: FAB-T, one run per class among the most likely other classes of the
        clean input (must be below the number of classes).
      alpha_max, eta, beta: the step's largest bias toward ``x``, the overshoot, the pull-back
        factor after a success (0.1, 1.05, 0.9).
      early_stop: with ``eps``, exit once every example is broken within ``eps``.
      training, jit_compile, batch_size: as in :func:`attacks.projected_gradient_descent`.
    """
    return _fab_run(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                    targeted=targeted, seed=seed, steps=steps, restarts=restarts,
                    n_target_classes=n_target_classes, alpha_max=alpha_max, eta=eta, beta=beta,
                    early_stop=early_stop, training=training, jit_compile=jit_compile,
                    batch_size=batch_size).x_adv


class FAB(Attack):
    """Configured :func:`fab`: ``FAB(norm="l2", n_target_classes=9)(model, x, y, eps=0.5)``."""

    name = "fab"
    norms = ("linf", "l2", "l1")
    supports_early_stop = True
    _run = staticmethod(_fab_run)

    def check_num_classes(self, num_classes: int) -> None:
        """Raise before any work when the configuration cannot run on ``num_classes`` classes."""
        k = self.config.get("n_target_classes")
        if k is not None and int(k) >= int(num_classes):
            raise ValueError(f"n_target_classes must be < the number of classes "
                             f"({num_classes}), got {k}")
