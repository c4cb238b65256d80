"""One certification run as a library call: :func:`certify_run` (what ``robustgrad certify`` does).

It takes a :class:`CertifyConfig` and a :class:`robustgrad.rundir.RunDirectory`: certified
accuracy of a classifier at every radius of ``config.eps``, by bound propagation
(:func:`attacks.certify.verified_accuracy`: ``crown``, ``ibp``, ``crown-ibp``, ``alpha-crown``) or
by randomized smoothing (:func:`attacks.certify.smooth_certify`), written to ``report.json``,
``report.txt`` and ``per_example.npz`` (per example its label, clean prediction and, per radius,
whether it is certified) in the run directory, atomically. The command line parses its flags
into the config and calls it.

The examples are certified in chunks of ``config.chunk_size``; each chunk's certificates are
committed to ``results/`` in the run directory (:class:`attacks.results.ResultsStore`) as soon
as the chunk ends, so Ctrl-C or a kill loses at most the chunk in flight. ``resume=True``
continues such a run: its finished chunks are read back, never certified again, and the report
is per example equal to an uninterrupted run's (smoothing draws chunk ``c``'s noise from
:func:`attacks.results.chunk_base_seed` of ``seed`` and ``c``). A resume whose model, data,
method, radii, norm, bounds or (smoothing) noise settings differ from the run's record is
refused naming each difference, before any work.

>>> import tempfile, keras
>>> from robustgrad.rundir import RunDirectory
>>> keras.utils.set_random_seed(0)
>>> model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
...                           keras.layers.Dense(10)])
>>> config = CertifyConfig(model="tiny", method="ibp", eps=(0.1, 0.01), limit=32)
>>> run = RunDirectory(tempfile.mkdtemp())
>>> report = certify_run(config, run, model=model, verbose=0)
>>> [r["eps"] for r in report["results"]], report["n"], run.holds(["report.json", "report.txt"])
([0.01, 0.1], 32, ['report.json', 'report.txt'])
>>> small, large = (r["certified_accuracy"] for r in report["results"])
>>> large <= small <= report["clean_accuracy"]          # a lower bound, shrinking with the radius
True
>>> again = certify_run(config, run, model=model, verbose=0, resume=True)  # nothing left to do
>>> again["results"] == report["results"]
True
>>> certify_run(CertifyConfig(model="tiny", method="crown", eps=(0.1, 0.01), limit=32), run,
...             model=model, verbose=0, resume=True)
Traceback (most recent call last):
...
robustgrad.errors.ConfigError: resume: ... different settings: method: recorded 'ibp', now 'crown'
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from robustgrad.atomic import replacing
from robustgrad.errors import ConfigError
from robustgrad.rundir import RunDirectory

from . import certify
from ._models import check_classification_data
from .results import (
    DEFAULT_CHUNK_SIZE,
    ResultsStore,
    chunk_base_seed,
    data_digest,
    model_digest,
    split_chunks,
)

__all__ = ["CERTIFY_METHODS", "CertifyConfig", "certify_run", "report_table"]

CERTIFY_METHODS = ("crown", "ibp", "crown-ibp", "alpha-crown", "smoothing")
"""The bound methods of :mod:`robustgrad.bounds`, and randomized smoothing."""


@dataclass(frozen=True)
class CertifyConfig:
    """The settings of a certification run (the ``robustgrad certify`` flags, underscored)."""

    model: str
    """The model's file (recorded in the report; :func:`certify_run` may be given the model)."""
    data: str = "digits"
    """A dataset name or a path .npz (:func:`attacks.data.load_test_set`)."""
    eps: tuple[float, ...] = (0.05, 0.1)
    """The radii (L2 for smoothing)."""
    method: str = "crown"
    """One of :data:`CERTIFY_METHODS`."""
    norm: str | None = None
    """``linf`` (default) or ``l2`` for the bounds; smoothing certifies ``l2``."""
    sigma: float = 0.25
    """smoothing: the noise's standard deviation."""
    n0: int = 100
    """smoothing: selection draws per example."""
    n: int = 10_000
    """smoothing: estimation draws per example."""
    alpha: float = 0.001
    """smoothing: failure probability of each certificate."""
    seed: int = 0
    """smoothing: the noise's seed."""
    batch_size: int = 256
    """Examples per call."""
    limit: int | None = None
    """Certify only the first ``limit`` examples."""
    clip_min: float | None = None
    """Lower input bound (default: the dataset's, else the data's minimum)."""
    clip_max: float | None = None
    """Upper input bound (default: the dataset's, else the data's maximum)."""
    chunk_size: int | None = None
    """Examples per committed chunk (default :data:`attacks.results.DEFAULT_CHUNK_SIZE`): the
    most an interruption loses."""

    def __post_init__(self) -> None:
        from robustgrad.checks import positive_int

        if self.method not in CERTIFY_METHODS:
            raise ConfigError(f"method must be one of {', '.join(CERTIFY_METHODS)}, got "
                              f"{self.method!r}")
        positive_int(self.chunk_size, "chunk_size", allow_none=True, maximum=10**9)
        object.__setattr__(self, "eps", tuple(sorted(set(float(e) for e in self.eps))))
        if self.norm is None:
            object.__setattr__(self, "norm", "l2" if self.method == "smoothing" else "linf")

    @property
    def report_norm(self) -> str:
        """The norm of the radii in the report (smoothing: ``l2``)."""
        return "l2" if self.method == "smoothing" else str(self.norm)


