"""robustgrad — gradients as a first-class, controllable thing on TensorFlow 2.

The shared core: JAX-style derivative transforms over Python callables (``grad``,
``value_and_grad``, ``jvp``, ``vjp``, ``hvp``, ``hessian``, ``jacobian``, ``batch_jacobian``),
``input_gradient`` for classifiers, tape control (``stop_gradient``, ``unrecorded``, ``watched``,
``check_connected``), custom-gradient ops, gradient transformations (:mod:`robustgrad.transforms`),
derivative-based regularisers (:mod:`robustgrad.regularizers`) and monitoring
(:mod:`robustgrad.monitor`). Knows nothing of attacks or agents.
"""

__version__ = "0.1.0"

from robustgrad.custom import (  # noqa: E402
    clip_gradient,
    clip_gradient_norm,
    reverse_gradient,
    safe_norm,
    safe_sqrt,
    scale_gradient,
    straight_through,
)
from robustgrad.higher import (  # noqa: E402
    batch_jacobian,
    hessian,
    hessian_diagonal,
    hvp,
    jacobian,
    jvp,
    vjp,
)
from robustgrad.tape import (  # noqa: E402
    Tape,
    WatchReport,
    check_connected,
    grad,
    input_gradient,
    stop_gradient,
    unrecorded,
    value_and_grad,
    watched,
)
from robustgrad import data, errors, hyper, meta, monitor, regularizers, transforms  # noqa: E402
from robustgrad.errors import NonFiniteError  # noqa: E402
from robustgrad.monitor import gradient_stats  # noqa: E402
from robustgrad.transforms import (  # noqa: E402
    GradientStep,
    GradientTransformation,
    NonFiniteGradientError,
)

__all__ = [
    "GradientStep", "GradientTransformation", "NonFiniteError", "NonFiniteGradientError",
    "errors", "gradient_stats",
    "Tape", "WatchReport", "batch_jacobian", "check_connected", "clip_gradient",
    "clip_gradient_norm", "data", "grad", "hessian", "hessian_diagonal", "hvp",
    "input_gradient", "jacobian", "jvp", "monitor", "regularizers", "reverse_gradient",
    "safe_norm", "safe_sqrt", "scale_gradient", "stop_gradient", "straight_through",
    "transforms", "unrecorded", "value_and_grad", "vjp", "watched", "hyper", "meta",
]
