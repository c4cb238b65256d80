"""Square Attack, Andriushchenko, Croce, Flammarion & Hein, "Square Attack: a query-efficient
black-box adversarial attack via random search", ECCV 2020 — L∞, L2 and L1 (the L1 version of
AutoAttack's reference implementation), gradient-free.

Random search on the margin loss ``z_y - max_{j!=y} z_j`` (targeted: ``max_{j!=t} z_j - z_t``):
each iteration proposes a change confined to a random square window whose side follows the
paper's schedule (``p`` halves at iterations 10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000 of
10000, rescaled to ``steps``) and keeps it per example only if the loss decreases.

* L∞: initialise with vertical stripes of ``±eps``; a proposal sets one window (per example, per
  channel) to a random ``±eps``.
* L2: initialise with a grid of "pseudo-Gaussian" bumps of random sign scaled to norm ``eps``;
  a proposal moves the perturbation mass of a second window into the first window's new bump
  (the paper's Algorithm 3), keeping the total norm at ``eps``.
* L1 (as the reference implementation of "Mind the box", Croce & Hein 2021): the same scheme
  with bumps weighted ``1/(k+1)^4`` and normalised in L1, each proposal projected onto the L1
  ball of radius ``eps (1 - 1e-6)`` and the box (:func:`attacks.norms.project_l1_box`).

Only forward passes (queries): a black-box check against gradient masking. Inputs must be images
``[B, H, W, C]`` (or ``[B, H, W]``). The whole search runs in one compiled ``tf.while_loop``;
``seed`` makes it deterministic. Successful examples stop being queried (``early_stop``).
"""

from __future__ import annotations

import math
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
from ._engine import expand_rows
from .norms import canonical_norm, clip_to_bounds, project, project_l1_box

__all__ = ["square", "Square"]


def p_schedule(p_init: float, it: int, n_iters: int, rescale: bool = True) -> float:
    """The fraction of pixels changed at iteration ``it``: the paper's schedule (halvings after
    iterations 10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000), stretched to ``n_iters`` as if
    it were 10000 when ``rescale``, at its own iteration counts otherwise (AutoAttack's
    ``resc_schedule=False``).

    >>> p_schedule(0.8, 30, 5000), p_schedule(0.8, 30, 5000, rescale=False)
    (0.2, 0.4)
    """
    if rescale:
        it = int(it / n_iters * 10000)
    for bound, div in ((8000, 512), (6000, 256), (4000, 128), (2000, 64), (1000, 32),
                       (500, 16), (200, 8), (50, 4), (10, 2)):
        if it > bound:
            return p_init / div
    return p_init


def _pseudo_gaussian_rect(x, y, l1=False):
    """Nested rectangles weighted ``1/(k+1)^2`` (L2; normalised in L2) or ``1/(k+1)^4`` (L1;
    normalised in L1), the paper's "pseudo-Gaussian" bump."""
    d = np.zeros([x, y])
    xc, yc = x // 2 + 1, y // 2 + 1
    c0, c1 = xc - 1, yc - 1
    for counter in range(max(xc, yc)):
        d[max(c0, 0):min(c0 + 2 * counter + 1, x), max(0, c1):min(c1 + 2 * counter + 1, y)] += \
            1.0 / (counter + 1) ** (4 if l1 else 2)
        c0 -= 1
        c1 -= 1
    return d / max(_size(d, l1), 1e-12)


def _size(d, l1):
    return np.sum(np.abs(d)) if l1 else np.sqrt(np.sum(d ** 2))


