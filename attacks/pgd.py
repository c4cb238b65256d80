"""Projected gradient descent and its relatives: PGD, BIM and MIM.

* :func:`projected_gradient_descent` — Madry et al., "Towards deep learning models resistant to
  adversarial attacks", ICLR 2018: random start in the ball, ``steps`` steepest-ascent steps of
  size ``step_size`` each projected back onto the ball and the box; ``restarts`` random starts
  keep the worst case *per example*.
* :func:`basic_iterative_method` — Kurakin et al. 2017: PGD without the random start.
* :func:`momentum_iterative_method` — Dong et al., "Boosting adversarial attacks with momentum",
  CVPR 2018: the step follows an accumulated, L1-normalised gradient (decay ``decay_factor``).

The whole loop (restarts and steps) runs inside one ``tf.function`` built from
``tf.while_loop``; it is traced once per (model, configuration, per-example shape, dtype) and
reused for every batch size, eps, step size, bound and seed. Each restart ends at its last
iterate (Madry et al.); across restarts the attack keeps, per example, the worst case: a
successful final point (misclassified, or at the target) before an unsuccessful one, then the
one with the highest objective. With ``early_stop=True`` examples freeze at the first iterate
where they are broken, and the loop exits when every example is broken.

For reuse beyond classifiers (RL observations, sensitivity analysis), pass either a callable
``objective(outputs, y) -> [B]`` (``y`` may be anything with a leading batch dimension, e.g. clean
action probabilities) or ``model=None, loss_fn=f`` with ``f(x_adv) -> [B]`` any differentiable
function of the input; the attack maximises it. Compiled loops are cached per model and per
objective / ``loss_fn`` object: pass the same callable across calls (not a fresh lambda each
time) to reuse the trace. ``loss_fn`` is probed once, eagerly, on the first rows of ``x``.

>>> import tensorflow as tf
>>> w = tf.constant([[1.0], [-2.0]])
>>> model = lambda x, training=False: tf.concat([x @ w, -(x @ w)], axis=1)
>>> x = tf.constant([[0.5, 0.5]])
>>> x_adv = projected_gradient_descent(model, x, tf.constant([1]), eps=0.1, clip_min=0.0,
...                                    clip_max=1.0, steps=5, seed=0)
>>> [round(float(v), 3) for v in x_adv[0]]
[0.6, 0.4]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from . import _validate
from ._base import (
    Attack,
    AttackResult,
    cached,
    chunk_seed,
    prepare,
    run_in_chunks,
    seed_tensor,
    spec_key,
)
from ._engine import compile_iterative
from .norms import canonical_norm

__all__ = [
    "projected_gradient_descent",
    "basic_iterative_method",
    "momentum_iterative_method",
    "PGD",
    "BIM",
    "MIM",
]

DEFAULT_L1_TOP_K = 0.01  # fraction of coordinates moved per L1 step (SLIDE-style)


def _check_iter_args(steps, restarts, step_size, early_stop, p):
    _validate.check_positive_int(steps, "steps", maximum=_validate.MAX_STEPS)
    _validate.check_positive_int(restarts, "restarts", maximum=_validate.MAX_RESTARTS)
    if step_size is not None:
        _validate.check_nonnegative(step_size, "step_size")
    if early_stop and not p.has_success:
        raise ValueError("early_stop: needs integer class labels to decide when an example is "
                         "broken; not available with loss_fn or a non-label y")


@tf.autograph.experimental.do_not_convert
def run_iterative(model: Any, x: Any, y: Any = None, *, eps: Any, norm: Any = "linf", clip_min: Any,
                  clip_max: Any, targeted: bool = False, seed: Any = None, steps: int = 10,
                  step_size: Any = None, restarts: int = 1, rand_init: bool = True, early_stop: bool = False,
                  objective: Any = "ce", training: Any = False, jit_compile: bool = False,
                  momentum: Any = None, l1_top_k: Any = DEFAULT_L1_TOP_K, loss_fn: Callable | None = None,
                  kind: str = "pgd", batch_size: int | None = None,
                  gradient_noise: Callable | None = None) -> AttackResult:
    """The PGD/BIM/MIM call behind the public functions and classes (``kind`` picks the default
    step size); returns the :class:`AttackResult` with the passes spent."""
    norm = canonical_norm(norm)
    p = prepare(model, x, y, eps=eps, clip_min=clip_min, clip_max=clip_max, targeted=targeted,
                objective=objective, training=training, loss_fn=loss_fn, batch_size=batch_size)
    _check_iter_args(steps, restarts, step_size, early_stop, p)
    if gradient_noise is not None and not callable(gradient_noise):
        raise TypeError(f"gradient_noise must be a callable gradient_noise(step, y) -> noise "
                        f"broadcasting to x, or None, got {type(gradient_noise).__name__}")
    if momentum is not None:
        _validate.check_nonnegative(momentum, "decay_factor")
    dtype = p.x.dtype
    eps_t = tf.cast(eps, dtype)
    if step_size is None:
        step_size = eps_t * (1.0 if kind != "pgd" else 2.5) / float(steps)
    if l1_top_k is not None and isinstance(l1_top_k, float) and l1_top_k >= 1:
        l1_top_k = int(l1_top_k)
    cfg = (kind, norm, int(steps), int(restarts), bool(rand_init), bool(early_stop),
           None if momentum is None else float(momentum), l1_top_k, bool(jit_compile),
           gradient_noise)  # the callable itself: alive while its trace is cached
    key = p.key + cfg + spec_key((p.x, p.y, p.y_true)) + (tuple(p.lo.shape.as_list()),)
    fn = cached(p.owner, key, lambda: compile_iterative(
        p, norm=norm, steps=steps, restarts=restarts, rand_init=rand_init,
        early_stop=early_stop, momentum=None if momentum is None else float(momentum), l1_top_k=l1_top_k,
        jit_compile=jit_compile, gradient_noise=gradient_noise))
    seed_t, step_t = seed_tensor(seed), tf.cast(step_size, dtype)
    x_adv, (rows, frows) = run_in_chunks(p, lambda xc, yc, ytc, k: fn(
        xc, yc, ytc, eps_t, step_t, p.lo, p.hi, chunk_seed(seed_t, k)))
    if p.eager:
        frows += p.forward_passes
    return AttackResult(x_adv, rows, frows)


@tf.autograph.experimental.do_not_convert
def projected_gradient_descent(model: Any, x: Any, y: Any = None, *, eps: Any, norm: Any = "linf",
                               clip_min: Any, clip_max: Any, targeted: bool = False, seed: Any = None,
                               steps: int = 10, step_size: Any = None, restarts: int = 1,
                               rand_init: bool = True, early_stop: bool = False, objective: Any = "ce",
                               training: Any = False, jit_compile: bool = False,
                               l1_top_k: Any = DEFAULT_L1_TOP_K,
                               loss_fn: Callable | None = None,
                               batch_size: int | None = None,
                               gradient_noise: Callable | None = None) -> tf.Tensor:
    """PGD (Madry et al. 2018) under the L∞, L2 or L1 norm; returns ``x_adv``.

    Args:
      model: callable ``model(x, training=False) -> logits`` (a Keras model is one), or ``None``
        with ``loss_fn``.
      x: float batch ``[B, ...]`` inside ``[clip_min, clip_max]``; never modified.
      y: integer labels ``[B]``; ``None`` uses the model's predictions. With ``targeted=True``
        the target labels. With a callable ``objective`` anything it accepts.
      eps: radius of the ball (same units as ``x``); ``0`` returns ``x``.
      norm: ``"linf"`` (``np.inf``), ``"l2"`` (``2``) or ``"l1"`` (``1``).
      clip_min, clip_max: bounds of the input domain, scalars or per feature; ``None`` is
        unbounded. Required, nothing assumes ``[0, 1]``.
      targeted: maximise toward ``y`` instead of away from it.
      seed: int, ``tf.random.Generator`` or ``None`` (random) for the random starts.
      steps: gradient steps per restart. step_size: defaults to ``2.5 * eps / steps``.
      restarts: random starts; the worst case is kept per example.
      rand_init: start uniformly in the ball (``False`` starts at ``x``).
      early_stop: freeze examples once broken and stop when all are.
      objective: ``"ce"``, ``"cw"``, ``"dlr"`` or ``objective(logits, y) -> [B]`` to maximise.
      training: the mode the model is called in (default inference).
      jit_compile: compile the loop with XLA (often slower on CPU for small models).
      l1_top_k: L1 only: coordinates moved per step, an int or a fraction of the dimension.
      loss_fn: instead of a model, any differentiable per-example ``loss_fn(x_adv) -> [B]`` to
        maximise.
      batch_size: examples per compiled call; a larger ``x`` is attacked in chunks of this
        size (``None``: 1024, :data:`attacks._base.DEFAULT_BATCH_SIZE`), so memory stays that
        of one chunk. Chunk ``k`` draws its random starts from ``stateless_fold_in(seed, k)``:
        reproducible per ``(seed, batch_size)``; without random starts the result is the same
        as one call on the whole batch.
      gradient_noise: ``None``, or a callable ``gradient_noise(step, y) -> noise`` (``step``
        an int32 scalar tensor counting from 0, ``y`` the batch's ``y``, chunked with it)
        whose result, broadcasting to ``x``, is added to the gradient of every step before its
        direction is taken: each step follows ``dir(grad + noise)``. This is stochastic gradient
        Langevin dynamics (Welling & Teh 2011; SA-PPO's inner maximiser, Zhang et al. 2020,
        :func:`agents.observation_attacks.sgld_mad_attack`). Carry per-example noise in ``y``
        (a dict, with a callable ``objective``) so that it is drawn once and chunked with the
        batch. Every restart gets the same noise (the hook sees the step, not the restart).
        Traces are cached per callable object: pass the same function each call.

    >>> w = tf.constant([[1.0], [-2.0]])
    >>> model = lambda x, training=False: tf.concat([x @ w, -(x @ w)], axis=1)
    >>> x, y = tf.constant([[0.5, 0.5]]), tf.constant([1])
    >>> def push_down(step, y):  # far larger than the gradient, whose direction is (+, -)
    ...     return tf.fill([1, 2], -10.0)
    >>> for noise in (None, push_down):
    ...     x_adv = projected_gradient_descent(model, x, y, eps=0.1, clip_min=0.0, clip_max=1.0,
    ...                                        steps=5, rand_init=False, gradient_noise=noise)
    ...     print([round(float(v), 3) for v in x_adv[0]])
    [0.6, 0.4]
    [0.4, 0.4]
    """
    return run_iterative(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                         targeted=targeted, seed=seed, steps=steps, step_size=step_size,
                         restarts=restarts, rand_init=rand_init, early_stop=early_stop,
                         objective=objective, training=training, jit_compile=jit_compile,
                         l1_top_k=l1_top_k, loss_fn=loss_fn, kind="pgd",
                         batch_size=batch_size, gradient_noise=gradient_noise).x_adv


@tf.autograph.experimental.do_not_convert
def basic_iterative_method(model: Any, x: Any, y: Any = None, *, eps: Any, norm: Any = "linf", clip_min: Any,
                           clip_max: Any, targeted: bool = False, seed: Any = None, steps: int = 10,
                           step_size: Any = None, early_stop: bool = False, objective: Any = "ce",
                           training: Any = False, jit_compile: bool = False, l1_top_k: Any = DEFAULT_L1_TOP_K,
                           loss_fn: Callable | None = None, batch_size: int | None = None) -> tf.Tensor:
    """BIM (Kurakin et al. 2017): PGD from ``x`` without random start; step ``eps / steps``.

    Arguments as in :func:`projected_gradient_descent` (``batch_size``: examples per call).
    """
    return run_iterative(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                         targeted=targeted, seed=seed, steps=steps, step_size=step_size,
                         restarts=1, rand_init=False, early_stop=early_stop, objective=objective,
                         training=training, jit_compile=jit_compile, l1_top_k=l1_top_k,
                         loss_fn=loss_fn, kind="bim", batch_size=batch_size).x_adv


@tf.autograph.experimental.do_not_convert
def momentum_iterative_method(model: Any, x: Any, y: Any = None, *, eps: Any, norm: Any = "linf",
                              clip_min: Any, clip_max: Any, targeted: bool = False, seed: Any = None,
                              steps: int = 10, step_size: Any = None, decay_factor: float = 1.0,
                              early_stop: bool = False, objective: Any = "ce", training: Any = False,
                              jit_compile: bool = False, l1_top_k: Any = DEFAULT_L1_TOP_K,
                              loss_fn: Callable | None = None,
                              batch_size: int | None = None) -> tf.Tensor:
    """MIM (Dong et al. 2018): ``g <- mu g + grad / ||grad||_1``, step along ``g``'s direction.

    Arguments as in :func:`projected_gradient_descent` (``batch_size``: examples per call).
    """
    return run_iterative(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                         targeted=targeted, seed=seed, steps=steps, step_size=step_size,
                         restarts=1, rand_init=False, early_stop=early_stop, objective=objective,
                         training=training, jit_compile=jit_compile,
                         momentum=float(decay_factor), l1_top_k=l1_top_k,
                         loss_fn=loss_fn, kind="mim", batch_size=batch_size).x_adv


@tf.autograph.experimental.do_not_convert
def _pgd_run(model, x, y=None, *, eps=None, norm="linf", clip_min=None, clip_max=None,
             targeted=False, seed=None, steps=10, step_size=None, restarts=1, rand_init=True,
             early_stop=False, objective="ce", training=False, jit_compile=False,
             l1_top_k=DEFAULT_L1_TOP_K, loss_fn=None, batch_size=None, gradient_noise=None):
    return run_iterative(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                         targeted=targeted, seed=seed, steps=steps, step_size=step_size,
                         restarts=restarts, rand_init=rand_init, early_stop=early_stop,
                         objective=objective, training=training, jit_compile=jit_compile,
                         l1_top_k=l1_top_k, loss_fn=loss_fn, kind="pgd", batch_size=batch_size,
                         gradient_noise=gradient_noise)


@tf.autograph.experimental.do_not_convert
def _bim_run(model, x, y=None, *, eps=None, norm="linf", clip_min=None, clip_max=None,
             targeted=False, seed=None, steps=10, step_size=None, early_stop=False,
             objective="ce", training=False, jit_compile=False, l1_top_k=DEFAULT_L1_TOP_K,
             loss_fn=None, batch_size=None):
    return run_iterative(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                         targeted=targeted, seed=seed, steps=steps, step_size=step_size,
                         restarts=1, rand_init=False, early_stop=early_stop, objective=objective,
                         training=training, jit_compile=jit_compile, l1_top_k=l1_top_k,
                         loss_fn=loss_fn, kind="bim", batch_size=batch_size)


@tf.autograph.experimental.do_not_convert
def _mim_run(model, x, y=None, *, eps=None, norm="linf", clip_min=None, clip_max=None,
             targeted=False, seed=None, steps=10, step_size=None, decay_factor=1.0,
             early_stop=False, objective="ce", training=False, jit_compile=False,
             l1_top_k=DEFAULT_L1_TOP_K, loss_fn=None, batch_size=None):
    return run_iterative(model, x, y, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max,
                         targeted=targeted, seed=seed, steps=steps, step_size=step_size,
                         restarts=1, rand_init=False, early_stop=early_stop, objective=objective,
                         training=training, jit_compile=jit_compile,
                         momentum=float(decay_factor), l1_top_k=l1_top_k,
                         loss_fn=loss_fn, kind="mim", batch_size=batch_size)


class PGD(Attack):
    """Configured :func:`projected_gradient_descent`: ``PGD(eps=0.1, steps=20)(model, x, y)``."""

    name = "pgd"
    supports_early_stop = True
    _run = staticmethod(_pgd_run)


class BIM(Attack):
    """Configured :func:`basic_iterative_method`."""

    name = "bim"
    supports_early_stop = True
    _run = staticmethod(_bim_run)


class MIM(Attack):
    """Configured :func:`momentum_iterative_method`."""

    name = "mim"
    supports_early_stop = True
    _run = staticmethod(_mim_run)
