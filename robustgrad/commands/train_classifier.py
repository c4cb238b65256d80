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

from robustgrad import rundir
from robustgrad.cli import UsageError, user_errors
from robustgrad.commands._files import load_keras_model
from robustgrad.commands._train_classifier_flags import (  # noqa: F401 (the command's names)
    CERTIFIED,
    DATA_NAMES,
    METHODS,
    add_arguments,
    check_values,
)

HELP = "adversarially train a classifier (madry, trades, fast, free, mart, awp, ibp, crown-ibp)"

# attacks.training.run.ARTIFACTS (repeated: validate runs before TensorFlow loads)
ARTIFACTS = ("config.json", "checkpoints", "logs", "model.keras", "trainer.keras", "report.json",
             "history.json", "report")

# attacks.training.config.RESUME_FREE, likewise: keys a resumed run may change
_RESUME_FREE = {"resume", "overwrite", "export", "verbose", "eval_attacks", "eval_eps", "resolved",
                "val_size", "val_steps",
                "eval_limit", "out", "no_eval", "strategy", "logical_cpus", "no_progress",
                "show_native_log", "threads", "override", "overrides", "recompute",
                "convolutions",
                "stop_after_steps"}  # (a hidden test flag of earlier versions, in old configs)


def _config_of(args) -> dict:
    """The command line as the run's record: every flag (the config's fields and the run's)."""
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


def _config(args):
    """The flags as an :class:`attacks.training.config.ClassifierConfig` (unresolved)."""
    from attacks.training.config import ClassifierConfig

    return ClassifierConfig.from_record(vars(args))


def _write_back(args, config) -> None:
    """Put the config's settings back on the namespace (what the run record shows)."""
    from attacks.training.config import SETTING_FIELDS

    for key in (*SETTING_FIELDS, "recipe"):
        setattr(args, key, getattr(config, key))


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
        with user_errors(ValueError):  # --overwrite deletes a SavedModel, nothing else
            rundir.check_export_dir(args.export, "--export", overwrite=args.overwrite)


def _resume_plan(args, run: rundir.RunDirectory):
    """A resumed run keeps its settings (:func:`attacks.training.run.plan_resume`, the one
    resume rule): every setting flag not given takes the saved run's value (written into
    ``args``). Returns the saved run (:class:`attacks.training.run_settings.SavedRun`) and the
    changes ``--override`` let through."""
    from attacks.training.run import plan_resume

    with user_errors(ValueError):
        plan = plan_resume(_config(args), run, resume=True, override=args.override,
                           record=_config_of(args))
    _write_back(args, plan.config)
    return plan.saved, plan.changed


def _inherit_settings(args, config: dict):
    """Every setting flag not given takes the value the saved run (``config``, its
    ``config.json``) resolved; returns the :class:`attacks.training.run_settings.SavedRun`."""
    from attacks.training.run_settings import SavedRun

    saved = SavedRun.of(config)
    _write_back(args, _config(args).inherit(saved))
    return saved


def _resolve_settings(args, saved=None):
    """The run's settings (method defaults < recipe < explicit flags,
    :meth:`attacks.training.config.ClassifierConfig.resolve`), written back into ``args``."""
    with user_errors(ValueError):
        config = _config(args).resolve(saved)
    _write_back(args, config)
    return config.settings()


def _settings_line(args, settings) -> str:
    import dataclasses

    from attacks.training.run import settings_line

    return settings_line(dataclasses.replace(_config(args), resolved=settings.as_record()))


def run(args: argparse.Namespace) -> int:
    """Train, save, export and evaluate as the flags say (after :func:`validate`, as the command
    line runs them): :func:`attacks.training.train_classifier`; returns the exit status (0)."""
    from attacks.training import train_classifier

    train_classifier(_config(args), _run_directory(args), resume=args.resume, overwrite=args.overwrite,
                     override=args.override, export=args.export,
                     model=lambda path: load_keras_model(path, "--init-from"),
                     verbose=args.verbose, progress=not args.no_progress,
                     record=_config_of(args), lock=False)
    return 0
