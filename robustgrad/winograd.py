"""3x3 convolutions by Winograd's minimal filtering, compiled by XLA (CPU training steps).

A stride-1 3x3 convolution computes ``m x m`` outputs of a channel from an ``(m + 2) x (m + 2)``
input tile with ``(m + 2)^2`` products per (input, output) channel pair instead of ``9 m^2``
(Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016):
``Y = A^T [(G K G^T) * (B^T D B)] A`` per tile, the products summed over input channels as one
matrix product per tile position. F(2x2, 3x3) (``tile=2``) does 16 products where direct
convolution does 36 (2.25x fewer); F(4x4, 3x3) (``tile=4``) 36 where direct does 144 (4x).
The transforms are sums of shifted slices; XLA fuses them and runs the products with
kernels compiled for the host CPU (TensorFlow's pip build runs its own convolutions on Eigen
kernels built without AVX2/FMA), so on a 2-core AVX2 CPU at batch 128 WideResNet-28-10's 3x3
convolutions take 0.42-0.65x TensorFlow's forward time and 0.43-0.72x its input-gradient time with
``tile=4`` (docs/benchmarks/training.md, "Winograd"). Narrow layers lose (the transforms' copies
outweigh the products saved): :func:`winograd_pays` is the measured rule.

The result is the convolution's to float rounding, in another order: in float32 the largest
difference from ``tf.nn.conv2d`` is ~1e-6 of the output's largest entry with ``tile=2`` and
~1e-5 to 3e-5 with ``tile=4`` (the transforms' entries reach 8 and 1/24); float64 agrees to
~1e-14. That is the accuracy GPU libraries trade by default for speed (cuDNN's Winograd
algorithms; TF32 convolutions, ~1e-3), and it is why :mod:`robustgrad.convolution` uses it
only where it is asked for (``AdversarialTrainer``'s update, see
:func:`robustgrad.convolution.forward_input_gradients`), never in attacks, evaluation or bounds.

- :func:`winograd_conv2d` -- ``tf.nn.conv2d(x, kernel, 1, "SAME")`` for a 3x3 kernel, by
  Winograd, with gradients: the input gradient is the same algorithm on the output gradient
  with the kernel flipped and its channels swapped (a stride-1 "same" convolution's transpose),
  the kernel gradient TensorFlow's ``Conv2DBackpropFilter``.
- :func:`winograd_applies` -- whether a convolution is one :func:`winograd_conv2d` computes.

>>> import numpy as np, tensorflow as tf
>>> rng = np.random.default_rng(0)
>>> x = tf.constant(rng.normal(size=(2, 6, 6, 4)))  # float64
>>> k = tf.constant(rng.normal(size=(3, 3, 4, 5)))
>>> gap = winograd_conv2d(x, k) - tf.nn.conv2d(x, k, 1, "SAME")
>>> bool(tf.reduce_max(tf.abs(gap)) < 1e-12)
True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from ._conv_args import _pairs, _stride  # as robustgrad.convolution reads them

__all__ = ["MIN_WIDTH", "TILES", "winograd_applies", "winograd_conv2d", "winograd_pays"]

# (B^T, G, A^T) of F(m x m, 3 x 3) for the output tile sizes m: interpolation points 0, 1, -1
# (m = 2) and 0, 1, -1, 2, -2 (m = 4), plus the point at infinity (Lavin and Gray 2016).
_MATRICES: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64),
        np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)),
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]], np.float64)),
}
TILES = tuple(sorted(_MATRICES))
"""The output tile sizes ``m`` :func:`winograd_conv2d` supports: F(2x2, 3x3) and F(4x4, 3x3)."""

_DTYPES = (tf.float32, tf.float64)

# Fewest ``Cin Cout / (Cin + Cout)`` (half the harmonic mean of the channel counts) for which
# winograd_pays: the products saved grow with Cin Cout, the transforms' copies with Cin + Cout.
# Measured with tile 4 against robustgrad.convolution.conv2d (TensorFlow's forward convolution,
# Eigen; the input gradient by a forward convolution), forward and input gradient, float32, one
# thread, batch 128, "same" 3x3 (2-core AVX2 AMD EPYC, 2026-12-05, docs/benchmarks/training.md,
# "Winograd"): 32x32 160 -> 160 (80) 0.65x / 0.72x, 16x16 320 (160) 0.45x / 0.47x, 8x8 640 (320)
# 0.42x / 0.43x, 16x16 128 (64) 0.85x / 0.84x, 8x8 256 (128) 0.49x / 0.56x, 4x4 512 (256)
# 0.84x / 0.48x; slower at 32x32 64 -> 64 (32: 1.76x / 1.19x) and 16 -> 160 (14.5: 1.9x / 3.1x).
MIN_WIDTH = 64


def _is_tile(value: Any) -> bool:
    """Whether ``value`` is one of :data:`TILES` (a bool is not, though ``True == 1``)."""
    return not isinstance(value, bool) and value in _MATRICES


def _combine(parts: list[tf.Tensor], coefficients: np.ndarray) -> tf.Tensor:
    """``sum_i coefficients[i] * parts[i]`` without the zero terms and the unit products."""
    total = None
    for c, part in zip(coefficients, parts):
        if c == 0:
            continue
        term = part if c == 1 else -part if c == -1 else part * float(c)
        total = term if total is None else total + term
    assert total is not None  # every row of the transforms has a non-zero entry
    return total


def _same(x: tf.Tensor, kernel: tf.Tensor, tile: int, transposed: bool) -> tf.Tensor:
    """The "same" 3x3 convolution of ``x [N, H, W, Cin]`` by Winograd F(tile, 3); with
    ``transposed``, by the kernel flipped spatially with its channels swapped (the input
    gradient of the convolution by ``kernel``)."""
    bt, g, at = _MATRICES[tile]
    a = tile + 2
    if transposed:
        kernel = tf.transpose(tf.reverse(kernel, [0, 1]), [0, 1, 3, 2])
    h, w, cin = int(x.shape[1]), int(x.shape[2]), int(x.shape[3])
    cout = int(kernel.shape[3])
    n = tf.shape(x)[0]
    th, tw = -(-h // tile), -(-w // tile)
    # one row/column of zeros before (the "same" padding), after: up to whole tiles plus one
    xp = tf.pad(x, [[0, 0], [1, th * tile + 1 - h], [1, tw * tile + 1 - w], [0, 0]])
    # input transform B^T D B, rows then columns: a * a maps [N, th, tw, Cin]
    rows = [xp[:, r:r + tile * (th - 1) + 1:tile] for r in range(a)]
    tiles: list[tf.Tensor] = []
    for row in (_combine(rows, bt[i]) for i in range(a)):
        cols = [row[:, :, s:s + tile * (tw - 1) + 1:tile] for s in range(a)]
        tiles.extend(_combine(cols, bt[j]) for j in range(a))
    v = tf.reshape(tf.stack(tiles), [a * a, -1, cin])
    gk = tf.constant(g, kernel.dtype)
    u = tf.reshape(tf.einsum("ai,ijco,bj->abco", gk, kernel, gk), [a * a, cin, cout])
    m = tf.reshape(tf.matmul(v, u), tf.stack([a, a, n, th, tw, cout]))
    # output transform A^T M A, then the m x m outputs of each tile put in place
    first = [m[i] for i in range(a)]
    outs: list[tf.Tensor] = []
    for p in range(tile):
        row = _combine(first, at[p])
        second = [row[j] for j in range(a)]
        outs.extend(_combine(second, at[q]) for q in range(tile))
    y = tf.nn.depth_to_space(tf.concat(outs, axis=-1), tile)
    return y[:, :h, :w]


_compiled = tf.function(_same, jit_compile=True, autograph=False)


def winograd_applies(x: Any, kernel: Any, strides: Any = 1, padding: Any = "SAME",
                     dilations: Any = 1) -> bool:
    """Whether :func:`winograd_conv2d` computes ``tf.nn.conv2d(x, kernel, strides, padding,
    dilations=dilations)``: a ``[3, 3, Cin, Cout]`` kernel of ``x``'s channels (no groups),
    stride 1, no dilation, "same" padding (or explicit ``[[1, 1], [1, 1]]``), float32 or
    float64, the input's height and width known when traced.

    >>> winograd_applies(tf.zeros([1, 8, 8, 4]), tf.zeros([3, 3, 4, 4]))
    True
    >>> winograd_applies(tf.zeros([1, 8, 8, 4]), tf.zeros([3, 3, 4, 4]), strides=2)
    False
    """
    try:
        shape, kshape = tf.TensorShape(x.shape), tf.TensorShape(kernel.shape)
        dtype, kdtype = tf.as_dtype(x.dtype), tf.as_dtype(kernel.dtype)
    except (AttributeError, TypeError, ValueError):
        return False
    if shape.rank != 4 or kshape.rank != 4:
        return False
    if not kshape.is_fully_defined() or None in (shape[1], shape[2], shape[3]):
        return False
    if tuple(kshape[:2]) != (3, 3) or int(kshape[2]) != int(shape[3]):
        return False
    if dtype not in _DTYPES or kdtype != dtype:
        return False
    if _stride(strides) != 1 or _stride(dilations) != 1:
        return False
    return _pairs(padding, 3, 3) == [[1, 1], [1, 1]]


def winograd_pays(x: Any, kernel: Any) -> bool:
    """Whether :func:`winograd_conv2d` is expected to be faster than TensorFlow's convolution
    on a CPU for this convolution: it :func:`winograd_applies` (the caller checked strides,
    padding and dilations) and ``Cin Cout / (Cin + Cout) >= MIN_WIDTH``.

    >>> winograd_pays(tf.zeros([1, 8, 8, 256]), tf.zeros([3, 3, 256, 256]))
    True
    >>> winograd_pays(tf.zeros([1, 8, 8, 64]), tf.zeros([3, 3, 64, 64]))
    False
    """
    if not winograd_applies(x, kernel):
        return False
    cin, cout = int(kernel.shape[2]), int(kernel.shape[3])
    return cin * cout >= MIN_WIDTH * (cin + cout)


def winograd_conv2d(x: Any, kernel: Any, tile: int = 4) -> tf.Tensor:
    """``tf.nn.conv2d(x, kernel, 1, "SAME")`` for a 3x3 kernel by Winograd F(tile x tile, 3x3)
    (Lavin and Gray 2016), compiled by XLA, with gradients (module doc: accuracy and speed).

    Args:
        x: ``[N, H, W, Cin]`` float32 or float64 (H, W known when traced; N may vary).
        kernel: ``[3, 3, Cin, Cout]``, ``x``'s dtype.
        tile: output tile size, one of :data:`TILES` (4: F(4x4, 3x3), fewer products, ~1e-5
            of the largest output in float32; 2: F(2x2, 3x3), ~1e-6).

    Returns:
        ``[N, H, W, Cout]``. Gradients: the input gradient by the same algorithm (the kernel
        flipped, its channels swapped), the kernel gradient TensorFlow's
        ``Conv2DBackpropFilter``; both differentiable again (nested tapes).

    Raises:
        ValueError: ``tile`` not in :data:`TILES`, or a convolution :func:`winograd_applies`
            refuses (say why: kernel, channels, dtype, unknown size).

    Example:
        >>> x = tf.ones([1, 4, 4, 2]); k = tf.ones([3, 3, 2, 1])
        >>> y = winograd_conv2d(x, k, tile=2)
        >>> float(tf.round(y[0, 0, 0, 0])), float(tf.round(y[0, 1, 1, 0]))
        (8.0, 18.0)
    """
    if not _is_tile(tile):
        raise ValueError(f"tile must be one of {TILES}; got {tile!r}")
    x, kernel = tf.convert_to_tensor(x), tf.convert_to_tensor(kernel)
    if not winograd_applies(x, kernel):
        raise ValueError(
            "winograd_conv2d computes a 3x3 'same' convolution of float32/float64 NHWC inputs "
            f"with known height and width and a [3, 3, Cin, Cout] kernel of the input's "
            f"channels and dtype; got x {x.shape} {x.dtype.name}, kernel {kernel.shape} "
            f"{kernel.dtype.name}")
    return _winograd(tile)(x, kernel)


def _winograd(tile: int) -> Any:
    @tf.custom_gradient
    def conv(x, kernel):
        y = _compiled(x, kernel, tile, False)

        def grad(dy):
            dx = _compiled(dy, kernel, tile, True)
            dk = tf.raw_ops.Conv2DBackpropFilter(
                input=x, filter_sizes=tf.shape(kernel), out_backprop=dy,
                strides=[1, 1, 1, 1], padding="SAME")
            return dx, dk

        return y, grad

    return conv
