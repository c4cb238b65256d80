"""``history.json`` of a classifier training run (:func:`attacks.training.train_classifier`):
every epoch from the start of a run, across interruptions and resumes, with the training time
summed over its parts.

>>> import tempfile
>>> prior_history(tempfile.mkdtemp(), 3)  # nothing to resume from
{}
"""

from __future__ import annotations

import json
import os
from typing import Any

from robustgrad.atomic import write_json

__all__ = ["prior_history", "write_history"]


def prior_history(out: str, epochs_done: int) -> dict:
    """The ``history.json`` of the run being resumed, cut to the ``epochs_done`` epochs its
    checkpoint holds (an empty dict when there is none)."""
    path = os.path.join(out, "history.json")
    try:
        with open(path) as f:
            prior = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(prior, dict):
        return {}
    history, seconds = prior.get("history"), prior.get("epoch_seconds")
    history = history if isinstance(history, dict) else {}
    seconds = seconds if isinstance(seconds, list) else []
    return {"history": {k: list(v)[:epochs_done] for k, v in history.items()
                        if isinstance(v, list)},
            "epoch_seconds": seconds[:epochs_done],
            "train_seconds": float(prior.get("train_seconds") or 0.0),
            "partial_epoch_seconds": float(prior.get("partial_epoch_seconds") or 0.0),
            "resumed_at": [r for r in prior.get("resumed_at", []) if isinstance(r, dict)]}


def write_history(out: str, prior: dict, recorder: Any, timer: Any, guard: Any, seconds: float,
                  first_epoch: int, skipped: int, partial: float | None = None) -> float:
    """Write ``history.json``: every epoch from the start of the run (the resumed part after
    the ``prior`` one, as :func:`prior_history` read it; ``recorder`` a ``keras.callbacks.History``,
    ``timer`` an :class:`~attacks.training.EpochTimer`, ``guard`` the fast-AT guard or None),
    ``train_seconds`` summed over every part; returns that sum.
    ``partial`` (seconds of an epoch interrupted mid-way) is kept for the part that ends it."""
    history = {k: list(v) for k, v in prior.get("history", {}).items()}
    for k, vals in recorder.history.items():
        history.setdefault(k, []).extend(float(v) for v in vals)
    epoch_seconds = list(prior.get("epoch_seconds", []))
    mine = list(timer.seconds)
    if mine and skipped:  # the interrupted epoch's earlier batches
        mine[0] += prior.get("partial_epoch_seconds", 0.0)
    epoch_seconds += mine
    total = prior.get("train_seconds", 0.0) + seconds
    resumed = list(prior.get("resumed_at", []))
    if first_epoch or skipped:
        resumed.append({"epoch": first_epoch, "batch": skipped})
    record = {"history": history, "train_seconds": total, "epoch_seconds": epoch_seconds,
              "resumed_at": resumed}
    if partial is not None:
        carried = prior.get("partial_epoch_seconds", 0.0) if skipped and not mine else 0.0
        record["partial_epoch_seconds"] = partial + carried
    if guard is not None:
        record["guard"] = {"collapsed_epoch": guard.collapsed_epoch,
                           "pgd_accuracy": guard.history, "best_epoch": guard.best_epoch}
    write_json(os.path.join(out, "history.json"), record)  # a second Ctrl-C: never half a file
    return total