def _said(exc: BaseException, prefix: str = "") -> ConfigError:
    return ConfigError(f"{prefix}{exc}")


def _load(config: CertifyConfig, model: Any) -> tuple:
    """The test examples (``limit``), their input range, and the model (``model``, or loaded by
    it: a function ``path -> model``, default ``keras.models.load_model``) checked against them
    and against the bound method; ``(model, x, y, lo, hi)``."""
    from robustgrad import bounds

    from .data import load_test_set

    try:
        x, y, lo, hi = load_test_set(config.data)
    except (ValueError, OSError) as exc:
        raise _said(exc) from exc
    if config.limit:
        x, y = x[: config.limit], y[: config.limit]
    lo = config.clip_min if config.clip_min is not None else (
        float(x.min()) if lo is None else lo)
    hi = config.clip_max if config.clip_max is not None else (
        float(x.max()) if hi is None else hi)
    y = np.asarray(y)
    if model is None or not hasattr(model, "predict"):  # not a model: a loader
        model = (model or _load_model)(config.model)
    try:  # the model's errors name --model, the data's --data
        num_classes = check_classification_data(model, x, y, x_name=f"--data {config.data}: x",
                                                y_name=f"--data {config.data}: y",
                                                model_name="--model")
    except (ValueError, TypeError) as exc:
        raise _said(exc) from exc
    try:
        if config.method != "smoothing":
            bounded = bounds.BoundedModel(model)  # an unsupported layer or a softmax output, named
            if config.method == "alpha-crown":  # too wide for dense slopes: now, not per radius
                bounded.check_alpha_crown(x.shape[1:], num_classes - 1)
    except ValueError as exc:
        raise _said(exc, "--model: ") from exc
    return model, x, y, lo, hi


def _load_model(path: str) -> Any:
    import keras

    try:
        return keras.models.load_model(path, compile=False)
    except (ValueError, OSError) as exc:
        raise _said(exc, f"--model {path}: ") from exc


def _clean_predictions(config: CertifyConfig, model: Any, x: Any, verbose: int) -> np.ndarray:
    """The model's predicted classes ``[N]`` (int64)."""
    logits = np.concatenate([np.asarray(model(x[i:i + config.batch_size]))
                             for i in range(0, len(x), config.batch_size)])
    if config.method == "smoothing" and np.allclose(logits.sum(-1), 1.0, atol=1e-3) and \
            logits.min() >= 0 and verbose:
        print("warning: the model outputs probabilities; smoothing only uses the predicted "
              "class, so this is fine, but the bound methods need logits", flush=True)
    return logits.argmax(-1).astype(np.int64)


def _settings(config: CertifyConfig, model: Any, x: np.ndarray, y: np.ndarray, lo: Any,
              hi: Any) -> dict[str, Any]:
    """What a resumed certification must share with the run that wrote its results."""
    def bound(b: Any) -> Any:
        a = np.asarray(b, np.float64)
        return float(a) if a.ndim == 0 else data_digest(a, np.zeros(0, np.int64))

    settings: dict[str, Any] = {
        "kind": "certify", "n": int(len(x)), "data": data_digest(x, y),
        "model": model_digest(model), "method": config.method, "eps": list(config.eps),
        "norm": config.report_norm, "clip_min": bound(lo), "clip_max": bound(hi),
        "chunk_size": config.chunk_size or DEFAULT_CHUNK_SIZE}
    if config.method == "smoothing":  # the noise draws depend on these (and on the batch)
        settings.update(sigma=config.sigma, n0=config.n0, n=config.n, alpha=config.alpha,
                        seed=config.seed, batch_size=config.batch_size)
    return settings


