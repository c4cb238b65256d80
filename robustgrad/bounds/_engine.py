"""Propagation: IBP forward over boxes, CROWN backward over linear bounds, on a bound graph.

A bound graph is any object with ``rules`` (node 0 is the input, ``None``), ``inputs`` (the
input node indices of every node) and ``output`` (the index of the output node); the Keras
walker (:mod:`robustgrad.bounds._keras_graph`) and the plain stack
(:mod:`robustgrad.bounds._stack`) build one. :func:`propagate` is the whole computation for one
static batch, traceable (no Python branch on tensor values) and differentiable w.r.t. the weights
the rules read. alpha-CROWN (:mod:`robustgrad.bounds._alpha`) builds on it, and
:mod:`robustgrad.bounds._methods` picks between the two by method name, for any batch size.

- ``"ibp"``: the interval pass; with a specification ``C`` the last linear layers are merged with
  ``C`` by a backward pass over them (tighter than bounding the logits and subtracting).
- ``"crown"``: the pre-activation bounds of every activation by CROWN (a backward pass from that
  node to the input), intersected with IBP's (both are sound) and computed only for the elements
  the activation gains from (an unstable ReLU, any tanh/sigmoid element); then the output's.
- ``"crown-ibp"``: IBP's pre-activation bounds, CROWN for the output.

>>> import numpy as np, tensorflow as tf
>>> from robustgrad.bounds._stack import StackGraph
>>> g = StackGraph([np.array([[1.0, -1.0]], "float32")], [None], [])
>>> lo, hi = propagate(g, tf.constant([[0.0]]), tf.constant([[1.0]]), None, None, "crown")
>>> lo.numpy().tolist(), hi.numpy().tolist()
([[0.0, -1.0]], [[1.0, 0.0]])
"""

from __future__ import annotations

import math

import tensorflow as tf

from . import _patches
from ._activations import Activation, joint_relaxations
from ._chunks import map_chunks

__all__ = ["concretize", "output_shape", "pre_activation_bounds", "propagate"]

# Largest number of elements one chunk of an intermediate layer's CROWN pass may hold at once
# (its coefficients on every node of the path, both sides, the relaxations it reads and the
# temporaries: estimated from the shapes before any work; 512 MB in float32).
WORK_BUDGET = 2 ** 27
# Whether CROWN's intermediate bounds are intersected with IBP's (both sound; on by default).
# Off, they are CROWN's alone: the definition of auto_LiRPA's "CROWN" (its comparison benchmark
# turns it off to compare like with like). Read when a computation is traced.
INTERSECT_WITH_IBP = True
# Fewest identity rows per chunk of an intermediate layer's CROWN pass (a layer of n elements is
# done in chunks of max(MIN_ROWS, n / 8) rows, so that mostly-stable layers cost a fraction).
MIN_ROWS = 16
# Whether the intermediate bounds of convolutional layers are computed by patches
# (:mod:`robustgrad.bounds._patches`): None chooses (patches where they are at most half the dense
# coefficients), True wherever the layers allow, False never. Read when a computation is traced.
PATCHES: bool | None = None
# Largest coefficient tensor (elements) of the output's backward pass (both sides) done in one
# piece; above it, in chunks of examples (:func:`_output_backward`; 4 MB in float32).
OUTPUT_CHUNK = 2 ** 20
# Whether CROWN's intermediate passes bound only the elements an activation gains from (unstable
# ReLUs, the elements a max pooling may pick; every tanh/sigmoid element): sound and lossless
# (a stable ReLU's relaxation is exact whatever its bounds), on by default. Off, every element
# gets a CROWN pass (auto_LiRPA's ``sparse_intermediate_bounds=False``). Read when traced.
SPARSE_INTERMEDIATE = True


