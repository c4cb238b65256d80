"""One classifier training run, resumable, as a library call: :func:`train_classifier`.

What ``robustgrad train-classifier`` does is this function: it takes a
:class:`~attacks.training.config.ClassifierConfig` and a :class:`robustgrad.rundir.RunDirectory`,
and owns the run from start to end -- the configuration record with its provenance, the one
resume rule, the data split, the model and the :class:`~attacks.training.AdversarialTrainer`,
per-epoch checkpoints, Ctrl-C / SIGTERM (a checkpoint of the current batch, then
:class:`robustgrad.interrupts.TrainingInterrupted`), robust early stopping, weight averaging,
the saved model and trainer, and the final robustness report. The command line only parses its
flags into the config and calls it.

Files written under the run directory: ``config.json``, ``checkpoints/``, ``logs/``,
``history.json``, ``model.keras``, ``trainer.keras``, ``report.json`` and ``report/``
(:data:`ARTIFACTS`).

A whole resumable run in Python (run it again after an interruption and it continues)::

    from attacks.training import ClassifierConfig, train_classifier
    from robustgrad.rundir import RunDirectory

    run = RunDirectory("runs/madry")
    config = ClassifierConfig(method="madry", data="digits", eps=0.1, epochs=5)
    result = train_classifier(config, run, resume=run.has_config())
    print(result.report["worst_case"])        # robust accuracy per eps, worst over the attacks

Error messages name a setting as the command line's flag (``--val-size``, ``--eps``), the names
the tests and the users of ``robustgrad train-classifier`` know; the fields have the same names,
underscored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Iterator
from typing import Any

from robustgrad import atomic
from robustgrad.errors import ConfigError
from robustgrad.rundir import RunDirectory, check_export_dir

from .architectures import make_model
from .callbacks import (
    CatastrophicOverfittingGuard,
    EpochCheckpoint,
    EpochTimer,
    NonFiniteGuard,
    RobustEarlyStopping,
    ScalarLogger,
    WeightAveraging,
)
from .config import RESUME_FREE, SETTING_FIELDS, ClassifierConfig, ResolvedConfig
from .data import epoch_dataset, steps_per_epoch
from .distributed import multi_worker_strategy
from .history import prior_history, write_history
from .models import check_classifier, freeze_layers
from .recompute import checkpoint_segments
from .run_settings import SavedRun
from .schedules import learning_rate_schedule, make_optimizer
from .trainer import AdversarialTrainer

__all__ = ["ARTIFACTS", "ResumePlan", "TrainedClassifier", "final_report", "mixed_precision_copy",
           "plan_resume", "settings_line", "setup_devices", "train_classifier"]

ARTIFACTS = ("config.json", "checkpoints", "logs", "model.keras", "trainer.keras", "report.json",
             "history.json", "report")
"""What a run writes in its directory (``overwrite`` removes these, and only these)."""


class StepError(ConfigError):
    """The user's error in one step of a run (its settings, its files), worded by
    :func:`user_errors` with the flag it came from: an enclosing :func:`user_errors` passes it
    through as it is, instead of wording it again."""


@contextlib.contextmanager
def user_errors(*types: type[BaseException], prefix: str = "") -> Iterator[None]:
    """Re-raise ``types`` from the block as :class:`robustgrad.errors.ConfigError` with ``prefix``
    (a :class:`StepError`; steps whose errors are the user's: settings, files; never the work
    itself); an error a nested ``user_errors`` already worded passes through unchanged.

    >>> with user_errors(ValueError, prefix="eps: "):
    ...     float("abc")
    Traceback (most recent call last):
    attacks.training.run.StepError: eps: could not convert string to float: 'abc'
    >>> with user_errors(ValueError, prefix="--arch cnn: "):
    ...     with user_errors(ValueError, prefix="--width: "):
    ...         int("wide")
    Traceback (most recent call last):
    attacks.training.run.StepError: --width: invalid literal for int() with base 10: 'wide'
    """
    try:
        yield
    except StepError:
        raise
    except types as exc:
        raise StepError(f"{prefix}{exc}") from exc


@dataclasses.dataclass
class TrainedClassifier:
    """What :func:`train_classifier` returns: the trained ``model`` (a Keras classifier
    returning logits), its ``trainer``, the resolved ``config``, the final ``report`` (the dict
    of ``report.json``; ``None`` with ``no_eval``) and ``train_seconds`` (summed over every
    part of a resumed run)."""

    model: Any
    trainer: Any
    config: ClassifierConfig
    report: dict | None
    train_seconds: float


@dataclasses.dataclass(frozen=True)
class ResumePlan:
    """A run's start: its ``config`` (settings inherited from the saved run on resume), the
    ``saved`` run (None for a new run) and the ``changed`` keys ``override`` let through."""

    config: ClassifierConfig
    saved: SavedRun | None
    changed: dict


def plan_resume(config: ClassifierConfig, run: RunDirectory, *, resume: bool,
                override: str | None = None, record: dict | None = None) -> ResumePlan:
    """Apply the one resume rule (:meth:`robustgrad.rundir.RunDirectory.resume_changes`): a
    resumed run keeps its settings -- each setting left unset takes the saved run's value --
    and a key whose value differs from the saved one is refused
    (:class:`robustgrad.errors.ResumeError`) unless ``override`` names it. ``record`` adds the
    keys of the run that are not config fields (the command line's other flags). Needs no
    TensorFlow (a command calls it before TensorFlow loads)."""
    if not resume:
        if override is not None:
            raise ConfigError("--override: only with --resume (it names the configuration keys "
                              "a resumed run may change)")
        return ResumePlan(config, None, {})
    saved = SavedRun.of(run.read_config())
    config = config.inherit(saved)
    mine = {**(record or {}), **config.to_record()}
    changed = run.resume_changes(mine, saved=saved.compared(SETTING_FIELDS), override=override,
                                 free=RESUME_FREE, known=set(mine), where=run.path)
    return ResumePlan(config, saved, changed)


def setup_devices(config: ClassifierConfig) -> Any:
    """Logical CPUs, op determinism and the ``tf.distribute`` strategy of ``config.strategy``
    (``None`` for ``none``)."""
    import tensorflow as tf

    if config.logical_cpus and config.logical_cpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * config.logical_cpus)
    if not config.no_deterministic:
        tf.config.experimental.enable_op_determinism()
    if config.strategy == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        return tf.distribute.MirroredStrategy(devices=devices)
    if config.strategy == "multiworker":
        return multi_worker_strategy()  # TF_CONFIG (the command checks it before TensorFlow)
    return None


def mixed_precision_copy(model: Any) -> Any:
    """Rebuild a loaded float32 model with mixed_float16 layers (logits stay float32).

    >>> import keras
    >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    >>> [layer.dtype_policy.name for layer in mixed_precision_copy(m).layers]
    ['mixed_float16', 'float32']
    """
    cfg = model.get_config()
    layers = cfg.get("layers")
    if not layers:
        raise ConfigError("--mixed-precision with --init-from needs a Sequential or functional "
                          "model")
    for i, layer in enumerate(layers):
        if layer.get("class_name") == "InputLayer":
            continue
        last = i == len(layers) - 1
        layer["config"]["dtype"] = "float32" if last else "mixed_float16"
    new = model.__class__.from_config(cfg)
    new.set_weights(model.get_weights())
    return new


def final_report(config: ResolvedConfig, clf: Any, x_te: Any, y_te: Any, data: Any,
                 run: RunDirectory, *, verbose: int = 1, progress: bool = True) -> dict:
    """The robustness report of ``config.eval_attacks`` at ``config.eval_eps`` (default
    ``config.eps``) through :func:`attacks.evaluate` (worst case over the ensemble); prints its
    table when ``verbose``, saves ``report/`` in ``run`` and returns its dict."""
    import attacks
    from robustgrad.progress import EvaluationProgress

    eps_list = ([float(v) for v in config.eval_eps.split(",")] if config.eval_eps
                else [config.eps])
    if config.eval_limit:
        x_te, y_te = x_te[: config.eval_limit], y_te[: config.eval_limit]
    bar = EvaluationProgress(enabled=verbose >= 1 and progress)
    try:
        rep = attacks.evaluate(clf, x_te, y_te, attacks=attacks.parse_attacks(
            config.eval_attacks, norm=config.norm), eps=eps_list, batch_size=256,
            norm=config.norm, clip_min=data.clip_min, clip_max=data.clip_max, progress=bar)
    finally:
        bar.close()
    if verbose:
        print(rep.table())
    try:
        rep.save(run.join("report"))
    except Exception as exc:  # the JSON is the contract; plots are extras
        print(f"(could not save the evaluation plots: {exc})", file=sys.stderr)
    return rep.to_dict()


def settings_line(config: ClassifierConfig | ResolvedConfig) -> str:
    """One line: the recipe (or none) and the main settings of a resolved ``config``
    (:meth:`ClassifierConfig.resolve`), each not set by the user followed by where it came
    from."""
    settings = config.settings()
    v, o = settings.values, settings.origin
    shown: tuple[str, ...] = ("eps", "epochs", "batch_size", "optimizer", "lr", "schedule",
                              "momentum", "weight_decay", "steps", "step_size", "label_smoothing",
                              "early_stop", "augment")
    if config.certified:
        shown = (*shown[:3], "warmup_epochs", "warmup_delay_epochs", "kappa_final",
                 "beta_final", *shown[3:])
    if config.method == "smoothadv":
        shown = (*shown[:1], "sigma", "noise_draws", "warmup_epochs", *shown[1:])
    parts = [f"{k}={v[k]}" + ("" if o.get(k) == "user" else f" ({o.get(k)})") for k in shown
             if v.get(k) is not None and not (k == "momentum" and v["optimizer"] != "sgd")]
    head = (f"recipe {settings.recipe} ({settings.source})" if settings.recipe
            else "no recipe: the method's defaults")
    return f"settings: {head}; " + ", ".join(parts)


@dataclasses.dataclass
class _Split:
    """The training, validation and test arrays of a run, and its dataset."""

    data: Any
    x_tr: Any
    y_tr: Any
    x_val: Any
    y_val: Any
    x_te: Any
    y_te: Any


def _split(config: ResolvedConfig, data: Any) -> _Split:
    """Training examples (``limit``), the validation split (held out of training for robust
    early stopping, the first test examples otherwise) and the test set; checks ``eps``
    against the input range."""
    x_tr, y_tr, x_te, y_te = data.x_train, data.y_train, data.x_test, data.y_test
    if config.limit is not None:
        x_tr, y_tr = x_tr[: config.limit], y_tr[: config.limit]
    n = config.val_size
    if config.early_stop:  # Rice et al.: a split held out of the training set ranks the epochs
        if n >= len(x_tr):
            raise ConfigError(f"--val-size {n}: --early-stop holds that many training "
                              f"examples out, but there are only {len(x_tr)}")
        x_val, y_val, x_tr, y_tr = x_tr[-n:], y_tr[-n:], x_tr[:-n], y_tr[:-n]
    else:
        x_val, y_val = x_te[:n], y_te[:n]
    span = data.clip_max - data.clip_min
    if config.norm == "linf" and config.eps > span:
        raise ConfigError(f"--eps {config.eps} is larger than the input range "
                          f"[{data.clip_min:g}, {data.clip_max:g}] (span {span:g})")
    return _Split(data, x_tr, y_tr, x_val, y_val, x_te, y_te)


def _load_model(path: str) -> Any:
    import keras

    with user_errors(ValueError, OSError, prefix=f"--init-from {path}: "):
        return keras.models.load_model(path, compile=False)


def _initial_model(config: ResolvedConfig, split: _Split, model: Any) -> Any:
    """The classifier to start from (``model``: a Keras model, or a function loading
    ``config.init_from``), checked; None when the run builds a new one."""
    if model is None or not hasattr(model, "trainable_variables"):  # not a model: a loader
        if not config.init_from:
            return None
        model = (model or _load_model)(config.init_from)
    with user_errors(ValueError, prefix=f"--init-from {config.init_from}: "):
        check_classifier(model, split.x_te, split.data.num_classes)
    model = mixed_precision_copy(model) if config.mixed_precision else model
    if config.recompute == "blocks" and not checkpoint_segments(model):
        raise ConfigError(f"--recompute: the model of --init-from {config.init_from} is not a "
                          "Keras functional or Sequential model with one input and one output, "
                          "so it cannot be recomputed block by block; train it without "
                          "--recompute")
    return model


def _make_trainer(config: ResolvedConfig, clf: Any, data: Any, spe: int) -> Any:
    """The :class:`~attacks.training.AdversarialTrainer` of the config around ``clf``."""
    with user_errors(ValueError, prefix=f"--method {config.method}: "):
        return AdversarialTrainer(
            clf, method=config.method, eps=config.eps, norm=config.norm,
            clip_min=data.clip_min, clip_max=data.clip_max, steps=config.steps,
            step_size=config.step_size, beta=config.beta,
            random_start=not config.no_random_start, adv_ratio=config.adv_ratio,
            warmup_steps=int(round(config.warmup_epochs * spe)),
            craft_training=config.craft_training,
            max_grad_norm=config.max_grad_norm if config.max_grad_norm > 0 else None,
            eval_steps=config.val_steps, seed=config.seed, weight_decay=config.weight_decay,
            label_smoothing=config.label_smoothing, awp_gamma=config.awp_gamma,
            warmup_delay=int(round(config.warmup_delay_epochs * spe)),
            kappa_final=config.kappa_final, beta_final=config.beta_final, sigma=config.sigma,
            noise_draws=config.noise_draws, recompute=config.recompute,
            convolutions=config.convolutions)


def _make_optimizer(config: ResolvedConfig, spe: int) -> Any:
    """The optimizer and learning-rate schedule of the config. Keras evaluates a schedule at the
    optimizer's raw iteration count, which counts every micro-batch under gradient
    accumulation: the schedule spans every train step."""
    import keras

    updates = config.epochs * spe * ((config.steps or 4) if config.method == "free" else 1)
    with user_errors(ValueError):
        schedule = learning_rate_schedule(config.schedule, config.lr, max(1, updates),
                                          warmup=config.warmup,
                                          boundaries=list(config.boundaries or ()))
    opt_kw: dict[str, Any] = ({"gradient_accumulation_steps": config.grad_accum}
                              if config.grad_accum > 1 else {})
    optimizer = make_optimizer(config.optimizer, schedule, momentum=config.momentum, **opt_kw)
    if config.mixed_precision:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def _build(config: ResolvedConfig, split: _Split, base: Any, spe: int) -> tuple:
    """The classifier (new, or ``base``), its frozen layers and the compiled, built trainer
    (inside the strategy's scope, by the caller)."""
    if base is None:
        arch = config.architecture
        if arch is None:  # init_from names the model, which the caller loads
            raise ConfigError("--init-from: the model to start from was not loaded")
        options = {"width": config.width} if arch in ("cnn", "preactresnet18") else {}
        with user_errors(ValueError, TypeError, prefix=f"--arch {arch}: "):
            base = make_model(arch, split.data.input_shape, split.data.num_classes, **options)
    with user_errors(ValueError):
        check_classifier(base, split.x_te, split.data.num_classes)
        frozen = freeze_layers(base, config.freeze) if config.freeze else []
    if not base.trainable_variables:
        raise ConfigError("--freeze froze every layer: nothing left to train")
    trainer = _make_trainer(config, base, split.data, spe)
    trainer.compile(optimizer=_make_optimizer(config, spe))
    trainer.build(split.x_tr.shape)
    trainer.optimizer.build(base.trainable_variables)
    return base, frozen, trainer


@dataclasses.dataclass
class _Loop:
    """The state of a run's training loop: what it trains, where it starts, its callbacks."""

    config: ResolvedConfig
    split: _Split
    trainer: Any
    spe: int
    strategy: Any
    frozen: list
    ckpt: Any = None
    averager: Any = None
    first_epoch: int = 0
    skipped: int = 0
    prior: dict = dataclasses.field(default_factory=dict)
    callbacks: list = dataclasses.field(default_factory=list)
    timer: Any = None
    recorder: Any = None
    guard: Any = None
    stopper: Any = None
    bar: Any = None
    started: float = 0.0  # time.time() when training starts: the run's seconds count from it


def _add_callbacks(loop: _Loop, out: str, verbose: int, progress: bool) -> None:
    """Timer, non-finite guard, scalars, history, the fast-AT guard, weight averaging, robust
    early stopping, the progress bar, ``history.json``'s write and, last, the checkpoint (it
    may stop the run)."""
    import keras

    c, s = loop.config, loop.split
    loop.timer, loop.recorder = EpochTimer(), keras.callbacks.History()
    loop.callbacks = [loop.timer, NonFiniteGuard(), ScalarLogger(os.path.join(out, "logs")),
                      loop.recorder]
    if c.method == "fast" and not c.no_guard:
        loop.guard = CatastrophicOverfittingGuard(
            s.x_tr, s.y_tr, eps=c.eps, norm=c.norm, clip_min=s.data.clip_min,
            clip_max=s.data.clip_max, steps=10, size=256, seed=c.seed, verbose=verbose)
        loop.callbacks.insert(0, loop.guard)
    if loop.averager is not None:
        loop.callbacks.append(loop.averager)
    if c.early_stop:
        loop.stopper = RobustEarlyStopping(os.path.join(out, "checkpoints"), verbose=verbose)
        loop.callbacks.append(loop.stopper)
    if verbose == 1 and progress:
        from robustgrad.progress import keras_progress

        loop.bar = keras_progress(c.epochs, loop.spe, initial_epoch=loop.first_epoch,
                                  initial_batch=loop.skipped)
        loop.callbacks.append(loop.bar)
    # history.json at every epoch end, before that epoch's checkpoint: a process killed at any
    # moment (SIGKILL, a lost machine) resumes with every epoch its checkpoint holds (a history
    # one epoch ahead of the checkpoint is cut back by prior_history)
    loop.started = time.time()
    loop.callbacks.append(keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: write_history(
            out, loop.prior, loop.recorder, loop.timer, loop.guard, time.time() - loop.started,
            loop.first_epoch, loop.skipped)))
    loop.callbacks.append(loop.ckpt)


def _datasets(loop: _Loop, first: int, last: int, skip: int) -> tuple:
    """The training pipeline of epochs ``first .. last-1`` (skipping ``skip`` batches of the
    first) and the validation set, sharded by data under a strategy."""
    import numpy as np
    import tensorflow as tf

    c, s = loop.config, loop.split
    ds = epoch_dataset(s.x_tr, s.y_tr, c.batch_size, seed=c.seed, first_epoch=first,
                       epochs=last, drop_remainder=(loop.strategy is not None), skip_batches=skip,
                       shift=4 if c.augment else 0, flip=bool(c.augment) and s.x_tr.shape[-1] == 3)
    val = None
    if len(s.x_val):
        val = tf.data.Dataset.from_tensor_slices(
            (s.x_val.astype(np.float32), s.y_val.astype(np.int64))).batch(256)
    if (loop.strategy is not None):
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        ds = ds.with_options(opts)
        val = None if val is None else val.with_options(opts)
    return ds, val


def _fit(loop: _Loop, first: int, last: int, steps: int, verbose: int, skip: int = 0) -> None:
    ds, val = _datasets(loop, first, last, skip)
    loop.trainer.fit(ds, epochs=last, initial_epoch=first, steps_per_epoch=steps,
                     shuffle=False,  # epoch_dataset shuffles (Keras warned on every run)
                     validation_data=val, callbacks=loop.callbacks,
                     verbose=2 if verbose == 2 else 0)


def _train(loop: _Loop, verbose: int) -> None:
    """The rest of an interrupted epoch (exactly the batches it had left), then the remaining
    epochs, unless the fast-AT guard saw a collapse."""
    epochs, first = loop.config.epochs, loop.first_epoch

    def collapsed() -> bool:
        return loop.guard is not None and loop.guard.collapsed_epoch is not None

    if first < epochs and loop.skipped:
        _fit(loop, first, first + 1, loop.spe - loop.skipped, verbose, skip=loop.skipped)
        first += 1
        if not collapsed():
            loop.ckpt.raise_if_requested(first)
    if first < epochs and not collapsed():
        _fit(loop, first, epochs, loop.spe, verbose)


def _log(verbose: int, message: str) -> None:
    if verbose:
        print(message, flush=True)


def _describe(loop: _Loop) -> str:
    c, s, strategy, frozen = loop.config, loop.split, loop.strategy, loop.frozen
    val = (f", validation: {len(s.x_val)} "
           + ("held-out training examples (robust early stopping)" if c.early_stop
              else "test examples") + f", PGD-{c.val_steps}"
           if len(s.x_val) else ", no per-epoch validation")
    return (f"train-classifier: {c.method} eps={c.eps} {c.norm} on {c.data} "
            f"({len(s.x_tr)} train / {len(s.x_te)} test, {s.data.num_classes} classes), "
            f"{c.epochs} epochs x {loop.spe} steps, batch {c.batch_size}" + val
            + (f", strategy {c.strategy} ({strategy.num_replicas_in_sync} replicas)"
               if strategy is not None else "")
            + (f", frozen: {', '.join(frozen)}" if frozen else ""))


def _start(loop: _Loop, run: RunDirectory, plan: ResumePlan, record: dict, resume: bool,
           verbose: int) -> None:
    """Restore the checkpoint of a resumed run (recording ``override``'s changes), or write
    the configuration record of a new one."""
    if not resume:
        run.write_config(dict(sorted(record.items())), provenance=loop.config.resolved)
        return
    loop.first_epoch = loop.ckpt.restore()
    loop.skipped = loop.ckpt.batches_done
    loop.prior = prior_history(run.path, loop.first_epoch)
    where = (f"at epoch {loop.first_epoch + 1}, batch {loop.skipped} of {loop.spe}"
             if loop.skipped else f"after epoch {loop.first_epoch}")
    _log(verbose, f"resuming {run.path} {where}")
    if plan.changed and plan.saved is not None:  # override: the new values, and a record
        run.record_resume({**plan.saved.config, **{k: v for k, (_, v) in plan.changed.items()}},
                          plan.changed)
        _log(verbose, "configuration changed on resume (--override): " + ", ".join(
            f"{k} {a!r} -> {b!r}" for k, (a, b) in plan.changed.items()))


def _run_loop(loop: _Loop, run: RunDirectory, plan: ResumePlan, record: dict, resume: bool,
              verbose: int, progress: bool) -> float:
    """Checkpointed, interruptible training; returns the training seconds of the whole run."""
    from robustgrad.interrupts import TrainingInterrupted

    c = loop.config
    with run.interrupts("training") as flag:
        loop.averager = WeightAveraging(loop.trainer.model, decay=c.ema) if c.ema else None
        loop.ckpt = EpochCheckpoint(
            run.checkpoint_dir, loop.trainer, interrupt=flag,
            extra=None if loop.averager is None else {"weight_average": loop.averager.state})
        _start(loop, run, plan, record, resume, verbose)
        _log(verbose, settings_line(c))
        _log(verbose, _describe(loop))
        _add_callbacks(loop, run.path, verbose, progress)
        try:
            _train(loop, verbose)
        except TrainingInterrupted:
            if loop.bar is not None:
                loop.bar.on_train_end()
            write_history(run.path, loop.prior, loop.recorder, loop.timer, loop.guard,
                          time.time() - loop.started, loop.first_epoch, loop.skipped,
                          partial=loop.timer.partial_seconds)
            raise
    return write_history(run.path, loop.prior, loop.recorder, loop.timer, loop.guard,
                         time.time() - loop.started, loop.first_epoch, loop.skipped)


def _keep_best_epoch(run: RunDirectory, stopper: Any) -> None:
    """After robust early stopping: put the best epoch's weights back and record it in
    ``history.json``."""
    record = run.read_json("history.json", {})
    epochs = len(next(iter(record.get("history", {}).values()), []))
    stopper.restore_best(epochs - 1)
    record["early_stopping"] = {"best_epoch": None if stopper.best_epoch is None
                                else stopper.best_epoch + 1,
                                "monitor": stopper.monitor, "best": stopper.best,
                                "restored": stopper.restored}
    run.write_json("history.json", record)


def _finish(loop: _Loop, run: RunDirectory, seconds: float, export: str | None,
            verbose: int) -> None:
    """The best epoch or the weights' average as the model; ``model.keras``, ``trainer.keras``
    and the SavedModel of ``export``."""
    import keras

    clf, c = loop.trainer.model, loop.config
    if loop.stopper is not None:
        _keep_best_epoch(run, loop.stopper)
    if loop.averager is not None:  # the model users get is the average; checkpoints keep the raw
        loop.averager.apply()
        _log(verbose, f"weight averaging: saving the moving average (decay {c.ema}) of "
                      f"{int(loop.averager.state.count.numpy())} updates as the model")
    if c.mixed_precision:
        keras.mixed_precision.set_global_policy("float32")
    for keras_object, name in ((clf, "model.keras"), (loop.trainer, "trainer.keras")):
        with atomic.replacing(run.join(name)) as tmp:  # a full disk: no truncated file
            keras_object.save(tmp)
    _log(verbose, f"saved {run.join('model.keras')} and trainer.keras "
                  f"({seconds:.0f} s of training in all)")
    if export:
        clf.export(export, format="tf_saved_model", verbose=False)
        _log(verbose, f"exported a SavedModel to {export} (signature 'serve')")


def _load_data(config: ClassifierConfig) -> Any:
    """The dataset (after checking the report's attacks: a typo must not cost a whole run)."""
    import attacks
    from attacks.data import load_dataset

    if not config.no_eval:
        with user_errors(ValueError):
            attacks.parse_attacks(config.eval_attacks)
    with user_errors(ValueError, OSError):
        return load_dataset(config.data, seed=0, download=not config.no_download)


def _prepare(run: RunDirectory, overwrite: bool, export: str | None) -> None:
    """Remove an earlier run's files (``overwrite``) and create the directory."""
    if overwrite:
        if export:  # a SavedModel, or nothing: never a directory of the user's own files
            check_export_dir(export, "--export", overwrite=True)
        run.remove(ARTIFACTS)
        if export and os.path.isdir(export):
            shutil.rmtree(export)
    os.makedirs(run.path, exist_ok=True)


def train_classifier(config: ClassifierConfig, run: RunDirectory | str, *, resume: bool = False,
                     overwrite: bool = False, override: str | None = None,
                     export: str | None = None, model: Any = None, verbose: int = 1,
                     progress: bool = True, record: dict | None = None,
                     lock: bool = True) -> TrainedClassifier:
    """Train, checkpoint, save and evaluate a classifier as ``config`` says, in ``run``.

    Args:
      config: the run's settings; unset ones are resolved here (method defaults < recipe <
        the fields set), and on ``resume`` taken from the saved run.
      run: the run's directory (a path is wrapped in a :class:`~robustgrad.rundir.RunDirectory`).
      resume: continue the run saved in ``run`` from its latest checkpoint (the interrupted
        epoch goes on with exactly the batches it had left); a changed setting is refused
        (:class:`robustgrad.errors.ResumeError`) unless ``override`` (``"KEY[,KEY]"``) names it.
      overwrite: replace the files of an earlier run (:data:`ARTIFACTS`); without it a directory
        holding a run is refused.
      export: also write a TF-Serving SavedModel of the classifier there.
      model: a Keras classifier to start from, or a function ``path -> model`` that loads
        ``config.init_from`` (default ``keras.models.load_model``); without either, a new
        ``config.arch`` is built.
      verbose: 0 silent, 1 progress bar, 2 one line per epoch; ``progress``: the bar.
      record: keys recorded in ``config.json`` beside the config's (the command line's other
        flags).
      lock: hold the directory's lock for the run (the command line already holds it).

    Returns a :class:`TrainedClassifier`; Ctrl-C or SIGTERM checkpoints the current batch and
    raises :class:`robustgrad.interrupts.TrainingInterrupted` (resume with ``resume=True``).

    Example: a whole resumable run (the ``robustgrad train-classifier`` command is this call)

    >>> import tempfile
    >>> from attacks.training import ClassifierConfig, train_classifier
    >>> from robustgrad.rundir import RunDirectory
    >>> run = RunDirectory(tempfile.mkdtemp())
    >>> config = ClassifierConfig(method="clean", limit=128, epochs=1, no_eval=True, val_size=0)
    >>> result = train_classifier(config, run, resume=run.has_config(), verbose=0)
    >>> result.config.lr, result.config.origin["lr"], result.config.origin["epochs"]
    (0.001, 'default', 'user')
    >>> sorted(run.holds(["config.json", "history.json", "model.keras"]))
    ['config.json', 'history.json', 'model.keras']
    >>> again = train_classifier(config, run, resume=run.has_config(), verbose=0)  # nothing left
    >>> run.read_json("history.json")["resumed_at"]
    [{'epoch': 1, 'batch': 0}]
    """
    run = run if isinstance(run, RunDirectory) else RunDirectory(run)
    record = {**(record or {}), **config.to_record()}
    if not resume:
        existing = run.holds(ARTIFACTS)
        if existing and not overwrite:
            raise ConfigError(f"--out {run.path} already holds a run ({', '.join(existing)}); "
                              "pass --overwrite to replace it or --resume to continue it")
    with run if lock else contextlib.nullcontext():
        return _train_in(config, run, resume=resume, overwrite=overwrite, override=override,
                         export=export, model=model, verbose=verbose, progress=progress,
                         record=record)


def _train_in(config: ClassifierConfig, run: RunDirectory, *, resume: bool, overwrite: bool,
              override: str | None, export: str | None, model: Any, verbose: int,
              progress: bool, record: dict) -> TrainedClassifier:
    """:func:`train_classifier` inside the directory's lock: devices, data, the resume plan,
    the resolved settings, the model and trainer, the loop, the files and the report."""
    strategy = setup_devices(config)
    import keras

    data = _load_data(config)
    plan = plan_resume(config, run, resume=resume, override=override, record=record)
    record = {**record, **plan.config.to_record()}
    resolved = plan.config.resolve(plan.saved)
    rc = resolved.resolved_view()
    split = _split(rc, data)
    keras.utils.set_random_seed(rc.seed)
    if rc.mixed_precision:
        keras.mixed_precision.set_global_policy("mixed_float16")
    base = _initial_model(rc, split, model)
    spe = steps_per_epoch(len(split.x_tr), rc.batch_size, drop_remainder=strategy is not None)
    if spe < 1:
        raise ConfigError(f"--batch-size {rc.batch_size} is larger than the training set "
                          f"({len(split.x_tr)})")
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        clf, frozen, trainer = _build(rc, split, base, spe)
    resolved = _as_used(resolved, trainer)
    rc = resolved.resolved_view()
    _prepare(run, overwrite, export)
    loop = _Loop(rc, split, trainer, spe, strategy, frozen)
    seconds = _run_loop(loop, run, plan, record, resume, verbose, progress)
    _finish(loop, run, seconds, export, verbose)
    report = None
    if not rc.no_eval:
        report = final_report(rc, clf, split.x_te, split.y_te, data, run, verbose=verbose,
                              progress=progress)
        run.write_json("report.json", report)
    return TrainedClassifier(clf, trainer, resolved, report, seconds)


def _as_used(config: ClassifierConfig, trainer: Any) -> ClassifierConfig:
    """The config with the attack steps and step size the trainer uses (defaults filled)."""
    resolved = dict(config.resolved or {})
    resolved["values"] = {**resolved.get("values", {}), "steps": trainer.steps,
                          "step_size": trainer.step_size}
    return dataclasses.replace(config, resolved=resolved)
