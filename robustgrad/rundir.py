"""A run directory: the one place where the rules of "where a run may write" are written down.

Both trainers (``train-classifier``, ``train-agent``) and the loaders use these rules:

* :func:`path_inside`: a path or name read from a file the user supplies (a saved agent's
  ``checkpoint_dir``, an entry of a TensorFlow checkpoint state file) is resolved inside the
  directory that holds the file, or refused with a ``ValueError`` naming the key and the file.
  A loaded file never chooses where the program writes or deletes.
* :func:`check_checkpoint_state`: the ``checkpoint`` state file of a ``tf.train.CheckpointManager``
  names only checkpoints inside its directory (the manager deletes the old ones it lists).
* :func:`check_output_dir`: an output directory is writable (found by creating a probe file:
  ``os.access`` says yes to root on a read-only file system) and holds no earlier run's
  outputs unless they may be overwritten.
* :func:`read_config` / :func:`write_config`: the run's configuration record (``config.json``),
  read back for ``--resume`` with one error per kind of bad file, written atomically;
  :func:`check_resume`: a resumed run keeps its configuration unless ``--override`` names the
  keys it changes, and :func:`record_overrides` keeps the record of those changes.
* :class:`RunLock`: an exclusive lock on an output directory for the life of a run, so a
  second run on the same ``--out`` is refused with one line; a lock left by a dead process is
  detected and taken over.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> path_inside(d, "checkpoint", key="checkpoint_dir", source="config.json") == \\
...     os.path.join(d, "checkpoint")
True
>>> path_inside(d, "../elsewhere", key="checkpoint_dir", source="config.json")
Traceback (most recent call last):
ValueError: config.json: checkpoint_dir '../elsewhere' points outside the directory that ...
>>> with RunLock(d) as lock:          # a second RunLock(d) now raises RunDirectoryLockedError
...     os.path.exists(os.path.join(d, LOCK_FILE))
True
>>> os.path.exists(os.path.join(d, LOCK_FILE))  # released on exit
False
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import tempfile
import time
from typing import Any

__all__ = ["CONFIG", "LOCK_FILE", "RunDirectoryLockedError", "RunLock", "changed_keys",
           "check_checkpoint_state", "check_output_dir", "check_resume", "is_inside",
           "override_keys", "path_inside", "read_config", "record_overrides", "write_config"]

CONFIG = "config.json"
"""The run's configuration record in its directory."""


def is_inside(directory: str, path: str) -> bool:
    """Whether ``path`` is ``directory`` or lies under it, symbolic links resolved.

    >>> is_inside("/tmp/run", "/tmp/run/checkpoint"), is_inside("/tmp/run", "/tmp/other")
    (True, False)
    """
    root = os.path.realpath(directory)
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def path_inside(directory: str, value: object, *, key: str, source: str) -> str:
    """``value`` (read from the file ``source`` under ``key``) as a path inside ``directory``.

    A relative value is taken relative to ``directory``; an absolute one must already lie in
    it. Returns the normalised path (``directory`` joined with ``value``); ``ValueError``
    naming ``key`` and ``source`` when ``value`` is not a string or the path (symbolic links
    resolved) leaves ``directory``.
    """
    if not isinstance(value, str) or not value or "\0" in value:
        raise ValueError(f"{source}: {key} must be a path (a non-empty string), got {value!r}")
    path = os.path.normpath(os.path.join(os.fspath(directory), value))
    if not is_inside(directory, path):
        raise ValueError(f"{source}: {key} {value!r} points outside the directory that holds "
                         "it; a saved file may only name places inside its own directory")
    return path


_STATE_LINE = re.compile(r'^\s*(model_checkpoint_path|all_model_checkpoint_paths)\s*:\s*"(.*)"')


