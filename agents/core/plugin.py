"""Robust training as a plug-in: the protocol an algorithm calls, and the table of methods.

An agent holds one plug-in, ``agent.robustness``, built from its config (``robust``) by
:func:`robustness_for` right after the algorithm's networks. The algorithms
(:mod:`agents.algorithms.onpolicy`,
:mod:`agents.algorithms.ppo`, :mod:`agents.algorithms.dqn`) call its hooks and never ask which method it is;
the
learn driver (:class:`agents.Agent`) calls the phase between iterations:

* **what the agent perceives**: :meth:`RobustnessPlugin.perceive` (the on-policy rollout: what the
  policy sees of ``obs``, and what is stored and learned from) and
  :meth:`RobustnessPlugin.learner_observations` (what a Q-learner's update sees of its replayed
  observations; the buffer keeps the clean ones);
* **what the policy objective optimises**: :meth:`RobustnessPlugin.shape_advantages` (an on-policy
  batch's advantages as the update uses them; a method that learns from the rollout, WocaR's
  worst-attack critic, trains there); for a Q-learner :meth:`RobustnessPlugin.learn_from_replay`
  (a replayed minibatch, before the gradient step: WocaR-DQN's worst-attack Q-network trains
  there), :meth:`RobustnessPlugin.target_action_scores` (what the TD target's next action is
  chosen by) and :meth:`RobustnessPlugin.q_loss` (the per-example loss, given the TD loss);
* **an extra loss term**: :meth:`RobustnessPlugin.regularizer_inputs` outside the gradient tape
  (the inner search; ``None``: no term), then :meth:`RobustnessPlugin.regularizer` inside it;
* **state of its own in the agent's checkpoint**: :meth:`RobustnessPlugin.checkpoint_modules`
  (WocaR's worst-attack networks and their optimiser), saved and restored with the agent's,
  and each seed's slice of it on the seed axis (:meth:`RobustnessPlugin.seed_axis_state`,
  moved by ``export`` and ``import_seed``);
* **a phase between iterations**: :meth:`RobustnessPlugin.before_iteration` (a schedule, a learned
  adversary's training) and :meth:`RobustnessPlugin.after_iteration` (what the iteration's logs
  carry), and :meth:`RobustnessPlugin.record` after the driver's bookkeeping of an update.

The settings a plug-in reads are every config's :class:`RobustFields` (``robust``, ``robust_eps``,
...); a method's typed config (:class:`RobustMethod`, ``robust=SA(eps=0.05)``) sets them and enters
:data:`ROBUST_CONFIGS` through :func:`register_robust_config` (:mod:`agents.robustness.configs`).

:class:`RobustnessPlugin` itself is the plug-in of ``robust=None``: every hook leaves the agent as
it is. The methods live in the robustness wing, above the algorithms, and enter
:data:`ROBUSTNESS` through :func:`register_robustness` when :mod:`agents` is imported
(:mod:`agents.robustness.robust`: ``"sa"``, ``"adv"``; :mod:`agents.robustness.atla`: ``"atla"``,
``"atla-sa"``; :mod:`agents.robustness.wocar`: ``"wocar"``). A new
method is one module there: a subclass and its registry entry.

>>> import agents
>>> agent = agents.PPO(env="CartPole-v1", num_envs=2, n_steps=8, preset=None)
>>> type(agent.robustness).__name__, agent.robustness.schedule is None
('RobustnessPlugin', True)
>>> sorted(ROBUSTNESS)
['adv', 'atla', 'atla-sa', 'sa', 'wocar']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
import tensorflow as tf

from agents.core.interface import AgentInterface
from robustgrad.checks import choice, nonnegative, number, positive_int, probability
from robustgrad.errors import ConfigError

__all__ = ["MAX_ROBUST_EPS", "MAX_ROBUST_KAPPA", "ROBUSTNESS", "ROBUST_CONFIGS", "WOCAR_BOUNDS",
           "WOCAR_FIELDS", "WOCAR_TERMS", "RobustFields", "RobustMethod", "RobustnessPlugin",
           "on_policy_saved_fields", "register_robust_config", "register_robustness",
           "robustness_for"]


MAX_ROBUST_EPS = 1e3
"""The largest ``robust_eps``: an L-inf observation radius in standard deviations (with
``normalize_obs``) or raw units. Published budgets are below 1 in either (SA-PPO on MuJoCo:
0.05-0.15 normalised; CartPole: 0.01-0.2 raw; Atari: a few 1/255 of a pixel), so 1,000 is far
above any real budget; 1e9 is a typo that would train against pure noise."""

MAX_ROBUST_KAPPA = 1e3
"""The largest ``robust_kappa``: the SA regulariser's weight against a policy loss of order 1.
Published settings are about 0.003-1 (SA-PPO on MuJoCo) and the tuned presets carry 3 and 0.5
(``agents/presets.json``), so 1,000, where the regulariser already swamps the return, is far
above any useful weight; 1e12 is a typo."""


class RobustnessPlugin:
    """The protocol (module doc), and the plug-in of ``robust=None`` (every hook a no-op).

    ``agent``: the agent it serves (its config, policy surface and random streams are read,
    never its private state written). ``schedule``: the eps/kappa schedule of the method
    (``None`` here), read by the Ray workers' policy state and the logs."""

    schedule: Any = None

    def __init__(self, agent: AgentInterface):
        self.agent = agent

    # -- what the agent perceives --------------------------------------------------------------
    def perceive(self, obs: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        """What the policy sees of the rollout's ``obs [(S,) N, d]`` at a step whose stateless
        seed is ``seed [2]`` int32 (inside the compiled rollout)."""
        return obs

    def learner_observations(self, obs: tf.Tensor) -> tf.Tensor:
        """What a Q-learner's update sees of a replayed minibatch ``obs [(S,) B, d]``."""
        return obs

    # -- what the policy objective optimises -------------------------------------------------
    def shape_advantages(self, batch: dict, advantages: tf.Tensor) -> tf.Tensor:
        """The advantages ``[(S,) B]`` the on-policy update optimises, given the rollout's
        transitions ``batch`` (``obs``, ``actions``, ``rewards`` (scaled when the agent scales
        them), ``next_obs`` (the observation each transition led to), ``terminated``; each
        ``[(S,) B, ...]``, ``B = n_steps * num_envs``) and its GAE ``advantages``; inside the
        compiled iteration, once per rollout, before the update."""
        return advantages

    def learn_from_replay(self, batch: dict) -> None:
        """A Q-learner's replayed minibatch ``batch`` (``obs`` (clean), ``actions``, ``rewards``,
        ``next_obs``, ``terminated``; ``[(S,) B, ...]``), inside the compiled update, before the
        gradient step's tape: a method that learns a model of its own from the replay trains
        it here."""
        return None

    def target_action_scores(self, next_obs: tf.Tensor, scores: tf.Tensor) -> tf.Tensor:
        """The scores ``[(S,) B, A]`` whose argmax is the next action of a Q-learner's TD target,
        given the algorithm's own ``scores`` (Double DQN: the online network's Q-values at
        ``next_obs``; else the target network's); the target network values that action."""
        return scores

    def q_loss(self, per_example: tf.Tensor, obs: tf.Tensor, actions: tf.Tensor,
               q: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
        """The per-example loss ``[(S,) B]`` a Q-learner minimises, given its TD loss
        ``per_example``, the online Q-values ``q [(S,) B, A]`` at ``obs`` (differentiable), the
        taken ``actions`` and the TD ``target`` (stopped); inside the gradient tape (before the
        importance-sampling weights and the mean)."""
        return per_example

    # -- an extra loss term --------------------------------------------------------------------
    def regularizer_inputs(self, obs: tf.Tensor) -> Any:
        """The term's inputs for a minibatch ``obs``, computed outside the gradient tape (an
        inner search), or ``None``: the method adds no term."""
        return None

    def regularizer(self, obs: tf.Tensor, inputs: Any) -> tuple[tf.Tensor, tf.Tensor]:
        """``(weighted term, term)`` for the loss and the logs, inside the gradient tape;
        zeros when ``inputs`` is ``None``."""
        return tf.constant(0.0), tf.constant(0.0)

    # -- the phase between iterations ----------------------------------------------------------
    def before_iteration(self, steps_done: int, total: int) -> dict:
        """Called before each training iteration at ``steps_done`` of a ``total``-step budget;
        returns logs for :meth:`after_iteration`."""
        return {}

    def after_iteration(self, logs: dict, extra: dict) -> None:
        """Add to an iteration's ``logs`` (``extra``: what :meth:`before_iteration` returned)."""

    def record(self, logs: dict) -> None:
        """After the driver's bookkeeping of an update (``agent.history`` and each seed's)."""

    # -- state of its own in the agent's checkpoint ----------------------------------------------
    def checkpoint_modules(self) -> dict[str, Any]:
        """``name -> trackable`` (networks, optimiser state) the method learns and keeps between
        iterations, written in the agent's checkpoint under ``robustness/`` and restored with it
        (:meth:`agents.Agent.save`, :func:`agents.load`); ``{}``: nothing to keep. What a method
        recomputes from the step counts (its eps/kappa schedule) does not belong here. A
        checkpoint saved before the method kept its state loads without it (the state starts
        fresh)."""
        return {}

    def seed_axis_state(self) -> tuple[list[tf.Variable], list[tf.Variable]]:
        """``(per seed, shared)``: the variables of :meth:`checkpoint_modules` that carry the
        seed axis (``[S, ...]`` on an agent of ``S > 1`` seeds, an ordinary agent's shapes for
        one) and those all seeds share, in the same order for any ``S``: what
        :meth:`agents.Agent.export` and ``import_seed`` move with the algorithm's own
        (:func:`agents.backends.seed_axis.export_seed`; WocaR's worst-attack networks). ``([],
        [])``: nothing of its own."""
        return [], []


class _AxisOfOne(RobustnessPlugin):
    """The hooks of one seed's plug-in (written for ``[B, ...]``) on the seed axis of one
    (``[1, B, ...]``): each takes ``x[0]`` and gives its tensors back with the axis of one.
    The on-policy hooks run without AutoGraph (no tensor control flow in them, nor in the
    methods' hooks they call: those branch on the config's Python values only), which the
    update's converted loop bodies would otherwise apply to them and all they call."""

    def __init__(self, plugin: RobustnessPlugin):
        super().__init__(plugin.agent)
        self.plugin = plugin

    @tf.autograph.experimental.do_not_convert
    def perceive(self, obs: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        return self.plugin.perceive(obs[0], seed)[None]

    @tf.autograph.experimental.do_not_convert
    def shape_advantages(self, batch: dict, advantages: tf.Tensor) -> tf.Tensor:
        one = {k: v[0] for k, v in batch.items()}
        return self.plugin.shape_advantages(one, advantages[0])[None]

    @tf.autograph.experimental.do_not_convert
    def regularizer_inputs(self, obs: tf.Tensor) -> Any:
        return self.plugin.regularizer_inputs(obs[0])

    @tf.autograph.experimental.do_not_convert
    def regularizer(self, obs: tf.Tensor, inputs: Any) -> tuple[tf.Tensor, tf.Tensor]:
        term, value = self.plugin.regularizer(obs[0], inputs)
        return term[None], value[None]

    def learner_observations(self, obs: tf.Tensor) -> tf.Tensor:
        return self.plugin.learner_observations(obs[0])[None]

    def learn_from_replay(self, batch: dict) -> None:
        self.plugin.learn_from_replay({k: v[0] for k, v in batch.items()})

    def target_action_scores(self, next_obs: tf.Tensor, scores: tf.Tensor) -> tf.Tensor:
        return self.plugin.target_action_scores(next_obs[0], scores[0])[None]

    def q_loss(self, per_example: tf.Tensor, obs: tf.Tensor, actions: tf.Tensor,
               q: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
        return self.plugin.q_loss(per_example[0], obs[0], actions[0], q[0], target[0])[None]


def on_seed_axis(plugin: RobustnessPlugin, num_seeds: int) -> RobustnessPlugin:
    """The training hooks of ``plugin`` (the on-policy ones and a Q-learner's) for an agent whose
    training tensors carry the seed axis ``[S, ...]``, one seed included: the plug-in itself for
    ``S > 1`` (it works on the axis) and for ``robust=None``; one seed's plug-in sees its own
    ``[B, ...]`` tensors."""
    if num_seeds > 1 or type(plugin) is RobustnessPlugin:
        return plugin
    return _AxisOfOne(plugin)


_TABLE: dict[str, Callable[[Any], RobustnessPlugin]] = {}
ROBUSTNESS: Mapping[str, Callable[[Any], RobustnessPlugin]] = MappingProxyType(_TABLE)
"""``robust`` value -> the factory of its plug-in (read-only; :func:`register_robustness`)."""


def register_robustness(name: str, factory: Callable[[Any], RobustnessPlugin]) -> None:
    """Enter ``factory`` (``agent -> plug-in``) as the plug-in of ``robust=name``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory must be callable (agent -> plug-in), got {factory!r}")
    if _TABLE.get(name, factory) is not factory:
        raise ValueError(f"name: robust={name!r} is already {_TABLE[name]!r}")
    _TABLE[name] = factory


def robustness_for(agent: AgentInterface) -> RobustnessPlugin:
    """The plug-in of ``agent.config.robust`` (``None``: :class:`RobustnessPlugin`)."""
    name = getattr(agent.config, "robust", None)
    if name is None:
        return RobustnessPlugin(agent)
    if name not in _TABLE:
        raise ValueError(f"robust: no robust training method {name!r} is registered (one of "
                         f"{', '.join(repr(n) for n in sorted(_TABLE))})")
    return _TABLE[name](agent)


class RobustMethod:
    """A typed robust training config: ``PPO(robust=SA(eps=0.05, kappa=0.5))``; the methods'
    own (:mod:`agents.robustness.configs`) enter :data:`ROBUST_CONFIGS` through
    :func:`register_robust_config`.

    It stands for the flat ``robust*`` fields of :class:`agents.core.config.AgentConfig` that it
    sets (:meth:`fields`); the config keeps those (``config.robust`` becomes the method's name),
    so a config saves, loads and prints as before and agents saved by earlier versions load. A
    field left ``None`` keeps the config's value (the preset's or the default), so
    ``SA(eps=0.02)`` on a DQN keeps its preset's kappa. ``config.robust_spec`` reads the fields
    back as one (:meth:`from_config`)."""

    name: ClassVar[str]
    _FIELDS: ClassVar[dict[str, str]]  # attribute -> config field

    def fields(self) -> dict:
        """The config fields this method sets: ``robust`` and each attribute given."""
        out = {"robust": self.name}
        for attr, field in self._FIELDS.items():
            value = getattr(self, attr)
            if value is not None:
                out[field] = value
        return out

    @classmethod
    def from_config(cls, config: Any) -> RobustMethod:
        """The typed config of ``config``'s flat fields (``config.robust_spec``)."""
        return cls(**{attr: getattr(config, field) for attr, field in cls._FIELDS.items()})


_CONFIGS: dict[str, type[RobustMethod]] = {}
ROBUST_CONFIGS: Mapping[str, type[RobustMethod]] = MappingProxyType(_CONFIGS)
"""``robust`` value -> its typed config class (read-only; :func:`register_robust_config`)."""


def register_robust_config(cls: type[RobustMethod], *names: str) -> type[RobustMethod]:
    """Enter ``cls`` as the typed config of ``robust=name`` for each of ``names`` (what
    ``config.robust_spec`` builds); returns ``cls``."""
    if not (isinstance(cls, type) and issubclass(cls, RobustMethod)):
        raise TypeError(f"cls must be a RobustMethod subclass, got {cls!r}")
    if not names or not all(isinstance(n, str) and n for n in names):
        raise TypeError(f"names must be non-empty strings, got {names!r}")
    for name in names:
        if _CONFIGS.get(name, cls) is not cls:
            raise ValueError(f"names: robust={name!r} already has the typed config "
                             f"{_CONFIGS[name].__name__}")
        _CONFIGS[name] = cls
    return cls


WOCAR_BOUNDS = ("ibp", "crown", "crown-ibp")
"""Bound methods of WocaR's admissible actions (``wocar_bound``; :mod:`agents.robustness.wocar`)."""

WOCAR_TERMS = ("spread", "margin")
"""WocaR-DQN's worst-case terms (``wocar_term``; :class:`agents.robustness.wocar.WocaRDQNPlugin`)."""


def _flag(value: Any, name: str) -> bool:
    """``value`` if it is a bool, else a ``ConfigError`` naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    return bool(value)


WOCAR_FIELDS: Mapping[str, Callable[[Any, str], Any]] = MappingProxyType({
    "wocar_weight": lambda v, n: number(v, n, minimum=0, maximum=MAX_ROBUST_KAPPA),
    "wocar_bound": lambda v, n: choice(v, n, WOCAR_BOUNDS),
    "wocar_warmup": probability,
    "wocar_admissible_eps": lambda v, n: number(v, n, minimum=0, min_inclusive=False,
                                                maximum=MAX_ROBUST_EPS),
    "wocar_importance": _flag,
    "wocar_weight_over_run": _flag,
    "wocar_search_per_rollout": _flag,
    "wocar_smoothness_every": lambda v, n: positive_int(v, n, maximum=1000),
    "wocar_double": _flag,
    "wocar_search_steps": lambda v, n: positive_int(v, n, minimum=0, maximum=1000),
    "wocar_q_epochs": lambda v, n: positive_int(v, n, maximum=100_000),
    "wocar_q_minibatches": lambda v, n: positive_int(v, n, maximum=65_536),
    "wocar_q_min_rows": lambda v, n: positive_int(v, n, maximum=65_536),
    "wocar_q_every": lambda v, n: positive_int(v, n, maximum=100_000),
    "wocar_term": lambda v, n: choice(v, n, WOCAR_TERMS),
    "wocar_term_start": probability,
    "wocar_q_lr": lambda v, n: number(v, n, minimum=0, min_inclusive=False, maximum=1),
    "wocar_tau": lambda v, n: number(v, n, minimum=0, min_inclusive=False, maximum=1),
    "wocar_gamma": lambda v, n: number(v, n, minimum=0, maximum=1, max_inclusive=False),
})
"""WocaR's flat config fields (``robust="wocar"``; :class:`agents.WocaR` sets them) -> the check
of a value given (``None``: WocaR's default, :attr:`agents.WocaR.DEFAULTS`): one-line
``ConfigError`` naming the field and its range."""

_DEFAULT_WARMUP = 0.75  # RobustFields.robust_eps_warmup's default

_SAVED_BEFORE: Mapping[str, str] = MappingProxyType({"wocar_warmup": "robust_eps_warmup"})
"""A WocaR field added after agents were saved -> the field whose value such an agent's
``robust="wocar"`` read instead (:meth:`RobustFields.saved_fields`)."""


@dataclass
class RobustFields:
    """The settings of robust training, fields of every agent's config
    (:class:`agents.core.config.AgentConfig`): the plug-in of ``robust`` reads them (an algorithm
    never does); a typed config (:class:`RobustMethod`) sets them."""

    robust: str | RobustMethod | None = None
    """Robust training against observation perturbations (:mod:`agents.robustness.robust`): ``None``
    (plain training), ``"sa"`` (state-adversarial regulariser: SA-PPO/SA-A2C's
    ``kappa * max KL(pi(.|s) || pi(.|s_hat))``, SA-DQN's hinge on the greedy action's Q-margin;
    Zhang et al., NeurIPS 2020), ``"adv"`` (train on observations attacked by
    ``robust_attack``) or ``"atla"`` / ``"atla-sa"`` (PPO, A2C: alternate with a learned
    adversary, plus SA's regulariser for ``"atla-sa"``; :mod:`agents.robustness.atla`). REINFORCE has no
    robust variant. A typed config
    (:mod:`agents.robustness.configs`: ``robust=SA(eps=0.05, kappa=0.5)``) sets
    this field and the ``robust_*`` fields it names (``robust_spec`` reads them back as one)."""
    robust_eps: float = 0.1
    """L-inf radius of the observation ball, in standard deviations when ``normalize_obs``
    (inside the normaliser, as the papers) and in raw units otherwise."""
    robust_kappa: float = 0.1
    """Weight kappa of the SA regulariser (``robust="sa"``). The default is the SA-PPO paper's
    usual value (0.003-1 on MuJoCo, in normalised units); the kappa that works depends on the
    environment and its units, so tuned presets carry their own (``ppo-CartPole-v1``: 3, since
    at raw eps 0.05 kappa 0.1 kept a median 100.5 under attack, 1 kept 254.5 and 3 kept 500;
    docs/benchmarks/robust-rl.md). ``dqn-CartPole-v1`` carries 0.5: SA-DQN trained at eps 0.02
    kept a median of 500 under the strongest attack with 0.5 and 397 with 0.1 (5 seeds)."""
    robust_steps: int = 10
    """Steps of the inner maximisation (step size ``robust_eps / robust_steps``)."""
    robust_method: str = "pgd"
    """Inner maximiser of SA-PPO/SA-A2C's KL (``robust="sa"``): ``"pgd"`` (the ``mad``
    attack), ``"sgld"`` (SA-PPO's stochastic gradient Langevin dynamics,
    :func:`agents.robustness.observation_attacks.sgld_mad_attack`) or ``"convex"`` (no search: CROWN-IBP
    bounds over the ball, :func:`agents.robustness.robust.convex_policy_regularizer`). SA-DQN takes
    ``"pgd"`` or ``"convex"``."""
    robust_eps_warmup: float = 0.75
    """Fraction of the ``learn`` budget over which eps and kappa rise linearly from 0 to
    ``robust_eps`` and ``robust_kappa`` (0: full strength from the first update).
    ``robust="wocar"`` has its own, ``wocar_warmup`` (this one must stay at its default)."""
    atla_start_radius: float | None = None
    """ATLA's adversary radius curriculum (``robust="atla"`` / ``"atla-sa"``; :mod:`agents.robustness.atla`):
    ``None`` trains the adversary at the agent's radius (the schedule's eps, rising from 0); a
    radius >= ``robust_eps`` (same units) trains it at a radius shrinking linearly from this one
    to ``robust_eps`` over ``robust_eps_warmup`` of the budget, while the agent meets its
    perturbations at the schedule's eps (:func:`agents.robustness.atla.adversary_radius`). At
    most :data:`MAX_ROBUST_EPS`."""
    robust_attack: str = "action"
    """The attack of ``robust="adv"`` (``"random"``, ``"action"``, ``"mad"`` or ``"critic"``;
    see :mod:`agents.robustness.observation_attacks`). The default, PGD away from the greedy action, is the
    attack of the adversarial-training baselines (Kos & Song 2017, Pattanaik et al. 2018); on
    CartPole it did better than ``"mad"``, which at 100k steps kept a median of 128.5 / 170
    under Robust Sarsa at eps 0.05 against ``"action"``'s 295.5 / 246.5 (seeds 3 / 0); at 200k
    steps ``"action"`` kept a median of 386.5 under the strongest attack at eps 0.05 over 5
    seeds, vanilla PPO 38 (docs/benchmarks/robust-rl.md)."""

    wocar_weight: float | None = None
    """WocaR's weight of the worst-attack value in the policy objective (``robust="wocar"``;
    :mod:`agents.robustness.wocar`), rising linearly to this value over ``wocar_warmup`` of the
    budget; at most 1000. PPO/A2C: the update optimises ``n(A) + w * n(Q_w(s, a))`` (each
    standardised over the batch; ``None``: 0.8, :attr:`agents.WocaR.DEFAULTS`). DQN (in
    [0, 1]): the TD target's next action is ``argmax_a (1 - w) Q(s', a) + w Q_w(s', a)``
    (``None``: 0.05, :attr:`agents.WocaR.DQN_DEFAULTS`)."""
    wocar_bound: str | None = None
    """The bound method of WocaR's admissible actions (``"ibp"``, ``"crown"`` or ``"crown-ibp"``;
    costs in :mod:`agents.robustness.wocar`). ``None``: ``"ibp"``."""
    wocar_warmup: float | None = None
    """WocaR's warm-up, in [0, 1]: the fraction of the ``learn`` budget over which its eps, kappa
    and worst-case weight rise from 0 (``robust="wocar"`` reads this, not
    ``robust_eps_warmup``). ``None``: :attr:`agents.WocaR.DEFAULTS` (0.3; DQN 0.75; an agent
    saved before this field existed loads with the ``robust_eps_warmup`` it trained with)."""
    wocar_admissible_eps: float | None = None
    """PPO/A2C: the radius of the admissible sets in the worst-attack critic's target, in
    (0, 1000] (``None``: the schedule's eps, the attack's own budget; the paper's PPO code: a
    fixed 0.01)."""
    wocar_importance: bool | None = None
    """Whether the smoothness term (DQN: the worst-case term) is weighted by the state
    importance ``ω(s)`` (the paper's text; its PPO and DQN code weight all states alike).
    ``None``: ``True``."""
    wocar_weight_over_run: bool | None = None
    """Whether the worst-case weight rises over the whole run (the paper's ``linear`` schedule,
    ``w * t / T``) instead of over ``wocar_warmup``. ``None``: ``False``."""
    wocar_search_per_rollout: bool | None = None
    """PPO/A2C: whether the smoothness term's search runs once per rollout instead of on every
    minibatch of every epoch (SA-PPO's and the paper's code). ``None``: ``True``."""
    wocar_smoothness_every: int | None = None
    """PPO/A2C: the smoothness term on update steps ``0, k, 2k, ...`` of each iteration's
    update, weighted so the update's weights sum to its steps (the steps between skip the
    policy's pass on ``s_hat``; :meth:`agents.robustness.wocar.WocaRPlugin.regularizer`), in
    [1, 1000]. ``None``: 2 on a discrete policy, 1 on Box actions
    (:attr:`agents.WocaR.DEFAULTS`); an agent saved before the field existed: 1, as it
    trained."""
    wocar_double: bool | None = None
    """Whether the worst admissible next action of the worst-attack target is chosen by the
    critic ``Q_w`` and valued by its target copy (the paper's code; Double DQN's decoupling: a
    min over one noisy estimate is biased low) instead of the target copy's own min.
    ``None``: ``False``."""
    wocar_search_steps: int | None = None
    """PPO/A2C on Box actions: projected sign steps of the worst-action search in the admissible
    box after its corners, in [0, 1000] (:func:`agents.robustness.wocar_box.worst_action_in_box`;
    the discrete variant enumerates its actions). ``None``: 10."""
    wocar_q_epochs: int | None = None
    """PPO/A2C: epochs of the worst-attack critic over each rollout, in [1, 100000]. ``None``: 4;
    on Box actions 10 (:attr:`agents.WocaR.BOX_DEFAULTS`; an agent saved before
    ``wocar_search_steps`` existed: 4)."""
    wocar_q_minibatches: int | None = None
    """PPO/A2C: minibatches per critic epoch, in [1, 65536]. ``None``: 4; on Box actions 32
    (:attr:`agents.WocaR.BOX_DEFAULTS`; an agent saved before ``wocar_search_steps`` existed:
    4)."""
    wocar_q_min_rows: int | None = None
    """PPO/A2C: the fewest rows of one critic minibatch, in [1, 65536]: a rollout of ``n`` rows
    gets ``min(wocar_q_minibatches, max(1, n // wocar_q_min_rows))`` minibatches. ``None``: 1
    (a rollout of fewer rows than minibatches: one row each); on Box actions 8
    (:attr:`agents.WocaR.BOX_DEFAULTS`; an agent saved before the field existed: 1, as it
    trained)."""
    wocar_q_every: int | None = None
    """DQN: gradient steps of the agent per step of the worst-attack network, in [1, 100000]
    (the paper's DQN code's ``worst_rate``). ``None``: 10."""
    wocar_term: str | None = None
    """DQN: the worst-case term of the loss, ``"spread"`` (the paper's: every Q-value's IBP
    bounds over the ball kept near its target) or ``"margin"`` (SA-DQN's hinge on the greedy
    action's certified margin, its lower bound over the ball by ``wocar_bound``). ``None``:
    ``"spread"``."""
    wocar_term_start: float | None = None
    """DQN: the fraction of the budget, in [0, 1], before which the worst-case term is off
    (its weight ``robust_kappa`` then rises from 0 to full at ``wocar_warmup``, or at once
    when that has passed): TD learning first, as the paper starts from a trained agent.
    ``None``: 0 (the term rises with eps from the start)."""
    wocar_q_lr: float | None = None
    """Adam learning rate of the worst-attack network, in (0, 1]. ``None``: 1e-3."""
    wocar_tau: float | None = None
    """Polyak rate of the worst-attack network's target copy per step, in (0, 1]. ``None``:
    0.01."""
    wocar_gamma: float | None = None
    """The worst-attack network's own discount, in [0, 1) (``None``: the agent's ``gamma``). A
    value closer to 1 than the agent's gives the critic a longer horizon than the policy's
    advantages: an attack whose cost lands later than ``1 / (1 - gamma)`` steps (Robust Sarsa's
    drift on CartPole: 150-240 steps, against the ~50 of gamma 0.98) is visible to ``Q_w``."""

    def check_robust(self, max_steps: int) -> None:
        """Check the fields (``ConfigError`` naming one; ``max_steps``: the most
        ``robust_steps``), after setting those a typed config names."""
        if isinstance(self.robust, RobustMethod):  # a typed config: the flat fields it names
            typed = self.robust
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            for name, value in typed.fields().items():
                given = getattr(self, name)
                if (name != "robust" and name in defaults and given != defaults[name]
                        and given != value):
                    raise ConfigError(
                        f"{name}: robust={typed!r} sets it to {value!r} and {name}={given!r} "
                        f"too; give it once (in the typed config, or as {name} with "
                        f"robust={typed.name!r})")
                setattr(self, name, value)
        if self.robust is not None:  # the methods the robustness wing registered
            choice(self.robust, "robust", tuple(ROBUSTNESS) or ("sa", "adv", "atla", "atla-sa"))
        nonnegative(self.robust_eps, "robust_eps")
        nonnegative(self.robust_kappa, "robust_kappa")
        for name, most, what in (
                ("robust_eps", MAX_ROBUST_EPS, "an observation radius (standard deviations "
                 "with normalize_obs, else raw units); published budgets are below 1"),
                ("robust_kappa", MAX_ROBUST_KAPPA, "the SA regulariser's weight; published "
                 "settings are below 10")):
            if getattr(self, name) > most:
                raise ConfigError(f"{name} must be a number <= {most:g}, got "
                                  f"{getattr(self, name)!r}: {what}")
        self.robust_steps = positive_int(self.robust_steps, "robust_steps", maximum=max_steps)
        choice(self.robust_method, "robust_method", ("pgd", "sgld", "convex"))
        probability(self.robust_eps_warmup, "robust_eps_warmup")
        if self.atla_start_radius is not None:
            if self.robust not in ("atla", "atla-sa"):
                raise ConfigError(f"atla_start_radius: only with robust='atla' or 'atla-sa' (the "
                                 f"learned adversary's curriculum), got robust={self.robust!r}")
            self.atla_start_radius = number(self.atla_start_radius, "atla_start_radius",
                                            minimum=self.robust_eps)
            if self.atla_start_radius > MAX_ROBUST_EPS:
                raise ConfigError(f"atla_start_radius must be a number <= {MAX_ROBUST_EPS:g}, "
                                  f"got {self.atla_start_radius!r}: the learned adversary's "
                                  f"first radius, in the units of robust_eps (standard "
                                  f"deviations with normalize_obs, else raw units)")
        choice(self.robust_attack, "robust_attack", ("random", "action", "mad", "critic"))
        self._check_wocar()

    _WOCAR_SEARCHES: ClassVar[tuple[str, ...]] = ("pgd", "sgld")
    """The inner maximisers WocaR's smoothness term can use with this algorithm."""

    _WOCAR_ONLY_ON_POLICY: ClassVar[tuple[str, ...]] = ()
    """WocaR fields this algorithm does not read (refused by name; DQN's:
    :class:`agents.algorithms.dqn_config.DQNConfig`)."""

    _WOCAR_ONLY_DQN: ClassVar[tuple[str, ...]] = ("wocar_q_every", "wocar_term",
                                                  "wocar_term_start")
    """WocaR-DQN's fields, which WocaR-PPO/A2C do not read (refused by name; DQN's config
    clears it)."""

    def _check_wocar(self) -> None:
        """WocaR's settings (each ``wocar_*`` field in its range, :data:`WOCAR_FIELDS`): only with
        ``robust="wocar"``, eps > 0, a search inner maximiser, ``robust_eps_warmup`` left at its
        default (WocaR's warm-up is ``wocar_warmup``)."""
        for name in WOCAR_FIELDS:
            if getattr(self, name) is not None and self.robust != "wocar":
                raise ConfigError(f"{name}: a WocaR setting, only with robust='wocar' (WocaR "
                                  f"combines with no other robust method), got robust="
                                  f"{self.robust!r}")
        if self.robust != "wocar":
            return
        number(self.robust_eps, "robust_eps", minimum=0, min_inclusive=False)
        if self.robust_eps_warmup != _DEFAULT_WARMUP:
            raise ConfigError(f"robust_eps_warmup: WocaR's warm-up is wocar_warmup "
                              f"(agents.WocaR(warmup=...), --eps-warmup with --robust wocar), "
                              f"got robust_eps_warmup={self.robust_eps_warmup!r}")
        for name, check in WOCAR_FIELDS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if name in self._WOCAR_ONLY_ON_POLICY:
                raise ConfigError(f"{name}: a setting of WocaR-PPO/A2C (its rollout critic "
                                  f"and smoothness term), which WocaR-DQN does not read, got "
                                  f"{name}={value!r}")
            if name in self._WOCAR_ONLY_DQN:
                raise ConfigError(f"{name}: a setting of WocaR-DQN (its worst-attack network's "
                                  f"step rate on the replay), which WocaR-PPO/A2C do not read, "
                                  f"got {name}={value!r}")
            setattr(self, name, check(value, name))
        if self.robust_method not in self._WOCAR_SEARCHES:
            raise ConfigError(f"robust_method: WocaR weights the KL at a searched s_hat by the "
                              f"state's importance; {' or '.join(map(repr, self._WOCAR_SEARCHES))}"
                              f", got {self.robust_method!r}")

    @staticmethod
    def saved_fields(saved: dict) -> dict:
        """A saved config dict (``config.json``) as this version reads it: a ``robust="wocar"``
        agent saved before a WocaR field existed gets the value it trained with (its
        ``wocar_warmup`` is the ``robust_eps_warmup`` it read then, which goes back to its
        default), so it learns on as before; ``saved`` itself otherwise.

        >>> RobustFields.saved_fields({"robust": "wocar", "robust_eps_warmup": 0.3})
        {'robust': 'wocar', 'robust_eps_warmup': 0.75, 'wocar_warmup': 0.3}
        """
        if saved.get("robust") != "wocar":
            return saved
        out = dict(saved)
        for field, old in _SAVED_BEFORE.items():
            if field not in out and old in out:
                out[field] = out[old]
                out[old] = _DEFAULT_WARMUP
        return out

    @property
    def robust_spec(self) -> RobustMethod | None:
        """The robust training fields as one typed config (:mod:`agents.robustness.configs`:
        ``SA``, ``Adversarial``, ``ATLA``, ``WocaR``), or ``None`` (``robust=None``, or a
        method without a typed config)."""
        cls = ROBUST_CONFIGS.get(self.robust) if isinstance(self.robust, str) else None
        if cls is None:  # robust=None, or a method registered without a typed config
            return None
        return cls.from_config(self)


def on_policy_saved_fields(saved: dict) -> dict:
    """A saved on-policy (PPO, A2C) config dict as this version reads it: those of
    :meth:`RobustFields.saved_fields`; a ``robust="wocar"`` agent saved before
    ``wocar_search_steps`` existed keeps the worst-attack critic's budget it trained with, 4
    epochs of 4 minibatches, where it left the field unset (on Box actions today's defaults are
    10 x 32, :attr:`agents.WocaR.BOX_DEFAULTS`); one saved before ``wocar_smoothness_every``
    existed keeps the smoothness term on every update step (today's discrete default: every
    other); one saved before ``wocar_q_min_rows`` existed, critic minibatches of one row and
    up (today's Box default: 8). ``OnPolicyConfig.saved_fields``.

    >>> old = on_policy_saved_fields({"robust": "wocar", "wocar_q_epochs": None})
    >>> [old[f"wocar_{k}"] for k in ("q_epochs", "q_minibatches", "smoothness_every", "q_min_rows")]
    [4, 4, 1, 1]
    >>> new = {"robust": "wocar", "wocar_q_epochs": None, "wocar_search_steps": None,
    ...        "wocar_smoothness_every": None, "wocar_q_min_rows": None}
    >>> on_policy_saved_fields(new) == new   # saved by this version
    True
    """
    out = RobustFields.saved_fields(saved)
    if out.get("robust") != "wocar":
        return out
    out = dict(out)
    if "wocar_search_steps" not in out:
        for name in ("wocar_q_epochs", "wocar_q_minibatches"):
            if out.get(name) is None:
                out[name] = 4
    if "wocar_smoothness_every" not in out:
        out["wocar_smoothness_every"] = 1
    if "wocar_q_min_rows" not in out:
        out["wocar_q_min_rows"] = 1
    return out