def _store(run: RunDirectory, settings: dict[str, Any], resume: bool) -> ResultsStore:
    """The run's :class:`~attacks.results.ResultsStore` (``results/``): continued with
    ``resume`` (its record must match ``settings``), else started afresh (an earlier run's
    committed chunks removed)."""
    directory = run.join("results")
    manifest = os.path.join(directory, "manifest.json")
    if resume and not os.path.isfile(manifest):
        raise ConfigError(f"resume: {run.path} holds no certification to resume (no "
                          "results/manifest.json); run without --resume")
    if not resume and os.path.isdir(directory):
        for name in os.listdir(directory):
            if name == "manifest.json" or name.endswith(".npz") and name.startswith(
                    ("certified-", "smoothed-", "chunk-")):
                os.remove(os.path.join(directory, name))
    return _stored(ResultsStore, directory, settings)


def _stored(load: Callable[..., Any], *args: Any) -> Any:
    """``load(*args)`` with a results file's ``ValueError`` (a damaged, foreign or different
    record) as the user's :class:`~robustgrad.errors.ConfigError`."""
    try:
        return load(*args)
    except ValueError as exc:
        raise _said(exc) from exc


def _chunk_label(c: int, chunks: list) -> str:
    return f"chunk {c + 1}/{len(chunks)} " if len(chunks) > 1 else ""


def _smoothing(config: CertifyConfig, model: Any, x: Any, y: Any, chunks: list,
               store: ResultsStore, verbose: int) -> tuple[list, dict, dict]:
    """Randomized smoothing (Cohen et al.) chunk by chunk, each committed to ``store`` (or read
    back from it): certified accuracy per radius, its extras, and the per-example arrays."""
    finished = set(store.finished_smoothing())
    labels, radii, seconds = [], [], 0.0
    for c, (start, stop) in enumerate(chunks):
        if c in finished:
            lab, rad, spent = _stored(store.load_smoothing, c, start, stop - start)
        else:
            t = time.perf_counter()
            lab, rad = certify.smooth_certify(
                model, x[start:stop], config.sigma, n0=config.n0, n=config.n,
                alpha=config.alpha, batch_size=config.batch_size,
                seed=chunk_base_seed(config.seed, c))
            spent = time.perf_counter() - t
            store.commit_smoothing(c, start, np.asarray(lab), np.asarray(rad), spent)
            if verbose >= 2 and len(chunks) > 1:
                print(f"  {_chunk_label(c, chunks)}committed ({spent:.1f} s)", flush=True)
        labels.append(np.asarray(lab, np.int64))
        radii.append(np.asarray(rad, np.float64))
        seconds += spent
    label, radius = np.concatenate(labels), np.concatenate(radii)
    right = label == y
    results = [{"eps": e, "certified_accuracy": float(np.mean(right & (radius >= e)))}
               for e in config.eps]
    extra = {"sigma": config.sigma, "n0": config.n0, "n": config.n, "alpha": config.alpha,
             "abstained": float(np.mean(label == certify.ABSTAIN)),
             "smoothed_accuracy": float(np.mean(right)), "seconds": seconds}
    per_example = {"smoothed_prediction": label, "radius": radius,
                   **{f"certified@{e:g}": right & (radius >= e) for e in config.eps}}
    return results, extra, per_example


def _bounded(config: CertifyConfig, model: Any, x: Any, y: Any, lo: Any, hi: Any,
             chunks: list, store: ResultsStore, verbose: int) -> tuple[list, dict, dict]:
    """Verified accuracy by bound propagation at each radius, chunk by chunk (each chunk's
    masks committed to ``store`` before the next starts, or read back from it)."""
    finished = set(store.finished_certificates(config.method))
    masks: list[list[np.ndarray]] = [[] for _ in config.eps]
    seconds = [0.0] * len(config.eps)
    for c, (start, stop) in enumerate(chunks):
        if c in finished:
            verified, spent = _stored(store.load_certificate, config.method, c, start,
                                      stop - start, config.eps)
        else:
            verified, spent = [], []
            for e in config.eps:
                t = time.perf_counter()
                verified.append(np.asarray(certify.verified_mask(
                    model, x[start:stop], y[start:stop], e, str(config.norm), config.method,
                    clip_min=lo, clip_max=hi, batch_size=config.batch_size), bool))
                spent.append(time.perf_counter() - t)
                if verbose >= 2:
                    print(f"  {_chunk_label(c, chunks)}eps={e:g}: certified "
                          f"{verified[-1].mean():.3f} ({spent[-1]:.1f} s)", flush=True)
            store.commit_certificate(config.method, c, start, config.eps, verified, spent)
        for k in range(len(config.eps)):
            masks[k].append(verified[k])
            seconds[k] += spent[k]
    mask = [np.concatenate(m) for m in masks]
    results = [{"eps": e, "certified_accuracy": float(np.mean(mask[k])), "seconds": seconds[k]}
               for k, e in enumerate(config.eps)]
    return results, {"seconds": float(sum(seconds))}, \
        {f"verified@{e:g}": mask[k] for k, e in enumerate(config.eps)}


