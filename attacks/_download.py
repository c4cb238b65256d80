"""Fetching a dataset's published files into the local cache, safely.

A file is fetched only when a user asked for a dataset by name and it is not in the cache yet. The
bytes go to a temporary file beside the destination; the size and checksum are verified; only then
is the file renamed into place (``robustgrad.atomic.replacing``). A download that fails half-way, or whose
checksum is wrong, leaves nothing at the destination, so the next call simply retries.

The cache is ``$ROBUSTGRAD_DATA_DIR`` when set, else ``$KERAS_HOME/datasets``, else
``~/.keras/datasets`` (the directory ``keras.datasets`` uses, so files Keras already fetched are
found). ``ROBUSTGRAD_NO_DOWNLOAD=1`` refuses every download (as ``download=False`` does).

>>> f = RemoteFile("mnist.npz", "https://example.org/mnist.npz", "sha256", "00" * 32)
>>> f.path.endswith("mnist.npz")
True
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator

from robustgrad import atomic

__all__ = ["DownloadError", "RemoteFile", "cache_dir", "downloads_allowed", "ensure_file",
           "http_get"]

_CHUNK = 1 << 20
_MB = 1 << 20


class DownloadError(OSError):
    """A file could not be fetched (no network, a server error, a wrong checksum)."""


def cache_dir() -> str:
    """The directory datasets are cached in (see the module docstring for the order)."""
    explicit = os.environ.get("ROBUSTGRAD_DATA_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return os.path.join(base, "datasets")


def downloads_allowed(download: bool) -> bool:
    """``download`` unless the environment variable ``ROBUSTGRAD_NO_DOWNLOAD`` is set (not 0)."""
    flag = os.environ.get("ROBUSTGRAD_NO_DOWNLOAD", "").strip().lower()
    return bool(download) and flag in ("", "0", "false", "no")


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    """One published file: where it goes in the cache, where it comes from, its checksum.

    ``relpath`` is relative to :func:`cache_dir`; ``algorithm`` is ``"md5"`` or ``"sha256"``,
    ``digest`` its hex digest; ``size`` in bytes when known (checked before the checksum).
    """

    relpath: str
    url: str
    algorithm: str
    digest: str
    size: int | None = None

    @property
    def path(self) -> str:
        """The absolute destination in the current cache."""
        return os.path.join(cache_dir(), self.relpath)


def http_get(url: str) -> tuple[int | None, Iterator[bytes]]:
    """``(size or None, chunks)`` of ``url`` over HTTP(S), with a 60 s timeout per read."""
    import urllib.request

    request = urllib.request.Request(url, headers={"User-Agent": "robustgrad"})
    response = urllib.request.urlopen(request, timeout=60)  # noqa: S310 (fixed https/http URLs)
    length = response.headers.get("Content-Length")

    def chunks():
        with response:
            while True:
                block = response.read(_CHUNK)
                if not block:
                    return
                yield block

    return (int(length) if length and length.isdigit() else None), chunks()


Fetcher = Callable[[str], "tuple[int | None, Iterable[bytes]]"]


def ensure_file(remote: RemoteFile, *, what: str, download: bool = True,
                fetch: Fetcher | None = None, progress: bool = True) -> str:
    """The path of ``remote`` in the cache, fetching it first when it is missing.

    Args:
        remote: the file.
        what: how errors name the request (``"--data cifar10"``).
        download: ``False`` refuses to fetch: a missing file is a ``FileNotFoundError`` that says
            which file to put where.
        fetch: ``url -> (size or None, iterable of bytes)``; default :func:`http_get` (tests pass
            a fake one).
        progress: show a progress bar on a terminal.

    Raises:
        FileNotFoundError: the file is missing and downloads are off.
        DownloadError: the fetch failed or the bytes are not the published file; nothing was
            left at the destination.
    """
    dest = remote.path
    if os.path.isfile(dest):
        return dest
    if not downloads_allowed(download):
        raise FileNotFoundError(
            f"{what}: {dest} is missing and downloads are off; download {remote.url} and put "
            f"it at {dest}")
    directory = os.path.dirname(dest)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise DownloadError(f"{what}: cannot create the cache directory {directory} ({exc}); "
                            f"set ROBUSTGRAD_DATA_DIR to a writable directory") from None
    with atomic.replacing(dest) as tmp:
        with open(tmp, "wb") as out:
            size, written, hexdigest = _fetch_into(out, remote, fetch or http_get, what, dest,
                                                   progress)
        expected_size = remote.size or size
        if expected_size is not None and written != expected_size:
            raise DownloadError(
                f"{what}: the download of {remote.url} stopped at {written} of {expected_size} "
                f"bytes; nothing was saved, try again (or put the file at {dest})")
        if hexdigest != remote.digest.lower():
            raise DownloadError(
                f"{what}: {remote.url} has {remote.algorithm} {hexdigest}, expected "
                f"{remote.digest} (a changed file or a proxy's page); nothing was saved; put the "
                f"published file at {dest}")
    return dest


def _fetch_into(out, remote: RemoteFile, fetch: Fetcher, what: str, dest: str,
                progress: bool) -> tuple[int | None, int, str]:
    """Stream ``remote.url`` into the open file ``out``: ``(announced size, bytes, hex digest)``."""
    import http.client

    from robustgrad.progress import Progress

    digest = hashlib.new(remote.algorithm)
    written = 0
    try:
        size, chunks = fetch(remote.url)
        total_mb = -(-int(size or remote.size or 0) // _MB)
        with Progress(total_mb, desc=f"downloading {os.path.basename(dest)}", unit="MB",
                      enabled=progress) as bar:
            for block in chunks:
                out.write(block)
                digest.update(block)
                written += len(block)
                done_mb = -(-written // _MB)  # the last, partial megabyte counts once complete
                bar.update_to(min(done_mb, total_mb) if total_mb else done_mb)
    except (OSError, http.client.HTTPException) as exc:  # URLError, timeouts, resets, cut reads
        reason = getattr(exc, "reason", None) or exc
        raise DownloadError(
            f"{what}: could not download {remote.url} ({reason}); on a machine without network "
            f"access, download that file elsewhere and put it at {dest}") from None
    return size, written, digest.hexdigest()
