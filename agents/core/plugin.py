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
* **a phase between iterations**: :meth:`RobustnessPlugin.before_iteration` (a schedule, a learned
  adversary's training) and :meth:`RobustnessPlugin.after_iteration` (what the iteration's logs
  carry), and :meth:`RobustnessPlugin.record` after the driver's bookkeeping of an update.

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

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import tensorflow as tf

from agents.core.interface import AgentInterface

__all__ = ["ROBUSTNESS", "ROBUST_CONFIGS", "RobustMethod", "RobustnessPlugin", "register_robust_config",
           "register_robustness", "robustness_for"]


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
