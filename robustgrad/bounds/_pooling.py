"""Max pooling in the bound engine: its interval rule and its linear relaxation for CROWN.

A max-pooling output is ``y = max_k x_k`` over the elements ``x_k`` of its window (``K`` of them,
``K = kh * kw``; the zero padding of ``"same"`` takes no part, as in the layer). With the window's
input bounds ``l_k <= x_k <= u_k``:

- IBP: ``[max_k l_k, max_k u_k]`` (exact for a box).
- CROWN: the lower line ``y >= x_i`` with ``i`` the element of the largest lower bound (any
  element of the window is a lower bound of the max: sound for every choice); the upper line
  ``y <= x_i`` when that element dominates the window (``l_i >= u_j`` for every other ``j``: then
  ``y = x_i`` exactly), otherwise the constant ``max_k u_k``. The same relaxation as auto_LiRPA's
  ``BoundMaxPool`` (not optimised by alpha-CROWN here), for any pool size, strides and padding
  (auto_LiRPA takes strides equal to the pool size only).

The windows are gathered by a depthwise convolution with one-hot filters (``[B, H, W, C]`` ->
``[B, oh, ow, C, K]``, exact: one product by 1 per value), and the backward pass puts every
window's coefficient back on its chosen element with the transposed convolution (overlapping
windows add up).

>>> import tensorflow as tf
>>> rule = MaxPooling2D("p", (2, 2), (2, 2), "valid")
>>> lo = tf.constant([[[[0.0], [1.0]], [[2.0], [-1.0]]]])
>>> [t.numpy().ravel().tolist() for t in rule.interval([(lo, lo + 0.5)], tf.float32)]
[[2.0], [2.5]]
"""

from __future__ import annotations

import tensorflow as tf

from ._rules import Rule, sum_trailing

__all__ = ["MaxPooling2D"]


