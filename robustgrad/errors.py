"""The core's error classes: the user's mistakes (:class:`ConfigError`) and non-finite values
(:class:`NonFiniteError`), each one hierarchy, so that a program (the command line among them)
tells the user's mistakes from bugs by their type.

:class:`ConfigError` is a ``ValueError`` (code that catches ``ValueError`` keeps working): a
setting out of range, an unknown name, a file that does not hold what it should, a run directory
that cannot be used (:class:`RunDirectoryError`), a resumed run whose configuration changed
(:class:`ResumeError`). The ``robustgrad`` command prints a ``ConfigError`` as one line
``robustgrad: error: <message>`` (exit status 2); any other exception is a bug and keeps its
traceback.

:class:`NonFiniteError` is the base of every "the numbers went NaN/Inf" error in the project (a
``ValueError``, as DESIGN's "fail loud" rule asks); :class:`NonFiniteGradientError` is raised by
:meth:`robustgrad.transforms.GradientStep.raise_if_exceeded` when more than
``max_nonfinite_steps`` consecutive steps had non-finite gradients. Catch ``NonFiniteError`` to
handle any of them. This module imports nothing (the CLI imports it before TensorFlow).

>>> issubclass(NonFiniteGradientError, NonFiniteError), issubclass(NonFiniteError, ValueError)
(True, True)
>>> try:
...     raise ResumeError("--resume: the run in runs/x has a different configuration")
... except ValueError as exc:
...     isinstance(exc, ConfigError), str(exc)
(True, '--resume: the run in runs/x has a different configuration')
"""

from __future__ import annotations

__all__ = ["ConfigError", "NonFiniteError", "NonFiniteGradientError", "ResumeError",
           "RunDirectoryError"]


class ConfigError(ValueError):
    """Something the user got wrong: a setting, a name, a file, an output directory. The message
    names the setting (or flag) and says what was received and what is accepted."""

    # One message argument, exactly ``Exception``'s constructor: TensorFlow's AutoGraph re-raises
    # an error whose ``__init__`` is ``Exception.__init__`` as itself when it leaves a traced
    # function (a check inside a ``tf.function``), where any other subclass becomes a StagingError.
    __init__ = Exception.__init__


class RunDirectoryError(ConfigError):
    """A run directory that cannot be used: not writable, a file, or holding a run that would be
    overwritten."""


class ResumeError(ConfigError):
    """A run that cannot be resumed as asked: no run to resume, an unreadable record, or a
    configuration that differs from the saved one without ``override`` naming the change."""


class NonFiniteError(ValueError):
    """Values that must be finite (a loss, gradients, an update) were NaN or infinite."""


class NonFiniteGradientError(NonFiniteError):
    """Too many consecutive steps had non-finite gradients (raised eagerly, outside the graph)."""
