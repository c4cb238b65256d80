"""The linear rules of the bound engine: one class per kind of affine map.

A rule is one node of a bound graph. A *linear* rule is an affine map ``f(x) = L x + c``: its
interval rule is the centre/radius form (``L mid + c`` plus or minus ``|L| rad``, exact for a box
through an affine map), its CROWN rule the transposed map ``L^T a`` plus the bias ``a . c``
(:meth:`_Affine.backward`). The activations (ReLU, tanh, sigmoid) are in
:mod:`robustgrad.bounds._activations`.

Weights are read at call time from the variables or tensors a rule holds, so a rule built once
bounds a model that trains between calls, and gradients reach the weights.

Shapes: ``x``/``lo``/``hi`` are ``[B, *shape]``; the linear coefficients of CROWN are
``[B, S, *shape]`` (``S`` specification rows).

>>> import numpy as np, tensorflow as tf
>>> rule = Dense("d", lambda: np.array([[1.0], [-2.0]], "float32"), lambda: None)
>>> lo, hi = rule.interval([(tf.zeros([1, 2]), tf.ones([1, 2]))], tf.float32)
>>> lo.numpy().tolist(), hi.numpy().tolist()
([[-2.0]], [[1.0]])
"""

from __future__ import annotations

import tensorflow as tf

from robustgrad import convolution

__all__ = ["Add", "Affine", "AveragePooling2D", "Conv2D", "Dense", "Elementwise",
           "GlobalAveragePooling2D", "Identity", "Reshape", "Rule", "ZeroPadding2D"]


def cast(v, dtype):
    """A variable or array as a tensor of ``dtype`` (differentiable)."""
    return tf.cast(tf.convert_to_tensor(v), dtype)


def sum_trailing(t):
    """Sum of ``t`` [B, S, ...] over every axis after the first two -> [B, S]."""
    return tf.reduce_sum(t, axis=list(range(2, t.shape.rank))) if t.shape.rank > 2 else t


def channel_dot(a, c):
    """``sum(a * c)`` over every axis after the first two, ``a`` [B, S, *shape], ``c`` broadcast
    to ``shape`` -> [B, S]; a per-channel ``c`` ([C], the last axis) is a sum over the other axes
    and a matrix-vector product (no product tensor the size of ``a``)."""
    if c.shape.rank == 1 and a.shape.rank >= 3:
        if a.shape.rank > 3:
            a = tf.reduce_sum(a, axis=list(range(2, a.shape.rank - 1)))
        return tf.linalg.matvec(a, c)
    return sum_trailing(a * c)


# How a convolution's transpose is computed: "native" (TensorFlow's Conv2DBackpropInput),
# "forward" (forward convolutions with the flipped kernel, one per stride phase:
# robustgrad.convolution.transpose; the same sums)
# or "same" (the default: the forward convolution only where it is one "same" convolution, the
# dense transpose of a stride-1 "same" convolution with an odd kernel and at least
# SAME_MIN_CHANNELS input channels; native elsewhere: 8% off CROWN-IBP on a 28x28 CNN at batch
# 128, where "forward" everywhere was slower than native). Read when a computation is traced.
TRANSPOSE = "same"
# Fewest input channels of a convolution whose dense transpose "same" computes by a forward
# convolution (robustgrad.convolution.MIN_CHANNELS, measured there).
SAME_MIN_CHANNELS = convolution.MIN_CHANNELS


def conv_transpose_valid(a, kernel, strides):
    """The transpose of a ``"VALID"`` convolution: ``a`` [N, h, w, Cout], ``kernel`` [kh, kw, Cin,
    Cout], ``strides`` (sh, sw) -> [N, (h - 1) sh + kh, (w - 1) sw + kw, Cin]."""
    kh, kw, cin, cout = kernel.shape
    sh, sw = strides
    h, w = a.shape[1], a.shape[2]
    oh, ow = (h - 1) * sh + kh, (w - 1) * sw + kw
    if TRANSPOSE != "forward" or sh != sw:
        return tf.nn.conv2d_transpose(a, kernel, tf.stack([tf.shape(a)[0], oh, ow, cin]),
                                      [1, sh, sw, 1], "VALID")
    # the stride phases' forward convolutions (robustgrad.convolution's input gradient)
    return convolution.transpose(a, kernel, "VALID", sh, (oh, ow))


def _merge_batch_spec(a):
    """[B, S, *shape] -> [B*S, *shape]."""
    return tf.reshape(a, [-1, *a.shape[2:]])


class Rule:
    """A node of the bound graph. ``linear`` rules are affine; the others are activations."""

    linear = True
    num_inputs = 1

    def __init__(self, name: str) -> None:
        self.name = name


