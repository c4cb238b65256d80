"""Adversarial training of classifiers, Keras-native.

:class:`AdversarialTrainer` is a ``keras.Model`` that wraps a classifier (any Keras model
returning logits) and replaces ``train_step`` with an adversarial one, so ``compile()``,
``fit()``, callbacks, ``tf.distribute`` strategies and the ``.keras`` format all work as usual::

    import attacks, keras
    clf = attacks.training.make_classifier((8, 8, 1), 10)
    trainer = attacks.AdversarialTrainer(clf, method="madry", eps=0.1, steps=10)
    trainer.compile(optimizer=keras.optimizers.Adam(1e-3))
    trainer.fit(x_train, y_train, batch_size=64, epochs=40, validation_data=(x_test, y_test))
    clf.save("robust.keras")                 # the plain classifier, no custom objects
    trainer.save("trainer.keras")            # the trainer; load it after ``import attacks``

Methods (``method=``):

* ``"madry"`` -- PGD adversarial training (Madry et al., "Towards Deep Learning Models
  Resistant to Adversarial Attacks", ICLR 2018): ``steps`` PGD steps of ``step_size``
  (default ``2.5 * eps / steps``) from a uniform random start, cross-entropy on the result.
* ``"trades"`` -- TRADES (Zhang et al., "Theoretically Principled Trade-off between Robustness
  and Accuracy", ICML 2019): ``CE(f(x), y) + beta * KL(f(x) || f(x'))``, ``x'`` maximising the
  KL term by PGD from ``x + 0.001 * N(0, 1)``.
* ``"fast"`` -- "Fast is better than free" (Wong et al., ICLR 2020): FGSM from a uniform random
  start with step ``1.25 * eps``. Pair it with :class:`CatastrophicOverfittingGuard`.
* ``"free"`` -- "Adversarial training for free!" (Shafahi et al., NeurIPS 2019): each batch is
  replayed ``replays`` times; one backward pass gives both the weight gradient (applied) and
  the input gradient (an FGSM step of size ``eps`` on the perturbation). The perturbation
  starts uniformly at random in the ball for each batch (the paper carries it over from the
  previous batch; a fresh start keeps batches independent, which deterministic resume and
  ``tf.distribute`` need). Because crafting and update share one pass, ``free`` crafts in
  training mode.
* ``"clean"`` -- plain training with the same machinery (the reference for cost ratios).

Common options: ``eps`` ramps up linearly over ``warmup_steps`` train steps; ``adv_ratio``
mixes the clean and adversarial losses (``(1 - r) * CE(clean) + r * CE(adv)``; TRADES ignores
it); adversarial examples are crafted with the model in inference mode
(``craft_training=False``, so dropout/batch-norm statistics do not move while crafting) and
the update runs in training mode. ``max_grad_norm`` clips by global norm and
non-finite gradients skip the update (counted in the ``nonfinite_steps`` metric).

Random starts use stateless seeds derived from ``seed``, a step counter saved with the
model, and the replica id, so a run restored from a checkpoint continues the same random
stream. Under a ``tf.distribute`` strategy the gradients are all-reduced once, clipped and
checked as global gradients (every replica takes the same decision), then applied.
"""

from __future__ import annotations

import fnmatch
import math
import re

import keras
import numpy as np
import tensorflow as tf

from attacks import norms as _norms

__all__ = [
    "METHODS",
    "AdversarialTrainer",
    "CatastrophicOverfittingGuard",
    "EpochCheckpoint",
    "EpochTimer",
    "NonFiniteGuard",
    "ScalarLogger",
    "epoch_dataset",
    "freeze_layers",
    "make_classifier",
    "robust_accuracy",
]

METHODS = ("madry", "trades", "fast", "free", "clean")

# default number of crafting steps per method (PGD steps for madry/trades, replays for free)
DEFAULT_STEPS = {"madry": 10, "trades": 10, "fast": 1, "free": 4, "clean": 0}


