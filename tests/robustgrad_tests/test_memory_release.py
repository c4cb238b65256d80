"""robustgrad.memory: freed large blocks leave the process (return_large_blocks) or stay for reuse
(reuse_freed_memory) (issue 38)."""

import ctypes
import os
import platform
import subprocess
import sys

import pytest

from robustgrad.memory import return_large_blocks

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A child process (the setting lasts for the process): free 16 blocks of 4 MiB, each followed by
# a live 256 KiB block so that freed blocks cannot merge into the heap's top and be trimmed, and
# print how much the resident set fell. glibc's threshold has first risen past 4 MiB (a 24 MiB
# block freed), as it does in a process that has freed large tensors.
_CHILD = """
import ctypes, os, sys
from robustgrad.memory import return_large_blocks
page, mib = os.sysconf("SC_PAGE_SIZE"), 2**20
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
if sys.argv[1] == "on":
    assert return_large_blocks(2**20)
big = libc.malloc(24 * mib); libc.memset(big, 1, 24 * mib); libc.free(big)
blocks, pins = [], []
for _ in range(16):
    blocks.append(libc.malloc(4 * mib)); libc.memset(blocks[-1], 1, 4 * mib)
    pins.append(libc.malloc(256 * 1024))
before = rss()
for b in blocks:
    libc.free(b)
print((before - rss()) / mib)
"""


def _glibc() -> bool:
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def _child_outputs(code: str) -> dict:
    """``{mode: stdout}`` of ``code`` run in a fresh interpreter with ``mode`` off and on."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")])}
    return {mode: subprocess.run([sys.executable, "-c", code, mode], capture_output=True,
                                 text=True, check=True, env=env).stdout.strip()
            for mode in ("off", "on")}


@pytest.mark.skipif(not _glibc(), reason="the setting is glibc's")
def test_freed_blocks_are_returned_only_with_the_setting():
    fell = {mode: float(out) for mode, out in _child_outputs(_CHILD).items()}
    assert fell["off"] < 8.0, fell   # glibc keeps them in its heap
    assert fell["on"] >= 60.0, fell  # 64 MiB back to the system


@pytest.mark.skipif(not _glibc(), reason="the setting is glibc's")
def test_takes_effect_on_glibc():
    assert return_large_blocks() is True
    # glibc's initial threshold again (now fixed): later tests allocate as before
    ctypes.CDLL(None).mallopt(-3, 128 * 1024)


@pytest.mark.parametrize("threshold", [0, 4095, 2**25 + 1, 1.5, True, "1"])
def test_threshold_out_of_range_is_refused(threshold):
    with pytest.raises(ValueError, match=r"^threshold must be an int in \[4096, 33554432\] "
                                         r"bytes; got "):
        return_large_blocks(threshold)


# A child process: a thread (as TensorFlow's kernels run in pool threads) allocates, touches and
# frees a 96 MiB block five times; print the page faults of the last four. glibc maps a block
# that large on its own and unmaps it when freed, so each round faults its 24,576 pages in again
# -- unless reuse_freed_memory() was called before the thread started.
_REUSE_CHILD = """
import ctypes, resource, sys, threading
from robustgrad.memory import reuse_freed_memory
if sys.argv[1] == "on":
    assert reuse_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
faults = []
def work():
    for _ in range(5):
        f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        b = libc.malloc(96 * 2**20); libc.memset(b, 1, 96 * 2**20); libc.free(b)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0)
t = threading.Thread(target=work); t.start(); t.join()
print(sum(faults[1:]))
"""


@pytest.mark.skipif(not _glibc(), reason="the setting is glibc's")
def test_freed_blocks_are_reused_only_with_the_setting():
    faults = {mode: int(out) for mode, out in _child_outputs(_REUSE_CHILD).items()}
    pages = 4 * 96 * 2**20 // os.sysconf("SC_PAGE_SIZE")  # four rounds of 96 MiB
    assert faults["off"] >= 0.9 * pages, faults  # mapped and unmapped each round
    assert faults["on"] <= 0.05 * pages, faults  # the same heap memory, faulted in once