class Affine(Rule):
    """A single-input affine map ``f(x) = L x + c``. Subclasses give ``apply`` (L x),
    ``apply_abs`` (|L| r), ``transpose`` (L^T a, a: [N, *out] -> [N, *in]) and ``offset`` (c,
    broadcastable to [B, *out], or None)."""

    def apply(self, x, dtype):
        raise NotImplementedError

    def apply_abs(self, r, dtype):
        raise NotImplementedError

    def transpose(self, a, in_shape, dtype):
        raise NotImplementedError

    def offset(self, dtype):
        return None

    def interval(self, bounds, dtype):
        (lo, hi), = bounds
        mid, rad = (hi + lo) / 2, (hi - lo) / 2
        out_mid = self.apply(mid, dtype)
        c = self.offset(dtype)
        if c is not None:
            out_mid = out_mid + c
        out_rad = self.apply_abs(rad, dtype)
        return out_mid - out_rad, out_mid + out_rad

    def backward(self, a, in_shapes, dtype):
        at = self.transpose(_merge_batch_spec(a), in_shapes[0], dtype)
        at = tf.reshape(at, [tf.shape(a)[0], a.shape[1], *in_shapes[0]])
        c = self.offset(dtype)
        bias = None if c is None else channel_dot(a, c)  # c broadcasts over *out
        return [at], bias


class Dense(Affine):
    """``x @ kernel + bias``; ``kernel()`` -> [in, out], ``bias()`` -> [out] or None."""

    def __init__(self, name, kernel, bias):
        super().__init__(name)
        self.kernel, self.bias = kernel, bias

    def apply(self, x, dtype):
        return tf.tensordot(x, cast(self.kernel(), dtype), [[x.shape.rank - 1], [0]])

    def apply_abs(self, r, dtype):
        return tf.tensordot(r, tf.abs(cast(self.kernel(), dtype)), [[r.shape.rank - 1], [0]])

    def transpose(self, a, in_shape, dtype):
        return tf.tensordot(a, cast(self.kernel(), dtype), [[a.shape.rank - 1], [1]])

    def offset(self, dtype):
        b = self.bias()
        return None if b is None else cast(b, dtype)


class Conv2D(Affine):
    """A 2-D convolution (NHWC, dilation 1) of a Keras ``Conv2D`` layer."""

    def __init__(self, layer):
        super().__init__(layer.name)
        self.layer = layer
        self.strides = [1, *layer.strides, 1]
        self.padding = layer.padding.upper()

    def _conv(self, x, kernel):
        return tf.nn.conv2d(x, kernel, self.strides, self.padding)

    def apply(self, x, dtype):
        return self._conv(x, cast(self.layer.kernel, dtype))

    def apply_abs(self, r, dtype):
        return self._conv(r, tf.abs(cast(self.layer.kernel, dtype)))

    def transpose(self, a, in_shape, dtype):
        kernel = cast(self.layer.kernel, dtype)
        kh, kw = kernel.shape[0], kernel.shape[1]
        if (TRANSPOSE != "native" and self.strides == [1, 1, 1, 1] and self.padding == "SAME"
                and kh % 2 == 1 and kw % 2 == 1 and kernel.shape[2] >= SAME_MIN_CHANNELS):
            # stride 1, "same", odd kernel: the transpose is the "same" forward convolution with
            # the flipped kernel (in and out channels swapped): no padding, no crop (the same
            # function gives the attacks' and the training's convolutions their input gradient)
            return convolution.transpose(a, kernel, "SAME")
        if TRANSPOSE != "forward":
            out_shape = tf.stack([tf.shape(a)[0], *in_shape])
            return tf.nn.conv2d_transpose(a, kernel, out_shape, self.strides, self.padding)
        full = conv_transpose_valid(a, kernel, self.strides[1:3])
        top = left = 0
        if self.padding == "SAME":  # TensorFlow's: the smaller half on top
            top = max((a.shape[1] - 1) * self.strides[1] + kernel.shape[0] - in_shape[0], 0) // 2
            left = max((a.shape[2] - 1) * self.strides[2] + kernel.shape[1] - in_shape[1], 0) // 2
        full = full[:, top:top + in_shape[0], left:left + in_shape[1]]
        return tf.pad(full, [[0, 0], [0, in_shape[0] - full.shape[1]],
                             [0, in_shape[1] - full.shape[2]], [0, 0]])

    def offset(self, dtype):
        return cast(self.layer.bias, dtype) if self.layer.use_bias else None