def _meta_pseudo_gaussian(s, l1=False):
    d = np.zeros([s, s])
    if s // 2 > 0:
        d[: s // 2] = _pseudo_gaussian_rect(s // 2, s, l1)
    d[s // 2:] = -_pseudo_gaussian_rect(s - s // 2, s, l1)
    return d / max(_size(d, l1), 1e-12)


def _l2_init_pattern(h, w, l1=False):
    """The tile layout of the L2 (and L1) initialisation: (pattern [h, w], tile id [h, w],
    n_tiles)."""
    s = max(h // 5, 1)
    sp = (h - s * 5) // 2
    pattern = np.zeros([h, w])
    tiles = np.full([h, w], -1, np.int64)
    n, ch = 0, sp
    for _ in range(h // s):
        cw = sp
        for _ in range(w // s):
            hs, ws = slice(ch, min(ch + s, h)), slice(cw, min(cw + s, w))
            blk = _meta_pseudo_gaussian(s, l1)[: hs.stop - hs.start, : ws.stop - ws.start]
            if blk.size:
                pattern[hs, ws] += blk
                tiles[hs, ws] = n
                n += 1
            cw += s
        ch += s
    return pattern, tiles, max(n, 1)


def _build(p, model, training, *, norm, steps, p_init, targeted, early_stop, jit_compile,
           rescale_schedule=True):
    model_call = weak_caller(model, training)  # weak: the cache must not keep the model
    n_steps = int(steps)
    _, h, w, c = p.x.shape
    # per-iteration window sizes (static schedule), for L∞ and L2
    sizes = []
    for i in range(n_steps):
        pi = p_schedule(p_init, i, n_steps, rescale_schedule)
        if norm == "linf":
            s = int(round(math.sqrt(pi * h * w)))
            s = min(max(s, 1), h - 1 if h > 1 else 1)
        else:
            s = max(int(round(math.sqrt(pi * h * w))), 3)
            if s % 2 == 0:
                s += 1
            s = min(s, h, w)
        sizes.append(s)
    sizes_t = tf.constant(sizes, tf.int32)
    if norm in ("l2", "l1"):
        l1 = norm == "l1"
        uniq = sorted(set(sizes))
        bank = np.zeros([max(uniq) + 1, 2, h, w])
        for s in uniq:
            g = _meta_pseudo_gaussian(s, l1)
            bank[s, 0, :s, :s] = g
            bank[s, 1, :s, :s] = g.T
        init_pat, init_tiles, n_tiles = _l2_init_pattern(h, w, l1)

    def margin(logits, y):
        oh = tf.one_hot(tf.cast(y, tf.int32), tf.shape(logits)[-1], dtype=logits.dtype)
        z_y = tf.reduce_sum(oh * logits, axis=-1)
        z_o = tf.reduce_max(logits - oh * 1e9, axis=-1)
        return (z_o - z_y) if targeted else (z_y - z_o)  # minimised; < 0 is success

    def loop(x, y, eps, lo, hi, seed):
        b = tf.shape(x)[0]
        dt = x.dtype

        def onto_l1(delta):  # the reference's L1 Square projects onto eps (1 - 1e-6)
            return clip_to_bounds(
                x + project_l1_box(delta, eps * (1.0 - 1e-6), lo - x, hi - x), lo, hi)
        ii = tf.range(h)[None, :, None, None]
        jj = tf.range(w)[None, None, :, None]

        def seeds(i, k):
            return tf.random.experimental.stateless_fold_in(
                tf.random.experimental.stateless_fold_in(seed, i), k)

        def rsign(shape, s):
            return tf.sign(tf.random.stateless_uniform(shape, s, -1.0, 1.0, dtype=dt))

        if norm == "linf":
            x0 = clip_to_bounds(x + eps * rsign([b, 1, w, c], seeds(-1, 0)), lo, hi)
        else:
            sg = rsign([b, n_tiles, c], seeds(-1, 0))
            tid = tf.constant(np.maximum(init_tiles, 0), tf.int32)
            per = tf.gather(sg, tf.reshape(tid, [-1]), axis=1)  # [B, h*w, c]
            per = tf.reshape(per, [b, h, w, c])
            d0 = tf.constant(init_pat, dt)[None, :, :, None] * per
            if norm == "l1":  # the pattern projected onto the ball and the box
                x0 = onto_l1(d0)
            else:
                n0 = tf.sqrt(tf.reduce_sum(tf.square(tf.reshape(d0, [b, -1])), axis=1))
                x0 = clip_to_bounds(x + d0 / expand_rows(tf.maximum(n0, 1e-12), x) * eps, lo,
                                    hi)
        logits = tf.cast(model_call(x0), dt)
        loss = margin(logits, y)
        fwd = tf.cast(b, tf.int64)

        def cond(i, xb, loss, fwd):
            c_ = i < n_steps
            if early_stop:
                c_ = tf.logical_and(c_, tf.reduce_any(loss >= 0))
            return c_

        def body(i, xb, loss, fwd):
            s = sizes_t[i]
            active = loss >= 0 if early_stop else tf.ones([b], tf.bool)
            if norm == "linf":
                r0 = tf.random.stateless_uniform([b], seeds(i, 1), 0, h - s + 1, dtype=tf.int32)
                c0 = tf.random.stateless_uniform([b], seeds(i, 2), 0, w - s + 1, dtype=tf.int32)
                r0, c0 = r0[:, None, None, None], c0[:, None, None, None]
                win = (ii >= r0) & (ii < r0 + s) & (jj >= c0) & (jj < c0 + s)
                val = x + eps * rsign([b, 1, 1, c], seeds(i, 3))
                x_new = tf.where(win, val, xb)
                x_new = clip_to_bounds(x_new, lo, hi)
            else:
                delta = xb - x
                r1 = tf.random.stateless_uniform([], seeds(i, 1), 0, h - s + 1, dtype=tf.int32)
                c1 = tf.random.stateless_uniform([], seeds(i, 2), 0, w - s + 1, dtype=tf.int32)
                r2 = tf.random.stateless_uniform([], seeds(i, 4), 0, h - s + 1, dtype=tf.int32)
                c2 = tf.random.stateless_uniform([], seeds(i, 5), 0, w - s + 1, dtype=tf.int32)
                tr = tf.random.stateless_uniform([], seeds(i, 6), 0, 2, dtype=tf.int32)
                win1 = (ii >= r1) & (ii < r1 + s) & (jj >= c1) & (jj < c1 + s)
                win2 = (ii >= r2) & (ii < r2 + s) & (jj >= c2) & (jj < c2 + s)
                win1f = tf.cast(win1, dt)
                both = tf.cast(win1 | win2, dt)
                pat = tf.roll(tf.constant(bank, dt)[s, tr], [r1, c1], [0, 1])[None, :, :, None]

                def chan_norm(t):  # per example and channel, over space
                    if norm == "l1":
                        return tf.reduce_sum(tf.abs(t), axis=[1, 2], keepdims=True)
                    return tf.sqrt(tf.reduce_sum(tf.square(t), axis=[1, 2], keepdims=True))

                flat = tf.reshape(delta, [b, -1])
                img_norm = expand_rows(tf.reduce_sum(tf.abs(flat), axis=1) if norm == "l1" else
                                       tf.sqrt(tf.reduce_sum(tf.square(flat), axis=1)), x)
                win_norm = chan_norm(delta * win1f)
                both_norm = chan_norm(delta * both)
                new = pat * rsign([b, 1, 1, c], seeds(i, 3))
                new = new + delta * win1f / (1e-10 + win_norm)
                if norm == "l1":  # the reference's L1 budget of the new window, then projected
                    budget = (tf.maximum(eps - img_norm, 0.0) / c + both_norm) * c
                else:
                    budget = tf.sqrt(tf.maximum(eps ** 2 - img_norm ** 2, 0.0) / c
                                     + both_norm ** 2)
                new = new / tf.maximum(chan_norm(new * win1f), 1e-12) * budget
                d_new = tf.where(win2, tf.zeros_like(delta), delta)
                d_new = tf.where(win1, new, d_new)
                if norm == "l1":
                    x_new = onto_l1(d_new)
                else:
                    n_new = tf.sqrt(tf.reduce_sum(tf.square(tf.reshape(d_new, [b, -1])), axis=1))
                    d_new = d_new / expand_rows(tf.maximum(n_new, 1e-12), x) * eps
                    x_new = clip_to_bounds(x + d_new, lo, hi)
            x_new = tf.where(expand_rows(active, x), x_new, xb)
            logits = tf.cast(model_call(x_new), dt)
            l_new = margin(logits, y)
            better = tf.logical_and(active, l_new < loss)
            xb = tf.where(expand_rows(better, x), x_new, xb)
            loss = tf.where(better, l_new, loss)
            return i + 1, xb, loss, fwd + tf.cast(b, tf.int64)

        _, xb, _, fwd = tf.while_loop(cond, body, (tf.constant(0), x0, loss, fwd))
        return xb, fwd

    sig = [relaxed_spec(p.x), relaxed_spec(p.y), tf.TensorSpec([], p.x.dtype),
           tf.TensorSpec(p.lo.shape, p.x.dtype), tf.TensorSpec(p.hi.shape, p.x.dtype),
           tf.TensorSpec([2], tf.int32)]
    # autograph=False: the loop is written in tf.while_loop, and converting it (and the model
    # call under it) took ~2-5 s per attack and process: most of a resumed run's start-up
    return tf.function(loop, input_signature=sig, jit_compile=bool(jit_compile), autograph=False)


def check_square_shape(shape: tuple) -> None:
    """Examples of ``shape`` (``x.shape[1:]``) Square can attack: images ``(H, W, C)`` or
    ``(H, W)`` with ``H, W >= 2`` (its windows are squares placed inside the image); a
    ``ValueError`` naming ``x`` otherwise (a vector ``(d, 1)`` read as a ``d x 1`` image left no
    room for a window: TensorFlow's "Need minval < maxval").

    >>> check_square_shape((8, 8, 1))
    >>> check_square_shape((64, 1))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: x: square needs images [B, H, W, C] or [B, H, W] with H, W >= 2 ...
    """
    shape = tuple(shape)
    if len(shape) not in (2, 3) or any(d is not None and d < 2 for d in shape[:2]):
        raise ValueError(f"x: square needs images [B, H, W, C] or [B, H, W] with H, W >= 2 (it "
                         f"perturbs square windows), got examples of shape {shape}; for vector "
                         f"data use another attack (e.g. apgd-ce)")


@tf.autograph.experimental.do_not_convert
def _square_run(model, x, y=None, *, eps=None, norm="linf", clip_min=None, clip_max=None,
                targeted=False, seed=None, steps=1000, p_init=None, early_stop=True,
                training=False, jit_compile=False, batch_size=None, rescale_schedule=True):
    norm = canonical_norm(norm)
    if norm not in ("linf", "l2", "l1"):
        raise ValueError(f"norm: square supports 'linf', 'l2' and 'l1', got {norm!r}")
    xt = tf.convert_to_tensor(x) if not isinstance(x, np.ndarray) else x
    rank = len(np.shape(xt))
    check_square_shape(tuple(np.shape(xt))[1:])
    if rank == 3:
        out = _square_run(model, x[..., None] if isinstance(x, np.ndarray) else
                          tf.expand_dims(x, -1), y, eps=eps, norm=norm,
                          clip_min=clip_min if np.ndim(clip_min) == 0 else np.asarray(clip_min)[..., None],
                          clip_max=clip_max if np.ndim(clip_max) == 0 else np.asarray(clip_max)[..., None],
                          targeted=targeted, seed=seed, steps=steps, p_init=p_init,
                          early_stop=early_stop, training=training, jit_compile=jit_compile,
                          batch_size=batch_size, rescale_schedule=rescale_schedule)
        out.x_adv = out.x_adv[..., 0]
        return out
    p = prepare(model, x, y, eps=eps, clip_min=clip_min, clip_max=clip_max, targeted=targeted,
                objective="cw", training=training, need_gradient=False, batch_size=batch_size)
    _validate.check_positive_int(steps, "steps", maximum=_validate.MAX_STEPS)
    if p_init is None:
        p_init = 0.05 if norm == "linf" else 0.1
    _checks.number(p_init, "p_init", minimum=0, maximum=1, min_inclusive=False)  # of the pixels
    if not p.x.shape[1:].is_fully_defined():
        raise ValueError("x: square needs a static image shape")
    cfg = ("square", norm, int(steps), float(p_init), bool(targeted), bool(early_stop),
           bool(jit_compile), bool(rescale_schedule))
    key = p.key + cfg + spec_key((p.x, p.y)) + (tuple(p.lo.shape.as_list()),)
    fn = cached(p.owner, key, lambda: _build(p, model, training, norm=norm, steps=steps,
                                             p_init=float(p_init), targeted=targeted,
                                             early_stop=early_stop, jit_compile=jit_compile,
                                             rescale_schedule=bool(rescale_schedule)))
    eps_t, seed_t = tf.cast(eps, p.x.dtype), seed_tensor(seed)

    def attack_chunk(xc, yc, ytc, k):
        x_adv, fwd = fn(xc, yc, eps_t, p.lo, p.hi, chunk_seed(seed_t, k))
        # exact budget (the L2 rescaling is exact up to float rounding)
        return clip_to_bounds(xc + project(x_adv - xc, eps_t, norm), p.lo, p.hi), fwd

    x_adv, (fwd,) = run_in_chunks(p, attack_chunk)
    return AttackResult(x_adv, 0, fwd + p.forward_passes)


@tf.autograph.experimental.do_not_convert
def square(model: Any, x: Any, y: Any = None, *, eps: Any, norm: Any = "linf", clip_min: Any, clip_max: Any,
           targeted: bool = False, seed: Any = None, steps: int = 1000, p_init: float | None = None,
           early_stop: bool = True, training: Any = False, jit_compile: bool = False,
           batch_size: int | None = None, rescale_schedule: bool = True) -> tf.Tensor:
    """Square Attack (L∞, L2 or L1), gradient-free; returns ``x_adv``.

    ``steps`` is the query budget per example (one forward pass each); ``p_init`` the initial
    fraction of pixels per window (0.05 for L∞, 0.1 for L2 by default). ``batch_size`` (default
    1024) examples per compiled call; chunk ``k`` of a larger ``x`` searches with the seed
    ``stateless_fold_in(seed, k)`` (reproducible per ``(seed, batch_size)``).
    ``rescale_schedule=False`` keeps the window schedule at the paper's iteration counts
    whatever ``steps`` is (:func:`p_schedule`); AutoAttack runs Square with ``steps=5000``,
    ``p_init=0.8`` and no rescaling.
    """
    return _square_run(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                       targeted=targeted, seed=seed, steps=steps, p_init=p_init,
                       early_stop=early_stop, training=training, jit_compile=jit_compile,
                       batch_size=batch_size, rescale_schedule=rescale_schedule).x_adv


class Square(Attack):
    """Configured :func:`square`."""

    name = "square"
    norms = ("linf", "l2", "l1")
    gradient_free = True
    supports_early_stop = True
    _run = staticmethod(_square_run)

    def check_example_shape(self, shape: tuple) -> None:
        check_square_shape(shape)