def report_table(config: CertifyConfig, report: dict) -> str:
    """The report as the text of ``report.txt``."""
    results, n, clean = report["results"], report["n"], report["clean_accuracy"]
    lines = [f"certified accuracy ({config.method}, {report['norm']}) of {n} examples; clean "
             f"accuracy {clean:.3f}", "eps      certified acc"]
    lines += [f"{r['eps']:<8g} {r['certified_accuracy']:.3f}" for r in results]
    if config.method == "smoothing":
        lines.append(f"smoothed accuracy {report['smoothed_accuracy']:.3f}, abstained "
                     f"{report['abstained']:.3f} (sigma {config.sigma:g}, n0 {config.n0}, "
                     f"n {config.n}, alpha {config.alpha:g})")
    return "\n".join(lines)


def certify_run(config: CertifyConfig, run: RunDirectory | str, *, model: Any = None,
                verbose: int = 1, resume: bool = False, lock: bool = True) -> dict:
    """Certify ``model`` (a Keras classifier returning logits, or a function ``path -> model``;
    default: ``config.model`` loaded) at every radius of ``config.eps``; writes ``report.json``,
    ``report.txt`` and ``per_example.npz`` in ``run`` and returns the report (``results``: one
    ``{"eps", "certified_accuracy"}`` per radius; ``clean_accuracy``, ``n``, the input range,
    the chunks and, for smoothing, the abstention rate). ``lock``: hold ``run``'s lock for the run
    (the command line already holds it). Chunks are committed to
    ``run/results`` as they end; ``resume`` continues the run committed there (same settings,
    else :class:`~robustgrad.errors.ConfigError` naming each difference), otherwise it starts
    afresh. ``verbose``: 0 silent, 1 the summary and the table, 2 also a line per chunk and
    radius."""
    run = run if isinstance(run, RunDirectory) else RunDirectory(run)
    model, x, y, lo, hi = _load(config, model)
    if lock:  # the directory's lock for the run's life (the command line holds its own)
        run.open()
    try:
        store = _store(run, _settings(config, model, x, y, lo, hi), resume)
        chunks = split_chunks(len(x), config.chunk_size or DEFAULT_CHUNK_SIZE)
        predictions = _clean_predictions(config, model, x, verbose)
        clean = float(np.mean(predictions == y))
        if verbose:
            done = len(store.finished_smoothing() if config.method == "smoothing"
                       else store.finished_certificates(config.method))
            print(f"certifying {config.model} on {len(x)} examples of {config.data}: "
                  f"{config.method}, {config.report_norm} radii "
                  f"{','.join(f'{e:g}' for e in config.eps)}; clean accuracy {clean:.3f}"
                  + (f"; resuming: {done}/{len(chunks)} chunks committed" if resume else ""),
                  flush=True)
        if config.method == "smoothing":
            results, extra, per_example = _smoothing(config, model, x, y, chunks, store, verbose)
        else:
            results, extra, per_example = _bounded(config, model, x, y, lo, hi, chunks, store,
                                                   verbose)
        report = {"model": str(config.model), "data": str(config.data), "method": config.method,
                  "norm": config.report_norm, "n": int(len(x)), "clean_accuracy": clean,
                  "clip_min": lo, "clip_max": hi, "results": results, "chunks": len(chunks),
                  "chunk_size": config.chunk_size or DEFAULT_CHUNK_SIZE, **extra}
        text = report_table(config, report)
        if verbose:
            print(text)
        run.write_json("report.json", report, indent=2)
        with replacing(run.join("report.txt")) as tmp, open(tmp, "w") as f:
            f.write(text + "\n")
        with replacing(run.join("per_example.npz")) as tmp:
            np.savez_compressed(tmp, index=np.arange(len(x)), label=y, clean_prediction=predictions,
                                correct=predictions == y, **per_example)
        return report
    finally:
        if lock:
            run.close()
