"""The adversarial trainer: a ``keras.Model`` whose ``train_step`` trains its classifier
adversarially, so ``compile()``, ``fit()``, callbacks, ``tf.distribute`` strategies and the
``.keras`` format all work as usual. The methods (madry, trades, fast, free, clean, ...) are
objects in :mod:`attacks.training.methods`, looked up by name in
:mod:`attacks.training.registry`; each step hands its method a
:class:`~attacks.training.StepContext` (:meth:`AdversarialTrainer.step_context`). This module
holds the Keras plumbing and the update (clipping, the non-finite guard, the all-reduce under a
strategy).

Common options: ``eps`` ramps up linearly over ``warmup_steps`` train steps; ``adv_ratio``
mixes the clean and adversarial losses (``(1 - r) * CE(clean) + r * CE(adv)``; TRADES ignores
it); adversarial examples are crafted with the model in inference mode
(``craft_training=False``, so dropout/batch-norm statistics do not move while crafting) and
the update runs in training mode. ``max_grad_norm`` clips by global norm and non-finite
gradients skip the update (counted in ``nonfinite_count``).

Random starts use stateless seeds derived from ``seed``, a step counter saved with the
model, and the replica id, so a run restored from a checkpoint continues the same random
stream. Under a ``tf.distribute`` strategy the gradients are all-reduced once, clipped and
checked as global gradients (every replica takes the same decision), then applied.

>>> from attacks.training import make_classifier
>>> trainer = AdversarialTrainer(make_classifier((8, 8), 10, width=4), method="fast", eps=0.1)
>>> trainer.steps, round(trainer.step_size, 3)
(1, 0.125)
>>> AdversarialTrainer(make_classifier((8, 8), 10, width=4), method="fast", norm="l1")
Traceback (most recent call last):
...
ValueError: norm 'l1' is not supported by method 'fast'; use linf or l2
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from robustgrad import checks as _checks
from robustgrad import memory as _memory
from robustgrad import transforms
from robustgrad.convolution import forward_input_gradients

from .._validate import MAX_STEPS
from .context import StepContext
from .crafting import accuracy, cross_entropy, robust_correct
from .method_options import TRAINER_OPTIONS, check_applicable
from .options import CraftingOptions, LossOptions, ScheduleOptions, UpdateOptions, split_options
from .recompute import checkpointed_call, recomputed_activations_call
from .registry import METHODS, get_method

__all__ = ["AdversarialTrainer"]


def _with_decay(g: tf.Tensor, v: Any, weight_decay: float) -> tf.Tensor:
    """``g + weight_decay * v``, computed once ``g`` is: without the dependency the graph
    executor runs the product (ready from the start of the step) first and keeps a copy of
    every weight alive through the whole backward pass (139 MiB for WRN-28-10)."""
    with tf.control_dependencies([g]):
        return g + tf.cast(weight_decay, g.dtype) * tf.cast(v, g.dtype)


def _check_applicable(method: str, eps: float, impl: Any, craft: CraftingOptions,
                      loss: LossOptions) -> None:
    """Refuse a non-default option that the built-in ``method`` does not read
    (:mod:`attacks.training.method_options`): ``ConfigError`` naming it. ``steps`` and
    ``step_size`` also accept the method's own defaults (what :meth:`AdversarialTrainer.
    get_config` saves)."""
    values = {**{f.name: getattr(craft, f.name) for f in dataclasses.fields(craft)},
              **{f.name: getattr(loss, f.name) for f in dataclasses.fields(loss)}}
    defaults: dict[str, tuple] = {
        f.name: (f.default,) for options in (CraftingOptions, LossOptions)
        for f in dataclasses.fields(options)}
    defaults["steps"] = (None, impl.default_steps)
    if craft.step_size is not None and method not in TRAINER_OPTIONS["step_size"]:
        defaults["step_size"] = (None, impl.default_step_size(eps, impl.default_steps))
    check_applicable(method, values, defaults, TRAINER_OPTIONS)


@keras.saving.register_keras_serializable(package="attacks")
class AdversarialTrainer(keras.Model):
    """A ``keras.Model`` that trains the wrapped classifier adversarially (see the module doc).

    The options come as four typed groups (:mod:`attacks.training.options`) or, field by
    field, as the flat keywords below (``AdversarialTrainer(clf, eps=0.1, beta=3.0)`` is
    ``AdversarialTrainer(clf, eps=0.1, loss=LossOptions(beta=3.0))``); the attributes and
    ``get_config`` stay flat.

    An option that the built-in ``method`` does not read (``awp_gamma`` with ``"madry"``,
    ``steps`` with ``"clean"``, ...: :mod:`attacks.training.method_options`) must keep its
    default: any other value is a ``ConfigError`` naming it, the method and the methods that
    read it, as ``train-classifier`` refuses the flag.

    Args:
        model: the classifier, a Keras model ``model(x, training) -> logits``.
        crafting: :class:`~attacks.training.options.CraftingOptions` (``norm``, ``clip_min``,
            ``clip_max``, ``steps``, ``step_size``, ``random_start``, ``craft_training``).
        loss: :class:`~attacks.training.options.LossOptions` (``beta``, ``adv_ratio``,
            ``label_smoothing``, ``awp_gamma``, ``kappa_final``, ``beta_final``, ``sigma``,
            ``noise_draws``).
        update: :class:`~attacks.training.options.UpdateOptions` (``max_grad_norm``,
            ``weight_decay``, ``max_nonfinite_steps``).
        schedule: :class:`~attacks.training.options.ScheduleOptions` (``warmup_steps``,
            ``warmup_delay``).
        method: one of ``"madry"``, ``"trades"``, ``"fast"``, ``"free"``, ``"mart"``,
            ``"awp"``, ``"ibp"``, ``"crown-ibp"``, ``"clean"``, ``"gaussian"``, ``"smoothadv"``
            (:data:`attacks.training.METHODS`), or a name given to
            :func:`attacks.training.register_method`.
        eps: the perturbation budget, in the units of the inputs; ``0 < eps <= clip_max - clip_min``.
        norm: ``"linf"`` or ``"l2"`` (``"l1"`` too for madry/trades; smoothadv: ``"l2"``);
            default ``"linf"``, ``"l2"`` for smoothadv.
        clip_min, clip_max: input bounds (scalars).
        steps: PGD steps (madry, trades) or replays (free); default per method
            (:data:`attacks.training.DEFAULT_STEPS`).
        step_size: PGD step (default ``2.5 * eps / steps``; fast: ``1.25 * eps``; free: ``eps``);
            a float is absolute, scaled with ``eps`` during warm-up.
        beta: the TRADES weight of the KL term.
        random_start: start PGD/FGSM from a uniform point of the ball.
        adv_ratio: weight of the adversarial loss, in [0, 1] (the rest on the clean loss).
        warmup_steps: linear eps ramp over this many train steps (0: none).
        craft_training: call the model in training mode while crafting (default False).
        max_grad_norm: clip the global gradient norm to this value (None: no clipping).
        eval_steps: PGD steps for the robust accuracy reported by ``evaluate()``/validation
            (0: clean accuracy only).
        max_nonfinite_steps: consecutive non-finite steps tolerated by the guard before
            :class:`attacks.training.NonFiniteGuard` stops training.
        seed: seed of the random starts.
        weight_decay: L2 weight decay added to the gradient as ``weight_decay * w`` for every
            trainable variable before clipping (PyTorch's coupled ``weight_decay``, which the
            published recipes use: Rice et al. 2020 5e-4 with SGD); 0 disables it.
        label_smoothing: smooth the one-hot targets of the training loss's cross-entropy
            terms by this amount in [0, 1) (crafting keeps the plain cross-entropy).
        awp_gamma: the relative size of method ``"awp"``'s weight perturbation (Wu et al.
            2020 use 0.01 with PGD training, 0.005 with TRADES).
        warmup_delay: train steps at eps 0 before the ``warmup_steps`` ramp starts (Gowal et
            al. 2018 train 2,000 steps clean before ramping; default 0).
        sigma: ``"smoothadv"``: the standard deviation (> 0) of the smoothing noise (method
            ``"gaussian"`` takes it from ``eps``).
        noise_draws: ``"smoothadv"``: the noise draws ``m`` per example (>= 1).
        kappa_final: certified training (``"ibp"``, ``"crown-ibp"``): the weight of the clean
            cross-entropy at full eps; it goes from 1 at eps 0 linearly in eps (0.5: Gowal et al.
            2018 and the CROWN-IBP code).
        recompute: what the update's training-mode forward pass keeps for the backward pass
            (the same outputs, gradients and batch-norm statistics in every mode):
            ``"activations"`` (default): of each batch norm -> ReLU -> convolution chain only
            the batch norm's input; the normalisation and the ReLU (element-wise) are recomputed
            when the gradient arrives, the convolutions are not
            (:func:`attacks.training.recomputed_activations_call`); models without such a
            chain run as ``"none"``. ``"none"``: everything the gradient needs.
            ``"blocks"`` (or ``True``): only the input of each residual block (each segment of
            :func:`attacks.training.checkpoint_segments`), the rest recomputed -- one more
            forward pass of the update -- and the C library made to return freed blocks of
            1 MiB or more to the system at once (:func:`robustgrad.memory.return_large_blocks`,
            for the rest of the process). A WRN-28-10 PGD-10 step at batch 128: see
            docs/benchmarks/training.md.
        convolutions: how the training step's 3x3 convolutions compute (crafting and
            update; the test step and every attack outside training stay ``"direct"``):
            ``"auto"`` (default: ``"winograd"`` when TensorFlow sees no GPU, else
            ``"direct"``), ``"direct"`` (TensorFlow's, values bit for bit) or ``"winograd"``
            (Winograd F(4x4, 3x3) compiled by XLA, for float32/float64 stride-1 "same" 3x3
            convolutions wide enough to pay, :func:`robustgrad.winograd.winograd_pays`: a
            WRN-28-10 PGD-10 step at batch 128 took 0.66x PyTorch's CPU time on a 2-core AVX2
            CPU, docs/benchmarks/training.md; outputs and gradients equal the direct ones to
            ~1e-5 of their largest entry in float32).
        beta_final: ``"crown-ibp"``: the weight of the CROWN-IBP bound (against IBP's) at full
            eps, from 1 at eps 0 (0: Zhang et al. 2020's default schedule; 1 keeps CROWN-IBP).
    """

    def __init__(
        self,
        model: Any,
        method: str = "madry",
        eps: float = 0.1,
        *,
        crafting: CraftingOptions | None = None,
        loss: LossOptions | None = None,
        update: UpdateOptions | None = None,
        schedule: ScheduleOptions | None = None,
        eval_steps: int = 10,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        groups, kwargs = split_options(kwargs, crafting=crafting, loss=loss, update=update,
                                       schedule=schedule)
        super().__init__(**kwargs)
        if isinstance(model, dict):
            model = keras.saving.deserialize_keras_object(model)
        if not callable(model):
            raise TypeError(f"model must be a Keras model returning logits; got {type(model)}")
        impl = get_method(method)
        craft = groups["crafting"]
        norm = impl.norms[0] if craft.norm is None else craft.norm
        if norm not in impl.norms:
            raise ValueError(f"norm {norm!r} is not supported by method {method!r}; use "
                             + " or ".join(impl.norms))
        _checks.number(eps, "eps")
        if norm == "linf":
            _checks.number(eps, "eps", minimum=0, maximum=craft.clip_max - craft.clip_min,
                           min_inclusive=False)
        else:
            _checks.number(eps, "eps", minimum=0, min_inclusive=False)
        if method in METHODS:  # a registered method may read any option
            _check_applicable(method, eps, impl, craft, groups["loss"])
        steps = impl.default_steps if craft.steps is None else craft.steps
        steps = _checks.positive_int(steps, "steps", minimum=impl.min_steps,
                                     maximum=impl.max_steps)
        step_size = (impl.default_step_size(eps, steps) if craft.step_size is None
                     else craft.step_size)
        impl.check_model(model)

        self.model = model
        self.method = method
        self.eps = float(eps)
        self.norm = norm
        self.steps = int(steps)
        self.step_size = float(step_size)
        self.eval_steps = _checks.positive_int(eval_steps, "eval_steps", minimum=0,
                                               maximum=MAX_STEPS)  # as every attack's steps
        self.seed = int(seed)
        self._set_options(craft, groups["loss"], groups["update"], groups["schedule"])
        self._grad_step: transforms.GradientStep | None = None

        # state saved with the model (checkpoint and .keras): the train-step counter drives
        # the eps warm-up and the stateless random stream.
        self.step_counter = self.add_weight(
            shape=(), dtype="int64", initializer="zeros", trainable=False,
            name="step_counter", aggregation="only_first_replica")
        self.nonfinite_count = self.add_weight(
            shape=(), dtype="int64", initializer="zeros", trainable=False,
            name="nonfinite_count", aggregation="only_first_replica")
        metrics = keras.metrics
        self.loss_tracker = metrics.Mean(name="loss")
        self.adv_acc_tracker = metrics.Mean(name="adv_accuracy")
        self.clean_acc_tracker = metrics.Mean(name="clean_accuracy")
        self.robust_acc_tracker = metrics.Mean(name="robust_accuracy")
        self.grad_norm_tracker = metrics.Mean(name="grad_norm")
        self.eps_tracker = metrics.Mean(name="eps")
        self._eval_fn = None
        if getattr(model, "built", False):
            self.built = True

    def _set_options(self, craft: CraftingOptions, loss: LossOptions, update: UpdateOptions,
                     schedule: ScheduleOptions) -> None:
        """The options' fields as the trainer's flat attributes (what ``get_config`` saves)."""
        self.clip_min, self.clip_max = float(craft.clip_min), float(craft.clip_max)
        self.random_start = bool(craft.random_start)
        self.craft_training = bool(craft.craft_training)
        self.beta, self.adv_ratio = float(loss.beta), float(loss.adv_ratio)
        self.label_smoothing, self.awp_gamma = float(loss.label_smoothing), float(loss.awp_gamma)
        self.kappa_final, self.beta_final = float(loss.kappa_final), float(loss.beta_final)
        self.sigma = float(loss.sigma)
        self.noise_draws = int(loss.noise_draws)
        self.max_grad_norm = (None if update.max_grad_norm is None
                              else float(update.max_grad_norm))
        self.weight_decay = float(update.weight_decay)
        self.max_nonfinite_steps = int(update.max_nonfinite_steps)
        self.recompute = update.recompute
        self.convolutions = update.convolutions
        if self.recompute == "blocks":  # the memory-saving mode: freed maps leave the process
            _memory.return_large_blocks()
        self.warmup_steps = int(schedule.warmup_steps)
        self.warmup_delay = int(schedule.warmup_delay)

    # ---------------------------------------------------------------- keras plumbing
    def call(self, x: Any, training: Any = False) -> tf.Tensor:
        """The wrapped classifier's logits ``[B, C]`` for ``x [B, ...]``."""
        return self.model(x, training=training)

    def build(self, input_shape: Any = None) -> None:
        """Build the wrapped classifier for ``input_shape`` (``[B, ...]``) if it is not built."""
        if not self.model.built and input_shape is not None:
            self.model.build(input_shape)
        self.built = True

    @property
    def metrics(self) -> list:
        """The running means Keras resets each epoch: loss, adversarial/clean/robust accuracy,
        gradient norm and eps."""
        return [self.loss_tracker, self.adv_acc_tracker, self.clean_acc_tracker,
                self.robust_acc_tracker, self.grad_norm_tracker, self.eps_tracker]

    def get_config(self) -> dict:
        """The constructor arguments (the classifier serialised), for ``.keras`` saving."""
        return {
            "model": keras.saving.serialize_keras_object(self.model),
            "method": self.method, "eps": self.eps, "norm": self.norm,
            "clip_min": self.clip_min, "clip_max": self.clip_max, "steps": self.steps,
            "step_size": self.step_size, "beta": self.beta, "random_start": self.random_start,
            "adv_ratio": self.adv_ratio, "warmup_steps": self.warmup_steps,
            "craft_training": self.craft_training, "max_grad_norm": self.max_grad_norm,
            "eval_steps": self.eval_steps, "max_nonfinite_steps": self.max_nonfinite_steps,
            "seed": self.seed, "weight_decay": self.weight_decay, "recompute": self.recompute,
            "convolutions": self.convolutions,
            "label_smoothing": self.label_smoothing, "awp_gamma": self.awp_gamma,
            "warmup_delay": self.warmup_delay, "kappa_final": self.kappa_final,
            "beta_final": self.beta_final, "sigma": self.sigma, "noise_draws": self.noise_draws,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config: dict) -> Any:
        """The trainer :meth:`get_config` described (the classifier deserialised)."""
        config = dict(config)
        config["model"] = keras.saving.deserialize_keras_object(config["model"])
        return cls(**config)

    # ---------------------------------------------------------------- crafting
    def _step_seed(self, salt: int):
        """A stateless seed from (seed, step counter, replica id, salt)."""
        ctx = tf.distribute.get_replica_context()
        rid = ctx.replica_id_in_sync_group if ctx is not None else 0
        base = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(self.step_counter, tf.int64)])
        s = tf.random.experimental.stateless_fold_in(tf.cast(base, tf.int32), rid)
        return tf.random.experimental.stateless_fold_in(s, salt)

    def _current_eps(self):
        if self.warmup_steps <= 0 and self.warmup_delay <= 0:
            return tf.constant(self.eps, tf.float32)
        done = tf.cast(self.step_counter + 1 - self.warmup_delay, tf.float32)
        frac = done / float(max(self.warmup_steps, 1)) if self.warmup_steps > 0 else \
            tf.cast(done > 0, tf.float32)
        return self.eps * tf.clip_by_value(frac, 0.0, 1.0)

    def _logits(self, x, training):
        if training and self.recompute == "blocks":
            return tf.cast(checkpointed_call(self.model, x, training=True), tf.float32)
        if training and self.recompute == "activations":
            return tf.cast(recomputed_activations_call(self.model, x, training=True), tf.float32)
        return tf.cast(self.model(x, training=training), tf.float32)

    def _craft_scale(self):
        # float16 compute: scale the objective so small input gradients do not underflow;
        # the ascent directions (sign / normalised) do not depend on the scale.
        policy = getattr(self.model, "dtype_policy", None)
        compute = getattr(policy, "compute_dtype", "float32")
        return 1024.0 if compute == "float16" else 1.0

    def step_context(self, eps: Any = None) -> StepContext:
        """The :class:`~attacks.training.StepContext` a method sees at the current step:
        ``eps`` (a number or float32 scalar tensor) defaults to the current warm-up budget."""
        if eps is None:
            eps = self._current_eps()
        elif not isinstance(eps, tf.Tensor):
            eps = tf.constant(float(eps), tf.float32)
        return StepContext(self, eps)

    def craft(self, x: Any, y: Any, eps: float | None = None, steps: int | None = None,
              seed: Any = None) -> tf.Tensor:
        """Adversarial examples for ``(x, y)`` as this trainer's method crafts them.

        ``x`` float ``[B, ...]``, ``y`` int ``[B]``; ``eps`` defaults to the current (warm-up)
        budget, ``steps`` to the trainer's, ``seed`` to one derived from the step counter."""
        x = tf.convert_to_tensor(x, tf.float32)
        y = tf.cast(tf.reshape(y, [-1]), tf.int32)
        ctx = self.step_context(None if eps is None else float(eps))
        seed = ctx.step_seed(1) if seed is None else seed
        return get_method(self.method).craft(
            ctx, x, y, eps=ctx.eps, step_size=ctx.step_size,
            steps=self.steps if steps is None else steps, seed=seed)

    # ---------------------------------------------------------------- the update
    def _num_replicas(self):
        return tf.distribute.get_strategy().num_replicas_in_sync

    def _transform(self):
        """The core gradient transformation: clip by global norm, inside the non-finite guard."""

        inner = (transforms.clip_by_global_norm(self.max_grad_norm) if self.max_grad_norm is not None
                 else transforms.identity())
        return transforms.apply_if_finite(inner, max_nonfinite_steps=self.max_nonfinite_steps)

    def _maybe_build_grad_step(self):
        """Single device, no loss scaling: a :class:`robustgrad.transforms.GradientStep`
        (its state is a tf.Variable, saved by :class:`EpochCheckpoint`). Under a strategy or
        loss scaling the stateless clip runs on the all-reduced gradients instead."""
        step = getattr(self, "_grad_step", None)
        if step is not None and step.optimizer is self.optimizer:
            return
        self._grad_step = None
        if not self.model.built:
            return
        if getattr(self, "optimizer", None) is None:
            return
        if (tf.distribute.has_strategy() or getattr(self, "_distribute_strategy", None) is not None
                or isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)):
            return

        variables = self.model.trainable_variables
        if not self.optimizer.built:
            self.optimizer.build(variables)
        self._grad_step = transforms.GradientStep(self._transform(), self.optimizer, variables)

    @property
    def gradient_step(self) -> Any:
        """The core GradientStep used for updates (None under a strategy or loss scaling)."""
        return getattr(self, "_grad_step", None)

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        """``keras.Model.fit``; arrays ``x, y`` are checked against the classifier first
        (example shape, labels in ``[0, C)``, counts: one-line ``ValueError``)."""
        x = args[0] if args else kwargs.get("x")
        y = args[1] if len(args) > 1 else kwargs.get("y")
        if y is not None and isinstance(x, (np.ndarray, tf.Tensor)):
            from .._base import check_classification_data

            check_classification_data(self.model, x, y, finite=False)
        self._maybe_build_grad_step()
        return super().fit(*args, **kwargs)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras 3.15's version reduces the first distributed batch eagerly, which fails under
        # MultiWorkerMirroredStrategy; the wrapped classifier is already built, so build only
        # the optimizer (no data needed).
        if self.model.built and getattr(self, "_distribute_strategy", None) is not None:
            with self.distribute_strategy.scope():
                if self.optimizer is not None and not self.optimizer.built:
                    self.optimizer.build(self.trainable_variables)
            return
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def _apply_gradients(self, grads, variables):
        """Update the classifier; returns the global gradient norm (before clipping).

        Single device: the core ``GradientStep`` (clip by global norm inside
        ``apply_if_finite``; a rejected step never reaches the optimizer). Under a strategy: the
        gradients are all-reduced once here, clipped and checked as global gradients (every
        replica takes the same decision), and handed to the optimizer divided by the replica
        count (the Keras optimizer all-reduces -- sums -- them again). With loss scaling the
        ``LossScaleOptimizer`` skips non-finite steps and adapts its scale.
        """
        missing = [getattr(v, "path", v.name) for g, v in zip(grads, variables) if g is None]
        if missing:  # at trace time: once per compiled step, not per batch
            warnings.warn(f"no gradient reaches {len(missing)} trainable variable(s) of the "
                          f"classifier ({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}"
                          "): the loss does not depend on them, so only weight decay moves them; "
                          "freeze them (trainable=False, --freeze) if that is intended",
                          UserWarning, stacklevel=2)
        grads = [tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v)
                 for g, v in zip(grads, variables)]
        if self.weight_decay > 0.0:
            grads = [_with_decay(g, v, self.weight_decay) for g, v in zip(grads, variables)]
        step = self.gradient_step
        if step is not None:
            stats = step(grads)
            self.nonfinite_count.assign_add(1 - tf.cast(stats["applied"], tf.int64))
            return stats["grad_norm"]

        n = self._num_replicas()
        ctx = tf.distribute.get_replica_context()
        opt = self.optimizer
        lso = isinstance(opt, keras.optimizers.LossScaleOptimizer)
        loss_scale = tf.cast(opt.dynamic_scale, tf.float32) if lso else None
        if n > 1 and ctx is not None:
            grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        unscaled = [g / loss_scale for g in grads] if lso else grads
        gnorm = transforms.global_norm(unscaled)
        finite = transforms.all_finite(unscaled)
        if self.max_grad_norm is not None:
            clip = transforms.clip_by_global_norm(self.max_grad_norm)
            unscaled, _ = clip.update(unscaled, clip.init(variables))
        inv = 1.0 / n if (n > 1 and ctx is not None) else 1.0
        if lso:
            # the loss-scale optimizer skips non-finite steps and adapts its scale itself
            opt.apply([g * loss_scale * inv for g in unscaled], variables)
        elif tf.__internal__.distribute.strategy_supports_no_merge_call() or ctx is None or n == 1:
            def apply():
                opt.apply([g * inv for g in unscaled], variables)
                return tf.constant(True)

            tf.cond(finite, apply, lambda: tf.constant(False))
        else:
            # a cond around a synchronisation point must run in cross-replica context (the
            # pattern of keras' LossScaleOptimizer): every replica computed the same `finite`.
            def cross(distribution, grads, finite):
                finite = distribution.experimental_local_results(finite)[0]

                def apply():
                    distribution.extended.call_for_each_replica(opt.apply,
                                                                args=(grads, variables))
                    return tf.constant(True)

                tf.cond(finite, apply, lambda: tf.constant(False))

            ctx.merge_call(cross, args=([g * inv for g in unscaled], finite))
        self.nonfinite_count.assign_add(1 - tf.cast(finite, tf.int64))
        return gnorm

    def _training_ce(self, logits, y):
        """Per-example cross-entropy of the training loss ``[B]`` (label-smoothed when
        ``label_smoothing > 0``; crafting always uses the plain one)."""
        if self.label_smoothing <= 0.0:
            return cross_entropy(logits, y)
        num_classes = tf.shape(logits)[-1]
        targets = tf.one_hot(y, num_classes, dtype=tf.float32)
        k = tf.cast(num_classes, tf.float32)
        targets = targets * (1.0 - self.label_smoothing) + self.label_smoothing / k
        return tf.nn.softmax_cross_entropy_with_logits(targets, tf.cast(logits, tf.float32))

    def _scaled(self, loss):
        """The per-replica loss to differentiate: mean over the local batch / replicas."""
        n = self._num_replicas()
        if n > 1:
            loss = loss / float(n)
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            loss = self.optimizer.scale_loss(loss)
        return loss

    def train_step(self, data: Any) -> dict:
        """One update on a batch ``(x [B, ...], y [B])`` by the training method (craft, loss,
        guarded gradient step); returns the logs (loss, accuracies, gradient norm, eps).

        Keras ``Conv2D`` layers take their input gradient by a forward convolution here
        (:func:`robustgrad.convolution.forward_input_gradients`: the same values, faster on
        Eigen's CPU kernels), in the crafting passes and in the update; their wide 3x3
        convolutions by Winograd with ``convolutions="winograd"`` (``"auto"`` on a host
        without a GPU)."""
        with forward_input_gradients(winograd=self.winograd_tile()):
            return self._train_step(data)

    def winograd_tile(self) -> int | None:
        """The train step's Winograd tile (4) or None, by ``convolutions``."""
        mode = self.convolutions
        if mode == "auto":
            mode = "direct" if tf.config.list_physical_devices("GPU") else "winograd"
        return 4 if mode == "winograd" else None

    def _train_step(self, data: Any) -> dict:
        x, y = data[0], data[1]
        x = tf.cast(tf.convert_to_tensor(x), tf.float32)
        y = tf.cast(tf.reshape(y, [-1]), tf.int32)
        ctx = self.step_context()
        eps = ctx.eps
        out = get_method(self.method).update(ctx, x, y)

        self.step_counter.assign_add(1)
        self.loss_tracker.update_state(out.loss)
        self.adv_acc_tracker.update_state(accuracy(out.adv_logits, y))
        if out.clean_logits is not None:
            self.clean_acc_tracker.update_state(accuracy(out.clean_logits, y))
        self.grad_norm_tracker.update_state(out.grad_norm)
        self.eps_tracker.update_state(eps)
        logs = {"loss": self.loss_tracker.result(),
                "adv_accuracy": self.adv_acc_tracker.result(),
                "grad_norm": self.grad_norm_tracker.result(),
                "eps": self.eps_tracker.result()}
        if out.clean_logits is not None:
            logs["clean_accuracy"] = self.clean_acc_tracker.result()
        return self._for_reduction(logs)

    def _for_reduction(self, logs):
        # Keras reduces step outputs under a multi-worker strategy with
        # strategy.reduce("MEAN", v, axis=0), which needs a batch axis: give scalars one.
        strategy = getattr(self, "_distribute_strategy", None)
        if strategy is not None and getattr(strategy.extended, "_in_multi_worker_mode",
                                            lambda: False)():
            return {k: tf.reshape(v, [1]) for k, v in logs.items()}
        return logs

    def test_step(self, data: Any) -> dict:
        """Clean loss and accuracy on a batch ``(x, y)``, and PGD-``eval_steps`` robust accuracy
        when ``eval_steps > 0``; returns the logs (convolutions as in :meth:`train_step`)."""
        with forward_input_gradients():
            return self._test_step(data)

    def _test_step(self, data: Any) -> dict:
        x, y = data[0], data[1]
        x = tf.cast(tf.convert_to_tensor(x), tf.float32)
        y = tf.cast(tf.reshape(y, [-1]), tf.int32)
        logits = self._logits(x, False)
        self.loss_tracker.update_state(tf.reduce_mean(cross_entropy(logits, y)))
        self.clean_acc_tracker.update_state(accuracy(logits, y))
        logs = {"loss": self.loss_tracker.result(),
                "clean_accuracy": self.clean_acc_tracker.result()}
        if self.eval_steps > 0:
            robust = robust_correct(lambda z: self._logits(z, False), x, y, eps=self.eps,
                                    norm=self.norm, clip_min=self.clip_min,
                                    clip_max=self.clip_max, steps=self.eval_steps)
            self.robust_acc_tracker.update_state(tf.reduce_mean(robust))
            logs["robust_accuracy"] = self.robust_acc_tracker.result()
        return self._for_reduction(logs)
