"""How :mod:`robustgrad.convolution` and :mod:`robustgrad.winograd` read a convolution's
``strides`` and ``padding`` arguments: one parser for both (each module imports it; neither
imports the other for it). Pure Python, no TensorFlow."""

from __future__ import annotations

from typing import Any

_Padding = Any  # "SAME", "VALID" or [[top, bottom], [left, right]]


def _stride(strides: Any) -> int | None:
    """The stride of ``strides`` (an int, ``[sh, sw]`` or NHWC ``[1, sh, sw, 1]``) when it is
    the same along both spatial axes, else None."""
    vals = [strides] if isinstance(strides, int) else [int(s) for s in strides]
    if len(vals) == 4:
        if vals[0] != 1 or vals[3] != 1:
            return None
        vals = vals[1:3]
    if len(vals) == 1:
        vals = vals * 2
    if len(vals) != 2 or vals[0] != vals[1] or vals[0] < 1:
        return None
    return int(vals[0])


def _pairs(padding: _Padding, kh: int, kw: int, stride: int = 1,
           size: tuple[int, int] | None = None) -> list[list[int]] | None:
    """``padding`` as ``[[top, bottom], [left, right]]`` of a convolution with this stride, or
    None for a string this module does not handle (or "SAME" at a stride > 1 without the input's
    ``size``). ``"SAME"`` pads ``max((ceil(H / s) - 1) s + k - H, 0)`` in all, the smaller half
    on top/left (TensorFlow's rule; ``k - 1`` at stride 1, whatever the size)."""
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return [[0, 0], [0, 0]]
        if mode != "SAME":
            return None
        if stride == 1:
            totals = [kh - 1, kw - 1]
        elif size is None:
            return None
        else:
            totals = [max((-(-n // stride) - 1) * stride + k - n, 0)
                      for n, k in zip(size, (kh, kw))]
        return [[t // 2, t - t // 2] for t in totals]
    pads = [list(map(int, p)) for p in padding]
    if len(pads) == 4:  # NHWC explicit: batch and channel pairs must be zero
        if pads[0] != [0, 0] or pads[3] != [0, 0]:
            return None
        pads = pads[1:3]
    return pads if len(pads) == 2 else None
