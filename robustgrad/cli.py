"""The ``robustgrad`` command line.

The outermost layer: each sub-command lives in its own module under :mod:`robustgrad.commands`
and is imported only when it runs, so ``robustgrad --help`` and ``robustgrad CMD --help`` import
no TensorFlow. A command module exposes

* ``HELP``: one line;
* ``add_arguments(parser)``: its flags (no TensorFlow, no ``attacks``/``agents`` at import);
* ``validate(args)`` (optional): the checks that need no TensorFlow, run before it loads;
* ``run(args) -> int``: the work, importing TensorFlow, ``attacks`` and ``agents`` inside.

Errors: a :class:`robustgrad.errors.ConfigError` raised by a command or the library under it (a
:class:`UsageError` is one) is the user's mistake -- a bad flag value, a setting out of range, a
missing or unreadable file, an output directory that would be overwritten, a resumed run whose
configuration changed -- and prints one line ``robustgrad: error: ...`` with exit status 2,
without a traceback (``ROBUSTGRAD_DEBUG=1`` shows it). Any other exception, a plain
``ValueError`` among them, is an internal error and keeps its traceback. Ctrl-C or SIGTERM, at any
moment after the checks (loading, tracing, the work), ends with status 130 and one line saying what
``--out`` holds and how to go on, even when a library's clean-up raised its own error over the
interrupt; a training command stopped at a safe point
(:class:`robustgrad.interrupts.TrainingInterrupted`) also prints the checkpoint it wrote and the
command that resumes it.

TensorFlow's native start-up lines are hidden unless ``-v``/``--verbose`` is given (see
:mod:`robustgrad.commands._startup`).

Example::

    $ robustgrad --version
    $ robustgrad demo --out runs/demo
    $ robustgrad -v evaluate --model runs/demo/attacks/digits_cnn.keras   # with TF's log lines
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import importlib
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator

from robustgrad.errors import ConfigError

__all__ = ["COMMANDS", "UsageError", "build_parser", "is_user_error", "main", "user_errors"]

# sub-command name -> (module under robustgrad.commands, one-line help)
COMMANDS = {
    "demo": ("demo", "run the main job on the embedded defaults (digits, CartPole)"),
    "train-classifier": ("train_classifier", "adversarially train a classifier"),
    "evaluate": ("evaluate", "evaluate a classifier's robustness under attacks"),
    "certify": ("certify", "certified accuracy of a classifier (CROWN, IBP, smoothing)"),
    "sensitivity": ("sensitivity", "input-gradient sensitivity analysis of a classifier"),
    "train-agent": ("train_agent", "train an RL agent on a gymnasium environment"),
    "evaluate-agent": ("evaluate_agent", "evaluate an RL agent, clean and under observation attacks"),
}

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(ConfigError):
    """A mistake in what the user asked for on the command line (flag values, files, output
    directories): the commands' :class:`robustgrad.errors.ConfigError`.

    ``robustgrad`` prints it as one line ``robustgrad: error: <message>`` and exits with status 2,
    without a traceback. Commands raise it, or convert errors with :func:`user_errors`.
    """


@contextlib.contextmanager
def user_errors(*types: type[BaseException], prefix: str = "") -> Iterator[None]:
    """Re-raise exceptions of ``types`` (default: ``ValueError``, ``TypeError``, ``OSError``)
    from the block as :class:`UsageError`, with ``prefix`` before their message.

    Wrap only steps whose errors are the user's (validating flags, loading the user's files),
    never the work itself, so that internal errors keep their tracebacks.

    Example:
      >>> try:
      ...     with user_errors(ValueError, prefix="--eps: "):
      ...         float("abc")
      ... except UsageError as exc:
      ...     print(exc)
      --eps: could not convert string to float: 'abc'
    """
    caught = types or (ValueError, TypeError, OSError)
    try:
        yield
    except UsageError:
        raise  # already the command's own words
    except caught as exc:
        raise UsageError(f"{prefix}{exc}") from exc


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line ``robustgrad: error: ...`` of every other user error."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"robustgrad: error: {message} (see '{self.prog} --help')\n")


def _load(module: str):
    return importlib.import_module(f"robustgrad.commands.{module}")


MAX_THREADS = 1024
"""The largest ``--threads``: above the hardware threads of any current machine (two 192-core
CPUs with SMT have 768), the same on every machine so that a script runs anywhere, and cheap:
1,024 intra- and inter-op threads start in seconds and ~160 MB on a 2-core machine, where
100,000 grew by ~45 MB/s without printing anything."""


def _thread_count(text: str) -> int:
    """``--threads``: an integer in [1, :data:`MAX_THREADS`] (argparse turns the error into a
    usage error, before TensorFlow loads)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_THREADS} (TensorFlow starts that "
                                         f"many threads per pool), got {value}")
    return value


