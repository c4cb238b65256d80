"""The optimizer as a transformation: :func:`scale_by_adam`, :func:`scale_by_learning_rate`, :func:`adam`.

As in optax, an optimizer is a chain: ``adam(lr) = chain(scale_by_adam(), scale_by_learning_rate(lr))``
and its updates are *added* to the parameters (the learning-rate step flips the sign). So clipping,
guards and Adam compose in one algebra::

    chain(clip_by_global_norm(0.5), scale_by_adam(eps=1e-5), scale_by_learning_rate(lr))

Adam (Kingma & Ba 2015, "Adam: A Method for Stochastic Optimization", arXiv:1412.6980), at step
``t`` (1-based) with gradient ``g``::

    mu_t = b1 * mu_{t-1} + (1 - b1) * g          nu_t = b2 * nu_{t-1} + (1 - b2) * g**2
    mu_hat = mu_t / (1 - b1**t)                   nu_hat = nu_t / (1 - b2**t)
    update = mu_hat / (sqrt(nu_hat + eps_root) + eps_t)

Where epsilon goes is the one place implementations disagree (``eps_style``):

* ``"pytorch"`` (default): ``eps_t = eps``, added to ``sqrt(nu_hat)``; ``torch.optim.Adam``, optax,
  and so CleanRL and Stable-Baselines3, whose settings the RL presets copy (eps 1e-5).
* ``"keras"``: ``eps`` added to ``sqrt(nu_t)`` *before* the bias correction, Kingma & Ba's
  "epsilon hat" (end of their section 2), i.e. ``eps_t = eps / sqrt(1 - b2**t)`` on ``sqrt(nu_hat)``:
  ``keras.optimizers.Adam`` and TensorFlow's ``ApplyAdam`` kernels. Early on it is a much larger
  epsilon (~32x at step 1 with b2 = 0.999), so small gradients move less.

With ``eps_root == 0`` both have a fused TensorFlow kernel (``ResourceApplyAdam``: one op per
variable updates the variable and both moments in place): :class:`GradientStep` uses it when its
``optimizer`` is ``adam(...)`` (``chain(scale_by_adam, scale_by_learning_rate)``), with the same
results up to float rounding (the kernel forms ``1 - b2`` in float32, 0.00099998713 for 0.999,
so float32 weights agree to about 1e-5 relative). The pure ``update`` here is what runs
everywhere else (any other chain, a leading seed axis, XLA).

>>> import tensorflow as tf
>>> t = adam(1e-3, eps=1e-5)
>>> w = [tf.zeros(2)]
>>> u, s = t.update([tf.constant([1e-4, 1.0])], t.init(w))
>>> [round(float(x) / -1e-3, 3) for x in u[0]], int(s[0].count)
([0.909, 1.0], 1)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf

from robustgrad.checks import choice, nonnegative, number
from robustgrad.transforms._base import (
    EmptyState,
    GradientTransformation,
    _as_tensor,
    _assert_same_structure,
    _check_state,
    _flatten_checked,
    _zeros_state_like_params,
    chain,
    tag_update,
)

__all__ = ["ScaleByAdamState", "ScaleByScheduleState", "adam", "scale_by_adam",
           "scale_by_learning_rate"]

EPS_STYLES = ("pytorch", "keras")


class ScaleByAdamState(NamedTuple):
    """State of :func:`scale_by_adam`.

    count: int64 scalar, steps taken (as Keras' ``iterations``); the bias corrections use it.
    mu: first moments, the structure, shapes and dtypes of ``params``.
    nu: second moments, likewise.
    """

    count: Any
    mu: Any
    nu: Any


class ScaleByScheduleState(NamedTuple):
    """State of :func:`scale_by_learning_rate` with a schedule: ``count`` (int64 scalar), the
    steps taken so far; the schedule is called with it (0 on the first step)."""

    count: Any


class _AdamSpec(NamedTuple):
    b1: float
    b2: float
    eps: float
    eps_root: float
    eps_style: str


def _beta(value, name):
    return number(value, name, minimum=0.0, maximum=1.0, max_inclusive=False)


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
                  *, eps_style: str = "pytorch") -> GradientTransformation:
    """Rescale updates by Adam's bias-corrected moment ratio (Kingma & Ba 2015; formula above).

    The output is the *direction* ``mu_hat / (sqrt(nu_hat + eps_root) + eps_t)`` (no learning
    rate, no sign flip): follow it with :func:`scale_by_learning_rate`, or use :func:`adam`.

    Args:
        b1: float in [0, 1), decay of the first moment.
        b2: float in [0, 1), decay of the second moment.
        eps: float >= 0, added to the denominator (where: ``eps_style``).
        eps_root: float >= 0, added to ``nu_hat`` inside the square root (optax's; keeps the
            gradient of the update finite when differentiating through it). Not fused.
        eps_style: ``"pytorch"`` (eps on ``sqrt(nu_hat)``: PyTorch, optax) or ``"keras"`` (eps on
            ``sqrt(nu)`` before bias correction: Keras, TF's ApplyAdam); module docstring.

    State: :class:`ScaleByAdamState` (int64 ``count``; ``mu``, ``nu`` in each leaf's dtype).
    Updates keep each leaf's shape and dtype; the moments are computed in the leaf's dtype, the
    bias corrections in float64 for float64 leaves and in float32 otherwise.

    >>> t = scale_by_adam()
    >>> s = t.init([tf.zeros(3)])
    >>> u, s = t.update([tf.constant([2.0, -0.5, 0.0])], s)
    >>> u[0].numpy().round(4).tolist(), int(s.count)    # the first step is about sign(g)
    ([1.0, -1.0, 0.0], 1)
    """
    b1 = _beta(b1, "b1")
    b2 = _beta(b2, "b2")
    eps = nonnegative(eps, "eps")
    eps_root = nonnegative(eps_root, "eps_root")
    eps_style = choice(eps_style, "eps_style", EPS_STYLES)
    spec = _AdamSpec(b1, b2, eps, eps_root, eps_style)

    def init(params):
        _flatten_checked(params, "params")
        zeros = _zeros_state_like_params(params)
        return ScaleByAdamState(count=tf.constant(0, tf.int64), mu=zeros,
                                nu=tf.nest.map_structure(tf.identity, zeros))

    def update(updates, state, params=None):
        _check_state(state, ScaleByAdamState, "scale_by_adam")
        _flatten_checked(updates, "updates")
        _assert_same_structure(updates, state.mu, "updates", "state.mu")
        if params is not None:
            _assert_same_structure(updates, params, "updates", "params")
        count = state.count + 1
        corrections = {}

        def bias_corrections(d):
            """``(1 - b1^t, 1 - b2^t, eps_t)`` in ``d``, computed in float64 for float64 leaves
            and in float32 otherwise (half precision cannot hold 1 - 0.999 accurately)."""
            if d not in corrections:
                w = tf.float64 if d == tf.float64 else tf.float32
                t = tf.cast(count, w)
                c1 = 1.0 - tf.pow(tf.constant(b1, w), t)
                c2 = 1.0 - tf.pow(tf.constant(b2, w), t)
                eps_t = tf.constant(eps, w) if eps_style == "pytorch" else eps / tf.sqrt(c2)
                corrections[d] = tuple(tf.cast(x, d) for x in (c1, c2, eps_t))
            return corrections[d]

        def moments(g, m, v):
            g = _as_tensor(g)
            d = g.dtype
            m = tf.constant(b1, d) * m + tf.constant(1.0 - b1, d) * g
            v = tf.constant(b2, d) * v + tf.constant(1.0 - b2, d) * tf.square(g)
            return m, v

        def direction(m, v):
            c1, c2, eps_t = bias_corrections(m.dtype)
            v_hat = v / c2
            if eps_root:
                v_hat = v_hat + tf.constant(eps_root, m.dtype)
            return (m / c1) / (tf.sqrt(v_hat) + eps_t)

        flat_g = tf.nest.flatten(updates)
        pairs = [moments(g, m, v) for g, m, v in
                 zip(flat_g, tf.nest.flatten(state.mu), tf.nest.flatten(state.nu))]
        mu = tf.nest.pack_sequence_as(state.mu, [m for m, _ in pairs])
        nu = tf.nest.pack_sequence_as(state.nu, [v for _, v in pairs])
        out = tf.nest.pack_sequence_as(updates, [direction(m, v) for m, v in pairs])
        return out, ScaleByAdamState(count=count, mu=mu, nu=nu)

    return GradientTransformation(init, tag_update(update, _rg_adam=spec))


def _lr_kind(learning_rate):
    """``("variable"|"constant"|"schedule", value)`` for :func:`scale_by_learning_rate`."""
    if isinstance(learning_rate, tf.Variable) or isinstance(
            getattr(learning_rate, "value", None), tf.Variable):
        var = learning_rate if isinstance(learning_rate, tf.Variable) else learning_rate.value
        if var.shape.rank != 0 or not var.dtype.is_floating:
            raise ValueError(f"learning_rate: a variable learning rate must be a float scalar, "
                             f"got shape {var.shape} and dtype {var.dtype.name}")
        return "variable", var
    if callable(learning_rate):
        return "schedule", learning_rate
    return "constant", nonnegative(learning_rate, "learning_rate")


def scale_by_learning_rate(learning_rate: float | tf.Variable | Callable[[tf.Tensor], Any],
                           *, flip_sign: bool = True) -> GradientTransformation:
    """Multiply updates by ``-learning_rate`` (by ``+learning_rate`` with ``flip_sign=False``).

    The sign flip makes a gradient-descent step an *update to add* to the parameters (optax's
    convention; :class:`GradientStep` adds them).

    Args:
        learning_rate: a number >= 0; or a float scalar ``tf.Variable`` read at every update (assign
            it to anneal without retracing a compiled step); or a schedule, a callable of the step
            count (int64 scalar tensor, 0 on the first step) returning a scalar.
        flip_sign: bool, negate (descent) when True.

    State: :class:`ScaleByScheduleState` with a schedule, else ``EmptyState()``.

    >>> t = scale_by_learning_rate(lambda count: 0.1 / tf.cast(count + 1, tf.float32))
    >>> s = t.init([tf.zeros(1)])
    >>> for _ in range(2):
    ...     u, s = t.update([tf.constant([1.0])], s)
    ...     print(round(float(u[0][0]), 3))
    -0.1
    -0.05
    """
    kind, value = _lr_kind(learning_rate)
    if not isinstance(flip_sign, bool):
        raise TypeError(f"flip_sign must be a bool, got {type(flip_sign).__name__}")
    sign = -1.0 if flip_sign else 1.0

    def rate(count):
        """The signed float32 step size at ``count`` (schedule) or now (variable, constant)."""
        if kind == "schedule":
            return sign * tf.cast(tf.convert_to_tensor(value(count)), tf.float32)
        if kind == "variable":
            return sign * tf.cast(value.read_value(), tf.float32)
        return tf.constant(sign * value, tf.float32)

    def init(params):
        _flatten_checked(params, "params")
        if kind == "schedule":
            return ScaleByScheduleState(count=tf.constant(0, tf.int64))
        return EmptyState()

    def update(updates, state, params=None):
        _flatten_checked(updates, "updates")
        if params is not None:
            _assert_same_structure(updates, params, "updates", "params")
        if kind == "schedule":
            _check_state(state, ScaleByScheduleState, "scale_by_learning_rate")
            lr = rate(state.count)
            new_state = ScaleByScheduleState(count=state.count + 1)
        else:
            _check_state(state, EmptyState, "scale_by_learning_rate")
            lr = rate(None)
            new_state = state
        out = tf.nest.map_structure(lambda u: _as_tensor(u) * tf.cast(lr, _as_tensor(u).dtype),
                                    updates)
        return out, new_state

    return GradientTransformation(init, tag_update(update, _rg_lr=(kind, rate)))


def adam(learning_rate: float | tf.Variable | Callable[[tf.Tensor], Any] = 1e-3,
         b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0, *,
         eps_style: str = "pytorch") -> GradientTransformation:
    """Adam as a transformation: ``chain(scale_by_adam(...), scale_by_learning_rate(learning_rate))``.

    Its updates are to be added to the parameters (``GradientStep(transform, adam(lr), variables)``
    does, with TensorFlow's fused kernel when ``eps_root == 0``). Arguments as
    :func:`scale_by_adam` and :func:`scale_by_learning_rate` (Kingma & Ba 2015). The defaults are
    optax's and PyTorch's; the RL agents use ``eps=1e-5`` (CleanRL, Stable-Baselines3).

    >>> w = tf.Variable([1.0, 1.0])
    >>> t = adam(0.1)
    >>> s = t.init([w])
    >>> for _ in range(3):
    ...     u, s = t.update([2.0 * w], s)     # gradient of ||w||^2: each step about -0.1
    ...     _ = w.assign_add(u[0])
    >>> [round(float(x), 4) for x in w.numpy()]
    [0.7016, 0.7016]
    """
    return chain(scale_by_adam(b1, b2, eps, eps_root, eps_style=eps_style),
                 scale_by_learning_rate(learning_rate))


# --------------------------------------------------------------------------------------------
# The fused fast path (TensorFlow's ResourceApplyAdam), used by GradientStep
# --------------------------------------------------------------------------------------------


def _flatten_chain(t):
    """The transformations of ``t`` with nested chains flattened (``[t]`` when not a chain)."""
    parts = getattr(t.update, "_rg_chain", None)
    if parts is None:
        return [t]
    return [x for p in parts for x in _flatten_chain(p)]


def _fused_adam_plan(t):
    """``(adam_spec, lr)`` when ``t`` is ``chain(scale_by_adam(...), scale_by_learning_rate(...))``
    (nested chains allowed) with ``eps_root == 0``, so that one ``ResourceApplyAdam`` per
    variable computes it; else None."""
    parts = _flatten_chain(t)
    if len(parts) != 2:
        return None
    spec = getattr(parts[0].update, "_rg_adam", None)
    lr = getattr(parts[1].update, "_rg_lr", None)
    if spec is None or lr is None or spec.eps_root != 0.0:
        return None
    return spec, lr


def _fused_adam_apply(plan, grads, state_vars, variables):
    """One Adam step applied in place: ``variables``, ``state_vars`` (the chain's state as
    variables: ``(ScaleByAdamState, lr state)``) updated by ``ResourceApplyAdam``. Same math as
    the pure chain followed by ``variables += updates``."""
    spec, (kind, rate) = plan
    adam_vars, lr_vars = state_vars
    if kind == "schedule":
        lr = -rate(lr_vars.count.read_value())  # rate() is signed; the kernel subtracts
        lr_assign = [lr_vars.count.assign_add(1)]
    else:
        lr = -rate(None)
        lr_assign = []
    count = adam_vars.count.assign_add(1)
    t = tf.cast(count, tf.float32)
    b1_power, b2_power = tf.pow(spec.b1, t), tf.pow(spec.b2, t)
    # the kernel: lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps_k); eps_k = eps is
    # Keras' form, eps * sqrt(1 - b2^t) gives eps on sqrt(v_hat), PyTorch's.
    eps_k = (spec.eps * tf.sqrt(1.0 - b2_power) if spec.eps_style == "pytorch"
             else tf.constant(spec.eps, tf.float32))
    ops = []
    for g, var, m, v in zip(grads, variables, tf.nest.flatten(adam_vars.mu),
                            tf.nest.flatten(adam_vars.nu)):
        d = var.dtype.base_dtype

        def c(x, d=d):
            return tf.cast(x, d)

        ops.append(tf.raw_ops.ResourceApplyAdam(
            var=var.handle, m=m.handle, v=v.handle, beta1_power=c(b1_power),
            beta2_power=c(b2_power), lr=c(lr), beta1=c(spec.b1), beta2=c(spec.b2),
            epsilon=c(eps_k), grad=c(g)))
    return ops + lr_assign