class AveragePooling2D(Affine):
    def __init__(self, layer):
        super().__init__(layer.name)
        self.ksize = [1, *layer.pool_size, 1]
        self.strides = [1, *layer.strides, 1]
        self.padding = layer.padding.upper()

    def apply(self, x, dtype):
        return tf.nn.avg_pool2d(x, self.ksize, self.strides, self.padding)

    apply_abs = apply  # non-negative weights

    def transpose(self, a, in_shape, dtype):
        return tf.raw_ops.AvgPoolGrad(orig_input_shape=tf.stack([tf.shape(a)[0], *in_shape]),
                                      grad=a, ksize=self.ksize, strides=self.strides,
                                      padding=self.padding)


class GlobalAveragePooling2D(Affine):
    def __init__(self, layer):
        super().__init__(layer.name)
        self.keepdims = bool(layer.keepdims)

    def apply(self, x, dtype):
        return tf.reduce_mean(x, axis=[1, 2], keepdims=self.keepdims)

    apply_abs = apply

    def transpose(self, a, in_shape, dtype):
        h, w = in_shape[0], in_shape[1]
        a = a if self.keepdims else a[:, None, None, :]
        return tf.broadcast_to(a / (h * w), [tf.shape(a)[0], *in_shape])


class Elementwise(Affine):
    """``f(x) = s * x + t`` with ``s``, ``t`` broadcastable to one example (BatchNormalization at
    inference, Rescaling, Normalization). ``coefficients(dtype, rank) -> (s, t)``, ``rank`` the
    rank of one example."""

    def __init__(self, name, coefficients):
        super().__init__(name)
        self.coefficients = coefficients

    def apply(self, x, dtype):
        return x * self.coefficients(dtype, x.shape.rank - 1)[0]

    def apply_abs(self, r, dtype):
        return r * tf.abs(self.coefficients(dtype, r.shape.rank - 1)[0])

    def interval(self, bounds, dtype):
        (lo, hi), = bounds
        s, t = self.coefficients(dtype, lo.shape.rank - 1)
        mid, rad = (hi + lo) / 2, (hi - lo) / 2
        out_mid, out_rad = mid * s + t, rad * tf.abs(s)
        return out_mid - out_rad, out_mid + out_rad

    def backward(self, a, in_shapes, dtype):
        s, t = self.coefficients(dtype, len(in_shapes[0]))
        s = tf.broadcast_to(s, in_shapes[0])  # example-shaped, then broadcast over [B, S]
        shape = list(in_shapes[0])
        if t.shape.rank >= 1 and t.shape[-1] == shape[-1] and all(d == 1 for d in t.shape[:-1]):
            return [a * s], channel_dot(a, tf.reshape(t, [-1]))  # per channel (batch norm)
        return [a * s], sum_trailing(a * tf.broadcast_to(t, shape))


class Reshape(Affine):
    """Flatten / Reshape: exact on intervals; the transpose reshapes back."""

    def __init__(self, name, target):
        super().__init__(name)
        self.target = list(target)

    def interval(self, bounds, dtype):
        (lo, hi), = bounds
        shape = [tf.shape(lo)[0], *self.target]
        return tf.reshape(lo, shape), tf.reshape(hi, shape)

    def apply(self, x, dtype):
        return tf.reshape(x, [tf.shape(x)[0], *self.target])

    def transpose(self, a, in_shape, dtype):
        return tf.reshape(a, [tf.shape(a)[0], *in_shape])


class ZeroPadding2D(Affine):
    """Zero rows and columns around an NHWC image: ``padding`` ``((top, bottom), (left,
    right))``; the transpose crops them off."""

    def __init__(self, name, padding):
        super().__init__(name)
        (self.top, self.bottom), (self.left, self.right) = (tuple(int(p) for p in side)
                                                            for side in padding)

    def apply(self, x, dtype):
        return tf.pad(x, [[0, 0], [self.top, self.bottom], [self.left, self.right], [0, 0]])

    apply_abs = apply

    def transpose(self, a, in_shape, dtype):
        return a[:, self.top:self.top + in_shape[0], self.left:self.left + in_shape[1]]


class Identity(Affine):
    def interval(self, bounds, dtype):
        return bounds[0]

    def apply(self, x, dtype):
        return x

    def backward(self, a, in_shapes, dtype):
        return [a], None


class Add(Rule):
    """The sum of several inputs of one shape (a residual connection)."""

    def __init__(self, name, num_inputs):
        super().__init__(name)
        self.num_inputs = num_inputs

    def interval(self, bounds, dtype):
        shapes = {tuple(lo.shape[1:]) for lo, _ in bounds}
        if len(shapes) != 1:
            raise ValueError(f"layer {self.name!r} (Add) adds tensors of different shapes "
                             f"{sorted(shapes)}; broadcasting adds are not supported by the bounds")
        return tf.add_n([lo for lo, _ in bounds]), tf.add_n([hi for _, hi in bounds])

    def backward(self, a, in_shapes, dtype):
        return [a] * self.num_inputs, None
