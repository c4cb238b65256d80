"""Adversarial-training methods as small objects: each has one ``craft`` and one ``loss``.

A method is a stateless object registered by name; :class:`~attacks.training.AdversarialTrainer`
looks its method up by ``trainer.method`` at every step and calls ``method.update`` (craft,
then differentiate ``loss``, then apply). Adding a method is writing one more class here.

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

>>> METHODS
('madry', 'trades', 'fast', 'free', 'mart', 'awp', 'ibp', 'crown-ibp', 'clean', 'gaussian', 'smoothadv')
>>> DEFAULT_STEPS["madry"], get_method("fast").default_step_size(0.1, 1)
(10, 0.125)
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import tensorflow as tf

from robustgrad.checks import NORMS, choice

from .. import norms as _norms
from .crafting import ascend, cross_entropy, kl_to_logits

__all__ = ["CERTIFIED_METHODS", "DEFAULT_STEPS", "METHODS", "StepOutputs", "TrainingMethod",
           "get_method", "worst_case_logits"]


class StepOutputs(NamedTuple):
    """What one training update produced (scalars are float32)."""

    loss: tf.Tensor            #: the training loss (mean over the batch; replays averaged)
    grad_norm: tf.Tensor       #: global gradient norm before clipping
    adv_logits: tf.Tensor      #: logits the adversarial accuracy is measured on ``[B, C]``
    clean_logits: Any          #: logits on the clean batch ``[B, C]``, or None if not computed


class TrainingMethod:
    """One adversarial-training method. ``trainer`` is the calling ``AdversarialTrainer``; a
    method reads its configuration (``norm``, bounds, ``beta``, ...) and its hooks
    (``_logits``, ``_craft_scale``, ``_scaled``, ``_apply_gradients``) and keeps no state."""

    name: ClassVar[str] = ""
    default_steps: ClassVar[int] = 0   #: PGD steps (madry, trades), replays (free)
    min_steps: ClassVar[int] = 0
    norms: ClassVar[tuple] = NORMS
    adversarial: ClassVar[bool] = True  #: whether ``update`` crafts before the loss
    certified: ClassVar[bool] = False   #: whether the loss bounds the model (ibp, crown-ibp)

    def default_step_size(self, eps: float, steps: int) -> float:
        """The step size when the user gives none (absolute, at full ``eps``)."""
        return 2.5 * eps / max(steps, 1)

    def check_model(self, model: Any) -> None:
        """Refuse, before training, a classifier this method cannot train (``ValueError``)."""

    def craft(self, trainer: Any, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
              step_size: tf.Tensor, steps: int, seed: tf.Tensor) -> tf.Tensor:
        """Adversarial examples ``[B, ...]`` for ``(x, y)``: PGD on the cross-entropy."""
        return _pgd_on_ce(trainer, x, y, eps=eps, step_size=step_size, steps=steps, seed=seed)

    def loss(self, trainer: Any, x: tf.Tensor, x_adv: tf.Tensor | None,
             y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
        """``(loss, adv_logits, clean_logits or None)``, the model called in training mode:
        ``CE(adv)``, mixed ``r CE(adv) + (1 - r) CE(clean)`` when ``adv_ratio = r < 1``."""
        adv_logits = trainer._logits(x_adv, True)
        loss = tf.reduce_mean(trainer._training_ce(adv_logits, y))
        clean_logits = None
        if trainer.adv_ratio < 1.0:
            clean_logits = trainer._logits(x, True)
            loss = (trainer.adv_ratio * loss + (1.0 - trainer.adv_ratio)
                    * tf.reduce_mean(trainer._training_ce(clean_logits, y)))
        return loss, adv_logits, clean_logits

    def update(self, trainer: Any, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
               scale: tf.Tensor) -> StepOutputs:
        """Craft, differentiate :meth:`loss` w.r.t. the classifier's weights, apply."""
        variables = trainer.model.trainable_variables
        x_adv = None
        if self.adversarial:
            x_adv = self.craft(trainer, x, y, eps=eps, step_size=trainer.step_size * scale,
                               steps=trainer.steps, seed=trainer._step_seed(1))
        (loss, adv_logits, clean_logits), grads = _loss_and_gradients(
            trainer, lambda: self.loss(trainer, x, x_adv, y), variables)
        gnorm = trainer._apply_gradients(grads, variables)
        return StepOutputs(loss, gnorm, adv_logits, clean_logits)


def _loss_and_gradients(trainer, loss_fn, variables):
    """``(loss_fn(), gradients)``: ``loss_fn() -> (loss, logits, clean logits or None)``
    differentiated w.r.t. ``variables`` through the trainer's per-replica scaling."""
    with tf.GradientTape() as tape:
        outputs = loss_fn()
        scaled = trainer._scaled(outputs[0])
    return outputs, tape.gradient(scaled, variables)


def _crafting_logits(trainer):
    """``x -> float32 logits`` in the crafting mode, scaled for float16 compute."""
    scale = trainer._craft_scale()
    training = trainer.craft_training
    if scale == 1.0:
        return lambda z: trainer._logits(z, training)
    return lambda z: trainer._logits(z, training) * scale


