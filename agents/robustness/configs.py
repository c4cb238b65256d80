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
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from agents.core.plugin import RobustMethod, register_robust_config

__all__ = ["ATLA", "SA", "Adversarial", "WocaR", "WocaRSettings"]


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
    """``robust="wocar"``: worst-case-aware robust training (WocaR-PPO, WocaR-A2C, WocaR-DQN;
    Liang et al., NeurIPS 2022; :mod:`agents.robustness.wocar`). Every setting of the method is
    here (``None``: the config's value, else WocaR's default, :attr:`DEFAULTS`); each is a flat
    ``wocar_*`` or ``robust_*`` field of the agent's config, checked there
    (:data:`agents.core.plugin.WOCAR_FIELDS`: a ``ConfigError`` naming the field and its range).

    * ``eps``: the ball's radius (> 0); ``warmup``: the fraction of the budget over which eps,
      kappa and the weight rise from 0 (``wocar_warmup``; WocaR's own, not SA's
      ``robust_eps_warmup``);
    * ``weight``: the worst-attack value's weight in the policy objective (DQN: its share, in
      [0, 1], in the TD target's choice of the next action); ``weight_over_run``: the weight
      rises over the whole run (the paper's ``linear`` schedule) instead of over ``warmup``;
    * ``bound``: the bound method of the admissible actions (``"ibp"``, ``"crown"`` or
      ``"crown-ibp"``; WocaR-DQN's worst-case term is on IBP bounds whatever it is);
      ``admissible_eps``: their radius in the critic's target (PPO/A2C; ``None``: the
      schedule's eps);
    * ``kappa``, ``steps``, ``method``: the smoothness term and its inner maximiser (``"pgd"``,
      ``"sgld"``); ``importance``: weight it by the state importance ``ω(s)`` (DQN: its
      worst-case term);
      ``search_per_rollout``: search once per rollout, not per minibatch (PPO/A2C);
      ``smoothness_every``: the term on update steps ``0, k, 2k, ...`` of an iteration's
      update, weighted so each update's weights sum to its steps (PPO/A2C; 1: every step);
      ``search_steps``: the projected sign steps of the worst-action search in a Box-action
      admissible box, after its corners (PPO/A2C on Box actions);
    * ``q_epochs``, ``q_minibatches`` (PPO/A2C), ``q_lr``, ``tau``: the worst-attack critic's
      epochs and minibatches per rollout, Adam learning rate and target-network Polyak rate;
      ``q_min_rows`` (PPO/A2C): the fewest rows of one critic minibatch (a rollout of ``n``
      rows gets ``min(q_minibatches, max(1, n // q_min_rows))`` minibatches);
      ``q_every`` (DQN): the agent's gradient steps per step of the worst-attack network;
      ``term`` (DQN): the worst-case term, ``"spread"`` (the paper's: every Q-value's IBP
      bounds over the ball near its target) or ``"margin"`` (SA-DQN's hinge on the greedy
      action's certified margin, its lower bound by ``bound``); ``term_start`` (DQN): the
      fraction of the budget before which that term is off;
      ``double``: its target's worst next action chosen by the critic and valued by the target
      copy (the paper's code) instead of the target copy's own min; ``gamma``: the critic's own
      discount, in [0, 1) (``None``: the agent's ``gamma``; closer to 1, a longer horizon for
      the worst-attack values than the policy's advantages have).

    >>> from agents.config import PPOConfig
    >>> spec = PPOConfig(robust=WocaR(eps=0.05, weight=0.5)).robust_spec
    >>> spec.weight, spec.warmup, spec.kappa
    (0.5, None, 0.1)
    >>> spec.resolved().warmup, spec.resolved().q_lr, spec.resolved(value_based=True).warmup
    (0.3, 0.001, 0.75)
    """

    eps: float | None = None
    weight: float | None = None
    bound: str | None = None
    kappa: float | None = None
    steps: int | None = None
    method: str | None = None
    warmup: float | None = None
    admissible_eps: float | None = None
    importance: bool | None = None
    weight_over_run: bool | None = None
    search_per_rollout: bool | None = None
    smoothness_every: int | None = None
    double: bool | None = None
    search_steps: int | None = None
    q_epochs: int | None = None
    q_minibatches: int | None = None
    q_min_rows: int | None = None
    q_every: int | None = None
    term: str | None = None
    term_start: float | None = None
    q_lr: float | None = None
    tau: float | None = None
    gamma: float | None = None
    name: ClassVar[str] = "wocar"
    _FIELDS: ClassVar[dict[str, str]] = {
        "eps": "robust_eps", "weight": "wocar_weight", "bound": "wocar_bound",
        "kappa": "robust_kappa", "steps": "robust_steps", "method": "robust_method",
        "warmup": "wocar_warmup", "admissible_eps": "wocar_admissible_eps",
        "importance": "wocar_importance", "weight_over_run": "wocar_weight_over_run",
        "search_per_rollout": "wocar_search_per_rollout", "double": "wocar_double",
        "smoothness_every": "wocar_smoothness_every",
        "search_steps": "wocar_search_steps", "q_epochs": "wocar_q_epochs",
        "q_minibatches": "wocar_q_minibatches", "q_min_rows": "wocar_q_min_rows",
        "q_lr": "wocar_q_lr", "tau": "wocar_tau",
        "q_every": "wocar_q_every", "term": "wocar_term", "term_start": "wocar_term_start",
        "gamma": "wocar_gamma"}
    DEFAULTS: ClassVar[Mapping[str, Any]] = MappingProxyType({
        "weight": 0.8, "bound": "ibp", "warmup": 0.3, "importance": True,
        "weight_over_run": False, "search_per_rollout": True, "double": False,
        "smoothness_every": 2, "search_steps": 10, "q_epochs": 4, "q_minibatches": 4,
        "q_min_rows": 1,
        "q_lr": 1e-3, "tau": 0.01})
    """WocaR's defaults of the settings left ``None`` (:meth:`resolved`), PPO/A2C's where the
    paper's code differs (docs/benchmarks/robust-rl.md, "WocaR-PPO"): ``weight`` 0.8 (its MuJoCo
    ``q_weight``); ``bound`` ``"ibp"`` (the cheaper bound, as its code); ``warmup`` 0.3 (the
    CartPole screen: median worst case 160.5 -> 223 over 3 seeds against 0.75, natural 500
    kept); ``importance`` (the paper's text; its code weights all states alike); the search
    once per rollout (its code: per minibatch; ~1.7x the training CPU, no better);
    ``smoothness_every`` 2, the term on every other update step, twice (its code: every step;
    on CartPole at 200k steps, 5 seeds: median worst case 221.5 against 219.5, natural 500
    kept; training CPU 1.41x vanilla's against 1.47x, measured quietly side by side:
    docs/benchmarks/robust-rl.md); the critic's 4
    epochs of 4 minibatches per 256-step rollout, lr 1e-3, tau 0.01 (its code: 10 x 32 per
    2048 steps, 4e-4, 0.001; Box actions: :attr:`BOX_DEFAULTS`), ``q_min_rows`` 1 (a rollout
    of fewer rows than minibatches: one row each); ``search_steps`` 10 after
    the box's corners (its code: 100 steps from the mean, no corners). ``admissible_eps``
    ``None`` is the schedule's eps (its code: a fixed 0.01)."""
    BOX_DEFAULTS: ClassVar[Mapping[str, Any]] = MappingProxyType({
        "q_epochs": 10, "q_minibatches": 32, "q_min_rows": 8, "smoothness_every": 1})
    """WocaR-PPO/A2C's defaults on Box actions where they differ from :attr:`DEFAULTS`: the
    worst-attack critic's 10 epochs of 32 minibatches per rollout (the paper's MuJoCo code),
    each of at least 8 rows (``q_min_rows``; on a smaller rollout fewer minibatches: A2C's
    40-row rollouts get 5, 50 critic steps per rollout where 32 minibatches of one row each
    were 320 at 3.1x the training CPU, the worst-attack values reaching the same scale; 64
    rows, the paper's 2048 / 32, left them at two thirds of it after 50k steps:
    docs/benchmarks/robust-rl.md, "WocaR-A2C on Box actions");
    the smoothness term on every update step (``smoothness_every`` 1: the Pendulum figures
    were measured so; every other step was not tried on Box actions).
    The discrete defaults (4 x 4, set on CartPole's 256-step rollouts) give ``Q_w`` 16 steps
    per rollout; on Pendulum's 2048-step rollouts a 30k-step run left its mean value at -0.47
    where the natural critic's was -2.65 (normalised rewards: still climbing down from its
    zero start), and with 10 x 32 it reached -2.8, below ``V`` as a worst-attack value must
    be (docs/benchmarks/robust-rl.md, "WocaR-PPO on Box actions"). A Box agent saved before
    ``search_steps`` existed trained with 4 x 4 and keeps it on load, one saved before
    ``q_min_rows`` existed trained with 1 and keeps it
    (:func:`agents.core.plugin.on_policy_saved_fields`)."""
    DQN_DEFAULTS: ClassVar[Mapping[str, Any]] = MappingProxyType({
        "weight": 0.3, "warmup": 0.75, "q_every": 10, "bound": "crown-ibp"})
    """WocaR-DQN's defaults where they differ from :attr:`DEFAULTS`: ``weight`` 0.3 (the
    paper's DQN code: ``worst_ratio`` 0.05; on CartPole at eps 0.02, with the CROWN-IBP sets
    below, 0.3 kept a 5-seed median worst case of 185.5 against 0.05's 177.5, within the
    seeds' draw, and one seed at 500 under every attack: docs/benchmarks/robust-rl.md, "What
    limited WocaR-DQN"), ``warmup`` 0.75 (the warm-up its figures were
    measured with; the 0.3 of the PPO screen was not tried on DQN), ``q_every`` 10 (the
    paper's DQN code's ``worst_rate``: the worst-attack network steps on every tenth replayed
    minibatch), ``bound`` ``"crown-ibp"`` (on CartPole's 256-256 ReLU Q-network at eps 0.02
    IBP's sets admitted 1.90-1.98 of the 2 actions after 30k steps, CROWN-IBP's 1.13-1.46
    against 1.09-1.33 reached by sampling the ball, and the worst-attack values under IBP's
    sets sank toward those of an attacker choosing every action; with ``q_every`` 10 the
    tighter sets cost less than IBP's did on every step: docs/benchmarks/robust-rl.md,
    "WocaR-DQN")."""

    def resolved(self, value_based: bool = False, box: bool = False) -> WocaR:
        """This config with each ``None`` setting at WocaR's default (:attr:`DEFAULTS`;
        ``value_based``: a DQN's, :attr:`DQN_DEFAULTS` first; ``box``: an actor-critic's on
        Box actions, :attr:`BOX_DEFAULTS` first); ``admissible_eps`` stays ``None`` (the
        schedule's eps).

        >>> WocaR().resolved().q_epochs, WocaR().resolved(box=True).q_minibatches
        (4, 32)
        """
        if value_based and box:
            raise ValueError("resolved: value_based (WocaR-DQN) has no Box-action variant")
        defaults = {**self.DEFAULTS, **(self.DQN_DEFAULTS if value_based else {}),
                    **(self.BOX_DEFAULTS if box else {})}
        return dataclasses.replace(self, **{k: v for k, v in defaults.items()
                                            if getattr(self, k) is None})

    def settings(self, value_based: bool = False, box: bool = False) -> WocaRSettings:
        """The method's settings as the plug-ins read them (:meth:`resolved`, typed:
        :class:`WocaRSettings`; ``eps``, ``kappa``, ``steps``, ``method`` are the config's
        schedule's, not here).

        >>> WocaR(weight=0.5).settings().weight, WocaR().settings(value_based=True).warmup
        (0.5, 0.75)
        """
        r = self.resolved(value_based, box)
        return WocaRSettings(
            weight=float(_set(r.weight)), bound=str(_set(r.bound)), warmup=float(_set(r.warmup)),
            admissible_eps=None if r.admissible_eps is None else float(r.admissible_eps),
            importance=bool(_set(r.importance)), weight_over_run=bool(_set(r.weight_over_run)),
            search_per_rollout=bool(_set(r.search_per_rollout)), double=bool(_set(r.double)),
            smoothness_every=int(_set(r.smoothness_every)),
            search_steps=int(_set(r.search_steps)), q_epochs=int(_set(r.q_epochs)),
            q_minibatches=int(_set(r.q_minibatches)), q_min_rows=int(_set(r.q_min_rows)),
            q_lr=float(_set(r.q_lr)), tau=float(_set(r.tau)),
            gamma=None if r.gamma is None else float(r.gamma),
            q_every=1 if r.q_every is None else int(r.q_every),
            term="spread" if r.term is None else str(r.term),
            term_start=0.0 if r.term_start is None else float(r.term_start))