def _is_number(v):
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def make_classifier(input_shape, num_classes, width: int = 32, name: str = "classifier"):
    """A small CNN returning logits (no softmax): 3 conv layers, 2 max-pools, 2 dense layers.

    ``width`` is the channel count of the first conv layer (then 2x, 4x). On 8x8 digits with
    ``width=32`` it has ~0.2M parameters.
    """
    input_shape = tuple(int(d) for d in input_shape)
    if len(input_shape) == 2:
        input_shape = input_shape + (1,)
    if len(input_shape) != 3:
        raise ValueError(f"input_shape must be (H, W) or (H, W, C); got {input_shape}")
    if int(num_classes) < 2:
        raise ValueError(f"num_classes must be >= 2; got {num_classes}")
    L = keras.layers
    pool = input_shape[0] >= 4 and input_shape[1] >= 4
    layers = [
        keras.Input(input_shape),
        L.Conv2D(width, 3, padding="same", activation="relu", name="conv1"),
        L.Conv2D(2 * width, 3, padding="same", activation="relu", name="conv2"),
    ]
    if pool:
        layers.append(L.MaxPooling2D(2, name="pool1"))
    layers.append(L.Conv2D(4 * width, 3, padding="same", activation="relu", name="conv3"))
    if pool and input_shape[0] >= 8:
        layers.append(L.MaxPooling2D(2, name="pool2"))
    layers += [
        L.Flatten(name="flatten"),
        L.Dense(4 * width, activation="relu", name="dense1"),
        L.Dense(int(num_classes), name="logits", dtype="float32"),
    ]
    return keras.Sequential(layers, name=name)


def freeze_layers(model, patterns):
    """Set ``trainable=False`` on every layer whose name matches one of ``patterns``.

    A pattern is a glob (``conv*``) or, prefixed with ``re:``, a regular expression
    (``re:^conv[12]$``). Returns the frozen layer names; ``ValueError`` when a pattern matches
    nothing (naming it and the available layers). Frozen layers drop out of
    ``trainable_variables``, so the optimizer never sees them (the same effect as a masked
    gradient transformation that zeroes their updates, without optimizer state for them).
    """
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p.strip()]
    layers = list(_iter_layers(model))
    frozen = []
    for pat in patterns:
        pat = pat.strip()
        if pat.startswith("re:"):
            rx = re.compile(pat[3:])
            hits = [layer for layer in layers if rx.search(layer.name)]
        else:
            hits = [layer for layer in layers if fnmatch.fnmatchcase(layer.name, pat)]
        if not hits:
            raise ValueError(
                f"freeze pattern {pat!r} matches no layer; layers are: "
                + ", ".join(layer.name for layer in layers)
            )
        for layer in hits:
            layer.trainable = False
            if layer.name not in frozen:
                frozen.append(layer.name)
    return frozen


def _iter_layers(model):
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers") and layer is not model:
            yield from _iter_layers(layer)


def _looks_like_probabilities(outputs) -> bool:
    out = np.asarray(outputs, dtype=np.float64)
    if out.ndim != 2 or out.shape[0] == 0:
        return False
    return bool(np.all(out >= -1e-6) and np.allclose(out.sum(axis=1), 1.0, atol=1e-3))


def check_classifier(model, x_sample, num_classes: int):
    """Raise ``ValueError`` if ``model`` outputs probabilities or the wrong number of classes."""
    out = model(tf.convert_to_tensor(x_sample[:32]), training=False)
    out = np.asarray(out)
    if out.ndim != 2:
        raise ValueError(f"the model must output logits of shape (batch, classes); got {out.shape}")
    if out.shape[1] != num_classes:
        raise ValueError(
            f"the labels have {num_classes} classes but the model outputs {out.shape[1]} logits"
        )
    if _looks_like_probabilities(out):
        raise ValueError(
            "the model outputs probabilities (rows are non-negative and sum to 1): remove the "
            "final softmax and output logits; attacks through saturated probabilities give "
            "vanishing input gradients (gradient masking)"
        )


