"""CROWN's intermediate bounds of a convolutional layer without dense matrices: patches.

The linear bounds of one element of an image-shaped node (a position ``(p, q)`` and a channel of
a convolution's output, say), propagated back through convolutions, only reach that element's
receptive field: a window of the earlier node. So each specification row keeps its coefficients
on that window only, ``[B, rows, Rh, Rw, C]`` (a *patch*), instead of on the whole node
``[B, rows, H, W, C]`` (auto_LiRPA's "patches" mode). The window of node ``j`` for the target
position ``(p, q)`` starts at row ``p * Sh - Ph`` and column ``q * Sw - Pw`` and is ``Rh x Rw``
(:class:`Geometry`); going back through a convolution of stride ``s``, kernel ``k`` and top
padding ``t``: ``S' = S s``, ``P' = P s + t``, ``R' = (R - 1) s + k``, and the patch goes through
the transposed convolution on its own (``"valid"``; a batch of ``B * rows`` small images).
Positions of a window outside its node (a convolution's zero padding) get coefficient 0 (the
``mask``), so biases and relaxations there count for nothing. Element-wise rules (activations,
batch normalization) read their per-position values from the same windows (``unfold``).

The rules with a patch form: Conv2D, element-wise activations, Elementwise (batch norm,
rescaling), ZeroPadding2D, AveragePooling2D without padding, Identity and Add (the branches'
windows are aligned to their union). A path with any other rule (Dense, Flatten, max pooling)
is done densely. The bounds are those of the dense pass (the same sums, in another order).

>>> import keras, numpy as np, tensorflow as tf
>>> from robustgrad.bounds._keras_graph import Graph
>>> m = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(2, 3, activation="relu"),
...                       keras.layers.Conv2D(2, 3)])
>>> g = Graph(m)
>>> plan(g, g.output, [(6, 6, 1), (4, 4, 2), (4, 4, 2), (2, 2, 2)])[0]
Geometry(pad_h=0, pad_w=0, size_h=5, size_w=5, stride_h=1, stride_w=1)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import tensorflow as tf

from . import _rules as _r
from ._activations import Activation, ReLU
from ._rules import sum_trailing

__all__ = ["Geometry", "backward", "memory_per_row", "plan", "prepare", "worth_it"]


class Geometry(NamedTuple):
    """The window of a node read by a target position ``(p, q)``: rows ``p * stride_h - pad_h``
    to ``+ size_h``, columns likewise."""

    pad_h: int
    pad_w: int
    size_h: int
    size_w: int
    stride_h: int
    stride_w: int


_START = Geometry(0, 0, 1, 1, 1, 1)


def _same_pad(size_in, size_out, k, s):
    """TensorFlow's top (left) padding of ``"same"``."""
    return max((size_out - 1) * s + k - size_in, 0) // 2


def _through(rule, g, in_shape, out_shape):
    """The window of a rule's input from its output's, or None when the rule has no patch form."""
    if isinstance(rule, _r.Conv2D):
        kh, kw = (int(d) for d in rule.layer.kernel.shape[:2])
        sh, sw = rule.strides[1:3]
        th = tw = 0
        if rule.padding == "SAME":
            th = _same_pad(in_shape[0], out_shape[0], kh, sh)
            tw = _same_pad(in_shape[1], out_shape[1], kw, sw)
        return Geometry(g.pad_h * sh + th, g.pad_w * sw + tw, (g.size_h - 1) * sh + kh,
                        (g.size_w - 1) * sw + kw, g.stride_h * sh, g.stride_w * sw)
    if isinstance(rule, _r.AveragePooling2D):
        (kh, kw), (sh, sw) = rule.ksize[1:3], rule.strides[1:3]
        if rule.padding == "SAME" and (_same_pad(in_shape[0], out_shape[0], kh, sh)
                                       or _same_pad(in_shape[1], out_shape[1], kw, sw)
                                       or (out_shape[0] - 1) * sh + kh != in_shape[0]
                                       or (out_shape[1] - 1) * sw + kw != in_shape[1]):
            return None  # the divisor of a padded window depends on the position
        return Geometry(g.pad_h * sh, g.pad_w * sw, (g.size_h - 1) * sh + kh,
                        (g.size_w - 1) * sw + kw, g.stride_h * sh, g.stride_w * sw)
    if isinstance(rule, _r.ZeroPadding2D):
        return g._replace(pad_h=g.pad_h + rule.top, pad_w=g.pad_w + rule.left)
    if isinstance(rule, (Activation, _r.Elementwise, _r.Identity, _r.Add)):
        return g
    return None