def _set(value: Any) -> Any:
    """``value``, which :meth:`WocaR.resolved` has filled in (a default is never ``None``)."""
    assert value is not None
    return value


@dataclass(frozen=True)
class WocaRSettings:
    """WocaR's settings with every default filled in (:meth:`WocaR.settings`): what its
    plug-ins (:mod:`agents.robustness.wocar`) read. Each is the :class:`WocaR` field of the
    same name; ``admissible_eps`` ``None``: the schedule's eps; ``gamma`` ``None``: the
    agent's; ``q_every``, ``term``, ``term_start``: 1, ``"spread"``, 0 where WocaR-PPO/A2C
    (which do not read them) leave them unset."""

    weight: float
    bound: str
    warmup: float
    admissible_eps: float | None
    importance: bool
    weight_over_run: bool
    search_per_rollout: bool
    double: bool
    search_steps: int
    q_epochs: int
    q_minibatches: int
    q_min_rows: int
    q_lr: float
    tau: float
    gamma: float | None
    q_every: int = 1
    term: str = "spread"
    term_start: float = 0.0
    smoothness_every: int = 1


register_robust_config(SA, "sa")
register_robust_config(Adversarial, "adv")
register_robust_config(ATLA, "atla", "atla-sa")
register_robust_config(WocaR, "wocar")
