"""Keras callbacks of adversarial training: the catastrophic-overfitting guard (Wong et al.,
"Fast is better than free", ICLR 2020), per-epoch checkpoints, the non-finite guard, TensorBoard
scalars without the ``tensorboard`` package, and an epoch timer.

>>> timer = EpochTimer()
>>> timer.on_epoch_begin(0); timer.on_train_batch_end(0); timer.on_epoch_end(0)
>>> len(timer.seconds), timer.seconds[0] >= 0
(1, True)
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from robustgrad import atomic, rundir

from .._validate import MAX_STEPS, check_eps, check_nonnegative, check_positive_int
from ..norms import canonical_norm
from .crafting import inference_logits, robust_correct
from .trainer import AdversarialTrainer

__all__ = ["CatastrophicOverfittingGuard", "EpochCheckpoint", "EpochTimer", "NonFiniteGuard",
           "RobustEarlyStopping", "ScalarLogger", "WeightAveraging"]


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
        steps = check_positive_int(steps, "steps", maximum=MAX_STEPS)
        size = check_positive_int(size, "size")
        check_nonnegative(drop, "drop")
        rng = np.random.default_rng(seed)
        idx = rng.choice(len(x), size=min(size, len(x)), replace=False)
        self.x, self.y = np.asarray(x)[idx], np.asarray(y).reshape(-1)[idx]
        self.kw = dict(eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max, steps=steps)
        self.drop = float(drop)
        self.verbose = verbose
        self.best = -1.0
        self.best_weights: list[np.ndarray] | None = None
        self.best_epoch: int | None = None
        self.collapsed_epoch: int | None = None
        self.history: list[float] = []
        self._fn: Any = None
        self._fn_model: Any = None

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
        """Measure the guard subset's PGD accuracy (logged as ``guard_pgd_accuracy``); on a
        collapse, restore the best epoch's weights and stop training."""
        acc = self._measure()
        self.history.append(acc)
        if logs is not None:
            logs["guard_pgd_accuracy"] = acc
        if acc >= self.best:
            self.best, self.best_epoch = acc, epoch
            self.best_weights = [w.numpy() for w in self.model.weights]
        elif acc < self.best - self.drop:
            # a best epoch exists: acc < best - drop needs best > -1
            assert self.best_epoch is not None and self.best_weights is not None
            self.collapsed_epoch = epoch
            if self.verbose:
                print(f"\ncatastrophic overfitting at epoch {epoch + 1}: PGD accuracy on the "
                      f"guard subset fell to {acc:.3f} (best {self.best:.3f} at epoch "
                      f"{self.best_epoch + 1}); restoring the best weights and stopping")
            for w, v in zip(self.model.weights, self.best_weights):
                w.assign(v)
            self.model.stop_training = True