@keras.saving.register_keras_serializable(package="attacks")
class AdversarialTrainer(keras.Model):
    """A ``keras.Model`` that trains the wrapped classifier adversarially (see the module doc).

    Args:
        model: the classifier, a Keras model ``model(x, training) -> logits``.
        method: one of ``"madry"``, ``"trades"``, ``"fast"``, ``"free"``, ``"clean"``.
        eps: the perturbation budget, in the units of the inputs; ``0 < eps <= clip_max - clip_min``.
        norm: ``"linf"`` or ``"l2"`` (``"l1"`` too for madry/trades).
        clip_min, clip_max: input bounds (scalars).
        steps: PGD steps (madry, trades) or replays (free); default per method.
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
            :class:`NonFiniteGuard` stops training.
        seed: seed of the random starts.
    """

    def __init__(
        self,
        model,
        method="madry",
        eps=0.1,
        norm="linf",
        clip_min=0.0,
        clip_max=1.0,
        steps=None,
        step_size=None,
        beta=6.0,
        random_start=True,
        adv_ratio=1.0,
        warmup_steps=0,
        craft_training=False,
        max_grad_norm=None,
        eval_steps=10,
        max_nonfinite_steps=10,
        seed=0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(model, dict):
            model = keras.saving.deserialize_keras_object(model)
        if not callable(model):
            raise TypeError(f"model must be a Keras model returning logits; got {type(model)}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
        norm = _norms.canonical_norm(norm)
        if method in ("fast", "free") and norm == "l1":
            raise ValueError(f"norm 'l1' is not supported by method {method!r}; use linf or l2")
        for name, v in (("eps", eps), ("clip_min", clip_min), ("clip_max", clip_max),
                        ("beta", beta), ("adv_ratio", adv_ratio)):
            if not _is_number(v) or not math.isfinite(float(v)):
                raise ValueError(f"{name} must be a finite number; got {v!r}")
        if not clip_min < clip_max:
            raise ValueError(f"clip_min ({clip_min}) must be < clip_max ({clip_max})")
        if norm == "linf" and not 0 < eps <= clip_max - clip_min:
            raise ValueError(
                f"eps must be in (0, clip_max - clip_min] = (0, {clip_max - clip_min:g}]; got {eps}"
            )
        if not eps > 0:
            raise ValueError(f"eps must be > 0; got {eps}")
        if steps is None:
            steps = DEFAULT_STEPS[method]
        if not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ValueError(f"steps must be a non-negative integer; got {steps!r}")
        if method in ("madry", "trades", "free") and steps < 1:
            raise ValueError(f"steps must be >= 1 for method {method!r}; got {steps}")
        if step_size is not None and (not _is_number(step_size) or not step_size > 0):
            raise ValueError(f"step_size must be a positive number; got {step_size!r}")
        if beta < 0:
            raise ValueError(f"beta must be >= 0; got {beta}")
        if not 0.0 <= adv_ratio <= 1.0:
            raise ValueError(f"adv_ratio must be in [0, 1]; got {adv_ratio}")
        if not isinstance(warmup_steps, (int, np.integer)) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be a non-negative integer; got {warmup_steps!r}")
        if max_grad_norm is not None and (not _is_number(max_grad_norm) or max_grad_norm <= 0):
            raise ValueError(f"max_grad_norm must be a positive number or None; got {max_grad_norm}")
        if not isinstance(eval_steps, (int, np.integer)) or eval_steps < 0:
            raise ValueError(f"eval_steps must be a non-negative integer; got {eval_steps!r}")

        self.model = model
        self.method = method
        self.eps = float(eps)
        self.norm = norm
        self.clip_min = float(clip_min)
        self.clip_max = float(clip_max)
        self.steps = int(steps)
        if step_size is None:
            step_size = {"madry": 2.5 * eps / max(steps, 1), "trades": 2.5 * eps / max(steps, 1),
                         "fast": 1.25 * eps, "free": eps, "clean": eps}[method]
        self.step_size = float(step_size)
        self.beta = float(beta)
        self.random_start = bool(random_start)
        self.adv_ratio = float(adv_ratio)
        self.warmup_steps = int(warmup_steps)
        self.craft_training = bool(craft_training)
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.eval_steps = int(eval_steps)
        self.max_nonfinite_steps = int(max_nonfinite_steps)
        self.seed = int(seed)
        self._grad_step = None

        # state saved with the model (checkpoint and .keras): the train-step counter drives
        # the eps warm-up and the stateless random stream.
        self.step_counter = self.add_weight(
            shape=(), dtype="int64", initializer="zeros", trainable=False,
            name="step_counter", aggregation="only_first_replica")
        self.nonfinite_count = self.add_weight(
            shape=(), dtype="int64", initializer="zeros", trainable=False,
            name="nonfinite_count", aggregation="only_first_replica")
        M = keras.metrics
        self.loss_tracker = M.Mean(name="loss")
        self.adv_acc_tracker = M.Mean(name="adv_accuracy")
        self.clean_acc_tracker = M.Mean(name="clean_accuracy")
        self.robust_acc_tracker = M.Mean(name="robust_accuracy")
        self.grad_norm_tracker = M.Mean(name="grad_norm")
        self.eps_tracker = M.Mean(name="eps")
        self._eval_fn = None
        if getattr(model, "built", False):
            self.built = True

    # ---------------------------------------------------------------- keras plumbing
    def call(self, x, training=False):
        return self.model(x, training=training)

    def build(self, input_shape=None):
        if not self.model.built and input_shape is not None:
            self.model.build(input_shape)
        self.built = True

    @property
    def metrics(self):
        return [self.loss_tracker, self.adv_acc_tracker, self.clean_acc_tracker,
                self.robust_acc_tracker, self.grad_norm_tracker, self.eps_tracker]

    def get_config(self):
        return {
            "model": keras.saving.serialize_keras_object(self.model),
            "method": self.method, "eps": self.eps, "norm": self.norm,
            "clip_min": self.clip_min, "clip_max": self.clip_max, "steps": self.steps,
            "step_size": self.step_size, "beta": self.beta, "random_start": self.random_start,
            "adv_ratio": self.adv_ratio, "warmup_steps": self.warmup_steps,
            "craft_training": self.craft_training, "max_grad_norm": self.max_grad_norm,
            "eval_steps": self.eval_steps, "max_nonfinite_steps": self.max_nonfinite_steps,
            "seed": self.seed, "name": self.name,
        }

    @classmethod
    def from_config(cls, config):
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
        if self.warmup_steps <= 0:
            return tf.constant(self.eps, tf.float32)
        frac = tf.cast(self.step_counter + 1, tf.float32) / float(self.warmup_steps)
        return self.eps * tf.minimum(frac, 1.0)

    def _logits(self, x, training):
        return tf.cast(self.model(x, training=training), tf.float32)

    def _input_grad(self, x_adv, loss_fn, training):
        with tf.GradientTape() as tape:
            tape.watch(x_adv)
            obj = tf.reduce_sum(loss_fn(self._logits(x_adv, training)))
            scale = self._craft_scale()
            if scale != 1.0:
                obj = obj * scale
        return tape.gradient(obj, x_adv)

    def _craft_scale(self):
        # float16 compute: scale the objective so small input gradients do not underflow;
        # the ascent directions (sign / normalised) do not depend on the scale.
        policy = getattr(self.model, "dtype_policy", None)
        compute = getattr(policy, "compute_dtype", "float32")
        return 1024.0 if compute == "float16" else 1.0

    def _pgd(self, x, loss_fn, eps, steps, step_size, random_start, seed, norm=None):
        """``steps`` steps of projected steepest ascent on ``loss_fn(logits)`` (a tf.while_loop)."""
        norm = norm or self.norm
        if random_start:
            delta = _norms.random_in_ball(tf.shape(x), eps, norm, seed=seed, dtype=x.dtype)
        else:
            delta = tf.zeros_like(x)
        x_adv = _norms.clip_to_bounds(x + delta, self.clip_min, self.clip_max)

        def body(i, x_adv):
            g = self._input_grad(x_adv, loss_fn, self.craft_training)
            x_new = x_adv + step_size * _norms.steepest_ascent(g, norm)
            x_new = x + _norms.project(x_new - x, eps, norm)
            x_new = _norms.clip_to_bounds(x_new, self.clip_min, self.clip_max)
            return i + 1, tf.stop_gradient(x_new)

        _, x_adv = tf.while_loop(lambda i, _: i < steps, body, (tf.constant(0), x_adv),
                                 parallel_iterations=1)
        return tf.stop_gradient(x_adv)

    def craft(self, x, y, eps=None, steps=None, seed=None):
        """Adversarial examples for ``(x, y)`` as this trainer's method crafts them."""
        x = tf.convert_to_tensor(x, tf.float32)
        y = tf.cast(tf.reshape(y, [-1]), tf.int32)
        eps = self._current_eps() if eps is None else tf.constant(float(eps), tf.float32)
        scale = eps / self.eps
        seed = self._step_seed(1) if seed is None else seed
        if self.method in ("madry", "clean"):
            steps = self.steps if steps is None else steps
            return self._pgd(x, lambda z: _ce(z, y), eps, steps, self.step_size * scale,
                             self.random_start, seed)
        if self.method == "fast":
            return self._pgd(x, lambda z: _ce(z, y), eps, 1, self.step_size * scale,
                             self.random_start, seed)
        if self.method == "trades":
            p_clean = tf.stop_gradient(tf.nn.softmax(self._logits(x, self.craft_training)))
            x0 = x + 0.001 * tf.random.stateless_normal(tf.shape(x), seed, dtype=x.dtype)
            x0 = _norms.clip_to_bounds(x0, self.clip_min, self.clip_max)
            steps = self.steps if steps is None else steps
            # PGD on the KL term from x0 (no random start inside the ball)
            return self._pgd_from(x, x0, lambda z: _kl(p_clean, z), eps, steps,
                                  self.step_size * scale)
        raise ValueError(f"method {self.method!r} crafts inside its train step")

    def _pgd_from(self, x, x_adv, loss_fn, eps, steps, step_size):
        def body(i, x_adv):
            g = self._input_grad(x_adv, loss_fn, self.craft_training)
            x_new = x_adv + step_size * _norms.steepest_ascent(g, self.norm)
            x_new = x + _norms.project(x_new - x, eps, self.norm)
            x_new = _norms.clip_to_bounds(x_new, self.clip_min, self.clip_max)
            return i + 1, tf.stop_gradient(x_new)

        _, x_adv = tf.while_loop(lambda i, _: i < steps, body, (tf.constant(0), x_adv),
                                 parallel_iterations=1)
        return tf.stop_gradient(x_adv)

    # ---------------------------------------------------------------- the update
    def _num_replicas(self):
        return tf.distribute.get_strategy().num_replicas_in_sync

    def _transform(self):
        """The core gradient transformation: clip by global norm, inside the non-finite guard."""
        from robustgrad import transforms as rt

        inner = (rt.clip_by_global_norm(self.max_grad_norm) if self.max_grad_norm is not None
                 else rt.identity())
        return rt.apply_if_finite(inner, max_consecutive_errors=self.max_nonfinite_steps)

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
        from robustgrad import transforms as rt

        variables = self.model.trainable_variables
        if not self.optimizer.built:
            self.optimizer.build(variables)
        self._grad_step = rt.GradientStep(self._transform(), self.optimizer, variables)

    @property
    def gradient_step(self):
        """The core GradientStep used for updates (None under a strategy or loss scaling)."""
        return getattr(self, "_grad_step", None)

    def fit(self, *args, **kwargs):
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
        grads = [tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v)
                 for g, v in zip(grads, variables)]
        step = self.gradient_step
        if step is not None:
            stats = step(grads)
            self.nonfinite_count.assign_add(1 - tf.cast(stats["applied"], tf.int64))
            return stats["grad_norm"]
        from robustgrad import transforms as rt

        n = self._num_replicas()
        ctx = tf.distribute.get_replica_context()
        opt = self.optimizer
        lso = isinstance(opt, keras.optimizers.LossScaleOptimizer)
        loss_scale = tf.cast(opt.dynamic_scale, tf.float32) if lso else None
        if n > 1 and ctx is not None:
            grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        unscaled = [g / loss_scale for g in grads] if lso else grads
        gnorm = rt.global_norm(unscaled)
        finite = rt.all_finite(unscaled)
        if self.max_grad_norm is not None:
            clip = rt.clip_by_global_norm(self.max_grad_norm)
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

    def _scaled(self, loss):
        """The per-replica loss to differentiate: mean over the local batch / replicas."""
        n = self._num_replicas()
        if n > 1:
            loss = loss / float(n)
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            loss = self.optimizer.scale_loss(loss)
        return loss

    def train_step(self, data):
        x, y = data[0], data[1]
        x = tf.convert_to_tensor(x)
        x = tf.cast(x, tf.float32)
        y = tf.cast(tf.reshape(y, [-1]), tf.int32)
        eps = self._current_eps()
        scale = eps / self.eps
        variables = self.model.trainable_variables
        clean_logits = None

        if self.method == "free":
            delta = _norms.random_in_ball(tf.shape(x), eps, self.norm,
                                          seed=self._step_seed(1), dtype=x.dtype)
            delta = _norms.clip_to_bounds(x + delta, self.clip_min, self.clip_max) - x
            losses, gnorms = [], []
            for _ in range(self.steps):  # m replays, unrolled (m is small)
                with tf.GradientTape(persistent=True) as tape:
                    tape.watch(delta)
                    x_adv = x + delta
                    logits = self._logits(x_adv, True)
                    loss = tf.reduce_mean(_ce(logits, y))
                    scaled = self._scaled(loss)
                grads = tape.gradient(scaled, variables)
                g_delta = tape.gradient(scaled, delta)
                del tape
                gnorms.append(self._apply_gradients(grads, variables))
                delta = delta + self.step_size * scale * _norms.steepest_ascent(g_delta, self.norm)
                delta = _norms.project(delta, eps, self.norm)
                delta = tf.stop_gradient(
                    _norms.clip_to_bounds(x + delta, self.clip_min, self.clip_max) - x)
                losses.append(loss)
            loss = tf.add_n(losses) / float(len(losses))
            gnorm = tf.add_n(gnorms) / float(len(gnorms))
            adv_logits = logits
        else:
            x_adv = None if self.method == "clean" else self.craft(x, y, eps=None)
            with tf.GradientTape() as tape:
                if self.method == "clean":
                    adv_logits = clean_logits = self._logits(x, True)
                    loss = tf.reduce_mean(_ce(clean_logits, y))
                elif self.method == "trades":
                    clean_logits = self._logits(x, True)
                    adv_logits = self._logits(x_adv, True)
                    kl = _kl(tf.nn.softmax(clean_logits), adv_logits)
                    loss = tf.reduce_mean(_ce(clean_logits, y) + self.beta * kl)
                else:
                    adv_logits = self._logits(x_adv, True)
                    loss = tf.reduce_mean(_ce(adv_logits, y))
                    if self.adv_ratio < 1.0:
                        clean_logits = self._logits(x, True)
                        loss = (self.adv_ratio * loss
                                + (1.0 - self.adv_ratio) * tf.reduce_mean(_ce(clean_logits, y)))
                scaled = self._scaled(loss)
            grads = tape.gradient(scaled, variables)
            gnorm = self._apply_gradients(grads, variables)

        self.step_counter.assign_add(1)
        self.loss_tracker.update_state(loss)
        self.adv_acc_tracker.update_state(_accuracy(adv_logits, y))
        if clean_logits is not None:
            self.clean_acc_tracker.update_state(_accuracy(clean_logits, y))
        self.grad_norm_tracker.update_state(gnorm)
        self.eps_tracker.update_state(eps)
        logs = {"loss": self.loss_tracker.result(),
                "adv_accuracy": self.adv_acc_tracker.result(),
                "grad_norm": self.grad_norm_tracker.result(),
                "eps": self.eps_tracker.result()}
        if clean_logits is not None:
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

    def test_step(self, data):
        x, y = data[0], data[1]
        x = tf.cast(tf.convert_to_tensor(x), tf.float32)
        y = tf.cast(tf.reshape(y, [-1]), tf.int32)
        logits = self._logits(x, False)
        self.loss_tracker.update_state(tf.reduce_mean(_ce(logits, y)))
        self.clean_acc_tracker.update_state(_accuracy(logits, y))
        logs = {"loss": self.loss_tracker.result(),
                "clean_accuracy": self.clean_acc_tracker.result()}
        if self.eval_steps > 0:
            robust = self._robust_correct(x, y, self.eps, self.eval_steps)
            self.robust_acc_tracker.update_state(tf.reduce_mean(robust))
            logs["robust_accuracy"] = self.robust_acc_tracker.result()
        return self._for_reduction(logs)

    def _robust_correct(self, x, y, eps, steps, restarts=1, seed=(17, 0)):
        """Per-example 1.0/0.0: still correct under PGD-``steps`` (worst over restarts)."""
        eps = tf.constant(float(eps), tf.float32)
        ok = tf.cast(tf.equal(tf.argmax(self._logits(x, False), -1, output_type=tf.int32), y),
                     tf.float32)
        step_size = 2.5 * eps / float(max(steps, 1))
        for r in range(restarts):
            s = tf.random.experimental.stateless_fold_in(tf.constant(seed, tf.int32), r)
            x_adv = self._pgd(x, lambda z: _ce(z, y), eps, steps, step_size,
                              True, s)
            ok = ok * tf.cast(tf.equal(tf.argmax(self._logits(x_adv, False), -1,
                                                 output_type=tf.int32), y), tf.float32)
        return ok


def _ce(logits, y):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)


