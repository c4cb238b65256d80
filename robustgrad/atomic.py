"""Replace a set of files in a directory so that a kill at any moment loses nothing.

A saved object (an agent, a checkpoint) is a few named entries in a directory that may also hold
other things (logs, plots). :func:`write_entries` writes the new version in a staging directory
inside the target, then switches entry by entry with ``os.replace``, keeping the previous
version in ``.previous/`` until the new one is complete. The *commit entry* (the metadata file a
loader reads first) leaves first and arrives last, so its presence at the top level means the
top-level version is complete. :func:`recover` (called by every loader and by the next write)
finishes or rolls back an interrupted switch and removes staging leftovers:

* no commit entry at the top but a ``.previous/``: the switch was interrupted; the previous
  version is moved back (rolled back), whatever part of the new one had arrived is removed;
* a commit entry at the top and a ``.previous/``: the new version is complete; ``.previous/``
  is deleted.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> def writer(stage):
...     open(os.path.join(stage, "data.txt"), "w").write("v1")
...     open(os.path.join(stage, "meta.json"), "w").write("{}")
>>> write_entries(d, ["data.txt", "meta.json"], writer, commit="meta.json")
>>> sorted(os.listdir(d))
['data.txt', 'meta.json']
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["PREVIOUS", "recover", "replacing", "save_figure", "write_entries", "write_json"]

PREVIOUS = ".previous"
_STAGING_PREFIX = ".incoming-"
_MANIFEST = ".manifest.json"


def _fault_point(stage: str) -> None:
    """No-op hook between the steps of a switch; fault-injection tests replace it to kill there."""


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _read_manifest(path: str, entries: Sequence[str]) -> list[str]:
    """The entries a manifest lists, only among ``entries``: a name read from the file never
    chooses what is moved or deleted (``../x`` or an unknown name is ignored)."""
    try:
        with open(path) as f:
            listed = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot be read as the manifest of an interrupted save "
                         f"({exc})") from None
    if not isinstance(listed, list):
        raise ValueError(f"{path}: expected a JSON list of entry names, got "
                         f"{type(listed).__name__}")
    return [name for name in entries if name in listed]


def recover(directory: str, entries: Sequence[str], commit: str) -> str | None:
    """Finish or roll back an interrupted :func:`write_entries` in ``directory``.

    Returns what the directory now holds after an interrupted write: ``"completed"`` (the new
    version, whose switch had finished), ``"rolled back"`` (the previous version, moved back),
    ``"discarded"`` (the previous version, which had not moved yet: the unfinished new one was
    removed), or None (no interrupted write). Staging directories left by a killed writer are
    removed.
    """
    if not os.path.isdir(directory):
        return None
    staged = False
    for name in os.listdir(directory):
        if name.startswith(_STAGING_PREFIX):  # an unfinished version (empty: all had moved)
            path = os.path.join(directory, name)
            staged = staged or not os.path.isdir(path) or bool(os.listdir(path))
            _remove(path)
    prev = os.path.join(directory, PREVIOUS)
    if os.path.islink(prev):  # never ours: write_entries makes a real directory
        raise ValueError(f"{prev} is a symbolic link; refusing to move or delete what it points "
                         "to (remove it, it is not part of a saved version)")
    if not os.path.isdir(prev):
        return "discarded" if staged else None
    if not os.path.exists(os.path.join(prev, _MANIFEST)):
        _remove(prev)  # nothing had left the top level yet: the previous version is intact
        return "discarded"
    old = _read_manifest(os.path.join(prev, _MANIFEST), entries)
    if os.path.exists(os.path.join(directory, commit)):
        # the commit entry leaves first and arrives last: if the old one had left, the one at
        # the top is the new version, complete; if it had not, nothing had moved yet
        arrived = commit not in old or os.path.lexists(os.path.join(prev, commit))
        _remove(prev)
        return "completed" if arrived else "discarded"
    # roll back: the top level holds at most part of the new version. Every step can be
    # repeated, so a kill during the roll-back is rolled back again by the next call.
    for name in entries:
        if name not in old:
            _remove(os.path.join(directory, name))
    for name in sorted(old, key=lambda n: n == commit):  # the commit entry goes back last
        src = os.path.join(prev, name)
        if os.path.lexists(src):
            _remove(os.path.join(directory, name))
            os.replace(src, os.path.join(directory, name))
            _fault_point(f"restored {name}")
    _remove(prev)
    _fsync_dir(directory)
    return "rolled back"


def write_entries(directory: str, entries: Sequence[str], writer: Callable[[str], None],
                  commit: str) -> None:
    """Write ``entries`` of ``directory`` anew with ``writer(staging_dir)``, crash-safely.

    Args:
      directory: the target (created if missing); other files in it are left alone.
      entries: every name this object owns in ``directory`` (files or directories); names the
        writer does not produce are removed from the new version.
      writer: writes the new version's entries into the staging directory it is given.
      commit: the entry whose presence marks a complete version (written by ``writer``).
    """
    if commit not in entries:
        raise ValueError(f"commit must be one of entries {list(entries)}, got {commit!r}")
    os.makedirs(directory, exist_ok=True)
    recover(directory, entries, commit)
    stage = os.path.join(directory, f"{_STAGING_PREFIX}{uuid.uuid4().hex[:8]}")
    os.makedirs(stage)
    try:
        writer(stage)
        if not os.path.exists(os.path.join(stage, commit)):
            raise RuntimeError(f"writer did not write the commit entry {commit!r}")
        _fault_point("staged")
        prev = os.path.join(directory, PREVIOUS)
        os.makedirs(prev, exist_ok=True)
        old = [n for n in entries if os.path.lexists(os.path.join(directory, n))]
        with open(os.path.join(prev, _MANIFEST + ".tmp"), "w") as f:
            json.dump(old, f)
        os.replace(os.path.join(prev, _MANIFEST + ".tmp"), os.path.join(prev, _MANIFEST))
        _fault_point("manifest")
        for name in sorted(old, key=lambda n: n != commit):  # the commit entry leaves first
            os.replace(os.path.join(directory, name), os.path.join(prev, name))
            _fault_point(f"moved out {name}")
        new = [n for n in entries if os.path.lexists(os.path.join(stage, n))]
        for name in sorted(new, key=lambda n: n == commit):  # ... and arrives last
            os.replace(os.path.join(stage, name), os.path.join(directory, name))
            _fault_point(f"moved in {name}")
        _fsync_dir(directory)
        _remove(prev)
        _fault_point("done")
    finally:
        _remove(stage)


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[str]:
    """Write one file crash-safely: the block writes the temporary path it is given (same
    directory, same extension, so format-by-extension writers such as ``savefig`` work), which
    replaces ``path`` only when the block succeeds. A failure (a full disk) leaves ``path`` as
    it was and no partial file behind. The extension is everything from the name's first dot
    (``best.weights.h5`` -> ``.best.partial-XXXX.weights.h5``: Keras wants ``.weights.h5``).

    >>> import tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), "report.json")
    >>> with replacing(target) as tmp:
    ...     _ = open(tmp, "w").write("{}")
    >>> open(target).read()
    '{}'
    """
    path = os.fspath(path)
    head, tail = os.path.split(path)
    cut = tail.find(".", 1)
    stem, ext = (tail[:cut], tail[cut:]) if cut > 0 else (tail, "")
    tmp = os.path.join(head, f".{stem}.partial-{uuid.uuid4().hex[:8]}{ext}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)


def write_json(path: str | os.PathLike, value: Any, indent: int | None = 1) -> str:
    """Write ``value`` as JSON to ``path`` crash-safely (:func:`replacing`): a kill or a full
    disk leaves the previous file whole, never half a file; returns ``path``.

    >>> import tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), "history.json")
    >>> _ = write_json(target, {"epochs": 3})
    >>> json.load(open(target))
    {'epochs': 3}
    """
    with replacing(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(value, f, indent=indent)
    return os.fspath(path)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive ``Agg`` backend (figures are only saved),
    imported on first use: matplotlib is an optional dependency, needed only by the plots.

    >>> plt = pyplot()
    >>> plt.get_backend().lower()
    'agg'
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 100) -> str | os.PathLike:
    """Save a matplotlib figure to ``path`` crash-safely (:func:`replacing`: a full disk leaves
    no truncated image) and close it, also when saving fails; returns ``path``.

    The format follows the extension (``.png``, ``.pdf``, ``.svg``).

    >>> import tempfile
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> fig, ax = plt.subplots()
    >>> _ = ax.plot([0, 1], [1, 0])
    >>> target = os.path.join(tempfile.mkdtemp(), "curve.png")
    >>> save_figure(fig, target) == target, open(target, "rb").read(4)
    (True, b'\\x89PNG')
    >>> plt.fignum_exists(fig.number)
    False
    """
    import matplotlib.pyplot as plt

    try:
        with replacing(path) as tmp:
            fig.savefig(tmp, dpi=dpi)
    finally:
        plt.close(fig)
    return path
