"""Machinery shared by the attacks: preparing inputs, caching compiled loops, and the
:class:`Attack` configuration wrapper (calling models lives in :mod:`attacks._models`, running a
call in chunks in :mod:`attacks._chunks`, the prepared call in :mod:`attacks._prepared`).

Compiled functions are cached per *owner* (the model, or the ``loss_fn``) and per static
configuration, with a relaxed batch dimension, so an attack traces once per
(model, configuration, per-example shape, dtype) — not once per call or per batch size. eps,
step sizes, bounds and seeds are tensor arguments of the compiled function and never retrace.

>>> from attacks import PGD
>>> seed_tensor(7).numpy().tolist()
[7, 0]
>>> PGD(eps=0.1, steps=5).replace(steps=10)
PGD(eps=0.1, steps=10)
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad.checks import looks_like_probabilities
from robustgrad.convolution import winograd_tile

from . import _validate
from ._chunks import (  # noqa: F401  (re-exported: the attack modules import them from here)
    DEFAULT_BATCH_SIZE,
    check_batch_size,
    chunk_seed,
    finish,
    run_in_chunks,
)
from ._models import (  # noqa: F401  (re-exported: the attack modules import them from here)
    SelectedOutput,
    _accepts_training,
    call_model,
    check_classification_data,
    check_model_output,
    declared_input_shape,
    select_output,
    weak_caller,
)
from ._prepared import Prepared
from .norms import canonical_norm
from .objectives import canonical_objective, get_objective

__all__ = ["AttackResult", "Attack", "DEFAULT_BATCH_SIZE", "SelectedOutput", "call_model",
           "check_batch_size", "check_classification_data", "run_in_chunks", "select_output"]


@dataclasses.dataclass
class AttackResult:
    """What an attack run produced: ``x_adv`` and the work it spent.

    ``gradient_passes`` and ``forward_passes`` count *example rows* pushed through a
    forward+backward (resp. forward-only) pass of the model, summed over the chunks of a call;
    ``x_adv`` holds every chunk's examples in their order.
    """

    x_adv: tf.Tensor
    gradient_passes: int = 0
    forward_passes: int = 0


# ---------------------------------------------------------------------------------------------
# compiled-function cache

_CACHE: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()
_PROBED: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()
_STRONG_CACHE: dict = {}


def cached(owner: Any, key: tuple, builder: Callable[[], Callable]) -> Callable:
    """The compiled function for ``(owner, key)``, built by ``builder()`` on first use.

    Held weakly by the owner (the model or ``loss_fn``); a bound method is keyed by its object
    and function, so ``attack(policy.logits, ...)`` reuses the trace across calls. The key
    includes the Winograd setting of the convolutions being traced
    (:func:`robustgrad.convolution.winograd_tile`): a loop traced in a training step is not
    reused outside it.
    """
    tile = winograd_tile()
    if tile is not None:
        key = tuple(key) + (("winograd", tile),)
    if inspect.ismethod(owner):
        key = (owner.__func__,) + tuple(key)
        owner = owner.__self__
    try:
        table = _CACHE.setdefault(owner, {})
    except TypeError:
        table = _STRONG_CACHE.setdefault(id(owner), {})
    fn = table.get(key)
    if fn is None:
        fn = builder()
        table[key] = fn
    return fn


def relaxed_spec(t: Any) -> tf.TensorSpec:
    """A TensorSpec like ``t`` with an unknown batch dimension."""
    t = tf.convert_to_tensor(t)
    return tf.TensorSpec([None] + t.shape.as_list()[1:], t.dtype)


def spec_key(structure: Any) -> tuple:
    """A hashable key of the relaxed specs (shapes with an unknown batch, dtypes) of a structure."""
    return tuple((tuple(s.shape.as_list()), s.dtype.name)
                 for s in tf.nest.flatten(tf.nest.map_structure(relaxed_spec, structure)))


# ---------------------------------------------------------------------------------------------
# preparing a call

COMPUTE_DTYPES = (tf.float32, tf.float64)


def seed_tensor(seed: Any) -> tf.Tensor:
    """A stateless seed ``[2]`` int32 from an int, a ``tf.random.Generator`` or ``None``."""
    if seed is None:
        return tf.random.uniform([2], maxval=2**31 - 1, dtype=tf.int32)
    if isinstance(seed, tf.random.Generator):
        return tf.cast(seed.make_seeds(1)[:, 0], tf.int32)
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        s = int(seed)
        return tf.constant([s % (2**31 - 1), (s // (2**31 - 1)) % (2**31 - 1)], tf.int32)
    t = tf.convert_to_tensor(seed)
    if t.shape.rank == 0:
        return tf.stack([tf.cast(t, tf.int32), tf.constant(0, tf.int32)])
    if t.shape.as_list() == [2]:
        return tf.cast(t, tf.int32)
    raise TypeError(f"seed must be an int, a shape-[2] tensor, a tf.random.Generator or None; "
                    f"got {seed!r}")


def warn_if_probabilities(out: Any, who: str = "model") -> bool:
    """Warn (and return True) when a model's outputs look like probabilities, not logits."""
    if looks_like_probabilities(out):
        warnings.warn(
            f"{who} outputs look like probabilities (non-negative rows summing to 1). Attacks and "
            "objectives expect logits: gradients through a saturated softmax vanish and make a "
            "model look robust (gradient masking). Remove the final softmax.",
            UserWarning, stacklevel=4)
        return True
    return False


