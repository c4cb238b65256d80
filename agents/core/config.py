"""The configuration every agent shares: :class:`AgentConfig`, documented fields, validated early.

Each algorithm's own config sits beside its code (:class:`agents.algorithms.ppo.PPOConfig`,
:class:`agents.algorithms.onpolicy.OnPolicyConfig`, :class:`agents.algorithms.a2c.A2CConfig`,
:class:`agents.algorithms.reinforce.REINFORCEConfig`,
:class:`agents.algorithms.dqn_config.DQNConfig`; all importable from :mod:`agents.config`), the
typed robust configs in the robustness wing (:mod:`agents.robustness.configs`).

Each field carries a docstring (the string literal under it). ``__post_init__``
validates everything it can before an environment is built, against the bounds of
:mod:`agents.core.limits`, and raises ``ValueError`` naming the offending field.
``to_dict``/``from_dict`` round-trip through JSON (an env factory is not serialisable: it is
saved as ``None`` and must be passed again to :func:`agents.load`).
:func:`agents.core.presets.make_config` builds a config from a tuned preset (the table
``presets.json``) and overrides.

>>> AgentConfig(num_envs=4).to_dict()["num_envs"]
4
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agents.core.limits import MAX_ASYNC_ENVS, MAX_HIDDEN_SIZE, MAX_NUM_ENVS, MAX_REPEATS, MAX_TOTAL_STEPS
from agents.core.plugin import RobustFields
from agents.envs import check_env_id
from agents.graph_envs import GRAPH_ENV_IDS
from robustgrad.checks import (
    MAX_LEARNING_RATE,
    ArgumentTypeError,
    choice,
    number,
    positive_int,
    probability,
)
from robustgrad.errors import ConfigError


def positive(value: Any, name: str) -> float:
    """A finite number > 0 (a learning rate, a clip coefficient)."""
    return number(value, name, minimum=0, min_inclusive=False)


@dataclass
class _AgentFields:
    """The fields of :class:`AgentConfig` but robust training's (:class:`RobustFields`)."""

    env: Any = "CartPole-v1"
    """A gymnasium id (``"CartPole-v1"``) or a factory returning a ``gymnasium.Env``."""
    num_envs: int = 1
    """Number of parallel environments in the training ``gymnasium.vector`` env."""
    async_envs: bool = False
    """Step the environments in subprocesses (``AsyncVectorEnv``) instead of a loop."""
    seed: int = 0
    """Seed for the environments, the initial weights and all sampling."""
    gamma: float = 0.99
    """Discount factor."""
    learning_rate: float = 2.5e-4
    """Adam learning rate (Adam's epsilon is 1e-5)."""
    max_grad_norm: float | None = 0.5
    """Clip gradients to this global norm (``None``: no clipping). Non-finite gradients are
    always rejected by the guard."""
    hidden_sizes: tuple = (64, 64)
    """Hidden layer sizes of each network."""
    activation: str = "tanh"
    """Hidden activation: ``"tanh"`` or ``"relu"``."""
    normalize_obs: bool = False
    """Normalise observations with running statistics (inside the model, saved with it)."""
    normalize_reward: bool = False
    """Scale rewards by the running standard deviation of the discounted return."""
    max_nonfinite_updates: int = 5
    """Stop training (``NonFiniteTrainingError``) after this many consecutive updates whose
    every gradient step was rejected as non-finite."""
    checkpoint_dir: str | None = None
    """Directory for periodic checkpoints (and the crash checkpoint of a failing env)."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many environment steps (0: only at the end of ``learn``)."""
    jit_compile: bool = False
    """Compile the update step with XLA. Off by default: on a 2-core CPU it made the PPO
    CartPole update ~1.5x faster but costs ~15 s of compilation; measure on your platform."""
    backend: str = "gymnasium"
    """Where the environments run: ``"gymnasium"`` (Python envs, any id or factory) or
    ``"graph"`` (the TensorFlow-ops envs of :mod:`agents.graph_envs`, stepped inside the
    compiled iteration; only for :data:`agents.graph_envs.GRAPH_ENV_IDS`)."""
    preset: str | None = None
    """Name of the tuned preset (``agents/presets.json``) the other fields were taken from
    (``None``: dataclass defaults and overrides only). Recorded, not re-applied on load."""


