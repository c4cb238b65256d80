"""The typed robust training configs: ``PPO(robust=SA(eps=0.05, kappa=0.5))``.

One :class:`agents.core.plugin.RobustMethod` per method of the robustness wing, each entered in
:data:`agents.core.plugin.ROBUST_CONFIGS` (:func:`agents.core.plugin.register_robust_config`), so
that ``config.robust_spec`` reads a config's flat ``robust*`` fields back as one. A typed config
only sets those fields (the config saves, loads and prints as before); the methods themselves
are the plug-ins of :mod:`agents.robustness.robust`, :mod:`agents.robustness.atla` and
:mod:`agents.robustness.wocar`.

>>> from agents.config import PPOConfig
>>> PPOConfig(robust=SA(eps=0.05, kappa=0.5)).robust_spec
SA(eps=0.05, kappa=0.5, steps=10, method='pgd', warmup=0.75)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from agents.core.plugin import RobustMethod, register_robust_config

__all__ = ["ATLA", "SA", "Adversarial", "WocaR"]


@dataclass(frozen=True)
class SA(RobustMethod):
    """``robust="sa"``: the state-adversarial regulariser (SA-PPO, SA-A2C, SA-DQN;
    :mod:`agents.robustness.robust`). ``eps``: the ball's radius; ``kappa``: the term's weight;
    ``steps``, ``method``: the inner maximiser (``"pgd"``, ``"sgld"``, ``"convex"``);
    ``warmup``: fraction of the budget over which eps and kappa rise from 0.

    >>> from agents.config import PPOConfig
    >>> PPOConfig(robust=SA(eps=0.05, kappa=0.5)).robust_spec.kappa
    0.5
    """

    eps: float | None = None
    kappa: float | None = None
    steps: int | None = None
    method: str | None = None
    warmup: float | None = None
    name: ClassVar[str] = "sa"
    _FIELDS: ClassVar[dict[str, str]] = {
        "eps": "robust_eps", "kappa": "robust_kappa", "steps": "robust_steps",
        "method": "robust_method", "warmup": "robust_eps_warmup"}


@dataclass(frozen=True)
class Adversarial(RobustMethod):
    """``robust="adv"``: train on observations attacked by ``attack`` (``"random"``,
    ``"action"``, ``"mad"``, ``"critic"``) at radius ``eps`` with ``steps`` steps; ``warmup`` as
    :class:`SA`.

    >>> from agents.config import DQNConfig
    >>> DQNConfig(robust=Adversarial(eps=0.02, attack="mad")).robust
    'adv'
    """

    eps: float | None = None
    attack: str | None = None
    steps: int | None = None
    warmup: float | None = None
    name: ClassVar[str] = "adv"
    _FIELDS: ClassVar[dict[str, str]] = {
        "eps": "robust_eps", "attack": "robust_attack", "steps": "robust_steps",
        "warmup": "robust_eps_warmup"}


@dataclass(frozen=True)
class ATLA(RobustMethod):
    """``robust="atla"``: alternate with a learned adversary at radius ``eps``
    (:mod:`agents.robustness.atla`; ``start_radius``: its curriculum, ``warmup`` as :class:`SA`);
    with ``kappa`` also SA's regulariser (``robust="atla-sa"``, ``steps`` and ``method`` its inner
    maximiser).

    >>> from agents.config import PPOConfig
    >>> PPOConfig(robust=ATLA(eps=0.1, kappa=0.2)).robust
    'atla-sa'
    """

    eps: float | None = None
    warmup: float | None = None
    start_radius: float | None = None
    kappa: float | None = None
    steps: int | None = None
    method: str | None = None
    _FIELDS: ClassVar[dict[str, str]] = {
        "eps": "robust_eps", "warmup": "robust_eps_warmup", "start_radius": "atla_start_radius",
        "kappa": "robust_kappa", "steps": "robust_steps", "method": "robust_method"}

    @property
    def name(self) -> str:  # type: ignore[override]
        """``"atla-sa"`` with a ``kappa``, else ``"atla"``."""
        return "atla" if self.kappa is None else "atla-sa"

    @classmethod
    def from_config(cls, config: Any) -> ATLA:
        """As :meth:`RobustMethod.from_config`; ``robust="atla"`` has no SA term (no ``kappa``,
        ``steps``, ``method``)."""
        spec = super().from_config(config)
        assert isinstance(spec, ATLA)
        if config.robust == "atla":
            spec = dataclasses.replace(spec, kappa=None, steps=None, method=None)
        return spec


@dataclass(frozen=True)
class WocaR(RobustMethod):
    """``robust="wocar"``: worst-case-aware robust training (WocaR-PPO, WocaR-A2C, WocaR-DQN; Liang et al.,
    NeurIPS 2022; :mod:`agents.robustness.wocar`). ``eps``: the ball's radius (> 0); ``weight``:
    the worst-attack value's weight in the policy objective; ``bound``: the bound method of the
    admissible actions (``"ibp"`` or ``"crown"``); ``kappa``, ``steps``, ``method``: the
    importance-weighted smoothness term and its inner maximiser (``"pgd"``, ``"sgld"``);
    ``warmup`` as :class:`SA`.

    >>> from agents.config import PPOConfig
    >>> PPOConfig(robust=WocaR(eps=0.05, weight=0.5)).robust_spec
    WocaR(eps=0.05, weight=0.5, bound=None, kappa=0.1, steps=10, method='pgd', warmup=0.75)
    """

    eps: float | None = None
    weight: float | None = None
    bound: str | None = None
    kappa: float | None = None
    steps: int | None = None
    method: str | None = None
    warmup: float | None = None
    name: ClassVar[str] = "wocar"
    _FIELDS: ClassVar[dict[str, str]] = {
        "eps": "robust_eps", "weight": "wocar_weight", "bound": "wocar_bound",
        "kappa": "robust_kappa", "steps": "robust_steps", "method": "robust_method",
        "warmup": "robust_eps_warmup"}


register_robust_config(SA, "sa")
register_robust_config(Adversarial, "adv")
register_robust_config(ATLA, "atla", "atla-sa")
register_robust_config(WocaR, "wocar")
