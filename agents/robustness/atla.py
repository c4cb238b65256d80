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
seed axis of its own (``agent.atla_adversary``, ``num_seeds=S``, seeds ``seeds[s] + 104_729``,
the same settings: slice ``s`` is exactly the adversary seed ``s`` builds alone), whose env is
one :class:`agents.robustness.adversary.AdversaryVectorEnv` of ``S · num_envs`` copies against all seeds'
victims (:class:`SeedVictimSurface`: block ``s`` perturbed in seed ``s``'s
unit of eps and answered by seed ``s``'s policy, read live from the stacked variables; one
victim call per vector step for all seeds; block ``s`` seeded as seed ``s``'s adversary env
alone, :class:`agents.backends.seed_axis.SeedBlockVecEnv`). In the agent's compiled rollout, seed ``s``'s
observations are perturbed by slice ``s`` of that network (one draw for all seeds). The logs
carry each seed's ``atla_adversary_return`` (from the adversary's seed ``s`` episodes) and
``atla_adversary_radius`` under ``"per_seed"`` (the top level: their mean), and each seed's
``history`` entries carry them too. ``agent.export(s)`` is an ordinary ``robust="atla"`` agent
without its adversary: adversaries are not part of a checkpoint for any ``S`` (a resumed or
exported agent that learns again starts fresh ones).

>>> import agents
>>> agent = agents.PPO(env="CartPole-v1", seed=0, num_envs=2, n_steps=16, robust="atla",
...                    robust_eps=0.1, robust_eps_warmup=0.0)
>>> _ = agent.learn(32, progress_bar=False)
>>> int(agent.atla_adversary.num_timesteps.numpy()) >= 32
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import tensorflow as tf

from agents.algorithms.ppo import PPO
from agents.core.plugin import register_robustness
from agents.robustness._victim import _victim
from agents.robustness.adversary import (
    DEFAULT_PPO,
    AdversaryVectorEnv,
    VictimSurface,
    _check_victim,
    _check_victim_env,
    _factory,
    _Radius,
    check_inter_op_threads,
    victim_surface,
)
from agents.robustness.robust import SAPlugin, ScheduledPlugin

if TYPE_CHECKING:
    from collections.abc import Callable

    from agents.algorithms.onpolicy import OnPolicyAgent
    from agents.core.base import Agent
    from agents.core.config import AgentConfig
    from agents.core.policy import PolicySurface

__all__ = ["ATLAPlugin", "ATLASAPlugin", "ATLA_MODES", "SeedVictimSurface", "adversary_phase",
           "adversary_radius", "atla_observations", "seed_victim_surface", "uses_atla", "uses_sa"]

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
class SeedVictimSurface(VictimSurface):
    """The victims of all ``S`` seeds of an agent with a seed axis, as one
    :class:`VictimSurface` over ``S * n`` rows (``n`` per seed, seed ``s``'s block of rows
    ``s·n`` to ``(s+1)·n``): ``act(obs [S·n, d])`` calls the seed-axis policy once on
    ``[S, n, d]`` (each block by its own seed's weights and normaliser, read live), ``scale
    [S·n, d]`` each row its seed's unit of eps (so the one-seed ``_squash_step`` perturbs
    every block in its own units). ATLA's adversary with a seed axis trains on an
    :class:`agents.robustness.adversary.AdversaryVectorEnv` of ``S · n`` copies against it (module doc).
    Built by :func:`seed_victim_surface`."""

    def __init__(self, agent: Agent, policy: PolicySurface, envs_per_seed: int):
        assert policy.num_seeds is not None  # seed_victim_surface: the seed-axis policy
        self.num_seeds, self.envs_per_seed = int(policy.num_seeds), int(envs_per_seed)
        super().__init__(agent, policy)

    def _batch_shape(self) -> tuple:
        """The seed-axis policy takes ``[S, n, d]``."""
        return (self.num_seeds, None)

    def refresh(self) -> None:
        """Re-read every seed's unit of eps (after the agent's normalisers moved)."""
        scale = self.policy.obs_scale().numpy().reshape((self.num_seeds, -1))
        self._scale = np.repeat(scale, self.envs_per_seed, axis=0)

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions ``[S·n(, k)]`` of each block's own seed (one call)."""
        obs = np.asarray(obs, np.float32)
        out = self._act(obs.reshape((self.num_seeds, -1) + self.obs_shape)).numpy()
        return out.reshape((obs.shape[0],) + out.shape[2:])


