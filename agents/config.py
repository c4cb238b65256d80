"""Configuration dataclasses shared by the agents: documented fields, validated early.

Each field carries a docstring (the string literal under it). ``__post_init__``
validates everything it can before an environment is built, and raises
``ValueError`` naming the offending field. ``to_dict``/``from_dict`` round-trip
through JSON (an env factory is not serialisable: it is saved as ``None`` and must be
passed again to :func:`agents.load`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from agents.envs import check_env_id


def _positive(name, value, integer=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    if integer and int(value) != value:
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: must be positive, got {value!r}")


def _in_unit(name, value, closed_low=True):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            (0 <= value <= 1) if closed_low else (0 < value <= 1)):
        raise ValueError(f"{name}: must be in {'[' if closed_low else '('}0, 1], got {value!r}")


def _non_negative(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}: must be >= 0, got {value!r}")


@dataclass
class AgentConfig:
    """Fields common to every agent."""

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

    def __post_init__(self):
        check_env_id(self.env, "env")
        _positive("num_envs", self.num_envs, integer=True)
        _positive("learning_rate", self.learning_rate)
        _in_unit("gamma", self.gamma)
        if self.max_grad_norm is not None:
            _positive("max_grad_norm", self.max_grad_norm)
        self.hidden_sizes = tuple(int(h) for h in self.hidden_sizes)
        for h in self.hidden_sizes:
            _positive("hidden_sizes", h, integer=True)
        if self.activation not in ("tanh", "relu"):
            raise ValueError(f"activation: expected 'tanh' or 'relu', got {self.activation!r}")
        _positive("max_nonfinite_updates", self.max_nonfinite_updates, integer=True)
        _non_negative("checkpoint_every", self.checkpoint_every)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed: expected an integer, got {self.seed!r}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if callable(self.env):
            d["env"] = None
        d["hidden_sizes"] = list(self.hidden_sizes)
        return d

    @classmethod
    def from_dict(cls, d: dict, env=None) -> "AgentConfig":
        d = dict(d)
        if env is not None:
            d["env"] = env
        if d.get("env") is None:
            raise ValueError("env: the saved agent was trained on an env factory; pass env=")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class OnPolicyConfig(AgentConfig):
    """Fields of the on-policy actor-critic agents (REINFORCE, A2C, PPO)."""

    num_envs: int = 8
    """Number of parallel environments."""
    n_steps: int = 128
    """Steps per environment in each rollout (batch = ``num_envs * n_steps``)."""
    gae_lambda: float = 0.95
    """GAE lambda (1.0: Monte-Carlo returns minus the baseline)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the ``learn`` call."""
    normalize_advantages: bool = True
    """Standardise advantages (per minibatch for PPO, per batch otherwise)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (continuous actions)."""

    def __post_init__(self):
        super().__post_init__()
        _positive("n_steps", self.n_steps, integer=True)
        _in_unit("gae_lambda", self.gae_lambda)
        _non_negative("ent_coef", self.ent_coef)
        _non_negative("vf_coef", self.vf_coef)


@dataclass
class PPOConfig(OnPolicyConfig):
    """PPO (Schulman et al. 2017) with the CleanRL ``ppo.py`` defaults for CartPole.

    Implementation details (Huang et al. 2022) that apply to vector observations: vector
    envs, orthogonal init, Adam eps 1e-5, LR annealing, GAE, minibatch epochs, advantage
    normalisation, clipped surrogate, value clipping, entropy bonus, global gradient
    clipping, separate networks, truncation bootstrapping, target-KL early stop.
    """

    num_envs: int = 8
    """Number of parallel environments."""
    n_steps: int = 128
    """Steps per environment in each rollout."""
    learning_rate: float = 2.5e-4
    """Adam learning rate."""
    n_epochs: int = 4
    """Optimisation epochs over each rollout (``update_epochs`` in CleanRL)."""
    n_minibatches: int = 4
    """Minibatches per epoch."""
    clip_coef: float = 0.2
    """Surrogate clipping coefficient epsilon."""
    clip_vloss: bool = True
    """Clip the value loss around the old value estimate (same coefficient)."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    target_kl: float | None = None
    """Stop the epochs of an update early once the approximate KL exceeds this."""

    def __post_init__(self):
        super().__post_init__()
        _positive("n_epochs", self.n_epochs, integer=True)
        _positive("n_minibatches", self.n_minibatches, integer=True)
        _positive("clip_coef", self.clip_coef)
        if self.target_kl is not None:
            _positive("target_kl", self.target_kl)
        if (self.num_envs * self.n_steps) % self.n_minibatches:
            raise ValueError(
                f"n_minibatches: num_envs * n_steps = {self.num_envs * self.n_steps} is not "
                f"divisible by n_minibatches = {self.n_minibatches}")


