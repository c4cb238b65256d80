"""Classifier architectures by name: the small CNN, an MLP, PreActResNet-18 and WideResNets.

:func:`make_model` builds any of :data:`ARCHITECTURES` as a Keras functional model returning
logits (no softmax), channels-last (``[N, H, W, C]`` inputs):

* ``cnn`` -- :func:`~attacks.training.make_classifier`'s small CNN (option ``width``);
* ``mlp`` -- :func:`mlp` (option ``hidden``);
* ``ibp-small`` -- :func:`ibp_small`, the small CNN of Gowal et al. 2018 for certified training
  (strided convolutions, no pooling: every layer is one :mod:`robustgrad.bounds` bounds; option
  ``width``);
* ``preactresnet18`` -- :func:`preact_resnet18`, He et al. 2016, "Identity Mappings in Deep
  Residual Networks", in the form Rice et al. 2020 and Wong et al. 2020 train on CIFAR-10
  (11,172,170 parameters for 10 classes, with the final BN-ReLU before pooling; option ``width``,
  64 by default);
* ``wideresnet`` (options ``depth``, ``widen_factor``, ``dropout``) and the names ``wrn-28-10``,
  ``wrn-34-10`` (any ``wrn-<depth>-<widen>``) -- :func:`wide_resnet`, Zagoruyko & Komodakis 2016,
  "Wide Residual Networks", as used by Madry et al. 2018 and TRADES (Zhang et al. 2019):
  WRN-28-10 has 36,479,194 parameters, WRN-34-10 46,160,474 (10 classes).

Every model:

* takes ``mean`` and ``std`` (a number or one per channel): a ``Normalization`` layer inside the
  model computes ``(x - mean) / std``, so inputs, ``clip_min``/``clip_max`` and ``eps`` stay in
  pixel units (CIFAR-10's usual statistics are :data:`CIFAR10_MEAN`, :data:`CIFAR10_STD`);
* is mixed-precision safe: under a ``mixed_float16`` policy the normalisation and the logits
  stay float32;
* uses only built-in Keras layers, so ``keras.models.load_model("m.keras")`` needs no custom
  objects;
* matches the PyTorch reference layer for layer: biasless convolutions, batch normalisation with
  PyTorch's momentum (0.1, i.e. Keras ``momentum=0.9``) and epsilon (1e-5), and a stride-2
  3x3 convolution padded by one pixel on every side (``ZeroPadding2D`` + ``valid``), so ported
  weights give the same outputs.

>>> model = make_model("preactresnet18", (32, 32, 3), 10, width=4)
>>> model.output_shape, model.output.dtype
((None, 10), 'float32')
>>> make_model("resnet50", (32, 32, 3), 10)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: arch must be one of cnn, ... (or wrn-<depth>-<widen>); got 'resnet50'
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from robustgrad.checks import number, positive_int

from .models import _cnn_layers

__all__ = ["ARCHITECTURES", "CIFAR10_MEAN", "CIFAR10_STD", "ibp_small", "make_model", "mlp",
           "preact_resnet18", "wide_resnet"]

#: Architecture names of :func:`make_model`, each with a one-line description.
ARCHITECTURES = {
    "cnn": "small CNN: 3 conv layers, 2 max-pools, 2 dense (option width=32)",
    "mlp": "multi-layer perceptron on the flattened image (option hidden=(256, 256))",
    "ibp-small": "Gowal et al. 2018's small CNN for certified training: conv 4x4/2, conv 4x4/1, "
                 "dense 100, no pooling (options width=16, hidden=100)",
    "preactresnet18": "PreActResNet-18, He et al. 2016 (11.17M parameters on CIFAR-10; option width=64)",
    "wideresnet": "WideResNet, Zagoruyko & Komodakis 2016 (options depth=28, widen_factor=10, "
                  "dropout=0)",
    "wrn-28-10": "WideResNet-28-10 (36.5M parameters on CIFAR-10)",
    "wrn-34-10": "WideResNet-34-10 (46.2M parameters on CIFAR-10)",
}

#: Per-channel mean and standard deviation of CIFAR-10's training images, in [0, 1] pixel units.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2471, 0.2435, 0.2616)

_WRN_NAME = re.compile(r"^wrn-(\d+)-(\d+)$")
_BN = {"momentum": 0.9, "epsilon": 1e-5}


def _image_shape(input_shape: Any, arch: str, downsamplings: int) -> tuple[int, int, int]:
    """``input_shape`` as ``(H, W, C)``; ``ValueError`` naming it when ``arch`` cannot take it."""
    try:
        shape = tuple(int(d) for d in input_shape)
    except (TypeError, ValueError):
        raise ValueError(f"input_shape must be (H, W) or (H, W, C) of positive ints; got "
                         f"{input_shape!r}") from None
    if len(shape) == 2:
        shape += (1,)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"input_shape {tuple(input_shape)}: {arch} takes images (H, W) or "
                         "(H, W, C) with positive sizes (flattened vectors: use arch='mlp')")
    least = 2 ** downsamplings
    if min(shape[:2]) < least:
        raise ValueError(f"input_shape {shape}: {arch} halves the image {downsamplings} times and "
                         f"needs at least {least}x{least} pixels")
    return shape


def _inputs(shape: tuple, mean: Any, std: Any) -> tuple[keras.KerasTensor, keras.KerasTensor]:
    """The model's input and, with ``mean``/``std``, its normalised version (float32)."""
    inputs = keras.Input(shape, name="image")
    if mean is None and std is None:
        return inputs, inputs
    channels = shape[-1]

    def per_channel(value, what, default):
        value = default if value is None else value
        arr = np.asarray(value, np.float64).reshape(-1)
        if arr.size not in (1, channels) or not np.all(np.isfinite(arr)):
            raise ValueError(f"{what} must be a finite number or {channels} numbers (one per "
                             f"channel); got {value!r}")
        return np.broadcast_to(arr, (channels,)).astype(np.float32)

    m = per_channel(mean, "mean", 0.0)
    s = per_channel(std, "std", 1.0)
    if np.any(s <= 0):
        raise ValueError(f"std must be > 0; got {std!r}")
    norm = keras.layers.Normalization(axis=-1, mean=m.tolist(), variance=(s ** 2).tolist(),
                                      name="normalize", dtype="float32")
    return inputs, norm(inputs)