class MaxPooling2D(Rule):
    """``tf.nn.max_pool2d`` (NHWC) with ``pool_size`` ``(kh, kw)``, ``strides`` ``(sh, sw)`` and
    ``padding`` ``"valid"`` or ``"same"``."""

    linear = False

    def __init__(self, name, pool_size, strides, padding):
        super().__init__(name)
        self.pool = tuple(int(k) for k in pool_size)
        self.ksize = [1, *self.pool, 1]
        self.strides = [1, *(int(s) for s in strides), 1]
        self.padding = padding.upper()
        self.window = self.pool[0] * self.pool[1]

    def interval(self, bounds, dtype):
        (lo, hi), = bounds
        return (tf.nn.max_pool2d(lo, self.ksize, self.strides, self.padding),
                tf.nn.max_pool2d(hi, self.ksize, self.strides, self.padding))

    def _filter(self, channels, dtype):
        """[kh, kw, C, K]: window position ``p`` of every channel to output ``p``."""
        eye = tf.reshape(tf.eye(self.window, dtype=dtype), [*self.pool, 1, self.window])
        return tf.broadcast_to(eye, [*self.pool, channels, self.window])

    def _windows(self, x):
        """[N, H, W, C] -> [N, oh, ow, C, K]: the elements of every window (padding: 0)."""
        n, c = tf.shape(x)[0], x.shape[-1]
        if self.strides[1] == self.strides[2]:
            out = tf.nn.depthwise_conv2d(x, self._filter(c, x.dtype), self.strides, self.padding)
            return tf.reshape(out, [n, *out.shape[1:3], c, self.window])
        # unequal strides (depthwise convolutions take equal ones): channels into the batch
        xc = tf.reshape(tf.transpose(x, [0, 3, 1, 2]), [-1, *x.shape[1:3], 1])
        out = tf.nn.conv2d(xc, self._filter(1, x.dtype), self.strides, self.padding)
        out = tf.reshape(out, [n, c, *out.shape[1:3], self.window])
        return tf.transpose(out, [0, 2, 3, 1, 4])

    def _windows_transpose(self, w, in_shape):
        """The transpose of :meth:`_windows`: [N, oh, ow, C, K] -> [N, *in_shape]."""
        n, c = tf.shape(w)[0], in_shape[-1]
        if self.strides[1] == self.strides[2]:
            flat = tf.reshape(w, [n, *w.shape[1:3], c * self.window])
            return tf.nn.depthwise_conv2d_backprop_input(
                tf.stack([n, *in_shape]), self._filter(c, w.dtype), flat, self.strides,
                self.padding)
        wc = tf.reshape(tf.transpose(w, [0, 3, 1, 2, 4]), [-1, *w.shape[1:3], self.window])
        out = tf.nn.conv2d_transpose(wc, self._filter(1, w.dtype),
                                     tf.stack([n * c, *in_shape[:2], 1]), self.strides,
                                     self.padding)
        return tf.transpose(tf.reshape(out, [n, c, *in_shape[:2]]), [0, 2, 3, 1])

    def relaxation(self, lo, hi):
        """From the input bounds [B, H, W, C] -> ``(choice, exact, top)``: ``choice`` [B, oh,
        ow, C, K] one-hot on the element of the largest lower bound, ``exact`` [B, oh, ow, C]
        1 where that element dominates its window (else 0), ``top`` the largest upper bound."""
        valid = self._windows(tf.ones_like(lo[:1])) > 0.5  # padding is no candidate
        neg_inf = tf.constant(-float("inf"), lo.dtype)
        lo_w = tf.where(valid, self._windows(lo), neg_inf)
        hi_w = tf.where(valid, self._windows(hi), neg_inf)
        choice = tf.one_hot(tf.argmax(lo_w, axis=-1), self.window, dtype=lo.dtype)
        others = tf.reduce_max(tf.where(choice > 0, neg_inf, hi_w), axis=-1)
        exact = tf.cast(tf.reduce_max(lo_w, axis=-1) >= others, lo.dtype)
        return choice, exact, tf.reduce_max(hi_w, axis=-1)

    def refine(self, lo, hi):
        """The elements that can be a window's max (upper bound >= the window's largest lower
        bound, in some window) and are not fixed: the others take no part in the relaxation,
        and tighter bounds keep them out (the largest lower bound only grows)."""
        valid = self._windows(tf.ones_like(lo[:1])) > 0.5
        neg_inf = tf.constant(-float("inf"), lo.dtype)
        lo_w = tf.where(valid, self._windows(lo), neg_inf)
        hi_w = tf.where(valid, self._windows(hi), neg_inf)
        candidate = hi_w >= tf.reduce_max(lo_w, axis=-1, keepdims=True)
        count = self._windows_transpose(tf.cast(candidate, lo.dtype), lo.shape[1:])
        return (count > 0.5) & (hi > lo)

    def backward_relaxed(self, a_lo, a_hi, pre_bounds):
        """As :meth:`robustgrad.bounds._activations.Activation.backward_relaxed`: ``a_lo`` /
        ``a_hi`` [B, S, oh, ow, C] (``a_hi`` None: the lower side only) -> coefficients [B, S,
        H, W, C] and biases [B, S]."""
        lo, hi = pre_bounds
        choice, exact, top = self.relaxation(lo, hi)
        choice = tf.expand_dims(choice, 1)
        exact, top = tf.expand_dims(exact, 1), tf.expand_dims(top, 1)
        in_shape = lo.shape[1:]
        batch, rows = tf.shape(a_lo)[0], a_lo.shape[1]

        def back(on_choice):  # [B, R, oh, ow, C] on the chosen elements -> [B, R, H, W, C]
            w = tf.expand_dims(on_choice, -1) * choice
            w = tf.reshape(w, [-1, *w.shape[2:]])
            return tf.reshape(self._windows_transpose(w, in_shape),
                              [batch, on_choice.shape[1], *in_shape])

        # lower side: positive coefficients take the lower line, negative ones the upper line
        pos, neg = tf.nn.relu(a_lo), tf.minimum(a_lo, 0)
        on_lo = pos + neg * exact
        bias_lo = sum_trailing(neg * (1 - exact) * top)
        if a_hi is None:
            return back(on_lo), None, bias_lo, None
        pos, neg = tf.nn.relu(a_hi), tf.minimum(a_hi, 0)
        on_hi = pos * exact + neg
        bias_hi = sum_trailing(pos * (1 - exact) * top)
        both = back(tf.concat([on_lo, on_hi], axis=1))  # one transposed convolution
        return both[:, :rows], both[:, rows:], bias_lo, bias_hi
