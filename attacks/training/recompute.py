"""Training-mode forward passes that keep less for the backward pass (gradient checkpointing).

A tape keeps, until the backward pass reaches it, every forward tensor a gradient needs: in a
pre-activation ResNet that is the input of each batch normalisation and the output of each ReLU
(the next convolution's input), four activation maps per block, the same set PyTorch's autograd
keeps. :func:`checkpointed_call` runs a Keras functional model segment by segment, a segment
ending at each tensor that is the only one alive at that point of the graph (the output of a
residual block, for example); the backward pass gets only the segment inputs and recomputes each
segment's forward, one segment at a time, when its gradient arrives (Chen et al. 2016,
"Training Deep Nets with Sublinear Memory Cost"). Memory for activations drops from the whole
network's to one activation map per segment plus the largest segment; the time rises by one
more forward pass of the training-mode update (not of the crafting passes, which do not use it).

Batch-normalisation layers update their moving statistics once, in the first forward pass: the
recomputation normalises with the same batch statistics and leaves the moving averages alone,
so the outputs, the gradients and the moving statistics are those of ``model(x, training=True)``
(tested to float tolerance).

:func:`recomputed_activations_call` recomputes less and costs (almost) nothing: of each batch
norm -> ReLU -> convolution chain (:func:`activation_groups`) it keeps only the batch norm's input
and recomputes the normalisation and the ReLU (element-wise) when the gradient arrives; the
convolutions' gradients need only their input (the recomputed ReLU output) and kernel, so they
are not run again. A pre-activation ResNet then keeps two activation maps per block instead of
four (plus the padded copies of the strided blocks).

Used by :class:`~attacks.training.AdversarialTrainer` (the update's forward pass in training
mode): ``recompute="activations"`` (the default) and ``recompute="blocks"`` (or ``True``).

>>> import keras, numpy as np, tensorflow as tf
>>> from attacks.training import make_model
>>> model = make_model("wrn-10-1", (8, 8, 3), 4)
>>> len(checkpoint_segments(model))  # (stem + block 1), block 2, block 3, head
4
>>> x = tf.constant(np.random.default_rng(0).random((2, 8, 8, 3)), tf.float32)
>>> checkpointed_call(model, x).shape
TensorShape([2, 4])
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

__all__ = ["activation_groups", "checkpoint_segments", "checkpointed_call",
           "recomputed_activations_call"]

# model -> its segments (lists of Keras graph nodes), computed once per model
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# model -> (its nodes in order, its activation groups), computed once per model
_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _nodes_in_order(model: keras.Model) -> list:
    """The model's graph nodes in the order Keras runs them (deepest first)."""
    order = []
    for depth in sorted(model._nodes_by_depth, reverse=True):
        for node in model._nodes_by_depth[depth]:
            if node.operation is not None and not node.is_input:
                order.append(node)
    return order


def checkpoint_segments(model: Any) -> list[list]:
    """The segments :func:`checkpointed_call` runs ``model`` in: lists of its Keras graph nodes,
    in order, each segment taking exactly one tensor (the previous segment's output, or the
    model's input) and leaving exactly one alive for the rest of the graph. A segment ends at
    the first such point after a merge (a residual block's addition) or after ``sqrt(layers)``
    layers (Chen et al.'s rule for a plain chain), whichever comes first. Empty when
    ``model`` is not a single-input, single-output Keras functional (or built Sequential) model
    (the caller then runs it whole)."""
    if model in _PLANS:
        return _PLANS[model]
    plan: list[list] = []
    graph = model
    if isinstance(model, keras.Sequential):  # a built Sequential runs a functional graph
        graph = getattr(model, "_functional", None)
    if (isinstance(graph, keras.Model) and hasattr(graph, "_nodes_by_depth")
            and len(graph.inputs or []) == 1 and len(graph.outputs or []) == 1):
        model_in, model_out = graph.inputs[0], graph.outputs[0]
        nodes = _nodes_in_order(graph)
        last_use: dict[int, int] = {}
        for i, node in enumerate(nodes):
            for t in node.input_tensors:
                last_use[id(t)] = i
        out_id = id(model_out)
        last_use[out_id] = len(nodes)
        live = {id(model_in)}
        current: list = []
        merged = False  # the current segment holds a merge (a residual addition)
        longest = max(2, math.isqrt(len(nodes)))
        for i, node in enumerate(nodes):
            current.append(node)
            for t in node.outputs:
                live.add(id(t))
            live = {t for t in live if last_use.get(t, -1) > i}
            merged = merged or len(node.input_tensors) > 1
            if (len(live) == 1 and len(node.outputs) == 1 and id(node.outputs[0]) in live
                    and (merged or len(current) >= longest or i == len(nodes) - 1)):
                plan.append(current)
                merged = False
                current = []
        if current:  # cannot happen for a connected graph; run the rest as one segment
            plan.append(current)
    _PLANS[model] = plan
    return plan