def _union(a, b):
    """The smallest window holding windows ``a`` and ``b`` (same strides), or None."""
    if (a.stride_h, a.stride_w) != (b.stride_h, b.stride_w):
        return None
    ph, pw = max(a.pad_h, b.pad_h), max(a.pad_w, b.pad_w)
    return Geometry(ph, pw, max(a.size_h - a.pad_h, b.size_h - b.pad_h) + ph,
                    max(a.size_w - a.pad_w, b.size_w - b.pad_w) + pw, a.stride_h, a.stride_w)


def plan(graph, node, shapes):
    """The window of every node the target ``node`` depends on, ``{node: Geometry}``, or None when
    a rule on the way has no patch form (or a node is not an image ``[H, W, C]``)."""
    if len(shapes[node]) != 3:
        return None
    geo = {node: _START}
    for i in range(node, 0, -1):
        if i not in geo:
            continue
        rule = graph.rules[i]
        for j in graph.inputs[i]:
            if len(shapes[j]) != 3:
                return None
            g = _through(rule, geo[i], shapes[j], shapes[i])
            if g is None:
                return None
            g = g if j not in geo else _union(geo[j], g)
            if g is None:
                return None
            geo[j] = g
    return geo if 0 in geo else None


def worth_it(geo, shapes, node):
    """Whether patches are smaller than dense coefficients by at least half, summed over the
    nodes on the way (the cost of every rule is about proportional to its coefficients)."""
    patch = sum(g.size_h * g.size_w * shapes[j][2] for j, g in geo.items() if j != node)
    dense = sum(math.prod(shapes[j]) for j in geo if j != node)
    return 2 * patch <= dense


