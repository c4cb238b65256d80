"""The core's error classes: one hierarchy for non-finite values.

:class:`NonFiniteError` is the base of every "the numbers went NaN/Inf" error in the project (a
``ValueError``, as DESIGN's "fail loud" rule asks); :class:`NonFiniteGradientError` is raised by
:meth:`robustgrad.transforms.GradientStep.raise_if_exceeded` when more than
``max_nonfinite_steps`` consecutive steps had non-finite gradients. Catch ``NonFiniteError`` to
handle any of them. This module imports nothing heavy (the CLI may import it before TensorFlow).

>>> issubclass(NonFiniteGradientError, NonFiniteError), issubclass(NonFiniteError, ValueError)
(True, True)
"""

from __future__ import annotations

__all__ = ["NonFiniteError", "NonFiniteGradientError"]


class NonFiniteError(ValueError):
    """Values that must be finite (a loss, gradients, an update) were NaN or infinite."""


class NonFiniteGradientError(NonFiniteError):
    """Too many consecutive steps had non-finite gradients (raised eagerly, outside the graph)."""