def _probe(model, x, training, loss_fn, need_gradient=True):
    """Eager probe on a few examples: output shape, softmax warning, x-dependence."""
    xp = tf.identity(x[:16])
    with tf.GradientTape() as tape:
        tape.watch(xp)
        if loss_fn is not None:
            out = loss_fn(xp)
            r = tf.ones_like(out)
        else:
            out = check_model_output(call_model(model, xp, training))
            r = tf.random.stateless_uniform(tf.shape(out), [1, 2], 0.5, 1.5, dtype=out.dtype)
        total = tf.reduce_sum(tf.cast(out, tf.float64) * tf.cast(r, tf.float64))
    g = tape.gradient(total, xp)
    who = "loss_fn" if loss_fn is not None else "model"
    probs = False
    if loss_fn is None:
        if not isinstance(out, tf.Tensor) or not out.dtype.is_floating:
            kind = (f"a {out.dtype.name} tensor" if isinstance(out, tf.Tensor)
                    else type(out).__name__)
            raise TypeError(f"model must return a floating tensor of logits, got {kind}")
        probs = warn_if_probabilities(out)
    if not need_gradient:  # a black-box attack: the output must still move with x
        if loss_fn is None and isinstance(out, tf.Tensor):
            scale = tf.reduce_max(tf.abs(xp)) + 1.0
            moved = xp + tf.random.stateless_uniform(tf.shape(xp), [3, 4], -1.0, 1.0,
                                                     dtype=xp.dtype) * scale
            other = check_model_output(call_model(model, moved, training))
            if isinstance(other, tf.Tensor) and bool(tf.reduce_all(tf.equal(
                    tf.cast(out, tf.float64), tf.cast(other, tf.float64)))):
                raise ValueError(f"{who}: the output does not depend on the input x (the same "
                                 "logits for every probe example moved anywhere); the model "
                                 "ignores x, so no attack can change its prediction")
        return out
    if g is None:
        raise ValueError(f"{who}: the output does not depend on the input x (no gradient path "
                         "from x to the output)")
    if not bool(tf.reduce_all(tf.math.is_finite(g))):
        raise ValueError(f"{who}: the input gradient has NaN/Inf values on the probe batch")
    if not bool(tf.reduce_any(g != 0)) and not probs:
        raise ValueError(f"{who}: the input gradient is zero on every probe example; the output "
                         "ignores x or is piecewise constant (gradient masking)")
    return out


