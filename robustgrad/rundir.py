"""A run directory: the one object that owns a run's directory for its whole life.

:class:`RunDirectory` is what every run kind (``train-classifier``, ``train-agent``, a Python
script) goes through, as Keras' ``BackupAndRestore`` or Acme's ``Checkpointer`` own a run's
state: it

* locks the directory for the life of the run (:class:`RunLock`: a second run on the same
  directory is refused with one line naming the process that holds it; a lock left by a dead
  process is taken over and said);
* checks it can be written and holds no earlier run that would be overwritten
  (:meth:`RunDirectory.check_writable`);
* keeps the run's configuration record (``config.json``) with its provenance (which settings
  came from defaults, a recipe or the user: ``"resolved"``), read back on resume with one
  error per kind of bad file;
* applies **the one resume rule** of every run kind (:meth:`RunDirectory.resume_changes`): a
  resumed run keeps its configuration; a key whose requested value differs from the saved one
  is refused (:class:`robustgrad.errors.ResumeError`, every differing key named) unless
  ``override`` names it, and the changes let through are recorded in ``config.json``
  (``overrides``: one ``{key: [saved, new]}`` entry per resume, :meth:`RunDirectory.record_resume`);
* knows where its checkpoints live and refuses a checkpoint state file naming files outside
  them (:meth:`RunDirectory.check_checkpoints`);
* defers Ctrl-C and SIGTERM to a safe point (:meth:`RunDirectory.interrupts`);
* writes every record atomically through :mod:`robustgrad.atomic` (:meth:`RunDirectory.write_json`).

The rules are also free functions, used by the loaders: :func:`path_inside` (a path read from a
file the user supplies stays inside that file's directory: a loaded file never chooses where the
program writes or deletes), :func:`check_checkpoint_state`, :func:`check_output_dir`,
:func:`read_config` / :func:`write_config`, :func:`check_resume` / :func:`record_overrides`.

>>> import os, tempfile
>>> run = RunDirectory(os.path.join(tempfile.mkdtemp(), "run"))
>>> with run:                                   # locked until the block ends
...     _ = run.write_config({"epochs": 10, "lr": 0.1})
...     changes = run.resume_changes({"epochs": 12, "lr": 0.1}, override="epochs")
...     run.record_resume({"epochs": 12, "lr": 0.1}, changes)["overrides"]
[{'epochs': [10, 12]}]
>>> run.resume_changes({"epochs": 12, "lr": 0.2}, override="epochs")
Traceback (most recent call last):
robustgrad.errors.ResumeError: --resume: the run in ... (lr: saved 0.1 != 0.2); pass --override lr ...
>>> d = tempfile.mkdtemp()
>>> path_inside(d, "checkpoint", key="checkpoint_dir", source="config.json") == \\
...     os.path.join(d, "checkpoint")
True
>>> path_inside(d, "../elsewhere", key="checkpoint_dir", source="config.json")
Traceback (most recent call last):
ValueError: config.json: checkpoint_dir '../elsewhere' points outside the directory that ...
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

from robustgrad.errors import ConfigError, ResumeError, RunDirectoryError

__all__ = ["CONFIG", "LOCK_FILE", "RunDirectory", "RunDirectoryLockedError", "RunLock",
           "changed_keys", "check_checkpoint_state", "check_output_dir", "check_resume",
           "is_inside", "override_keys", "path_inside", "read_config", "record_overrides",
           "write_config"]

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
    :class:`robustgrad.errors.RunDirectoryError` (a ``ValueError``) naming ``flag`` and the path.

    >>> import tempfile
    >>> check_output_dir(os.path.join(tempfile.mkdtemp(), "new"))  # fine: created later
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise RunDirectoryError(f"{flag} {path}: exists and is not a directory")
    existing = _nearest_existing(path)
    if not os.path.isdir(existing):
        raise RunDirectoryError(f"{flag} {path}: {existing} is a file, not a directory")
    if not _can_create_in(existing):
        where = "" if existing == os.path.abspath(path) else f" ({existing} is not writable)"
        raise RunDirectoryError(f"{flag} {path}: not writable{where}")
    if os.path.isdir(path) and not overwrite:
        entries = sorted(n for n in os.listdir(path) if n != LOCK_FILE)
        if entries:
            shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
            raise RunDirectoryError(f"{flag} {path}: exists and is not empty ({shown}); pass "
                                    "--overwrite to replace its outputs")


SAVEDMODEL_ENTRIES = frozenset({"saved_model.pb", "saved_model.pbtxt", "variables", "assets",
                                "fingerprint.pb", "keras_metadata.pb"})
"""What a TensorFlow SavedModel directory holds: all that ``--export --overwrite`` may delete."""


_FILE_SUFFIXES = (".keras", ".h5", ".hdf5", ".pb", ".tflite", ".onnx", ".zip", ".npz", ".json",
                  ".txt", ".pkl")
"""Extensions of model and data files: an export path ending in one is a file name, not the
SavedModel directory ``--export`` writes."""


def check_export_dir(path: str, flag: str = "--export", overwrite: bool = False) -> None:
    """:func:`check_output_dir` for a SavedModel directory that ``overwrite`` replaces as a
    whole: with ``overwrite`` it must hold a SavedModel and nothing else (or nothing), so that
    ``--export ~/thesis --overwrite`` deletes no file it did not write.

    >>> import tempfile
    >>> d = tempfile.mkdtemp(); open(os.path.join(d, "notes.txt"), "w").close()
    >>> try:
    ...     check_export_dir(d, overwrite=True)
    ... except ValueError as exc:
    ...     print(str(exc).split(": ", 1)[1][:51])
    holds files that are not a SavedModel's (notes.txt)
    """
    suffix = os.path.splitext(os.path.normpath(path))[1].lower()
    if suffix in _FILE_SUFFIXES and not os.path.isdir(path):
        raise RunDirectoryError(f"{flag} {path}: a SavedModel is a directory, and {suffix} names "
                                f"a file (the Keras model is written as model.keras in the run's "
                                f"directory): give a directory name")
    check_output_dir(path, flag, overwrite)
    if overwrite and os.path.isdir(path):
        entries = sorted(n for n in os.listdir(path) if n != LOCK_FILE)
        foreign = [n for n in entries if n not in SAVEDMODEL_ENTRIES]
        if foreign or (entries and "saved_model.pb" not in entries):
            shown = ", ".join((foreign or entries)[:4]) + (", ..." if len(foreign) > 4 else "")
            raise RunDirectoryError(f"{flag} {path}: holds files that are not a SavedModel's "
                                    f"({shown}); --overwrite replaces a SavedModel only: choose "
                                    "another directory")


def read_config(directory: str) -> dict:
    """The configuration record of the run in ``directory``, for ``--resume``:
    :class:`robustgrad.errors.ResumeError` (a ``ValueError``) when there is none, when it is not
    a JSON object, or when the run's ``checkpoints/`` state file names a checkpoint outside it
    (:func:`check_checkpoint_state`)."""
    path = os.path.join(directory, CONFIG)
    if not os.path.isfile(path):
        raise ResumeError(f"--resume: {directory} holds no run (no {CONFIG})")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise ResumeError(f"--resume: {path} is not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ResumeError(f"--resume: {path} does not hold a configuration (a JSON object), got "
                         f"{type(config).__name__}")
    try:
        check_checkpoint_state(os.path.join(directory, "checkpoints"))
    except ValueError as exc:
        raise ResumeError(f"--resume: {exc}") from None
    return config


def write_config(directory: str, config: dict) -> None:
    """Write ``config`` as the run's record (``directory/config.json``), atomically."""
    from robustgrad.atomic import write_json

    write_json(os.path.join(directory, CONFIG), config)


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
    ``--``, dashes or underscores, each one of ``known``; :class:`robustgrad.errors.ConfigError`
    otherwise."""
    if text is None:
        return set()
    keys = {k.strip().lstrip("-").replace("-", "_") for k in str(text).split(",") if k.strip()}
    unknown = sorted(k for k in keys if k not in known)
    if not keys or unknown:
        raise ConfigError(f"--override: expected configuration keys (one of "
                         f"{', '.join(sorted(known))}); got {text!r}")
    return keys


def check_resume(saved: dict, requested: dict, *, override: str | None, where: str,
                 free: Any = (), known: Any = None, names: dict | None = None) -> dict[str, list]:
    """The changes of a resumed run, ``{key: [saved, new]}``, after checking each was allowed
    by ``override``; else :class:`robustgrad.errors.ResumeError` naming every refused key.
    ``names`` maps a key to the name the user knows it by (``{"learning_rate": "lr"}``) for the
    message and ``--override``.

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
        raise ResumeError(f"--resume: the run in {where} has a different configuration "
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


class RunDirectoryLockedError(RunDirectoryError, RuntimeError):
    """Another live process holds the lock of the directory; the message names it (a
    :class:`robustgrad.errors.RunDirectoryError`, and a ``RuntimeError`` as before)."""


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
            raise RunDirectoryError(f"{self.flag} {self.directory}: exists and is not a directory")
        self._created = not os.path.isdir(self.directory)
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            raise RunDirectoryError(f"{self.flag} {self.directory}: cannot be created "
                                    f"({exc.strerror})") from None
        if os.name != "posix":  # pragma: no cover
            return self
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:  # a read-only directory or file system
                self._remove_if_created()
                raise RunDirectoryError(f"{self.flag} {self.directory}: not writable (its lock "
                                        f"file cannot be created: {exc.strerror})") from None
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


class RunDirectory:
    """A run's directory for its whole life: lock, configuration record, resume, checkpoints,
    interrupts, atomic records (see the module docstring).

    ``with run:`` (or :meth:`open` / :meth:`close`) holds the lock; everything else may be used
    before (the checks a command makes before TensorFlow loads) or without it.

    Args:
      path: the directory (created when the lock is taken or a record written).
      flag: how the user names it, for messages (``"--out"``).
      command: what runs, recorded in the lock file (default: the command line).
      checkpoints: the name of the checkpoint directory inside it.

    Example (a resumable loop in a few lines)::

        run = RunDirectory("runs/mine")
        with run, run.interrupts() as stop:
            state = run.read_json("state.json", {"step": 0})
            for step in range(state["step"], 100):
                ...                                   # one step of work
                run.write_json("state.json", {"step": step + 1})
                if stop.requested:
                    break
    """

    def __init__(self, path: str | os.PathLike, *, flag: str = "--out",
                 command: str | None = None, checkpoints: str = "checkpoints"):
        self.path = os.fspath(path)
        self.flag = flag
        self.checkpoints = checkpoints
        self.lock = RunLock(self.path, flag, command=command)

    def __repr__(self) -> str:
        return f"RunDirectory({self.path!r})"

    # ---- lifecycle
    def check_lock(self) -> None:
        """:class:`RunDirectoryLockedError` if a live process holds the directory now."""
        self.lock.check()

    def open(self) -> RunDirectory:
        """Take the lock (creating the directory); :class:`RunDirectoryLockedError` if another
        live run holds it."""
        self.lock.acquire()
        return self

    def close(self) -> None:
        """Release the lock (safe to call twice)."""
        self.lock.release()

    def __enter__(self) -> RunDirectory:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def took_over(self) -> str | None:
        """A sentence when the lock of a dead process was taken over, else None."""
        return self.lock.took_over

    def interrupts(self, what: str = "training"):
        """:func:`robustgrad.interrupts.deferred_interrupts`: a context whose flag says when
        Ctrl-C or SIGTERM asked the run to stop at its next safe point."""
        from robustgrad.interrupts import deferred_interrupts

        return deferred_interrupts(what)

    # ---- files
    def join(self, *names: str) -> str:
        """``path/name/...``."""
        return os.path.join(self.path, *names)

    def holds(self, names: Any) -> list[str]:
        """The ones of ``names`` that exist in the directory."""
        return [n for n in names if os.path.lexists(self.join(n))]

    def check_writable(self, overwrite: bool = False) -> None:
        """:func:`check_output_dir` of this directory (:class:`RunDirectoryError`)."""
        check_output_dir(self.path, self.flag, overwrite)

    def remove(self, names: Any) -> None:
        """Delete the entries ``names`` (files or trees) that exist, leaving the rest alone."""
        import shutil

        for name in names:
            path = self.join(name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)

    def write_json(self, name: str, value: Any, indent: int | None = 1) -> str:
        """Write ``value`` as ``name`` atomically (:func:`robustgrad.atomic.write_json`); returns
        the path. A kill at any moment leaves the previous file whole."""
        from robustgrad.atomic import write_json

        os.makedirs(os.path.dirname(self.join(name)) or ".", exist_ok=True)
        return write_json(self.join(name), value, indent=indent)

    def read_json(self, name: str, default: Any = None) -> Any:
        """The JSON value of ``name``, or ``default`` when it is missing or unreadable."""
        try:
            with open(self.join(name), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return default

    # ---- the configuration record and the one resume rule
    def has_config(self) -> bool:
        """Whether the directory holds a run's configuration record."""
        return os.path.isfile(self.join(CONFIG))

    def read_config(self) -> dict:
        """The saved configuration record (:func:`read_config`: :class:`ResumeError` when there
        is none or it is unreadable, or the checkpoint state file points outside)."""
        return read_config(self.path)

    def write_config(self, config: dict, provenance: dict | None = None) -> dict:
        """Write the run's configuration record atomically; ``provenance`` (where each setting
        came from: ``{"values": ..., "origin": ...}``) is kept under ``"resolved"``. Returns the
        record written."""
        record = dict(config) if provenance is None else {**config, "resolved": provenance}
        os.makedirs(self.path, exist_ok=True)
        write_config(self.path, record)
        return record

    def resume_changes(self, requested: dict, *, override: str | None,
                       saved: dict | None = None, free: Any = (), known: Any = None,
                       names: dict | None = None, where: str | None = None) -> dict[str, list]:
        """The one resume rule: the changes ``{key: [saved, requested]}`` of a resumed run,
        each allowed by ``override`` (``"KEY[,KEY]"``), else :class:`ResumeError` naming every
        refused key. ``saved`` defaults to the record in the directory; ``free`` keys may change
        freely (how the run uses the machine, where it reports); ``names`` maps a key to the name
        the user knows it by (``{"learning_rate": "lr"}``); ``where`` names the run in messages
        (default: the directory)."""
        saved = self.read_config() if saved is None else saved
        return check_resume(dict(saved), dict(requested), override=override,
                            where=where or self.path, free=free, known=known, names=names)

    def record_resume(self, config: dict, changed: dict) -> dict:
        """Write ``config`` as the record with the ``changed`` keys appended to its
        ``overrides`` list (nothing is written when nothing changed); returns the record."""
        record = record_overrides(config, changed)
        if changed:
            self.write_config(record)
        return record

    # ---- checkpoints
    @property
    def checkpoint_dir(self) -> str:
        """Where the run's checkpoints live (``path/checkpoints`` by default)."""
        return self.join(self.checkpoints)

    def check_checkpoints(self) -> None:
        """:func:`check_checkpoint_state` of :attr:`checkpoint_dir` (``ValueError`` when its
        state file names a checkpoint outside it)."""
        check_checkpoint_state(self.checkpoint_dir)