def _kl(p, logits_q):
    """KL(p || softmax(logits_q)) per example."""
    logq = tf.nn.log_softmax(logits_q)
    return tf.reduce_sum(p * (tf.math.log(tf.maximum(p, 1e-12)) - logq), axis=-1)


def _accuracy(logits, y):
    return tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y),
                                  tf.float32))


def robust_accuracy(model, x, y, *, eps, norm="linf", clip_min=0.0, clip_max=1.0, steps=50,
                    restarts=1, batch_size=256, seed=0):
    """Accuracy of ``model`` under PGD-``steps`` with ``restarts`` (worst case per example).

    A compact in-training check (the catastrophic-overfitting guard and the fallback report);
    the full evaluation is :func:`attacks.evaluate`.
    """
    helper = AdversarialTrainer(model, method="madry", eps=eps, norm=norm, clip_min=clip_min,
                                clip_max=clip_max, steps=max(steps, 1))

    @tf.function(reduce_retracing=True)
    def batch_fn(xb, yb):
        return helper._robust_correct(xb, yb, eps, steps, restarts, seed=(seed, 1))

    oks = []
    for i in range(0, len(x), batch_size):
        xb = tf.convert_to_tensor(x[i:i + batch_size], tf.float32)
        yb = tf.convert_to_tensor(np.asarray(y[i:i + batch_size]).reshape(-1), tf.int32)
        oks.append(batch_fn(xb, yb).numpy())
    return float(np.mean(np.concatenate(oks)))


