"""alpha-CROWN: CROWN whose ReLU lower slopes are optimised (Xu et al. 2021).

CROWN bounds an unstable ReLU (``l < 0 < u``) from below by ``alpha z`` with the adaptive slope
``alpha = 1 if u > -l else 0``; every ``alpha`` in ``[0, 1]`` gives a sound lower line, so every
choice gives a sound bound, and the best one depends on the specification row. alpha-CROWN (Xu et
al. 2021, "Fast and Complete: Enabling Complete Neural Network Verification with Rapid and
Massively Parallel Incomplete Verifiers", section 3.1; auto_LiRPA's method ``"CROWN-Optimized"``)
makes the slopes variables and maximises the bound by projected gradient ascent.

What is optimised here (the full per-layer version, as auto_LiRPA's default):

- one slope per (ReLU element, specification row, bound being computed): the rows of the output
  specification (the ``C``-merged margins) and the rows of every intermediate pre-activation node
  whose bounds depend on a ReLU (its lower and its upper bound: ``2 n`` rows for ``n`` elements),
  for every ReLU that node depends on;
- the lower bound and the upper bound of the output are two separate optimisations (two sets of
  slopes), as in auto_LiRPA; ``lower_only`` runs the first one only;
- the intermediate bounds are recomputed with the slopes at every iteration and intersected with
  CROWN's (both are sound), so they never get looser than CROWN's, which are the starting point
  (the gradient is the recomputed bound's, as if not intersected: auto_LiRPA does not intersect);
- the slopes start at CROWN's adaptive slopes (so the first iteration is CROWN), Adam (the
  optimiser of auto_LiRPA, with torch's defaults: betas 0.9 / 0.999, eps 1e-8) ascends the sum of
  the output bounds, the learning rate decays by ``lr_decay`` per iteration, the slopes are
  projected onto ``[0, 1]`` after every step;
- the best bound seen over the iterations is kept per element (auto_LiRPA keeps per example the
  best iterations' bounds), so alpha-CROWN is never looser than CROWN (up to rounding).

tanh and sigmoid keep CROWN's relaxation (their tangent points are not optimised); a network
without ReLUs gets CROWN's bounds. The slopes are dense over the intermediate elements (stable ones
included): their memory is ``B x sum_(node, ReLU) rows x elements``, so the batch is cut into
smaller chunks (:func:`chunk_limit`), and a network for which one example would need more than
:data:`MAX_ELEMENTS` is refused (a ``ValueError``) rather than left to run out of memory; it
suits small and medium networks.

The whole loop is one ``tf.while_loop`` (no host round-trip per iteration). The bounds returned
are not differentiable w.r.t. the weights (``tf.stop_gradient``: certified training uses the
other methods).

>>> import numpy as np, tensorflow as tf
>>> from robustgrad.bounds._stack import StackGraph
>>> g = StackGraph([np.array([[1.0]], "float32"), np.array([[1.0]], "float32")], [None, None],
...                ["relu"])          # relu(x) on [-1, 2]: CROWN's lower bound is -1 (slope 1)
>>> lo, hi = optimized_bounds(g, tf.constant([[-1.0]]), tf.constant([[2.0]]), None, None)
>>> round(float(lo[0, 0]), 4), round(float(hi[0, 0]), 4)   # the optimum: slope 0
(0.0, 2.0)
"""

from __future__ import annotations

import math

import tensorflow as tf

from robustgrad.transforms import scale_by_adam

from . import _engine
from ._activations import ReLU

__all__ = ["DEFAULTS", "MAX_ELEMENTS", "chunk_limit", "elements_per_example", "optimized_bounds"]

#: auto_LiRPA 0.7.1's defaults (``optimize_bound_args``): iterations, Adam learning rate, decay
DEFAULTS = {"iterations": 20, "lr": 0.5, "lr_decay": 0.98}
_BETA1, _BETA2, _EPS = 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults
#: the most elements one example's optimisation may hold (2 GB in float32): beyond, an error
MAX_ELEMENTS = 2 ** 29
# Largest number of elements the slopes and coefficients of one chunk of examples may hold
# (:func:`chunk_limit`; 64 MB in float32).
COEFFICIENT_BUDGET = 2 ** 24