def concretize(a_lo, a_hi, lo, hi, ball=None):
    """Bounds over ``lo <= x <= hi`` (``x`` [B, *shape]) of the linear forms with coefficients
    ``a_lo``/``a_hi`` ([B, S, *shape]; ``a_hi`` may be None: no upper bound, or ``a_lo`` itself:
    computed once), without the biases -> ([B, S], [B, S]): ``a.mid -+ |a|.rad`` as batched
    matrix-vector products. With ``ball = (centre, radius)`` also over the L2 ball (dual norm),
    keeping the tighter of the two."""
    flat = [tf.shape(a_lo)[0], a_lo.shape[1], -1]
    rows = [tf.shape(lo)[0], -1]
    mid, rad = tf.reshape((hi + lo) / 2, rows), tf.reshape((hi - lo) / 2, rows)

    def centre_radius(a):
        a = tf.reshape(a, flat)
        return tf.linalg.matvec(a, mid), tf.linalg.matvec(tf.abs(a), rad)

    a_mid, a_rad = centre_radius(a_lo)
    low, high = a_mid - a_rad, None
    if a_hi is a_lo:
        high = a_mid + a_rad
    elif a_hi is not None:
        h_mid, h_rad = centre_radius(a_hi)
        high = h_mid + h_rad
    if ball is not None:
        centre, radius = ball
        centre = tf.reshape(centre, rows)

        def dual(a):
            a = tf.reshape(a, flat)
            return tf.linalg.matvec(a, centre), radius * tf.norm(a, axis=-1)

        c_lo, n_lo = dual(a_lo)
        low = tf.maximum(low, c_lo - n_lo)
        if a_hi is not None:
            c_hi, n_hi = (c_lo, n_lo) if a_hi is a_lo else dual(a_hi)
            high = tf.minimum(high, c_hi + n_hi)
    return low, high


def interval_pass(graph, lower, upper, dtype):
    """IBP: the box of every node, ``[(lo, hi)]`` in node order."""
    boxes = [(lower, upper)]
    for rule, ins in zip(graph.rules[1:], graph.inputs[1:]):
        boxes.append(rule.interval([boxes[j] for j in ins], dtype))
    return boxes


def output_shape(graph, example_shape, dtype=tf.float32):
    """The per-example output shape for inputs of per-example shape ``example_shape``."""
    one = tf.zeros([1, *example_shape], dtype)
    return tuple(interval_pass(graph, one, one, dtype)[graph.output][0].shape[1:])


def _linear_tail_start(graph, node):
    """The first node of the chain of single-input linear nodes that ends at ``node``: IBP merges
    the spec into that tail (the model's last linear layers)."""
    while node != 0 and graph.rules[node].linear and graph.rules[node].num_inputs == 1:
        node = graph.inputs[node][0]
    return node


def propagate(graph, lower, upper, spec, ball, method, lower_only=False):
    """Bounds of the graph's output over the box (static batch ``B``) -> ``(lb, ub)``:
    ``[B, *out]``, or ``[B, S]`` with ``spec`` [B, S, *out]. ``ball``: ``(centre, radius)`` of an
    L2 ball (CROWN concretises over it as well) or None. ``lower_only``: the last backward pass
    (with ``spec``) carries the lower bound's coefficients only (half the work; certified
    training needs no more) and ``ub`` is None. ``method``: ``"ibp"``, ``"crown"`` or
    ``"crown-ibp"`` (alpha-CROWN: :func:`robustgrad.bounds._methods.propagate`). No validation."""
    dtype = lower.dtype
    boxes = interval_pass(graph, lower, upper, dtype)
    shapes = [tuple(lo.shape[1:]) for lo, _ in boxes]
    out_shape = shapes[graph.output]
    n_out = math.prod(out_shape)
    batch = lower.shape[0]
    if method == "ibp":
        if spec is None:
            return boxes[graph.output]
        stop = _linear_tail_start(graph, graph.output)
        return _backward(graph, graph.output, spec, {}, boxes, shapes, stop, ball, dtype,
                         lower_only)
    pre = pre_activation_bounds(graph, boxes, shapes, ball, dtype, method)
    # CROWN-IBP knows every relaxation's input bounds before its backward pass: one joint
    # relaxation of the S-shaped layers (their bisections shared)
    joint = method == "crown-ibp"
    if spec is None:
        eye = tf.eye(n_out, dtype=dtype)
        spec_full = tf.broadcast_to(tf.reshape(eye, [1, n_out, *out_shape]),
                                    [batch, n_out, *out_shape])
        lo, hi = _output_backward(graph, spec_full, pre, boxes, shapes, ball, dtype, joint)
        return tf.reshape(lo, [batch, *out_shape]), tf.reshape(hi, [batch, *out_shape])
    if lower_only:  # certified training's (differentiated) pass: whole, as measured there
        return _backward(graph, graph.output, spec, pre, boxes, shapes, 0, ball, dtype, True,
                         lines=_joint_lines(graph, pre) if joint else None)
    return _output_backward(graph, spec, pre, boxes, shapes, ball, dtype, joint)