def _bn(name: str) -> keras.layers.Layer:
    return keras.layers.BatchNormalization(name=name, **_BN)


def _conv3x3(x, filters: int, stride: int, name: str):
    if stride == 1:
        return keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=name)(x)
    x = keras.layers.ZeroPadding2D(1, name=name + "_pad")(x)
    return keras.layers.Conv2D(filters, 3, strides=stride, padding="valid", use_bias=False,
                               name=name)(x)


def _preact_block(x, filters: int, stride: int, dropout: float, name: str):
    """BN-ReLU-conv3x3(stride)-BN-ReLU-[dropout]-conv3x3 plus the shortcut: the input, or a
    1x1 strided convolution of the activated input when the shape changes."""
    kl = keras.layers
    activated = kl.ReLU(name=name + "_relu1")(_bn(name + "_bn1")(x))
    if stride != 1 or x.shape[-1] != filters:
        shortcut = kl.Conv2D(filters, 1, strides=stride, use_bias=False,
                             name=name + "_shortcut")(activated)
    else:
        shortcut = x
    out = _conv3x3(activated, filters, stride, name + "_conv1")
    out = kl.ReLU(name=name + "_relu2")(_bn(name + "_bn2")(out))
    if dropout:
        out = kl.Dropout(dropout, name=name + "_dropout")(out)
    out = _conv3x3(out, filters, 1, name + "_conv2")
    return kl.Add(name=name + "_add")([out, shortcut])


def _head(x, num_classes: int):
    kl = keras.layers
    x = kl.ReLU(name="final_relu")(_bn("final_bn")(x))
    x = kl.GlobalAveragePooling2D(name="pool")(x)
    return kl.Dense(num_classes, name="logits", dtype="float32")(x)


