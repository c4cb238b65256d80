"""One certification run as a library call: :func:`certify_run` (what ``robustgrad certify`` does).

It takes a :class:`CertifyConfig` and a :class:`robustgrad.rundir.RunDirectory`: certified
accuracy of a classifier at every radius of ``config.eps``, by bound propagation
(:func:`attacks.certify.verified_accuracy`: ``crown``, ``ibp``, ``crown-ibp``, ``alpha-crown``) or
by randomized smoothing (:func:`attacks.certify.smooth_certify`), written to ``report.json`` and
``report.txt`` in the run directory, atomically. The command line parses its flags into the
config and calls it.

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
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from robustgrad.atomic import replacing
from robustgrad.errors import ConfigError
from robustgrad.rundir import RunDirectory

from . import certify
from ._models import check_classification_data

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

    def __post_init__(self) -> None:
        if self.method not in CERTIFY_METHODS:
            raise ConfigError(f"method must be one of {', '.join(CERTIFY_METHODS)}, got "
                              f"{self.method!r}")
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
    try:
        num_classes = check_classification_data(model, x, y)
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


def _clean_accuracy(config: CertifyConfig, model: Any, x: Any, y: Any, verbose: int) -> float:
    logits = np.concatenate([np.asarray(model(x[i:i + config.batch_size]))
                             for i in range(0, len(x), config.batch_size)])
    if config.method == "smoothing" and np.allclose(logits.sum(-1), 1.0, atol=1e-3) and \
            logits.min() >= 0 and verbose:
        print("warning: the model outputs probabilities; smoothing only uses the predicted "
              "class, so this is fine, but the bound methods need logits", flush=True)
    return float(np.mean(logits.argmax(-1) == y))


def _smoothing(config: CertifyConfig, model: Any, x: Any, y: Any) -> tuple[list, dict]:
    """Randomized smoothing (Cohen et al.): certified accuracy per radius, and its extras."""
    labels, radii = certify.smooth_certify(model, x, config.sigma, n0=config.n0, n=config.n,
                                           alpha=config.alpha, batch_size=config.batch_size,
                                           seed=config.seed)
    labels, radii = np.asarray(labels), np.asarray(radii)
    right = labels == y
    results = [{"eps": e, "certified_accuracy": float(np.mean(right & (radii >= e)))}
               for e in config.eps]
    extra = {"sigma": config.sigma, "n0": config.n0, "n": config.n, "alpha": config.alpha,
             "abstained": float(np.mean(labels == certify.ABSTAIN)),
             "smoothed_accuracy": float(np.mean(right))}
    return results, extra


def _bounded(config: CertifyConfig, model: Any, x: Any, y: Any, lo: Any, hi: Any,
             verbose: int) -> list:
    """Verified accuracy by bound propagation at each radius."""
    results = []
    for e in config.eps:
        t = time.perf_counter()
        acc = certify.verified_accuracy(model, x, y, e, str(config.norm), config.method,
                                        clip_min=lo, clip_max=hi, batch_size=config.batch_size)
        results.append({"eps": e, "certified_accuracy": acc, "seconds": time.perf_counter() - t})
        if verbose >= 2:
            print(f"  eps={e:g}: certified {acc:.3f} ({time.perf_counter() - t:.1f} s)",
                  flush=True)
    return results


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
                verbose: int = 1) -> dict:
    """Certify ``model`` (a Keras classifier returning logits, or a function ``path -> model``;
    default: ``config.model`` loaded) at every radius of ``config.eps``; writes ``report.json``
    and ``report.txt`` in ``run`` and returns the report (``results``: one ``{"eps",
    "certified_accuracy"}`` per radius; ``clean_accuracy``, ``n``, the input range and, for
    smoothing, the abstention rate). ``verbose``: 0 silent, 1 the summary and the table, 2 also
    a line per radius."""
    run = run if isinstance(run, RunDirectory) else RunDirectory(run)
    model, x, y, lo, hi = _load(config, model)
    clean = _clean_accuracy(config, model, x, y, verbose)
    if verbose:
        print(f"certifying {config.model} on {len(x)} examples of {config.data}: "
              f"{config.method}, {config.report_norm} radii "
              f"{','.join(f'{e:g}' for e in config.eps)}; clean accuracy {clean:.3f}",
              flush=True)
    started = time.perf_counter()
    if config.method == "smoothing":
        results, extra = _smoothing(config, model, x, y)
    else:
        results, extra = _bounded(config, model, x, y, lo, hi, verbose), {}
    report = {"model": str(config.model), "data": str(config.data), "method": config.method,
              "norm": config.report_norm, "n": int(len(x)), "clean_accuracy": clean,
              "clip_min": lo, "clip_max": hi, "results": results,
              "seconds": time.perf_counter() - started, **extra}
    text = report_table(config, report)
    if verbose:
        print(text)
    run.write_json("report.json", report, indent=2)
    with replacing(run.join("report.txt")) as tmp, open(tmp, "w") as f:
        f.write(text + "\n")
    return report