def _joint_lines(graph, pre):
    """``{activation node: its relaxation's lines}`` for the S-shaped activations, computed
    together (:func:`robustgrad.bounds._activations.joint_relaxations`)."""
    return joint_relaxations({i: (rule, pre[graph.inputs[i][0]])
                              for i, rule in enumerate(graph.rules)
                              if rule is not None and not rule.linear})


def _output_backward(graph, spec, pre, boxes, shapes, ball, dtype, joint=False):
    """The output's backward pass (both sides), in chunks of examples, one chunk at a time,
    when its widest coefficient tensor (``B x S x`` the widest node) would exceed
    :data:`OUTPUT_CHUNK` elements: each chunk's tensors then stay in the processor's cache (28x28
    CNNs at batch 128: 1.4-1.9x faster). The same sums per example. ``joint``: the relaxations'
    lines computed together beforehand (:func:`_joint_lines`) in the one-piece pass (a chunked
    pass relaxes each chunk's own)."""
    batch, rows = spec.shape[0], spec.shape[1]
    k = max(1, OUTPUT_CHUNK // max(1, rows * max(math.prod(s) for s in shapes)))
    if batch is None or k >= batch:
        return _backward(graph, graph.output, spec, pre, boxes, shapes, 0, ball, dtype,
                         lines=_joint_lines(graph, pre) if joint else None)
    keys = sorted(pre)
    parts = [spec, *boxes[0], *(t for j in keys for t in pre[j])]
    if ball is not None:
        parts.append(ball[0])

    def one(a):
        chunk_pre = {j: (a[3 + 2 * n], a[4 + 2 * n]) for n, j in enumerate(keys)}
        chunk_ball = None if ball is None else (a[-1], ball[1])
        return _backward(graph, graph.output, a[0], chunk_pre, [(a[1], a[2])], shapes, 0,
                         chunk_ball, dtype)

    sig = tf.TensorSpec([k, rows], dtype)
    return map_chunks(one, parts, k, (sig, sig), parallel_iterations=1)


def pre_activation_bounds(graph, boxes, shapes, ball, dtype, method):
    """The input bounds of every activation, ``{node: (lo, hi)}``: IBP's for ``"crown-ibp"`` (and
    for the graph's input), CROWN's (intersected with IBP's) otherwise."""
    pre: dict[int, tuple] = {}
    for i, rule in enumerate(graph.rules):
        if rule is None or rule.linear:
            continue
        p = graph.inputs[i][0]
        if p in pre:
            continue
        if method == "crown-ibp" or p == 0:
            pre[p] = boxes[p]
        elif _is_elementwise(graph.rules[p]) and graph.inputs[p][0] in pre:
            pre[p] = _activation_output_bounds(graph, p, pre, boxes)
        else:
            pre[p] = _node_bounds(graph, p, pre, boxes, shapes, ball, dtype)
    return pre


def _is_elementwise(rule):
    """Whether ``rule`` is an element-wise monotone activation (its interval rule is exact)."""
    return isinstance(rule, Activation)


def _activation_output_bounds(graph, node, pre, boxes):
    """The bounds of an activation's output (the input of another non-linear rule, e.g. a ReLU
    before a max pooling) from its input's bounds: the activation is monotone, so its interval
    rule on them is exact and at least as tight as a CROWN pass through its relaxation (what
    auto_LiRPA does for activation outputs too)."""
    lo, hi = graph.rules[node].interval([pre[graph.inputs[node][0]]], None)
    if INTERSECT_WITH_IBP:
        lo, hi = tf.maximum(lo, boxes[node][0]), tf.minimum(hi, boxes[node][1])
    return lo, hi


def _output_bounds_needed(graph, node):
    """Whether an activation's output bounds are read (by a non-linear rule after it, e.g. a
    max pooling): then its input's elements whose outputs that rule gains from need tighter
    bounds, stable or not (an element-wise monotone activation: the same elements)."""
    return _is_elementwise(graph.rules[node]) and any(
        rule is not None and not rule.linear and graph.inputs[i][0] == node
        for i, rule in enumerate(graph.rules))


def _refine_mask(graph, node, boxes):
    """Elements of ``node`` whose tighter bounds help an activation that reads it (all of them
    with :data:`SPARSE_INTERMEDIATE` off)."""
    lo, hi = boxes[node]
    if not SPARSE_INTERMEDIATE:
        return tf.ones_like(lo, tf.bool)
    masks = []
    for i, rule in enumerate(graph.rules):
        if rule is None or rule.linear or graph.inputs[i][0] != node:
            continue
        masks.append(rule.refine(lo, hi))
        if _output_bounds_needed(graph, i):  # the elements its readers gain from, stable or not
            masks += [graph.rules[c].refine(*boxes[i]) for c, r in enumerate(graph.rules)
                      if r is not None and not r.linear and graph.inputs[c][0] == i]
    mask = masks[0]
    for m in masks[1:]:
        mask = mask | m
    return mask


def _node_bounds(graph, node, pre, boxes, shapes, ball, dtype):
    """CROWN bounds of the elements of ``node``, intersected with IBP's.

    Only the elements an activation gains from get a CROWN pass: per example, those first, as
    identity rows in chunks of ``rows`` inside one ``tf.while_loop`` that stops after the last
    example's last such element, one chunk at a time; no chunk holds more than ``WORK_BUDGET``
    elements (estimated from the shapes)."""
    shape = shapes[node]
    n = math.prod(shape)
    batch = boxes[0][0].shape[0]
    geo = None if PATCHES is False else _patches.plan(graph, node, shapes)
    if geo is not None and PATCHES is None and not _patches.worth_it(geo, shapes, node):
        geo = None
    if geo is not None:
        per_row = _patches.memory_per_row(geo, shapes, node)
        prepared = _patches.prepare(graph, node, geo, pre, boxes, shapes, ball, dtype)
    else:
        per_row = 8 * max(math.prod(shapes[i]) for i in range(node + 1))
    budget_rows = max(1, WORK_BUDGET // max(1, batch * per_row))
    rows = max(1, min(n, budget_rows, max(MIN_ROWS, -(-n // 8))))
    ibp_lo, ibp_hi = (tf.reshape(t, [batch, n]) for t in boxes[node])
    wanted = tf.reshape(_refine_mask(graph, node, boxes), [batch, n])
    order = tf.argsort(tf.cast(~wanted, tf.int32), axis=1, stable=True)  # wanted first
    needed = tf.reduce_max(tf.reduce_sum(tf.cast(wanted, tf.int32), axis=1))
    chunks = (needed + rows - 1) // rows
    n_pad = -(-n // rows) * rows
    order = tf.pad(order, [[0, 0], [0, n_pad - n]], constant_values=n)  # n: a spare column
    rows_of = tf.broadcast_to(tf.range(batch)[:, None], [batch, rows])

    def body(k, lo_acc, hi_acc):
        idx = tf.slice(order, tf.stack([0, k * rows]), [batch, rows])
        if geo is not None:
            lo_k, hi_k = _patches.backward(graph, node, tf.minimum(idx, n - 1), geo, prepared,
                                           shapes, ball, dtype)
        else:
            spec = tf.reshape(tf.one_hot(idx, n, dtype=dtype), [batch, rows, *shape])
            lo_k, hi_k = _backward(graph, node, spec, pre, boxes, shapes, 0, ball, dtype)
        where = tf.stack([rows_of, idx], axis=-1)
        return (k + 1, tf.tensor_scatter_nd_update(lo_acc, where, lo_k),
                tf.tensor_scatter_nd_update(hi_acc, where, hi_k))

    spare = tf.zeros([batch, 1], dtype)
    init = [tf.constant(0), tf.concat([ibp_lo, spare], 1), tf.concat([ibp_hi, spare], 1)]
    # one chunk at a time: the default (10 iterations in flight) held ten chunks' coefficients
    _, lo, hi = tf.while_loop(lambda k, *_: k < chunks, body, init, parallel_iterations=1)
    lo, hi = lo[:, :n], hi[:, :n]
    if INTERSECT_WITH_IBP:
        lo, hi = tf.maximum(lo, ibp_lo), tf.minimum(hi, ibp_hi)
    return tf.reshape(lo, [batch, *shape]), tf.reshape(hi, [batch, *shape])


def _backward(graph, target, spec, pre, boxes, shapes, stop, ball, dtype, lower_only=False,
              slopes=None, lines=None):
    """Bounds of ``spec @ value(target)`` (spec [B, S, *shape(target)]) -> ([B, S], [B, S]):
    linear bounds propagated back to node ``stop`` and concretised over its box (the input set
    when ``stop`` is 0). ``lower_only``: the upper bound's coefficients are not carried, and the
    upper bound returned is None. ``slopes``: ``{ReLU node: lower slopes [B, S, *shape]}`` for
    its unstable elements (alpha-CROWN; with ``lower_only`` only), instead of CROWN's.
    ``lines``: ``{activation node: (ls, li, us, ui)}`` of relaxations computed beforehand."""
    coeffs = {target: (spec, None if lower_only else spec)}
    bias_lo = tf.zeros(tf.shape(spec)[:2], dtype)
    bias_hi = None if lower_only else tf.zeros(tf.shape(spec)[:2], dtype)
    for i in range(target, stop, -1):
        if i not in coeffs:
            continue
        a_lo, a_hi = coeffs.pop(i)
        rule, ins = graph.rules[i], graph.inputs[i]
        if slopes is not None and i in slopes:
            a_lo, a_hi, d_lo, d_hi = rule.backward_sloped(a_lo, pre[ins[0]], slopes[i])
            new = [(a_lo, a_hi)]
        elif lines is not None and i in lines:
            a_lo, a_hi, d_lo, d_hi = rule.backward_lines(a_lo, a_hi, lines[i])
            new = [(a_lo, a_hi)]
        elif not rule.linear:
            a_lo, a_hi, d_lo, d_hi = rule.backward_relaxed(a_lo, a_hi, pre[ins[0]])
            new = [(a_lo, a_hi)]
        elif lower_only or a_hi is a_lo:  # one side, or both the same (before a relaxation)
            outs, d_lo = rule.backward(a_lo, [shapes[j] for j in ins], dtype)
            new = [(o, None if lower_only else o) for o in outs]
            d_hi = None if lower_only else d_lo
        else:  # one call per side: concatenating them (and slicing the result) copied every
            # coefficient tensor twice more, a third of CROWN-IBP's time on a 28x28 CNN
            outs_lo, d_lo = rule.backward(a_lo, [shapes[j] for j in ins], dtype)
            outs_hi, d_hi = rule.backward(a_hi, [shapes[j] for j in ins], dtype)
            new = list(zip(outs_lo, outs_hi))
        if d_lo is not None:
            bias_lo = bias_lo + d_lo
        if d_hi is not None:
            bias_hi = bias_hi + d_hi
        for j, (n_lo, n_hi) in zip(ins, new):
            if j in coeffs:
                o_lo, o_hi = coeffs[j]
                same = o_hi is o_lo and n_hi is n_lo
                n_lo = o_lo + n_lo
                n_hi = None if lower_only else n_lo if same else o_hi + n_hi
            coeffs[j] = (n_lo, n_hi)
    if stop not in coeffs:  # the target does not depend on the input
        return bias_lo, bias_hi
    a_lo, a_hi = coeffs[stop]
    lo, hi = boxes[stop]
    low, high = concretize(a_lo, a_hi, lo, hi, ball if stop == 0 else None)
    return low + bias_lo, None if lower_only else high + bias_hi
