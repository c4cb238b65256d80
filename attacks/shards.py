"""An evaluation's chunks as Ray tasks: one model rebuilt per worker, chunks committed by the driver.

:func:`attacks.evaluate` with ``workers=N`` runs its unfinished chunks (:mod:`attacks.results`)
as Ray tasks, at most ``N`` at a time: each task rebuilds the model in its worker, runs the
cascade on its chunk with the chunk's own random streams (the same as in one process), computes
the margins and returns plain arrays (:func:`attacks.results.chunk_arrays`). The *driver*
commits each chunk to the :class:`~attacks.results.ResultsStore` as it arrives and merges them
in chunk order, so the report is per example equal to the one-process evaluation; a worker lost
mid-run loses only its chunk in flight, which Ray runs again (``max_retries``) or a later
``--resume`` computes.

How the model reaches the workers (:class:`ModelSource`):

* a Keras model is sent as its architecture (``model.to_json()``) and its weights (numpy, put
  once into Ray's object store) and rebuilt with ``keras.models.model_from_json``: any
  functional or sequential model of registered layers (custom layers must be importable and
  registered with ``keras.saving.register_keras_serializable`` in the workers);
* any other model (a subclassed model, a plain function) needs ``model_factory``: a callable
  of no arguments, shipped to the workers by Ray (it must be importable there, e.g.
  ``functools.partial(keras.models.load_model, "model.keras", compile=False)``, which is what
  ``robustgrad evaluate --workers`` sends).

Each worker checks that the model it built has the driver's weights (SHA-256 of the weights,
:func:`attacks.results.model_digest`): a factory that builds another model is an error.

Threads: every worker runs TensorFlow with ``threads`` intra- and inter-op threads (default 1,
the shape of a run over machines: one worker per core; ``None`` keeps TensorFlow's default of
one thread per core *per worker*, which oversubscribes a machine shared by several workers).

>>> source = ModelSource.of(lambda x: x, None)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
TypeError: workers: the model must be a Keras model (rebuilt in each worker from ...; got <lambda>
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from robustgrad import ray_setup

from ._base import Attack
from .cascade import run_cascade
from .results import chunk_arrays, chunk_base_seed, margins, model_digest

__all__ = ["ModelSource", "run_chunks"]

_MODELS: dict[str, Any] = {}  # per worker process: the model of each evaluation, built once


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """How a worker builds the model: ``architecture`` (``to_json()``) and ``weights``, or
    ``factory``; ``digest`` the driver's weight digest (``None``: not checked); ``key`` names
    the evaluation (a worker builds each evaluation's model once)."""

    architecture: str | None
    weights: list[np.ndarray] | None
    factory: Callable[[], Any] | None
    digest: str | None
    key: str

    @classmethod
    def of(cls, model: Any, model_factory: Callable[[], Any] | None) -> ModelSource:
        """The source of ``model`` (``model_factory`` when given), checked before any work."""
        digest = model_digest(model)
        key = uuid.uuid4().hex
        if model_factory is not None:
            if not callable(model_factory):
                raise TypeError(f"model_factory must be a callable of no arguments that builds "
                                f"the model, got {model_factory!r}")
            return cls(None, None, model_factory, digest, key)
        architecture = None
        if hasattr(model, "to_json") and hasattr(model, "get_weights"):
            try:
                architecture = model.to_json()
            except (NotImplementedError, TypeError, ValueError):
                architecture = None  # a subclassed model without get_config
        if architecture is None:
            name = getattr(model, "__name__", type(model).__name__)
            raise TypeError("workers: the model must be a Keras model (rebuilt in each worker "
                            "from model.to_json() and its weights) or come with model_factory=, "
                            "a callable of no arguments that builds it in each worker; got "
                            f"{name}")
        weights = [np.asarray(w) for w in model.get_weights()]
        return cls(architecture, weights, None, digest, key)

    def build(self) -> Any:
        """The model, built in this process (once per evaluation), checked against
        :attr:`digest`."""
        if self.key in _MODELS:
            return _MODELS[self.key]
        if self.factory is not None:
            model = self.factory()
        else:
            import keras

            model = keras.models.model_from_json(self.architecture)
            model.set_weights(self.weights)
        if self.digest is not None and model_digest(model) != self.digest:
            raise ValueError("workers: the model built in the worker does not have the weights "
                             "of the model given to evaluate (model_factory builds another "
                             "model?)")
        _MODELS.clear()  # one evaluation at a time per worker: drop the previous one's model
        _MODELS[self.key] = model
        return model


def limit_threads(threads: int | None) -> int:
    """Set TensorFlow's intra- and inter-op threads of this process to ``threads`` (``None``:
    leave them); returns the intra-op setting in effect (0: TensorFlow's default). A process
    whose TensorFlow runtime already started keeps its threads (TensorFlow refuses the change)."""
    import tensorflow as tf

    if threads is not None:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:
            pass  # the runtime already runs (an earlier task of this worker set it)
    return int(tf.config.threading.get_intra_op_parallelism_threads())


def run_chunk(source: ModelSource, chunk: int, start: int, x: np.ndarray, y: np.ndarray,
              correct: np.ndarray, targets: np.ndarray,
              named_attacks: Sequence[tuple[str, Attack]], budgets: Sequence[float],
              threads: int | None, settings: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """One chunk's cascade and margins (in a worker): its :func:`chunk_arrays`. ``settings``
    holds run_cascade's keywords (norm, bounds, batch size, cascade) and ``seed``, the
    evaluation's seed."""
    limit_threads(threads)
    model = source.build()
    kwargs = dict(settings)
    seed, batch_size = kwargs.pop("seed"), kwargs["batch_size"]
    outcomes = run_cascade(model, x, y, named_attacks, list(budgets), correct=correct,
                           targets=targets, seed=chunk_base_seed(seed, chunk), **kwargs)
    margin = [margins(model, o.x_worst, y, batch_size) for o in outcomes]
    for o in outcomes:
        o.forward_passes += len(o.robust)  # the margins' forward pass, as in one process
    return chunk_arrays(chunk, start, outcomes, margin)


def run_chunks(source: ModelSource, inputs: np.ndarray, labels: np.ndarray, correct: np.ndarray,
               targets: np.ndarray, named_attacks: Sequence[tuple[str, Attack]],
               budgets: Sequence[float], chunks: Sequence[tuple[int, int]], todo: Sequence[int],
               commit: Callable[[int, dict[str, np.ndarray]], None], *, workers: int,
               ray_address: str | None, threads: int | None,
               settings: Mapping[str, Any]) -> None:
    """Run chunks ``todo`` (indices into ``chunks``, ``(start, stop)`` rows) as Ray tasks, at
    most ``workers`` at a time, and call ``commit(chunk, arrays)`` on the driver as each
    arrives (in the order they finish). Connects to ``ray_address`` or starts a local Ray of
    ``workers`` CPUs (shut down at the end) unless Ray is already initialised. An exception
    raised in a task is raised here as itself; the tasks in flight are cancelled."""
    if not todo:
        return
    started = not ray_setup.import_ray("workers").is_initialized()
    ray = ray_setup.init_ray(ray_address, None if ray_address else workers, purpose="workers")
    task = ray.remote(num_cpus=1, max_retries=3)(run_chunk)
    pending: dict[Any, int] = {}
    queue = list(todo)
    try:
        source_ref = ray.put(source)  # the weights once, shared by every task
        while queue or pending:
            while queue and len(pending) < workers:
                c = queue.pop(0)
                rows = slice(*chunks[c])
                ref = task.remote(source_ref, c, chunks[c][0], inputs[rows], labels[rows],
                                  correct[rows], targets[rows], named_attacks, budgets,
                                  threads, settings)
                pending[ref] = c
            ready, _ = ray.wait(list(pending), num_returns=1)
            c = pending.pop(ready[0])
            try:
                arrays = ray.get(ready[0])
            except ray.exceptions.RayTaskError as error:
                raise error.as_instanceof_cause() from None
            commit(c, arrays)
    finally:
        for ref in pending:
            ray.cancel(ref)
        if started:
            ray.shutdown()
