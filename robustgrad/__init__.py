"""robustgrad — gradients as a first-class, controllable thing on TensorFlow 2.

The shared core: JAX-style derivative transforms over Python callables (``grad``,
``value_and_grad``, ``jvp``, ``vjp``, ``hvp``, ``hessian``, ``jacobian``, ``batch_jacobian``),
``input_gradient`` for classifiers, tape control (``stop_gradient``, ``unrecorded``, ``watched``,
``check_connected``), custom-gradient ops, gradient transformations (:mod:`robustgrad.transforms`),
derivative-based regularisers (:mod:`robustgrad.regularizers`) and monitoring
(:mod:`robustgrad.monitor`). Knows nothing of attacks or agents.

Names are imported on first use (PEP 562), so ``import robustgrad`` -- and the command line's
``robustgrad --help``, which lives in this package -- loads no TensorFlow until a name that needs
it is touched.

>>> import robustgrad as rg
>>> rg.__version__
'0.1.0'
>>> callable(rg.value_and_grad)
True
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it
_NAMES = {
    **dict.fromkeys(("clip_gradient", "clip_gradient_norm", "reverse_gradient", "safe_norm",
                     "safe_sqrt", "scale_gradient", "straight_through"), "robustgrad.custom"),
    **dict.fromkeys(("hvp", "jvp", "vjp"), "robustgrad.higher"),
    **dict.fromkeys(("batch_jacobian", "hessian", "hessian_diagonal", "jacobian"),
                    "robustgrad.jacobians"),
    **dict.fromkeys(("Tape", "WatchReport", "check_connected", "grad", "stop_gradient",
                     "unrecorded", "value_and_grad", "watched"), "robustgrad.tape"),
    "input_gradient": "robustgrad.input_gradients",
    "NonFiniteError": "robustgrad.errors",
    "gradient_stats": "robustgrad.monitor",
    **dict.fromkeys(("GradientStep", "GradientTransformation", "NonFiniteGradientError"),
                    "robustgrad.transforms"),
}
_SUBMODULES = ("atomic", "bounds", "checks", "convolution", "data", "errors", "hyper", "interrupts",
               "meta", "monitor", "progress", "regularizers", "transforms", "winograd")

__all__ = sorted([*_NAMES, *_SUBMODULES])


def __getattr__(name: str):
    if name in _SUBMODULES:
        value = importlib.import_module(f"robustgrad.{name}")
    elif name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    else:
        raise AttributeError(f"module 'robustgrad' has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