def set_threads(threads: int) -> None:
    """Give TensorFlow ``threads`` intra-op and inter-op threads (``robustgrad --threads``).

    XLA's CPU pool follows the intra-op count. TensorFlow refuses the change once its runtime
    has started in this process: that is a :class:`UsageError`, never a silent no-op.
    """
    import tensorflow as tf

    threading = tf.config.threading
    if (threading.get_intra_op_parallelism_threads() == threads
            and threading.get_inter_op_parallelism_threads() == threads):
        return
    try:
        threading.set_intra_op_parallelism_threads(threads)
        threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        raise UsageError("--threads: TensorFlow is already running in this process; its thread "
                         "counts can no longer change (pass --threads to a fresh process)"
                         ) from None


def build_parser(load_commands: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; only the command named ``load_commands`` is imported."""
    from robustgrad import __version__  # the package this module is in: already imported

    parser = _Parser(
        prog="robustgrad",
        description="Gradients as a first-class, controllable thing on TensorFlow 2.",
    )
    parser.add_argument("--version", action="version", version=f"robustgrad {__version__}")
    parser.add_argument("-v", "--verbose", dest="show_native_log", action="store_true",
                        help="show TensorFlow's start-up log lines (hidden by default)")
    parser.add_argument("--threads", type=_thread_count, default=None, metavar="N",
                        help="TensorFlow's intra- and inter-op threads (default: TensorFlow's, "
                             "one per core). Small networks (the RL agents' MLPs) run faster "
                             "per CPU second with 1: the thread pool costs more than it saves")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == load_commands:
            mod = _load(module)
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run, _validate=getattr(mod, "validate", None),
                           _output_dir=getattr(mod, "output_dir", None))
    return parser


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's mistake: a :class:`robustgrad.errors.ConfigError` (a
    :class:`UsageError`, a setting the library refused, a wrong argument type caught by
    :mod:`robustgrad.checks`, a run directory or resume refused). Told by type alone."""
    return isinstance(exc, ConfigError)


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a full disk or quota."""
    return _disk_full_cause(exc) is not None


def _disk_full_cause(exc: BaseException | None) -> OSError | None:
    """The full-disk ``OSError`` in ``exc``'s chain of causes and contexts, or None."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def disk_full_message(exc: BaseException, args: argparse.Namespace) -> str:
    """One line for a full disk: what failed and what ``--out`` is left as. Saves are atomic
    (:mod:`robustgrad.atomic`): the previous version of every file stays, never a truncated one;
    a training command's last checkpoint stays resumable."""
    full = _disk_full_cause(exc)
    where = f" writing {full.filename}" if full is not None and full.filename else ""
    out = getattr(args, "out", None)
    state = (f"{out} keeps its last complete files (writes are atomic)" if out
             else "nothing was left half-written (writes are atomic)")
    again = "free space and run again with --resume" if hasattr(args, "resume") \
        else "free space and run again"
    return f"no space left on device{where}: {state}; {again}"


def _error(message: object) -> int:
    text = " ".join(str(message).split()) or type(message).__name__
    print(f"robustgrad: error: {text}", file=sys.stderr)
    return EXIT_USAGE


def _run_lock(args: argparse.Namespace):
    """The :class:`robustgrad.rundir.RunLock` of the command's output directory (``--out``, or
    what the command's ``output_dir(args)`` says), or None for a command that writes none."""
    find = getattr(args, "_output_dir", None)
    out = find(args) if find is not None else getattr(args, "out", None)
    if not out:
        return None
    from robustgrad import rundir

    return rundir.RunLock(out, "--out", command=f"robustgrad {args.command}")


def _locked(step) -> None:
    """Run a lock step; another live run, or a directory that cannot hold the lock, is a
    :class:`UsageError` (one line)."""
    from robustgrad import rundir

    try:
        step()
    except (rundir.RunDirectoryLockedError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--out: cannot lock the output directory ({exc})") from None


def _command_name(argv: list[str]) -> str | None:
    """The command word of ``argv``: its first word that is neither an option nor the value of
    ``--threads`` (the one global option that takes a value)."""
    words = iter(argv)
    for word in words:
        if word == "--threads":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


_RECEIVED: list[str] = []
"""The stop signals (``"SIGINT"``, ``"SIGTERM"``) received while the current command ran."""


def _terminate(signum, frame):
    """SIGTERM outside a training loop's safe points: stop as Ctrl-C does (a batch system's
    stop request would otherwise end the process in silence, status -15)."""
    _RECEIVED.append(signal.Signals(signum).name)
    raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")


def _ctrl_c(signum, frame):
    """SIGINT: Python's own ``KeyboardInterrupt``, the signal recorded (see :func:`_stop_of`)."""
    _RECEIVED.append("SIGINT")
    raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """While the command runs (from the end of its checks: loading TensorFlow, the data and the
    model, tracing, the work), SIGTERM raises ``KeyboardInterrupt`` as SIGINT does, and both
    are recorded in ``_RECEIVED``. A training loop's
    :func:`robustgrad.interrupts.deferred_interrupts` still defers both to its safe points."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python installs signal handlers in the main thread only
        return
    installed = {}
    for signum, handler, default in ((signal.SIGTERM, _terminate, signal.SIG_DFL),
                                     (signal.SIGINT, _ctrl_c, signal.default_int_handler)):
        if signal.getsignal(signum) is default:  # else a caller (a test, an embedding
            installed[signum] = default          # program) chose its own handling
            signal.signal(signum, handler)
    redeliver = _Redeliver(sys.unraisablehook) if installed else None
    if redeliver is not None:
        sys.unraisablehook = redeliver
    try:
        yield
    finally:
        if redeliver is not None:
            redeliver.close()
            sys.unraisablehook = redeliver.previous
        for signum, default in installed.items():
            signal.signal(signum, default)


class _Redeliver:
    """``sys.unraisablehook`` while a command runs: the ``KeyboardInterrupt`` of a stop signal
    (this module's handlers, or a training loop's second signal) that landed in a finaliser (a
    ``__del__``, a weakref callback: TensorFlow runs many while it loads and traces) is not
    lost there -- Python would print "Exception ignored in ..." and the run would go on to its
    end -- but raised again in the main thread from a helper thread
    (``PyThreadState_SetAsyncExc``), at its next bytecode outside the finaliser. Any other
    unraisable exception goes to the previous hook. After :meth:`close` nothing is raised."""

    def __init__(self, previous):
        self.previous = previous
        self._lock = threading.Lock()
        self._open = True
        self._main = threading.main_thread().ident or 0

    def __call__(self, unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):  # a signal's: none else
            self.previous(unraisable)
            return
        returned = threading.Event()
        threading.Thread(target=self._raise, args=(returned,), daemon=True).start()
        returned.set()  # the last line: the raise must land after this hook, not in it

    def _raise(self, returned: threading.Event) -> None:
        returned.wait()
        time.sleep(0.005)  # the hook's return
        with self._lock:
            if self._open:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._main),
                                                           ctypes.py_object(KeyboardInterrupt))

    def close(self) -> None:
        """Raise nothing more (and drop a raise not yet delivered)."""
        with self._lock:
            self._open = False
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._main), None)


def _stop_of(exc: BaseException) -> KeyboardInterrupt | None:
    """The stop request behind ``exc``, an exception the command ended with: a
    ``KeyboardInterrupt`` in its chain of causes and contexts, or one made from a stop signal
    received while the command ran; None when neither.

    A signal raises ``KeyboardInterrupt`` at whatever Python line runs when it arrives; inside
    a library's clean-up (TensorFlow's graph stack while it traces a ``tf.function``, a ``with``
    block's exit) the clean-up can fail in turn and end the command with its own exception, the
    interrupt only its context, or none at all when the library dropped it. Either way the run
    was stopped on request, and says so on one line."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return seen
        seen = seen.__cause__ or seen.__context__
    if _RECEIVED:
        return KeyboardInterrupt(f"{_RECEIVED[0]} received" if _RECEIVED[0] != "SIGINT" else "")
    return None


def _left_behind(args: argparse.Namespace, argv: list[str]) -> str:
    """What an interrupted command left in its ``--out``, and how to go on: one clause."""
    out = getattr(args, "out", None)
    if not out:
        return ""
    again = [a for a in argv if a != "--overwrite"]  # --overwrite and --resume exclude
    again = again if "--resume" in again else [*again, "--resume"]
    if hasattr(args, "resume") and os.path.isfile(os.path.join(out, "results", "manifest.json")):
        return (f"--out {out} keeps the results committed so far; continue with: robustgrad "
                f"{shlex.join(again)}")
    if hasattr(args, "resume") and os.path.exists(os.path.join(out, "checkpoint")):
        # a training run stopped before its loop (while loading): its last checkpoint is there
        return (f"--out {out} keeps its last checkpoint; resume with: robustgrad "
                f"{shlex.join(again)}")
    return (f"--out {out} holds nothing to resume (every file there is whole: each write is "
            "atomic); run the command again")


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_name(argv)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if not args.show_native_log:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    del _RECEIVED[:]  # an earlier command's signal (main called again in one process) is not ours
    try:
        lock = _run_lock(args)
        if lock is not None:  # a live run in --out: say so before any other check
            _locked(lock.check)
        if args._validate is not None:
            args._validate(args)
        with _signals_as_interrupt():  # from here on a stop request ends in one line
            if lock is not None:
                _locked(lock.acquire)
                if lock.took_over:
                    print(f"robustgrad: {lock.took_over}", file=sys.stderr)
            try:
                from robustgrad.commands._startup import import_tensorflow

                import_tensorflow(verbose=args.show_native_log)
                if args.threads is not None:
                    set_threads(args.threads)
                return int(args._run(args) or 0)
            finally:
                if lock is not None:
                    lock.release()
    except Exception as exc:
        stop = _stop_of(exc)
        if stop is not None and not os.environ.get("ROBUSTGRAD_DEBUG"):
            return _interrupted(stop, args, argv)
        if disk_full(exc) and not os.environ.get("ROBUSTGRAD_DEBUG"):
            return _error(disk_full_message(exc, args))
        if not is_user_error(exc) or os.environ.get("ROBUSTGRAD_DEBUG"):
            raise
        return _error(exc)
    except KeyboardInterrupt as exc:
        return _interrupted(exc, args, argv)


def _interrupted(exc: KeyboardInterrupt, args: argparse.Namespace, argv: list[str]) -> int:
    """The one line of a stopped command (what it left in ``--out``, how to go on); 130."""
    detail = " ".join(str(exc).split())
    if not detail and _RECEIVED and _RECEIVED[0] != "SIGINT":  # raised again (_Redeliver)
        detail = f"{_RECEIVED[0]} received"
    if getattr(exc, "checkpoint", None) and hasattr(args, "resume"):
        # a training command stopped at a safe point: say how to continue it
        again = argv if "--resume" in argv else [*argv, "--resume"]
        detail += f"; resume with: robustgrad {shlex.join(again)}"
    elif _left_behind(args, argv):
        detail += ("; " if detail else "") + _left_behind(args, argv)
    print(f"robustgrad: interrupted{': ' + detail if detail else ''}", file=sys.stderr)
    return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    # ``python -m robustgrad.cli``: run the importable module's main, not this __main__ copy,
    # so that the UsageError the commands raise is the class main() catches
    from robustgrad.cli import main as _main

    sys.exit(_main())