def _relus_behind(graph, node):
    """The ReLU nodes a backward pass from ``node`` crosses (``node`` itself included), ascending."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n == 0 or n in seen:
            continue
        seen.add(n)
        stack.extend(graph.inputs[n])
    return sorted(n for n in seen if isinstance(graph.rules[n], ReLU))


def _plan(graph, pre_nodes, output):
    """``(starts, relus)``: the intermediate nodes whose bounds depend on a ReLU (ascending) and,
    for them and the output, the ReLUs behind them."""
    relus = {s: _relus_behind(graph, s) for s in [*pre_nodes, output] if s != 0}
    starts = [s for s in sorted(pre_nodes) if s != 0 and relus[s]]
    return starts, relus


def elements_per_example(graph, example_shape, dtype, spec_rows, lower_only=False):
    """About how many tensor elements one example's optimisation holds at once: its slopes and
    their two Adam moments, and the coefficients of its backward passes. ``spec_rows``: the
    specification's rows (``None``: the output's elements)."""
    one = tf.zeros([1, *example_shape], dtype)
    boxes = _engine.interval_pass(graph, one, one, dtype)
    sizes = [math.prod(lo.shape[1:]) for lo, _ in boxes]
    pre_nodes = [graph.inputs[i][0] for i, r in enumerate(graph.rules)
                 if r is not None and not r.linear]
    starts, relus = _plan(graph, pre_nodes, graph.output)
    widest = max(sizes)
    rows = {s: 2 * sizes[s] for s in starts}
    rows[graph.output] = sizes[graph.output] if spec_rows is None else spec_rows
    per_example = sum(rows[s] * (3 * sum(sizes[r] for r in relus[s]) + 4 * widest)
                      for s in [*starts, graph.output] if relus[s])
    return per_example * (1 if lower_only else 2)


def chunk_limit(graph, example_shape, dtype, spec_rows, lower_only=False, budget=None):
    """The most examples per call whose :func:`elements_per_example` stay within ``budget``
    elements (default :data:`COEFFICIENT_BUDGET`); at least 1.

    Raises:
      ValueError: one example alone needs more than :data:`MAX_ELEMENTS` (the network is too
        wide for dense slopes: use ``"crown"``).
    """
    budget = COEFFICIENT_BUDGET if budget is None else budget
    per_example = elements_per_example(graph, example_shape, dtype, spec_rows, lower_only)
    if per_example > MAX_ELEMENTS:
        raise ValueError(f"method='alpha-crown' would hold about {per_example:.3g} tensor "
                         f"elements per example (its slopes are dense over every hidden neuron "
                         f"and spec row), more than {MAX_ELEMENTS:.3g}: use method='crown' for "
                         f"this network, or bound fewer outputs (a spec C)")
    return max(1, budget // max(1, per_example))


def _clamped(bound, reference, tighter):
    """``tighter(bound, reference)`` (sound: both are bounds) with the gradient of ``bound``
    everywhere: the slopes keep learning where CROWN's bound is still the tighter one, and ties
    (the first iteration recomputes CROWN's bounds) do not decide where the gradient goes."""
    return bound + tf.stop_gradient(tighter(bound, reference) - bound)


def _identity_rows(batch, shape, dtype):
    """``[I; -I]`` over the elements of ``shape``, [B, 2n, *shape]: the lower bounds of its rows
    are the node's lower bounds and minus its upper bounds."""
    n = math.prod(shape)
    eye = tf.eye(n, dtype=dtype)
    both = tf.reshape(tf.concat([eye, -eye], 0), [1, 2 * n, *shape])
    return tf.broadcast_to(both, [batch, 2 * n, *shape])


def optimized_bounds(graph, lower, upper, spec, ball, lower_only=False, iterations=20, lr=0.5,
                     lr_decay=0.98):
    """alpha-CROWN bounds of the graph's output over the box (static batch ``B``) -> ``(lb, ub)``
    as :func:`robustgrad.bounds._engine.propagate` (``[B, *out]``, or ``[B, S]`` with ``spec``;
    ``ub`` None with ``lower_only`` and a ``spec``). ``iterations`` bound evaluations (the first
    is CROWN's), ``iterations - 1`` Adam steps of learning rate ``lr * lr_decay ** k``. No
    validation (:func:`robustgrad.bounds.compute_bounds` validates)."""
    dtype = lower.dtype
    boxes = _engine.interval_pass(graph, lower, upper, dtype)
    shapes = [tuple(lo.shape[1:]) for lo, _ in boxes]
    out_shape = shapes[graph.output]
    batch = lower.shape[0]
    pre0 = _engine.pre_activation_bounds(graph, boxes, shapes, ball, dtype, "crown")
    starts, relus = _plan(graph, list(pre0), graph.output)
    if not relus[graph.output]:  # nothing to optimise: CROWN
        return _engine.propagate(graph, lower, upper, spec, ball, "crown", lower_only)
    lower_only = bool(lower_only and spec is not None)
    full = spec
    if spec is None:
        n_out = math.prod(out_shape)
        full = tf.broadcast_to(tf.reshape(tf.eye(n_out, dtype=dtype), [1, n_out, *out_shape]),
                               [batch, n_out, *out_shape])
    objectives = [full] if lower_only else [full, -full]  # ub = -(lower bound of -spec)
    keys, init = [], []
    for o, obj in enumerate(objectives):
        for s in [*starts, graph.output]:
            rows = obj.shape[1] if s == graph.output else 2 * math.prod(shapes[s])
            for r in relus[s]:
                lo, hi = pre0[graph.inputs[r][0]]
                adaptive = tf.cast(hi > -lo, dtype)  # CROWN's slope: the starting point
                keys.append((o, s, r))
                init.append(tf.broadcast_to(tf.expand_dims(adaptive, 1),
                                            [batch, rows, *shapes[r]]))
    index = {k: j for j, k in enumerate(keys)}

    def evaluate(alphas):
        """The lower bound of every objective [B, S] with the slopes ``alphas``."""
        out = []
        for o, obj in enumerate(objectives):
            pre = dict(pre0)
            for s in starts:
                slopes = {r: alphas[index[(o, s, r)]] for r in relus[s]}
                n = math.prod(shapes[s])
                both, _ = _engine._backward(graph, s, _identity_rows(batch, shapes[s], dtype),
                                            pre, boxes, shapes, 0, ball, dtype, True, slopes)
                lo0, hi0 = (tf.reshape(t, [batch, n]) for t in pre0[s])
                lo, hi = _clamped(both[:, :n], lo0, tf.maximum), _clamped(-both[:, n:], hi0,
                                                                            tf.minimum)
                pre[s] = (tf.reshape(lo, [batch, *shapes[s]]), tf.reshape(hi, [batch, *shapes[s]]))
            slopes = {r: alphas[index[(o, graph.output, r)]] for r in relus[graph.output]}
            lb, _ = _engine._backward(graph, graph.output, obj, pre, boxes, shapes, 0, ball,
                                      dtype, True, slopes)
            out.append(lb)
        return out

    lr_t, decay = tf.constant(lr, dtype), tf.constant(lr_decay, dtype)

    adam = scale_by_adam(_BETA1, _BETA2, _EPS)  # torch.optim.Adam's direction

    def body(k, alphas, state, best):
        with tf.GradientTape() as tape:
            tape.watch(alphas)
            lbs = evaluate(alphas)
            loss = -tf.add_n([tf.reduce_sum(lb) for lb in lbs])
        grads = tape.gradient(loss, alphas, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        step = lr_t * decay ** tf.cast(k, dtype)
        direction, state = adam.update(grads, state)
        alphas = [tf.clip_by_value(a - step * d, 0.0, 1.0) for a, d in zip(alphas, direction)]
        best = [tf.maximum(b, lb) for b, lb in zip(best, lbs)]
        return k + 1, alphas, state, best

    best0 = [tf.fill(tf.shape(obj)[:2], tf.constant(-math.inf, dtype)) for obj in objectives]
    _, alphas, _, best = tf.while_loop(
        lambda k, *_: k < iterations - 1, body, [tf.constant(0), init, adam.init(init), best0])
    best = [tf.stop_gradient(tf.maximum(b, lb)) for b, lb in zip(best, evaluate(alphas))]
    lb = best[0]
    ub = None if lower_only else -best[1]
    if spec is None:
        return tf.reshape(lb, [batch, *out_shape]), tf.reshape(ub, [batch, *out_shape])
    return lb, ub
