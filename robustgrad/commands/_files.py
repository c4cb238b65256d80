"""File checks and helpers shared by the sub-commands: output directories checked before the
work starts, Keras models loaded with one clear error per kind of bad file.

Every problem is a :class:`robustgrad.cli.UsageError` naming the flag, the path and what is wrong,
raised before any long work (``robustgrad: error: ...``, exit status 2).

Example:
  >>> import tempfile, os
  >>> d = tempfile.mkdtemp()
  >>> open(os.path.join(d, "report.json"), "w").close()
  >>> check_output_dir(d, "--out")  # doctest: +ELLIPSIS
  Traceback (most recent call last):
  ...
  robustgrad.cli.UsageError: --out ...: exists and is not empty (report.json); pass --overwrite ...
  >>> check_output_dir(os.path.join(d, "new"), "--out")   # fine: created when the results exist
"""

from __future__ import annotations

import contextlib
import os
import shutil
import zipfile
from collections.abc import Iterable, Iterator

from robustgrad.cli import UsageError

__all__ = ["check_clip_flags", "check_model_file", "check_output_dir", "load_keras_model",
           "remove_outputs", "removed_if_empty_on_error"]


def remove_outputs(directory: str, names: Iterable[str]) -> None:
    """Delete ``directory/name`` for each of ``names`` (files or directory trees) that
    exists, leaving anything else in ``directory`` alone (``--overwrite``)."""
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)


def check_output_dir(path: str, flag: str = "--out", overwrite: bool = False) -> None:
    """:func:`robustgrad.rundir.check_output_dir`, its ``ValueError`` a :class:`UsageError`:
    an output directory that exists as a file, is not writable, or is not empty without
    ``overwrite`` is refused before any work."""
    from robustgrad import rundir

    try:
        rundir.check_output_dir(path, flag, overwrite)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@contextlib.contextmanager
def removed_if_empty_on_error(path: str) -> Iterator[None]:
    """If the block fails, remove ``path`` when the block created it and left it empty, so that
    a failed command leaves no empty output directory behind."""
    existed = os.path.exists(path)
    try:
        yield
    except BaseException:
        if not existed and os.path.isdir(path) and not os.listdir(path):
            os.rmdir(path)
        raise


def check_clip_flags(clip_min: float | None, clip_max: float | None) -> None:
    """``--clip-min`` below ``--clip-max`` when both are given, each finite; ``UsageError``
    otherwise (NaN was refused only after the model and data loaded, as ``clip_min``)."""
    import math

    for flag, value in (("--clip-min", clip_min), ("--clip-max", clip_max)):
        if value is not None and not math.isfinite(value):
            raise UsageError(f"{flag} must be a finite number, got {value}")
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        raise UsageError(f"--clip-min must be below --clip-max, got {clip_min} and {clip_max}")


def check_model_file(path: str, flag: str = "--model") -> None:
    """The checks of :func:`load_keras_model` that need no Keras: the file exists, is a file, and
    a ``.keras`` file is a complete zip archive."""
    if not os.path.exists(path):
        raise UsageError(f"{flag} {path}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a directory, expected a .keras file (a SavedModel "
                         "directory cannot be loaded as a Keras model)")
    if not path.endswith((".keras", ".h5", ".hdf5")):
        raise UsageError(f"{flag} {path}: expected a .keras file (or a legacy .h5 file)")
    if path.endswith(".keras") and not zipfile.is_zipfile(path):
        raise UsageError(f"{flag} {path}: not a valid .keras file (not a zip archive, or "
                         "truncated)")


def _refused_object(message: str) -> str | None:
    """Keras's refusal of a Lambda layer (safe mode) or of an unregistered custom object, said
    in full and in our words (Keras's text runs to kilobytes of config and was cut off)."""
    import re

    if "safe_mode" in message and "Lambda" in message:
        return ("holds a Lambda layer (Python code inside the file), which Keras refuses to load "
                "by default because loading it could run arbitrary code; rebuild the model "
                "without Lambda layers (a custom layer class instead), or, if you trust the "
                "file, load it from Python with keras.models.load_model(path, safe_mode=False)")
    if "safe_mode" in message:
        return ("holds Python code that Keras refuses to load by default (safe mode: loading "
                "it could run arbitrary code); if you trust the file, load it from Python with "
                "keras.models.load_model(path, safe_mode=False)")
    m = re.search(r"Could not locate (class|function) '([^']+)'", message)
    if m:
        return (f"uses a custom {m.group(1)} {m.group(2)!r} that is not registered in this "
                "process, so Keras cannot rebuild it; the command line loads built-in Keras "
                "layers only: load the model from Python after importing the module that "
                "defines it (decorated with @keras.saving.register_keras_serializable())")
    return None


def load_keras_model(path: str, flag: str = "--model"):
    """``keras.models.load_model(path, compile=False)`` with one-line errors naming ``flag`` and
    the file: missing, a directory, not a zip archive, truncated or otherwise not loadable."""
    check_model_file(path, flag)
    import keras

    try:
        return keras.models.load_model(path, compile=False)
    except Exception as exc:  # noqa: BLE001 - whatever the reason, the file is what is wrong
        refused = _refused_object(str(exc))
        if refused:
            raise UsageError(f"{flag} {path}: {refused}") from exc
        detail = " ".join(str(exc).split())
        if len(detail) > 200:
            detail = detail[:200] + "..."
        raise UsageError(f"{flag} {path}: cannot be loaded as a Keras model "
                         f"({type(exc).__name__}: {detail})") from exc
