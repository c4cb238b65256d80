"""An evaluation run as a library object: :class:`EvaluationConfig` (the settings of
``robustgrad evaluate``, typed) and :func:`evaluate_run`, which evaluates a saved classifier
under an attack cascade into a :class:`~robustgrad.rundir.RunDirectory`, as
:func:`attacks.training.train_classifier` trains one and :func:`attacks.certification.certify_run`
certifies one. The command line only parses its flags into the config and calls it.

The run directory is locked for the run's life (a second run on it is refused, naming the
process); each chunk of examples is committed to ``run/results`` as it finishes, so an
interrupted run resumes (``resume=True``) where it stopped and ends per example equal to an
uninterrupted one; the report (``report.json``, ``report.txt``, ``per_example.npz``, the
figures) and a RobustBench-style ``summary.json`` are written atomically at the end.

Example (a whole resumable evaluation in three lines)::

    >>> import tempfile, keras
    >>> from attacks.evaluation_run import EvaluationConfig, evaluate_run
    >>> model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
    ...                           keras.layers.Dense(10)])
    >>> config = EvaluationConfig(model="tiny", attacks=("fgsm",), eps=(0.1,), limit=16)
    >>> report = evaluate_run(config, tempfile.mkdtemp(), model=model, verbose=0)
    >>> sorted(report.worst_case) == [0.1] and report.n == 16
    True
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from robustgrad import checks
from robustgrad.atomic import replacing
from robustgrad.errors import ConfigError
from robustgrad.rundir import RunDirectory

from ._models import check_classification_data
from .data import load_test_set
from .evaluate import evaluate
from .registry import parse_attacks

__all__ = ["DEFAULT_ATTACKS", "EvaluationConfig", "evaluate_run"]

DEFAULT_ATTACKS = ("fgsm", "pgd", "apgd-ce", "square")
"""The cascade run when :attr:`EvaluationConfig.attacks` is ``None`` (cheap first)."""

_CERTIFY = ("crown", "ibp", "crown-ibp", "alpha-crown")


@dataclass(frozen=True)
class EvaluationConfig:
    """The settings of an evaluation run (the ``robustgrad evaluate`` flags, underscored).

    Checked when built: a :class:`~robustgrad.errors.ConfigError` (a ``ValueError``) names the
    field and its accepted range before any work."""

    model: str
    """The model's file (its name is the summary's model name; :func:`evaluate_run` may be
    given the model itself)."""
    data: str = "digits"
    """A dataset name or a path .npz (:func:`attacks.data.load_test_set`)."""
    attacks: tuple[str, ...] | None = None
    """Attack names run as a cascade in this order (:data:`attacks.ATTACK_NAMES`, ``pgd40``,
    ``pgd50x5``, AutoAttack's versions); ``None``: :data:`DEFAULT_ATTACKS`, without Square on
    vector data (it perturbs square windows)."""
    eps: tuple[float, ...] = (0.05, 0.1)
    """The budgets, in the units of the data."""
    norm: str = "linf"
    """``linf``, ``l2`` or ``l1``: the threat model every attack shares."""
    batch_size: int = 256
    """Examples per attack call."""
    limit: int | None = None
    """Evaluate only the first ``limit`` examples."""
    clip_min: float | None = None
    """Lower input bound (default: the dataset's, else the data's minimum)."""
    clip_max: float | None = None
    """Upper input bound (default: the dataset's, else the data's maximum)."""
    cascade: bool = True
    """Attack only still-robust examples; ``False`` runs every attack on every example."""
    sanity_checks: bool = True
    """Run the gradient-masking checks."""
    certify: str | None = None
    """Also certify every eps with this bound method (crown, ibp, crown-ibp, alpha-crown)."""
    seed: int = 0
    """Base seed of the attacks' randomness."""
    chunk_size: int | None = None
    """Examples per committed chunk (default :data:`attacks.results.DEFAULT_CHUNK_SIZE`): the
    most an interruption loses."""
    workers: int | None = None
    """Run the chunks as Ray tasks on this many workers (the ``distributed`` extra)."""
    ray_address: str | None = None
    """With ``workers``: a running Ray cluster (``HOST:PORT`` or ``auto``)."""

    def __post_init__(self) -> None:
        eps = tuple(float(checks.nonnegative(e, "eps")) for e in _as_tuple(self.eps, "eps"))
        if not eps:
            raise ConfigError("eps must hold at least one budget >= 0, got ()")
        object.__setattr__(self, "eps", eps)
        if self.attacks is not None:
            names = tuple(str(a).strip() for a in _as_tuple(self.attacks, "attacks")
                          if str(a).strip())
            if not names:
                raise ConfigError(f"attacks must name at least one attack, got {self.attacks!r}")
            object.__setattr__(self, "attacks", names)
        object.__setattr__(self, "norm", checks.norm_name(self.norm, "norm"))
        checks.positive_int(self.batch_size, "batch_size", maximum=2**20)
        checks.positive_int(self.limit, "limit", allow_none=True, maximum=10**9)
        checks.positive_int(self.seed, "seed", minimum=0, maximum=2**32 - 1)
        checks.positive_int(self.chunk_size, "chunk_size", allow_none=True, maximum=10**9)
        # the command line's bound (robustgrad.commands._bounds.MAX_PROCESSES), as --workers
        checks.positive_int(self.workers, "workers", allow_none=True, maximum=1024)
        if self.certify is not None:
            if self.certify not in _CERTIFY:
                raise ConfigError(f"certify must be one of {', '.join(_CERTIFY)} or None, got "
                                  f"{self.certify!r}")
            if self.norm not in ("linf", "l2"):
                raise ConfigError(f"certify certifies linf or l2 balls, not norm {self.norm}")
        if self.ray_address is not None and self.workers is None:
            raise ConfigError("ray_address is where the workers run: give workers too")
        lo, hi = self.clip_min, self.clip_max
        for name, value in (("clip_min", lo), ("clip_max", hi)):  # as --clip-min/--clip-max
            if value is not None:
                checks.number(value, name)
        if lo is not None and hi is not None and not float(lo) < float(hi):
            raise ConfigError(f"clip_min ({lo}) must be below clip_max ({hi})")

    @property
    def attack_names(self) -> tuple[str, ...]:
        """The attacks asked for, or :data:`DEFAULT_ATTACKS`."""
        return self.attacks if self.attacks is not None else DEFAULT_ATTACKS


def _as_tuple(value: Any, name: str) -> tuple:
    """A tuple of ``value``'s items (a comma-separated string is split; for ``eps`` each item
    of it read as a number)."""
    if isinstance(value, str):
        items = tuple(v.strip() for v in value.split(",") if v.strip())
        if name == "eps":
            try:
                return tuple(float(v) for v in items)
            except ValueError:
                raise ConfigError(f"eps must be comma-separated numbers, got {value!r}") from None
        return items
    try:
        return tuple(value)
    except TypeError:
        return (value,)


def evaluate_run(config: EvaluationConfig, run: RunDirectory | str | os.PathLike, *,
                 model: Any = None, load_model: Callable[[str], Any] | None = None,
                 resume: bool = False, overwrite: bool = False,
                 progress: Callable[[int, int, str], None] | None = None,
                 verbose: int = 1, log: Callable[[str], None] = print,
                 lock: bool = True) -> Any:
    """Evaluate a classifier under ``config``'s attack cascade into ``run`` and return the
    :class:`attacks.report.EvaluationReport`.

    Args:
      config: the run's settings.
      run: a :class:`~robustgrad.rundir.RunDirectory` (or its path).
      model: the classifier (a Keras model or any ``model(x, training=False) -> logits``);
        default: ``config.model`` loaded by ``load_model``.
      load_model: ``path -> model`` (default ``keras.models.load_model(path, compile=False)``).
      resume: continue the chunks committed in ``run/results`` (the same model weights, data,
        attacks, eps, norm, bounds, seed and chunk size, else a ``ValueError`` naming the
        difference); a finished chunk is never attacked again.
      overwrite: start afresh, discarding chunks an earlier run left in ``run/results``. A run
        directory holding committed results needs one of the two.
      progress: ``progress(done, total, description)``, as :func:`attacks.evaluate` takes.
      verbose: 0 silent; 1 a line saying what runs, the report's table and the files written.
      log: where those lines go (default ``print``).
      lock: hold ``run``'s lock for the run (the command line already holds it).

    Raises:
      ConfigError: an attack that does not support ``config.norm``; ``resume`` with
        ``overwrite``, ``resume`` of a directory without results, committed results without
        either; data that cannot be read.
      ValueError: data the model does not fit (shapes, label range), a resume of another
        evaluation (every difference named).
    """
    if resume and overwrite:
        raise ConfigError("resume continues the results in the run directory; overwrite "
                          "replaces them: give one")
    run = run if isinstance(run, RunDirectory) else RunDirectory(run)
    committed = os.path.isfile(run.join("results", "manifest.json"))
    if resume and not committed:
        raise ConfigError(f"resume: {run.path} holds no evaluation to resume (no "
                          f"results/manifest.json); run without resume")
    if committed and not (resume or overwrite):
        raise ConfigError(f"{run.path} holds an evaluation's committed results: resume=True "
                          f"continues it, overwrite=True starts afresh")
    specs = parse_attacks(",".join(config.attack_names), norm=config.norm)
    for label, attack in specs:
        if config.norm not in attack.norms:
            raise ConfigError(f"attacks: {label} does not support norm {config.norm} (supports "
                              f"{', '.join(attack.norms)})")
    try:
        x, y, lo, hi = load_test_set(config.data)
    except OSError as exc:  # a missing or unreadable file: the user's, said as it is
        raise ConfigError(str(exc)) from exc
    if config.limit:
        x, y = x[: config.limit], y[: config.limit]
    if config.attacks is None and np.ndim(x) not in (3, 4):
        specs = [(label, attack) for label, attack in specs if label != "square"]
        if verbose:
            log(f"note: data {config.data} holds vectors {tuple(np.shape(x)[1:])}, not images: "
                f"the default attacks run without square (it perturbs square windows)")
    lo = config.clip_min if config.clip_min is not None else lo
    hi = config.clip_max if config.clip_max is not None else hi
    # the bounds, and so the units of eps, said on the first line (0-255 pixels with an eps
    # meant for [0, 1] must not pass in silence); None takes the data's range, as evaluate does
    shown = [float(np.min(x)) if lo is None else lo, float(np.max(x)) if hi is None else hi]
    units = ("" if shown == [0.0, 1.0] else
             f" (inputs in [{shown[0]:g}, {shown[1]:g}]: eps is in these units)")
    if model is None:
        model = (load_model or _load_keras)(config.model)
    # one forward pass: the model's errors name the model, the data's name the data
    check_classification_data(model, x, np.asarray(y), x_name=f"data {config.data}: x",
                              y_name=f"data {config.data}: y", model_name="model")
    if lock:  # the directory's lock for the run's life (the command line holds its own)
        run.open()
    try:
        if verbose:
            log(f"evaluating {config.model} on {len(x)} examples of {config.data}: attacks "
                f"{','.join(label for label, _ in specs)}, {config.norm} eps "
                f"{','.join(f'{e:g}' for e in config.eps)}{units}")
        results = run.join("results")
        if overwrite and os.path.isdir(results):
            shutil.rmtree(results)  # a new evaluation, not the old one's chunks
        report = evaluate(
            model, x, np.asarray(y), specs, list(config.eps), config.batch_size,
            norm=config.norm, clip_min=lo, clip_max=hi, cascade=config.cascade,
            seed=config.seed, sanity_checks=config.sanity_checks, progress=progress,
            certify=config.certify, results_dir=results, chunk_size=config.chunk_size,
            **_sharding(config))
        if verbose:
            log(report.table())
        paths = report.save(run.path)
        paths["summary"] = _write_summary(report, config, run)
        if verbose:
            log("wrote " + ", ".join(str(p) for p in paths.values()))
        return report
    finally:
        if lock:
            run.close()


def _load_keras(path: str) -> Any:
    import keras

    if not os.path.exists(path):  # Keras's own message names neither the argument nor a fix
        raise ConfigError(f"model {path}: no such file (a saved Keras model, .keras or .h5)")
    return keras.models.load_model(path, compile=False)


def _sharding(config: EvaluationConfig) -> dict:
    """:func:`attacks.evaluate`'s keywords for ``workers``: each worker loads ``config.model``
    itself."""
    import functools

    import keras

    if config.workers is None:
        return {}
    return {"workers": config.workers, "ray_address": config.ray_address,
            "model_factory": functools.partial(keras.models.load_model,
                                               os.path.abspath(config.model), compile=False)}


def _write_summary(report: Any, config: EvaluationConfig, run: RunDirectory) -> str:
    """``summary.json``: the report's RobustBench-style entry (model file name, dataset), with
    the attack versions as asked (``autoattack`` names AutoAttack's standard version; its
    robust accuracy is then ``autoattack_robust_accuracy``), the library's version and, with
    ``certify``, the certified accuracy per eps."""
    import json

    import robustgrad

    path = run.join("summary.json")
    name = os.path.splitext(os.path.basename(os.path.normpath(config.model)))[0]
    entry = report.summary(name, config.data)
    entry["attack_versions"] = list(config.attack_names)
    if any(a.lower().startswith("autoattack") for a in config.attack_names):
        entry["autoattack_robust_accuracy"] = entry["robust_accuracy"]
    if report.certified:
        entry["certified_accuracy"] = {f"{e:g}": c["certified_accuracy"]
                                       for e, c in report.certified.items()}
        entry["certify"] = report.certify
    entry["library_version"] = robustgrad.__version__
    with replacing(path) as tmp, open(tmp, "w") as f:
        json.dump(entry, f, indent=2)
    return path
