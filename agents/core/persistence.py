"""Saving and loading agents: crash-safe writes and loads that check what they read.

An agent directory holds ``config.json`` (every config field), ``agent.json`` (algorithm, steps,
learning curve; written last, so its presence marks a complete save), ``weights/`` (a TF checkpoint
of every variable) and, with observation normalisation, ``normalization.npz`` (the statistics as
plain arrays). No pickle. Other files in the directory (logs, plots, ``best/``) are left alone.

Writes go through :func:`robustgrad.atomic.write_entries`: a kill at any moment leaves either the
previous or the new version, never a mixture and never an empty checkpoint. Loads recover an
interrupted write first, then refuse, with one line naming the file, anything that is not what
:meth:`Agent.save` wrote: missing or non-JSON metadata, an unknown algorithm, weights that do not
match the agent the metadata describes, a checkpoint value nothing consumed.

>>> import tempfile, agents
>>> agent = agents.PPO(env="CartPole-v1", num_envs=2, n_steps=8, hidden_sizes=(8,), seed=0)
>>> path = agent.save(tempfile.mkdtemp() + "/ppo")
>>> read_metadata(path)[0]["algo"]
'ppo'
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad import atomic, rundir

__all__ = ["ENTRIES", "COMMIT", "check_config_matches", "check_saved_env", "loaded_checkpoint_dir",
           "read_metadata", "recover_checkpoint", "restore_weights", "save_crash_checkpoint",
           "write_agent", "write_seed_axis", "agent_meta", "saved_node", "FORMAT_VERSION"]

ENTRIES = ("weights", "config.json", "agent.json", "normalization.npz")
COMMIT = "agent.json"
SEEDS_FILE = "seeds.json"  # a saved agent of several seeds: one ordinary agent per seed beside it


FORMAT_VERSION = 1
"""The version of a saved agent's ``agent.json``."""


def agent_meta(algo: str, num_timesteps: int, env: Any, history: list[dict]) -> dict:
    """The ``agent.json`` of an agent: the format's version, the algorithm, its step count, the
    environment's id (``None`` for a factory) and its ``history``."""
    return {"format_version": FORMAT_VERSION, "algo": algo, "num_timesteps": num_timesteps,
            "env_id": env if isinstance(env, str) else None, "history": history}


