"""Adversarial-training methods as small objects: each has one ``craft`` and one ``loss``.

A method is a stateless object registered by name (:mod:`attacks.training.registry`);
:class:`~attacks.training.AdversarialTrainer` looks its method up by ``trainer.method`` at every
step and calls ``method.update(ctx, x, y)`` (craft, then differentiate ``loss``, then apply)
with the step's :class:`~attacks.training.StepContext` ``ctx``: the logits, the training
cross-entropy, the gradient application and the step's seed, never the trainer itself. Adding
a method is writing one more subclass of :class:`TrainingMethod` and registering it
(:func:`~attacks.training.register_method`).

* ``"madry"`` -- PGD adversarial training (Madry et al., "Towards Deep Learning Models
  Resistant to Adversarial Attacks", ICLR 2018): ``steps`` PGD steps of ``step_size``
  (default ``2.5 * eps / steps``) from a uniform random start, cross-entropy on the result.
* ``"trades"`` -- TRADES (Zhang et al., "Theoretically Principled Trade-off between Robustness
  and Accuracy", ICML 2019): ``CE(f(x), y) + beta * KL(f(x) || f(x'))``, ``x'`` maximising the
  KL term by PGD from ``x + 0.001 * N(0, 1)``.
* ``"fast"`` -- "Fast is better than free" (Wong et al., ICLR 2020): FGSM from a uniform random
  start with step ``1.25 * eps``. Pair it with
  :class:`~attacks.training.CatastrophicOverfittingGuard`. As in their MNIST code, the random
  start is not clipped to the input box before the gradient is taken (the step's result is:
  the adversarial example always lies in the ball and the box); on the 28x28 MNIST subset,
  clipping the start (as the other methods do) gave 91.8% APGD-CE accuracy at eps 0.1 over 6
  seeds with a spread of 4 points, the unclipped start 92.4% with a spread of 1.4.
* ``"free"`` -- "Adversarial training for free!" (Shafahi et al., NeurIPS 2019): each batch is
  replayed ``replays`` times; one backward pass gives both the weight gradient (applied) and
  the input gradient (an FGSM step of size ``eps`` on the perturbation). The perturbation
  starts uniformly at random in the ball for each batch (the paper carries it over from the
  previous batch; a fresh start keeps batches independent, which deterministic resume and
  ``tf.distribute`` need). Because crafting and update share one pass, ``free`` crafts in
  training mode and has its own ``update``.
* ``"mart"`` -- MART (Wang et al., "Improving adversarial robustness requires revisiting
  misclassified examples", ICLR 2020): PGD on the cross-entropy as madry, then
  ``BCE(f(x'), y) + beta * KL(f(x) || f(x')) * (1 - f(x)_y)``, where the boosted
  cross-entropy ``BCE`` adds ``-log(1 - max_{k != y} f(x')_k)`` to the cross-entropy: the KL
  term weighs the examples the model gets wrong (low ``f(x)_y``) more. ``beta`` is shared
  with TRADES (the paper uses 6 on CIFAR-10 too).
* ``"awp"`` -- adversarial weight perturbation on top of PGD training (AT-AWP; Wu, Xia & Wang,
  "Adversarial weight perturbation helps robust generalization", NeurIPS 2020): after crafting
  ``x'``, each kernel ``w`` (rank >= 2: dense and convolution weights) moves by
  ``awp_gamma * ||w|| * g / ||g||`` along the gradient ``g`` of the adversarial loss, the
  weight gradient is taken there, the kernels move back and the optimizer applies it. One more
  forward/backward pass per step; batch-norm statistics do not move on that extra pass.
* ``"ibp"`` -- certified training with interval bound propagation (Gowal et al., "On the
  Effectiveness of Interval Bound Propagation for Training Verifiably Robust Models", 2018):
  ``kappa * CE(f(x), y) + (1 - kappa) * CE(z_hat, y)``, where the worst-case logits ``z_hat``
  are the negated lower bounds of the margins ``z_y - z_j`` over the L-inf ball (``z_hat_y =
  0``; :func:`worst_case_logits`), computed by the core's bound engine
  (:mod:`robustgrad.bounds`) and differentiated w.r.t. the weights. ``kappa`` follows ``eps``
  during the warm-up: ``kappa = 1 - (1 - kappa_final) * eps_t / eps`` (1 at ``eps_t = 0``,
  ``kappa_final = 0.5`` at full ``eps``; the schedule of Gowal et al. and of the CROWN-IBP
  code). Pair it with ``warmup_steps`` (the eps ramp) and ``warmup_delay`` (steps at eps 0).
* ``"crown-ibp"`` -- CROWN-IBP (Zhang et al., "Towards Stable and Efficient Training of
  Verifiably Robust Neural Networks", ICLR 2020): as ``"ibp"`` with the margin lower bound
  ``beta * CROWN-IBP + (1 - beta) * IBP``, ``beta = 1 - (1 - beta_final) * eps_t / eps`` (from
  1 to ``beta_final = 0`` over the ramp; the CROWN-IBP pass is skipped once ``beta`` is 0).
  The bounds read batch normalisation's moving statistics (inference mode); the clean term
  runs the model in training mode.
* ``"clean"`` -- plain training with the same machinery (the reference for cost ratios).
* ``"gaussian"`` -- Gaussian data augmentation with standard deviation ``eps``, the base
  classifier of randomized smoothing (Cohen et al. 2019; :mod:`attacks.training.noise`).
* ``"smoothadv"`` -- SmoothAdv (Salman et al. 2019): L2 PGD of radius ``eps`` against the
  smoothed classifier (``noise_draws`` draws of std ``sigma``), then the cross-entropy on the
  noisy copies of the result (:mod:`attacks.training.smoothadv`).

The PGD crafting of madry, trades and fast runs through the library's one attack engine
(:func:`attacks.training.crafting.ascend`).

>>> Madry().default_steps, Fast().default_step_size(0.1, 1), Trades().norms
(10, 0.125, ('linf', 'l2', 'l1'))
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import tensorflow as tf

from robustgrad.checks import NORMS

from .. import norms as _norms
from .._validate import MAX_STEPS
from .context import StepContext
from .crafting import ascend, cross_entropy, kl_to_logits

__all__ = ["Awp", "Clean", "Fast", "Free", "Madry", "Mart", "StepOutputs", "Trades",
           "TrainingMethod", "pgd_on_cross_entropy"]


class StepOutputs(NamedTuple):
    """What one training update produced (scalars are float32)."""

    loss: tf.Tensor            #: the training loss (mean over the batch; replays averaged)
    grad_norm: tf.Tensor       #: global gradient norm before clipping
    adv_logits: tf.Tensor      #: logits the adversarial accuracy is measured on ``[B, C]``
    clean_logits: Any          #: logits on the clean batch ``[B, C]``, or None if not computed


MAX_FREE_REPLAYS = 64
"""``"free"``'s most replays (``steps``; Shafahi et al. use 2-10): each replay is unrolled in
the traced train step, so ``steps=1000`` would trace for minutes and ``10**6`` for hours
(``robustgrad train-classifier --method free --steps`` has the same bound)."""


class TrainingMethod:
    """One training method, stateless. Every entry takes the step's
    :class:`~attacks.training.StepContext` ``ctx``: the configuration (``ctx.norm``, bounds,
    ``ctx.beta``, ...) and the operations (``ctx.logits``, ``ctx.training_ce``,
    ``ctx.loss_and_gradients``, ``ctx.apply_gradients``, ``ctx.step_seed``).

    A subclass sets ``name`` and overrides what differs: :meth:`loss` (the default update
    crafts with :meth:`craft`, then differentiates it), :meth:`craft`, or the whole
    :meth:`update`. Register it with :func:`~attacks.training.register_method`."""

    name: ClassVar[str] = ""
    default_steps: ClassVar[int] = 0   #: PGD steps (madry, trades), replays (free)
    min_steps: ClassVar[int] = 0
    max_steps: ClassVar[int] = MAX_STEPS  #: a compiled loop is deaf to Ctrl-C until it ends
    norms: ClassVar[tuple] = NORMS
    adversarial: ClassVar[bool] = True  #: whether ``update`` crafts before the loss
    certified: ClassVar[bool] = False   #: whether the loss bounds the model (ibp, crown-ibp)

    def default_step_size(self, eps: float, steps: int) -> float:
        """The step size when the user gives none (absolute, at full ``eps``)."""
        return 2.5 * eps / max(steps, 1)

    def check_model(self, model: Any) -> None:
        """Refuse, before training, a classifier this method cannot train (``ValueError``)."""

    def craft(self, ctx: StepContext, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
              step_size: tf.Tensor, steps: int, seed: tf.Tensor) -> tf.Tensor:
        """Adversarial examples ``[B, ...]`` for ``(x, y)``: PGD on the cross-entropy."""
        return pgd_on_cross_entropy(ctx, x, y, eps=eps, step_size=step_size, steps=steps,
                                    seed=seed)

    def loss(self, ctx: StepContext, x: tf.Tensor, x_adv: tf.Tensor | None,
             y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
        """``(loss, adv_logits, clean_logits or None)``, the model called in training mode:
        ``CE(adv)``, mixed ``r CE(adv) + (1 - r) CE(clean)`` when ``adv_ratio = r < 1``."""
        adv_logits = ctx.logits(x_adv, True)
        loss = tf.reduce_mean(ctx.training_ce(adv_logits, y))
        clean_logits = None
        if ctx.adv_ratio < 1.0:
            clean_logits = ctx.logits(x, True)
            loss = (ctx.adv_ratio * loss + (1.0 - ctx.adv_ratio)
                    * tf.reduce_mean(ctx.training_ce(clean_logits, y)))
        return loss, adv_logits, clean_logits

    def update(self, ctx: StepContext, x: tf.Tensor, y: tf.Tensor) -> StepOutputs:
        """Craft, differentiate :meth:`loss` w.r.t. the classifier's weights, apply."""
        variables = ctx.model.trainable_variables
        x_adv = None
        if self.adversarial:
            x_adv = self.craft(ctx, x, y, eps=ctx.eps, step_size=ctx.step_size,
                               steps=ctx.steps, seed=ctx.step_seed(1))
        (loss, adv_logits, clean_logits), grads = ctx.loss_and_gradients(
            lambda: self.loss(ctx, x, x_adv, y), variables)
        gnorm = ctx.apply_gradients(grads, variables)
        return StepOutputs(loss, gnorm, adv_logits, clean_logits)


