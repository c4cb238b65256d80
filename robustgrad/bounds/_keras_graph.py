"""Keras models as bound graphs: the table of layer types and the graph walker.

The table maps a Keras layer class (exact type: a subclass may change ``call``) to a function of
the layer that returns its rules (:mod:`robustgrad.bounds._rules`,
:mod:`robustgrad.bounds._activations`); a new layer is one entry. :class:`Graph` walks a
Sequential or functional model (nested models too) into nodes in topological order. An
unsupported layer is a ``ValueError`` that names it, never a silent identity.

>>> import keras
>>> g = Graph(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="tanh")]))
>>> [type(r).__name__ for r in g.rules[1:]], g.output
(['Dense', 'Tanh'], 2)
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from . import _activations as _act
from . import _pooling as _pool
from . import _rules as _r

__all__ = ["Graph", "layer_table"]

_SOFTMAX_MESSAGE = ("{what} outputs probabilities (softmax): bounds of a softmax are not what a "
                    "certificate needs. Bound the logits: build the model without the final softmax")


def _activation_rules(layer, activation):
    name = getattr(activation, "__name__", str(activation))
    if name == "linear":
        return []
    if name in _act.ACTIVATIONS:
        return [_act.ACTIVATIONS[name](f"{layer.name}/{name}")]
    if name in ("softmax", "log_softmax"):
        raise ValueError(_SOFTMAX_MESSAGE.format(
            what=f"layer {layer.name!r} ({type(layer).__name__}, activation={name!r})"))
    raise ValueError(f"layer {layer.name!r} ({type(layer).__name__}) has activation {name!r}; "
                     f"the bounds support activation 'relu', 'tanh', 'sigmoid' or 'linear' (put "
                     f"other activations in a supported layer, or bound the model up to that "
                     f"layer)")


def _dense_rules(layer):
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        raise ValueError(f"layer {layer.name!r} (Dense) is LoRA-enabled or quantized; the bounds "
                         f"support plain Dense layers")
    dense = _r.Dense(layer.name, lambda: layer.kernel,
                     lambda: layer.bias if layer.use_bias else None)
    return [dense, *_activation_rules(layer, layer.activation)]


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
    return [_r.Conv2D(layer), *_activation_rules(layer, layer.activation)]


def _pooling_rules(layer):
    if layer.data_format != "channels_last":
        raise ValueError(f"layer {layer.name!r} ({type(layer).__name__}) has data_format="
                         f"{layer.data_format!r}; the bounds support 'channels_last'")
    if isinstance(layer, _keras().layers.GlobalAveragePooling2D):
        return [_r.GlobalAveragePooling2D(layer)]
    return [_r.AveragePooling2D(layer)]


def _max_pooling_rules(layer):
    if layer.data_format != "channels_last":
        raise ValueError(f"layer {layer.name!r} (MaxPooling2D) has data_format="
                         f"{layer.data_format!r}; the bounds support 'channels_last'")
    if layer.padding not in ("valid", "same"):
        raise ValueError(f"layer {layer.name!r} (MaxPooling2D) has padding={layer.padding!r}; "
                         f"supported: 'valid', 'same'")
    return [_pool.MaxPooling2D(layer.name, layer.pool_size, layer.strides, layer.padding)]


def _zero_padding_rules(layer):
    if layer.data_format != "channels_last":
        raise ValueError(f"layer {layer.name!r} (ZeroPadding2D) has data_format="
                         f"{layer.data_format!r}; the bounds support 'channels_last'")
    return [_r.ZeroPadding2D(layer.name, layer.padding)]


def _relu_layer_rules(layer):
    if layer.max_value is not None or float(layer.negative_slope) != 0 or float(layer.threshold) != 0:
        raise ValueError(f"layer {layer.name!r} (ReLU) has max_value={layer.max_value}, "
                         f"negative_slope={layer.negative_slope}, threshold={layer.threshold}; the "
                         f"bounds support the plain ReLU only")
    return [_act.ReLU(layer.name)]


def _batch_norm_rules(layer):
    def coefficients(dtype, rank):
        mean, var = _r.cast(layer.moving_mean, dtype), _r.cast(layer.moving_variance, dtype)
        s = tf.math.rsqrt(var + tf.cast(layer.epsilon, dtype))
        if layer.scale:
            s = s * _r.cast(layer.gamma, dtype)
        t = -mean * s
        if layer.center:
            t = t + _r.cast(layer.beta, dtype)
        axis = layer.axis if layer.axis >= 0 else rank + 1 + layer.axis
        if axis == 0 or axis > rank:
            raise ValueError(f"layer {layer.name!r} (BatchNormalization) has axis={layer.axis}, "
                             f"which is not a feature axis of a rank-{rank} example")
        shape = [1] * rank
        shape[axis - 1] = -1
        return tf.reshape(s, shape), tf.reshape(t, shape)

    return [_r.Elementwise(layer.name, coefficients)]


def _rescaling_rules(layer):
    def coefficients(dtype, rank):
        return _r.cast(layer.scale, dtype), _r.cast(layer.offset, dtype)

    return [_r.Elementwise(layer.name, coefficients)]


def _normalization_rules(layer):
    if layer.mean is None:
        raise ValueError(f"layer {layer.name!r} (Normalization) is not built or adapted: call "
                         f"adapt() or pass mean= and variance= first")

    def coefficients(dtype, rank):
        mean = _r.cast(layer.mean, dtype)[0]  # drop the batch axis of the broadcast shape
        std = tf.maximum(tf.sqrt(_r.cast(layer.variance, dtype)[0]),
                         tf.cast(_keras().backend.epsilon(), dtype))
        if layer.invert:
            return std, mean
        return 1 / std, -mean / std

    return [_r.Elementwise(layer.name, coefficients)]


def _activation_layer_rules(layer):
    rules = _activation_rules(layer, layer.activation)
    return rules or [_r.Identity(layer.name)]


def _softmax_layer_rules(layer):
    raise ValueError(_SOFTMAX_MESSAGE.format(what=f"layer {layer.name!r} (Softmax)"))


def _keras():
    import keras

    return keras


_TABLE_CACHE: dict = {}


def layer_table() -> dict:
    """Keras layer class -> function(layer) -> list of rules (built once, on first use)."""
    if _TABLE_CACHE:
        return _TABLE_CACHE
    layers = _keras().layers
    identity = lambda layer: [_r.Identity(layer.name)]
    table = {
        layers.Dense: _dense_rules,
        layers.Conv2D: _conv2d_rules,
        layers.ReLU: _relu_layer_rules,
        layers.Activation: _activation_layer_rules,
        layers.Softmax: _softmax_layer_rules,
        layers.Flatten: lambda layer: [_r.Reshape(layer.name, [-1])],
        layers.Reshape: lambda layer: [_r.Reshape(layer.name, layer.target_shape)],
        layers.AveragePooling2D: _pooling_rules,
        layers.GlobalAveragePooling2D: _pooling_rules,
        layers.MaxPooling2D: _max_pooling_rules,
        layers.ZeroPadding2D: _zero_padding_rules,
        layers.BatchNormalization: _batch_norm_rules,
        layers.Rescaling: _rescaling_rules,
        layers.Normalization: _normalization_rules,
        layers.Add: lambda layer: [],  # resolved with its number of inputs in Graph._call
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


class Graph:
    """The model as nodes in topological order: node 0 is the input; every node is
    ``(rule, input node indices)``."""

    def __init__(self, model) -> None:
        self.rules: list[_r.Rule | None] = [None]
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
            return self._append(_r.Add(op.name, len(refs)), [r.index for r in refs])
        table = layer_table()
        if kind not in table:
            raise ValueError(
                f"layer {op.name!r} of type {kind.__name__} is not supported by the bounds. "
                f"Supported: Dense, Conv2D, ReLU, Activation('relu'/'tanh'/'sigmoid'/'linear'), "
                f"Flatten, Reshape, AveragePooling2D, GlobalAveragePooling2D, MaxPooling2D, "
                f"ZeroPadding2D, BatchNormalization, "
                f"Add, Dropout-like layers, Rescaling, Normalization, Identity, nested "
                f"Sequential/functional models")
        if len(refs) != 1:
            raise ValueError(f"layer {op.name!r} ({kind.__name__}) takes {len(refs)} inputs; one "
                             f"expected")
        ref = refs[0]
        for rule in table[kind](op):
            ref = self._append(rule, [ref.index])
        return ref
