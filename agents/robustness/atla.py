"""ATLA: alternating training of an agent and its learned adversary (``robust="atla"``).

Zhang, Chen, Boning, Hsieh, "Robust reinforcement learning on state observations with learned
optimal adversary", ICLR 2021. The agent (PPO or A2C) lives in the perturbed MDP of its
current adversary, and the adversary (a PPO in the adversary MDP of :mod:`agents.robustness.adversary`)
is trained against the current agent; the two alternate, one iteration each (the paper's
ATLA-PPO schedule alternates the two learners with equal budgets; here every agent
iteration of ``n_steps · num_envs`` env steps is preceded by as many adversary steps):

1. adversary phase: the adversary's PPO learns for one agent batch of steps at the current
   radius, against the agent's deterministic actions;
2. agent phase: the agent's rollout sees ``ŝ = s + r · tanh(a) · scale`` with ``a`` sampled
   from the adversary's policy (in the compiled rollout: the adversary's network is called
   in the agent's graph), stores and learns from ``ŝ`` as ``robust="adv"`` does.

One object owns both learners and alternates them: :class:`ATLAPlugin`, the agent's robustness
plug-in (``agent.robustness``), holds the agent and its adversary (``agent.robustness.adversary``)
and runs the adversary phase before each agent iteration.

The radius ``r`` is the robust schedule's eps (rising from 0 to ``robust_eps`` over
``robust_eps_warmup`` of the budget, :class:`agents.robustness.robust.RobustSchedule`): by default the
adversary's curriculum grows with the agent's. With ``atla_start_radius`` the adversary trains
at a radius *shrinking* from that value to ``robust_eps`` over the same warm-up
(:func:`adversary_radius`), the standalone adversary's lesson (issue 25: at a radius where
random perturbations never end an episode, every adversary return is the same and it learns
nothing), while the agent still meets its perturbations at the schedule's eps. The paper's
code (huanzhang12/ATLA_robust_RL) applies its adversary at the full eps from the first
iteration (its eps schedule drives only the SA regulariser); ``robust_eps_warmup=0`` does the
same here.
``robust="atla-sa"`` adds the SA regulariser (``robust_kappa``, the paper's best "ATLA +
SA-Reg"). Policies are MLPs: the paper's best ATLA agents are LSTMs; recurrent policies are
not implemented here. The adversary's weights are not part of the agent's checkpoint: a loaded
``robust="atla"`` agent that learns again starts a fresh adversary. Costs about twice a plain
update per env step in env steps (the adversary's rollouts), more in time: each adversary
vector step calls the agent once (:class:`agents.robustness.adversary.AdversaryVectorEnv`).

The seed axis (``num_seeds=S > 1``, DESIGN.md sections 7-8): each seed ``s`` meets its own
adversary, trained against seed ``s``'s own policy at the radius the schedule gives; the agent's
``S`` seeds still roll out and update in one compiled call. The adversaries are one PPO with a
seed axis of its own (``agent.robustness.adversary``, ``num_seeds=S``, seeds
``seeds[s] + 104_729``, the same settings: slice ``s`` is exactly the adversary seed ``s`` builds
alone), whose env is one :class:`agents.robustness.adversary.AdversaryVectorEnv` of
``S · num_envs`` copies against all seeds' victims (the agent's seed-axis
:class:`agents.robustness._victim.Victim`: block ``s`` perturbed in seed ``s``'s unit of eps
and answered by seed ``s``'s policy, read live from the stacked variables; one victim call per
vector step for all seeds; block ``s`` seeded as seed ``s``'s adversary env alone,
:class:`agents.backends.seed_axis.SeedBlockVecEnv`). In the agent's compiled rollout, seed
``s``'s observations are perturbed by slice ``s`` of that network (one draw for all seeds). The logs
carry each seed's ``atla_adversary_return`` (from the adversary's seed ``s`` episodes) and
``atla_adversary_radius`` under ``"per_seed"`` (the top level: their mean), and each seed's
``history`` entries carry them too. ``agent.export(s)`` is an ordinary ``robust="atla"`` agent
without its adversary: adversaries are not part of a checkpoint for any ``S`` (a resumed or
exported agent that learns again starts fresh ones).

>>> import agents
>>> agent = agents.PPO(env="CartPole-v1", seed=0, num_envs=2, n_steps=16, robust="atla",
...                    robust_eps=0.1, robust_eps_warmup=0.0)
>>> _ = agent.learn(32, progress_bar=False)
>>> int(agent.robustness.adversary.num_timesteps.numpy()) >= 32
True
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from agents.algorithms.onpolicy import OnPolicyAgent
from agents.algorithms.ppo import PPO
from agents.core.base import Agent
from agents.core.config import AgentConfig
from agents.core.plugin import register_robustness
from agents.robustness._victim import Victim, _victim
from agents.robustness.adversary import (
    DEFAULT_PPO,
    AdversaryVectorEnv,
    _factory,
    _Radius,
    check_inter_op_threads,
    victim_surface,
)
from agents.robustness.robust import SAPlugin, ScheduledPlugin

__all__ = ["ATLAPlugin", "ATLASAPlugin", "ATLA_MODES", "adversary_radius", "uses_atla", "uses_sa"]

ATLA_MODES = ("atla", "atla-sa")
"""The ``robust`` values that train with a learned adversary (``atla-sa``: plus SA's KL)."""

ADVERSARY_PPO = {"anneal_lr": False, "n_minibatches": 1}
"""Overrides of :data:`agents.robustness.adversary.DEFAULT_PPO` for the ATLA adversary (its ``learn`` is
called once per agent iteration: a learning rate annealed per call would restart each time);
its ``num_envs`` and ``n_steps`` are the agent's. One minibatch: 10 gradient steps per phase.
The paper's MuJoCo configs (ATLA_robust_RL ``configs/hopper_atla_ppo_best.py``) update the
adversary much harder: 32 minibatches of a 2048-step batch, 10 epochs, learning rate 3e-3
(``benchmarks/learned_adversary.py --atla-adversary`` sets these for a run; the Hopper pilot in
docs/benchmarks/robust-rl.md measures both)."""


def uses_atla(config: AgentConfig) -> bool:
    """``robust`` is ``"atla"`` or ``"atla-sa"``."""
    return config.robust in ATLA_MODES


def uses_sa(config: AgentConfig) -> bool:
    """The SA regulariser is on (``robust="sa"`` or ``"atla-sa"``)."""
    return config.robust in ("sa", "atla-sa")


def adversary_radius(eps: float, robust_eps: float, start_radius: float | None) -> float:
    """The radius the ATLA adversary trains at when the agent's schedule is at ``eps`` (of its
    target ``robust_eps``): ``eps`` itself without a ``start_radius`` (``None``), else the
    point as far from ``start_radius`` toward ``robust_eps`` as ``eps`` is from 0 toward
    ``robust_eps`` (both linear over the warm-up). Floats in the agent's units of eps.

    >>> adversary_radius(0.02, 0.05, None)
    0.02
    >>> round(adversary_radius(0.0, 0.05, 0.2), 6), round(adversary_radius(0.025, 0.05, 0.2), 6)
    (0.2, 0.125)
    >>> adversary_radius(0.05, 0.05, 0.2)
    0.05
    """
    if start_radius is None:
        return float(eps)
    frac = min(float(eps) / robust_eps, 1.0) if robust_eps > 0 else 1.0
    return float(frac * robust_eps + (1.0 - frac) * start_radius)


# -- the seed axis' adversary env: all seeds' victims in one call -------------------------------
def _seed_factory(surface: Victim, radius: _Radius):
    """The env of an adversary PPO with a seed axis (``num_seeds = S``) against ``surface``'s
    ``S`` victims (a :class:`agents.robustness._victim.Victim` of the agent's seed-axis surface,
    ``envs_per_seed`` rows per seed: block ``s`` perturbed in seed ``s``'s unit of eps and
    answered by seed ``s``'s policy, read live from the stacked variables): its
    ``make_seed_vector_env(num_seeds, num_envs, async_envs)`` builds one
    :class:`agents.robustness.adversary.AdversaryVectorEnv` of ``S · num_envs`` copies (one victim
    call per vector step for all seeds; :func:`agents.backends.seed_axis.make_seed_env` seeds each
    block as that seed alone)."""
    def make():
        raise ValueError("env: this adversary MDP steps the victims of all seeds together; "
                         "build its agent with num_seeds="
                         f"{surface.num_seeds} (make_seed_vector_env)")

    def make_seed_vector_env(num_seeds: int, num_envs: int, async_envs: bool = False
                             ) -> AdversaryVectorEnv:
        if (num_seeds, num_envs) != (surface.num_seeds, surface.envs_per_seed):
            raise ValueError(f"num_envs: the victims' surface holds {surface.num_seeds} seeds "
                             f"x {surface.envs_per_seed} envs, got {num_seeds} x {num_envs}")
        return AdversaryVectorEnv(surface.env_id, num_seeds * num_envs, surface, radius,
                                  async_envs=async_envs)
    make.make_seed_vector_env = make_seed_vector_env  # type: ignore[attr-defined]
    return make


def _mean_return(returns) -> float:
    """The mean of an adversary's recent episode returns (NaN before its first episode)."""
    ret = list(returns)
    return sum(ret) / len(ret) if ret else float("nan")


# -- the two learners ---------------------------------------------------------------------------
class ATLAPlugin(ScheduledPlugin):
    """``robust="atla"``: the object that owns both learners, the agent (``agent``, whose
    plug-in it is) and its learned adversary (``adversary``, a :class:`agents.PPO` built on first
    use by :meth:`build_adversary`), and alternates them: before each agent iteration
    :meth:`adversary_phase` trains the adversary against the agent, then the agent's rollout
    perceives the adversary's perturbation (:meth:`observations`). ``victim`` is the agent as the
    adversary's MDP steps it (:class:`agents.robustness._victim.Victim`), ``radius`` the radius
    the adversary trains at. Neither learner's private state is touched: the agent is read
    through its public API (config, seeds, surfaces, histories), the adversary trained through
    ``learn``."""

    agent: OnPolicyAgent  # ATLA trains PPO and A2C (the configs refuse it elsewhere)

    def __init__(self, agent: Agent):
        super().__init__(agent)
        self.adversary: PPO | None = None
        self.victim: Victim | None = None
        self.radius: _Radius | None = None

    # -- the adversary ------------------------------------------------------------------------
    def build_adversary(self) -> PPO:
        """The agent's adversary (module doc): a PPO in the adversary MDP of the agent, one
        iteration the size of the agent's; with ``S > 1`` seeds one PPO with a seed axis of
        ``S`` against all seeds' victims."""
        agent = self.agent
        check_inter_op_threads()
        if agent.rollout_workers is not None:
            raise ValueError("rollout_workers: ATLA's adversary acts in the agent's local "
                             "rollout; Ray rollout workers do not carry it (train robust='atla' "
                             "locally)")
        cfg = agent.config
        settings: dict[str, Any] = {**DEFAULT_PPO, **ADVERSARY_PPO, "num_envs": cfg.num_envs,
                    "n_steps": cfg.n_steps}
        seeds = [seed + 104_729 for seed in agent.seeds]
        self.radius = _Radius(0.0)
        self.victim = victim_surface(agent, "agent", seed_axis=True)
        if agent.num_seeds == 1:
            self.adversary = PPO(env=_factory(self.victim, self.radius, None, None),
                                 seed=seeds[0], preset=None, **settings)
        else:
            self.adversary = PPO(env=_seed_factory(self.victim, self.radius), seed=seeds[0],
                                 seeds=seeds, num_seeds=len(seeds), preset=None, **settings)
        return self.adversary

    def adversary_phase(self) -> dict:
        """Train the adversary (built on first use) for one agent batch of steps (per seed) at
        the current radius (:func:`adversary_radius`); returns logs (``atla_adversary_return``:
        the adversary's mean episode return, minus the agent's; ``atla_adversary_radius``).
        With ``S > 1`` seeds: their means, and each seed's values (from the adversary's seed
        ``s``) under ``"per_seed"``."""
        adversary = self.adversary if self.adversary is not None else self.build_adversary()
        assert self.victim is not None and self.radius is not None
        agent, cfg = self.agent, self.agent.config
        radius = adversary_radius(float(self.schedule.eps.numpy()), cfg.robust_eps,
                                  cfg.atla_start_radius)
        self.radius.value = radius
        self.victim.refresh()  # the agent's normaliser moved in its last update
        if radius > 0:
            adversary.learn(cfg.n_steps * cfg.num_envs, progress_bar=False,
                            handle_interrupts=False)
        if agent.num_seeds == 1:
            return {"atla_adversary_return": _mean_return(adversary.episode_returns),
                    "atla_adversary_radius": radius}
        returns = [_mean_return(r) for r in adversary.seed_episode_returns]
        finite = [x for x in returns if x == x]
        return {"atla_adversary_return": sum(finite) / len(finite) if finite else float("nan"),
                "atla_adversary_radius": radius,
                "per_seed": {"atla_adversary_return": returns,
                             "atla_adversary_radius": [radius] * agent.num_seeds}}

    def observations(self, obs: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        """``ŝ = s + r · tanh(a) · scale`` for the rollout's ``obs [N, d]`` (``[S, N, d]`` with
        the seed axis: seed ``s``'s rows by slice ``s`` of the adversary's seed axis, one draw for
        all seeds), ``a`` sampled with the stateless ``seed`` from the adversary's policy, ``r``
        the schedule's eps, ``scale`` the agent's unit of eps (each seed's own); non-finite rows
        pass through. Stopped. Runs inside the rollout."""
        assert self.adversary is not None, "the adversary phase runs before the rollout"
        finite = tf.math.is_finite(obs)
        safe = tf.where(finite, obs, tf.zeros_like(obs))
        a = self.adversary.model.distribution(safe).sample(seed=seed)  # [S, N, d]: slice s
        scale = _victim(self.agent, None).row_scale()  # [d], or [S, 1, d]: each seed's unit
        seen = safe + self.schedule.eps * tf.tanh(a) * scale
        return tf.stop_gradient(tf.where(finite, seen, obs))

    # -- the plug-in's hooks (agents.core.plugin) ----------------------------------------------
    def perceive(self, obs: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        return self.observations(obs, tf.random.experimental.stateless_fold_in(seed, 1))

    def before_iteration(self, steps_done: int, total: int) -> dict:
        super().before_iteration(steps_done, total)
        return self.adversary_phase()

    def record(self, logs: dict) -> None:
        """With ``S > 1`` seeds each seed's ``history`` entry also records its adversary's
        return and radius."""
        agent = self.agent
        if agent.num_seeds > 1:
            per_seed = logs.get("per_seed", {})
            for key in ("atla_adversary_return", "atla_adversary_radius"):
                for k, history in enumerate(agent.seed_histories):
                    history[-1][key] = per_seed[key][k]


class ATLASAPlugin(ATLAPlugin, SAPlugin):
    """``robust="atla-sa"``: :class:`ATLAPlugin` plus SA's regulariser
    (:class:`agents.robustness.robust.SAPlugin`)."""


register_robustness("atla", ATLAPlugin)
register_robustness("atla-sa", ATLASAPlugin)