def check_checkpoint_state(directory: str) -> None:
    """Refuse a ``tf.train.CheckpointManager`` state file (``directory/checkpoint``) that names
    a checkpoint outside ``directory``: the manager would read it, and delete it when it
    rotates old checkpoints. ``ValueError`` naming the key and the file; nothing when there is
    no state file.
    """
    state = os.path.join(os.fspath(directory), "checkpoint")
    if not os.path.isfile(state):
        return
    try:
        with open(state, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{state}: cannot be read as a checkpoint state file ({exc})") from None
    for line in lines:
        m = _STATE_LINE.match(line)
        if m:
            value = m.group(2).encode("utf-8").decode("unicode_escape")
            path_inside(directory, value, key=m.group(1), source=state)


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _can_create_in(directory: str) -> bool:
    """Whether a file can be created in ``directory``, found by creating (and removing) one:
    ``os.access`` answers yes to root for a ``chmod 555`` directory -- which root can indeed
    write -- but also for a read-only file system (``/sys``), which nobody can."""
    if not os.access(directory, os.W_OK | os.X_OK):
        return False
    try:
        fd, probe = tempfile.mkstemp(prefix=".robustgrad-write-probe-", dir=directory)
    except OSError:
        return False
    os.close(fd)
    os.remove(probe)
    return True


def check_output_dir(path: str, flag: str = "--out", overwrite: bool = False) -> None:
    """Refuse an output directory the command could not or should not write, before any work.

    Refused: ``path`` exists and is not a directory; it (or, when it does not exist yet, its
    nearest existing parent) is not writable; it is not empty and ``overwrite`` is false.
    Nothing is created: commands create the directory when they write their results.
    ``ValueError`` naming ``flag`` and the path.

    >>> import tempfile
    >>> check_output_dir(os.path.join(tempfile.mkdtemp(), "new"))  # fine: created later
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {path}: exists and is not a directory")
    existing = _nearest_existing(path)
    if not os.path.isdir(existing):
        raise ValueError(f"{flag} {path}: {existing} is a file, not a directory")
    if not _can_create_in(existing):
        where = "" if existing == os.path.abspath(path) else f" ({existing} is not writable)"
        raise ValueError(f"{flag} {path}: not writable{where}")
    if os.path.isdir(path) and not overwrite:
        entries = sorted(n for n in os.listdir(path) if n != LOCK_FILE)
        if entries:
            shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
            raise ValueError(f"{flag} {path}: exists and is not empty ({shown}); pass "
                             "--overwrite to replace its outputs")


def read_config(directory: str) -> dict:
    """The configuration record of the run in ``directory``, for ``--resume``: ``ValueError``
    when there is none, when it is not a JSON object, or when the run's ``checkpoints/`` state
    file names a checkpoint outside it (:func:`check_checkpoint_state`)."""
    path = os.path.join(directory, CONFIG)
    if not os.path.isfile(path):
        raise ValueError(f"--resume: {directory} holds no run (no {CONFIG})")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--resume: {path} is not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"--resume: {path} does not hold a configuration (a JSON object), got "
                         f"{type(config).__name__}")
    try:
        check_checkpoint_state(os.path.join(directory, "checkpoints"))
    except ValueError as exc:
        raise ValueError(f"--resume: {exc}") from None
    return config


def write_config(directory: str, config: dict) -> None:
    """Write ``config`` as the run's record (``directory/config.json``), atomically."""
    path = os.path.join(directory, CONFIG)
    with open(path + ".tmp", "w") as f:
        json.dump(config, f, indent=1)
    os.replace(path + ".tmp", path)


def changed_keys(saved: dict, requested: dict, free: Any = ()) -> dict[str, list]:
    """``{key: [saved, requested]}`` for every key of ``requested`` whose value differs from
    ``saved``'s, except the ``free`` ones. Tuples compare equal to lists (JSON has only lists).

    >>> changed_keys({"epochs": 10, "lr": 0.1}, {"epochs": 12, "lr": 0.1})
    {'epochs': [10, 12]}
    """
    def norm(v):
        return [norm(x) for x in v] if isinstance(v, (list, tuple)) else v

    return {k: [saved.get(k), requested.get(k)] for k in sorted(set(requested) | set(saved))
            if k not in free and k in requested and norm(saved.get(k)) != norm(requested.get(k))}


def override_keys(text: str | None, known: Any) -> set[str]:
    """``"epochs,batch-size"`` -> ``{"epochs", "batch_size"}``: flag names with or without
    ``--``, dashes or underscores, each one of ``known``; ``ValueError`` otherwise."""
    if text is None:
        return set()
    keys = {k.strip().lstrip("-").replace("-", "_") for k in str(text).split(",") if k.strip()}
    unknown = sorted(k for k in keys if k not in known)
    if not keys or unknown:
        raise ValueError(f"--override: expected configuration keys (one of "
                         f"{', '.join(sorted(known))}); got {text!r}")
    return keys


def check_resume(saved: dict, requested: dict, *, override: str | None, where: str,
                 free: Any = (), known: Any = None, names: dict | None = None) -> dict[str, list]:
    """The changes of a resumed run, ``{key: [saved, new]}``, after checking each was allowed
    by ``override``; else ``ValueError`` naming every refused key. ``names`` maps a key to the
    name the user knows it by (``{"learning_rate": "lr"}``) for the message and ``--override``.

    >>> check_resume({"epochs": 10}, {"epochs": 12}, override="epochs", where="runs/x")
    {'epochs': [10, 12]}
    """
    names = dict(names or {})
    alias = {v: k for k, v in names.items()}
    known = set(known if known is not None else (set(saved) | set(requested))) - set(free)
    allowed = {alias.get(k, k) for k in override_keys(override, known | set(alias))}
    changed = changed_keys(saved, requested, free)
    refused = [k for k in changed if k not in allowed]
    if refused:
        detail = ", ".join(f"{names.get(k, k)}: saved {changed[k][0]!r} != {changed[k][1]!r}"
                           for k in refused)
        keys = ",".join(names.get(k, k) for k in refused)
        raise ValueError(f"--resume: the run in {where} has a different configuration "
                         f"({detail}); pass --override {keys} to change it")
    return changed


def record_overrides(config: dict, changed: dict) -> dict:
    """``config`` with ``changed`` appended to its ``overrides`` list (unchanged if empty).

    >>> record_overrides({"epochs": 12}, {"epochs": [10, 12]})
    {'epochs': 12, 'overrides': [{'epochs': [10, 12]}]}
    """
    config = dict(config)
    if changed:
        config["overrides"] = [*config.get("overrides", []), dict(changed)]
    return config


LOCK_FILE = ".robustgrad.lock"
"""The lock file a run keeps in its output directory while it runs (removed at the end)."""


class RunDirectoryLockedError(RuntimeError):
    """Another live process holds the lock of the directory; the message names it."""


def _holder(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def _describe(holder: dict) -> str:
    parts = [f"process {holder.get('pid', '?')}"]
    if holder.get("host") not in (None, socket.gethostname()):
        parts[0] += f" on {holder['host']}"
    if holder.get("command"):
        parts.append(str(holder["command"]))
    if holder.get("started"):
        parts.append(f"started {holder['started']}")
    return ", ".join(parts)


def _try_flock(fd: int) -> bool:
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class RunLock:
    """An exclusive lock on a run's output directory, held from :meth:`acquire` (or ``with``)
    to :meth:`release`: a second run on the same directory is refused with
    :class:`RunDirectoryLockedError`, whose message names the process that holds it.

    The lock is an ``flock`` on ``directory/.robustgrad.lock``, so the operating system drops it
    when its process dies, however it dies; the file, which names the process, then remains.
    The next run takes such a stale lock over and says so (:attr:`took_over`). ``directory``
    is created if missing, and removed again on release when the run left it empty. POSIX only
    (on other platforms the lock does nothing).

    Args:
      directory: the output directory.
      flag: how the user names it, for messages (``"--out"``).
      command: what runs, recorded in the lock file (default: the command line).
    """

    def __init__(self, directory: str, flag: str = "directory", command: str | None = None):
        self.directory = os.fspath(directory)
        self.flag = flag
        self.command = command if command is not None else " ".join(
            [os.path.basename(sys.argv[0] or "python"), *sys.argv[1:]])[:200]
        self.path = os.path.join(self.directory, LOCK_FILE)
        self.took_over: str | None = None
        self._fd: int | None = None
        self._created = False

    def check(self) -> None:
        """Raise :class:`RunDirectoryLockedError` if a live process holds the lock now (nothing is
        created or changed): the early check of a command, before its other checks."""
        if os.name != "posix" or not os.path.isfile(self.path):
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return
        try:
            if not _try_flock(fd):
                raise RunDirectoryLockedError(self._busy_message())
        finally:
            os.close(fd)

    def _busy_message(self) -> str:
        return (f"{self.flag} {self.directory}: in use by another run ({_describe(_holder(self.path))}"
                f"); wait for it to end or choose another {self.flag}")

    def acquire(self) -> RunLock:
        """Take the lock (creating the directory if needed); :class:`RunDirectoryLockedError` if a
        live process holds it. Sets :attr:`took_over` to a sentence when a dead process's lock
        was taken over."""
        if self._fd is not None:
            return self
        if os.path.lexists(self.directory) and not os.path.isdir(self.directory):
            raise ValueError(f"{self.flag} {self.directory}: exists and is not a directory")
        self._created = not os.path.isdir(self.directory)
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"{self.flag} {self.directory}: cannot be created "
                             f"({exc.strerror})") from None
        if os.name != "posix":  # pragma: no cover
            return self
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:  # a read-only directory or file system
                self._remove_if_created()
                raise ValueError(f"{self.flag} {self.directory}: not writable (its lock file "
                                 f"cannot be created: {exc.strerror})") from None
            if not _try_flock(fd):
                os.close(fd)
                self._remove_if_created()
                raise RunDirectoryLockedError(self._busy_message())
            try:  # the file may have been removed (released) between our open and our flock
                here, there = os.fstat(fd), os.stat(self.path)
                if (here.st_ino, here.st_dev) == (there.st_ino, there.st_dev):
                    break
            except OSError:
                pass
            os.close(fd)
        previous = _holder(self.path)
        if previous.get("pid"):
            self.took_over = (f"{self.flag} {self.directory}: took over the lock of "
                              f"{_describe(previous)}, which is no longer running")
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                  "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file and drop the lock (and the directory, if this lock created it
        and the run left nothing in it). Safe to call twice."""
        if self._fd is None:
            self._remove_if_created()
            return
        try:
            os.remove(self.path)
        except OSError:
            pass
        os.close(self._fd)  # drops the flock
        self._fd = None
        self._remove_if_created()

    def _remove_if_created(self) -> None:
        if self._created:
            try:
                os.rmdir(self.directory)  # only if empty
            except OSError:
                pass

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