def prepare(model: Any, x: Any, y: Any, *, eps: Any, clip_min: Any, clip_max: Any, targeted: bool,
            objective: Any, training: Any, loss_fn: Callable | None = None, eps_name: str = "eps",
            allow_none_eps: bool = False, need_gradient: bool = True,
            batch_size: int | None = None) -> Prepared:
    """Validate and convert the common arguments of an attack call on the whole ``x`` (every
    chunk's data is checked before the first chunk runs). Raises before any compiled work.

    ``y=None`` labels the examples with the model's predictions, ``batch_size`` (see
    :func:`check_batch_size`) examples per forward pass.
    """
    chunk = check_batch_size(batch_size)
    if loss_fn is None and model is None:
        raise ValueError("model is required (or pass loss_fn=f(x_adv) -> [B] with model=None)")
    if loss_fn is None and not callable(model):
        raise TypeError(f"model must be callable as model(x, training=False) -> logits, "
                        f"got {type(model).__name__}")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError("loss_fn must be a callable loss_fn(x_adv) -> per-example values [B]")
    _validate.check_eps(eps, eps_name, allow_none=allow_none_eps)
    xt = _validate.check_x(x)
    in_dtype = xt.dtype
    cdtype = in_dtype if in_dtype in COMPUTE_DTYPES else tf.float32
    xc = tf.cast(xt, cdtype)
    lo, hi = _validate.check_bounds(clip_min, clip_max, xc)
    eager = tf.executing_eagerly()
    obj_name = canonical_objective(objective) if loss_fn is None else None
    n = xc.shape[0]
    owner = loss_fn if loss_fn is not None else model
    forward = 0
    num_classes = None
    if eager:
        pkey: tuple = (bool(training), bool(need_gradient), tuple(xc.shape[1:].as_list()),
                       cdtype.name)
        powner = owner
        if inspect.ismethod(owner):  # bound methods are ephemeral: key on their object
            pkey, powner = (owner.__func__,) + pkey, owner.__self__
        try:
            seen = _PROBED.setdefault(powner, {})
        except TypeError:
            seen = {}
        if pkey not in seen:
            # once per model (and mode/shape): output shape, softmax warning, x-dependence
            out = _probe(model, xc, training, loss_fn, need_gradient)
            seen[pkey] = (int(out.shape[-1]) if loss_fn is None and out.shape.rank == 2
                          else None)
        num_classes = seen[pkey]
    if loss_fn is not None:
        if targeted:
            raise ValueError("targeted: not meaningful with loss_fn (maximise what you pass)")
        zeros = tf.zeros([tf.shape(xc)[0]], tf.int64)
        loss_call = weak_caller(loss_fn)

        def loss_value_fn(xa, y_, yt_):
            v = loss_call(xa)
            return tf.cast(v, xa.dtype), tf.zeros([tf.shape(xa)[0]], tf.bool)

        return Prepared(owner, xc, in_dtype, zeros, zeros, lo, hi, False, None, loss_value_fn,
                        batch_size=chunk, eager=eager, key=("loss_fn",))

    model_call = weak_caller(model, training)

    def logits_of(xa):
        out = check_model_output(model_call(xa))  # (traced: the probe did not run)
        if isinstance(out, tf.Tensor) and out.dtype in (tf.float16, tf.bfloat16):
            out = tf.cast(out, tf.float32)  # mixed precision: objectives in float32
        return out

    def predicted(xa):  # the model's labels, one chunk per forward pass when eager
        if not eager or n is None or n <= chunk:
            return tf.argmax(logits_of(xa), axis=-1)
        return tf.concat([tf.argmax(logits_of(xa[i:i + chunk]), axis=-1)
                          for i in range(0, n, chunk)], 0)

    # labels
    y_true = None
    if y is None:
        if targeted:
            raise ValueError("y: targeted attacks need the target labels in y")
        forward += int(n or 0)
        y = predicted(xc)
        y_true = y
    labels_like = obj_name is not None or _is_label_vector(y)
    if labels_like:
        y = _validate.check_labels(y, n, num_classes)
    else:
        y = tf.nest.map_structure(tf.convert_to_tensor, y)
    has_success = labels_like and (num_classes is not None or not eager)
    if y_true is None:
        if targeted and obj_name == "dlr":
            forward += int(n or 0)
            y_true = predicted(xc)
        elif labels_like:
            y_true = y
        else:
            y_true = tf.zeros([tf.shape(xc)[0]], tf.int64)
    if obj_name == "dlr" and num_classes is not None and num_classes < (4 if targeted else 3):
        raise ValueError(f"objective: DLR needs at least {4 if targeted else 3} classes, "
                         f"the model has {num_classes}")
    obj = get_objective(objective, targeted)

    def value_fn(xa, y_, yt_):
        logits = logits_of(xa)
        v = tf.cast(obj(logits, y_, yt_), xa.dtype)
        if has_success:
            pred = tf.argmax(logits, axis=-1)
            succ = tf.equal(pred, y_) if targeted else tf.not_equal(pred, y_)
        else:
            succ = tf.zeros([tf.shape(xa)[0]], tf.bool)
        return v, succ

    key = ("model", obj_name if obj_name else id(objective), bool(targeted), bool(training),
           has_success)
    return Prepared(owner, xc, in_dtype, y, y_true, lo, hi, has_success, num_classes, value_fn,
                    batch_size=chunk, forward_passes=forward, eager=eager, key=key)


