"""The activation rules of the bound engine: ReLU, tanh and sigmoid.

Each activation ``sigma`` is bounded from its input's bounds ``l <= z <= u`` (element-wise):

- IBP: ``[sigma(l), sigma(u)]`` (the three are monotone).
- CROWN: two lines ``a_L z + b_L <= sigma(z) <= a_U z + b_U`` on ``[l, u]`` (:meth:`relaxation`),
  which the backward pass substitutes by the sign of each coefficient
  (:meth:`Activation.backward_relaxed`).

ReLU: the upper line through ``(l, 0)`` and ``(u, u)``; the lower line ``alpha z`` with CROWN's
adaptive slope ``alpha = 1 if u > -l else 0``; exact where the neuron is stable.

tanh and sigmoid (S-shaped: convex below 0, concave above; Zhang et al. 2018, "Efficient Neural
Network Robustness Certification with General Activation Functions", section 3.2):

- ``u <= 0`` (convex on the interval): upper = the chord, lower = the tangent at ``(l + u) / 2``;
- ``l >= 0`` (concave): lower = the chord, upper = the tangent at ``(l + u) / 2``;
- ``l < 0 < u``: upper = the chord if its slope is ``<= sigma'(u)``, otherwise the tangent at
  ``max(d, (l + u) / 2)``, ``d`` the point of ``[0, u]`` whose tangent passes through ``(l,
  sigma(l))``, found by bisection (the bracket's upper end is kept, so the line stays above
  ``(l, sigma(l))``: sound; every tangent point beyond ``d`` gives a bound too, and the midpoint's
  is tighter on average: auto_LiRPA's choice); the lower line is the mirror image (chord if its
  slope is ``<= sigma'(l)``, else the tangent at ``min(d, (l + u) / 2)``, ``d`` in ``[l, 0]`` with
  its tangent through ``(u, sigma(u))``). ``d`` depends on the far end alone and is monotone in
  it, so the bisection starts from the bracket of a table (:func:`tangent_table`: ``d`` at a
  grid of far ends, computed once in float64 and rounded outward) and needs a few halvings
  (:data:`_BISECTION_STEPS`), not the ~26 of the bracket ``[0, u]`` in float32.

An interval narrower than :data:`NARROW` uses the constant lines ``sigma(l)`` and ``sigma(u)``
(sound by monotonicity). The tangent point ``d`` is differentiated implicitly (``h(d, l) = 0``
gives ``dd/dl = -h_l / h_d``), not through the bisection, so the lines' gradients w.r.t. ``l``
and ``u`` are those of the exact tangent point.

>>> import tensorflow as tf
>>> lo, hi = tf.constant([-1.0]), tf.constant([2.0])
>>> ls, li, us, ui = Tanh("t").relaxation(lo, hi)
>>> bool(tf.reduce_all(ls * -1.0 + li <= tf.tanh(-1.0) + 1e-6))
True
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from ._rules import Rule, sum_trailing

__all__ = ["ACTIVATIONS", "NARROW", "Activation", "ReLU", "Sigmoid", "Tanh", "joint_relaxations",
           "tangent_table"]

#: intervals narrower than this get constant lines (tanh, sigmoid)
NARROW = 1e-6
#: bisection steps for the tangent points of a crossing interval, per dtype (tanh, sigmoid),
#: from the table's bracket (at most ~1e-3 wide): ~1e-6 in float32, ~1e-15 in float64; the
#: half dtypes bisect the whole side ``[0, u]``
_BISECTION_STEPS = {tf.float16: 12, tf.bfloat16: 10, tf.float32: 10, tf.float64: 40}
#: the tangent-point table: far ends ``-q`` for ``q`` in ``[0, _TABLE_RANGE]`` every
#: ``_TABLE_STEP`` (tanh's units; sigmoid's are twice these)
_TABLE_RANGE, _TABLE_STEP = 16.0, 1.0 / 512


@functools.cache
def tangent_table() -> np.ndarray:
    """``D[k] >= d(-k · step)`` float32 ``[K + 1]``: the point ``d >= 0`` whose tangent of tanh
    passes through ``(p, tanh(p))``, at the far ends ``p = -k · step`` (:data:`_TABLE_STEP`,
    down to ``-``:data:`_TABLE_RANGE`); ``d(p)`` decreases in ``p`` (``D[0] = 0``). Computed by a
    float64 bisection (its upper ends) and rounded up to float32, so ``d(p) <= D[k]`` for
    ``-k · step <= p`` (an upper end of its bracket: a sound tangent point) and ``D[k - 1]``
    exceeds ``d(p)`` by at most that rounding for ``p <= -(k - 1) · step``. Sigmoid's is ``2 D``
    at ``2 p`` (``sigmoid(z) = (1 + tanh(z / 2)) / 2``).

    >>> t = tangent_table()
    >>> float(t[0]), bool(np.all(np.diff(t) >= 0)), round(float(t[512]), 4)   # d(-1)
    (0.0, True, 0.4583)
    """
    p = -np.arange(int(round(_TABLE_RANGE / _TABLE_STEP)) + 1, dtype=np.float64) * _TABLE_STEP
    a, b = np.zeros_like(p), np.full_like(p, 2.0 * _TABLE_RANGE)  # d(-16) < 2, far below 32
    for _ in range(80):  # h(d) = tanh(d) + tanh'(d) (p - d) - tanh(p), increasing in d >= 0
        m = (a + b) / 2
        t = np.tanh(m)
        right = t + (1.0 - t * t) * (p - m) - np.tanh(p) >= 0
        a, b = np.where(right, a, m), np.where(right, m, b)
    up = b.astype(np.float32)
    up = np.where(up.astype(np.float64) < b, np.nextafter(up, np.float32(np.inf)), up)
    up[0] = 0.0  # p = 0: the tangent at 0 passes through (0, 0)
    return up


class Activation(Rule):
    """An element-wise monotone activation. Subclasses give ``fn`` and ``relaxation``."""

    linear = False

    @staticmethod
    def fn(z):
        """The activation itself, element-wise."""
        raise NotImplementedError

    def interval(self, bounds, dtype):
        (lo, hi), = bounds
        return self.fn(lo), self.fn(hi)

    def relaxation(self, lo, hi):
        """``(lower slope, lower intercept, upper slope, upper intercept)``, each like ``lo``."""
        raise NotImplementedError

    def refine(self, lo, hi):
        """Which elements gain from tighter input bounds (all, unless overridden)."""
        return hi > lo

    def backward_relaxed(self, a_lo, a_hi, pre_bounds):
        """Substitute the lines into the coefficients ``a_lo``/``a_hi`` [B, S, *shape] ->
        ``(new a_lo, new a_hi, bias_lo [B, S], bias_hi [B, S])``; ``a_hi`` None: the lower side
        only (``None`` for the upper ones)."""
        return self.backward_lines(a_lo, a_hi, self.relaxation(*pre_bounds))

    def backward_lines(self, a_lo, a_hi, lines):
        """:meth:`backward_relaxed` with the lines ``(ls, li, us, ui)`` [B, *shape] of
        :meth:`relaxation` already computed (:func:`joint_relaxations`)."""
        ls, li, us, ui = (tf.expand_dims(t, 1) for t in lines)
        pos_lo, neg_lo = tf.nn.relu(a_lo), tf.minimum(a_lo, 0)
        if a_hi is None:
            return (pos_lo * ls + neg_lo * us, None, sum_trailing(pos_lo * li + neg_lo * ui),
                    None)
        pos_hi, neg_hi = tf.nn.relu(a_hi), tf.minimum(a_hi, 0)
        new_lo = pos_lo * ls + neg_lo * us
        new_hi = pos_hi * us + neg_hi * ls
        return (new_lo, new_hi, sum_trailing(pos_lo * li + neg_lo * ui),
                sum_trailing(pos_hi * ui + neg_hi * li))


class ReLU(Activation):
    """The ReLU; the relaxation of CROWN with its adaptive lower slope."""

    fn = staticmethod(tf.nn.relu)

    def relaxation(self, lo, hi):
        unstable = (lo < 0) & (hi > 0)
        active = lo >= 0
        one, zero = tf.ones_like(lo), tf.zeros_like(lo)
        width = tf.where(unstable, hi - lo, one)
        up_slope = tf.where(unstable, hi / width, tf.where(active, one, zero))
        up_intercept = tf.where(unstable, -lo * hi / width, zero)
        low_slope = tf.where(unstable, tf.where(hi > -lo, one, zero), tf.where(active, one, zero))
        return low_slope, zero, up_slope, up_intercept

    def refine(self, lo, hi):
        return (lo < 0) & (hi > 0)  # a stable ReLU's relaxation is exact whatever its bounds

    def backward_relaxed(self, a_lo, a_hi, pre_bounds):
        """:meth:`Activation.backward_relaxed` without the lower line's intercept (0 for every
        ReLU line), the biases as matrix-vector products (no product tensor [B, S, *shape])."""
        ls, _, us, ui = self.relaxation(*pre_bounds)
        flat = [tf.shape(a_lo)[0], a_lo.shape[1], -1]
        ui_flat = tf.reshape(ui, [tf.shape(ui)[0], -1])
        ls, us = tf.expand_dims(ls, 1), tf.expand_dims(us, 1)
        neg_lo = tf.minimum(a_lo, 0)
        new_lo = tf.nn.relu(a_lo) * ls + neg_lo * us
        bias_lo = tf.linalg.matvec(tf.reshape(neg_lo, flat), ui_flat)
        if a_hi is None:
            return new_lo, None, bias_lo, None
        pos_hi = tf.nn.relu(a_hi)
        new_hi = pos_hi * us + tf.minimum(a_hi, 0) * ls
        return new_lo, new_hi, bias_lo, tf.linalg.matvec(tf.reshape(pos_hi, flat), ui_flat)

    def backward_sloped(self, a_lo, pre_bounds, slopes):
        """:meth:`backward_relaxed` for the lower side only, with the lower line ``slopes * z``
        (``slopes`` [B, S, *shape] in [0, 1], one per specification row: alpha-CROWN) on the
        unstable elements -> ``(new a_lo, None, bias_lo [B, S], None)``. Any slope in [0, 1] is a
        sound lower line of the ReLU on ``[l, u]`` with ``l < 0 < u``."""
        lo, hi = pre_bounds
        ls, _, us, ui = self.relaxation(lo, hi)
        unstable = tf.expand_dims((lo < 0) & (hi > 0), 1)
        ls = tf.where(unstable, slopes, tf.expand_dims(ls, 1))
        pos, neg = tf.nn.relu(a_lo), tf.minimum(a_lo, 0)
        return (pos * ls + neg * tf.expand_dims(us, 1), None,
                sum_trailing(neg * tf.expand_dims(ui, 1)), None)


def _tangent(fn, grad, d):
    """Slope and intercept of the tangent of ``fn`` at ``d``."""
    slope = grad(d)
    return slope, fn(d) - slope * d


def _bisect_bracket(h, a, b):
    """Halvings of ``[a, b]`` (element-wise, :data:`_BISECTION_STEPS` of the dtype) for the sign
    change of the increasing ``h`` -> the last bracket ``(a, b)``, ``h(a) <= 0 <= h(b)``
    where it held at the start. Not differentiated."""
    a, b = tf.stop_gradient(a), tf.stop_gradient(b)
    for _ in range(_BISECTION_STEPS.get(a.dtype, 9)):
        m = (a + b) / 2
        right = tf.stop_gradient(h(m)) >= 0
        a, b = tf.where(right, a, m), tf.where(right, m, b)
    return a, b


def _implicit(d, h, h_d):
    """``d`` (a root of ``h(., params)``, not differentiated) with the implicit-function gradient
    ``dd/dparams = -h_params / h_d``; none where ``h_d`` vanishes."""
    slope = tf.stop_gradient(h_d(d))
    safe = tf.abs(slope) > 1e-12
    hd = h(d)
    return d - tf.where(safe, (hd - tf.stop_gradient(hd)) / tf.where(safe, slope, 1.0), 0.0)


class SShaped(Activation):
    """An activation convex on ``(-inf, 0]`` and concave on ``[0, inf)`` (tanh, sigmoid).
    ``table_scale``: its tangent points are ``table_scale`` times tanh's at ``far end /
    table_scale`` (:func:`tangent_table`)."""

    table_scale = 1.0

    @staticmethod
    def grad(z):
        raise NotImplementedError

    @staticmethod
    def grad2(z):
        raise NotImplementedError

    def relaxation(self, lo, hi):
        fn, grad = self.fn, self.grad
        f_lo, f_hi = fn(lo), fn(hi)
        narrow = hi - lo < NARROW
        width = tf.where(narrow, tf.ones_like(lo), hi - lo)
        chord = (f_hi - f_lo) / width
        chord_b = f_lo - chord * lo
        mid_s, mid_b = _tangent(fn, grad, (lo + hi) / 2)
        zero = tf.zeros_like(lo)
        convex, concave = hi <= 0, lo >= 0
        up_chord = convex | (~concave & (chord <= grad(hi)))
        low_chord = concave | (~convex & (chord <= grad(lo)))
        # crossing intervals whose chord is not a bound: tangents through the far end
        up_t, low_t = self._far_tangents(lo, hi, f_lo, f_hi, ~up_chord & ~concave,
                                         ~low_chord & ~convex)
        us = tf.where(up_chord, chord, tf.where(concave, mid_s, up_t[0]))
        ui = tf.where(up_chord, chord_b, tf.where(concave, mid_b, up_t[1]))
        ls = tf.where(low_chord, chord, tf.where(convex, mid_s, low_t[0]))
        li = tf.where(low_chord, chord_b, tf.where(convex, mid_b, low_t[1]))
        return (tf.where(narrow, zero, ls), tf.where(narrow, f_lo, li),
                tf.where(narrow, zero, us), tf.where(narrow, f_hi, ui))

    def _far_tangents(self, lo, hi, f_lo, f_hi, need_up, need_low):
        """The tangent lines ``((up slope, up intercept), (low slope, low intercept))``, each
        like ``lo``, of a crossing interval ``l < 0 < u`` whose chord is not a bound: the upper
        one at ``max(d, (l + u) / 2)``, ``d`` in ``[0, u]`` with its tangent through ``(l,
        sigma(l))``, where ``need_up``; the lower one at ``min(d, (l + u) / 2)``, ``d`` in ``[l,
        0]`` with its tangent through ``(u, sigma(u))``, where ``need_low``; 0 elsewhere.

        Only those elements are computed, both kinds in one bisection: the two tangency
        equations are one, ``h(d) = sigma(d) + sigma'(d) (p − d) − sigma(p)`` with ``p = l``
        (upper) or ``p = u`` (lower), increasing on both brackets. The same element-wise
        operations as on the whole tensor, in a fraction of the work (a network's crossing
        elements are few; the bisection's 2 x 26 steps were most of CROWN-IBP's cost on a
        small MLP); the bracket from :func:`tangent_table` (10 float32 steps, not 26)."""
        fn, grad = self.fn, self.grad
        shape = tf.shape(lo)
        need_up, need_low = tf.reshape(need_up, [-1]), tf.reshape(need_low, [-1])
        up, low = tf.where(need_up)[:, 0], tf.where(need_low)[:, 0]
        n_up = tf.shape(up)[0]

        def pick(up_src, low_src):
            return tf.concat([tf.gather(tf.reshape(up_src, [-1]), up),
                              tf.gather(tf.reshape(low_src, [-1]), low)], 0)

        p, f_p = pick(lo, hi), pick(f_lo, f_hi)
        is_up = tf.range(tf.shape(p)[0]) < n_up
        # |d| bracketed by the table at the far end |p| (d's side: [0, u] upper, [l, 0] lower;
        # |d| <= the near end |u| or |l|, whose tangent passes beyond the far end: the chord is
        # no bound); beyond the table (a saturated far end), the near end itself
        near = pick(hi, -lo)
        if p.dtype in (tf.float32, tf.float64):  # the table's float32 upper ends are exact there
            table = tf.constant(tangent_table(), p.dtype)
            last = int(table.shape[0]) - 1
            scale = tf.constant(self.table_scale, p.dtype)
            k = tf.cast(tf.minimum(tf.math.ceil(tf.abs(p) / (scale * _TABLE_STEP)), last + 1.0),
                        tf.int32)
            beyond = k > last
            k = tf.minimum(k, last)
            far_hi = tf.minimum(tf.where(beyond, near, scale * tf.gather(table, k)), near)
            far_lo = tf.where(beyond, near,  # beyond: the tangent at the near end (d <= it)
                              tf.minimum(scale * tf.gather(table, tf.maximum(k - 1, 0)), far_hi))
        else:  # a half dtype would round the table inward: the whole side [0, near]
            far_lo, far_hi = tf.zeros_like(near), near
            beyond = tf.zeros_like(is_up)
        # upper: [lo, hi] keeping the bracket's upper end; lower: [-hi, -lo] keeping its lower
        a = tf.where(is_up, far_lo, -far_hi)
        b = tf.where(is_up, far_hi, -far_lo)
        h = lambda d: fn(d) + grad(d) * (p - d) - f_p  # noqa: E731
        a, b = _bisect_bracket(h, a, b)
        d = _implicit(tf.where(is_up, b, a), h, lambda d: self.grad2(d) * (p - d))
        d = tf.where(beyond, pick(hi, lo), d)  # the near end, not a root: its own gradient
        mid = pick((lo + hi) / 2, (lo + hi) / 2)  # a tangent beyond the limit point is a bound
        d = tf.where(is_up, tf.where(mid > d, mid, d), tf.where(mid < d, mid, d))  # too
        slope, intercept = _tangent(fn, grad, d)
        # back in place by a gather from the computed values and one appended 0 (at index
        # n): an element's index is its rank among its kind's (the order tf.where gave them),
        # n where it needs none. The values of a scatter into zeros, without the scatter
        # (ScatterNd: ~20% of CROWN-IBP's sets of CartPole's policy, per-op trace)
        n = tf.shape(d, out_type=tf.int32)[0]
        up_at = tf.where(need_up, tf.cumsum(tf.cast(need_up, tf.int32)) - 1, n)
        low_at = tf.where(need_low, tf.cumsum(tf.cast(need_low, tf.int32)) - 1 + n_up, n)
        slope, intercept = (tf.concat([t, tf.zeros([1], t.dtype)], 0) for t in (slope, intercept))

        def place(values, at):
            return tf.reshape(tf.gather(values, at), shape)

        return ((place(slope, up_at), place(intercept, up_at)),
                (place(slope, low_at), place(intercept, low_at)))


class Tanh(SShaped):
    fn = staticmethod(tf.tanh)

    @staticmethod
    def grad(z):
        return 1 - tf.square(tf.tanh(z))

    @staticmethod
    def grad2(z):
        t = tf.tanh(z)
        return -2 * t * (1 - tf.square(t))


class Sigmoid(SShaped):
    fn = staticmethod(tf.sigmoid)
    table_scale = 2.0

    @staticmethod
    def grad(z):
        s = tf.sigmoid(z)
        return s * (1 - s)

    @staticmethod
    def grad2(z):
        s = tf.sigmoid(z)
        return s * (1 - s) * (1 - 2 * s)


#: activation name -> rule class
ACTIVATIONS = {"relu": ReLU, "tanh": Tanh, "sigmoid": Sigmoid}


def joint_relaxations(bounds: dict) -> dict:
    """The lines of :meth:`Activation.relaxation` for several S-shaped activations at once:
    ``{node: (rule, (lo, hi))}`` -> ``{node: (ls, li, us, ui)}``, each like its ``lo``. The
    elements of every rule of one class are flattened into one vector and relaxed by one call
    (the relaxation is element-wise: the same lines), so a network's layers share one
    bisection instead of one each (CROWN-IBP, whose pre-activation bounds are all known before
    its backward pass). Other rules (ReLU: cheap, with its own backward) are left out."""
    groups: dict[type, list] = {}
    for node, (rule, box) in bounds.items():
        if isinstance(rule, SShaped):
            groups.setdefault(type(rule), []).append((node, rule, box))
    out = {}
    for members in groups.values():
        if len(members) == 1:
            node, rule, box = members[0]
            out[node] = rule.relaxation(*box)
            continue
        shapes = [tf.shape(lo) for _, _, (lo, _) in members]
        sizes = [tf.size(lo) for _, _, (lo, _) in members]
        lo = tf.concat([tf.reshape(b[0], [-1]) for _, _, b in members], 0)
        hi = tf.concat([tf.reshape(b[1], [-1]) for _, _, b in members], 0)
        lines = [tf.split(t, sizes) for t in members[0][1].relaxation(lo, hi)]
        for k, (node, _, _) in enumerate(members):
            out[node] = tuple(tf.reshape(t[k], shapes[k]) for t in lines)
    return out
