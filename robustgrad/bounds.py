"""Bounds of a Keras model's outputs over a set of inputs: IBP, CROWN and CROWN-IBP.

Bound propagation is the core's third way through a model, beside ``grad``/``vjp`` and ``jvp``:

- ``"ibp"`` -- interval bound propagation (Gowal et al. 2018, "On the Effectiveness of Interval
  Bound Propagation for Training Verifiably Robust Models"): a forward pass over boxes.
- ``"crown"`` -- CROWN (Zhang et al. 2018, "Efficient Neural Network Robustness Certification with
  General Activation Functions"): a backward pass of linear bounds through the layers (a VJP of
  linear relaxations), with the adaptive lower slope for unstable ReLUs; the pre-activation bounds
  of every ReLU are computed by CROWN too (the definition of auto_LiRPA's method ``"CROWN"``),
  intersected with IBP's (both are sound), and only for the neurons IBP cannot prove stable (a
  stable ReLU's relaxation is exact whatever its bounds).
- ``"crown-ibp"`` -- CROWN-IBP (Zhang et al. 2020, "Towards Stable and Efficient Training of
  Verifiably Robust Neural Networks"): IBP for the intermediate bounds, CROWN for the last layer.

A verification specification ``C`` (``[B, S, num_outputs]``) asks for bounds of ``C @ outputs``;
:func:`margin_spec` builds the usual one (``z_y - z_j`` for every ``j != y``). ``C`` is merged into
the model's last linear layers before bounding, which is tighter than bounding the logits and
subtracting (Gowal et al. 2018, section 3).

Layers are handled by a table (layer type -> interval rule and linear relaxation): Dense, Conv2D,
ReLU and the ``activation=`` of Dense/Conv2D (``relu``/``linear``), Flatten, Reshape,
AveragePooling2D, GlobalAveragePooling2D, BatchNormalization (inference), Add (layer or ``x + y``),
Dropout-like layers (identity at inference), Rescaling, Normalization, Identity, InputLayer, and
nested Sequential/functional models. Any other layer is a ``ValueError`` that names it: never a
silent identity.

>>> import keras, numpy as np
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> model.layers[0].set_weights([np.array([[1.0], [-2.0]], "float32"), np.zeros(1, "float32")])
>>> lb, ub = compute_bounds(model, [[0.0, 0.0]], [[1.0, 1.0]])
>>> lb.numpy().tolist(), ub.numpy().tolist()   # x1 - 2 x2 over the unit square
([[-2.0]], [[1.0]])
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad._checks import ArgumentTypeError, choice, nonnegative, norm_name, positive_int

__all__ = ["METHODS", "BoundedModel", "compute_ball_bounds", "compute_bounds", "margin_spec"]

METHODS = ("ibp", "crown", "crown-ibp")

# Largest number of elements one linear-coefficient tensor [B, S, *shape] may hold before the
# specification rows of an intermediate layer are processed in chunks (64 MB in float32).
_COEFFICIENT_BUDGET = 2 ** 24
# Fewest identity rows per chunk of an intermediate layer's CROWN pass (a layer of n elements is
# done in chunks of max(_MIN_ROWS, n / 8) rows, so that mostly-stable layers cost a fraction).
_MIN_ROWS = 16


# ----------------------------------------------------------------------------------------------
# The per-layer rules. A rule is linear (an affine map; IBP by centre/radius, CROWN by the
# transposed map) or the ReLU (a linear relaxation from its input's bounds).
# ----------------------------------------------------------------------------------------------

def _w(v, dtype):
    return tf.cast(tf.convert_to_tensor(v), dtype)


def _sum_trailing(t):
    """Sum of ``t`` [B, S, ...] over every axis after the first two -> [B, S]."""
    return tf.reduce_sum(t, axis=list(range(2, t.shape.rank))) if t.shape.rank > 2 else t


def _merge_batch_spec(a):
    """[B, S, *shape] -> [B*S, *shape] (static B and S)."""
    return tf.reshape(a, [-1, *a.shape[2:]])


class _Rule:
    linear = True
    num_inputs = 1

    def __init__(self, name: str) -> None:
        self.name = name


class _Affine(_Rule):
    """A single-input affine map ``f(x) = L x + c``. Subclasses give ``apply`` (L x),
    ``apply_abs`` (|L| r), ``transpose`` (L^T a, a: [N, *out] -> [N, *in]) and ``offset`` (c,
    broadcastable to [B, *out], or None)."""

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
        at = tf.reshape(at, [a.shape[0], a.shape[1], *in_shapes[0]])
        c = self.offset(dtype)
        bias = None if c is None else _sum_trailing(a * c)  # c broadcasts over *out
        return [at], bias


class _Dense(_Affine):
    def __init__(self, layer):
        super().__init__(layer.name)
        self.layer = layer

    def apply(self, x, dtype):
        return tf.tensordot(x, _w(self.layer.kernel, dtype), [[x.shape.rank - 1], [0]])

    def apply_abs(self, r, dtype):
        return tf.tensordot(r, tf.abs(_w(self.layer.kernel, dtype)), [[r.shape.rank - 1], [0]])

    def transpose(self, a, in_shape, dtype):
        return tf.tensordot(a, _w(self.layer.kernel, dtype), [[a.shape.rank - 1], [1]])

    def offset(self, dtype):
        return _w(self.layer.bias, dtype) if self.layer.use_bias else None


class _Conv2D(_Affine):
    def __init__(self, layer):
        super().__init__(layer.name)
        self.layer = layer
        self.strides = [1, *layer.strides, 1]
        self.padding = layer.padding.upper()

    def _conv(self, x, kernel):
        return tf.nn.conv2d(x, kernel, self.strides, self.padding)

    def apply(self, x, dtype):
        return self._conv(x, _w(self.layer.kernel, dtype))

    def apply_abs(self, r, dtype):
        return self._conv(r, tf.abs(_w(self.layer.kernel, dtype)))

    def transpose(self, a, in_shape, dtype):
        out_shape = tf.stack([tf.shape(a)[0], *in_shape])
        return tf.nn.conv2d_transpose(a, _w(self.layer.kernel, dtype), out_shape, self.strides,
                                      self.padding)

    def offset(self, dtype):
        return _w(self.layer.bias, dtype) if self.layer.use_bias else None


class _AveragePooling2D(_Affine):
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


class _GlobalAveragePooling2D(_Affine):
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


class _Elementwise(_Affine):
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

    def offset(self, dtype):  # not used: interval and backward below pass the rank
        raise NotImplementedError

    def interval(self, bounds, dtype):
        (lo, hi), = bounds
        s, t = self.coefficients(dtype, lo.shape.rank - 1)
        mid, rad = (hi + lo) / 2, (hi - lo) / 2
        out_mid, out_rad = mid * s + t, rad * tf.abs(s)
        return out_mid - out_rad, out_mid + out_rad

    def backward(self, a, in_shapes, dtype):
        s, t = self.coefficients(dtype, len(in_shapes[0]))
        s = tf.broadcast_to(s, in_shapes[0])  # example-shaped, then broadcast over [B, S]
        t = tf.broadcast_to(t, in_shapes[0])
        return [a * s], _sum_trailing(a * t)


class _Reshape(_Affine):
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


class _Identity(_Affine):
    def interval(self, bounds, dtype):
        return bounds[0]

    def apply(self, x, dtype):
        return x

    def backward(self, a, in_shapes, dtype):
        return [a], None


class _Add(_Rule):
    """The sum of several inputs of one shape (a residual connection)."""

    def __init__(self, name, num_inputs):
        super().__init__(name)
        self.num_inputs = num_inputs

    def apply_inputs(self, xs):
        return tf.add_n(list(xs))

    def interval(self, bounds, dtype):
        shapes = {tuple(lo.shape[1:]) for lo, _ in bounds}
        if len(shapes) != 1:
            raise ValueError(f"layer {self.name!r} (Add) adds tensors of different shapes "
                             f"{sorted(shapes)}; broadcasting adds are not supported by the bounds")
        return tf.add_n([lo for lo, _ in bounds]), tf.add_n([hi for _, hi in bounds])

    def backward(self, a, in_shapes, dtype):
        return [a] * self.num_inputs, None


class _ReLU(_Rule):
    """The ReLU's linear relaxation from its input's bounds ``l <= z <= u``: the upper line through
    ``(l, 0)`` and ``(u, u)``; the lower line ``alpha * z`` with CROWN's adaptive slope
    ``alpha = 1 if u > -l else 0`` (Zhang et al. 2018); exact where the neuron is stable."""

    linear = False

    @staticmethod
    def relaxation(lo, hi):
        unstable = (lo < 0) & (hi > 0)
        active = lo >= 0
        one, zero = tf.ones_like(lo), tf.zeros_like(lo)
        width = tf.where(unstable, hi - lo, one)
        up_slope = tf.where(unstable, hi / width, tf.where(active, one, zero))
        up_intercept = tf.where(unstable, -lo * hi / width, zero)
        low_slope = tf.where(unstable, tf.where(hi > -lo, one, zero), tf.where(active, one, zero))
        return low_slope, up_slope, up_intercept

    def interval(self, bounds, dtype):
        (lo, hi), = bounds
        return tf.nn.relu(lo), tf.nn.relu(hi)

    def backward_relaxed(self, a_lo, a_hi, pre_bounds):
        low_slope, up_slope, up_intercept = (tf.expand_dims(t, 1)
                                             for t in self.relaxation(*pre_bounds))
        pos_lo, neg_lo = tf.nn.relu(a_lo), tf.minimum(a_lo, 0)
        pos_hi, neg_hi = tf.nn.relu(a_hi), tf.minimum(a_hi, 0)
        new_lo = pos_lo * low_slope + neg_lo * up_slope
        new_hi = pos_hi * up_slope + neg_hi * low_slope
        return (new_lo, new_hi, _sum_trailing(neg_lo * up_intercept),
                _sum_trailing(pos_hi * up_intercept))


# ----------------------------------------------------------------------------------------------
# The table: Keras layer type -> rules. Exact types (a subclass may change `call`).
# ----------------------------------------------------------------------------------------------

_SOFTMAX_MESSAGE = ("{what} outputs probabilities (softmax): bounds of a softmax are not what a "
                    "certificate needs. Bound the logits: build the model without the final softmax")


def _activation_rules(layer, activation):
    name = getattr(activation, "__name__", str(activation))
    if name == "linear":
        return []
    if name == "relu":
        return [_ReLU(f"{layer.name}/relu")]
    if name in ("softmax", "log_softmax"):
        raise ValueError(_SOFTMAX_MESSAGE.format(
            what=f"layer {layer.name!r} ({type(layer).__name__}, activation={name!r})"))
    raise ValueError(f"layer {layer.name!r} ({type(layer).__name__}) has activation {name!r}; "
                     f"the bounds support activation='relu' or 'linear' (put other activations in "
                     f"a supported layer, or bound the model up to that layer)")


def _dense_rules(layer):
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        raise ValueError(f"layer {layer.name!r} (Dense) is LoRA-enabled or quantized; the bounds "
                         f"support plain Dense layers")
    return [_Dense(layer), *_activation_rules(layer, layer.activation)]


def _conv2d_rules(layer):
    what = f"layer {layer.name!r} (Conv2D)"
    if layer.data_format != "channels_last":
        raise ValueError(f"{what} has data_format={layer.data_format!r}; the bounds support "
                         f"'channels_last'")
    if tuple(layer.dilation_rate) != (1, 1) or layer.groups != 1:
        raise ValueError(f"{what} has dilation_rate={layer.dilation_rate} and groups="
                         f"{layer.groups}; the bounds support dilation 1 and groups 1")
    if layer.padding not in ("valid", "same"):
        raise ValueError(f"{what} has padding={layer.padding!r}; supported: 'valid', 'same'")
    return [_Conv2D(layer), *_activation_rules(layer, layer.activation)]


def _pooling_rules(layer):
    if layer.data_format != "channels_last":
        raise ValueError(f"layer {layer.name!r} ({type(layer).__name__}) has data_format="
                         f"{layer.data_format!r}; the bounds support 'channels_last'")
    if isinstance(layer, _keras().layers.GlobalAveragePooling2D):
        return [_GlobalAveragePooling2D(layer)]
    return [_AveragePooling2D(layer)]


def _relu_layer_rules(layer):
    if layer.max_value is not None or float(layer.negative_slope) != 0 or float(layer.threshold) != 0:
        raise ValueError(f"layer {layer.name!r} (ReLU) has max_value={layer.max_value}, "
                         f"negative_slope={layer.negative_slope}, threshold={layer.threshold}; the "
                         f"bounds support the plain ReLU only")
    return [_ReLU(layer.name)]


def _batch_norm_rules(layer):
    def coefficients(dtype, rank):
        mean, var = _w(layer.moving_mean, dtype), _w(layer.moving_variance, dtype)
        s = tf.math.rsqrt(var + tf.cast(layer.epsilon, dtype))
        if layer.scale:
            s = s * _w(layer.gamma, dtype)
        t = -mean * s
        if layer.center:
            t = t + _w(layer.beta, dtype)
        axis = layer.axis if layer.axis >= 0 else rank + 1 + layer.axis
        if axis == 0 or axis > rank:
            raise ValueError(f"layer {layer.name!r} (BatchNormalization) has axis={layer.axis}, "
                             f"which is not a feature axis of a rank-{rank} example")
        shape = [1] * rank
        shape[axis - 1] = -1
        return tf.reshape(s, shape), tf.reshape(t, shape)

    return [_Elementwise(layer.name, coefficients)]


def _rescaling_rules(layer):
    def coefficients(dtype, rank):
        return _w(layer.scale, dtype), _w(layer.offset, dtype)

    return [_Elementwise(layer.name, coefficients)]


def _normalization_rules(layer):
    if layer.mean is None:
        raise ValueError(f"layer {layer.name!r} (Normalization) is not built or adapted: call "
                         f"adapt() or pass mean= and variance= first")

    def coefficients(dtype, rank):
        mean = _w(layer.mean, dtype)[0]  # drop the batch axis of the broadcast shape
        std = tf.maximum(tf.sqrt(_w(layer.variance, dtype)[0]),
                         tf.cast(_keras().backend.epsilon(), dtype))
        if layer.invert:
            return std, mean
        return 1 / std, -mean / std

    return [_Elementwise(layer.name, coefficients)]


def _activation_layer_rules(layer):
    rules = _activation_rules(layer, layer.activation)
    return rules or [_Identity(layer.name)]


def _softmax_layer_rules(layer):
    raise ValueError(_SOFTMAX_MESSAGE.format(what=f"layer {layer.name!r} (Softmax)"))


def _keras():
    import keras

    return keras


_TABLE_CACHE: dict = {}


def _layer_table() -> dict:
    """Keras layer class -> function(layer) -> list of rules (built once, on first use)."""
    if _TABLE_CACHE:
        return _TABLE_CACHE
    layers = _keras().layers
    identity = lambda layer: [_Identity(layer.name)]
    table = {
        layers.Dense: _dense_rules,
        layers.Conv2D: _conv2d_rules,
        layers.ReLU: _relu_layer_rules,
        layers.Activation: _activation_layer_rules,
        layers.Softmax: _softmax_layer_rules,
        layers.Flatten: lambda layer: [_Reshape(layer.name, [-1])],
        layers.Reshape: lambda layer: [_Reshape(layer.name, layer.target_shape)],
        layers.AveragePooling2D: _pooling_rules,
        layers.GlobalAveragePooling2D: _pooling_rules,
        layers.BatchNormalization: _batch_norm_rules,
        layers.Rescaling: _rescaling_rules,
        layers.Normalization: _normalization_rules,
        layers.Add: lambda layer: [],  # resolved with its number of inputs in _Graph.add_layer
    }
    for name in ("Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D",
                 "GaussianNoise", "GaussianDropout", "AlphaDropout", "ActivityRegularization",
                 "Identity", "InputLayer"):
        if hasattr(layers, name):
            table[getattr(layers, name)] = identity
    _TABLE_CACHE.update(table)
    return _TABLE_CACHE


class _Ref:
    """A node of the bound graph standing in for a tensor while Keras walks its functional graph."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class _Graph:
    """The model as nodes in topological order: node 0 is the input; every node is
    ``(rule, input node indices)``."""

    def __init__(self, model) -> None:
        self.rules: list[_Rule | None] = [None]
        self.inputs: list[tuple[int, ...]] = [()]
        self.output = self._trace(model, _Ref(0)).index

    def _append(self, rule, inputs) -> _Ref:
        self.rules.append(rule)
        self.inputs.append(tuple(inputs))
        return _Ref(len(self.rules) - 1)

    def _trace(self, model, ref: _Ref) -> _Ref:
        keras = _keras()
        if isinstance(model, keras.Sequential):
            for layer in model.layers:
                ref = self._call(layer, [ref])
            return ref
        if not hasattr(model, "_run_through_graph") or not hasattr(model, "_nodes_by_depth"):
            raise ValueError(f"model {getattr(model, 'name', model)!r} ({type(model).__name__}) is "
                             f"not a Keras Sequential or functional model; the bounds walk the "
                             f"layer graph, so build the model with keras.Sequential or "
                             f"keras.Model(inputs, outputs)")
        if len(model.inputs) != 1 or len(model.outputs) != 1:
            raise ValueError(f"model {model.name!r} has {len(model.inputs)} inputs and "
                             f"{len(model.outputs)} outputs; the bounds support one of each")

        def call_fn(op, *args, **kwargs):
            refs = [a for a in keras.tree.flatten((args, kwargs)) if isinstance(a, _Ref)]
            return self._call(op, refs, args=args)

        out = model._run_through_graph(ref, call_fn=call_fn)
        out = keras.tree.flatten(out)
        if len(out) != 1 or not isinstance(out[0], _Ref):
            raise ValueError(f"model {model.name!r}: expected one output tensor")
        return out[0]

    def _call(self, op, refs: Sequence[_Ref], args=()) -> _Ref:
        keras = _keras()
        kind = type(op)
        if isinstance(op, keras.Model):
            if len(refs) != 1:
                raise ValueError(f"nested model {op.name!r} takes {len(refs)} inputs; one supported")
            return self._trace(op, refs[0])
        if kind is keras.layers.Add or (kind.__name__ == "Add" and
                                        kind.__module__.startswith("keras.src.ops")):
            n_tensors = len(keras.tree.flatten(args))
            if len(refs) < 2 or n_tensors != len(refs):
                raise ValueError(f"{op.name!r} (Add) must add model tensors only (no constants)")
            return self._append(_Add(op.name, len(refs)), [r.index for r in refs])
        table = _layer_table()
        if kind not in table:
            raise ValueError(
                f"layer {op.name!r} of type {kind.__name__} is not supported by the bounds. "
                f"Supported: Dense, Conv2D, ReLU, Activation('relu'/'linear'), Flatten, Reshape, "
                f"AveragePooling2D, GlobalAveragePooling2D, BatchNormalization, Add, Dropout-like "
                f"layers, Rescaling, Normalization, Identity, nested Sequential/functional models")
        if len(refs) != 1:
            raise ValueError(f"layer {op.name!r} ({kind.__name__}) takes {len(refs)} inputs; one "
                             f"expected")
        ref = refs[0]
        for rule in table[kind](op):
            ref = self._append(rule, [ref.index])
        return ref