def _is_label_vector(y):
    try:
        t = tf.convert_to_tensor(y)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError):  # eager Pack of a ragged tuple
        return False
    return t.dtype.is_integer and t.shape.rank == 1


# ---------------------------------------------------------------------------------------------
# configuration wrappers


class Attack:
    """A configured attack: ``PGD(eps=0.1, steps=20)(model, x, y)``.

    Holds keyword arguments of the attack function (``batch_size`` among them: examples per
    compiled call, see :func:`run_in_chunks`); call-time keywords override them.
    ``run`` returns an :class:`AttackResult` with the work spent (used by the evaluation);
    ``get_config``/``from_config`` round-trip; ``replace(**kw)`` returns a modified copy.
    """

    name = "attack"
    norms: tuple[str, ...] = ("linf", "l2", "l1")
    gradient_free = False
    #: whether the run function takes ``early_stop`` (freeze examples once broken); the
    #: evaluation cascade turns it on where it is declared, never by inspecting signatures
    supports_early_stop: bool = False
    #: whether ``targeted=True`` (``y`` holds target classes) is meaningful for the attack
    supports_targeted: bool = True

    @staticmethod
    def _run(model: Any, x: Any, y: Any, **kw: Any) -> AttackResult:
        """The attack itself (each subclass sets its function); keyword-only parameters are the
        configuration the constructor accepts."""
        raise NotImplementedError

    def __init__(self, **config):
        sig = inspect.signature(type(self)._run)
        allowed = {k for k, p in sig.parameters.items() if p.kind == p.KEYWORD_ONLY}
        bad = sorted(set(config) - allowed)
        if bad:
            raise TypeError(f"{type(self).__name__}: unknown argument(s) {bad}; "
                            f"allowed: {sorted(allowed)}")
        if "norm" in config:
            config["norm"] = canonical_norm(config["norm"])
            if config["norm"] not in self.norms:
                raise ValueError(f"norm: {type(self).__name__} supports {self.norms}, "
                                 f"got {config['norm']!r}")
        if config.get("targeted") and not self.supports_targeted:
            raise ValueError(f"targeted: {type(self).__name__} cannot be targeted (it only "
                             "moves away from the label); use PGD, APGD, FAB or "
                             "CarliniWagnerL2 for targeted attacks")
        if config.get("eps") is not None:
            _validate.check_eps(config["eps"])
        if config.get("batch_size") is not None:
            check_batch_size(config["batch_size"])
        for name, most in (("steps", _validate.MAX_STEPS), ("restarts", _validate.MAX_RESTARTS)):
            if config.get(name) is not None:  # counts: bounded when built, not when run
                _validate.check_positive_int(config[name], name, maximum=most)
        self.config = dict(config)

    @property
    def norm(self) -> Any:
        """The configured norm (canonical name), or the attack's first supported one."""
        return self.config.get("norm", self.norms[0])

    def check_num_classes(self, num_classes: int) -> None:
        """Raise ``ValueError`` (before any work) when the configuration cannot run on a model
        with ``num_classes`` outputs; nothing to check by default."""

    def check_example_shape(self, shape: tuple) -> None:
        """Raise ``ValueError`` (before any work: a cascade checks every attack before the
        first runs) when the attack cannot run on examples of ``shape`` (``x.shape[1:]``);
        nothing to check by default."""

    @tf.autograph.experimental.do_not_convert
    def run(self, model: Any, x: Any, y: Any = None, **overrides: Any) -> AttackResult:
        """Attack ``x [B, ...]`` (labels ``y [B]`` or ``None``) with the configuration, call-time
        keywords overriding it; returns the :class:`AttackResult` (``x_adv`` and the passes)."""
        kw = {**self.config, **overrides}
        return type(self)._run(model, x, y, **kw)

    @tf.autograph.experimental.do_not_convert
    def __call__(self, model, x, y=None, **overrides):
        return self.run(model, x, y, **overrides).x_adv

    def get_config(self) -> dict:
        """The configuration as a dict with ``class_name`` (JSON-friendly when its values are)."""
        return {"class_name": type(self).__name__, **self.config}

    @classmethod
    def from_config(cls, config: dict) -> Any:
        """The attack :meth:`get_config` described (``class_name`` is ignored)."""
        config = dict(config)
        config.pop("class_name", None)
        return cls(**config)

    def replace(self, **kw: Any) -> Any:
        """A copy of the attack with the keywords ``kw`` changed (validated again)."""
        return type(self)(**{**self.config, **kw})

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        return f"{type(self).__name__}({args})"