def _pgd_on_ce(trainer, x, y, *, eps, step_size, steps, seed):
    return ascend(_crafting_logits(trainer), lambda z: cross_entropy(z, y), x, eps=eps,
                  step_size=step_size, steps=steps, norm=trainer.norm,
                  clip_min=trainer.clip_min, clip_max=trainer.clip_max, seed=seed,
                  start="uniform" if trainer.random_start else "none")


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

    def craft(self, trainer: Any, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
              step_size: tf.Tensor, steps: int, seed: tf.Tensor) -> tf.Tensor:
        """One FGSM step from a uniform start in the ball, not clipped to the box (``steps``
        is ignored); without ``random_start``, from ``x``."""
        if not trainer.random_start:
            return _pgd_on_ce(trainer, x, y, eps=eps, step_size=step_size, steps=1, seed=seed)
        norm = trainer.norm

        def start(x_, s):
            return x_ + _norms.random_in_ball(tf.shape(x_), tf.cast(eps, x_.dtype), norm, seed=s,
                                              dtype=x_.dtype)

        return ascend(_crafting_logits(trainer), lambda z: cross_entropy(z, y), x, eps=eps,
                      step_size=step_size, steps=1, norm=norm, clip_min=trainer.clip_min,
                      clip_max=trainer.clip_max, seed=seed, start=start)