def epoch_dataset(x, y, batch_size, *, seed=0, first_epoch=0, epochs=1, drop_remainder=False,
                  shift=0, pad_value=0.0):
    """A ``tf.data`` pipeline over epochs ``first_epoch .. epochs-1`` whose order depends only on
    ``(seed, epoch)``: resuming at epoch ``e`` replays exactly the batches an uninterrupted run
    would have seen. Use with ``fit(..., steps_per_epoch=steps_per_epoch(...))``.

    ``shift=k`` augments images (NHWC) with random translations of up to ``k`` pixels (pad with
    ``pad_value``, crop), drawn from stateless seeds ``(seed, epoch, batch)`` -- also replayed
    exactly on resume."""
    n = len(x)
    x = np.asarray(x, np.float32)

    def one_epoch(e):
        idx = tf.random.experimental.stateless_shuffle(
            tf.range(n), seed=tf.stack([tf.constant(seed, tf.int64), e]))
        batches = tf.data.Dataset.from_tensor_slices(idx).batch(batch_size,
                                                                drop_remainder=drop_remainder)
        return batches.enumerate().map(lambda b, i: (e, b, i))

    xs = tf.constant(x)
    ys = tf.constant(np.asarray(y).reshape(-1).astype(np.int64))

    def gather(e, b, i):
        xb = tf.gather(xs, i)
        if shift:
            s = tf.stack([tf.cast(seed, tf.int64) * 7919 + e, b])
            h, w = x.shape[1], x.shape[2]
            padded = tf.pad(xb, [[0, 0], [shift, shift], [shift, shift], [0, 0]],
                            constant_values=pad_value)
            off = tf.random.stateless_uniform([tf.shape(xb)[0], 2], s, 0, 2 * shift + 1,
                                              dtype=tf.int32)
            rows = off[:, 0:1] + tf.range(h)[None, :]
            cols = off[:, 1:2] + tf.range(w)[None, :]
            xb = tf.gather(padded, rows, axis=1, batch_dims=1)
            xb = tf.gather(xb, cols, axis=2, batch_dims=1)
        return xb, tf.gather(ys, i)

    ds = tf.data.Dataset.range(first_epoch, epochs).flat_map(one_epoch)
    ds = ds.map(gather)
    return ds.prefetch(2)