def pgd_on_cross_entropy(ctx: StepContext, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
                         step_size: tf.Tensor, steps: int, seed: tf.Tensor) -> tf.Tensor:
    """PGD on the cross-entropy as the context crafts it: ``steps`` steps of ``step_size``
    in ``ctx.norm``'s ball of radius ``eps`` and the box, from a uniform random start when
    ``ctx.random_start`` (stateless, from the ``[2]`` ``seed``). Returns ``x_adv [B, ...]``."""
    return ascend(ctx.crafting_logits(), lambda z: cross_entropy(z, y), x, eps=eps,
                  step_size=step_size, steps=steps, norm=ctx.norm,
                  clip_min=ctx.clip_min, clip_max=ctx.clip_max, seed=seed,
                  start="uniform" if ctx.random_start else "none")


class Madry(TrainingMethod):
    name = "madry"
    default_steps = 10
    min_steps = 1


class Fast(TrainingMethod):
    name = "fast"
    default_steps = 1
    norms = ("linf", "l2")

    def default_step_size(self, eps: float, steps: int) -> float:
        return 1.25 * eps

    def craft(self, ctx: StepContext, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
              step_size: tf.Tensor, steps: int, seed: tf.Tensor) -> tf.Tensor:
        """One FGSM step from a uniform start in the ball, not clipped to the box (``steps``
        is ignored); without ``random_start``, from ``x``."""
        if not ctx.random_start:
            return pgd_on_cross_entropy(ctx, x, y, eps=eps, step_size=step_size, steps=1,
                                        seed=seed)
        norm = ctx.norm

        def start(x_, s):
            return x_ + _norms.random_in_ball(tf.shape(x_), tf.cast(eps, x_.dtype), norm, seed=s,
                                              dtype=x_.dtype)

        return ascend(ctx.crafting_logits(), lambda z: cross_entropy(z, y), x, eps=eps,
                      step_size=step_size, steps=1, norm=norm, clip_min=ctx.clip_min,
                      clip_max=ctx.clip_max, seed=seed, start=start)


