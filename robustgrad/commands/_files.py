"""File helpers shared by the sub-commands."""

from __future__ import annotations

import os
import shutil


def remove_outputs(directory: str, names) -> None:
    """Delete ``directory/name`` for each of ``names`` (files or directory trees) that
    exists, leaving anything else in ``directory`` alone (``--overwrite``)."""
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