def write_agent(directory: str, checkpoint: tf.train.Checkpoint, config: dict, meta: dict,
                normalization: dict[str, np.ndarray] | None) -> str:
    """Write one agent version to ``directory`` crash-safely; returns ``directory``."""
    directory = os.fspath(directory)
    config = {**config, "checkpoint_dir": _portable_checkpoint_dir(config.get("checkpoint_dir"),
                                                                   directory)}

    def writer(stage: str) -> None:
        checkpoint.write(os.path.join(stage, "weights", "ckpt"))
        with open(os.path.join(stage, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        if normalization is not None:
            # numpy's stub types **kwds beside allow_pickle: bool, so a dict of arrays clashes
            np.savez(os.path.join(stage, "normalization.npz"), **normalization)  # type: ignore[arg-type]
        with open(os.path.join(stage, COMMIT), "w") as f:
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())

    atomic.write_entries(directory, ENTRIES, writer, commit=COMMIT)
    return directory


def write_seed_axis(directory: str, algo: str, seeds: Sequence[int], export: Callable[[int], Any],
                    num_timesteps: int, history: list[dict]) -> str:
    """Write an agent of several seeds to ``directory``: ``seed_<s>/`` for each of ``seeds``
    (``export(k)``, an ordinary agent, saved and closed) and :data:`SEEDS_FILE` naming them
    (written last, crash-safe); returns ``directory``."""
    os.makedirs(directory, exist_ok=True)
    for k, seed in enumerate(seeds):
        one = export(k)
        try:
            one.save(os.path.join(directory, f"seed_{seed}"))
        finally:
            one.close()
    with atomic.replacing(os.path.join(directory, SEEDS_FILE)) as tmp, open(tmp, "w") as f:
        json.dump({"algo": algo, "seeds": list(seeds), "num_timesteps": num_timesteps,
                   "history": history}, f)
    return directory


def save_crash_checkpoint(save: Callable[[str], Any], checkpoint_dir: str | None, algo: str,
                          exc: BaseException) -> str | None:
    """After an environment raised ``exc``: ``save`` the agent to ``checkpoint_dir`` (or a new
    temporary directory), warn with the path and add it to ``exc``'s notes; returns the path,
    or ``None`` (and a warning) when the save itself failed."""
    path = checkpoint_dir or tempfile.mkdtemp(prefix=f"robustgrad-{algo}-")
    try:
        save(path)
    except Exception as save_exc:  # pragma: no cover - report both
        warnings.warn(f"could not save the crash checkpoint to {path}: {save_exc}", stacklevel=4)
        return None
    msg = f"the environment raised during step(); checkpoint saved to {path}"
    warnings.warn(msg, stacklevel=4)
    if hasattr(exc, "add_note"):
        exc.add_note(msg)
    return path


def _portable_checkpoint_dir(value: str | None, directory: str) -> str | None:
    """The ``checkpoint_dir`` recorded in ``directory/config.json``: relative to ``directory``
    when it lies inside it (``"."`` for the directory itself), else ``None`` (a saved agent
    does not carry a place outside itself to write to)."""
    if not value:
        return None
    if not rundir.is_inside(directory, value):
        return None
    rel = os.path.relpath(os.path.realpath(value), os.path.realpath(directory))
    return rel.replace(os.sep, "/")


def loaded_checkpoint_dir(value: Any, directory: str) -> str | None:
    """Where an agent loaded from ``directory`` checkpoints, given the ``checkpoint_dir`` its
    ``config.json`` holds: ``None`` stays ``None``; a path is resolved inside ``directory``
    (relative to it), or refused with a ``ValueError`` naming the key and the file when it
    points anywhere else (an absolute path elsewhere, ``../elsewhere``, a symbolic link out).

    >>> loaded_checkpoint_dir(".", "runs/ppo/checkpoint")
    'runs/ppo/checkpoint'
    >>> loaded_checkpoint_dir("/etc", "runs/ppo")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: runs/ppo/config.json: checkpoint_dir '/etc' points outside ...; pass checkpoint_dir= ...
    """
    if value is None:
        return None
    source = os.path.join(directory, "config.json")
    try:
        return rundir.path_inside(directory, value, key="checkpoint_dir", source=source)
    except ValueError as exc:
        raise ValueError(f"{exc}; pass checkpoint_dir= to agents.load to choose where the "
                         "loaded agent checkpoints") from None


def recover_checkpoint(directory: str) -> str | None:
    """Finish or roll back a save of ``directory`` that a crash interrupted, and say which
    version is there now: a sentence for the user (``None`` when no save was interrupted).
    ``train-agent --resume`` calls it before it looks for the checkpoint, so a kill at any step
    of a save resumes from the new checkpoint or the previous one, never from step 0."""
    outcome = atomic.recover(os.fspath(directory), ENTRIES, COMMIT)
    if outcome is None:
        return None
    steps = ""
    try:
        with open(os.path.join(directory, COMMIT)) as f:
            steps = f" (step {int(json.load(f)['num_timesteps'])})"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if outcome == "completed":
        return (f"a save was interrupted once the new checkpoint was complete: resuming the "
                f"new checkpoint{steps}")
    if not os.path.exists(os.path.join(directory, COMMIT)):
        return "the first save was interrupted before it completed: no checkpoint was left"
    return (f"a save was interrupted before the new checkpoint was complete: resuming the "
            f"previous checkpoint{steps}")


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            value = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                         f"{exc.msg}); the file is corrupt or truncated") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text JSON file (it holds binary data)") from None
    except OSError as exc:
        raise ValueError(f"{path} cannot be read: {exc.strerror}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value


def read_metadata(directory: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(meta, config)`` read from an agent directory, after recovering an interrupted save.

    Raises ``ValueError`` naming the directory or file when it is not a saved agent.
    """
    directory = os.fspath(directory)
    if not os.path.exists(directory):
        raise ValueError(f"directory: {directory!r} does not exist")
    if not os.path.isdir(directory):
        raise ValueError(f"directory: {directory!r} is a file, not an agent directory")
    atomic.recover(directory, ENTRIES, COMMIT)
    for name in ("config.json", COMMIT):
        if not os.path.exists(os.path.join(directory, name)):
            raise ValueError(f"directory: {directory!r} does not contain a saved agent "
                             f"(missing {name})")
    meta = _read_json(os.path.join(directory, COMMIT))
    config = _read_json(os.path.join(directory, "config.json"))
    for key in ("algo", "num_timesteps"):
        if key not in meta:
            raise ValueError(f"{os.path.join(directory, COMMIT)} has no {key!r} field; it was "
                             "not written by Agent.save")
    index = os.path.join(directory, "weights", "ckpt.index")
    if not os.path.exists(index):
        raise ValueError(f"directory: {directory!r} has no weights (missing weights/ckpt.index)")
    return meta, config


def check_config_matches(directory: str, algo: str, config: dict,
                         fields: dict[str, set[str]]) -> None:
    """Refuse a ``config.json`` that is another algorithm's config than the ``algo`` its
    ``agent.json`` names (an edited ``agent.json``): the actor-critics' weights have the same
    shapes, so without this check the edit would load silently with the wrong settings.

    ``fields`` maps every algorithm to its config's field names. ``config.json`` holds every
    field of the config it was written from, so it is another algorithm's when it holds a field
    only that one has, or lacks every field that ``algo`` has and another algorithm has not.

    >>> fields = {"ppo": {"lr", "clip_coef"}, "a2c": {"lr"}}
    >>> check_config_matches("runs/a2c", "ppo", {"lr": 1.0}, fields)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: runs/a2c/agent.json says 'ppo' but config.json lacks clip_coef, fields every ...
    """
    own, keys = fields[algo], set(config)
    for other, theirs in fields.items():
        foreign = sorted(keys & (theirs - own))
        distinctive = sorted(own - theirs)
        if foreign:
            found = (f"holds {', '.join(foreign[:4])}, fields of a {other!r} config that {algo} "
                     "does not have")
        elif other != algo and distinctive and not keys & set(distinctive) and theirs <= keys:
            found = (f"lacks {', '.join(distinctive[:4])}, fields every {algo!r} config has, "
                     f"and holds the fields of the {other!r} config")
        else:
            continue
        raise ValueError(f"{os.path.join(directory, COMMIT)} says {algo!r} but config.json "
                         f"{found}: the two files are from different agents (was {COMMIT} "
                         "edited?)")


def check_saved_env(config: dict, directory: str, env: Any = None) -> None:
    """Refuse a gymnasium id with ``':'`` in a saved ``config.json`` when the caller does not
    pass ``env`` themselves: ``gym.make("module:Env")`` imports the module the id names, so a
    file would choose code to run.

    >>> check_saved_env({"env": "CartPole-v1"}, "runs/ppo")
    >>> check_saved_env({"env": "evil:Env-v0"}, "runs/ppo")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: runs/ppo/config.json: env 'evil:Env-v0' names a module to import ('evil'); ...
    """
    saved = config.get("env")
    if env is None and isinstance(saved, str) and ":" in saved:
        raise ValueError(f"{os.path.join(directory, 'config.json')}: env {saved!r} names a module "
                         f"to import ({saved.split(':', 1)[0]!r}); a saved file does not choose "
                         f"code to run: pass env={saved!r} to agents.load if you trust it")


def saved_node(directory: str, node: str) -> bool:
    """Whether the checkpoint in ``directory/weights`` has the top-level node ``node`` (true when
    it cannot be read: :func:`restore_weights` then says why)."""
    try:
        return node in {name.split("/", 1)[0] for name, _ in
                        tf.train.list_variables(os.path.join(directory, "weights", "ckpt"))}
    except (ValueError, tf.errors.OpError):
        return True


def restore_weights(checkpoint: tf.train.Checkpoint, directory: str, described: str) -> None:
    """Restore ``checkpoint`` from ``directory/weights`` and check that it matched exactly.

    Every variable of the agent must be restored and every saved value consumed; otherwise a
    ``ValueError`` names the directory and ``described`` (what the metadata says the agent is).
    """
    path = os.path.join(directory, "weights", "ckpt")
    try:
        status = checkpoint.read(path)
        status.assert_consumed()
    except (ValueError, AssertionError, IndexError, tf.errors.OpError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if len(detail) > 300:
            detail = detail[:300] + "..."
        raise ValueError(f"{path}: the saved weights do not match {described} ({detail}); "
                         "the checkpoint was written by another agent or is corrupt") from None