def seed_victim_surface(agent: Any, envs_per_seed: int, argument: str = "agent"
                        ) -> SeedVictimSurface:
    """:class:`SeedVictimSurface` of an agent with a seed axis (``num_seeds > 1``), ``n =
    envs_per_seed`` rows per seed; checked as :func:`agents.robustness.adversary.victim_surface` checks."""
    _check_victim(agent, argument)
    policy = agent._seed_axis_surface()
    _check_victim_env(agent, argument)
    return SeedVictimSurface(agent, policy, envs_per_seed)


def _seed_factory(surface: SeedVictimSurface, radius: _Radius) -> Callable[[], NoReturn]:
    """The env of an adversary PPO with a seed axis (``num_seeds = S``) against ``surface``'s
    ``S`` victims: its ``make_seed_vector_env(num_seeds, num_envs, async_envs)`` builds one
    :class:`agents.robustness.adversary.AdversaryVectorEnv` of ``S · num_envs`` copies (one victim call
    per vector step for all seeds; :func:`agents.backends.seed_axis.make_seed_env` seeds each block as
    that seed alone)."""
    def make() -> NoReturn:
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
    # a function with an attribute, as agents.robustness.adversary._factory (why: there)
    make.make_seed_vector_env = make_seed_vector_env  # type: ignore[attr-defined]
    return make


def _plugin(agent: Agent) -> ATLAPlugin:
    """``agent``'s ATLA plug-in (``robust="atla"`` or ``"atla-sa"``)."""
    plugin = agent.robustness
    if not isinstance(plugin, ATLAPlugin):
        raise TypeError(f"agent: trains with robust={agent.config.robust!r}, not ATLA's "
                        f"learned adversary ({' or '.join(ATLA_MODES)})")
    return plugin


# -- building and training the adversary -------------------------------------------------------
def _build_adversary(agent: OnPolicyAgent) -> None:
    """``agent``'s adversary (module doc), held by its ATLA plug-in (``agent.robustness``:
    ``adversary``, its victim ``surface`` and ``radius``) and shown as ``agent.atla_adversary``;
    with ``S > 1`` seeds one PPO with a seed axis of ``S`` against all seeds' victims."""
    check_inter_op_threads()
    if agent.rollout_workers is not None:
        raise ValueError("rollout_workers: ATLA's adversary acts in the agent's local rollout; "
                         "Ray rollout workers do not carry it (train robust='atla' locally)")
    cfg = agent.config  # one adversary iteration per agent iteration, of the same size
    settings: dict[str, Any] = {**DEFAULT_PPO, **ADVERSARY_PPO,  # PPO's keyword overrides
                                "num_envs": cfg.num_envs, "n_steps": cfg.n_steps}
    seeds = [seed + 104_729 for seed in agent.seeds]
    radius = _Radius(0.0)
    if agent.num_seeds == 1:
        surface = victim_surface(agent, "agent")
        adversary = PPO(env=_factory(surface, radius, None, None), seed=seeds[0], preset=None,
                        **settings)
    else:
        surface = seed_victim_surface(agent, cfg.num_envs)
        adversary = PPO(env=_seed_factory(surface, radius), seed=seeds[0], seeds=seeds,
                        num_seeds=len(seeds), preset=None, **settings)
    _plugin(agent).adopt(adversary, surface, radius)


def _mean_return(returns) -> float:
    """The mean of an adversary's recent episode returns (NaN before its first episode)."""
    ret = list(returns)
    return sum(ret) / len(ret) if ret else float("nan")


