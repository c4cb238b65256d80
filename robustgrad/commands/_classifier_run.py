"""What a ``train-classifier`` run needs around its training loop: devices, precision, report.

Private to :mod:`robustgrad.commands.train_classifier` (moved out of it): the device set-up
and ``tf.distribute`` strategy of ``--strategy``/``--logical-cpus``, the mixed-float16 copy of
an ``--init-from`` model, and the final robustness report. TensorFlow, Keras and ``attacks`` are
imported inside the functions, so importing this module (``robustgrad --help``) stays cheap.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from robustgrad.cli import UsageError


def setup_devices(args: argparse.Namespace) -> Any:
    """Logical CPUs, op determinism and the ``tf.distribute`` strategy of ``--strategy``
    (``None`` for ``none``)."""
    import tensorflow as tf

    if args.logical_cpus and args.logical_cpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus)
    if not args.no_deterministic:
        tf.config.experimental.enable_op_determinism()
    if args.strategy == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        return tf.distribute.MirroredStrategy(devices=devices)
    if args.strategy == "multiworker":
        from attacks.training.distributed import multi_worker_strategy

        return multi_worker_strategy()  # TF_CONFIG, checked by the flags
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
        raise UsageError("--mixed-precision with --init-from needs a Sequential or functional model")
    for i, layer in enumerate(layers):
        if layer.get("class_name") == "InputLayer":
            continue
        last = i == len(layers) - 1
        layer["config"]["dtype"] = "float32" if last else "mixed_float16"
    new = model.__class__.from_config(cfg)
    new.set_weights(model.get_weights())
    return new


def final_report(args: argparse.Namespace, clf: Any, x_te: Any, y_te: Any, data: Any) -> dict:
    """The robustness report of ``--eval-attacks`` at ``--eval-eps`` through ``attacks.evaluate``
    (worst case over the ensemble, cascade); prints its table, saves ``report/`` under ``--out``
    and returns its dict (written to ``report.json`` by the caller)."""
    import attacks
    from robustgrad.progress import EvaluationProgress

    eps_list = ([float(v) for v in args.eval_eps.split(",")] if args.eval_eps else [args.eps])
    if args.eval_limit:
        x_te, y_te = x_te[: args.eval_limit], y_te[: args.eval_limit]
    progress = EvaluationProgress(enabled=args.verbose >= 1 and not args.no_progress)
    try:
        rep = attacks.evaluate(clf, x_te, y_te, attacks=attacks.parse_attacks(args.eval_attacks,
                                                                             norm=args.norm),
                               eps=eps_list, batch_size=256, norm=args.norm,
                               clip_min=data.clip_min, clip_max=data.clip_max, progress=progress)
    finally:
        progress.close()
    if args.verbose:
        print(rep.table())
    try:
        rep.save(os.path.join(args.out, "report"))
    except Exception as exc:  # the JSON below is the contract; plots are extras
        print(f"(could not save the evaluation plots: {exc})", file=sys.stderr)
    return rep.to_dict()