@dataclass
class AgentConfig(RobustFields, _AgentFields):
    """Fields common to every agent: those of ``_AgentFields`` (the environments, the seed, the
    networks, the optimiser, checkpoints, the backend; below), then robust training's
    (:class:`agents.core.plugin.RobustFields`, read by the robustness plug-in only)."""

    def __post_init__(self):
        check_env_id(self.env, "env")
        self.num_envs = positive_int(self.num_envs, "num_envs", maximum=MAX_NUM_ENVS)
        if self.async_envs and self.num_envs > MAX_ASYNC_ENVS:
            raise ConfigError(f"num_envs must be an int in [1, {MAX_ASYNC_ENVS}] with "
                              f"async_envs=True (one subprocess per environment), got "
                              f"{self.num_envs}")
        number(self.learning_rate, "learning_rate", minimum=0, min_inclusive=False,
               maximum=MAX_LEARNING_RATE)
        probability(self.gamma, "gamma")
        if self.max_grad_norm is not None:
            positive(self.max_grad_norm, "max_grad_norm")
        if isinstance(self.hidden_sizes, (str, bytes)) or not hasattr(self.hidden_sizes,
                                                                      "__iter__"):
            raise ConfigError(f"hidden_sizes must be a sequence of ints >= 1, got "
                             f"{self.hidden_sizes!r}")
        self.hidden_sizes = tuple(positive_int(h, "hidden_sizes", maximum=MAX_HIDDEN_SIZE)
                                  for h in self.hidden_sizes)
        choice(self.activation, "activation", ("tanh", "relu"))
        self.max_nonfinite_updates = positive_int(self.max_nonfinite_updates,
                                                  "max_nonfinite_updates")
        self.checkpoint_every = positive_int(self.checkpoint_every, "checkpoint_every",
                                             minimum=0, maximum=MAX_TOTAL_STEPS)
        self.seed = positive_int(self.seed, "seed", minimum=0)  # NumPy refuses negative seeds
        choice(self.backend, "backend", ("gymnasium", "graph"))
        if self.backend == "graph":
            if self.env not in GRAPH_ENV_IDS:
                raise ConfigError(f"backend='graph' needs env to be one of {GRAPH_ENV_IDS} "
                                 f"(the compiled environments), got {self.env!r}")
            if self.async_envs:
                raise ConfigError("async_envs: the graph backend steps its environments inside "
                                 "the compiled iteration, not in subprocesses; async_envs=True "
                                 "is for backend='gymnasium'")
        if self.preset is not None and not isinstance(self.preset, str):
            raise ConfigError(f"preset must be a preset name or None, got {self.preset!r}")
        self.check_robust(MAX_REPEATS)  # robust training's fields (agents.core.plugin)

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict (an env factory becomes ``None``)."""
        d = dataclasses.asdict(self)
        if callable(self.env):
            d["env"] = None
        d["hidden_sizes"] = list(self.hidden_sizes)
        return d

    @classmethod
    def from_dict(cls, d: dict, env: Any = None) -> AgentConfig:
        """The config saved by :meth:`to_dict` (unknown keys ignored; ``env`` replaces a saved
        factory; a field added since it was saved: :meth:`RobustFields.saved_fields`)."""
        d = dict(d)
        if env is not None:
            d["env"] = env
        if d.get("env") is None:
            raise ConfigError("env: the saved agent was trained on an env factory; pass env=")
        names = {f.name for f in dataclasses.fields(cls)}
        d = cls.saved_fields(d)  # fields added since the agent was saved
        return cls(**{k: v for k, v in d.items() if k in names})


def check_seeds(seeds: Sequence[int] | None = None, num_seeds: int | None = None,
                first_seed: int = 0) -> list[int]:
    """The list of seeds from ``seeds`` (distinct ints >= 0) or ``num_seeds`` (an int >= 1:
    ``first_seed, first_seed + 1, ...``); exactly one of the two.

    >>> check_seeds(num_seeds=3, first_seed=4)
    [4, 5, 6]
    >>> check_seeds(num_seeds=0)
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: num_seeds must be an int >= 1, got 0
    """
    if (seeds is None) == (num_seeds is None):
        raise ConfigError("give exactly one of seeds (a list of ints) and num_seeds (an int)")
    if num_seeds is not None:
        n = positive_int(num_seeds, "num_seeds")
        return [first_seed + i for i in range(n)]
    if seeds is None or isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
        raise ArgumentTypeError(f"seeds must be a list of ints >= 0, got {seeds!r}")
    out = [positive_int(s, "seeds", minimum=0) for s in seeds]
    if not out:
        raise ConfigError("seeds must hold at least one seed, got []")
    if len(set(out)) != len(out):
        raise ConfigError(f"seeds must be distinct, got {out}")
    return out