def preact_resnet18(input_shape: Any, num_classes: int, *, width: int = 64, mean: Any = None,
                    std: Any = None, name: str = "preactresnet18") -> keras.Model:
    """PreActResNet-18 (He et al. 2016, "Identity Mappings in Deep Residual Networks").

    A 3x3 convolution of ``width`` channels, four stages of two pre-activation blocks with
    ``width * (1, 2, 4, 8)`` channels (strides 1, 2, 2, 2), BN-ReLU, global average pooling and a
    dense layer of ``num_classes`` float32 logits. Inputs ``[N, H, W, C]`` with H, W >= 8; with
    ``width=64`` and 10 classes it has 11,172,170 trainable parameters, as Rice et al. 2020's and
    Wong et al. 2020's CIFAR-10 model (the variant without the final BN has 11,171,146).
    ``mean``/``std``: see the module docstring.

    >>> preact_resnet18((32, 32, 3), 10, width=2).count_params() > 0
    True
    """
    shape = _image_shape(input_shape, "preactresnet18", 3)
    num_classes = positive_int(num_classes, "num_classes", minimum=2)
    width = positive_int(width, "width")
    inputs, x = _inputs(shape, mean, std)
    x = _conv3x3(x, width, 1, "stem_conv")
    for stage, (mult, stride) in enumerate(((1, 1), (2, 2), (4, 2), (8, 2)), start=1):
        for block in range(2):
            x = _preact_block(x, width * mult, stride if block == 0 else 1, 0.0,
                              f"stage{stage}_block{block + 1}")
    return keras.Model(inputs, _head(x, num_classes), name=name)


def wide_resnet(input_shape: Any, num_classes: int, *, depth: int = 28, widen_factor: int = 10,
                dropout: float = 0.0, mean: Any = None, std: Any = None,
                name: str | None = None) -> keras.Model:
    """WideResNet-``depth``-``widen_factor`` (Zagoruyko & Komodakis 2016, "Wide Residual Networks").

    A 3x3 convolution of 16 channels, three groups of ``(depth - 4) / 6`` pre-activation blocks
    with ``16k, 32k, 64k`` channels (``k = widen_factor``; strides 1, 2, 2; ``dropout`` between
    the two convolutions of a block), BN-ReLU, global average pooling and ``num_classes`` float32
    logits. ``depth`` must be ``6n + 4`` (16, 22, 28, 34, 40, ...). WRN-28-10 has 36,479,194
    trainable parameters for 10 classes, WRN-34-10 46,160,474. Inputs ``[N, H, W, C]`` with
    H, W >= 4.

    >>> wide_resnet((32, 32, 3), 10, depth=10, widen_factor=1).name
    'wrn-10-1'
    """
    shape = _image_shape(input_shape, "wideresnet", 2)
    num_classes = positive_int(num_classes, "num_classes", minimum=2)
    depth = positive_int(depth, "depth", minimum=10)
    if (depth - 4) % 6:
        raise ValueError(f"depth must be 6n + 4 (10, 16, 22, 28, 34, 40, ...); got {depth}")
    widen_factor = positive_int(widen_factor, "widen_factor")
    dropout = number(dropout, "dropout", minimum=0, maximum=1, max_inclusive=False)
    inputs, x = _inputs(shape, mean, std)
    x = _conv3x3(x, 16, 1, "stem_conv")
    for group, (channels, stride) in enumerate(((16, 1), (32, 2), (64, 2)), start=1):
        for block in range((depth - 4) // 6):
            x = _preact_block(x, channels * widen_factor, stride if block == 0 else 1, dropout,
                              f"group{group}_block{block + 1}")
    return keras.Model(inputs, _head(x, num_classes), name=name or f"wrn-{depth}-{widen_factor}")


def mlp(input_shape: Any, num_classes: int, *, hidden: Sequence[int] = (256, 256),
        mean: Any = None, std: Any = None, name: str = "mlp") -> keras.Model:
    """A multi-layer perceptron: flatten, ``Dense(h, relu)`` for each ``h`` in ``hidden``, and
    ``num_classes`` float32 logits. ``input_shape`` is any shape (an image or a vector).

    >>> mlp((8, 8, 1), 10, hidden=(16,)).count_params()
    1210
    """
    try:
        shape = tuple(int(d) for d in input_shape)
    except (TypeError, ValueError):
        raise ValueError(f"input_shape must be a tuple of positive ints; got {input_shape!r}") \
            from None
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape must be a tuple of positive ints; got {shape}")
    num_classes = positive_int(num_classes, "num_classes", minimum=2)
    hidden = [positive_int(h, "hidden") for h in hidden]
    inputs, x = _inputs(shape, mean, std)
    x = keras.layers.Flatten(name="flatten")(x)
    for i, h in enumerate(hidden, start=1):
        x = keras.layers.Dense(h, activation="relu", name=f"dense{i}")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits",
                                                  dtype="float32")(x), name=name)