def steps_per_epoch(n, batch_size, drop_remainder=False):
    return n // batch_size if drop_remainder else -(-n // batch_size)


class CatastrophicOverfittingGuard(keras.callbacks.Callback):
    """Wong et al. 2020's early stop for FGSM training.

    At the end of each epoch, measure PGD accuracy on a fixed small training subset. When it
    falls more than ``drop`` below the best seen (robust accuracy collapsing while clean
    accuracy stays: catastrophic overfitting), restore the weights of the best epoch and stop
    training. ``self.collapsed_epoch`` records where it happened (None if never).
    """

    def __init__(self, x, y, *, eps, norm="linf", clip_min=0.0, clip_max=1.0, steps=10,
                 size=256, drop=0.2, seed=0, verbose=1):
        super().__init__()
        rng = np.random.default_rng(seed)
        idx = rng.choice(len(x), size=min(size, len(x)), replace=False)
        self.x, self.y = np.asarray(x)[idx], np.asarray(y).reshape(-1)[idx]
        self.kw = dict(eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max, steps=steps)
        self.drop = float(drop)
        self.verbose = verbose
        self.best = -1.0
        self.best_weights = None
        self.best_epoch = None
        self.collapsed_epoch = None
        self.history = []
        self._helper = None
        self._fn = None

    def _measure(self):
        clf = self.model.model if isinstance(self.model, AdversarialTrainer) else self.model
        if self._fn is None:
            self._helper = AdversarialTrainer(clf, method="madry", **{
                k: v for k, v in self.kw.items() if k != "steps"}, steps=self.kw["steps"])
            helper, steps, eps = self._helper, self.kw["steps"], self.kw["eps"]

            @tf.function
            def fn(xb, yb):
                return tf.reduce_mean(helper._robust_correct(xb, yb, eps, steps))

            self._fn = fn
        return float(self._fn(tf.constant(self.x, tf.float32),
                              tf.constant(self.y.astype(np.int32))))

    def on_epoch_end(self, epoch, logs=None):
        acc = self._measure()
        self.history.append(acc)
        if logs is not None:
            logs["guard_pgd_accuracy"] = acc
        if acc >= self.best:
            self.best, self.best_epoch = acc, epoch
            self.best_weights = [w.numpy() for w in self.model.weights]
        elif acc < self.best - self.drop:
            self.collapsed_epoch = epoch
            if self.verbose:
                print(f"\ncatastrophic overfitting at epoch {epoch + 1}: PGD accuracy on the "
                      f"guard subset fell to {acc:.3f} (best {self.best:.3f} at epoch "
                      f"{self.best_epoch + 1}); restoring the best weights and stopping")
            for w, v in zip(self.model.weights, self.best_weights):
                w.assign(v)
            self.model.stop_training = True