def adversary_phase(agent: OnPolicyAgent) -> dict:
    """Train ``agent``'s adversary (built on first use) for one agent batch of steps (per seed)
    at the current radius (:func:`adversary_radius`); returns logs (``atla_adversary_return``:
    the adversary's mean episode return, minus the agent's; ``atla_adversary_radius``). With
    ``S > 1`` seeds: their means, and each seed's values (from the adversary's seed ``s``)
    under ``"per_seed"``."""
    plugin = _plugin(agent)
    if plugin.adversary is None:
        _build_adversary(agent)
    cfg = agent.config
    radius = adversary_radius(float(plugin.schedule.eps.numpy()), cfg.robust_eps,
                              cfg.atla_start_radius)
    adversary, surface, holder = plugin.adversary, plugin.surface, plugin.radius
    assert adversary is not None and surface is not None and holder is not None  # adopted
    holder.value = radius
    surface.refresh()  # the agent's normaliser moved in its last update
    if radius > 0:
        adversary.learn(cfg.n_steps * cfg.num_envs, progress_bar=False, handle_interrupts=False)
    if agent.num_seeds == 1:
        return {"atla_adversary_return": _mean_return(adversary.episode_returns),
                "atla_adversary_radius": radius}
    returns = [_mean_return(r) for r in adversary.seed_episode_returns]
    finite = [x for x in returns if x == x]
    return {"atla_adversary_return": sum(finite) / len(finite) if finite else float("nan"),
            "atla_adversary_radius": radius,
            "per_seed": {"atla_adversary_return": returns,
                         "atla_adversary_radius": [radius] * agent.num_seeds}}


def atla_observations(agent: Agent, obs: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """``ŝ = s + r · tanh(a) · scale`` for the rollout's ``obs [N, d]`` (``[S, N, d]`` with the
    seed axis: seed ``s``'s rows by slice ``s`` of the adversary's seed axis, one draw for all
    seeds), ``a`` sampled with the stateless ``seed`` from the adversary's policy, ``r`` the
    schedule's eps, ``scale`` the agent's unit of eps (each seed's own); non-finite rows pass
    through. Stopped. Runs inside the rollout."""
    plugin = _plugin(agent)
    assert plugin.adversary is not None  # built by the adversary phase before the first rollout
    finite = tf.math.is_finite(obs)
    safe = tf.where(finite, obs, tf.zeros_like(obs))
    a = plugin.adversary.model.distribution(safe).sample(seed=seed)  # [S, N, d]: slice s
    scale = _victim(agent, None).row_scale()  # [d], or [S, 1, d]: each seed's unit of eps
    seen = safe + plugin.schedule.eps * tf.tanh(a) * scale
    return tf.stop_gradient(tf.where(finite, seen, obs))


# -- the plug-in (agents.core.plugin) ------------------------------------------------------------------
class ATLAPlugin(ScheduledPlugin):
    """``robust="atla"``: the agent's rollout perceives its learned adversary's perturbation
    (:func:`atla_observations`); before each iteration the adversary trains against the agent
    (:func:`adversary_phase`, which builds it on first use). Holds the adversary (``adversary``,
    also ``agent.atla_adversary``), its victim ``surface`` and training ``radius``."""

    agent: OnPolicyAgent  # ATLA trains PPO and A2C (the configs refuse it elsewhere)

    def __init__(self, agent: Agent):
        super().__init__(agent)
        self.adversary: PPO | None = None
        self.surface: VictimSurface | None = None
        self.radius: _Radius | None = None

    def adopt(self, adversary: PPO, surface: VictimSurface, radius: _Radius) -> None:
        """Take ``adversary`` (built by :func:`_build_adversary`) as the agent's adversary."""
        self.adversary, self.surface, self.radius = adversary, surface, radius
        self.agent.atla_adversary = adversary  # the public name of the agent's adversary

    def perceive(self, obs: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        return atla_observations(self.agent, obs,
                                 tf.random.experimental.stateless_fold_in(seed, 1))

    def before_iteration(self, steps_done: int, total: int) -> dict:
        super().before_iteration(steps_done, total)
        return adversary_phase(self.agent)

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
