"""The former name of :mod:`robustgrad.checks`, kept so that code importing ``robustgrad._checks``
keeps working (the same functions and the same :class:`~robustgrad.checks.ArgumentTypeError`
class). New code imports :mod:`robustgrad.checks`."""

from robustgrad.checks import *  # noqa: F403
from robustgrad.checks import __all__  # noqa: F401
