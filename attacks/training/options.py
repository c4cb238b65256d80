"""The trainer's options in four small typed groups, each checked when it is made.

:class:`~attacks.training.AdversarialTrainer` takes its options either as these objects
(``crafting=``, ``loss=``, ``update=``, ``schedule=``) or as the flat keywords of earlier
versions (``norm=``, ``beta=``, ``max_grad_norm=``, ...), which fill the same fields; giving one
field both ways is a ``TypeError``. The trainer's attributes and its saved config stay flat.

* :class:`CraftingOptions` -- how adversarial examples are crafted: norm, input box, steps,
  step size, random start, the model's mode while crafting.
* :class:`LossOptions` -- the weights and parameters of the methods' losses.
* :class:`UpdateOptions` -- the gradient step: clipping, weight decay, the non-finite guard.
* :class:`ScheduleOptions` -- the eps warm-up.

>>> LossOptions(beta=3.0).beta, CraftingOptions(norm="inf").norm
(3.0, 'linf')
>>> UpdateOptions(max_grad_norm=0)
Traceback (most recent call last):
...
robustgrad.errors.ConfigError: max_grad_norm must be a number > 0, got 0
>>> split_options({"beta": 3.0, "warmup_steps": 2, "name": "t"})[1]     # the rest: Keras's
{'name': 't'}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from robustgrad import checks as _checks

__all__ = ["CraftingOptions", "LossOptions", "ScheduleOptions", "UpdateOptions",
           "split_options"]


@dataclass(frozen=True)
class CraftingOptions:
    """How adversarial examples are crafted (the trainer's docstring details each field).

    ``norm`` None takes the method's first norm; ``steps`` None its default; ``step_size`` None
    its default step size (an absolute step at full eps, scaled during warm-up)."""

    norm: Any = None
    clip_min: float = 0.0
    clip_max: float = 1.0
    steps: int | None = None
    step_size: float | None = None
    random_start: bool = True
    craft_training: bool = False

    def __post_init__(self) -> None:
        if self.norm is not None:
            object.__setattr__(self, "norm", _checks.norm_name(self.norm))
        _checks.number(self.clip_min, "clip_min")
        _checks.number(self.clip_max, "clip_max")
        if not self.clip_min < self.clip_max:
            raise ValueError(f"clip_min ({self.clip_min}) must be < clip_max ({self.clip_max})")
        _checks.number(self.step_size, "step_size", minimum=0, min_inclusive=False,
                       allow_none=True)


MAX_NOISE_DRAWS = 1_024
"""SmoothAdv's most noise draws per example (``noise_draws``; ``train-classifier
--noise-draws`` has the same bound): each multiplies the batch held in memory (Salman et al.
use 1-8)."""


@dataclass(frozen=True)
class LossOptions:
    """The losses' parameters: ``beta`` (TRADES, MART), ``adv_ratio``, ``label_smoothing``,
    ``awp_gamma``, ``kappa_final`` / ``beta_final`` (certified training), ``sigma`` and
    ``noise_draws`` (SmoothAdv)."""

    beta: float = 6.0
    adv_ratio: float = 1.0
    label_smoothing: float = 0.0
    awp_gamma: float = 0.01
    kappa_final: float = 0.5
    beta_final: float = 0.0
    sigma: float = 0.25
    noise_draws: int = 1

    def __post_init__(self) -> None:
        _checks.number(self.beta, "beta", minimum=0, maximum=_checks.MAX_LOSS_WEIGHT)
        _checks.number(self.adv_ratio, "adv_ratio")
        _checks.probability(self.adv_ratio, "adv_ratio")
        _checks.number(self.awp_gamma, "awp_gamma", minimum=0, maximum=_checks.MAX_AWP_GAMMA)
        _checks.probability(self.kappa_final, "kappa_final")
        _checks.probability(self.beta_final, "beta_final")
        _checks.number(self.sigma, "sigma", minimum=0, min_inclusive=False)
        object.__setattr__(self, "noise_draws", _checks.positive_int(
            self.noise_draws, "noise_draws", maximum=MAX_NOISE_DRAWS))
        _checks.number(self.label_smoothing, "label_smoothing", minimum=0, maximum=1,
                       max_inclusive=False)


RECOMPUTE_MODES = ("none", "activations", "blocks")
"""What the update's training-mode pass recomputes in its backward pass instead of keeping:
``"none"`` (everything kept), ``"activations"`` (each batch norm + ReLU feeding convolutions:
:func:`attacks.training.recomputed_activations_call`; the convolutions are not run again),
``"blocks"`` (each residual block: :func:`attacks.training.checkpointed_call`, one more forward
pass of the update, and freed memory returned to the system at once)."""


def recompute_mode(value: Any) -> str:
    """``value`` as one of :data:`RECOMPUTE_MODES` (``True`` is ``"blocks"``, ``False``
    ``"none"``: the earlier boolean option); anything else is a ``ValueError`` (a string) or a
    ``TypeError`` naming ``recompute`` and the accepted values.

    >>> recompute_mode(True), recompute_mode("activations")
    ('blocks', 'activations')
    """
    if isinstance(value, bool):
        return "blocks" if value else "none"
    accepted = ", ".join(repr(m) for m in RECOMPUTE_MODES)
    if not isinstance(value, str):
        raise TypeError(f"recompute must be one of {accepted} (or True/False); got {value!r}")
    if value not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {accepted} (or True/False); got {value!r}")
    return value


CONVOLUTION_MODES = ("auto", "direct", "winograd")
"""How the update's 3x3 convolutions compute (:class:`UpdateOptions`' ``convolutions``):
``"direct"`` (TensorFlow's convolution, values bit for bit), ``"winograd"`` (Winograd F(4x4, 3x3)
compiled by XLA where it pays, :func:`robustgrad.winograd.winograd_conv2d`: 0.4-0.7x the time of
a wide 3x3 convolution on a CPU, equal to float rounding, ~1e-5 of the largest output in
float32), ``"auto"`` (``"winograd"`` when TensorFlow sees no GPU, else ``"direct"``)."""


def convolution_mode(value: Any) -> str:
    """``value`` if it is one of :data:`CONVOLUTION_MODES`; otherwise a ``ValueError`` (a
    string) or ``TypeError`` naming ``convolutions`` and the accepted values.

    >>> convolution_mode("winograd")
    'winograd'
    """
    if value not in CONVOLUTION_MODES:
        accepted = ", ".join(repr(m) for m in CONVOLUTION_MODES)
        error = ValueError if isinstance(value, str) else TypeError
        raise error(f"convolutions must be one of {accepted}; got {value!r}")
    return value


@dataclass(frozen=True)
class UpdateOptions:
    """The gradient step: ``max_grad_norm`` (None: no clipping), ``weight_decay`` (coupled,
    added to the gradient), ``max_nonfinite_steps`` (the guard's patience), ``recompute``
    (what the training-mode forward pass keeps for the backward pass: one of
    :data:`RECOMPUTE_MODES`; ``True``/``False`` are read as ``"blocks"``/``"none"``),
    ``convolutions`` (one of :data:`CONVOLUTION_MODES`)."""

    max_grad_norm: float | None = None
    weight_decay: float = 0.0
    max_nonfinite_steps: int = 10
    recompute: str | bool = "activations"
    convolutions: str = "auto"

    def __post_init__(self) -> None:
        _checks.number(self.max_grad_norm, "max_grad_norm", minimum=0, min_inclusive=False,
                       allow_none=True)
        _checks.number(self.weight_decay, "weight_decay", minimum=0,
                       maximum=_checks.MAX_WEIGHT_DECAY)
        object.__setattr__(self, "max_nonfinite_steps", _checks.positive_int(
            self.max_nonfinite_steps, "max_nonfinite_steps", minimum=0))
        object.__setattr__(self, "recompute", recompute_mode(self.recompute))
        convolution_mode(self.convolutions)


@dataclass(frozen=True)
class ScheduleOptions:
    """The eps warm-up: ``warmup_delay`` train steps at eps 0, then a linear ramp over
    ``warmup_steps`` (0: none)."""

    warmup_steps: int = 0
    warmup_delay: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "warmup_steps",
                           _checks.positive_int(self.warmup_steps, "warmup_steps", minimum=0))
        object.__setattr__(self, "warmup_delay",
                           _checks.positive_int(self.warmup_delay, "warmup_delay", minimum=0))


_GROUPS: dict[str, type] = {"crafting": CraftingOptions, "loss": LossOptions,
                            "update": UpdateOptions, "schedule": ScheduleOptions}


def split_options(kwargs: dict, **groups: Any) -> tuple[dict[str, Any], dict]:
    """``({group name: options object}, the other keywords)``: the flat keywords in
    ``kwargs`` fill the fields of the groups given (``crafting=CraftingOptions(...)``, ...; None
    or absent: the defaults). ``TypeError`` when a field is given both ways or a group is not
    its options type."""
    rest = dict(kwargs)
    built: dict[str, Any] = {}
    for group, cls in _GROUPS.items():
        given = groups.get(group)
        if given is not None and not isinstance(given, cls):
            raise TypeError(f"{group} must be {cls.__name__}; got {type(given).__name__}")
        flat = {f.name: rest.pop(f.name) for f in dataclasses.fields(cls) if f.name in rest}
        if given is None:
            built[group] = cls(**flat)
            continue
        if flat:
            raise TypeError(f"{', '.join(flat)} given both as keyword(s) and in {group}=; "
                            "give each option once")
        built[group] = given
    return built, rest
