"""Keras callbacks of adversarial training: the catastrophic-overfitting guard (Wong et al.,
"Fast is better than free", ICLR 2020), per-epoch checkpoints, the non-finite guard, TensorBoard
scalars without the ``tensorboard`` package, and an epoch timer.

>>> timer = EpochTimer()
>>> timer.on_epoch_begin(0); timer.on_train_batch_end(0); timer.on_epoch_end(0)
>>> len(timer.seconds), timer.seconds[0] >= 0
(1, True)
"""

from __future__ import annotations

import os
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from .._validate import check_eps, check_nonnegative, check_positive_int
from ..norms import canonical_norm
from .crafting import inference_logits, robust_correct
from .trainer import AdversarialTrainer

__all__ = ["CatastrophicOverfittingGuard", "EpochCheckpoint", "EpochTimer", "NonFiniteGuard",
           "ScalarLogger"]


class CatastrophicOverfittingGuard(keras.callbacks.Callback):
    """Wong et al. 2020's early stop for FGSM training.

    At the end of each epoch, measure PGD accuracy on a fixed small training subset. When it
    falls more than ``drop`` below the best seen (robust accuracy collapsing while clean
    accuracy stays: catastrophic overfitting), restore the weights of the best epoch and stop
    training. ``self.collapsed_epoch`` records where it happened (None if never).
    """

    def __init__(self, x: Any, y: Any, *, eps: float, norm: Any = "linf", clip_min: float = 0.0,
                 clip_max: float = 1.0, steps: int = 10, size: int = 256, drop: float = 0.2,
                 seed: int = 0, verbose: int = 1) -> None:
        super().__init__()
        check_eps(eps)
        norm = canonical_norm(norm)
        steps = check_positive_int(steps, "steps")
        size = check_positive_int(size, "size")
        check_nonnegative(drop, "drop")
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
        self._fn = None
        self._fn_model = None

    def _measure(self) -> float:
        """PGD accuracy of the classifier on the guard subset (one compiled call)."""
        clf = self.model.model if isinstance(self.model, AdversarialTrainer) else self.model
        if self._fn is None or self._fn_model is not clf:
            logits_fn, kw = inference_logits(clf), dict(self.kw)

            @tf.function
            def fn(xb, yb):
                return tf.reduce_mean(robust_correct(logits_fn, xb, yb, **kw))

            self._fn, self._fn_model = fn, clf
        return float(self._fn(tf.constant(self.x, tf.float32),
                              tf.constant(self.y.astype(np.int32))))

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
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

    def __init__(self, directory: str, trainer: AdversarialTrainer, max_to_keep: int = 2) -> None:
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

    def restore(self) -> int:
        """Restore the latest checkpoint; returns the number of completed epochs (0 if none)."""
        path = self.manager.latest_checkpoint
        if path is None:
            return 0
        self.checkpoint.restore(path).assert_existing_objects_matched()
        return int(self.epoch.numpy())

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch.assign(epoch + 1)
        self.manager.save(checkpoint_number=epoch + 1)


class NonFiniteGuard(keras.callbacks.Callback):
    """Stop with :class:`robustgrad.transforms.NonFiniteGradientError` after more than
    ``max_nonfinite_steps`` consecutive non-finite gradient steps (each one was skipped)."""

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        step = getattr(self.model, "gradient_step", None)
        if step is not None:
            step.raise_if_exceeded()


class ScalarLogger(keras.callbacks.Callback):
    """TensorBoard scalars per epoch (``train/`` and ``validation/`` runs under ``log_dir``).

    Written with ``tf.summary.write`` and the ``scalars`` plugin metadata, so it needs only
    TensorFlow, not the ``tensorboard`` package (which Keras' own TensorBoard callback requires);
    ``tensorboard --logdir`` shows loss, clean/adversarial/robust accuracy, gradient norm and eps.
    """

    def __init__(self, log_dir: str) -> None:
        super().__init__()
        self.log_dir = log_dir
        self._meta = summary_pb2.SummaryMetadata()
        self._meta.plugin_data.plugin_name = "scalars"
        self._writers = {}

    def _writer(self, run):
        if run not in self._writers:
            self._writers[run] = tf.summary.create_file_writer(os.path.join(self.log_dir, run))
        return self._writers[run]

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
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

    def on_train_end(self, logs: dict | None = None) -> None:
        for w in self._writers.values():
            w.close()


class EpochTimer(keras.callbacks.Callback):
    """Wall-clock seconds of each epoch's training batches (validation excluded) in ``seconds``."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self._t0 = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._last = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.seconds.append(getattr(self, "_last", self._t0) - self._t0)