def _bn_training_no_update(layer: keras.layers.BatchNormalization, x: tf.Tensor) -> tf.Tensor:
    """``layer(x, training=True)`` without touching its moving statistics (the recomputation);
    the same operations as Keras' layer, so the result is the same to the last bit."""
    compute_dtype = keras.backend.result_type(x.dtype, "float32")
    x = keras.ops.cast(x, compute_dtype)
    mean, variance = keras.ops.moments(x, axes=layer._reduction_axes,
                                       synchronized=layer.synchronized)
    gamma = keras.ops.cast(layer.gamma, x.dtype) if layer.scale else None
    beta = keras.ops.cast(layer.beta, x.dtype) if layer.center else None
    out = keras.ops.batch_normalization(x, mean, variance, axis=layer.axis, offset=beta,
                                        scale=gamma, epsilon=layer.epsilon)
    return keras.ops.cast(out, layer.compute_dtype)


def _simple_bn(layer: Any) -> bool:
    return (isinstance(layer, keras.layers.BatchNormalization) and layer.trainable
            and not layer.renorm)


def _run_segment(nodes: list, x: tf.Tensor, training: bool, first: bool) -> tf.Tensor:
    """Run ``nodes`` on ``x`` (the segment's one input); ``first=False``: the recomputation
    (batch-norm moving statistics untouched)."""
    values: dict[int, Any] = {}
    for t in nodes[0].input_tensors:
        values[id(t)] = x
    out = x
    for node in nodes:
        args, kwargs = node.arguments.fill_in(values)
        op = node.operation
        if (not first and training and _simple_bn(op) and len(args) == 1
                and all(v is None for v in kwargs.values())):
            out = _bn_training_no_update(op, args[0])
        elif getattr(op, "_call_has_training_arg", False):
            out = op(*args, training=training, **kwargs)
        else:
            out = op(*args, **kwargs)
        for ref, value in zip(node.outputs, tf.nest.flatten(out)):
            values[id(ref)] = value
    return values[id(nodes[-1].outputs[0])]


def _after(x: tf.Tensor, dy: tf.Tensor) -> tf.Tensor:
    """``x`` made to depend on ``dy`` by data (adds a zero computed from one element of
    ``dy``), so that the executor cannot run the recomputation before the gradient arrives: a
    control dependency can be pruned by graph optimisations, and ``zeros_like`` of a tensor of
    known shape is a constant. ``b and not b`` is False for any ``b``, NaN included."""
    flag = tf.cast(tf.reshape(dy, [-1])[:1], tf.bool)
    zero = tf.cast(tf.reduce_any(tf.logical_and(flag, tf.logical_not(flag))), x.dtype)
    return x + zero


