"""``robustgrad train-classifier``: adversarially train a classifier.

Example::

    robustgrad train-classifier --data digits --method madry --eps 0.1 --out runs/madry
    robustgrad train-classifier --out runs/madry --resume          # continue an interrupted run
    robustgrad train-classifier --init-from runs/madry/model.keras --freeze 'conv1,conv2' \\
        --method trades --epochs 5 --mixed-precision --export runs/serving --out runs/ft

Writes under ``--out`` (required, no default): ``config.json``, ``checkpoints/`` (every epoch),
``logs/`` (TensorBoard), ``history.json``, ``model.keras`` (the classifier), ``trainer.keras``
(the AdversarialTrainer), ``report.json`` and ``report/`` (final robustness report and its
figures); with ``--export DIR``, a SavedModel in ``DIR``. Nothing in an existing directory is
overwritten without ``--overwrite``. Every flag is checked before TensorFlow loads or anything
is written.

Interrupting and resuming: Ctrl-C (SIGINT) or SIGTERM stops after the current batch, writes a
checkpoint of that state (weights, optimizer, step counter, the epoch's running metrics and the
batches done) to ``checkpoints/``, writes ``history.json`` and prints one line with the command
that resumes it (exit 130); a second signal aborts at once. ``--resume`` continues from the
latest checkpoint: the interrupted epoch goes on with exactly the batches it had left (the
order of every epoch depends only on ``(seed, epoch)``), so the run ends with the weights and
history an uninterrupted run ends with (with op determinism, the default). ``history.json``
then holds every epoch from the start, ``train_seconds`` the sum over every part and
``resumed_at`` where each part began. A resumed run keeps its configuration: a changed flag is
refused with the keys named, unless ``--override KEY[,KEY]`` names it; the change is recorded
in ``config.json`` (``overrides``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import time

from robustgrad import rundir
from robustgrad.atomic import write_json
from robustgrad.cli import UsageError, user_errors
from robustgrad.commands._classifier_history import prior_history, write_history
from robustgrad.commands._classifier_run import final_report, mixed_precision_copy, setup_devices
from robustgrad.commands._files import check_output_dir, load_keras_model, remove_outputs
from robustgrad.commands._train_classifier_flags import (  # noqa: F401 (the command's names)
    CERTIFIED,
    DATA_NAMES,
    METHODS,
    add_arguments,
    check_values,
)

HELP = "adversarially train a classifier (madry, trades, fast, free, mart, awp, ibp, crown-ibp)"

ARTIFACTS = ("config.json", "checkpoints", "logs", "model.keras", "trainer.keras", "report.json",
             "history.json", "report")

# the flags that are settings of attacks.training.recipes (None when not given on the command line)
_SETTING_FLAGS = ("eps", "steps", "step_size", "beta", "epochs", "batch_size", "optimizer", "lr",
                  "schedule", "momentum", "weight_decay", "label_smoothing", "early_stop",
                  "augment", "awp_gamma", "ema", "warmup_epochs", "warmup_delay_epochs",
                  "kappa_final", "beta_final", "sigma", "noise_draws")

# configuration keys that may change between a run and its --resume
_RESUME_FREE = {"resume", "overwrite", "export", "verbose", "eval_attacks", "eval_eps", "resolved",
                "val_size", "val_steps",
                "eval_limit", "out", "no_eval", "strategy", "logical_cpus", "no_progress",
                "show_native_log", "threads", "override", "overrides",
                "stop_after_steps"}  # (a hidden test flag of earlier versions, in old configs)


def _config_of(args) -> dict:
    return {k: v for k, v in sorted(vars(args).items()) if not k.startswith("_")
            and k != "command"}


def output_dir(args: argparse.Namespace) -> str:
    """The directory this process writes (the CLI locks it): ``--out``, or under
    ``--strategy multiworker`` this worker's part of it (the chief ``--out``, worker i
    ``--out/workers/i``; a bad TF_CONFIG is named by :func:`validate`)."""
    if getattr(args, "strategy", None) == "multiworker":
        from robustgrad.tf_config import worker_directory

        try:
            return worker_directory(args.out)
        except ValueError:
            pass
    return args.out


def _run_directory(args) -> rundir.RunDirectory:
    return rundir.RunDirectory(args.out, flag="--out", command="robustgrad train-classifier")


def validate(args: argparse.Namespace) -> None:
    """Checks that need no TensorFlow: run before anything is imported or written."""
    check_values(args)

    run = _run_directory(args)
    with user_errors(ValueError):
        run.check_writable(overwrite=True)  # a file, or not writable
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite are mutually exclusive")
    existing = run.holds(ARTIFACTS)
    if args.resume:
        _resume_plan(args, run)
    elif args.override is not None:
        raise UsageError("--override: only with --resume (it names the configuration keys a "
                         "resumed run may change)")
    elif existing and not args.overwrite:
        raise UsageError(f"--out {args.out} already holds a run ({', '.join(existing)}); pass "
                         "--overwrite to replace it or --resume to continue it")
    if args.export is not None:
        check_output_dir(args.export, "--export", overwrite=args.overwrite)


def _resume_plan(args, run: rundir.RunDirectory):
    """A resumed run keeps its settings: every setting flag not given on this command line
    takes the saved run's value (written into ``args``); then the run directory's resume rule
    compares the command line with the saved record. Returns the saved run
    (:class:`attacks.training.run_settings.SavedRun`) and the changes ``--override`` let through.
    Called by :func:`validate` (before TensorFlow) and again by :func:`run`: the second call
    finds the settings already inherited, and the same changes."""
    with user_errors(ValueError):
        saved = _inherit_settings(args, run.read_config())
    mine = _config_of(args)
    with user_errors(ValueError):
        changed = run.resume_changes(mine, saved=saved.compared(_SETTING_FLAGS),
                                     override=args.override, free=_RESUME_FREE, known=set(mine),
                                     where=args.out)
    return saved, changed


def _inherit_settings(args, config: dict):
    """Every setting flag not given on this command line takes the value the saved run
    (``config``, its ``config.json``) resolved; returns the
    :class:`attacks.training.run_settings.SavedRun` read from it."""
    from attacks.training.run_settings import SavedRun

    saved = SavedRun.of(config)
    given = {k: getattr(args, k, None) for k in (*_SETTING_FLAGS, "recipe")}
    for key, value in saved.inherited(given).items():
        setattr(args, key, value)
    return saved


def _resolve_settings(args, saved=None):
    """The run's settings (method defaults < recipe < explicit flags), written back into
    ``args``; on resume (``saved``) the values the run resolved when it started."""
    from attacks.training.run_settings import resolve_run_settings

    arch = None if args.init_from else (
        args.arch or ("ibp-small" if args.method in CERTIFIED else "cnn"))
    with user_errors(ValueError, prefix="--recipe: "):
        settings = resolve_run_settings(
            args.method, args.data if args.data in DATA_NAMES else None, arch,
            {k: getattr(args, k) for k in _SETTING_FLAGS}, recipe=args.recipe,
            saved=saved, certified=args.method in CERTIFIED)
    for key in _SETTING_FLAGS:
        setattr(args, key, settings.values[key])
    return settings


def _settings_line(args, settings) -> str:
    v, o = settings.values, settings.origin
    shown: tuple[str, ...] = ("eps", "epochs", "batch_size", "optimizer", "lr", "schedule", "momentum",
             "weight_decay", "steps", "step_size", "label_smoothing", "early_stop", "augment")
    if args.method in CERTIFIED:
        shown = (*shown[:3], "warmup_epochs", "warmup_delay_epochs", "kappa_final",
                 "beta_final", *shown[3:])
    if args.method == "smoothadv":
        shown = (*shown[:1], "sigma", "noise_draws", "warmup_epochs", *shown[1:])
    parts = [f"{k}={v[k]}" + ("" if o.get(k) == "user" else f" ({o.get(k)})") for k in shown
             if v.get(k) is not None and not (k == "momentum" and v["optimizer"] != "sgd")]
    head = (f"recipe {settings.recipe} ({settings.source})" if settings.recipe
            else "no recipe: the method's defaults")
    return f"settings: {head}; " + ", ".join(parts)


def _keep_best_epoch(out: str, stopper, args) -> None:
    """After robust early stopping: put the best epoch's weights back and record it in
    ``history.json``."""
    path = os.path.join(out, "history.json")
    with open(path) as f:
        record = json.load(f)
    epochs = len(next(iter(record.get("history", {}).values()), []))
    stopper.restore_best(epochs - 1)
    record["early_stopping"] = {"best_epoch": None if stopper.best_epoch is None
                                else stopper.best_epoch + 1,
                                "monitor": stopper.monitor, "best": stopper.best,
                                "restored": stopper.restored}
    write_json(path, record)


def _log(args, msg):
    if args.verbose:
        print(msg, flush=True)


def run(args: argparse.Namespace) -> int:
    """Train, save, export and evaluate as the flags say (after :func:`validate`, as the command
    line runs them); returns the exit status (0)."""
    strategy = setup_devices(args)

    import keras
    import numpy as np
    import tensorflow as tf

    import attacks
    from attacks import training as advtrain
    from attacks.data import load_dataset
    from robustgrad.progress import keras_progress

    if not args.no_eval:  # a typo in --eval-attacks must not cost a whole training run
        with user_errors(ValueError):
            attacks.parse_attacks(args.eval_attacks)
    with user_errors(ValueError, OSError):
        data = load_dataset(args.data, seed=0, download=not args.no_download)
    x_tr, y_tr, x_te, y_te = data.x_train, data.y_train, data.x_test, data.y_test
    if args.limit is not None:
        x_tr, y_tr = x_tr[: args.limit], y_tr[: args.limit]
    run_dir = _run_directory(args)
    saved, changed = _resume_plan(args, run_dir) if args.resume else (None, {})
    raw_config = _config_of(args)
    settings = _resolve_settings(args, saved)
    if args.early_stop:  # Rice et al.: a split held out of the training set ranks the epochs
        if args.val_size >= len(x_tr):
            raise UsageError(f"--val-size {args.val_size}: --early-stop holds that many training "
                             f"examples out, but there are only {len(x_tr)}")
        x_val, y_val = x_tr[-args.val_size:], y_tr[-args.val_size:]
        x_tr, y_tr = x_tr[: -args.val_size], y_tr[: -args.val_size]
    else:
        x_val, y_val = x_te[: args.val_size], y_te[: args.val_size]
    span = data.clip_max - data.clip_min
    if args.norm == "linf" and args.eps > span:
        raise UsageError(f"--eps {args.eps} is larger than the input range "
                         f"[{data.clip_min:g}, {data.clip_max:g}] (span {span:g})")
    num_classes = data.num_classes

    keras.utils.set_random_seed(args.seed)
    if args.mixed_precision:
        keras.mixed_precision.set_global_policy("mixed_float16")

    # ---- the classifier (validated before any training)
    if args.init_from:
        base = load_keras_model(args.init_from, "--init-from")
        with user_errors(ValueError, prefix=f"--init-from {args.init_from}: "):
            advtrain.check_classifier(base, x_te, num_classes)
        if args.mixed_precision:
            base = mixed_precision_copy(base)
    else:
        base = None

    batch = args.batch_size
    distributed = strategy is not None
    drop = distributed  # equal per-replica batches under a strategy
    spe = advtrain.steps_per_epoch(len(x_tr), batch, drop_remainder=drop)
    if spe < 1:
        raise UsageError(f"--batch-size {batch} is larger than the training set ({len(x_tr)})")
    warmup_steps = int(round(args.warmup_epochs * spe))
    warmup_delay = int(round(args.warmup_delay_epochs * spe))
    total_updates = args.epochs * spe * ((args.steps or 4) if args.method == "free" else 1)

    scope = strategy.scope() if distributed else contextlib.nullcontext()
    with scope:
        if base is None:
            arch = args.arch or ("ibp-small" if args.method in CERTIFIED else "cnn")
            options = {"width": args.width} if arch in ("cnn", "preactresnet18") else {}
            with user_errors(ValueError, TypeError, prefix=f"--arch {arch}: "):
                clf = advtrain.make_model(arch, data.input_shape, num_classes, **options)
        else:
            clf = base
        with user_errors(ValueError):
            advtrain.check_classifier(clf, x_te, num_classes)
            frozen = advtrain.freeze_layers(clf, args.freeze) if args.freeze else []
        if not clf.trainable_variables:
            raise UsageError("--freeze froze every layer: nothing left to train")
        with user_errors(ValueError, prefix=f"--method {args.method}: "):
            trainer = advtrain.AdversarialTrainer(
                clf, method=args.method, eps=args.eps, norm=args.norm,
                clip_min=data.clip_min, clip_max=data.clip_max, steps=args.steps,
                step_size=args.step_size, beta=args.beta, random_start=not args.no_random_start,
                adv_ratio=args.adv_ratio, warmup_steps=warmup_steps,
                craft_training=args.craft_training,
                max_grad_norm=args.max_grad_norm if args.max_grad_norm > 0 else None,
                eval_steps=args.val_steps, seed=args.seed, weight_decay=args.weight_decay,
                label_smoothing=args.label_smoothing, awp_gamma=args.awp_gamma,
                warmup_delay=warmup_delay, kappa_final=args.kappa_final, beta_final=args.beta_final,
                sigma=args.sigma, noise_draws=args.noise_draws)
        # Keras evaluates a schedule at the optimizer's raw iteration count, which counts every
        # micro-batch under gradient accumulation: the schedule spans every train step
        decay_steps = max(1, total_updates)
        values = settings.values
        with user_errors(ValueError):
            schedule = advtrain.learning_rate_schedule(
                args.schedule, args.lr, decay_steps, warmup=values["warmup"],
                boundaries=values["boundaries"])
        opt_kw = {}
        if args.grad_accum > 1:
            opt_kw["gradient_accumulation_steps"] = args.grad_accum
        optimizer = advtrain.make_optimizer(args.optimizer, schedule, momentum=args.momentum,
                                            **opt_kw)
        if args.mixed_precision:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        values["steps"], values["step_size"] = trainer.steps, trainer.step_size  # as used
        trainer.compile(optimizer=optimizer)
        trainer.build(x_tr.shape)
        trainer.optimizer.build(clf.trainable_variables)

    out = args.out
    if args.overwrite:
        remove_outputs(out, ARTIFACTS)
        if args.export and os.path.isdir(args.export):
            shutil.rmtree(args.export)
    os.makedirs(out, exist_ok=True)

    from robustgrad.interrupts import TrainingInterrupted

    interrupts = run_dir.interrupts("training")
    flag = interrupts.__enter__()  # SIGINT/SIGTERM: stop after the current batch, checkpoint
    try:
        averager = advtrain.WeightAveraging(clf, decay=args.ema) if args.ema else None
        ckpt = advtrain.EpochCheckpoint(
            os.path.join(out, "checkpoints"), trainer, interrupt=flag,
            extra=None if averager is None else {"weight_average": averager.state})
        first_epoch, skipped = 0, 0
        prior = {}
        if args.resume:
            first_epoch = ckpt.restore()
            skipped = ckpt.batches_done
            prior = prior_history(out, first_epoch)
            where = (f"at epoch {first_epoch + 1}, batch {skipped} of {spe}" if skipped
                     else f"after epoch {first_epoch}")
            _log(args, f"resuming {out} {where}")
            if changed:  # --override: the new values, and a record
                run_dir.record_resume(
                    {**saved.config, **{k: v for k, (_, v) in changed.items()}}, changed)
                _log(args, "configuration changed on resume (--override): " + ", ".join(
                    f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items()))
        else:
            run_dir.write_config(raw_config, provenance=settings.as_record())
        _log(args, _settings_line(args, settings))
        _log(args, f"train-classifier: {args.method} eps={args.eps} {args.norm} on {args.data} "
                   f"({len(x_tr)} train / {len(x_te)} test, {num_classes} classes), "
                   f"{args.epochs} epochs x {spe} steps, batch {batch}"
                   + (f", validation: {len(x_val)} "
                      + ("held-out training examples (robust early stopping)" if args.early_stop
                         else "test examples") + f", PGD-{args.val_steps}"
                      if len(x_val) else ", no per-epoch validation")
                   + (f", strategy {args.strategy} ({strategy.num_replicas_in_sync} replicas)"
                      if distributed else "")
                   + (f", frozen: {', '.join(frozen)}" if frozen else ""))

        timer = advtrain.EpochTimer()
        recorder = keras.callbacks.History()
        callbacks = [timer, advtrain.NonFiniteGuard(), advtrain.ScalarLogger(os.path.join(out, "logs")),
                     recorder]
        guard = None
        if args.method == "fast" and not args.no_guard:
            guard = advtrain.CatastrophicOverfittingGuard(
                x_tr, y_tr, eps=args.eps, norm=args.norm, clip_min=data.clip_min,
                clip_max=data.clip_max, steps=10, size=256, seed=args.seed, verbose=args.verbose)
            callbacks.insert(0, guard)
        if averager is not None:
            callbacks.append(averager)
        stopper = None
        if args.early_stop:
            stopper = advtrain.RobustEarlyStopping(os.path.join(out, "checkpoints"),
                                                   verbose=args.verbose)
            callbacks.append(stopper)
        bar = None
        if args.verbose == 1 and not args.no_progress:
            bar = keras_progress(args.epochs, spe, initial_epoch=first_epoch,
                                 initial_batch=skipped)
            callbacks.append(bar)
        callbacks.append(ckpt)  # last: it may stop the run once the others have seen the batch

        def fit(epochs_from, epochs_to, steps, skip=0):
            ds = advtrain.epoch_dataset(
                x_tr, y_tr, batch, seed=args.seed, first_epoch=epochs_from, epochs=epochs_to,
                drop_remainder=drop, skip_batches=skip, shift=4 if args.augment else 0,
                flip=bool(args.augment) and x_tr.shape[-1] == 3)
            val = None
            if len(x_val):
                val = tf.data.Dataset.from_tensor_slices(
                    (x_val.astype(np.float32), y_val.astype(np.int64))).batch(256)
            if distributed and val is not None:
                opts = tf.data.Options()
                opts.experimental_distribute.auto_shard_policy = \
                    tf.data.experimental.AutoShardPolicy.DATA
                ds, val = ds.with_options(opts), val.with_options(opts)
            elif distributed:
                opts = tf.data.Options()
                opts.experimental_distribute.auto_shard_policy = \
                    tf.data.experimental.AutoShardPolicy.DATA
                ds = ds.with_options(opts)
            trainer.fit(ds, epochs=epochs_to, initial_epoch=epochs_from, steps_per_epoch=steps,
                        shuffle=False,  # epoch_dataset shuffles (Keras warned on every run)
                        validation_data=val, callbacks=callbacks,
                        verbose=2 if args.verbose == 2 else 0)

        t0 = time.time()
        try:
            if first_epoch < args.epochs and skipped:
                # the rest of the interrupted epoch, exactly the batches it had left
                fit(first_epoch, first_epoch + 1, spe - skipped, skip=skipped)
                first_epoch_end = first_epoch + 1
                if guard is None or guard.collapsed_epoch is None:
                    ckpt.raise_if_requested(first_epoch_end)
            else:
                first_epoch_end = first_epoch
            if first_epoch_end < args.epochs and (guard is None or guard.collapsed_epoch is None):
                fit(first_epoch_end, args.epochs, spe)
        except TrainingInterrupted:
            if bar is not None:
                bar.on_train_end()
            write_history(out, prior, recorder, timer, guard, time.time() - t0, first_epoch,
                           skipped, partial=timer.partial_seconds)
            raise
    finally:
        interrupts.__exit__(None, None, None)
    train_time = write_history(out, prior, recorder, timer, guard, time.time() - t0,
                                first_epoch, skipped)
    if stopper is not None:
        _keep_best_epoch(out, stopper, args)
    if averager is not None:  # the model users get is the average; checkpoints keep the raw
        averager.apply()
        _log(args, f"weight averaging: saving the moving average (decay {args.ema}) of "
                   f"{int(averager.state.count.numpy())} updates as the model")

    # ---- artefacts
    if args.mixed_precision:
        keras.mixed_precision.set_global_policy("float32")
    clf.save(os.path.join(out, "model.keras"))
    trainer.save(os.path.join(out, "trainer.keras"))
    _log(args, f"saved {os.path.join(out, 'model.keras')} and trainer.keras "
               f"({train_time:.0f} s of training in all)")
    if args.export:
        clf.export(args.export, format="tf_saved_model", verbose=False)
        _log(args, f"exported a SavedModel to {args.export} (signature 'serve')")

    if not args.no_eval:
        report = final_report(args, clf, x_te, y_te, data)
        run_dir.write_json("report.json", report)
    return 0