class RobustEarlyStopping(keras.callbacks.Callback):
    """Robust early stopping (Rice et al., "Overfitting in adversarially robust deep learning",
    ICML 2020): keep the classifier of the epoch with the best robust validation accuracy.

    Reads ``monitor`` (default ``val_robust_accuracy``: the trainer's PGD-``eval_steps``
    accuracy on the validation data given to ``fit``, which should be a split held out of the
    training set) at each epoch's end. A new best writes the classifier's weights to
    ``directory/best.weights.h5`` (atomically, with ``best.json`` holding the epoch and the
    value), so an interrupted run that is resumed keeps it; at the end of training the best
    weights are put back into the classifier (the trainer's step counter, optimizer and the
    checkpoints keep the last epoch's raw state for ``--resume``). Training is not cut short:
    Rice et al. train the whole schedule and pick the best epoch. ``best_epoch`` (0-based) and
    ``best`` hold the result; ``restored`` tells whether weights were put back.

    PGD-10 accuracy overstates robustness (AutoAttack finds less); it only ranks epochs here.
    """

    def __init__(self, directory: str, monitor: str = "val_robust_accuracy",
                 verbose: int = 1) -> None:
        super().__init__()
        self.directory = str(directory)
        self.monitor = str(monitor)
        self.verbose = verbose
        self.best = -float("inf")
        self.best_epoch = None
        self.restored = False
        state = os.path.join(self.directory, "best.json")
        if os.path.isfile(state):  # a resumed run: the best so far is on disk
            try:
                with open(state) as f:
                    saved = json.load(f)
                self.best, self.best_epoch = float(saved["value"]), int(saved["epoch"])
            except (OSError, ValueError, KeyError, TypeError):
                self.best, self.best_epoch = -float("inf"), None

    @property
    def weights_path(self) -> str:
        """Where the best epoch's classifier weights are kept."""
        return os.path.join(self.directory, "best.weights.h5")

    def _classifier(self):
        return self.model.model if isinstance(self.model, AdversarialTrainer) else self.model

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Keep this epoch's weights when ``monitor`` improved on the best so far."""
        value = (logs or {}).get(self.monitor)
        if value is None:
            raise ValueError(f"RobustEarlyStopping: no {self.monitor!r} in the epoch's logs "
                             f"(pass validation data and eval_steps > 0); logs: "
                             f"{sorted(logs or {})}")
        value = float(value)
        if value > self.best:
            os.makedirs(self.directory, exist_ok=True)
            with atomic.replacing(self.weights_path) as tmp:
                self._classifier().save_weights(tmp)
            atomic.write_json(os.path.join(self.directory, "best.json"),
                              {"epoch": int(epoch), "value": value, "monitor": self.monitor},
                              indent=None)
            self.best, self.best_epoch = value, int(epoch)

    def restore_best(self, last_epoch: int) -> bool:
        """Put the best epoch's weights back into the classifier unless ``last_epoch`` (0-based)
        is the best one; returns whether weights were put back."""
        if self.best_epoch is None or self.best_epoch == last_epoch:
            return False
        self._classifier().load_weights(self.weights_path)
        self.restored = True
        if self.verbose:
            print(f"robust early stopping: kept epoch {self.best_epoch + 1} "
                  f"({self.monitor} {self.best:.4f})", flush=True)
        return True


class WeightAveraging(keras.callbacks.Callback):
    """An exponential moving average of the classifier's weights, updated after every train
    batch (weight averaging as in Gowal et al., "Uncovering the limits of adversarial training
    against norm-bounded adversarial examples", 2020: decay 0.995).

    The average covers every weight of the classifier (batch-norm statistics too). Early on the
    decay is ``min(decay, (1 + t) / (10 + t))`` after ``t`` updates, as
    ``tf.train.ExponentialMovingAverage`` with ``num_updates`` does, so the average does not
    remember the random initialisation. :attr:`state` (a ``tf.Module`` of the averaged
    variables and the update count) goes into checkpoints, so a resumed run continues the same
    average; :meth:`apply` writes the average into the classifier (the model users get), and
    :meth:`swap` exchanges average and raw weights (to evaluate the average and go back).

    >>> from attacks.training import make_classifier
    >>> clf = make_classifier((8, 8), 10, width=2)
    >>> ema = WeightAveraging(clf, decay=0.5)
    >>> w = clf.weights[0]
    >>> _ = w.assign(w + 1.0); ema.update()  # one update: decay min(0.5, 1/10) = 0.1
    >>> bool(abs(float(ema.state.averages[0][0, 0, 0, 0]) - float(w[0, 0, 0, 0])) < 0.1 + 1e-6)
    True
    """

    def __init__(self, classifier: Any, decay: float = 0.995) -> None:
        super().__init__()
        decay = float(decay)
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.classifier = classifier
        self.decay = decay
        self.state = tf.Module(name="weight_average")
        self.state.averages = [tf.Variable(tf.convert_to_tensor(v), trainable=False,
                                           name=f"average_{i}")
                               for i, v in enumerate(classifier.weights)]
        self.state.count = tf.Variable(0, dtype=tf.int64, trainable=False, name="count")
        self._update_fn = tf.function(self._update)

    def _update(self):
        t = tf.cast(self.state.count, tf.float32)
        decay = tf.minimum(self.decay, (1.0 + t) / (10.0 + t))
        for avg, v in zip(self.state.averages, self.classifier.weights):
            value = tf.cast(tf.convert_to_tensor(v), avg.dtype)
            avg.assign(decay * avg + (1.0 - decay) * value)
        self.state.count.assign_add(1)

    def update(self) -> None:
        """Fold the classifier's current weights into the average (one compiled call)."""
        self._update_fn()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        """One update after every train batch."""
        self.update()

    def apply(self) -> None:
        """Write the average into the classifier's weights."""
        for avg, v in zip(self.state.averages, self.classifier.weights):
            v.assign(tf.cast(avg, v.dtype))

    def swap(self) -> None:
        """Exchange the classifier's weights and the average (twice restores both)."""
        for avg, v in zip(self.state.averages, self.classifier.weights):
            raw = tf.identity(tf.convert_to_tensor(v))
            v.assign(tf.cast(avg, v.dtype))
            avg.assign(tf.cast(raw, avg.dtype))