class EpochCheckpoint(keras.callbacks.Callback):
    """Save a ``tf.train.CheckpointManager`` checkpoint at the end of every epoch.

    The checkpoint holds the trainer (classifier weights and the step counter that drives the
    random stream and warm-up: the RNG state), the optimizer (its slots and iteration count),
    the core GradientStep's transformation state, and the epoch.
    """

    def __init__(self, directory, trainer, max_to_keep=2):
        super().__init__()
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        extra = {}
        trainer._maybe_build_grad_step()
        if trainer.gradient_step is not None:
            extra["gradient_step"] = trainer.gradient_step
        self.checkpoint = tf.train.Checkpoint(model=trainer, optimizer=trainer.optimizer,
                                              epoch=self.epoch, **extra)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory,
                                                  max_to_keep=max_to_keep)

    def restore(self):
        """Restore the latest checkpoint; returns the number of completed epochs (0 if none)."""
        path = self.manager.latest_checkpoint
        if path is None:
            return 0
        self.checkpoint.restore(path).assert_existing_objects_matched()
        return int(self.epoch.numpy())

    def on_epoch_end(self, epoch, logs=None):
        self.epoch.assign(epoch + 1)
        self.manager.save(checkpoint_number=epoch + 1)


class NonFiniteGuard(keras.callbacks.Callback):
    """Stop with :class:`robustgrad.transforms.NonFiniteGradientError` after more than
    ``max_nonfinite_steps`` consecutive non-finite gradient steps (each one was skipped)."""

    def on_train_batch_end(self, batch, logs=None):
        step = getattr(self.model, "gradient_step", None)
        if step is not None:
            step.raise_if_exceeded()


