"""Absurd allocations refused before they are made.

A configuration that asks for more memory than the machine has (a DQN replay buffer of image
observations in float32, say) would otherwise be killed by the operating system after minutes of
swapping, or fail deep inside TensorFlow. :func:`check_allocation` compares what is about to be
allocated with the machine's physical memory (or the container's limit, when lower) and refuses,
naming the argument and the largest value that fits, before anything is allocated. Only the
standard library is imported.

:func:`return_large_blocks` is the other side: memory already freed. TensorFlow's CPU tensors
come from the C library's ``malloc``; glibc keeps freed blocks below its (self-raising, up to
32 MiB) mmap threshold in its heaps for reuse, where they fragment, so a process that allocates
and frees activation maps for minutes holds far more resident memory than it has tensors alive.
With a fixed threshold every block at least that large is its own mapping, returned to the
system when freed (issue 38: a WRN-28-10 PGD step at batch 128 held ~400 MiB less).
:func:`reuse_freed_memory` is the opposite trade: every freed block stays in one heap for the
next allocation, so a step that allocates the same large maps every time stops paying the kernel
for fresh zeroed pages (page faults, system time) once its heap has grown. Opt-in and not called
by the library: on a WRN-28-10 PGD-1 step at batch 128 it removed 96% of the faults and 7.8 s of
system time but the step took 11.5% more CPU and peaked 26% higher (one pair,
docs/benchmarks/training.md, "Freed memory kept for reuse").

>>> check_allocation(1_000, 8 * 1024, argument="buffer_size", what="a replay buffer",
...                  total=2**30)  # 8 MiB of 1 GiB: fine
>>> check_allocation(10**6, 2 * 84 * 84 * 4 * 4, argument="buffer_size",
...                  what="a replay buffer", total=16 * 2**30)  # doctest: +ELLIPSIS
Traceback (most recent call last):
ValueError: buffer_size=1000000: a replay buffer would allocate 210.3 GiB, more than half of ...
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

__all__ = ["check_allocation", "physical_memory", "return_large_blocks", "reuse_freed_memory"]

_M_TRIM_THRESHOLD = -1  # glibc malloc.h
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_MAX_MMAP_THRESHOLD = 32 * 2**20  # glibc: HEAP_MAX_SIZE / 2 on 64-bit

_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def physical_memory() -> int | None:
    """Bytes of memory this process may use: the physical memory, or the cgroup (container)
    limit when it is lower; ``None`` when neither can be read.

    >>> physical_memory() is None or physical_memory() > 0
    True
    """
    sizes = []
    try:
        sizes.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        pass
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < 2**62:  # "max", or v1's "unlimited" 2**63 - 4096
            sizes.append(int(text))
    return min(sizes) if sizes else None


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def check_allocation(count: int, bytes_each: int, *, argument: str, what: str,
                     fraction: float = 0.5, total: int | None = None) -> None:
    """Refuse to allocate ``count`` items of ``bytes_each`` bytes when that exceeds ``fraction``
    of ``total`` (default :func:`physical_memory`): a ``ValueError`` naming ``argument``, the
    size, the machine's memory and the largest ``count`` that fits. Nothing happens when the
    memory cannot be read.

    Args:
      count: how many items (transitions, examples); an int >= 0.
      bytes_each: bytes per item; an int >= 0.
      argument: the name the user set ``count`` with (``"buffer_size"``).
      what: the allocation, for the message (``"a replay buffer of ... observations"``).
      fraction: the share of memory one allocation may take, in (0, 1].
      total: the memory in bytes (for tests); ``None`` reads it.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    total = physical_memory() if total is None else int(total)
    nbytes = int(count) * int(bytes_each)
    if total is None or nbytes <= fraction * total:
        return
    share = "half" if fraction == 0.5 else f"{fraction:.0%}"
    fits = int(fraction * total) // max(int(bytes_each), 1)
    raise ValueError(f"{argument}={count}: {what} would allocate {_gib(nbytes)}, more than "
                     f"{share} of this machine's memory ({_gib(total)}); {argument} must be at "
                     f"most {fits} here")


def return_large_blocks(threshold: int = 2**20) -> bool:
    """Make the C library return every freed block of at least ``threshold`` bytes to the
    system at once (glibc's ``mallopt(M_MMAP_THRESHOLD, threshold)``, which also stops the
    threshold from rising by itself). For the rest of the process, large tensors (activation
    maps) cost a fresh mapping each, and the resident set follows the memory actually in use
    instead of the largest heap it ever needed. Nothing happens off glibc (returns False).

    Args:
      threshold: bytes, an int in [4096, 32 MiB]; the default 1 MiB puts every activation
        map of a convolutional network at CIFAR scale in its own mapping.

    Returns:
      True when the C library took the setting.

    >>> return_large_blocks(2**20) in (True, False)
    True
    >>> return_large_blocks(2**40)
    Traceback (most recent call last):
    ValueError: threshold must be an int in [4096, 33554432] bytes; got 1099511627776
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int) or \
            not 4096 <= threshold <= _MAX_MMAP_THRESHOLD:
        raise ValueError(f"threshold must be an int in [4096, {_MAX_MMAP_THRESHOLD}] bytes; "
                         f"got {threshold!r}")
    mallopt = _mallopt()
    return mallopt is not None and mallopt(_M_MMAP_THRESHOLD, threshold) == 1


def _mallopt() -> Any:
    """glibc's ``mallopt``, or None off glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def reuse_freed_memory() -> bool:
    """Make the C library keep every freed block for reuse: one heap for every thread
    (``M_ARENA_MAX`` 1), no block in its own mapping (``M_MMAP_MAX`` 0), no heap returned to the
    system (``M_TRIM_THRESHOLD`` at its largest). glibc otherwise maps each block above 32 MiB
    on its own and unmaps it when freed, and a thread's own heap cannot hold a block above
    64 MiB, so a step that allocates the same large tensors every time (WRN-28-10's activation
    maps at batch 128: 42-84 MB) faults every page of them in again, zeroed by the kernel,
    every step. With this, once the heap has grown to the step's need, later steps reuse it.

    The cost: the resident set stays at the largest heap the process ever needed (the peak is
    not lowered by returning memory between steps; the heap fragments), and threads share one
    heap's lock. Measure before use: in the one probe so far the step's CPU time rose (see the
    module's docstring).

    Call it **before TensorFlow is imported**: a thread keeps the heap it first allocated from,
    so threads already running (TensorFlow's thread pools) are not moved. For the rest of the
    process; nothing happens off glibc (returns False).

    Returns:
      True when the C library took all three settings.

    >>> import subprocess, sys
    >>> code = "from robustgrad.memory import reuse_freed_memory as r; print(r())"
    >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
    ...                check=True).stdout.strip() in ("True", "False")
    True
    """
    mallopt = _mallopt()
    if mallopt is None:
        return False
    took = [mallopt(_M_ARENA_MAX, 1), mallopt(_M_MMAP_MAX, 0),
            mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)]
    return all(t == 1 for t in took)
