"""2-D convolutions whose input gradient is a forward convolution (faster on Eigen's CPU kernels).

For a stride-1, undilated convolution ``y = conv(x, K)`` (NHWC, kernel ``[kh, kw, Cin, Cout]``,
padding ``(top, bottom)`` rows and ``(left, right)`` columns), the input gradient -- the
transposed convolution TensorFlow computes with ``Conv2DBackpropInput`` -- is itself a forward
convolution: of the output gradient with the kernel flipped spatially and its channels swapped
(``[kh, kw, Cout, Cin]``), padded ``(kh - 1 - top, kh - 1 - bottom)`` and ``(kw - 1 - left,
kw - 1 - right)``. ``"SAME"`` with an odd kernel stays ``"SAME"``; ``"VALID"`` becomes the
"full" padding ``kh - 1`` on each side. The sums are the same, in another order: the result
equals TensorFlow's to float rounding.

Why: on CPUs where TensorFlow runs its convolutions on Eigen (no oneDNN: TensorFlow 2.21
enables oneDNN by itself only on CPUs with AVX-512 VNNI/BF16 or AMX), ``Conv2DBackpropInput``
is about twice as slow as a forward convolution of the same size; the input gradient is the
whole backward pass of each attack iteration (``docs/benchmarks/training.md``).

At a stride ``s`` the input gradient splits into ``s x s`` phases (input rows ``s j + p`` receive
only the kernel rows ``p, p + s, ...``), each a stride-1 forward convolution with its share of the
taps; :func:`transpose` interleaves them. Their copies cost more than Eigen's transpose gains on
most shapes: only a large kernel over a small output map wins (:data:`MIN_KERNEL_PER_OUTPUT`).
A strided 1x1 convolution's transpose is one 1x1 convolution and a zero interleave (its other
phases are zeros), which wins from fewer entries per position (:data:`MIN_POINTWISE_PER_OUTPUT`).

- :func:`conv2d` -- ``tf.nn.conv2d`` (NHWC) whose input gradient is :func:`transpose` where it
  applies (dilation 1, at least :data:`MIN_CHANNELS` input channels; at stride 1 a padding that
  does not make the forward convolution do more than :data:`MAX_EXTRA_WORK` times the
  transpose's work: "same", or "valid" on a map much larger than the kernel; at a stride, the
  same along both axes, at least :data:`MIN_KERNEL_PER_OUTPUT` kernel entries per output
  position, or :data:`MIN_POINTWISE_PER_OUTPUT` for a 1x1 kernel on an input whose size is a
  multiple of the stride); the kernel gradient is TensorFlow's own; anything else is ``tf.nn.conv2d`` with
  TensorFlow's gradients. The custom gradient is made of differentiable operations, so nested
  tapes (second order) and XLA work through it.
- :func:`transpose` -- the transpose of a convolution as forward convolutions (also the bound
  engine's CROWN rule, :class:`robustgrad.bounds._rules.Conv2D`, and its "forward" transpose of
  strided convolutions).
- :func:`forward_input_gradients` -- a context in which Keras ``Conv2D`` layers compute with
  :func:`conv2d`: entered while a compiled attack or training step is traced, the graph keeps
  the faster gradient; the layers and saved models stay plain Keras ``Conv2D``.

>>> import numpy as np, tensorflow as tf
>>> rng = np.random.default_rng(0)
>>> x = tf.constant(rng.normal(size=(2, 5, 5, 8)), tf.float32)
>>> k = tf.constant(rng.normal(size=(3, 3, 8, 4)), tf.float32)
>>> with tf.GradientTape(persistent=True) as tape:
...     tape.watch(x)
...     ours, theirs = conv2d(x, k, padding="SAME"), tf.nn.conv2d(x, k, 1, "SAME")
>>> bool(tf.reduce_all(ours == theirs))
True
>>> gap = tape.gradient(ours, x) - tape.gradient(theirs, x)
>>> bool(tf.reduce_max(tf.abs(gap)) < 1e-4)
True
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from ._conv_args import _Padding, _pairs, _stride
from .winograd import TILES, _is_tile, winograd_applies, winograd_conv2d, winograd_pays

__all__ = ["MAX_EXTRA_WORK", "MIN_CHANNELS", "MIN_KERNEL_PER_OUTPUT", "MIN_POINTWISE_PER_OUTPUT",
           "conv2d",
           "forward_input_gradients", "forward_input_gradients_active", "transpose",
           "winograd_tile"]

# Fewest input channels (the transposed convolution's output channels) for which conv2d uses
# the forward convolution: Eigen's forward convolution with few output channels is slower than
# its Conv2DBackpropInput (one thread, float32, 3x3, 1,152 images: 16 -> 16 channels 2.4x faster
# at 14x14 and 1.3x at 28x28; 8 -> 1 channel 2.1x slower).
MIN_CHANNELS = 8
# Most the forward convolution may compute over what TensorFlow's transpose does: the
# transposed convolution visits every input position (H x W) where the native one scatters from
# the output's (Ho x Wo); "same" is 1, "valid" (H / (H - k + 1))^2: 1.14 for a 3x3 kernel on
# 32x32, 25 for a 5x5 kernel on a 5x5 map (CleverHans's tutorial CNN's last convolution, where
# the forward convolution made a PGD-10 pass 7% slower).
MAX_EXTRA_WORK = 1.25
# Fewest kernel entries (kh kw Cin Cout) per output position (Ho Wo) of a strided convolution
# whose input gradient conv2d computes by stride phases. Eigen's Conv2DBackpropInput is one
# matrix product per shard of images into a column buffer, the shards sized to a fixed working
# set that the kernel shares: a large kernel over a small map leaves products of few rows, and
# it falls from ~60 to 10-30 GFLOP/s, where the phases' convolutions keep ~40-50 (overhead
# included: the interleave and crop are copies of the input gradient). Measured on this
# project's 2-core AVX2 CPU, one thread, batch 128-256, 23 shapes
# (docs/benchmarks/training.md, "Strided convolutions"): every shape with 11.8k entries per
# position or more ran 0.26-0.88x TensorFlow's time, every shape at 7.2k or fewer 0.98-2.1x
# but one (a 4x4 kernel at 2k, 0.81x; missed, the safe side).
MIN_KERNEL_PER_OUTPUT = 8192
# Fewest kernel entries (Cin Cout) per output position of a strided 1x1 convolution (a ResNet's
# projection shortcut) whose input gradient conv2d computes as one 1x1 convolution and a zero
# interleave (transpose's pointwise form), when the input's size is a multiple of the stride (no
# crop: with one the copies cost 1.8-2.1x TensorFlow's time). Measured like
# MIN_KERNEL_PER_OUTPUT (one thread, float32, batch 128, 13 shapes in two runs,
# docs/benchmarks/training.md, "Strided 1x1 convolutions"): every shape at 2048 entries per
# position or more ran 0.15-0.69x TensorFlow's time (WRN-28-10's group 3 shortcut, 3.2k:
# 0.67-0.69x); below, 0.80-1.05x but one (800 at an 8x8 output, 0.63x; missed, the safe side;
# 800 at 16x16 ran 1.00x, and WRN's group 2 shortcut, 200, 0.95-1.05x).
MIN_POINTWISE_PER_OUTPUT = 2048

def transpose(a: tf.Tensor, kernel: tf.Tensor, padding: _Padding = "SAME", strides: Any = 1,
              input_size: Any = None) -> tf.Tensor:
    """The transpose of the undilated convolution ``tf.nn.conv2d(x, kernel, strides, padding)``
    applied to ``a``, by forward convolutions with the flipped kernel: one at stride 1; at a
    stride ``s``, one per stride phase (the input rows ``s j + p`` receive only the kernel rows
    ``p, p + s, ...``; likewise columns), interleaved by ``depth_to_space``. Each phase is a
    stride-1 convolution with ``ceil((k - p) / s)`` taps a side, so the phases together do the
    kernel's ``k x k`` multiply-adds per output position, as the transpose does; a phase without
    taps (``k < s``) is zeros.

    Args:
        a: ``[N, Ho, Wo, Cout]`` (an output gradient, or CROWN's linear coefficients).
        kernel: ``[kh, kw, Cin, Cout]``, the convolution's kernel, same dtype as ``a``.
        padding: the convolution's: ``"SAME"``, ``"VALID"`` or explicit
            ``[[top, bottom], [left, right]]`` (or the NHWC four pairs), each at most ``k - 1``.
        strides: the convolution's stride, the same along both axes: an int, ``[s, s]`` or
            ``[1, s, s, 1]``.
        input_size: ``(H, W)``, the convolution's input size; required at a stride > 1 (several
            sizes give the same output size there), implied by ``a`` at stride 1.

    Returns:
        ``[N, H, W, Cin]`` (at stride 1 ``H = Ho - top - bottom + kh - 1``), equal to
        ``Conv2DBackpropInput`` to float rounding.

    Example:
        >>> a = tf.ones([1, 4, 4, 2]); k = tf.ones([3, 3, 5, 2])
        >>> transpose(a, k, "VALID").shape  # the input of a 6x6 -> 4x4 convolution
        TensorShape([1, 6, 6, 5])
        >>> transpose(a, k, "SAME", strides=2, input_size=(8, 7)).shape  # 8x7 -> 4x4
        TensorShape([1, 8, 7, 5])
    """
    kh, kw = int(kernel.shape[0]), int(kernel.shape[1])
    stride = _stride(strides)
    if stride is None:
        raise ValueError(f"strides must be one positive stride for both axes (an int, [s, s] or "
                         f"[1, s, s, 1]), got {strides!r}")
    size: tuple[int, int] | None = None
    if input_size is not None:
        dims = tuple(int(n) for n in input_size)
        if len(dims) != 2 or min(dims) < 1:
            raise ValueError(f"input_size must be two positive ints (H, W), got {input_size!r}")
        size = (dims[0], dims[1])
    elif stride > 1:
        raise ValueError(f"input_size (H, W) is required at stride {stride}, got None")
    pads = _pairs(padding, kh, kw, stride, size)
    if pads is None:
        raise ValueError(f"padding must be 'SAME', 'VALID' or explicit pairs, got {padding!r}")
    (top, bottom), (left, right) = pads
    if not (0 <= top < kh and 0 <= bottom < kh and 0 <= left < kw and 0 <= right < kw):
        raise ValueError(f"padding must be between 0 and the kernel size - 1 "
                         f"({kh - 1}, {kw - 1}) on each side, got {pads}")
    if stride == 1:
        flipped = tf.transpose(kernel[::-1, ::-1], [0, 1, 3, 2])
        if isinstance(padding, str) and padding.upper() == "SAME" and kh % 2 and kw % 2:
            return tf.nn.conv2d(a, flipped, 1, "SAME")  # symmetric: the same padding
        full = [[0, 0], [kh - 1 - top, kh - 1 - bottom], [kw - 1 - left, kw - 1 - right], [0, 0]]
        if all(p == 0 for pair in full for p in pair):
            return tf.nn.conv2d(a, flipped, 1, "VALID")
        return tf.nn.conv2d(a, flipped, 1, full)
    assert size is not None  # required above at a stride
    if kh == 1 and kw == 1:
        return _pointwise(a, kernel, stride, size)
    return _phases(a, kernel, stride, pads, size)


def _pointwise(a: tf.Tensor, kernel: tf.Tensor, s: int, size: tuple[int, int]) -> tf.Tensor:
    """:func:`transpose` of a 1x1 convolution at stride ``s > 1`` (its padding is zero: "SAME"
    pads ``(ceil(H / s) - 1) s + 1 - H <= 0``): the convolution reads the input rows and
    columns ``s j``, so the gradient is ``a`` times the transposed kernel there and zero
    elsewhere -- one 1x1 convolution over the output's positions, then a zero interleave (one
    ``tf.pad`` of a ``[N, Ho, 1, Wo, 1, Cin]`` view to ``[N, Ho, s, Wo, s, Cin]``) cropped to
    ``size``. The phases' form computes the same with ``s^2 - 1`` zero phases, a stack and a
    ``depth_to_space``: three copies of the input gradient where this makes one."""
    n, ho, wo = tf.shape(a)[0], int(a.shape[1]), int(a.shape[2])
    cin = int(kernel.shape[2])
    g = tf.nn.conv2d(a, tf.transpose(kernel, [0, 1, 3, 2]), 1, "VALID")  # [N, Ho, Wo, Cin]
    g = tf.pad(tf.reshape(g, tf.stack([n, ho, 1, wo, 1, cin])),
               [[0, 0], [0, 0], [0, s - 1], [0, 0], [0, s - 1], [0, 0]])
    g = tf.reshape(g, tf.stack([n, ho * s, wo * s, cin]))
    if ho * s == size[0] and wo * s == size[1]:
        return g
    return g[:, :size[0], :size[1]]


def _phases(a: tf.Tensor, kernel: tf.Tensor, s: int, pads: list[list[int]],
            size: tuple[int, int]) -> tf.Tensor:
    """:func:`transpose` at stride ``s > 1``: the gradient with respect to the padded input,
    row ``s j + p`` = ``sum_u a[j - u] kernel[p + s u]``, is for each phase ``p`` a stride-1
    "full" convolution of ``a`` with that phase's taps reversed; ``J = ceil(padded size / s)``
    rows per phase, interleaved, then the padding cropped."""
    kh, kw = int(kernel.shape[0]), int(kernel.shape[1])
    (top, bottom), (left, right) = pads
    h, w = int(a.shape[1]), int(a.shape[2])
    rows, cols = -(-(size[0] + top + bottom) // s), -(-(size[1] + left + right) // s)
    swapped = tf.transpose(kernel, [0, 1, 3, 2])  # [kh, kw, Cout, Cin]
    n, cin = tf.shape(a)[0], int(kernel.shape[2])
    outs = []
    for p in range(s):
        taps_h = len(range(p, kh, s))
        for q in range(s):
            taps_w = len(range(q, kw, s))
            if taps_h == 0 or taps_w == 0:
                outs.append(tf.zeros(tf.stack([n, rows, cols, cin]), a.dtype))
                continue
            phase = swapped[p::s, q::s][::-1, ::-1]
            full = [[0, 0], [taps_h - 1, rows - h], [taps_w - 1, cols - w], [0, 0]]
            if all(v == 0 for pair in full for v in pair):
                outs.append(tf.nn.conv2d(a, phase, 1, "VALID"))
            else:
                outs.append(tf.nn.conv2d(a, phase, 1, full))
    y = tf.nn.depth_to_space(tf.reshape(tf.stack(outs, axis=3), tf.stack([n, rows, cols,
                                                                          s * s * cin])), s)
    return y[:, top:top + size[0], left:left + size[1]]


def _uses_forward(x: tf.Tensor, kernel: tf.Tensor, strides: Any, padding: _Padding,
                  dilations: Any) -> bool:
    """Whether :func:`conv2d` gives this convolution the forward-convolution input gradient."""
    if x.shape.rank != 4 or kernel.shape.rank != 4 or not kernel.shape.is_fully_defined():
        return False
    if x.shape[-1] is None or int(x.shape[-1]) != int(kernel.shape[2]):  # groups
        return False
    stride = _stride(strides)
    if stride is None or _stride(dilations) != 1:
        return False
    if int(kernel.shape[2]) < MIN_CHANNELS:
        return False
    kh, kw = int(kernel.shape[0]), int(kernel.shape[1])
    h, w = x.shape[1], x.shape[2]
    size = None if h is None or w is None else (int(h), int(w))
    pads = _pairs(padding, kh, kw, stride, size)
    if pads is None or not all(0 <= p < k for pair, k in zip(pads, (kh, kw)) for p in pair):
        return False
    (top, bottom), (left, right) = pads
    if stride > 1:
        if size is None:
            return False
        ho = (size[0] + top + bottom - kh) // stride + 1
        wo = (size[1] + left + right - kw) // stride + 1
        entries = kh * kw * int(kernel.shape[2]) * int(kernel.shape[3])
        if ho < 1 or wo < 1:
            return False
        if (kh == 1 and kw == 1 and size[0] % stride == 0 and size[1] % stride == 0
                and entries >= MIN_POINTWISE_PER_OUTPUT * ho * wo):
            return True
        return entries >= MIN_KERNEL_PER_OUTPUT * ho * wo
    if top + bottom == kh - 1 and left + right == kw - 1:  # output size = input size
        return True
    if size is None:
        return False
    ho, wo = size[0] + top + bottom - kh + 1, size[1] + left + right - kw + 1
    return ho > 0 and wo > 0 and size[0] * size[1] <= MAX_EXTRA_WORK * ho * wo


def _after(t: tf.Tensor, dy: tf.Tensor) -> tf.Tensor:
    """``t`` made to depend on ``dy`` by data (plus a zero computed from one element of ``dy``;
    ``b and not b`` is False for any ``b``, NaN included), so that the flipped kernel is computed
    when the gradient arrives. Without it the flip depends on the kernel alone, and inside a
    ``tf.while_loop`` (an attack's steps, ten iterations in flight) the executor computes the
    flips of later iterations ahead: +1.5 GiB for a PGD-10 step of WRN-28-10 (each flip is the
    size of its kernel). A control dependency can be pruned by graph optimisations."""
    flag = tf.cast(tf.reshape(dy, [-1])[:1], tf.bool)
    return t + tf.cast(tf.reduce_any(tf.logical_and(flag, tf.logical_not(flag))), t.dtype)


def _make(padding: _Padding, stride: int, size: tuple[int, int] | None) -> Any:
    """The custom-gradient convolution for one padding, stride and input size (H, W)."""
    tf_padding = padding.upper() if isinstance(padding, str) else padding
    strides = [1, stride, stride, 1]

    @tf.custom_gradient
    def conv(x, kernel):
        y = tf.nn.conv2d(x, kernel, strides, tf_padding)

        def grad(dy):
            dx = transpose(dy, _after(kernel, dy), tf_padding, stride, size)
            dk = tf.raw_ops.Conv2DBackpropFilter(
                input=x, filter_sizes=tf.shape(kernel), out_backprop=dy,
                strides=strides, **_raw_padding(tf_padding))
            return dx, dk

        return y, grad

    return conv


def _raw_padding(padding: _Padding) -> dict:
    """``Conv2DBackpropFilter``'s padding arguments for :func:`conv2d`'s padding (a string, or
    the four NHWC pairs it normalised explicit padding to)."""
    if isinstance(padding, str):
        return {"padding": padding}
    return {"padding": "EXPLICIT", "explicit_paddings": [int(p) for pair in padding for p in pair]}


def conv2d(x: Any, kernel: Any, strides: Any = 1, padding: _Padding = "VALID",
           dilations: Any = 1, winograd: int | None = None) -> tf.Tensor:
    """``tf.nn.conv2d(x, kernel, strides, padding, dilations=dilations)`` (NHWC) whose input
    gradient, for an undilated convolution with at least :data:`MIN_CHANNELS` input channels
    (at stride 1 and "valid", at most :data:`MAX_EXTRA_WORK` times the positions to visit; at a
    stride, at least :data:`MIN_KERNEL_PER_OUTPUT` kernel entries per output position, or
    :data:`MIN_POINTWISE_PER_OUTPUT` for 1x1 on a size that is a multiple of the stride), is
    :func:`transpose`'s forward convolution(s) (up to 3x as fast as TensorFlow's
    ``Conv2DBackpropInput`` on Eigen's CPU kernels). The value is TensorFlow's, bit for bit;
    the gradients equal TensorFlow's to float rounding (the kernel gradient is TensorFlow's
    own op). Other strides, dilations, grouped kernels and small inputs fall back to
    ``tf.nn.convolution`` (as Keras calls it) and its gradients.

    With ``winograd`` (an output tile size of :data:`robustgrad.winograd.TILES`), a stride-1
    3x3 "same" convolution wide enough to pay (:func:`robustgrad.winograd.winograd_pays`) is
    :func:`robustgrad.winograd.winograd_conv2d` instead: faster on CPUs, equal to
    TensorFlow's to float rounding only (~1e-5 of the largest output with tile 4, float32).

    Args:
        x: ``[N, H, W, Cin]`` float tensor.
        kernel: ``[kh, kw, Cin, Cout]``, the same dtype.
        strides, padding, dilations: as ``tf.nn.conv2d``'s (padding ``"SAME"``, ``"VALID"``
            or explicit pairs).
        winograd: None (TensorFlow's convolution), or 2 or 4: Winograd's tile where it pays.

    Returns:
        ``[N, Ho, Wo, Cout]``, ``tf.nn.conv2d``'s result.

    Example:
        >>> x = tf.ones([1, 4, 4, 8]); k = tf.ones([3, 3, 8, 2])
        >>> with tf.GradientTape() as tape:
        ...     tape.watch(x); y = tf.reduce_sum(conv2d(x, k, padding="SAME"))
        >>> g = tape.gradient(y, x)  # outputs that read a pixel x output channels
        >>> float(g[0, 0, 0, 0]), float(g[0, 1, 1, 0])
        (8.0, 18.0)
    """
    if winograd is not None and not _is_tile(winograd):
        raise ValueError(f"winograd must be None or one of {TILES}; got {winograd!r}")
    x, kernel = tf.convert_to_tensor(x), tf.convert_to_tensor(kernel)
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID"):
            raise ValueError(f"padding must be 'SAME', 'VALID' or explicit pairs, got {padding!r}")
        padding = padding.upper()
    else:
        padding = [list(map(int, p)) for p in padding]
        if len(padding) == 2:  # [[top, bottom], [left, right]] -> NHWC
            padding = [[0, 0], *padding, [0, 0]]
    if (winograd is not None and winograd_applies(x, kernel, strides, padding, dilations)
            and winograd_pays(x, kernel)):
        return winograd_conv2d(x, kernel, winograd)
    if _uses_forward(x, kernel, strides, padding, dilations):
        size = None if x.shape[1] is None or x.shape[2] is None else \
            (int(x.shape[1]), int(x.shape[2]))
        return _make(padding, _stride(strides) or 1, size)(x, kernel)
    if isinstance(padding, str):  # dilations by space-to-batch where the CPU kernel has none
        return tf.nn.convolution(x, kernel, strides, padding, dilations=dilations)
    return tf.nn.conv2d(x, kernel, strides, padding, dilations=dilations)


# ------------------------------------------------------------------ Keras Conv2D layers

_LOCK = threading.Lock()
_DEPTH = [0]
_ORIGINAL: list[Any] = []
_TILES = threading.local()  # .stack: this thread's winograd settings, innermost last


def winograd_tile() -> int | None:
    """The Winograd tile :func:`forward_input_gradients` set for this thread (None: none, or
    outside any scope): what Keras ``Conv2D`` layers traced now take. Code that caches traced
    functions keys them by it (``attacks``' compiled loops do), so a trace made in a training
    step is not reused by an evaluation outside it."""
    stack = getattr(_TILES, "stack", None)
    return stack[-1] if stack else None


def _keras_convolution_op(layer: Any, inputs: Any, kernel: Any) -> Any:
    """``Conv2D.convolution_op`` while :func:`forward_input_gradients` is active: :func:`conv2d`
    for a channels-last, ungrouped 2-D convolution, Keras' own operation otherwise."""
    if (layer.rank == 2 and layer.data_format == "channels_last"
            and getattr(layer, "groups", 1) == 1 and layer.padding in ("same", "valid")):
        return conv2d(inputs, kernel, list(layer.strides), layer.padding.upper(),
                      list(layer.dilation_rate), winograd=winograd_tile())
    return _ORIGINAL[0](layer, inputs, kernel)


@contextlib.contextmanager
def forward_input_gradients(winograd: int | None | str = "inherit") -> Iterator[None]:
    """While active, Keras ``Conv2D`` layers (and subclasses that do not override
    ``convolution_op``) compute with :func:`conv2d`: same outputs, the input gradient by a
    forward convolution. With ``winograd`` (2 or 4), the layers this thread calls take
    :func:`conv2d`'s Winograd path where it pays: outputs equal to float rounding, not bit for
    bit (``AdversarialTrainer``'s training step enters it so on CPU hosts); None: TensorFlow's
    convolution; ``"inherit"`` (default): the enclosing scope's setting in this thread (None
    outside any), so an attack traced inside a training step keeps the step's setting. Enter
    it around the tracing of a ``tf.function`` (the attack engine and ``AdversarialTrainer``
    do) and the traced graph keeps the faster gradient; nothing about the layers changes
    (their class, weights, config and saved files stay Keras').

    Re-entrant and shared by threads: the first entry installs the method on
    ``keras.layers.Conv2D``, the last exit restores Keras' own. A Conv2D layer another thread
    calls meanwhile computes the same values (its gradient differs from TensorFlow's in the
    last bits). Layers that call ``tf.nn.conv2d`` themselves are not changed; use
    :func:`conv2d` there.

    Example:
        >>> layer = keras.layers.Conv2D(8, 3, padding="same")
        >>> x = tf.ones([1, 6, 6, 8])
        >>> with forward_input_gradients():
        ...     y = layer(x)
        >>> bool(tf.reduce_all(y == layer(x)))
        True
    """
    if winograd == "inherit":
        winograd = winograd_tile()
    elif winograd is not None and not _is_tile(winograd):
        raise ValueError(f"winograd must be None, 'inherit' or one of {TILES}; "
                         f"got {winograd!r}")
    stack = getattr(_TILES, "stack", None)
    if stack is None:
        stack = _TILES.stack = []
    with _LOCK:
        if _DEPTH[0] == 0:
            _ORIGINAL[:] = [keras.layers.Conv2D.convolution_op,
                            keras.layers.Conv2D.__dict__.get("convolution_op")]
            keras.layers.Conv2D.convolution_op = _keras_convolution_op
        _DEPTH[0] += 1
    stack.append(winograd)
    try:
        yield
    finally:
        stack.pop()
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                if _ORIGINAL[1] is None:  # inherited (Keras' BaseConv): inherit it again
                    del keras.layers.Conv2D.convolution_op
                else:
                    keras.layers.Conv2D.convolution_op = _ORIGINAL[1]
                _ORIGINAL[:] = []


def forward_input_gradients_active() -> bool:
    """Whether :func:`forward_input_gradients` is active (in any thread)."""
    return _DEPTH[0] > 0

