"""Stop long jobs at a safe point on Ctrl-C (SIGINT) or SIGTERM instead of dying mid-step.

A training loop wraps its work in :func:`deferred_interrupts` and polls the returned flag at its
safe points (between updates, after a batch). The first signal only sets the flag and prints one
line; a second signal aborts at once with ``KeyboardInterrupt``. Outside the main thread (where
Python cannot install signal handlers) the flag never fires and signals behave as usual.

>>> with deferred_interrupts() as flag:
...     for step in range(3):
...         if flag.requested:  # a safe point
...             break
>>> flag.requested, flag.signal_name
(False, None)
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import IO

__all__ = ["InterruptFlag", "TrainingInterrupted", "deferred_interrupts"]


class TrainingInterrupted(KeyboardInterrupt):
    """Raised by a training loop that stopped at a safe point after SIGINT/SIGTERM.

    A ``KeyboardInterrupt`` (scripts that catch Ctrl-C keep working), with the checkpoint that was
    written: ``checkpoint`` (a path or None) and ``signal_name`` (``"SIGINT"``/``"SIGTERM"``).
    """

    def __init__(self, message: str, checkpoint: str | None = None,
                 signal_name: str | None = None):
        super().__init__(message)
        self.checkpoint = checkpoint
        self.signal_name = signal_name

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InterruptFlag:
    """Set by the first SIGINT/SIGTERM inside :func:`deferred_interrupts`."""

    def __init__(self):
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        """Whether a stop was requested."""
        return self.signum is not None

    @property
    def signal_name(self) -> str | None:
        """``"SIGINT"`` or ``"SIGTERM"`` once requested, else None."""
        return signal.Signals(self.signum).name if self.signum is not None else None


_FLAG_ATTRIBUTE = "_robustgrad_flag"  # the flag of the handler a deferred_interrupts block installs


@contextlib.contextmanager
def deferred_interrupts(what: str = "training",
                        signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM),
                        stream: IO[str] | None = None) -> Iterator[InterruptFlag]:
    """Defer SIGINT/SIGTERM to the caller's next safe point while the block runs.

    Args:
      what: the job's name for the one-line notice printed on the first signal.
      signals: the signals to defer.
      stream: where the notice goes (default ``sys.stderr``).

    Yields an :class:`InterruptFlag`; the previous handlers are restored on exit. Nested uses share
    the outermost handler (an inner block sees the same request).
    """
    flag = InterruptFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = {s: signal.getsignal(s) for s in signals}
    outer = [f for h in previous.values() if (f := getattr(h, _FLAG_ATTRIBUTE, None)) is not None]
    if outer:  # nested: report the outer block's flag
        yield outer[0]
        return

    def handler(signum, frame):
        if flag.signum is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: aborting now")
        flag.signum = signum
        print(f"robustgrad: {signal.Signals(signum).name} received; stopping {what} at the next "
              "safe point and writing a checkpoint (send it again to abort at once)",
              file=stream or sys.stderr, flush=True)

    setattr(handler, _FLAG_ATTRIBUTE, flag)  # what a nested block finds
    for s in signals:
        signal.signal(s, handler)
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
