"""The public, validated entries of the bound engine over Keras models.

:func:`compute_bounds` and :func:`compute_ball_bounds` check their arguments (eagerly) and run
the compiled propagation of a :class:`BoundedModel` (one per model, cached); :func:`margin_spec`
builds the usual specification. :func:`compute_bounds_unchecked` is the same computation without
validation, for a compiled training step (certified training, agents' regularisers).
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad.checks import (
    ArgumentTypeError,
    choice,
    nonnegative,
    norm_name,
    number,
    positive_int,
    probability,
)

from . import _alpha as _alpha
from . import _engine as _engine
from . import _methods as _methods
from ._keras_graph import Graph

METHODS = ("ibp", "crown", "crown-ibp", "alpha-crown")


def _alpha_options(method, iterations, lr, lr_decay):
    """alpha-CROWN's options, checked, as a hashable tuple (None for the other methods)."""
    iterations = positive_int(iterations, "iterations")
    lr = number(lr, "lr", minimum=0, min_inclusive=False)
    lr_decay = probability(lr_decay, "lr_decay", open_low=True)
    if method != "alpha-crown":
        return None
    return (("iterations", iterations), ("lr", lr), ("lr_decay", lr_decay))


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
        self._graph = Graph(model)
        self.name = getattr(model, "name", "model")
        inputs = getattr(model, "inputs", None)  # a built Keras model: its per-example shape
        self._input_shape = tuple(inputs[0].shape[1:]) if inputs else None
        self._fn = tf.function(self._bounds, jit_compile=bool(jit_compile), autograph=False)
        self._output_shapes: dict = {}
        self._concrete: dict = {}

    def _bounds(self, lower, upper, spec, ball, method, options=None):
        """The uncompiled, unchecked propagation (static batch)."""
        return _methods.propagate(self._graph, lower, upper, spec, ball, method,
                                  options=None if options is None else dict(options))

    # -- the public, validated call --------------------------------------------------------
    def bounds(self, lower: Any, upper: Any, method: str = "crown", C: Any = None, *,  # noqa: N803
               batch_size: int | None = 256, iterations: int = 20, lr: float = 0.5,
               lr_decay: float = 0.98, _ball: tuple | None = None):
        """Element-wise bounds of the outputs over ``lower <= x <= upper``; see
        :func:`compute_bounds`."""
        method = choice(method.lower() if isinstance(method, str) else method, "method", METHODS)
        options = _alpha_options(method, iterations, lr, lr_decay)
        lower, upper = _check_box(lower, upper)
        self._check_input_shape(lower)
        batch_size = positive_int(batch_size, "batch_size", allow_none=True)
        n = int(lower.shape[0])
        spec = None if C is None else self._check_spec(C, lower)
        chunk = n if batch_size is None else min(batch_size, n)
        if options is not None:  # the slopes' memory (too much for one example: an error)
            limit = _alpha.chunk_limit(self._graph, lower.shape[1:], lower.dtype,
                                       None if spec is None else spec.shape[1])
            chunk = chunk if batch_size is None else min(chunk, limit)
        if chunk >= n:  # one call: no slicing (an eager slice costs more than a small IBP)
            return self._call(lower, upper, spec, None if _ball is None else tuple(_ball),
                              method, options)
        los, his = [], []
        for start in range(0, n, chunk):
            sl = slice(start, start + chunk)
            ball = None if _ball is None else (_ball[0][sl], _ball[1])
            lo, hi = self._call(lower[sl], upper[sl], None if spec is None else spec[sl], ball,
                                method, options)
            los.append(lo)
            his.append(hi)
        if len(los) == 1:
            return los[0], his[0]
        return tf.concat(los, 0), tf.concat(his, 0)

    def _call(self, lower, upper, spec, ball, method, options):
        """The compiled propagation, its concrete function looked up by shapes and options
        (a third less per call than the polymorphic function's dispatch: IBP on a small MLP is
        about a millisecond).

        Tracing here, not in a call of ``self._fn``, also keeps TensorFlow's retracing warning
        away: it counts the traces of every ``BoundedModel._bounds`` (one code object) as one
        function's, and warned from the fifth model, while each model traces once per shape,
        spec and method (its weights are its own), a bounded number."""
        key = (tuple(lower.shape), lower.dtype, None if spec is None else tuple(spec.shape),
               None if ball is None else (tuple(ball[0].shape), ball[0].dtype), method, options)
        fn = self._concrete.get(key)
        if fn is None:
            fn = self._concrete[key] = self._fn.get_concrete_function(lower, upper, spec, ball,
                                                                      method, options)
        return fn(lower, upper, spec, ball, method, options)

    def check_alpha_crown(self, example_shape: Any, spec_rows: int | None = None,
                          dtype: Any = tf.float32) -> int:
        """The most examples per alpha-CROWN call for inputs ``[B, *example_shape]`` and a spec
        of ``spec_rows`` rows (``None``: every output); a ``ValueError`` when one example alone
        is too much for dense slopes (use ``"crown"``): what :meth:`bounds` checks, asked
        before any work (``robustgrad certify --method alpha-crown``)."""
        return _alpha.chunk_limit(self._graph, tuple(example_shape), tf.as_dtype(dtype),
                                  spec_rows)

    def _check_input_shape(self, lower):
        """``lower``/``upper`` ``[B, ...]`` against the model's input shape (``None`` dims
        match anything): a ``ValueError`` naming both, not TensorFlow's ``MatMul`` error."""
        want, got = self._input_shape, tuple(lower.shape[1:])
        if want is None:
            return
        if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want, got)):
            shown = ", ".join("None" if w is None else str(w) for w in want)
            raise ValueError(f"lower and upper must have shape [B, {shown}] (model "
                             f"{self.name!r} takes examples of shape {list(want)}), got "
                             f"{list(lower.shape)}")

    def output_shape(self, lower: Any) -> tuple:
        """The per-example output shape for inputs shaped like ``lower`` [B, ...]."""
        lower = tf.convert_to_tensor(lower)
        key = (tuple(lower.shape[1:]), lower.dtype)
        if key not in self._output_shapes:
            self._output_shapes[key] = _engine.output_shape(self._graph, key[0], lower.dtype)
        return self._output_shapes[key]

    def _check_spec(self, spec, lower):
        c = tf.convert_to_tensor(spec)
        if not (c.dtype.is_floating or c.dtype.is_integer):
            raise ArgumentTypeError(f"C must be a float tensor [B, S, num_outputs], got dtype "
                                    f"{c.dtype.name}")
        if c.dtype != lower.dtype:
            c = tf.cast(c, lower.dtype)
        out_shape = self.output_shape(lower)
        n_out = math.prod(out_shape)
        if c.shape.rank != 3 or c.shape[0] != lower.shape[0] or c.shape[2] != n_out or \
                c.shape[1] == 0:
            raise ValueError(f"C must have shape [B, S, num_outputs] = [{lower.shape[0]}, S >= 1, "
                             f"{n_out}] for this model and batch, got {list(c.shape)}")
        if hasattr(c, "numpy") and not np.all(np.isfinite(c.numpy())):
            raise ValueError("C contains NaN or Inf values")
        if tuple(c.shape[2:]) == out_shape:
            return c
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
                   batch_size: int | None = 256, iterations: int = 20, lr: float = 0.5,
                   lr_decay: float = 0.98) -> tuple[tf.Tensor, tf.Tensor]:
    """Bounds of a model's outputs over the box ``lower <= x <= upper``.

    Guaranteed for every ``x`` in the box (up to floating-point rounding): ``lb <= model(x) <= ub``
    element-wise, or ``lb <= C @ model(x) <= ub`` with a specification ``C``.

    Args:
      model: a Keras Sequential or functional model (or a :class:`BoundedModel`) that outputs
        logits; see the module docstring for the supported layers. Never modified.
      lower, upper: the box, float32 or float64 ``[B, *input_shape]``, ``lower <= upper``.
      method: ``"crown"`` (Zhang et al. 2018), ``"ibp"`` (Gowal et al. 2018; one forward pass
        over boxes), ``"crown-ibp"`` (Zhang et al. 2020) or ``"alpha-crown"`` (Xu et al. 2021:
        CROWN with optimised ReLU lower slopes; the tightest, ``iterations`` CROWN passes with
        their gradients; see :mod:`robustgrad.bounds._alpha`).
      C: optional specification ``[B, S, num_outputs]`` (outputs flattened): bound ``C @
        outputs``, ``C`` merged into the last linear layers. :func:`margin_spec` builds margins.
      batch_size: examples per compiled call (``None``: all at once). CROWN's intermediate bounds
        also split their rows so that no chunk holds more than ~512 MB in float32 (coefficients,
        the relaxations they read and temporaries, estimated from the shapes before the work);
        alpha-CROWN lowers the batch size (not ``None``) so that its slopes stay within ~64 MB.
      iterations, lr, lr_decay: alpha-CROWN's bound evaluations (int >= 1; the first is CROWN's),
        Adam learning rate (> 0) and its decay per iteration (in (0, 1]); auto_LiRPA's defaults.
        Checked, and unused by the other methods.

    Returns:
      ``(lb, ub)`` in the dtype of ``lower``: shape ``[B, *output_shape]``, or ``[B, S]`` with ``C``.

    Raises:
      ValueError: an unsupported layer (named) or softmax output, ``lower > upper`` anywhere,
        mismatched shapes, an unknown method, ``C`` of the wrong shape, ``iterations``, ``lr``
        or ``lr_decay`` out of range.

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
    return _bounded(model).bounds(lower, upper, method, C, batch_size=batch_size,
                                  iterations=iterations, lr=lr, lr_decay=lr_decay)


def compute_bounds_unchecked(model: Any, lower: tf.Tensor, upper: tf.Tensor,
                             method: str = "crown", C: tf.Tensor | None = None, *,  # noqa: N803
                             bound_upper: bool = True) -> tuple:
    """:func:`compute_bounds` without validation, for a compiled training step.

    Nothing reads a tensor's values (no ``lower <= upper`` check, no finiteness check, no Python
    branch on a tensor), so it traces inside ``tf.function``; an unknown batch size (``fit``
    traces ``[None, ...]``) is bounded in padded chunks of 32 examples. Not compiled itself: the
    caller's ``tf.function`` compiles it. Gradients reach the model's weights (certified
    training differentiates the bounds).

    Args:
      model: a Keras model the engine supports, or a :class:`BoundedModel`.
      lower, upper: float32/float64 tensors ``[B, *input_shape]``, ``lower <= upper`` (the
        caller's promise).
      method: ``"crown"``, ``"ibp"``, ``"crown-ibp"`` or ``"alpha-crown"`` (a Python string;
        alpha-CROWN with its default options, and its bounds are not differentiable).
      C: ``None`` or a float tensor ``[B, S, num_outputs]`` of ``lower``'s dtype.
      bound_upper: with ``C``, ``False`` skips the upper bound's coefficients in the last
        backward pass (about half of CROWN-IBP's work; certified training needs the lower bound
        only); ``ub`` is then None.

    Returns:
      ``(lb, ub)``: ``[B, *output_shape]``, or ``[B, S]`` with ``C``.

    >>> import keras, numpy as np, tensorflow as tf
    >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    >>> model.layers[0].set_weights([np.array([[-2.0]], "float32")])
    >>> step = tf.function(lambda x: compute_bounds_unchecked(model, x - 0.5, x + 0.5, "ibp"))
    >>> [t.numpy().tolist() for t in step(tf.constant([[1.0]]))]
    [[[-3.0]], [[-1.0]]]
    """
    method = choice(method.lower() if isinstance(method, str) else method, "method", METHODS)
    bounded = _bounded(model)
    if C is not None:
        out_shape = bounded.output_shape(lower)
        rows = C.shape[0] if C.shape[0] is not None else tf.shape(C)[0]
        C = tf.reshape(C, [rows, C.shape[1], *out_shape])  # noqa: N806
    return _methods.propagate_any_batch(bounded._graph, lower, upper, C, None, method,
                                        lower_only=not bound_upper)


def compute_ball_bounds(model: Any, x: Any, eps: float, norm: str = "linf", method: str = "crown",
                        C: Any = None, *, clip_min: Any = None, clip_max: Any = None,  # noqa: N803
                        batch_size: int | None = 256, iterations: int = 20, lr: float = 0.5,
                        lr_decay: float = 0.98) -> tuple[tf.Tensor, tf.Tensor]:
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
      model, method, C, batch_size, iterations, lr, lr_decay: as in :func:`compute_bounds`.

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
    _alpha_options(method, iterations, lr, lr_decay)
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
    return _bounded(model).bounds(lower, upper, method, C, batch_size=batch_size, _ball=ball,
                                  iterations=iterations, lr=lr, lr_decay=lr_decay)


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
