"""``TF_CONFIG``, the cluster description of ``tf.distribute`` multi-worker training, read and
checked without importing TensorFlow (a command checks it with its other flags, before any work).

``TF_CONFIG`` is JSON: ``{"cluster": {"worker": ["host:port", ...]}, "task": {"type":
"worker", "index": i}}`` (optionally a ``"chief"`` job of one address). One task is the *chief*:
the ``chief`` task if the cluster has one, else worker 0. The chief writes a run's outputs and
checkpoints; every other worker keeps its working copy in its own directory
(:func:`worker_directory`), since TensorFlow needs every worker to take part in a save.

>>> config = {"cluster": {"worker": ["127.0.0.1:20001", "127.0.0.1:20002"]},
...           "task": {"type": "worker", "index": 1}}
>>> role = worker_role(config)
>>> role.index, role.workers, role.chief
(1, 2, False)
>>> worker_directory("runs/mw", config)
'runs/mw/workers/1'
>>> worker_directory("runs/mw", dict(config, task={"type": "worker", "index": 0}))
'runs/mw'
>>> worker_role({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 3}})
Traceback (most recent call last):
...
ValueError: TF_CONFIG: task index 3 is not one of the 1 'worker' addresses of the cluster
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["WorkerRole", "read_tf_config", "worker_directory", "worker_role"]

_JOBS = ("chief", "worker")


@dataclasses.dataclass(frozen=True)
class WorkerRole:
    """This process's place in a multi-worker cluster.

    ``task_type`` (``"chief"`` or ``"worker"``) and ``task_index`` as ``TF_CONFIG`` says;
    ``index`` the position among all tasks (the chief first), ``workers`` their count,
    ``chief`` whether this task writes the run's outputs."""

    task_type: str
    task_index: int
    index: int
    workers: int
    chief: bool


def read_tf_config(tf_config: Mapping[str, Any] | str | None = None) -> dict[str, Any]:
    """``tf_config`` (a dict or its JSON; ``None``: the ``TF_CONFIG`` environment variable)
    parsed and checked: a ``cluster`` of ``chief``/``worker`` jobs, each a list of
    ``"host:port"`` strings (one chief at most), and a ``task`` naming one of them.
    ``ValueError`` naming ``TF_CONFIG`` and the problem otherwise."""
    if tf_config is None:
        tf_config = os.environ.get("TF_CONFIG")
        if not tf_config:
            raise ValueError("TF_CONFIG: the environment variable is not set (the cluster and "
                             "this worker's task, as JSON)")
    if isinstance(tf_config, str):
        try:
            tf_config = json.loads(tf_config)
        except json.JSONDecodeError as error:
            raise ValueError(f"TF_CONFIG is not JSON ({error})") from None
    if not isinstance(tf_config, Mapping):
        raise ValueError(f"TF_CONFIG must be a JSON object, got {type(tf_config).__name__}")
    cluster, task = tf_config.get("cluster"), tf_config.get("task")
    if not isinstance(cluster, Mapping) or not cluster.get("worker") and not cluster.get("chief"):
        raise ValueError("TF_CONFIG: 'cluster' must map 'worker' (and optionally 'chief') to a "
                         f"list of 'host:port' addresses, got {cluster!r}")
    for job, addresses in cluster.items():
        if job not in _JOBS:
            raise ValueError(f"TF_CONFIG: multi-worker training has 'chief' and 'worker' jobs, "
                             f"not {job!r}")
        if not isinstance(addresses, list) or not all(
                isinstance(a, str) and a.rpartition(":")[2].isdigit() and a.rpartition(":")[0]
                for a in addresses):
            raise ValueError(f"TF_CONFIG: cluster job {job!r} must be a list of 'host:port' "
                             f"strings, got {addresses!r}")
    if len(cluster.get("chief") or []) > 1:
        raise ValueError(f"TF_CONFIG: a cluster has one chief at most, got {cluster['chief']!r}")
    if not isinstance(task, Mapping) or task.get("type") not in cluster:
        raise ValueError(f"TF_CONFIG: 'task' must name a job of the cluster ({', '.join(cluster)})"
                         f" and an index, got {task!r}")
    index = task.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or \
            not 0 <= index < len(cluster[task["type"]]):
        raise ValueError(f"TF_CONFIG: task index {index!r} is not one of the "
                         f"{len(cluster[task['type']])} {task['type']!r} addresses of the cluster")
    return {"cluster": {job: list(a) for job, a in cluster.items()},
            "task": {"type": task["type"], "index": index}}


def worker_role(tf_config: Mapping[str, Any] | str | None = None) -> WorkerRole:
    """This task's :class:`WorkerRole` in ``tf_config`` (see :func:`read_tf_config`)."""
    config = read_tf_config(tf_config)
    cluster, task = config["cluster"], config["task"]
    chiefs = len(cluster.get("chief") or [])
    index = task["index"] + (chiefs if task["type"] == "worker" else 0)
    return WorkerRole(task_type=task["type"], task_index=task["index"], index=index,
                      workers=chiefs + len(cluster.get("worker") or []), chief=index == 0)


def worker_directory(directory: str | os.PathLike,
                     tf_config: Mapping[str, Any] | str | None = None) -> str:
    """Where this task writes: ``directory`` itself for the chief, ``directory/workers/<index>``
    for any other worker (idempotent: a path already ending so is returned as it is)."""
    directory = os.fspath(directory)
    role = worker_role(tf_config)
    if role.chief:
        return directory
    tail = os.path.join("workers", str(role.index))
    if os.path.normpath(directory).endswith(os.sep + tail):
        return directory
    return os.path.join(directory, tail)
