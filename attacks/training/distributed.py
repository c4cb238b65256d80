"""Adversarial training on several workers: ``tf.distribute.MultiWorkerMirroredStrategy``.

Every worker runs the same program with its own ``TF_CONFIG`` (:mod:`robustgrad.tf_config`);
they build the classifier and the :class:`~attacks.training.AdversarialTrainer` inside
``strategy.scope()`` and call ``fit`` on the same data: each step, every worker computes the
gradients of its share of the global batch, the trainer all-reduces them once (clipping and the
non-finite guard see the global gradients) and every worker applies the same update, so all
end with the same weights as one worker on the same global batch (to float tolerance).

The chief writes the run (checkpoints, the saved model); any other worker writes its working
copy to :func:`robustgrad.tf_config.worker_directory` (TensorFlow needs every worker to take
part in a checkpoint save, and the copy lets a worker on another machine resume)::

    strategy = multi_worker_strategy()              # reads TF_CONFIG
    with strategy.scope():
        trainer = AdversarialTrainer(make_classifier((8, 8, 1), 10), method="madry", eps=0.1)
        trainer.compile(optimizer=keras.optimizers.Adam(1e-3))
    out = worker_directory("runs/mw")               # runs/mw on the chief
    checkpoint = EpochCheckpoint(os.path.join(out, "checkpoints"), trainer)
    trainer.fit(dataset, epochs=5, callbacks=[checkpoint])

``robustgrad train-classifier --strategy multiworker`` does this (docs: the multi-worker guide).

>>> multi_worker_strategy({"cluster": {"worker": ["h:1"], "ps": ["h:2"]},
...                        "task": {"type": "worker", "index": 0}})
Traceback (most recent call last):
...
ValueError: TF_CONFIG: multi-worker training has 'chief' and 'worker' jobs, not 'ps'
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from robustgrad.tf_config import WorkerRole, read_tf_config, worker_directory, worker_role

__all__ = ["WorkerRole", "multi_worker_strategy", "worker_directory", "worker_role"]


def multi_worker_strategy(tf_config: Mapping[str, Any] | str | None = None,
                          communication: str = "ring") -> tf.distribute.Strategy:
    """A ``tf.distribute.MultiWorkerMirroredStrategy`` for the cluster of ``tf_config`` (a dict
    or its JSON, written to the ``TF_CONFIG`` environment variable; ``None``: the variable as
    it is), checked first (:func:`robustgrad.tf_config.read_tf_config`).

    ``communication``: the all-reduce, ``"ring"`` (gRPC; CPUs, the default) or ``"nccl"``
    (GPUs) or ``"auto"``. Call it once per process, at the start, before any other
    TensorFlow operation (TensorFlow's rule: the strategy starts this worker's server).
    """
    implementations = {"ring": "RING", "nccl": "NCCL", "auto": "AUTO"}
    if communication not in implementations:
        raise ValueError(f"communication must be one of {', '.join(implementations)}, got "
                         f"{communication!r}")
    config = read_tf_config(tf_config)
    if tf_config is not None:
        os.environ["TF_CONFIG"] = json.dumps(config)
    comm = tf.distribute.experimental.CommunicationOptions(
        implementation=getattr(tf.distribute.experimental.CommunicationImplementation,
                               implementations[communication]))
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm)