# ----------------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------------

def _concretize(a_lo, a_hi, lo, hi, ball=None):
    """Bounds over ``lo <= x <= hi`` (``x`` [B, *shape]) of the linear forms with coefficients
    ``a_lo``/``a_hi`` ([B, S, *shape]), without the biases -> ([B, S], [B, S]). With ``ball =
    (centre, radius)`` also over the L2 ball (dual norm), keeping the tighter of the two."""
    lo, hi = tf.expand_dims(lo, 1), tf.expand_dims(hi, 1)
    low = _sum_trailing(tf.nn.relu(a_lo) * lo + tf.minimum(a_lo, 0) * hi)
    high = _sum_trailing(tf.nn.relu(a_hi) * hi + tf.minimum(a_hi, 0) * lo)
    if ball is not None:
        centre, radius = ball
        centre = tf.expand_dims(centre, 1)
        low = tf.maximum(low, _sum_trailing(a_lo * centre) - radius * tf.norm(
            tf.reshape(a_lo, [a_lo.shape[0], a_lo.shape[1], -1]), axis=-1))
        high = tf.minimum(high, _sum_trailing(a_hi * centre) + radius * tf.norm(
            tf.reshape(a_hi, [a_hi.shape[0], a_hi.shape[1], -1]), axis=-1))
    return low, high