def _recomputed(run: Callable[[tf.Tensor, bool], list]) -> Callable[[tf.Tensor], Any]:
    """``run(x, first=True)`` as one custom-gradient call whose backward pass runs
    ``run(x, first=False)`` again (batch-norm statistics untouched) instead of keeping its
    activations; returns the tuple of ``run``'s outputs. Serves whole segments
    (:func:`checkpointed_call`) and activation groups (:func:`recomputed_activations_call`)."""
    @tf.custom_gradient
    def call(x):
        ys = run(x, True)

        def grad(*upstream, variables=None):
            dys = [tf.zeros_like(y) if d is None else d for y, d in zip(ys, upstream)]
            with tf.GradientTape() as tape:
                xr = _after(x, dys[0])
                tape.watch(xr)
                if variables:
                    tape.watch(variables)
                # outputs the gradients do not read (an activation group's convolutions) are
                # dropped from the graph: only what the gradients need runs again
                yrs = run(xr, False)
            sources = [xr, *(variables or [])]
            grads = tape.gradient(yrs, sources, output_gradients=dys,
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
            # The input's gradient is what the previous segment's recomputation waits for:
            # released only with the weights' gradients, so that this segment's recomputed
            # activations are freed before the next recomputation starts (an executor free to
            # run the input-gradient chain first would hold every segment's at once).
            with tf.control_dependencies(grads[1:]):
                dx = tf.identity(grads[0])
            return dx, grads[1:]

        return tuple(ys), grad

    return call


def _checkpointed(nodes: list, training: bool) -> Callable[[tf.Tensor], tf.Tensor]:
    run = _recomputed(lambda x, first: [_run_segment(nodes, x, training, first)])
    return lambda x: run(x)[0]


def checkpointed_call(model: Any, x: Any, training: bool = True) -> tf.Tensor:
    """``model(x, training=training)`` with the backward pass recomputing each segment of
    :func:`checkpoint_segments` instead of keeping its activations (see the module doc).

    Args:
        model: a Keras functional model with one input and one output; anything else (a
            subclassed model, a callable) is called whole, as ``model(x, training=training)``.
        x: the input batch ``[B, ...]``.
        training: the mode of the layers (batch-norm statistics move once when True).

    Returns:
        The model's output, equal to ``model(x, training=training)``; its gradients with
        respect to ``x`` and to the model's variables are the same.
    """
    plan = checkpoint_segments(model)
    if not plan:
        return model(x, training=training)
    out = tf.convert_to_tensor(x)
    for nodes in plan:
        if len(nodes) == 1:  # nothing to save by recomputing one layer
            out = _run_segment(nodes, out, training, first=True)
        else:
            out = _checkpointed(nodes, training)(out)
    return out


# ------------------------------------------------------------ recomputing activations only

def _functional_graph(model: Any) -> Any:
    """The functional graph ``model`` runs (a built Sequential's), or None."""
    graph = model
    if isinstance(model, keras.Sequential):
        graph = getattr(model, "_functional", None)
    if (isinstance(graph, keras.Model) and hasattr(graph, "_nodes_by_depth")
            and len(graph.inputs or []) == 1 and len(graph.outputs or []) == 1):
        return graph
    return None


def _is_relu(op: Any) -> bool:
    if isinstance(op, keras.layers.ReLU):
        return (op.max_value is None and float(op.negative_slope) == 0.0
                and float(op.threshold) == 0.0)
    return (isinstance(op, keras.layers.Activation)
            and getattr(op.activation, "__name__", "") == "relu")


def _single_input(node: Any) -> Any:
    """The one tensor ``node`` takes, with no other arguments; else None."""
    args, kwargs = node.arguments.args, node.arguments.kwargs
    if (len(node.input_tensors) == 1 and len(args) == 1 and args[0] is node.input_tensors[0]
            and all(v is None for v in kwargs.values()) and len(node.outputs) == 1):
        return node.input_tensors[0]
    return None


def _reader_lookup(consumers: dict[int, list]) -> Callable[[Any], list]:
    return lambda tensor: consumers.get(id(tensor), [])


def activation_groups(model: Any) -> list[list]:
    """The groups :func:`recomputed_activations_call` recomputes: a batch normalisation, the
    ReLU it alone feeds, and the convolutions (with their ``ZeroPadding2D``) that alone read
    the ReLU's output -- lists of Keras graph nodes, the batch normalisation first. The
    group's forward keeps only the batch normalisation's input; its backward recomputes the
    normalisation and the ReLU (element-wise, cheap) but not the convolutions, whose gradients
    need only their input and kernel. Empty when ``model`` is not a single-input,
    single-output functional (or built Sequential) model, or has no such pattern."""
    if model in _GROUPS:
        return _GROUPS[model][1]
    graph = _functional_graph(model)
    groups: list[list] = []
    order: list = []
    if graph is not None:
        order = _nodes_in_order(graph)
        consumers: dict[int, list] = {}
        for node in order:
            for t in node.input_tensors:
                consumers.setdefault(id(t), []).append(node)
        model_out = id(graph.outputs[0])
        consumers[model_out] = []  # a model output is not a group's to drop
        only_consumers = _reader_lookup(consumers)
        for node in order:
            if not (_simple_bn(node.operation) and _single_input(node) is not None):
                continue
            users = only_consumers(node.outputs[0])
            if len(users) != 1 or not _is_relu(users[0].operation) or \
                    _single_input(users[0]) is None:
                continue
            relu = users[0]
            group, ok = [node, relu], True
            for user in only_consumers(relu.outputs[0]):
                chain = [user]
                if isinstance(user.operation, keras.layers.ZeroPadding2D):
                    after = only_consumers(user.outputs[0])
                    if _single_input(user) is None or len(after) != 1:
                        ok = False
                        break
                    chain.append(after[0])
                conv = chain[-1]
                if not isinstance(conv.operation, keras.layers.Conv2D) or \
                        _single_input(conv) is None:
                    ok = False
                    break
                group.extend(chain)
            if ok and len(group) > 2 and not any(id(n.outputs[0]) == model_out for n in group):
                groups.append(group)
    _GROUPS[model] = (order, groups)
    return groups


def _group_outputs(group: list) -> list:
    """The group's outputs: its convolutions' (the nodes no other group member reads)."""
    inside = {id(t) for n in group for t in n.input_tensors}
    return [n.outputs[0] for n in group if id(n.outputs[0]) not in inside]


def _run_group(group: list, x: tf.Tensor, training: bool, first: bool) -> list:
    values: dict[int, Any] = {id(group[0].input_tensors[0]): x}
    for node in group:
        (arg,) = node.arguments.args
        value = values[id(arg)]
        op = node.operation
        if not first and training and node is group[0]:
            out = _bn_training_no_update(op, value)
        elif getattr(op, "_call_has_training_arg", False):
            out = op(value, training=training)
        else:
            out = op(value)
        values[id(node.outputs[0])] = out
    return [values[id(t)] for t in _group_outputs(group)]


def _recomputed_group(group: list, training: bool) -> Callable[[tf.Tensor], Any]:
    return _recomputed(lambda x, first: _run_group(group, x, training, first))


def recomputed_activations_call(model: Any, x: Any, training: bool = True) -> tf.Tensor:
    """``model(x, training=training)`` keeping, of each :func:`activation_groups` group
    (batch norm -> ReLU -> convolutions), only the batch normalisation's input for the
    backward pass: the ReLU outputs (the convolutions' inputs, half the activation maps a
    pre-activation ResNet keeps) are recomputed from it when the gradient arrives. The
    convolutions are not run again.

    Args:
        model: a Keras functional model with one input and one output; anything else (a
            subclassed model, a callable) is called whole, as ``model(x, training=training)``.
        x: the input batch ``[B, ...]``.
        training: the mode of the layers (batch-norm statistics move once when True).

    Returns:
        The model's output, equal to ``model(x, training=training)``; its gradients with
        respect to ``x`` and to the model's variables are the same.
    """
    groups = activation_groups(model)
    if not groups:
        return model(x, training=training)
    order = _GROUPS[model][0]
    graph = _functional_graph(model)
    starts = {id(g[0]): g for g in groups}
    grouped = {id(n) for g in groups for n in g}
    values: dict[int, Any] = {id(graph.inputs[0]): tf.convert_to_tensor(x)}
    for node in order:
        if id(node) in starts:
            group = starts[id(node)]
            ys = _recomputed_group(group, training)(values[id(node.input_tensors[0])])
            for ref, value in zip(_group_outputs(group), tf.nest.flatten(ys)):
                values[id(ref)] = value
            continue
        if id(node) in grouped:
            continue
        args, kwargs = node.arguments.fill_in(values)
        op = node.operation
        if getattr(op, "_call_has_training_arg", False):
            out = op(*args, training=training, **kwargs)
        else:
            out = op(*args, **kwargs)
        for ref, value in zip(node.outputs, tf.nest.flatten(out)):
            values[id(ref)] = value
    return values[id(graph.outputs[0])]