class Trades(TrainingMethod):
    name = "trades"
    default_steps = 10
    min_steps = 1

    def craft(self, trainer: Any, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
              step_size: tf.Tensor, steps: int, seed: tf.Tensor) -> tf.Tensor:
        """PGD on ``KL(f(x) || f(x'))`` from ``x + 0.001 N(0, 1)`` (no start in the ball)."""
        p_clean = tf.stop_gradient(tf.nn.softmax(trainer._logits(x, trainer.craft_training)))

        def start(x_, s):
            x0 = x_ + 0.001 * tf.random.stateless_normal(tf.shape(x_), s, dtype=x_.dtype)
            return _norms.clip_to_bounds(x0, trainer.clip_min, trainer.clip_max)

        return ascend(_crafting_logits(trainer), lambda z: kl_to_logits(p_clean, z), x,
                      eps=eps, step_size=step_size, steps=steps, norm=trainer.norm,
                      clip_min=trainer.clip_min, clip_max=trainer.clip_max, seed=seed,
                      start=start)

    def loss(self, trainer: Any, x: tf.Tensor, x_adv: tf.Tensor | None,
             y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
        """``CE(f(x), y) + beta KL(f(x) || f(x_adv))`` (``adv_ratio`` does not apply)."""
        clean_logits = trainer._logits(x, True)
        adv_logits = trainer._logits(x_adv, True)
        kl = kl_to_logits(tf.nn.softmax(clean_logits), adv_logits)
        loss = tf.reduce_mean(trainer._training_ce(clean_logits, y) + trainer.beta * kl)
        return loss, adv_logits, clean_logits


class Free(TrainingMethod):
    name = "free"
    default_steps = 4
    min_steps = 1
    norms = ("linf", "l2")

    def default_step_size(self, eps: float, steps: int) -> float:
        return eps

    def craft(self, trainer: Any, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
              step_size: tf.Tensor, steps: int, seed: tf.Tensor) -> tf.Tensor:
        raise ValueError("method 'free' crafts inside its train step")

    def loss(self, trainer: Any, x: tf.Tensor, x_adv: tf.Tensor | None,
             y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
        """``CE(f(x_adv), y)`` of one replay."""
        logits = trainer._logits(x_adv, True)
        return tf.reduce_mean(trainer._training_ce(logits, y)), logits, None

    def update(self, trainer: Any, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
               scale: tf.Tensor) -> StepOutputs:
        """``steps`` replays of the batch, each one weight update and one FGSM step on the
        perturbation from the same backward pass (unrolled: the replay count is small)."""
        norm, lo, hi = trainer.norm, trainer.clip_min, trainer.clip_max
        variables = trainer.model.trainable_variables
        delta = _norms.random_in_ball(tf.shape(x), eps, norm, seed=trainer._step_seed(1),
                                      dtype=x.dtype)
        delta = _norms.clip_to_bounds(x + delta, lo, hi) - x
        losses, gnorms = [], []
        for _ in range(trainer.steps):
            with tf.GradientTape(persistent=True) as tape:
                tape.watch(delta)
                loss, logits, _ = self.loss(trainer, x, x + delta, y)
                scaled = trainer._scaled(loss)
            grads = tape.gradient(scaled, variables)
            g_delta = tape.gradient(scaled, delta)
            del tape
            gnorms.append(trainer._apply_gradients(grads, variables))
            delta = delta + trainer.step_size * scale * _norms.steepest_ascent(g_delta, norm)
            delta = _norms.project(delta, eps, norm)
            delta = tf.stop_gradient(_norms.clip_to_bounds(x + delta, lo, hi) - x)
            losses.append(loss)
        return StepOutputs(tf.add_n(losses) / float(len(losses)),
                           tf.add_n(gnorms) / float(len(gnorms)), logits, None)


class Mart(TrainingMethod):
    name = "mart"
    default_steps = 10
    min_steps = 1

    def loss(self, trainer: Any, x: tf.Tensor, x_adv: tf.Tensor | None,
             y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
        """``BCE(f(x_adv), y) + beta * KL(f(x) || f(x_adv)) * (1 - f(x)_y)`` (batch means)."""
        clean_logits = trainer._logits(x, True)
        adv_logits = trainer._logits(x_adv, True)
        p_adv = tf.nn.softmax(adv_logits)
        p_clean = tf.nn.softmax(clean_logits)
        true = tf.one_hot(y, tf.shape(adv_logits)[-1], dtype=p_adv.dtype)
        strongest_wrong = tf.reduce_max(p_adv * (1.0 - true), axis=-1)  # probabilities >= 0
        boosted = trainer._training_ce(adv_logits, y) - tf.math.log(
            1.0001 - strongest_wrong + 1e-12)
        kl = kl_to_logits(p_clean, adv_logits)
        weight = 1.0 - tf.reduce_sum(p_clean * true, axis=-1)
        loss = tf.reduce_mean(boosted) + trainer.beta * tf.reduce_mean(kl * weight)
        return loss, adv_logits, clean_logits


class Awp(TrainingMethod):
    name = "awp"
    default_steps = 10
    min_steps = 1

    def update(self, trainer: Any, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
               scale: tf.Tensor) -> StepOutputs:
        """Craft (PGD), perturb the kernels along the adversarial loss's gradient, take the
        weight gradient there, undo the perturbation, apply."""
        model = trainer.model
        variables = model.trainable_variables
        x_adv = self.craft(trainer, x, y, eps=eps, step_size=trainer.step_size * scale,
                           steps=trainer.steps, seed=trainer._step_seed(1))
        kernels = [v for v in variables if len(v.shape) >= 2]
        frozen_stats = [tf.identity(v) for v in model.non_trainable_variables]
        with tf.GradientTape() as tape:
            probe = tf.reduce_mean(cross_entropy(trainer._logits(x_adv, True), y))
        probe_grads = tape.gradient(probe, kernels)
        for v, value in zip(model.non_trainable_variables, frozen_stats):
            v.assign(value)  # the probe pass must not move batch-norm statistics
        deltas = []
        for v, g in zip(kernels, probe_grads):
            g = tf.zeros_like(v) if g is None else tf.cast(g, v.dtype)
            delta = trainer.awp_gamma * tf.norm(v) * g / (tf.norm(g) + 1e-20)
            v.assign_add(delta)
            deltas.append(delta)
        (loss, adv_logits, clean_logits), grads = _loss_and_gradients(
            trainer, lambda: self.loss(trainer, x, x_adv, y), variables)
        for v, delta in zip(kernels, deltas):
            v.assign_sub(delta)
        gnorm = trainer._apply_gradients(grads, variables)
        return StepOutputs(loss, gnorm, adv_logits, clean_logits)


class Clean(TrainingMethod):
    name = "clean"
    default_steps = 0
    adversarial = False

    def default_step_size(self, eps: float, steps: int) -> float:
        return eps

    def loss(self, trainer: Any, x: tf.Tensor, x_adv: tf.Tensor | None,
             y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, Any]:
        """``CE(f(x), y)``; ``x_adv`` is ignored."""
        logits = trainer._logits(x, True)
        return tf.reduce_mean(trainer._training_ce(logits, y)), logits, logits


from .certified import CrownIbp, Ibp, worst_case_logits  # noqa: E402, F401  (likewise)
from .noise import Gaussian  # noqa: E402  (it subclasses TrainingMethod, defined above)
from .smoothadv import SmoothAdv  # noqa: E402  (likewise)

_ALL: tuple[TrainingMethod, ...] = (Madry(), Trades(), Fast(), Free(), Mart(), Awp(), Ibp(),
                                    CrownIbp(), Clean(), Gaussian(), SmoothAdv())
_REGISTRY: dict[str, TrainingMethod] = {m.name: m for m in _ALL}

#: the certified-training methods (their loss bounds the model; the model must be supported
#: by :mod:`robustgrad.bounds`)
CERTIFIED_METHODS: tuple[str, ...] = tuple(n for n, m in _REGISTRY.items() if m.certified)

#: the method names, in the order the documentation and the CLI list them
METHODS: tuple[str, ...] = tuple(_REGISTRY)

#: default number of crafting steps per method (PGD steps for madry/trades, replays for free)
DEFAULT_STEPS: dict[str, int] = {name: m.default_steps for name, m in _REGISTRY.items()}


def get_method(name: str) -> TrainingMethod:
    """The method object registered as ``name``; ``ValueError`` naming the choices otherwise."""
    return _REGISTRY[choice(name, "method", METHODS)]