class BoundedModel:
    """A Keras model read as a bound graph; :meth:`bounds` runs compiled.

    The model is never modified, and its weights are read at every call (a model that trains
    between calls is bounded with its current weights). :func:`compute_bounds` keeps one per model.

    Args:
      model: a Keras Sequential or functional model with one input and one output, outputting
        logits (a softmax output is refused).
      jit_compile: compile with XLA (off by default: on CPU plain graph mode is usually faster).

    Raises:
      ValueError: a layer the bounds do not support (named), a softmax output.
    """

    def __init__(self, model: Any, jit_compile: bool = False) -> None:
        self._graph = _Graph(model)
        self.name = getattr(model, "name", "model")
        self._fn = tf.function(self._bounds, jit_compile=bool(jit_compile), autograph=False)
        self._output_shapes: dict = {}

    # -- the compiled function -------------------------------------------------------------
    def _bounds(self, lower, upper, spec, ball, method):
        dtype = lower.dtype
        g = self._graph
        boxes = self._interval_pass(lower, upper, dtype)
        shapes = [tuple(lo.shape[1:]) for lo, _ in boxes]
        out_shape = shapes[g.output]
        n_out = math.prod(out_shape)
        batch = lower.shape[0]
        if method == "ibp":
            if spec is None:
                return boxes[g.output]
            stop = self._linear_tail_start(g.output)
            return self._backward(g.output, spec, {}, boxes, shapes, stop=stop, ball=ball,
                                  dtype=dtype)
        pre: dict[int, tuple] = {}
        for i, rule in enumerate(g.rules):
            if isinstance(rule, _ReLU):
                p = g.inputs[i][0]
                if p in pre:
                    continue
                if method == "crown-ibp" or p == 0:
                    pre[p] = boxes[p]
                else:
                    pre[p] = self._node_bounds(p, pre, boxes, shapes, ball, dtype)
        if spec is None:
            eye = tf.eye(n_out, dtype=dtype)
            spec_full = tf.broadcast_to(tf.reshape(eye, [1, n_out, *out_shape]),
                                        [batch, n_out, *out_shape])
            lo, hi = self._backward(g.output, spec_full, pre, boxes, shapes, stop=0, ball=ball,
                                    dtype=dtype)
            return tf.reshape(lo, [batch, *out_shape]), tf.reshape(hi, [batch, *out_shape])
        return self._backward(g.output, spec, pre, boxes, shapes, stop=0, ball=ball, dtype=dtype)

    def _interval_pass(self, lower, upper, dtype):
        g = self._graph
        boxes = [(lower, upper)]
        for rule, ins in zip(g.rules[1:], g.inputs[1:]):
            boxes.append(rule.interval([boxes[j] for j in ins], dtype))
        return boxes

    def _linear_tail_start(self, node: int) -> int:
        """The first node of the chain of single-input linear nodes that ends at ``node``: IBP
        merges the spec into that tail (the model's last linear layers)."""
        g = self._graph
        while node != 0 and g.rules[node].linear and g.rules[node].num_inputs == 1:
            node = g.inputs[node][0]
        return node

    def _node_bounds(self, node, pre, boxes, shapes, ball, dtype):
        """CROWN bounds of the elements of ``node``, intersected with IBP's (both are sound).

        Only the elements IBP cannot prove stable get a CROWN pass (a stable ReLU's relaxation is
        exact whatever its bounds): per example, the unstable elements first, as identity rows
        in chunks of ``rows`` inside one ``tf.while_loop`` that stops after the last example's
        last unstable element; no chunk's coefficients exceed ``_COEFFICIENT_BUDGET``."""
        shape = shapes[node]
        n = math.prod(shape)
        batch = boxes[0][0].shape[0]
        widest = max(math.prod(shapes[i]) for i in range(node + 1))
        budget_rows = max(1, _COEFFICIENT_BUDGET // max(1, batch * widest))
        rows = max(1, min(n, budget_rows, max(_MIN_ROWS, -(-n // 8))))
        ibp_lo, ibp_hi = (tf.reshape(t, [batch, n]) for t in boxes[node])
        unstable = (ibp_lo < 0) & (ibp_hi > 0)
        order = tf.argsort(tf.cast(~unstable, tf.int32), axis=1, stable=True)  # unstable first
        needed = tf.reduce_max(tf.reduce_sum(tf.cast(unstable, tf.int32), axis=1))
        chunks = (needed + rows - 1) // rows
        n_pad = -(-n // rows) * rows
        order = tf.pad(order, [[0, 0], [0, n_pad - n]], constant_values=n)  # n: a spare column
        rows_of = tf.broadcast_to(tf.range(batch)[:, None], [batch, rows])

        def body(k, lo_acc, hi_acc):
            idx = tf.slice(order, tf.stack([0, k * rows]), [batch, rows])
            spec = tf.reshape(tf.one_hot(idx, n, dtype=dtype), [batch, rows, *shape])
            lo_k, hi_k = self._backward(node, spec, pre, boxes, shapes, stop=0, ball=ball,
                                        dtype=dtype)
            where = tf.stack([rows_of, idx], axis=-1)
            return (k + 1, tf.tensor_scatter_nd_update(lo_acc, where, lo_k),
                    tf.tensor_scatter_nd_update(hi_acc, where, hi_k))

        spare = tf.zeros([batch, 1], dtype)
        init = [tf.constant(0), tf.concat([ibp_lo, spare], 1), tf.concat([ibp_hi, spare], 1)]
        _, lo, hi = tf.while_loop(lambda k, *_: k < chunks, body, init)
        lo = tf.maximum(lo[:, :n], ibp_lo)
        hi = tf.minimum(hi[:, :n], ibp_hi)
        return tf.reshape(lo, [batch, *shape]), tf.reshape(hi, [batch, *shape])

    def _backward(self, target, spec, pre, boxes, shapes, *, stop, ball, dtype):
        """Bounds of ``spec @ value(target)`` (spec [B, S, *shape(target)]) -> ([B, S], [B, S]):
        linear bounds propagated back to node ``stop`` and concretised over its box (the input
        set when ``stop`` is 0)."""
        g = self._graph
        coeffs = {target: (spec, spec)}
        batch, rows = spec.shape[0], spec.shape[1]
        bias_lo = tf.zeros([batch, rows], dtype)
        bias_hi = tf.zeros([batch, rows], dtype)
        for i in range(target, stop, -1):
            if i not in coeffs:
                continue
            a_lo, a_hi = coeffs.pop(i)
            rule, ins = g.rules[i], g.inputs[i]
            if isinstance(rule, _ReLU):
                a_lo, a_hi, d_lo, d_hi = rule.backward_relaxed(a_lo, a_hi, pre[ins[0]])
                new = [(a_lo, a_hi)]
            else:
                both = tf.concat([a_lo, a_hi], axis=1)
                outs, bias = rule.backward(both, [shapes[j] for j in ins], dtype)
                new = [(o[:, :rows], o[:, rows:]) for o in outs]
                d_lo, d_hi = (None, None) if bias is None else (bias[:, :rows], bias[:, rows:])
            if d_lo is not None:
                bias_lo, bias_hi = bias_lo + d_lo, bias_hi + d_hi
            for j, (n_lo, n_hi) in zip(ins, new):
                if j in coeffs:
                    o_lo, o_hi = coeffs[j]
                    n_lo, n_hi = o_lo + n_lo, o_hi + n_hi
                coeffs[j] = (n_lo, n_hi)
        if stop not in coeffs:  # the target does not depend on the input
            return bias_lo, bias_hi
        a_lo, a_hi = coeffs[stop]
        lo, hi = boxes[stop]
        low, high = _concretize(a_lo, a_hi, lo, hi, ball if stop == 0 else None)
        return low + bias_lo, high + bias_hi

    # -- the public, validated call --------------------------------------------------------
    def bounds(self, lower: Any, upper: Any, method: str = "crown", C: Any = None, *,  # noqa: N803
               batch_size: int | None = 256, _ball: tuple | None = None):
        """Element-wise bounds of the outputs over ``lower <= x <= upper``; see
        :func:`compute_bounds`."""
        method = choice(method.lower() if isinstance(method, str) else method, "method", METHODS)
        lower, upper = _check_box(lower, upper)
        batch_size = positive_int(batch_size, "batch_size", allow_none=True)
        n = int(lower.shape[0])
        spec = None if C is None else self._check_spec(C, lower)
        chunk = n if batch_size is None else min(batch_size, n)
        los, his = [], []
        for start in range(0, n, chunk):
            sl = slice(start, start + chunk)
            ball = None if _ball is None else (_ball[0][sl], _ball[1])
            lo, hi = self._fn(lower[sl], upper[sl], None if spec is None else spec[sl], ball,
                              method)
            los.append(lo)
            his.append(hi)
        if len(los) == 1:
            return los[0], his[0]
        return tf.concat(los, 0), tf.concat(his, 0)

    def output_shape(self, lower: Any) -> tuple:
        """The per-example output shape for inputs shaped like ``lower`` [B, ...]."""
        one = tf.convert_to_tensor(lower)[:1]
        key = (tuple(one.shape[1:]), one.dtype)
        if key not in self._output_shapes:
            boxes = self._interval_pass(one, one, one.dtype)
            self._output_shapes[key] = tuple(boxes[self._graph.output][0].shape[1:])
        return self._output_shapes[key]

    def _check_spec(self, spec, lower):
        c = tf.convert_to_tensor(spec)
        if not (c.dtype.is_floating or c.dtype.is_integer):
            raise ArgumentTypeError(f"C must be a float tensor [B, S, num_outputs], got dtype "
                                    f"{c.dtype.name}")
        c = tf.cast(c, lower.dtype)
        out_shape = self.output_shape(lower)
        n_out = math.prod(out_shape)
        if c.shape.rank != 3 or c.shape[0] != lower.shape[0] or c.shape[2] != n_out or \
                c.shape[1] == 0:
            raise ValueError(f"C must have shape [B, S, num_outputs] = [{lower.shape[0]}, S >= 1, "
                             f"{n_out}] for this model and batch, got {list(c.shape)}")
        if hasattr(c, "numpy") and not np.all(np.isfinite(c.numpy())):
            raise ValueError("C contains NaN or Inf values")
        return tf.reshape(c, [c.shape[0], c.shape[1], *out_shape])


def _check_box(lower, upper):
    lo, hi = tf.convert_to_tensor(lower), tf.convert_to_tensor(upper)
    for name, t in (("lower", lo), ("upper", hi)):
        if t.dtype not in (tf.float32, tf.float64):
            if t.dtype.is_floating or t.dtype.is_integer:
                t = tf.cast(t, tf.float32)
            else:
                raise ArgumentTypeError(f"{name} must be a float32 or float64 tensor [B, ...], "
                                        f"got dtype {t.dtype.name}")
        if t.shape.rank is None or t.shape.rank < 2 or t.shape[0] == 0:
            raise ValueError(f"{name} must be a non-empty batch [B, ...] (rank >= 2), got shape "
                             f"{list(t.shape)}")
        if hasattr(t, "numpy") and not np.all(np.isfinite(t.numpy())):
            raise ValueError(f"{name} contains NaN or Inf values")
        if name == "lower":
            lo = t
        else:
            hi = t
    if lo.shape != hi.shape:
        raise ValueError(f"lower and upper must have the same shape, got {list(lo.shape)} and "
                         f"{list(hi.shape)}")
    if lo.dtype != hi.dtype:
        raise ValueError(f"lower and upper must have the same dtype, got {lo.dtype.name} and "
                         f"{hi.dtype.name}")
    if not (hasattr(lo, "numpy") and hasattr(hi, "numpy")):  # symbolic: checked by the caller
        return lo, hi
    excess = lo.numpy() - hi.numpy()
    bad = int(np.sum(excess > 0))
    if bad:
        gap = float(excess.max())
        raise ValueError(f"lower must be <= upper everywhere; {bad} entries have lower > upper "
                         f"(largest excess {gap:.3g})")
    return lo, hi


_BOUNDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _bounded(model) -> BoundedModel:
    if isinstance(model, BoundedModel):
        return model
    try:
        cached = _BOUNDED.get(model)
    except TypeError:
        cached = None
    if cached is None:
        cached = BoundedModel(model)
        try:
            _BOUNDED[model] = cached
        except TypeError:
            pass
    return cached


def compute_bounds(model: Any, lower: Any, upper: Any, method: str = "crown", C: Any = None, *,  # noqa: N803
                   batch_size: int | None = 256) -> tuple[tf.Tensor, tf.Tensor]:
    """Bounds of a model's outputs over the box ``lower <= x <= upper``.

    Guaranteed for every ``x`` in the box (up to floating-point rounding): ``lb <= model(x) <= ub``
    element-wise, or ``lb <= C @ model(x) <= ub`` with a specification ``C``.

    Args:
      model: a Keras Sequential or functional model (or a :class:`BoundedModel`) that outputs
        logits; see the module docstring for the supported layers. Never modified.
      lower, upper: the box, float32 or float64 ``[B, *input_shape]``, ``lower <= upper``.
      method: ``"crown"`` (Zhang et al. 2018; the tightest, the slowest), ``"ibp"`` (Gowal et al.
        2018; one forward pass over boxes) or ``"crown-ibp"`` (Zhang et al. 2020).
      C: optional specification ``[B, S, num_outputs]`` (outputs flattened): bound ``C @
        outputs``, ``C`` merged into the last linear layers. :func:`margin_spec` builds margins.
      batch_size: examples per compiled call (``None``: all at once). CROWN's intermediate bounds
        also split their rows so that no coefficient tensor exceeds ~64 MB.

    Returns:
      ``(lb, ub)`` in the dtype of ``lower``: shape ``[B, *output_shape]``, or ``[B, S]`` with ``C``.

    Raises:
      ValueError: an unsupported layer (named) or softmax output, ``lower > upper`` anywhere,
        mismatched shapes, an unknown method, ``C`` of the wrong shape.

    Example:
      >>> import keras, numpy as np
      >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2, activation="relu"),
      ...                           keras.layers.Dense(1)])
      >>> model.layers[0].set_weights([np.array([[1.0, 1.0]], "float32"), np.zeros(2, "float32")])
      >>> model.layers[1].set_weights([np.array([[1.0], [-1.0]], "float32"), np.zeros(1, "float32")])
      >>> lb, ub = compute_bounds(model, [[1.0]], [[2.0]], method="ibp")  # relu(x) - relu(x)
      >>> lb.numpy().tolist(), ub.numpy().tolist()
      ([[-1.0]], [[1.0]])
      >>> lb, ub = compute_bounds(model, [[1.0]], [[2.0]], method="crown")  # exact here
      >>> lb.numpy().tolist(), ub.numpy().tolist()
      ([[0.0]], [[0.0]])
    """
    method = choice(method.lower() if isinstance(method, str) else method, "method", METHODS)
    return _bounded(model).bounds(lower, upper, method, C, batch_size=batch_size)


def compute_ball_bounds(model: Any, x: Any, eps: float, norm: str = "linf", method: str = "crown",
                        C: Any = None, *, clip_min: Any = None, clip_max: Any = None,  # noqa: N803
                        batch_size: int | None = 256) -> tuple[tf.Tensor, tf.Tensor]:
    """:func:`compute_bounds` over the ball ``||x' - x|| <= eps`` intersected with
    ``[clip_min, clip_max]``.

    For ``norm="linf"`` the set is a box. For ``norm="l2"`` IBP bounds the ball's bounding box;
    CROWN's linear bounds are concretised over the ball with the dual norm (``a.x - eps ||a||_2``)
    and over the clipped box, and the tighter of the two is kept (both are sound).

    Args:
      x: centres ``[B, *input_shape]``, float32/float64, inside ``[clip_min, clip_max]``.
      eps: radius >= 0, in the units of ``x``.
      norm: ``"linf"`` or ``"l2"``.
      clip_min, clip_max: the input domain (scalars or per-feature; ``None`` unbounded).
      model, method, C, batch_size: as in :func:`compute_bounds`.

    Example:
      >>> import keras, numpy as np
      >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
      >>> model.layers[0].set_weights([np.array([[3.0], [4.0]], "float32")])
      >>> lb, ub = compute_ball_bounds(model, [[0.0, 0.0]], 1.0, norm="l2")  # +-||w||_2
      >>> lb.numpy().tolist(), ub.numpy().tolist()
      ([[-5.0]], [[5.0]])
    """
    eps = nonnegative(eps, "eps")
    norm = norm_name(norm)
    if norm not in ("linf", "l2"):
        raise ValueError(f"norm must be 'linf' or 'l2' for bounds, got {norm!r}")
    method = choice(method.lower() if isinstance(method, str) else method, "method", METHODS)
    xt = tf.convert_to_tensor(x)
    if not xt.dtype.is_floating:
        xt = tf.cast(xt, tf.float32)
    if xt.dtype not in (tf.float32, tf.float64):
        raise ArgumentTypeError(f"x must be float32 or float64, got {xt.dtype.name}")
    lo_clip = _clip_tensor(clip_min, xt, "clip_min", -np.inf)
    hi_clip = _clip_tensor(clip_max, xt, "clip_max", np.inf)
    if not bool(tf.reduce_all(lo_clip <= hi_clip)):
        raise ValueError("clip_min must be <= clip_max everywhere")
    if not bool(tf.reduce_all((xt >= lo_clip) & (xt <= hi_clip))):
        raise ValueError("x has values outside [clip_min, clip_max]; pass the bounds of your input "
                         "domain (e.g. clip_min=0.0, clip_max=1.0 for images in [0, 1])")
    e = tf.constant(eps, xt.dtype)
    lower = tf.maximum(xt - e, lo_clip)
    upper = tf.minimum(xt + e, hi_clip)
    ball = (xt, e) if norm == "l2" else None
    return _bounded(model).bounds(lower, upper, method, C, batch_size=batch_size, _ball=ball)


def _clip_tensor(v, x, name, fill):
    if v is None:
        return tf.fill(tf.shape(x), tf.constant(fill, x.dtype))
    a = np.asarray(v, dtype=x.dtype.as_numpy_dtype)
    if np.isnan(a).any():
        raise ValueError(f"{name} contains NaN")
    try:
        return tf.broadcast_to(tf.constant(a), tf.shape(x))
    except (ValueError, tf.errors.InvalidArgumentError):
        raise ValueError(f"{name} must be a scalar or broadcast to x's shape {list(x.shape)}, got "
                         f"shape {a.shape}") from None


def margin_spec(labels: Any, num_classes: int, dtype: Any = tf.float32) -> tf.Tensor:
    """The margin specification ``C`` [B, num_classes - 1, num_classes]: row ``k`` of example ``b``
    is ``e_y - e_j`` for the ``k``-th class ``j != y`` (ascending), so ``C @ logits`` holds the
    margins ``z_y - z_j``. An example is verified when every lower bound of ``C @ logits`` is > 0.

    >>> margin_spec([1], 3).numpy().tolist()
    [[[-1.0, 1.0, 0.0], [0.0, 1.0, -1.0]]]
    """
    num_classes = positive_int(num_classes, "num_classes", minimum=2)
    y = tf.convert_to_tensor(labels)
    if not y.dtype.is_integer or y.shape.rank != 1:
        raise ValueError(f"labels must be int class indices of shape [B], got dtype "
                         f"{y.dtype.name} and shape {list(y.shape)}")
    if hasattr(y, "numpy") and y.shape[0] and (int(tf.reduce_min(y)) < 0 or
                                               int(tf.reduce_max(y)) >= num_classes):
        raise ValueError(f"labels must be in [0, {num_classes}), got min {int(tf.reduce_min(y))} "
                         f"and max {int(tf.reduce_max(y))}")
    y = tf.cast(y, tf.int32)
    ks = tf.range(num_classes - 1)[None, :]
    others = ks + tf.cast(ks >= y[:, None], tf.int32)  # skip the true class
    return (tf.one_hot(y, num_classes, dtype=dtype)[:, None, :]
            - tf.one_hot(others, num_classes, dtype=dtype))