def ibp_small(input_shape: Any, num_classes: int, *, width: int = 16, hidden: int = 100,
              mean: Any = None, std: Any = None, name: str = "ibp-small") -> keras.Model:
    """The "small" CNN of Gowal et al. 2018 ("On the Effectiveness of Interval Bound
    Propagation for Training Verifiably Robust Models", table 1): ``Conv2D(width, 4, stride
    2)``, ``Conv2D(2 * width, 4, stride 1)``, ``Dense(hidden)``, ReLU after each, float32 logits;
    ``padding="same"``. Only layers :mod:`robustgrad.bounds` supports, for ``"ibp"`` and
    ``"crown-ibp"`` training.

    >>> ibp_small((8, 8, 1), 10).count_params()
    60806
    """
    shape = _image_shape(input_shape, "ibp-small", 1)
    num_classes = positive_int(num_classes, "num_classes", minimum=2)
    width = positive_int(width, "width")
    hidden = positive_int(hidden, "hidden")
    inputs, x = _inputs(shape, mean, std)
    x = keras.layers.Conv2D(width, 4, strides=2, padding="same", activation="relu",
                            name="conv1")(x)
    x = keras.layers.Conv2D(2 * width, 4, strides=1, padding="same", activation="relu",
                            name="conv2")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(hidden, activation="relu", name="dense1")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits",
                                                  dtype="float32")(x), name=name)


def _cnn(input_shape: Any, num_classes: int, *, width: int = 32, mean: Any = None,
         std: Any = None, name: str = "cnn") -> keras.Model:
    shape = _image_shape(input_shape, "cnn", 0)
    num_classes = positive_int(num_classes, "num_classes", minimum=2)
    width = positive_int(width, "width")
    inputs, x = _inputs(shape, mean, std)
    for layer in _cnn_layers(shape, num_classes, width):
        x = layer(x)
    return keras.Model(inputs, x, name=name)


def make_model(arch: str, input_shape: Any, num_classes: int, **options: Any) -> keras.Model:
    """A classifier returning float32 logits, by architecture name.

    Args:
        arch: one of :data:`ARCHITECTURES`, or ``wrn-<depth>-<widen>``.
        input_shape: one example's shape, ``(H, W, C)`` (or ``(H, W)`` for one channel).
        num_classes: the number of logits (>= 2).
        **options: the architecture's own options (``width`` of ``cnn``, ``ibp-small`` and
            ``preactresnet18``; ``hidden`` of ``mlp`` and ``ibp-small``; ``depth``,
            ``widen_factor``, ``dropout`` of ``wideresnet``), and for every architecture
            ``mean``, ``std`` (normalisation inside the model, so eps stays in pixel units) and
            ``name``.

    Raises:
        ValueError: an unknown ``arch``, an ``input_shape`` the architecture cannot take (too
            small for its downsamplings, or not an image), a bad option value.
        TypeError: an option the architecture does not have.
    """
    if not isinstance(arch, str):
        raise TypeError(f"arch must be a name (one of {', '.join(ARCHITECTURES)}); got {arch!r}")
    key = arch.strip().lower().replace("_", "-")
    key = {"preact-resnet18": "preactresnet18", "preactresnet-18": "preactresnet18",
           "preact-resnet-18": "preactresnet18", "wide-resnet": "wideresnet"}.get(key, key)
    match = _WRN_NAME.match(key)
    builder: Callable[..., Any]
    fixed: dict[str, Any]
    if match:
        builder = wide_resnet
        fixed = {"depth": int(match.group(1)), "widen_factor": int(match.group(2))}
    elif key in ("cnn", "mlp", "ibp-small", "preactresnet18", "wideresnet"):
        builders: dict[str, Callable[..., Any]] = {
            "cnn": _cnn, "mlp": mlp, "ibp-small": ibp_small, "preactresnet18": preact_resnet18,
            "wideresnet": wide_resnet}
        builder = builders[key]
        fixed = {}
    else:
        raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)} (or "
                         f"wrn-<depth>-<widen>); got {arch!r}")
    accepted = [p for p in inspect.signature(builder).parameters
                if p not in ("input_shape", "num_classes") and p not in fixed]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(f"arch {arch!r} has no option {', '.join(unknown)}; its options are "
                        f"{', '.join(accepted)}")
    return builder(input_shape, num_classes, **fixed, **options)
