"""Gradient monitoring: summary statistics of a gradient list and ``tf.summary`` writers.

    >>> import tensorflow as tf
    >>> from robustgrad import monitor
    >>> w, b = tf.Variable([[3.0], [4.0]], name="w"), tf.Variable([0.0], name="b")
    >>> stats = monitor.gradient_stats([tf.constant([[3.0], [4.0]]), None], [w, b])
    >>> float(stats["global_norm"]), float(stats["norms"]["w"]), stats["none"]
    (5.0, 5.0, ('b',))

Works eagerly and inside ``tf.function`` (``none`` and the keys of ``norms`` are Python values fixed
at trace time; everything else is a tensor).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

__all__ = ["gradient_stats", "variable_names", "write_gradient_summaries"]


def variable_names(variables: Sequence[Any]) -> list[str]:
    """Unique display names: Keras 3 ``path`` (``"sequential/dense/kernel"``), else a tf.Variable's
    name without ``":0"``, else ``"var_<i>"``; duplicates get ``"_1"``, ``"_2"``... suffixes."""
    names: list[str] = []
    seen: dict[str, int] = {}
    for i, v in enumerate(variables):
        name = getattr(v, "path", None)
        if not isinstance(name, str) or not name:
            name = getattr(v, "name", None)
            if isinstance(name, str) and name.endswith(":0"):
                name = name[:-2]
        if not isinstance(name, str) or not name:
            name = f"var_{i}"
        if name in seen:
            seen[name] += 1
            name = f"{name}_{seen[name]}"
        else:
            seen[name] = 0
        names.append(name)
    return names


def gradient_stats(grads: Sequence[Any], variables: Sequence[Any]) -> dict[str, Any]:
    """Summarise gradients aligned with ``variables``.

    Args:
        grads: list of gradient tensors (``tf.IndexedSlices`` are densified), ``None`` allowed.
        variables: list of the same length (Keras 3 or tf variables, or anything with a name).

    Returns a dict:
        ``global_norm``: float32 scalar, ``sqrt(sum ||g||^2)`` over the non-None gradients
            (non-finite if any element is).
        ``norms``: dict ``name -> float32 scalar`` L2 norm per variable with a gradient.
        ``nonfinite_count``: int64 scalar, number of NaN/Inf elements over all gradients.
        ``max_abs``: float32 scalar, largest ``|g|`` over the finite elements (0 if none).
        ``none``: tuple of the names whose gradient is ``None`` (not silently skipped).
    """
    grads, variables = list(grads), list(variables)
    if len(grads) != len(variables):
        raise ValueError(f"grads has {len(grads)} entries but variables has {len(variables)}")
    names = variable_names(variables)
    norms, none = {}, []
    sq_total, nonfinite, max_abs = [], [], []
    for g, name in zip(grads, names):
        if g is None:
            none.append(name)
            continue
        if isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        g = tf.convert_to_tensor(g)
        if not g.dtype.is_floating:
            raise TypeError(f"grads: gradient for {name!r} has non-float dtype {g.dtype.name}")
        g = tf.cast(g, tf.float32)
        sq = tf.reduce_sum(tf.square(g))
        norms[name] = tf.sqrt(sq)
        sq_total.append(sq)
        finite = tf.math.is_finite(g)
        nonfinite.append(tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.int64)))
        max_abs.append(tf.reduce_max(tf.concat(
            [[0.0], tf.reshape(tf.abs(tf.where(finite, g, 0.0)), [-1])], 0)))
    if sq_total:
        global_norm = tf.sqrt(tf.add_n(sq_total))
        nonfinite_count = tf.add_n(nonfinite)
        max_abs_all = tf.reduce_max(tf.stack(max_abs))
    else:
        global_norm = tf.constant(0.0)
        nonfinite_count = tf.constant(0, tf.int64)
        max_abs_all = tf.constant(0.0)
    return {"global_norm": global_norm, "norms": norms, "nonfinite_count": nonfinite_count,
            "max_abs": max_abs_all, "none": tuple(none)}


def _scalar_metadata():
    md = tf.compat.v1.SummaryMetadata()
    md.plugin_data.plugin_name = "scalars"  # what tf.summary.scalar (TensorBoard) writes
    return md


def _scalar(tag, value, step):
    """A float32 scalar summary via the core ``tf.summary.write`` op.

    Same event format as ``tf.summary.scalar`` (scalars plugin), but does not need the
    ``tensorboard`` package, which TensorFlow 2.21 does not install.
    """
    value = tf.cast(tf.convert_to_tensor(value), tf.float32)
    return tf.summary.write(tag, value, step=step, metadata=_scalar_metadata())


def write_gradient_summaries(stats: dict[str, Any], step: Any, writer: Any = None,
                             prefix: str = "gradients") -> tf.Tensor:
    """Write ``stats`` (from :func:`gradient_stats`) as ``tf.summary`` scalars (TensorBoard format;
    the ``tensorboard`` package itself is only needed to view them).

    Scalars: ``{prefix}/global_norm``, ``{prefix}/nonfinite_count``, ``{prefix}/max_abs``,
    ``{prefix}/none_count`` and ``{prefix}/norm/<variable name>``. Uses ``writer`` (a
    ``tf.summary`` writer) when given, else the default writer (nothing is written without one,
    as with ``tf.summary``). Works inside ``tf.function``. Returns a bool tensor: whether written.

    >>> import tempfile
    >>> w = tf.summary.create_file_writer(tempfile.mkdtemp())
    >>> s = gradient_stats([tf.ones(2)], [tf.Variable([0.0, 0.0], name="v")])
    >>> bool(write_gradient_summaries(s, step=0, writer=w))
    True
    """
    if not prefix or not isinstance(prefix, str):
        raise ValueError(f"prefix must be a non-empty string, got {prefix!r}")
    for key in ("global_norm", "norms", "nonfinite_count", "max_abs"):
        if key not in stats:
            raise ValueError(f"stats: missing key {key!r}; pass the dict from gradient_stats")
    step = tf.cast(tf.convert_to_tensor(step), tf.int64)

    def write():
        ok = [_scalar(f"{prefix}/global_norm", stats["global_norm"], step),
              _scalar(f"{prefix}/nonfinite_count", stats["nonfinite_count"], step),
              _scalar(f"{prefix}/max_abs", stats["max_abs"], step),
              _scalar(f"{prefix}/none_count", float(len(stats.get("none", ()))), step)]
        for name, value in stats["norms"].items():
            ok.append(_scalar(f"{prefix}/norm/{name}", value, step))
        return tf.reduce_all(tf.stack([tf.convert_to_tensor(o) for o in ok]))

    if writer is not None:
        with writer.as_default():
            return write()
    return write()
