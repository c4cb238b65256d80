r"""The ``--resume`` rule both training commands share: a resumed run keeps its configuration
(the rule itself is :meth:`robustgrad.rundir.RunDirectory.resume_changes`; here its errors become
usage errors, and train-agent's side of it reads the agent checkpoint).

A key whose requested value differs from the saved one is refused, with every differing key
named, unless ``--override KEY[,KEY]`` names it; the changes that were let through are recorded
(``overrides`` in the run's ``config.json``: one ``{key: [saved, new]}`` entry per resume).

>>> saved, mine = {"epochs": 10, "lr": 0.1, "out": "a"}, {"epochs": 12, "lr": 0.1, "out": "b"}
>>> changed_keys(saved, mine, free={"out"})
{'epochs': [10, 12]}
>>> check_resume(saved, mine, override="epochs", where="runs/x", free={"out"})
{'epochs': [10, 12]}
>>> try:
...     check_resume(saved, mine, override=None, where="runs/x", free={"out"})
... except UsageError as exc:
...     print(str(exc).replace("; ", ";\n"))
--resume: the run in runs/x has a different configuration (epochs: saved 10 != 12);
pass --override epochs to change it
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from robustgrad import rundir
from robustgrad.cli import UsageError, user_errors
from robustgrad.rundir import changed_keys, record_overrides  # noqa: F401 - the commands' names

__all__ = ["agent_overrides", "changed_keys", "check_agent_resume", "check_resume",
           "override_keys", "read_agent_record", "read_checkpoint_steps", "record_overrides",
           "write_agent_record"]


def override_keys(text: str | None, known: Collection[str]) -> set[str]:
    """:func:`robustgrad.rundir.override_keys`, its ``ValueError`` a :class:`UsageError`."""
    with user_errors(ValueError):
        return rundir.override_keys(text, known)


def check_resume(saved: Mapping[str, Any], requested: Mapping[str, Any], *,
                 override: str | None, where: str, free: Collection[str] = (),
                 known: Collection[str] | None = None,
                 names: Mapping[str, str] | None = None) -> dict[str, list]:
    """:func:`robustgrad.rundir.check_resume`, its ``ValueError`` a :class:`UsageError`."""
    with user_errors(ValueError):
        return rundir.check_resume(dict(saved), dict(requested), override=override, where=where,
                                   free=free, known=known, names=dict(names or {}))


# names train-agent's flags give config fields (the rest are --set KEY=VALUE fields)
AGENT_FLAG_NAMES = {"learning_rate": "lr"}


def check_agent_resume(checkpoint: str, requested: Mapping[str, Any], *, override: str | None,
                       steps: int) -> dict[str, list]:
    """train-agent's side of the rule: ``requested`` (the config fields the command line sets,
    with ``env`` and ``seed``) against the checkpoint's config; ``steps`` (the budget) must not
    be below the steps the checkpoint already holds. Returns the allowed changes (the earlier
    resumes' record: :func:`agent_overrides`)."""
    from agents.core.persistence import read_metadata

    meta, saved = read_metadata(checkpoint)
    done = int(meta["num_timesteps"])
    if steps < done:
        raise UsageError(f"--steps {steps} is below the {done} steps the checkpoint in "
                         f"{checkpoint} already holds (--steps is the total budget)")
    requested = dict(requested)
    if saved.get("env") is None:  # trained on a factory: the id on the command line is not it
        requested.pop("env", None)
    free = {"checkpoint_dir", "checkpoint_every", "overrides"}
    with user_errors(ValueError):  # the one resume rule, on the checkpoint's record
        return rundir.RunDirectory(checkpoint).resume_changes(
            requested, saved=saved, override=override, free=free,
            known=set(saved) | set(requested), names=AGENT_FLAG_NAMES)


def read_checkpoint_steps(checkpoint: str) -> int:
    """The environment steps the agent checkpoint in ``checkpoint`` holds."""
    from agents.core.persistence import read_metadata

    return int(read_metadata(checkpoint)[0]["num_timesteps"])


def agent_overrides(checkpoint: str) -> list:
    """The ``overrides`` record kept in ``checkpoint/config.json`` (``[]`` when none)."""
    from agents.core.persistence import read_metadata

    _, saved = read_metadata(checkpoint)
    record = saved.get("overrides", [])
    return list(record) if isinstance(record, list) else []


def write_agent_record(directory: str, overrides: list, history: list, train_seconds: float,
                       resumed_at: list) -> None:
    """Add the ``overrides`` record to ``directory/config.json`` (an agent directory; loading
    ignores the key) and write ``directory/history.json`` (every update from the start, the
    summed ``train_seconds``, the steps each resume started from)."""
    import json
    import os

    path = os.path.join(directory, "config.json")
    if overrides and os.path.isfile(path):
        with open(path) as f:
            config = json.load(f)
        config["overrides"] = overrides
        _write_json(path, config)
    _write_json(os.path.join(directory, "history.json"),
                {"history": history, "train_seconds": train_seconds, "resumed_at": resumed_at})


def read_agent_record(directory: str) -> tuple[float, list]:
    """``(train_seconds, resumed_at)`` of ``directory/history.json`` (``(0.0, [])`` if none)."""
    import json
    import os

    try:
        with open(os.path.join(directory, "history.json")) as f:
            record = json.load(f)
        return float(record.get("train_seconds") or 0.0), list(record.get("resumed_at") or [])
    except (OSError, ValueError, TypeError, AttributeError):
        return 0.0, []


def _write_json(path: str, value: Any) -> None:
    from robustgrad.atomic import write_json

    write_json(path, value)