@dataclass
class A2CConfig(OnPolicyConfig):
    """Synchronous advantage actor-critic (Mnih et al. 2016): short n-step rollouts, one
    gradient step each. Defaults follow Stable-Baselines3's A2C (with Adam)."""

    num_envs: int = 8
    """Number of parallel environments."""
    n_steps: int = 5
    """Steps per environment in each rollout."""
    gae_lambda: float = 1.0
    """GAE lambda (1.0: plain n-step returns)."""
    learning_rate: float = 7e-4
    """Adam learning rate."""
    normalize_advantages: bool = False
    """Standardise advantages over the batch."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""


@dataclass
class REINFORCEConfig(OnPolicyConfig):
    """REINFORCE (Williams 1992) with a learned state-value baseline.

    Returns are Monte-Carlo returns-to-go, independent of the value estimates; only the
    end of a rollout that cuts an episode (and a time-limit truncation) bootstraps from
    the baseline. Use long rollouts (``n_steps`` near the episode length).
    """

    num_envs: int = 8
    """Number of parallel environments."""
    n_steps: int = 256
    """Steps per environment in each rollout."""
    learning_rate: float = 1e-3
    """Adam learning rate (policy and baseline)."""
    gae_lambda: float = 1.0
    """Fixed at 1 (Monte-Carlo returns)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""

    def __post_init__(self):
        super().__post_init__()
        if self.gae_lambda != 1.0:
            raise ValueError("gae_lambda: REINFORCE uses Monte-Carlo returns (gae_lambda=1.0)")


@dataclass
class DQNConfig(AgentConfig):
    """DQN (Mnih et al. 2015) with Double DQN (van Hasselt et al. 2016), Huber loss, a
    uniform replay buffer, a linear epsilon-greedy schedule and hard or Polyak target
    updates. Defaults follow the rl-baselines3-zoo CartPole-v1 settings, with epsilon decayed
    over the zoo's 8k steps of a 100k budget and the learning rate decayed linearly to 0."""

    num_envs: int = 1
    """Number of parallel environments."""
    learning_rate: float = 2.3e-3
    """Adam learning rate."""
    learning_rate_final: float | None = 0.0
    """The learning rate decays linearly from ``learning_rate`` to this value over the
    ``learn`` budget (``None``: constant, as in the zoo). On CartPole-v1 at 100k steps the decay
    took the final greedy policy to >= 475 in 4 of 5 seeds, against 1 of 5 with a constant rate
    (``benchmarks/agents.py`` rows ``dqn-cartpole-lr-decay`` and ``dqn-cartpole``)."""
    max_grad_norm: float | None = 10.0
    """Global-norm gradient clipping."""
    hidden_sizes: tuple = (256, 256)
    """Hidden layer sizes of the Q-network."""
    activation: str = "relu"
    """Hidden activation."""
    buffer_size: int = 100_000
    """Replay buffer capacity in transitions."""
    batch_size: int = 64
    """Minibatch size of each gradient step."""
    learning_starts: int = 1000
    """Environment steps of random actions before learning starts."""
    train_freq: int = 256
    """Environment steps (per env) between training phases."""
    gradient_steps: int = 128
    """Gradient steps in each training phase."""
    target_update_interval: int = 10
    """Environment steps between target-network updates (SB3/CleanRL convention)."""
    tau: float = 1.0
    """Target update rate: 1.0 is a hard copy, < 1 is Polyak averaging."""
    double_dqn: bool = True
    """Select the next action with the online network, evaluate it with the target one."""
    huber_delta: float = 1.0
    """Huber loss threshold (smooth L1)."""
    prioritized_replay: bool = False
    """Proportional prioritised experience replay (Schaul et al. 2016): transitions are
    sampled with probability proportional to ``(|TD error| + priority_eps) ** priority_alpha``
    (new ones at the highest priority so far) and the loss is weighted by importance-sampling
    weights ``(N P(i)) ** -beta`` (divided by the batch maximum)."""
    priority_alpha: float = 0.6
    """How strongly priorities shape sampling (0: uniform)."""
    priority_beta: float = 0.4
    """Initial importance-sampling exponent, annealed linearly to 1 over the ``learn`` budget."""
    priority_eps: float = 1e-6
    """Added to ``|TD error|`` so that no transition gets priority 0."""
    exploration_fraction: float = 0.08
    """Fraction of the ``learn`` budget over which epsilon decays linearly (0.08: the zoo's 8k
    steps for a 100k budget; the zoo's 0.16 is for its 50k)."""
    exploration_initial_eps: float = 1.0
    """Initial epsilon."""
    exploration_final_eps: float = 0.04
    """Final epsilon."""
    eval_epsilon: float = 0.0
    """Epsilon of ``act(deterministic=False)`` outside training."""

    def __post_init__(self):
        super().__post_init__()
        for name in ("buffer_size", "batch_size", "train_freq", "gradient_steps",
                     "target_update_interval"):
            _positive(name, getattr(self, name), integer=True)
        _non_negative("learning_starts", self.learning_starts)
        if self.learning_rate_final is not None:
            _non_negative("learning_rate_final", self.learning_rate_final)
        _in_unit("tau", self.tau, closed_low=False)
        _positive("huber_delta", self.huber_delta)
        _in_unit("priority_alpha", self.priority_alpha)
        _in_unit("priority_beta", self.priority_beta)
        _positive("priority_eps", self.priority_eps)
        _in_unit("exploration_fraction", self.exploration_fraction)
        _in_unit("exploration_initial_eps", self.exploration_initial_eps)
        _in_unit("exploration_final_eps", self.exploration_final_eps)
        _in_unit("eval_epsilon", self.eval_epsilon)
        if self.batch_size > self.buffer_size:
            raise ValueError(f"batch_size: {self.batch_size} exceeds buffer_size "
                             f"{self.buffer_size}")


CONFIGS = {"ppo": PPOConfig, "a2c": A2CConfig, "reinforce": REINFORCEConfig, "dqn": DQNConfig}