class Trades(TrainingMethod):
    name = "trades"
    default_steps = 10
    min_steps = 1

    def craft(self, ctx: StepContext, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
              step_size: tf.Tensor, steps: int, seed: tf.Tensor) -> tf.Tensor:
        """PGD on ``KL(f(x) || f(x'))`` from ``x + 0.001 N(0, 1)`` (no start in the ball)."""
        p_clean = tf.stop_gradient(tf.nn.softmax(ctx.logits(x, ctx.craft_training)))

        def start(x_, s):
            x0 = x_ + 0.001 * tf.random.stateless_normal(tf.shape(x_), s, dtype=x_.dtype)
            return _norms.clip_to_bounds(x0, ctx.clip_min, ctx.clip_max)

        return ascend(ctx.crafting_logits(), lambda z: kl_to_logits(p_clean, z), x,
                      eps=eps, step_size=step_size, steps=steps, norm=ctx.norm,
                      clip_min=ctx.clip_min, clip_max=ctx.clip_max, seed=seed,
                      start=start)

    def loss(self, ctx: StepContext, x: tf.Tensor, x_adv: tf.Tensor | None,
             y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
        """``CE(f(x), y) + beta KL(f(x) || f(x_adv))`` (``adv_ratio`` does not apply)."""
        clean_logits = ctx.logits(x, True)
        adv_logits = ctx.logits(x_adv, True)
        kl = kl_to_logits(tf.nn.softmax(clean_logits), adv_logits)
        loss = tf.reduce_mean(ctx.training_ce(clean_logits, y) + ctx.beta * kl)
        return loss, adv_logits, clean_logits


class Free(TrainingMethod):
    name = "free"
    default_steps = 4
    min_steps = 1
    max_steps = MAX_FREE_REPLAYS  # unrolled in the traced step
    norms = ("linf", "l2")

    def default_step_size(self, eps: float, steps: int) -> float:
        return eps

    def craft(self, ctx: StepContext, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
              step_size: tf.Tensor, steps: int, seed: tf.Tensor) -> tf.Tensor:
        raise ValueError("method 'free' crafts inside its train step")

    def loss(self, ctx: StepContext, x: tf.Tensor, x_adv: tf.Tensor | None,
             y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
        """``CE(f(x_adv), y)`` of one replay."""
        logits = ctx.logits(x_adv, True)
        return tf.reduce_mean(ctx.training_ce(logits, y)), logits, None

    def update(self, ctx: StepContext, x: tf.Tensor, y: tf.Tensor) -> StepOutputs:
        """``steps`` replays of the batch, each one weight update and one FGSM step on the
        perturbation from the same backward pass (unrolled: the replay count is small)."""
        norm, lo, hi, eps = ctx.norm, ctx.clip_min, ctx.clip_max, ctx.eps
        variables = ctx.model.trainable_variables
        delta = _norms.random_in_ball(tf.shape(x), eps, norm, seed=ctx.step_seed(1),
                                      dtype=x.dtype)
        delta = _norms.clip_to_bounds(x + delta, lo, hi) - x
        losses, gnorms = [], []
        for _ in range(ctx.steps):
            with tf.GradientTape(persistent=True) as tape:
                tape.watch(delta)
                loss, logits, _ = self.loss(ctx, x, x + delta, y)
                scaled = ctx.scale_loss(loss)
            grads = tape.gradient(scaled, variables)
            g_delta = tape.gradient(scaled, delta)
            del tape
            gnorms.append(ctx.apply_gradients(grads, variables))
            delta = delta + ctx.step_size * _norms.steepest_ascent(g_delta, norm)
            delta = _norms.project(delta, eps, norm)
            delta = tf.stop_gradient(_norms.clip_to_bounds(x + delta, lo, hi) - x)
            losses.append(loss)
        return StepOutputs(tf.add_n(losses) / float(len(losses)),
                           tf.add_n(gnorms) / float(len(gnorms)), logits, None)


class Mart(TrainingMethod):
    name = "mart"
    default_steps = 10
    min_steps = 1

    def loss(self, ctx: StepContext, x: tf.Tensor, x_adv: tf.Tensor | None,
             y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
        """``BCE(f(x_adv), y) + beta * KL(f(x) || f(x_adv)) * (1 - f(x)_y)`` (batch means)."""
        clean_logits = ctx.logits(x, True)
        adv_logits = ctx.logits(x_adv, True)
        p_adv = tf.nn.softmax(adv_logits)
        p_clean = tf.nn.softmax(clean_logits)
        true = tf.one_hot(y, tf.shape(adv_logits)[-1], dtype=p_adv.dtype)
        strongest_wrong = tf.reduce_max(p_adv * (1.0 - true), axis=-1)  # probabilities >= 0
        boosted = ctx.training_ce(adv_logits, y) - tf.math.log(
            1.0001 - strongest_wrong + 1e-12)
        kl = kl_to_logits(p_clean, adv_logits)
        weight = 1.0 - tf.reduce_sum(p_clean * true, axis=-1)
        loss = tf.reduce_mean(boosted) + ctx.beta * tf.reduce_mean(kl * weight)
        return loss, adv_logits, clean_logits


class Awp(TrainingMethod):
    name = "awp"
    default_steps = 10
    min_steps = 1

    def update(self, ctx: StepContext, x: tf.Tensor, y: tf.Tensor) -> StepOutputs:
        """Craft (PGD), perturb the kernels along the adversarial loss's gradient, take the
        weight gradient there, undo the perturbation, apply."""
        model = ctx.model
        variables = model.trainable_variables
        x_adv = self.craft(ctx, x, y, eps=ctx.eps, step_size=ctx.step_size,
                           steps=ctx.steps, seed=ctx.step_seed(1))
        kernels = [v for v in variables if len(v.shape) >= 2]
        frozen_stats = [tf.identity(v) for v in model.non_trainable_variables]
        with tf.GradientTape() as tape:
            probe = tf.reduce_mean(cross_entropy(ctx.logits(x_adv, True), y))
        probe_grads = tape.gradient(probe, kernels)
        for v, value in zip(model.non_trainable_variables, frozen_stats):
            v.assign(value)  # the probe pass must not move batch-norm statistics
        deltas = []
        for v, g in zip(kernels, probe_grads):
            g = tf.zeros_like(v) if g is None else tf.cast(g, v.dtype)
            delta = ctx.awp_gamma * tf.norm(v) * g / (tf.norm(g) + 1e-20)
            v.assign_add(delta)
            deltas.append(delta)
        (loss, adv_logits, clean_logits), grads = ctx.loss_and_gradients(
            lambda: self.loss(ctx, x, x_adv, y), variables)
        for v, delta in zip(kernels, deltas):
            v.assign_sub(delta)
        gnorm = ctx.apply_gradients(grads, variables)
        return StepOutputs(loss, gnorm, adv_logits, clean_logits)


class Clean(TrainingMethod):
    name = "clean"
    default_steps = 0
    adversarial = False

    def default_step_size(self, eps: float, steps: int) -> float:
        return eps

    def loss(self, ctx: StepContext, x: tf.Tensor, x_adv: tf.Tensor | None,
             y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
        """``CE(f(x), y)``; ``x_adv`` is ignored."""
        logits = ctx.logits(x, True)
        return tf.reduce_mean(ctx.training_ce(logits, y)), logits, logits
