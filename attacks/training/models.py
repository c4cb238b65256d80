"""Classifiers for adversarial training: a small CNN factory, layer freezing (fine-tuning),
and the check that a model outputs logits of the right width.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from robustgrad.checks import looks_like_probabilities, positive_int

__all__ = ["check_classifier", "freeze_layers", "make_classifier"]


def make_classifier(input_shape: Any, num_classes: int, width: int = 32,
                    name: str = "classifier") -> keras.Sequential:
    """A small CNN returning logits (no softmax): 3 conv layers, 2 max-pools, 2 dense layers.

    ``width`` is the channel count of the first conv layer (then 2x, 4x). On 8x8 digits with
    ``width=32`` it has ~0.2M parameters. ``input_shape`` is ``(H, W)`` or ``(H, W, C)``.

    Weights and biases start as PyTorch starts ``Conv2d``/``Linear`` layers (uniform in
    ``+-1/sqrt(fan_in)``), which the published recipes were tuned with: with Keras's default
    (Glorot-uniform kernels, zero biases), fast-AT on the 28x28 MNIST subset ended 1.3 to 2.3
    points of APGD-CE accuracy lower on the same seeds (``docs/benchmarks/training.md``).

    >>> clf = make_classifier((8, 8), 10, width=4)
    >>> clf.output_shape
    (None, 10)
    """
    input_shape = tuple(int(d) for d in input_shape)
    if len(input_shape) == 2:
        input_shape = input_shape + (1,)
    if len(input_shape) != 3:
        raise ValueError(f"input_shape must be (H, W) or (H, W, C); got {input_shape}")
    num_classes = positive_int(num_classes, "num_classes", minimum=2)
    width = positive_int(width, "width")
    return keras.Sequential([keras.Input(input_shape), *_cnn_layers(input_shape, num_classes, width)],
                            name=name)


def _fan_in_uniform(fan_in: int) -> keras.initializers.Initializer:
    """PyTorch's default initialisation of ``Conv2d``/``Linear`` weights and biases
    (``kaiming_uniform_(a=sqrt(5))``): uniform in ``+-1/sqrt(fan_in)``."""
    bound = 1.0 / float(np.sqrt(max(int(fan_in), 1)))
    return keras.initializers.RandomUniform(-bound, bound)


def _cnn_layers(input_shape: tuple, num_classes: int, width: int) -> list:
    """The layers of :func:`make_classifier` after its input (``input_shape`` ``(H, W, C)``),
    initialised as PyTorch initialises them (see :func:`make_classifier`)."""
    kl = keras.layers
    h, w, c = (int(d) for d in input_shape)
    pool = h >= 4 and w >= 4

    def conv(filters, fan_in, name):
        init = _fan_in_uniform(fan_in)
        return kl.Conv2D(filters, 3, padding="same", activation="relu", name=name,
                         kernel_initializer=init, bias_initializer=init)

    def dense(units, fan_in, name, **kw):
        init = _fan_in_uniform(fan_in)
        return kl.Dense(units, name=name, kernel_initializer=init, bias_initializer=init, **kw)

    layers = [conv(width, 9 * c, "conv1"), conv(2 * width, 9 * width, "conv2")]
    if pool:
        layers.append(kl.MaxPooling2D(2, name="pool1"))
        h, w = h // 2, w // 2
    layers.append(conv(4 * width, 9 * 2 * width, "conv3"))
    if pool and input_shape[0] >= 8:
        layers.append(kl.MaxPooling2D(2, name="pool2"))
        h, w = h // 2, w // 2
    layers += [
        kl.Flatten(name="flatten"),
        dense(4 * width, h * w * 4 * width, "dense1", activation="relu"),
        dense(int(num_classes), 4 * width, "logits", dtype="float32"),
    ]
    return layers


def freeze_layers(model: keras.Model, patterns: str | Iterable[str]) -> list[str]:
    """Set ``trainable=False`` on every layer whose name matches one of ``patterns``.

    A pattern is a glob (``conv*``) or, prefixed with ``re:``, a regular expression
    (``re:^conv[12]$``). Returns the frozen layer names; ``ValueError`` when a pattern matches
    nothing (naming it and the available layers). Frozen layers drop out of
    ``trainable_variables``, so the optimizer never sees them (the same effect as a masked
    gradient transformation that zeroes their updates, without optimizer state for them).

    >>> freeze_layers(make_classifier((8, 8), 10, width=4), "conv1,re:^dense")
    ['conv1', 'dense1']
    """
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p.strip()]
    layers = list(_iter_layers(model))
    frozen = []
    for pat in patterns:
        pat = pat.strip()
        if pat.startswith("re:"):
            rx = re.compile(pat[3:])
            hits = [layer for layer in layers if rx.search(layer.name)]
        else:
            hits = [layer for layer in layers if fnmatch.fnmatchcase(layer.name, pat)]
        if not hits:
            raise ValueError(
                f"freeze pattern {pat!r} matches no layer; layers are: "
                + ", ".join(layer.name for layer in layers)
            )
        for layer in hits:
            layer.trainable = False
            if layer.name not in frozen:
                frozen.append(layer.name)
    return frozen


def _iter_layers(model):
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers") and layer is not model:
            yield from _iter_layers(layer)


def check_classifier(model: Any, x_sample: Any, num_classes: int) -> None:
    """Raise ``ValueError`` if ``model`` outputs probabilities or the wrong number of classes.

    Runs ``model`` in inference mode on the first 32 rows of ``x_sample``.

    >>> import numpy as np
    >>> check_classifier(make_classifier((8, 8), 10, width=4), np.zeros((2, 8, 8, 1), "float32"), 12)
    Traceback (most recent call last):
    ...
    ValueError: the labels have 12 classes but the model outputs 10 logits
    """
    from .._base import check_model_output, declared_input_shape

    got, expected = tuple(np.shape(x_sample)[1:]), declared_input_shape(model)
    if expected is not None and (len(expected) != len(got) or any(
            e is not None and e != g for e, g in zip(expected, got))):
        raise ValueError(f"the data's examples have shape {got} but the model takes inputs of "
                         f"shape {tuple(expected)}")
    out = check_model_output(model(tf.convert_to_tensor(x_sample[:32]), training=False))
    out = np.asarray(out)
    if out.ndim != 2:
        raise ValueError(f"the model must output logits of shape (batch, classes); got {out.shape}")
    if out.shape[1] != num_classes:
        raise ValueError(
            f"the labels have {num_classes} classes but the model outputs {out.shape[1]} logits"
        )
    if looks_like_probabilities(out):
        raise ValueError(
            "the model outputs probabilities (rows are non-negative and sum to 1): remove the "
            "final softmax and output logits; attacks through saturated probabilities give "
            "vanishing input gradients (gradient masking)"
        )
