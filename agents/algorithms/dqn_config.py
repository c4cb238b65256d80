"""DQN's config: :class:`DQNConfig`, its fields documented and validated early, beside the
algorithm (:mod:`agents.algorithms.dqn`) as each algorithm's config is beside its code; the fields
every agent shares are :class:`agents.core.config.AgentConfig`'s.

>>> DQNConfig(buffer_size=1000, batch_size=32).train_freq
256
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agents.core.config import AgentConfig, positive
from agents.core.limits import MAX_REPEATS, MAX_ROLLOUT_TRANSITIONS, MAX_TOTAL_STEPS, check_update_work
from robustgrad.checks import nonnegative, positive_int, probability
from robustgrad.errors import ConfigError

__all__ = ["DQNConfig"]


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
    _WOCAR_SEARCHES: ClassVar[tuple[str, ...]] = ("pgd",)  # SA-DQN's margin: PGD (no SGLD)
    num_seeds: int = 1
    """Train this many seeds at once (``seed, seed + 1, ...``) as one agent whose networks,
    optimiser, observation statistics and replay buffer carry a leading seed axis
    (:mod:`agents.algorithms.dqn`); ``agent.export(s)`` gives seed ``s`` as an ordinary agent. SA-DQN and
    adversarial training (``robust="sa"``, ``"adv"``) work on the axis (each seed attacked against
    its own Q-network, :mod:`agents.robustness.robust`); not a custom ``transform``."""

    _WOCAR_ONLY_ON_POLICY: ClassVar[tuple[str, ...]] = (
        "wocar_admissible_eps", "wocar_search_per_rollout", "wocar_q_epochs",
        "wocar_q_minibatches", "wocar_q_min_rows", "wocar_search_steps",
        "wocar_smoothness_every")
    """WocaR-PPO/A2C's rollout critic and smoothness-term settings: WocaR-DQN trains its
    worst-attack network on the replayed minibatches and has no search."""

    _WOCAR_ONLY_DQN: ClassVar[tuple[str, ...]] = ()

    _WOCAR_DQN_SAVED_BEFORE_Q_EVERY: ClassVar[tuple[tuple[str, object], ...]] = (
        ("wocar_q_every", 1), ("wocar_bound", "ibp"), ("wocar_weight", 0.05))
    """WocaR-DQN's defaults before ``wocar_q_every`` existed (the worst-attack network stepped
    on every replayed minibatch, IBP admissible sets, weight 0.05): an agent saved then, with
    these fields unset, resumes with the settings it trained with (:meth:`saved_fields`)."""

    @staticmethod
    def saved_fields(saved: dict) -> dict:
        """A saved DQN config dict as this version reads it
        (:meth:`agents.core.plugin.RobustFields.saved_fields`, and: a ``robust="wocar"`` agent
        saved before ``wocar_q_every`` existed keeps the defaults it trained with wherever it
        left a field unset).

        >>> DQNConfig.saved_fields({"robust": "wocar", "wocar_bound": None})["wocar_bound"]
        'ibp'
        >>> new = {"robust": "wocar", "wocar_bound": None, "wocar_q_every": None}
        >>> DQNConfig.saved_fields(new)["wocar_bound"] is None   # saved by this version
        True
        """
        out = AgentConfig.saved_fields(saved)
        if out.get("robust") != "wocar" or "wocar_q_every" in out:
            return out
        out = dict(out)
        for name, before in DQNConfig._WOCAR_DQN_SAVED_BEFORE_Q_EVERY:
            if out.get(name) is None:
                out[name] = before
        return out

    def __post_init__(self):
        super().__post_init__()
        self.num_seeds = positive_int(self.num_seeds, "num_seeds")
        if self.robust in ("atla", "atla-sa"):
            raise ConfigError(f"robust: ATLA trains an actor-critic (PPO, A2C) against a learned "
                             f"adversary; DQN supports 'sa', 'adv' and 'wocar', got "
                             f"{self.robust!r}")
        if self.robust == "wocar" and self.wocar_weight is not None:  # a mixing weight here
            probability(self.wocar_weight, "wocar_weight")
        if self.robust is not None and self.robust_method not in ("pgd", "convex"):
            raise ConfigError(f"robust_method: SA-DQN bounds the greedy action's margin by PGD or "
                             f"by the convex relaxation; 'pgd' or 'convex', got "
                             f"{self.robust_method!r}")
        for name in ("buffer_size", "batch_size"):
            setattr(self, name, positive_int(getattr(self, name), name))
        self.train_freq = positive_int(self.train_freq, "train_freq",
                                       maximum=MAX_ROLLOUT_TRANSITIONS)
        collected = self.train_freq * self.num_envs * self.num_seeds
        if collected > MAX_ROLLOUT_TRANSITIONS:  # one training phase's steps, collected at once
            raise ConfigError(f"train_freq * num_envs * num_seeds must be at most "
                              f"{MAX_ROLLOUT_TRANSITIONS} (transitions one collection keeps in "
                              f"memory), got {self.train_freq} * {self.num_envs} * "
                              f"{self.num_seeds} = {collected}")
        for name in ("target_update_interval", "learning_starts"):  # periods in env steps
            setattr(self, name, positive_int(getattr(self, name), name,
                                             minimum=0 if name == "learning_starts" else 1,
                                             maximum=MAX_TOTAL_STEPS))
        self.gradient_steps = positive_int(self.gradient_steps, "gradient_steps",
                                           maximum=MAX_REPEATS)
        if self.learning_rate_final is not None:
            nonnegative(self.learning_rate_final, "learning_rate_final")
        probability(self.tau, "tau", open_low=True)
        positive(self.huber_delta, "huber_delta")
        for name in ("priority_alpha", "priority_beta", "exploration_fraction",
                     "exploration_initial_eps", "exploration_final_eps", "eval_epsilon"):
            probability(getattr(self, name), name)
        positive(self.priority_eps, "priority_eps")
        if self.batch_size > self.buffer_size:
            raise ConfigError(f"batch_size must be <= buffer_size ({self.buffer_size}), got "
                             f"{self.batch_size}")
        check_update_work(self, self.gradient_steps * self.batch_size * self.num_seeds,
                          "gradient_steps * batch_size * num_seeds")
