"""Robustness evaluation: an attack ensemble run as a cascade, a report, and sanity checks.

:func:`evaluate` attacks a classifier with several attacks at several budgets and returns an
:class:`~attacks.report.EvaluationReport` with, per attack and per eps, the robust accuracy, the
attack success rate (of the originally correct examples it attacked; for targeted attacks the
fraction that reached the target), the mean and max perturbation norm of its successful
adversarial examples, and the work spent (example-rows through forward+backward and forward-only
passes). The per-example worst case over the ensemble is computed as a *cascade*, as AutoAttack
does (Croce & Hein 2020): each attack only runs on the examples every earlier attack failed on,
so a strong first attack makes the rest cheap. ``cascade=False`` runs every attack on every
example instead (each row is then that attack's own robust accuracy). Budgets are processed in
increasing order and an example broken at a smaller eps counts as broken at every larger one (its
adversarial example lies in the larger ball too): the worst case at eps is over every budget up
to eps.

:func:`evaluate` is a pipeline over four modules, one concept each:

* :mod:`attacks.registry` turns names such as ``"pgd40"`` into configured attacks;
* :mod:`attacks.cascade` runs the attacks, budget by budget;
* :mod:`attacks.checks` looks for signs of gradient masking (AutoAttack's lesson: an evaluation
  should check itself): probability outputs, outputs that change between forward passes (a
  randomised model: use ``"autoattack-rand"``), zero or non-finite input gradients, a gradient-free
  attack breaking examples the gradient attacks could not, an unbounded attack (eps = the full
  input range) failing to bring accuracy to chance, robust accuracy increasing with eps, and any
  output violating its budget or the bounds. Their warnings go into the report and out through
  :mod:`warnings`;
* :mod:`attacks.report` prints the table, saves JSON and plots robust accuracy against eps and
  a grid of clean / adversarial / perturbation images (matplotlib, Agg backend, PNG).

With ``certify="crown"`` (or ``"ibp"``, ``"crown-ibp"``) every budget also gets a certificate
(:mod:`attacks.certify`): the certified accuracy, a *lower* bound on the accuracy under any
attack, beside the attacked accuracy, an *upper* bound; the examples between the two are the ones
neither side decides (robust to every attack tried, not verified). An example verified but broken
by an attack would contradict the bounds: the report warns.

>>> import numpy as np, tensorflow as tf
>>> weights = tf.constant([[1.0, -1.0], [-1.0, 1.0]])
>>> model = lambda x, training=False: tf.matmul(x, weights)  # margins 2 * (x0 - x1)
>>> x = np.array([[0.55, 0.45], [0.9, 0.1]], np.float32)
>>> report = evaluate(model, x, np.array([0, 0]), ["fgsm"], [0.1, 0.5], clip_min=0.0,
...                   clip_max=1.0, sanity_checks=False)
>>> report.clean_accuracy, report.worst_case
(1.0, {0.1: 0.5, 0.5: 0.0})
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from robustgrad import checks as _checks
from robustgrad import ray_setup

from . import _validate, shards
from ._base import Attack, check_classification_data
from .cascade import BudgetOutcome, predict_labels, predict_logits, run_cascade
from .checks import (
    budget_warnings,
    input_gradient_warnings,
    non_monotone_warning,
    probability_warning,
    randomness_warning,
    unbounded_attack_check,
)
from .registry import ATTACK_NAMES, AttackSpec, make_attack, parse_attacks
from .report import AttackRecord, EvaluationReport
from .results import (
    DEFAULT_CHUNK_SIZE,
    ResultsStore,
    chunk_base_seed,
    chunk_from_arrays,
    data_digest,
    margins,
    merge_outcomes,
    model_digest,
    split_chunks,
)

__all__ = ["evaluate", "EvaluationReport", "AttackRecord", "make_attack", "ATTACK_NAMES"]


def evaluate(model: Callable, x: Any, y: Any,
             attacks: AttackSpec | Sequence[AttackSpec] = ("fgsm", "pgd", "apgd-ce", "square"),
             eps: float | Sequence[float] = (0.05, 0.1), batch_size: int = 256, *,
             norm: str = "linf", clip_min: Any = None, clip_max: Any = None,
             cascade: bool = True, seed: int = 0, sanity_checks: bool = True,
             n_examples: int = 8, progress: Callable[[int, int, str], None] | None = None,
             target_seed: int = 1, certify: str | None = None,
             results_dir: str | os.PathLike | None = None,
             chunk_size: int | None = None, workers: int | None = None,
             ray_address: str | None = None,
             model_factory: Callable[[], Callable] | None = None,
             worker_threads: int | None = 1) -> EvaluationReport:
    """Evaluate ``model``'s robustness to ``attacks`` at each budget in ``eps``.

    Args:
      model: callable ``model(x, training=False) -> logits``.
      x, y: float inputs ``[N, ...]`` and integer labels ``[N]``.
      attacks: names (see :data:`ATTACK_NAMES`, e.g. ``"fgsm"``, ``"pgd"``, ``"pgd40"``,
        ``"pgd50x5"``, ``"apgd-ce"``, ``"apgd-t"``, ``"fab-t"``, ``"square"``, or an AutoAttack
        version, ``"autoattack"``, ``"autoattack-plus"``, ``"autoattack-rand"``, which expands
        into its components for ``norm``; a comma-separated string works too),
        :class:`attacks.Attack` instances or ``(label, Attack)`` pairs (their
        ``eps``/``norm``/bounds are set per run). Order matters for the cascade: cheap first.
        An attack configured with ``targeted=True`` gets random target classes (``target_seed``).
      eps: one budget or a sequence, in the units of ``x``.
      batch_size: examples per attack call.
      norm: the threat model shared by all attacks.
      clip_min, clip_max: input bounds (scalars or per feature). ``None`` takes the data's range
        (recorded in the report).
      cascade: attack only still-robust examples (AutoAttack style); ``False`` runs every attack
        on every example.
      seed: base seed of the attacks' randomness (deterministic evaluation).
      sanity_checks: run the gradient-masking checks (adds one small unbounded PGD run).
      n_examples: examples kept for the image grid (0: no grid).
      progress: optional ``progress(done, total, description)`` callback, called before each
        attack at each eps, before the unbounded check, and once with ``done == total`` at the end.
      target_seed: seed of the random target classes of targeted attacks.
      certify: ``None`` (default), or a bound method of :mod:`robustgrad.bounds` (``"crown"``,
        ``"ibp"``, ``"crown-ibp"``): also certify every budget (L-inf or L2) and report the
        certified accuracy and the undecided examples (``report.certified``). The model must be
        a Keras model of layers the bound engine supports (checked before any work).
      results_dir: a folder where every chunk's per-example outcome is committed as it finishes
        (:class:`attacks.results.ResultsStore`); when it already holds chunks of the same
        evaluation (same model weights, data, attacks, eps, norm, bounds, seeds, chunk size:
        else ``ValueError`` naming the difference) they are reused, never attacked again: an
        interrupted evaluation resumes where it stopped and ends per example equal to an
        uninterrupted one. Implies chunks (:data:`attacks.results.DEFAULT_CHUNK_SIZE`).
        With ``certify`` each chunk's certificate (per eps, the verified examples) is committed
        there too, after the attacks, and a resume certifies only the chunks it lacks
        (``report.per_example`` then holds ``verified@eps``).
      chunk_size: examples per chunk: the cascade runs on each chunk on its own with random
        streams that depend only on ``seed`` and the chunk's index (one chunk = the unchunked
        evaluation). Chunked evaluations fill ``report.per_example`` (labels, clean predictions,
        and per eps robustness, the first attack that broke each example, the logit margin at
        the worst-case input).
      workers: run the unfinished chunks as Ray tasks, at most ``workers`` at a time
        (:mod:`attacks.shards`; the ``distributed`` extra), each rebuilding the model in its
        worker; the driver commits every chunk as it arrives and merges them: the report is per
        example equal to ``workers=None`` (one process). Implies chunks. The clean pass, the
        sanity checks and certification run in this process. At most
        :data:`robustgrad.ray_setup.MAX_WORKERS`.
      ray_address: with ``workers``, the Ray cluster to run on (``"auto"`` or ``"HOST:PORT"``,
        checked reachable before any work); ``None`` starts a local Ray of ``workers`` CPUs
        (or uses the Ray already initialised in this process).
      model_factory: with ``workers``, a callable of no arguments that builds the model in each
        worker; needed when ``model`` is not a Keras model rebuildable from ``to_json()`` and
        its weights (each worker checks the built model has ``model``'s weights).
      worker_threads: TensorFlow threads of each worker (default 1, one worker per core;
        ``None``: TensorFlow's default).

    Example, resumable (run it twice: the second call attacks nothing)::

        report = evaluate(model, x, y, "autoattack", eps=0.1, results_dir="runs/eval/results")
    """
    x_tensor = _validate.check_x(x)
    inputs = x_tensor.numpy()
    n = len(inputs)
    budgets = _budgets(eps)
    batch_size = _checks.positive_int(batch_size, "batch_size")
    norm = _checks.norm_name(norm)
    clip_min = float(inputs.min()) if clip_min is None else clip_min
    clip_max = float(inputs.max()) if clip_max is None else clip_max
    _validate.check_bounds(clip_min, clip_max, x_tensor)
    named_attacks = _attacks_for_norm(attacks, norm)
    seed = _checks.positive_int(seed, "seed", minimum=None)
    target_seed = _checks.positive_int(target_seed, "target_seed", minimum=0)
    n_examples = _checks.positive_int(n_examples, "n_examples", minimum=0)
    check_classification_data(model, x_tensor, y)  # shapes, labels vs outputs: before any work
    certify = _check_certify(certify, model, norm)
    remote = _check_workers(workers, ray_address, model, model_factory, worker_threads)
    if chunk_size is not None or results_dir is not None or workers is not None:
        chunk_size = _checks.positive_int(DEFAULT_CHUNK_SIZE if chunk_size is None
                                          else chunk_size, "chunk_size", maximum=10**9)
    if progress is not None and not callable(progress):
        raise _checks.ArgumentTypeError(
            f"progress must be a callable progress(done, total, description) or None, "
            f"got {progress!r}")

    started = time.perf_counter()
    found: list[str] = []
    logits = predict_logits(model, inputs, batch_size)
    if logits.ndim != 2:
        raise ValueError(f"model must return logits [N, C], got shape {logits.shape}")
    num_classes = logits.shape[1]
    labels = _validate.check_labels(y, n, num_classes).numpy()
    for label, attack in named_attacks:  # settings the model's classes rule out: before work
        try:
            attack.check_num_classes(num_classes)
            attack.check_example_shape(tuple(inputs.shape[1:]))
        except ValueError as error:
            raise ValueError(f"attacks: {label}: {error}") from None
    clean_predictions = logits.argmax(1)
    correct = clean_predictions == labels
    _warn(found, probability_warning(logits))
    if sanity_checks and not any(a.config.get("eot_iter", 1) > 1 for _, a in named_attacks):
        _warn(found, randomness_warning(model, inputs, labels, batch_size))
    if sanity_checks:
        for message in input_gradient_warnings(model, inputs, labels, batch_size):
            _warn(found, message)

    chunks = split_chunks(n, chunk_size) if chunk_size else [(0, n)]
    attack_units = len(chunks) * len(budgets) * len(named_attacks)
    certify_units = len(chunks) * len(budgets) if certify else 0
    total_units = attack_units + certify_units + (1 if sanity_checks else 0)

    def report_progress(done: int, description: str) -> None:
        if progress is not None:
            progress(done, total_units, description)

    targets = _random_targets(labels, num_classes, target_seed)
    per_example: dict[str, np.ndarray] = {}
    store = None
    if chunk_size is None:
        outcomes = run_cascade(
            model, inputs, labels, named_attacks, budgets, norm=norm, clip_min=clip_min,
            clip_max=clip_max, correct=correct, targets=targets, batch_size=batch_size,
            cascade=cascade, seed=seed, progress=report_progress)
    else:
        store = None if results_dir is None else ResultsStore(results_dir, _settings(
            model, inputs, labels, named_attacks, budgets, norm, clip_min, clip_max, cascade,
            seed, target_seed, chunk_size))
        outcomes, margin = _cascade_in_chunks(
            model, inputs, labels, correct, targets, named_attacks, budgets, chunks, store,
            report_progress, norm=norm, clip_min=clip_min, clip_max=clip_max,
            batch_size=batch_size, cascade=cascade, seed=seed, remote=remote)
        per_example = {"index": np.arange(n), "label": labels,
                       "clean_prediction": clean_predictions, "correct": correct}
        for o, m in zip(outcomes, margin):
            per_example[f"robust@{o.eps:g}"] = o.robust
            per_example[f"broken_by@{o.eps:g}"] = np.asarray(o.broken_by)
            per_example[f"margin@{o.eps:g}"] = m
    gradient_free = {label: attack.gradient_free for label, attack in named_attacks}
    for outcome in outcomes:
        for message in budget_warnings(outcome, gradient_free, n, cascade=cascade,
                                       sanity_checks=sanity_checks):
            _warn(found, message)
    worst_case = {outcome.eps: outcome.robust_accuracy for outcome in outcomes}
    certified = {}
    if certify:
        verified, seconds = _certify_in_chunks(
            model, inputs, labels, budgets, certify, chunks, store,
            lambda done, text: report_progress(attack_units + done, text), norm=norm,
            clip_min=clip_min, clip_max=clip_max, batch_size=batch_size)
        for k, outcome in enumerate(outcomes):
            certified[outcome.eps] = _certificate(outcome, verified[k], certify, seconds[k])
            _warn(found, certified[outcome.eps].pop("_warning"))
            if per_example:
                per_example[f"verified@{outcome.eps:g}"] = verified[k]
    gradient_passes = sum(outcome.gradient_passes for outcome in outcomes)
    forward_passes = n + sum(outcome.forward_passes for outcome in outcomes)

    if sanity_checks:
        _warn(found, non_monotone_warning(worst_case))
        report_progress(total_units - 1, "unbounded check")
        unbounded = unbounded_attack_check(model, inputs, labels, correct, norm=norm,
                                           clip_min=clip_min, clip_max=clip_max,
                                           num_classes=num_classes, batch_size=batch_size,
                                           seed=seed)
        _warn(found, unbounded.message)
        gradient_passes += unbounded.gradient_passes
        forward_passes += unbounded.forward_passes
    report_progress(total_units, "done")

    return EvaluationReport(
        norm=norm, eps=budgets, attacks=[label for label, _ in named_attacks], n=n,
        clean_accuracy=float(correct.mean()),
        records=[record for outcome in outcomes for record in outcome.records],
        worst_case=worst_case, cascade=bool(cascade),
        bounds=(np.asarray(clip_min, float), np.asarray(clip_max, float)), warnings=found,
        carried={outcome.eps: outcome.carried for outcome in outcomes},
        gradient_passes=int(gradient_passes), forward_passes=int(forward_passes),
        seconds=time.perf_counter() - started, certify=certify, certified=certified,
        per_example=per_example,
        examples={} if n_examples == 0 else {
            outcome.eps: _example_grid(model, inputs, labels, clean_predictions, correct,
                                       outcome, n_examples, batch_size)
            for outcome in outcomes})


def _settings(model: Any, inputs: np.ndarray, labels: np.ndarray,
              named_attacks: Sequence[tuple[str, Attack]], budgets: list[float], norm: str,
              clip_min: Any, clip_max: Any, cascade: bool, seed: int, target_seed: int,
              chunk_size: int) -> dict[str, Any]:
    """What a resumed evaluation must share with the one that wrote its results."""
    def bound(b: Any) -> Any:
        a = np.asarray(b, np.float64)
        return float(a) if a.ndim == 0 else hashlib.sha256(a.tobytes()).hexdigest()

    return {"n": len(inputs), "data": data_digest(inputs, labels), "model": model_digest(model),
            "attacks": [[label, type(attack).__name__,
                         json.loads(json.dumps(attack.config, default=repr, sort_keys=True))]
                        for label, attack in named_attacks],
            "eps": budgets, "norm": norm, "clip_min": bound(clip_min),
            "clip_max": bound(clip_max), "cascade": bool(cascade), "seed": seed,
            "target_seed": target_seed, "chunk_size": chunk_size}


def _cascade_in_chunks(model: Callable, inputs: np.ndarray, labels: np.ndarray,
                       correct: np.ndarray, targets: np.ndarray,
                       named_attacks: Sequence[tuple[str, Attack]], budgets: list[float],
                       chunks: list[tuple[int, int]], store: ResultsStore | None,
                       progress: Callable[[int, str], None], *, norm: str, clip_min: Any,
                       clip_max: Any, batch_size: int, cascade: bool, seed: int,
                       remote: Callable[..., None] | None = None,
                       ) -> tuple[list[BudgetOutcome], list[np.ndarray]]:
    """The cascade on each chunk on its own (seeded by :func:`attacks.results.chunk_base_seed`),
    committed to ``store`` as each finishes and read back from it where it already holds the
    chunk; returns the merged outcomes and the per-eps margins ``[N]``. With ``remote``
    (:func:`attacks.shards.run_chunks` bound to a model source) the unfinished chunks run there
    and are committed here as they arrive; progress then counts finished chunks."""
    finished = set(store.finished()) if store is not None else set()
    units = len(budgets) * len(named_attacks)
    arrived: dict[int, tuple[list[BudgetOutcome], list[np.ndarray]]] = {}
    if remote is not None:
        todo = [c for c in range(len(chunks)) if c not in finished]

        def commit(c: int, arrays: dict[str, np.ndarray]) -> None:
            start, stop = chunks[c]
            arrived[c] = chunk_from_arrays(arrays, c, start, stop - start, budgets)
            if store is not None:
                store.commit_arrays(c, arrays)
            done = len(chunks) - len(todo) + len(arrived)
            progress(done * units, f"{done}/{len(chunks)} chunks done")

        progress((len(chunks) - len(todo)) * units,
                 f"{len(chunks) - len(todo)}/{len(chunks)} chunks done")
        remote(inputs, labels, correct, targets, named_attacks, budgets, chunks, todo, commit,
               settings={"norm": norm, "clip_min": clip_min, "clip_max": clip_max,
                         "batch_size": batch_size, "cascade": cascade, "seed": seed})
    parts, margin_parts = [], []
    for c, (start, stop) in enumerate(chunks):
        if c in arrived:
            outcomes, margin = arrived[c]
        elif c in finished:
            outcomes, margin = store.load(c, start, stop - start, budgets)  # type: ignore[union-attr]
        else:
            rows = slice(start, stop)

            def chunk_progress(done: int, description: str, c: int = c) -> None:
                label = f"chunk {c + 1}/{len(chunks)} " if len(chunks) > 1 else ""
                progress(c * units + done, label + description)

            outcomes = run_cascade(
                model, inputs[rows], labels[rows], named_attacks, budgets, norm=norm,
                clip_min=clip_min, clip_max=clip_max, correct=correct[rows],
                targets=targets[rows], batch_size=batch_size, cascade=cascade,
                seed=chunk_base_seed(seed, c), progress=chunk_progress)
            margin = [margins(model, o.x_worst, labels[rows], batch_size) for o in outcomes]
            for o in outcomes:
                o.forward_passes += len(o.robust)  # the margins' forward pass
            if store is not None:
                store.commit(c, start, outcomes, margin)
        parts.append(outcomes)
        margin_parts.append(margin)
    merged = merge_outcomes(parts)
    return merged, [np.concatenate([m[k] for m in margin_parts]) for k in range(len(budgets))]


def _check_workers(workers: Any, ray_address: Any, model: Any, model_factory: Any,
                   threads: Any) -> Callable[..., None] | None:
    """:func:`attacks.shards.run_chunks` bound to the model's source and the workers (``None``
    without ``workers``), after checking the workers' arguments, that Ray is installed and
    ``ray_address`` reachable: before any work."""
    if workers is None:
        if ray_address is not None or model_factory is not None:
            raise ValueError("ray_address and model_factory are for sharded evaluation: give "
                             "workers too")
        return None
    n = ray_setup.check_workers(workers, "workers")
    threads = _checks.positive_int(threads, "worker_threads", allow_none=True, maximum=1024)
    ray_setup.address_host_port(ray_address)  # its form first, then Ray, then the network
    ray_setup.import_ray("workers")
    ray_setup.check_ray_address(ray_address)
    return functools.partial(shards.run_chunks, shards.ModelSource.of(model, model_factory),
                             workers=n, ray_address=ray_address, threads=threads)


def _check_certify(certify: Any, model: Any, norm: str) -> str | None:
    """``certify`` validated (a bound method, a norm the bounds handle, a model they read)."""
    if certify is None:
        return None
    from robustgrad import bounds

    certify = _checks.choice(certify.lower() if isinstance(certify, str) else certify,
                             "certify", bounds.METHODS)
    if norm not in ("linf", "l2"):
        raise ValueError(f"certify: the bounds certify linf or l2 balls, not norm {norm!r}")
    try:
        bounds._bounded(model)
    except ValueError as exc:
        raise ValueError(f"certify={certify!r}: {exc}") from None
    return certify


def _certify_in_chunks(model: Any, inputs: np.ndarray, labels: np.ndarray,
                       budgets: list[float], method: str, chunks: list[tuple[int, int]],
                       store: ResultsStore | None, progress: Callable[[int, str], None], *,
                       norm: str, clip_min: Any, clip_max: Any,
                       batch_size: int) -> tuple[list[np.ndarray], list[float]]:
    """Per budget the verified mask ``[N]`` (bool) of bound method ``method`` and its seconds,
    chunk by chunk: a chunk whose certificate ``store`` holds is read back, any other is
    computed (:func:`attacks.certify.verified_mask`) and committed before the next starts, so an
    interrupted certification resumes where it stopped. ``progress(done, text)`` counts
    (chunk, budget) units."""
    from .certify import verified_mask

    finished = set(store.finished_certificates(method)) if store is not None else set()
    masks: list[list[np.ndarray]] = [[] for _ in budgets]
    seconds = [0.0] * len(budgets)
    for c, (start, stop) in enumerate(chunks):
        if c in finished:
            verified, spent = store.load_certificate(  # type: ignore[union-attr]
                method, c, start, stop - start, budgets)
        else:
            verified, spent = [], []
            label = f"chunk {c + 1}/{len(chunks)} " if len(chunks) > 1 else ""
            for k, eps in enumerate(budgets):
                progress(c * len(budgets) + k, f"{label}certify ({method}) eps={eps:g}")
                started = time.perf_counter()
                verified.append(np.asarray(verified_mask(
                    model, inputs[start:stop], labels[start:stop], eps, norm, method,
                    clip_min=clip_min, clip_max=clip_max, batch_size=batch_size), bool))
                spent.append(time.perf_counter() - started)
            if store is not None:
                store.commit_certificate(method, c, start, budgets, verified, spent)
        for k in range(len(budgets)):
            masks[k].append(verified[k])
            seconds[k] += spent[k]
    return [np.concatenate(m) for m in masks], seconds


def _certificate(outcome: BudgetOutcome, verified: np.ndarray, method: str,
                 seconds: float) -> dict[str, Any]:
    """The certificate at one budget beside the attacks' outcome: certified accuracy, the
    undecided examples (robust to every attack, not verified), and a warning if any verified
    example was broken (impossible unless the bounds or the attack are wrong)."""
    robust = np.asarray(outcome.robust, bool)
    contradicted = int(np.sum(verified & ~robust))
    warning = None
    if contradicted:
        warning = (f"eps={outcome.eps:g}: {contradicted} examples verified by {method} were "
                   f"broken by an attack: the bounds or the attack are wrong (report this)")
    n = len(robust)
    return {"method": method, "certified_accuracy": float(verified.mean()),
            "attacked_accuracy": float(robust.mean()),
            "undecided": float(np.sum(robust & ~verified) / n),
            "undecided_count": int(np.sum(robust & ~verified)),
            "seconds": seconds, "_warning": warning}


def _budgets(eps: Any) -> list[float]:
    """The distinct budgets in increasing order, each a finite number >= 0."""
    if isinstance(eps, (list, tuple)):
        values = list(eps)
    else:  # a number, an array or a tensor
        values = [eps] if np.ndim(eps) == 0 else np.asarray(eps).ravel().tolist()
    budgets = sorted({_checks.nonnegative(e, "eps") for e in values})
    if not budgets:
        raise ValueError("eps: give at least one budget")
    return budgets


def _attacks_for_norm(attacks: Any, norm: str) -> list[tuple[str, Attack]]:
    """``(label, Attack)`` pairs (:func:`attacks.registry.parse_attacks`), each supporting
    ``norm``."""
    named_attacks = parse_attacks(attacks, norm=norm)
    for label, attack in named_attacks:
        if norm not in attack.norms:
            raise ValueError(f"attacks: {label} does not support norm {norm!r} "
                             f"(supports {attack.norms})")
    return named_attacks


def _random_targets(labels: np.ndarray, num_classes: int, seed: int) -> np.ndarray:
    """A random class other than the label for every example (targeted attacks)."""
    offsets = np.random.default_rng(seed).integers(1, num_classes, size=len(labels))
    return (labels + offsets) % num_classes


def _example_grid(model: Callable, inputs: np.ndarray, labels: np.ndarray,
                  clean_predictions: np.ndarray, correct: np.ndarray, outcome: BudgetOutcome,
                  count: int, batch_size: int) -> dict[str, np.ndarray]:
    """The report's image grid at one eps: broken examples first, then robust ones (no
    adversarial found), then the misclassified."""
    order = np.concatenate([np.flatnonzero(correct & ~outcome.robust),
                            np.flatnonzero(outcome.robust), np.flatnonzero(~correct)])
    shown = order[:count]
    return {"x": inputs[shown], "x_adv": outcome.x_worst[shown], "y": labels[shown],
            "pred": clean_predictions[shown],
            "pred_adv": predict_labels(model, outcome.x_worst[shown], batch_size)}


def _warn(found: list[str], message: str | None) -> None:
    """Add ``message`` to the report's warnings and emit it (at the caller of :func:`evaluate`)."""
    if message:
        found.append(message)
        warnings.warn(message, UserWarning, stacklevel=3)