class EpochCheckpoint(keras.callbacks.Callback):
    """Save a ``tf.train.CheckpointManager`` checkpoint at the end of every epoch, and one of the
    *current* state when a stop is requested (SIGINT/SIGTERM).

    The checkpoint holds the trainer (classifier weights and the step counter that drives the
    random stream and warm-up: the RNG state), the optimizer (its slots and iteration count),
    the core GradientStep's transformation state, the running means of the epoch's metrics,
    the epoch and the batches already done of it. Checkpoints are numbered by the trainer's
    train-step counter.

    With ``interrupt`` (the flag of :func:`robustgrad.interrupts.deferred_interrupts`), the flag
    is polled after every batch: once a stop is requested, the state after that batch is saved
    and :class:`robustgrad.interrupts.TrainingInterrupted` is raised with the checkpoint
    directory (the last batch of an epoch lets the epoch end -- validation, the epoch
    checkpoint -- run first). :meth:`restore` then returns the completed epochs and sets
    :attr:`batches_done`; skip that many batches of the next epoch
    (``epoch_dataset(..., skip_batches=...)``) and ``fit`` that epoch with
    ``steps_per_epoch - batches_done`` steps to end where an uninterrupted run ends.
    """

    def __init__(self, directory: str, trainer: AdversarialTrainer, max_to_keep: int = 2,
                 interrupt: Any = None, extra: dict | None = None) -> None:
        super().__init__()
        self.directory = directory
        self.trainer = trainer
        self.interrupt = interrupt
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.batch = tf.Variable(0, dtype=tf.int64, trainable=False, name="batch")
        self.batches_done = 0
        self._offset = 0  # batches of the first epoch of this fit done before it (resume)
        self._metric_values: list[np.ndarray] | None = None
        extra = dict(extra or {})  # more trackables to checkpoint (a WeightAveraging's state)
        trainer._maybe_build_grad_step()
        if trainer.gradient_step is not None:
            extra["gradient_step"] = trainer.gradient_step
        self._metric_variables = [v for m in trainer.metrics for v in m.variables]
        self.checkpoint = tf.train.Checkpoint(model=trainer, optimizer=trainer.optimizer,
                                              epoch=self.epoch, batch=self.batch,
                                              metrics=self._metric_variables, **extra)
        # the state file lists checkpoints the manager reads and deletes: only its own
        rundir.check_checkpoint_state(directory)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory,
                                                  max_to_keep=max_to_keep)

    def restore(self) -> int:
        """Restore the latest checkpoint; returns the number of completed epochs (0 if none) and
        sets :attr:`batches_done` (batches of the next epoch already trained, 0 at a boundary)."""
        path = self.manager.latest_checkpoint
        if path is None:
            return 0
        self.checkpoint.restore(path).assert_existing_objects_matched()
        self.batches_done = self._offset = int(self.batch.numpy())
        if self.batches_done:  # fit resets the metrics at the epoch's start: put them back then
            self._metric_values = [v.numpy() for v in self._metric_variables]
        return int(self.epoch.numpy())

    def _save(self, epochs_done: int, batches_done: int) -> str:
        self.epoch.assign(epochs_done)
        self.batch.assign(batches_done)
        step = int(self.trainer.step_counter.numpy())
        return self.manager.save(checkpoint_number=step)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Put back the restored running metrics of an interrupted epoch (fit reset them)."""
        if self._metric_values is not None:
            for v, value in zip(self._metric_variables, self._metric_values):
                v.assign(value)
            self._metric_values = None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        """When a stop was requested: save the state after this batch and raise
        ``TrainingInterrupted`` (at an epoch's last batch, wait for the epoch end)."""
        steps = (self.params or {}).get("steps")
        if self.interrupt is None or not self.interrupt.requested:
            return
        if steps is not None and batch + 1 >= steps:
            return  # the epoch's last batch: stop after the epoch end instead
        epoch = int(self.epoch.numpy())
        done = self._offset + batch + 1
        self._save(epoch, done)
        total = "" if steps is None else f" of {self._offset + steps}"
        self._raise(f"at epoch {epoch + 1}, batch {done}{total}")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Save the epoch's checkpoint; raise ``TrainingInterrupted`` if a stop was requested
        and epochs remain."""
        self._offset = 0
        self._save(epoch + 1, 0)
        epochs = (self.params or {}).get("epochs")
        if self.interrupt is not None and self.interrupt.requested and \
                (epochs is None or epoch + 1 < epochs):
            self._raise(f"after epoch {epoch + 1}")

    def raise_if_requested(self, epochs_done: int) -> None:
        """Between two ``fit`` calls: raise ``TrainingInterrupted`` if a stop was requested."""
        if self.interrupt is not None and self.interrupt.requested:
            self._raise(f"after epoch {epochs_done}")

    def _raise(self, where: str) -> None:
        from robustgrad.interrupts import TrainingInterrupted

        name = self.interrupt.signal_name
        raise TrainingInterrupted(f"training stopped by {name} {where}; checkpoint saved to "
                                  f"{self.directory}", checkpoint=self.directory,
                                  signal_name=name)


class NonFiniteGuard(keras.callbacks.Callback):
    """Stop with :class:`robustgrad.transforms.NonFiniteGradientError` after more than
    ``max_nonfinite_steps`` consecutive non-finite gradient steps (each one was skipped)."""

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        """Raise once the consecutive non-finite steps exceed the limit."""
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
        self._writers: dict[str, Any] = {}

    def _writer(self, run):
        if run not in self._writers:
            self._writers[run] = tf.summary.create_file_writer(os.path.join(self.log_dir, run))
        return self._writers[run]

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Write the epoch's logs as scalars (``val_*`` under ``validation/``)."""
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
        """Close the event files (a later ``fit`` opens new ones)."""
        for w in self._writers.values():
            w.close()
        self._writers = {}  # a later fit (a resumed epoch, then the rest) opens new ones


class EpochTimer(keras.callbacks.Callback):
    """Wall-clock seconds of each epoch's training batches (validation excluded) in ``seconds``."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self._t0: float | None = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Start the epoch's clock."""
        self._t0 = self._last = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        """Note the time of the last training batch (validation comes after it)."""
        self._last = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Record the seconds from the epoch's start to its last training batch."""
        start = self._t0
        if start is not None:  # keras begins every epoch it ends
            self.seconds.append(getattr(self, "_last", start) - start)
        self._t0 = None

    @property
    def partial_seconds(self) -> float:
        """Seconds of the batches of an epoch that did not end (0 when every epoch ended)."""
        if self._t0 is None:
            return 0.0
        return getattr(self, "_last", self._t0) - self._t0