class _Windows:
    """The windows of a node's tensor ``t`` [N, H, W, C] (N = B or 1) read by the target positions
    of ``target`` [Ht, Wt, ...] through geometry ``g``: ``t`` zero-padded once to hold every window
    (a node-sized tensor), and each chunk of rows gathers its own windows (:meth:`take`), so that no
    tensor of every position's window (``N x Ht Wt x Rh Rw x C``, gigabytes on a 28x28 CNN) is
    ever built."""

    def __init__(self, t, g, target):
        h, w = t.shape[1], t.shape[2]
        self.g, self.wt, self.c = g, target[1], t.shape[3]
        bottom = max(0, (target[0] - 1) * g.stride_h - g.pad_h + g.size_h - h)
        right = max(0, (target[1] - 1) * g.stride_w - g.pad_w + g.size_w - w)
        self.width = g.pad_w + w + right  # of the padded tensor
        padded = tf.pad(t, [[0, 0], [g.pad_h, bottom], [g.pad_w, right], [0, 0]])
        self.flat = tf.reshape(padded, [tf.shape(t)[0], -1, self.c])
        self.batched = t.shape[0] != 1

    def take(self, where):
        """The windows of the rows' target positions ``where`` [B, rows] -> [B, rows, Rh, Rw,
        C]."""
        g = self.g
        offsets = (tf.range(g.size_h)[:, None] * self.width + tf.range(g.size_w)[None, :])
        start = (where // self.wt) * (g.stride_h * self.width) + (where % self.wt) * g.stride_w
        idx = start[:, :, None, None] + offsets  # [B, rows, Rh, Rw] into the padded rows
        if self.batched:
            return tf.gather(self.flat, idx, batch_dims=1)
        return tf.gather(self.flat[0], idx)


def _window_mask(g, in_shape, target, where, dtype):
    """1 where a row's window lies inside the node of shape ``in_shape``, 0 on its padding ->
    [B, rows, Rh, Rw, 1] (computed from the positions; nothing gathered)."""
    p, q = where // target[1], where % target[1]
    r = p[:, :, None] * g.stride_h - g.pad_h + tf.range(g.size_h)  # [B, rows, Rh]
    c = q[:, :, None] * g.stride_w - g.pad_w + tf.range(g.size_w)
    inside = (((r >= 0) & (r < in_shape[0]))[:, :, :, None]
              & ((c >= 0) & (c < in_shape[1]))[:, :, None, :])
    return tf.cast(inside, dtype)[..., None]


def prepare(graph, node, geo, pre, boxes, shapes, ball, dtype):
    """Everything the chunks of ``node``'s rows read, padded once (node-sized tensors): ``{key:
    _Windows}`` for the relaxations, the element-wise coefficients and the input box (and the
    ball's centre)."""
    target = shapes[node]
    out: dict = {}
    for i, g in geo.items():
        rule = graph.rules[i]
        if isinstance(rule, Activation):
            j = graph.inputs[i][0]
            lines = list(rule.relaxation(*pre[j]))
            out[("relax", i)] = tuple(None if k == 1 and isinstance(rule, ReLU) else  # li = 0
                                      _Windows(t, g, target) for k, t in enumerate(lines))
        elif isinstance(rule, _r.Elementwise):
            j = graph.inputs[i][0]
            s, t = rule.coefficients(dtype, 3)
            out[("affine", i)] = tuple(_Windows(tf.broadcast_to(v, [1, *shapes[j]]), g, target)
                                       for v in (s, t))
    out["box"] = tuple(_Windows(t, geo[0], target) for t in boxes[0])
    if ball is not None:
        out["centre"] = _Windows(ball[0], geo[0], target)
    return out


def memory_per_row(geo, shapes, node):
    """Elements one specification row of ``node``'s patch pass holds at once (per example): the
    two sides' coefficients on every window of the path, and as much again for the windows
    gathered from the relaxations and the temporaries of the widest rule."""
    windows = [g.size_h * g.size_w * shapes[j][2] for j, g in geo.items() if j != node]
    return 4 * sum(windows) + 8 * max(windows)


def _align(a, have, want):
    """Coefficients on window ``have`` padded with zeros to window ``want`` (which holds it)."""
    if have == want:
        return a
    top, left = want.pad_h - have.pad_h, want.pad_w - have.pad_w
    return tf.pad(a, [[0, 0], [0, 0], [top, want.size_h - have.size_h - top],
                      [left, want.size_w - have.size_w - left], [0, 0]])


def _conv_transpose(rule, a, in_channels, dtype):
    """A convolution's transpose on every patch: [B, rows, Rh, Rw, Cout] -> [B, rows, Rh', Rw',
    Cin]."""
    kernel = _r.cast(rule.layer.kernel, dtype)
    kh, kw = kernel.shape[0], kernel.shape[1]
    sh, sw = rule.strides[1:3]
    b, rows, rh, rw = tf.shape(a)[0], a.shape[1], a.shape[2], a.shape[3]
    oh, ow = (rh - 1) * sh + kh, (rw - 1) * sw + kw
    flat = tf.reshape(a, [-1, rh, rw, a.shape[4]])
    if (rh, rw) == (1, 1):  # one position: the kernel's columns weighted by the coefficients
        out = tf.tensordot(flat[:, 0, 0], kernel, [[1], [3]])
    else:
        out = _r.conv_transpose_valid(flat, kernel, (sh, sw))
    return tf.reshape(out, [b, rows, oh, ow, in_channels])


def _avg_pool_transpose(rule, a):
    b, rows, rh, rw, c = tf.shape(a)[0], a.shape[1], a.shape[2], a.shape[3], a.shape[4]
    (kh, kw), (sh, sw) = rule.ksize[1:3], rule.strides[1:3]
    oh, ow = (rh - 1) * sh + kh, (rw - 1) * sw + kw
    flat = tf.reshape(a, [-1, rh, rw, c])
    out = tf.raw_ops.AvgPoolGrad(orig_input_shape=tf.stack([tf.shape(flat)[0], oh, ow, c]),
                                 grad=flat, ksize=rule.ksize, strides=rule.strides,
                                 padding="VALID")
    return tf.reshape(out, [b, rows, oh, ow, c])


def _relaxed(a_lo, a_hi, ls, li, us, ui):
    """An activation's lines substituted by the sign of the coefficients (patch-shaped); ``li``
    None: the lower line has no intercept (a ReLU's)."""
    pos_lo, neg_lo = tf.nn.relu(a_lo), tf.minimum(a_lo, 0)
    pos_hi, neg_hi = tf.nn.relu(a_hi), tf.minimum(a_hi, 0)
    if li is None:
        return (pos_lo * ls + neg_lo * us, pos_hi * us + neg_hi * ls, sum_trailing(neg_lo * ui),
                sum_trailing(pos_hi * ui))
    return (pos_lo * ls + neg_lo * us, pos_hi * us + neg_hi * ls,
            sum_trailing(pos_lo * li + neg_lo * ui), sum_trailing(pos_hi * ui + neg_hi * li))


def backward(graph, node, index, geo, prepared, shapes, ball, dtype):
    """CROWN bounds of the elements ``index`` [B, rows] (flat indices into ``node``'s [H, W, C])
    -> ([B, rows], [B, rows]), by patches: :func:`robustgrad.bounds._engine._backward` with
    identity rows, concretised over the input box (and ball)."""
    ht, wt, ct = shapes[node]
    where = index // ct  # the target position of each row
    channel = index % ct
    one_hot = tf.one_hot(channel, ct, dtype=dtype)[:, :, None, None, :]
    coeffs = {node: (one_hot, one_hot)}
    bias_lo = tf.zeros(tf.shape(index), dtype)
    bias_hi = bias_lo
    for i in range(node, 0, -1):
        if i not in coeffs:
            continue
        a_lo, a_hi = coeffs.pop(i)
        rule, ins = graph.rules[i], graph.inputs[i]
        if isinstance(rule, Activation):
            relax = [None if w is None else w.take(where) for w in prepared[("relax", i)]]
            a_lo, a_hi, d_lo, d_hi = _relaxed(a_lo, a_hi, *relax)
            bias_lo, bias_hi = bias_lo + d_lo, bias_hi + d_hi
        elif isinstance(rule, _r.Elementwise):
            s, t = (w.take(where) for w in prepared[("affine", i)])
            bias_lo, bias_hi = bias_lo + sum_trailing(a_lo * t), bias_hi + sum_trailing(a_hi * t)
            a_lo, a_hi = a_lo * s, a_hi * s
        elif isinstance(rule, (_r.Conv2D, _r.AveragePooling2D)):
            both = tf.concat([a_lo, a_hi], 1)
            rows = a_lo.shape[1]
            if isinstance(rule, _r.Conv2D):
                if rule.layer.use_bias:
                    d = _r.channel_dot(both, _r.cast(rule.layer.bias, dtype))
                    bias_lo, bias_hi = bias_lo + d[:, :rows], bias_hi + d[:, rows:]
                both = _conv_transpose(rule, both, shapes[ins[0]][2], dtype)
            else:
                both = _avg_pool_transpose(rule, both)
            a_lo, a_hi = both[:, :rows], both[:, rows:]
        for j in ins:
            g = _through(rule, geo[i], shapes[j], shapes[i])
            n_lo, n_hi = _align(a_lo, g, geo[j]), _align(a_hi, g, geo[j])
            if isinstance(rule, (_r.Conv2D, _r.AveragePooling2D, _r.ZeroPadding2D)):
                mask = _window_mask(geo[j], shapes[j], shapes[node], where, dtype)  # padding: 0
                n_lo, n_hi = n_lo * mask, n_hi * mask
            if j in coeffs:
                n_lo, n_hi = coeffs[j][0] + n_lo, coeffs[j][1] + n_hi
            coeffs[j] = (n_lo, n_hi)
    a_lo, a_hi = coeffs[0]
    lo, hi = (w.take(where) for w in prepared["box"])
    low = sum_trailing(tf.nn.relu(a_lo) * lo + tf.minimum(a_lo, 0) * hi)
    high = sum_trailing(tf.nn.relu(a_hi) * hi + tf.minimum(a_hi, 0) * lo)
    if ball is not None:
        centre, radius = prepared["centre"].take(where), ball[1]
        flat = [tf.shape(a_lo)[0], a_lo.shape[1], -1]
        low = tf.maximum(low, sum_trailing(a_lo * centre)
                         - radius * tf.norm(tf.reshape(a_lo, flat), axis=-1))
        high = tf.minimum(high, sum_trailing(a_hi * centre)
                          + radius * tf.norm(tf.reshape(a_hi, flat), axis=-1))
    return low + bias_lo, high + bias_hi