class ScalarLogger(keras.callbacks.Callback):
    """TensorBoard scalars per epoch (``train/`` and ``validation/`` runs under ``log_dir``).

    Written with ``tf.summary.write`` and the ``scalars`` plugin metadata, so it needs only
    TensorFlow, not the ``tensorboard`` package (which Keras' own TensorBoard callback requires);
    ``tensorboard --logdir`` shows loss, clean/adversarial/robust accuracy, gradient norm and eps.
    """

    def __init__(self, log_dir):
        super().__init__()
        from tensorflow.core.framework import summary_pb2

        self.log_dir = log_dir
        self._meta = summary_pb2.SummaryMetadata()
        self._meta.plugin_data.plugin_name = "scalars"
        self._writers = {}

    def _writer(self, run):
        if run not in self._writers:
            import os

            self._writers[run] = tf.summary.create_file_writer(os.path.join(self.log_dir, run))
        return self._writers[run]

    def on_epoch_end(self, epoch, logs=None):
        for key, value in (logs or {}).items():
            run, tag = ("validation", key[4:]) if key.startswith("val_") else ("train", key)
            try:
                value = float(value)
            except (TypeError, ValueError):
                continue
            with self._writer(run).as_default():
                tf.summary.write(f"epoch_{tag}", tf.constant(value, tf.float32), step=epoch,
                                 metadata=self._meta.SerializeToString())
        for w in self._writers.values():
            w.flush()

    def on_train_end(self, logs=None):
        for w in self._writers.values():
            w.close()


class EpochTimer(keras.callbacks.Callback):
    """Wall-clock seconds of each epoch's training batches (validation excluded) in ``seconds``."""

    def __init__(self):
        super().__init__()
        self.seconds = []
        self._t0 = None

    def on_epoch_begin(self, epoch, logs=None):
        import time

        self._t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        import time

        self._last = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(getattr(self, "_last", self._t0) - self._t0)
