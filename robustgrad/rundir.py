"""A run directory: the one place where the rules of "where a run may write" are written down.

Both trainers (``train-classifier``, ``train-agent``) and the loaders use these rules:

* :func:`path_inside`: a path or name read from a file the user supplies (a saved agent's
  ``checkpoint_dir``, an entry of a TensorFlow checkpoint state file) is resolved inside the
  directory that holds the file, or refused with a ``ValueError`` naming the key and the file.
  A loaded file never chooses where the program writes or deletes.
* :func:`check_checkpoint_state`: the ``checkpoint`` state file of a ``tf.train.CheckpointManager``
  names only checkpoints inside its directory (the manager deletes the old ones it lists).
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
import time

__all__ = ["LOCK_FILE", "RunDirectoryLockedError", "RunLock", "check_checkpoint_state",
           "is_inside", "path_inside"]


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
