"""Learned observation adversaries: the adversary MDP, the ``optimal`` attack, save and load.

Zhang, Chen, Boning, Hsieh, "Robust reinforcement learning on state observations with learned
optimal adversary", ICLR 2021 (ATLA): for a fixed victim policy ``π``, perturbing its
observations is itself an MDP. Its state is the victim's (clean) observation ``s [d]``, its
action ``a ∈ R^d``, squashed by ``tanh`` into ``[-1, 1]^d`` and scaled to the ball:
``ŝ = s + r · tanh(a) · scale`` (``scale [d]`` the unit of eps the victim uses, see
:func:`agents.robustness.observation_attacks.perturbation_scale`; ``‖tanh(a)‖∞ ≤ 1`` keeps the step in
the L∞ ball of radius ``r``); the victim acts on ``ŝ`` (deterministically, as in the
evaluation); the adversary's reward is minus the victim's, and episodes end when the victim's
do. :class:`AdversaryEnv` is that MDP as a gymnasium wrapper, :class:`AdversaryVectorEnv` its
vector form (one victim call per vector step for all copies: what the adversary trains on);
:func:`train_adversary` trains an :class:`agents.PPO` in it for a budget of steps and returns
a :class:`LearnedAdversary`, which perturbs batches like any observation attack (``.step`` has
the signature the evaluation uses).

Two lessons from building it (issue 25 §3), both on by default:

* **radius curriculum** - trained only at eps, random perturbations of that size never end a
  CartPole episode, every return is the same and the adversary gets no signal. The radius
  starts at ``start_radius`` (default ``4 · eps``) and shrinks linearly to eps over
  ``curriculum`` of the budget, then stays at eps.
* **best snapshot** - after the curriculum the adversary is scored every ``eval_every`` steps
  on held-out env seeds at eps (deterministic actions); the weights that left the victim the
  lowest mean return are kept.

The victim is the robustness wing's one adapter of the agent's declared policy surface,
:class:`agents.robustness._victim.Victim` (its deterministic actions and the unit of eps; built
by :func:`victim_surface`).
:mod:`agents.robustness.paad` reuses the MDP with a different perturbation (PA-AD's director).

>>> import agents
>>> victim = agents.PPO(env="CartPole-v1", seed=0, num_envs=1, n_steps=32)
>>> adv = train_adversary(victim, eps=0.1, steps=64, eval_every=64, eval_episodes=1,
...                       ppo={"num_envs": 2, "n_steps": 32}, progress=False)
>>> obs_adv, norms, _, _ = adv.step(np.zeros([3, 4], np.float32))
>>> obs_adv.shape, bool(norms.max() <= 0.1 + 1e-6)
((3, 4), True)
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import tensorflow as tf
from gymnasium.vector import AutoresetMode

from agents.algorithms.ppo import PPO
from agents.core._loading import load
from agents.core.base import Agent
from agents.core.policy import surface_of
from agents.envs import episodes_split_evenly, make_vec_env, take_finished_episodes
from agents.robustness._victim import Victim
from agents.robustness.observation_attacks import check_box_observations
from agents.robustness.paad import director_perturbation
from robustgrad import checks as _checks
from robustgrad.atomic import replacing

__all__ = ["ADVERSARY_FILE", "LEARNED_ATTACKS", "AdversaryEnv", "AdversaryVectorEnv",
           "LearnedAdversary", "adversary_for", "check_adversary_request",
           "check_inter_op_threads", "load_adversary", "train_adversary", "victim_surface"]

LEARNED_ATTACKS = ("optimal", "paad")
"""Names of the learned attacks (trained per victim and eps, see ``adversary_steps``)."""

ADVERSARY_FILE = "adversary.json"
"""The file beside a saved adversary agent naming its victim's env, eps and obs shape."""

DEFAULT_PPO = {"num_envs": 8, "n_steps": 128, "n_minibatches": 4, "n_epochs": 10,
               "learning_rate": 3e-4, "gamma": 0.99, "gae_lambda": 0.95, "ent_coef": 0.0,
               "normalize_obs": True, "normalize_reward": True, "log_std_init": 0.0}
"""The adversary PPO's settings (a MuJoCo-style PPO: its action is a real vector)."""


# -- the victim ---------------------------------------------------------------------------------
def victim_surface(agent: Any, argument: str = "victim", *, seed_axis: bool = False
                   ) -> Victim:
    """``agent`` as a learned adversary's MDP steps it: a :class:`agents.robustness._victim.Victim`
    of its ``policy_surface()`` (with ``seed_axis`` and ``num_seeds > 1``, ATLA's adversaries of
    all seeds: of its ``seed_axis_surface()``, ``num_envs`` rows per seed), its unit of eps read
    now. ``TypeError`` naming what is missing when it is not an agent with a policy surface,
    ``ValueError`` unless it has a 1-D Box observation space and a gymnasium env id."""
    _check_victim(agent, argument)
    many = seed_axis and agent.num_seeds > 1
    policy = agent.seed_axis_surface() if many else surface_of(agent, argument)
    _check_victim_env(agent, argument)
    victim = Victim(policy, env_id=agent.config.env, algo=agent.algo,
                    envs_per_seed=agent.config.num_envs if many else 1)
    victim.refresh()
    return victim


def _check_victim(agent: Any, argument: str) -> None:
    if not isinstance(agent, Agent):
        raise TypeError(f"{argument} must be an agents.Agent with a policy surface "
                        f"(policy_surface()), got {type(agent).__name__}")


def _check_victim_env(agent: Any, argument: str) -> None:
    check_box_observations(agent.env.single_observation_space, argument)
    if not isinstance(agent.config.env, str):
        raise ValueError(f"{argument}: a learned adversary needs a victim trained on a "
                         "gymnasium env id (an env factory cannot be named in adversary.json)")


def check_inter_op_threads() -> None:
    """``RuntimeError`` when TensorFlow runs one inter-op thread: the victim is called from
    inside the adversary's compiled rollout (``tf.numpy_function`` around the env), and that
    nested call would wait forever for the only thread, which the rollout holds."""
    if tf.config.threading.get_inter_op_parallelism_threads() == 1:
        raise RuntimeError("a learned adversary needs >= 2 TensorFlow inter-op threads (the "
                           "victim acts inside the adversary's compiled rollout); "
                           "tf.config.threading.set_inter_op_parallelism_threads(1) would "
                           "deadlock: leave it at 0 (automatic) or set 2")


def check_adversary_request(agent: Any, eps: float, steps: int, argument: str = "victim"
                            ) -> tuple[Victim, float, int]:
    """Validate a learned-adversary request before any work: ``eps`` a finite radius > 0 that
    the victim can see (below its observation normaliser's clip of 10 std), ``steps`` > 0,
    TensorFlow with >= 2 inter-op threads (:func:`check_inter_op_threads`)."""
    steps = _checks.positive_int(steps, "adversary_steps")
    check_inter_op_threads()
    surface = victim_surface(agent, argument)
    eps = float(_checks.number(eps, "eps"))
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps: a learned adversary needs a finite radius > 0 (eps 0 leaves it "
                         f"no action), got {eps}")
    if surface.clip is not None and eps >= surface.clip:
        raise ValueError(f"eps: {eps} std is beyond what the victim sees (its observation "
                         f"normaliser clips at {surface.clip:g} std); use 0 < eps < "
                         f"{surface.clip:g}")
    return surface, eps, steps


# -- the adversary MDP --------------------------------------------------------------------------
class _Radius:
    """The current radius of an adversary env, shared by its vector copies (curriculum)."""

    def __init__(self, value: float):
        self.value = float(value)


def _squash_step(obs, action, radius, scale):
    """``ŝ = s + r · tanh(a) · scale`` for ``obs [B, d]``, ``action [B, d]`` (float32)."""
    return (np.asarray(obs, np.float32)
            + np.float32(radius) * np.tanh(np.asarray(action, np.float32)) * scale)


class AdversaryEnv(gym.Wrapper):
    """The adversary MDP of ``surface``'s victim in ``env`` (see the module doc).

    ``perturb(obs [1, d], action [1, k], radius) -> ŝ [1, d]`` maps the adversary's action to
    what the victim sees (default: the ``optimal`` attack's ``tanh`` step; ``k = d``);
    ``action_dim`` its action size. ``info["victim_reward"]`` is the victim's reward.
    """

    def __init__(self, env: gym.Env, surface: Victim, radius: _Radius,
                 perturb: Callable | None = None, action_dim: int | None = None):
        super().__init__(env)
        self.surface, self.radius = surface, radius
        self.perturb = perturb or (lambda o, a, r: _squash_step(o, a, r, surface.units))
        k = int(action_dim or surface.obs_shape[0])
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (k,), np.float32)
        self._obs: np.ndarray | None = None

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict]:
        """The wrapped env's reset; the clean observation is kept for the next step."""
        obs, info = self.env.reset(**kwargs)
        self._obs = np.asarray(obs, np.float32)
        return obs, info

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        """The victim acts on the perturbed observation; the adversary gets minus its reward."""
        assert self._obs is not None, "reset() before step()"
        seen = self.perturb(self._obs[None], np.asarray(action, np.float32)[None],
                            self.radius.value)
        victim_action = self.surface.act(seen)[0]
        obs, reward, terminated, truncated, info = self.env.step(victim_action)
        self._obs = np.asarray(obs, np.float32)
        info = dict(info, victim_reward=float(reward))
        return obs, -float(reward), terminated, truncated, info


class AdversaryVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` copies of the adversary MDP of ``surface``'s victim, stepped together: one
    ``perturb`` and one victim call per vector step for all copies (``num_envs`` calls of
    :class:`AdversaryEnv` inside a ``SyncVectorEnv`` cost ``num_envs`` times the victim's call
    overhead, about 85% of an ATLA iteration). The same MDP as :class:`AdversaryEnv` (same
    seeding, same-step autoreset, ``info["victim_reward"] [N]``); ``env_id``'s copies run in a
    ``SyncVectorEnv`` (``AsyncVectorEnv`` with ``async_envs``: the victim stays in this
    process). Built by the adversary's env factory (:func:`agents.envs.make_vec_env` calls its
    ``make_vector_env``).

    >>> import agents
    >>> victim = agents.PPO(env="CartPole-v1", seed=0, num_envs=1, n_steps=8)
    >>> vec = AdversaryVectorEnv("CartPole-v1", 3, victim_surface(victim), _Radius(0.1))
    >>> obs, _ = vec.reset(seed=0)
    >>> obs, reward, term, trunc, info = vec.step(np.zeros([3, 4], np.float32))
    >>> obs.shape, reward.tolist(), info["victim_reward"].tolist()
    ((3, 4), [-1.0, -1.0, -1.0], [1.0, 1.0, 1.0])
    """

    def __init__(self, env_id: str, num_envs: int, surface: Victim, radius: _Radius,
                 perturb: Callable | None = None, action_dim: int | None = None,
                 async_envs: bool = False):
        cls = gym.vector.AsyncVectorEnv if async_envs else gym.vector.SyncVectorEnv
        self.envs = cls([lambda: gym.make(env_id)] * int(num_envs),
                        autoreset_mode=AutoresetMode.SAME_STEP)
        self.surface, self.radius = surface, radius
        self.perturb = perturb or (lambda o, a, r: _squash_step(o, a, r, surface.units))
        k = int(action_dim or surface.obs_shape[0])
        self.num_envs = int(num_envs)
        self.metadata = {**self.envs.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}
        self.single_observation_space = self.envs.single_observation_space
        self.observation_space = self.envs.observation_space
        self.single_action_space = gym.spaces.Box(-np.inf, np.inf, (k,), np.float32)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self._obs: np.ndarray | None = None

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, dict]:
        """The copies' reset; their clean observations are kept for the next step."""
        obs, info = self.envs.reset(seed=seed, options=options)
        self._obs = np.asarray(obs, np.float32)
        return obs, info

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                 np.ndarray, dict]:
        """The victim acts on every copy's perturbed observation (one call); the adversary
        gets minus its rewards ``[N]``."""
        seen = self.perturb(self._obs, np.asarray(actions, np.float32), self.radius.value)
        obs, reward, terminated, truncated, info = self.envs.step(self.surface.act(seen))
        self._obs = np.asarray(obs, np.float32)
        reward = np.asarray(reward, np.float64)
        return obs, -reward, terminated, truncated, dict(info, victim_reward=reward)

    def close(self, **kwargs: Any) -> None:
        """Close the copies."""
        self.envs.close(**kwargs)


# -- the trained adversary ----------------------------------------------------------------------
class LearnedAdversary:
    """A trained adversary of one victim at one eps (``kind`` ``"optimal"`` or ``"paad"``).

    ``step(obs [B, d], seed, eps) -> (ŝ, norms [B], victim actions at ŝ, at obs)``, the
    evaluation's batch interface (``seed`` unused: the adversary acts deterministically;
    ``eps`` must be its own). ``cost`` holds its training steps, wall and CPU seconds.
    """

    def __init__(self, agent: Agent, surface: Victim, eps: float, kind: str = "optimal",
                 cost: dict | None = None, perturb: Callable | None = None,
                 victim: Agent | None = None):
        self.agent, self.surface, self.eps, self.kind = agent, surface, float(eps), kind
        self.victim = victim  # the agent it was trained against
        self.cost = dict(cost or {})
        self._perturb = perturb or (lambda o, a, r: _squash_step(o, a, r, surface.units))
        self.name = kind

    def perturb(self, obs: np.ndarray) -> np.ndarray:
        """``ŝ [B, d]`` float32 for clean ``obs [B, d]`` (the adversary's mean action)."""
        obs = np.asarray(obs, np.float32)
        return np.asarray(self._perturb(obs, self.agent.act(obs, deterministic=True), self.eps),
                          np.float32)

    def step(self, obs: np.ndarray, seed: Any = 0, eps: float | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One rollout step of the evaluation (see the class doc); norms in eps units."""
        if eps is not None and not math.isclose(float(eps), self.eps, rel_tol=1e-6):
            raise ValueError(f"eps: this {self.kind} adversary was trained at eps={self.eps}, "
                             f"got {eps}; train one per budget")
        obs = np.asarray(obs, np.float32)
        seen = self.perturb(obs)
        norms = np.max(np.abs((seen - obs) / self.surface.units), axis=-1)
        return seen, norms, self.surface.act(seen), self.surface.act(obs)

    def victim_return(self, n_episodes: int = 10, seed: int = 1_000) -> float:
        """Mean victim return under this adversary on ``n_episodes`` seeded episodes."""
        return _victim_return(self, n_episodes, seed)

    def save(self, directory: str) -> str:
        """The adversary agent (``agents.Agent.save``) and ``adversary.json`` (victim env, eps,
        obs shape, kind, cost)."""
        self.agent.save(directory)
        meta = {"kind": self.kind, "victim_env": self.surface.env_id, "eps": self.eps,
                "obs_shape": list(self.surface.obs_shape), "victim_algo": self.surface.algo,
                "cost": self.cost}
        with replacing(os.path.join(directory, ADVERSARY_FILE)) as tmp, open(tmp, "w") as f:
            json.dump(meta, f, indent=1)
        return directory

    def __repr__(self):
        return f"LearnedAdversary({self.kind!r}, env={self.surface.env_id!r}, eps={self.eps})"


def _victim_return(adversary: LearnedAdversary, n_episodes: int, seed: int) -> float:
    k = min(int(n_episodes), 8)
    env = make_vec_env(adversary.surface.env_id, k, seed=seed)
    targets = episodes_split_evenly(int(n_episodes), k)
    counts = np.zeros(k, int)
    returns: list[float] = []
    lengths: list[int] = []
    try:
        obs = env.reset()
        while (counts < targets).any():
            obs, _r, term, trunc, _f = env.step(adversary.surface.act(adversary.perturb(obs)))
            take_finished_episodes(env, term | trunc, counts, targets, returns, lengths)
    finally:
        env.close()
    return float(np.mean(returns))


# -- training -----------------------------------------------------------------------------------
def _factory(surface: Victim, radius: _Radius, perturb, action_dim):
    """The adversary PPO's env: one :class:`AdversaryEnv` per call, and the vector form its
    vector envs are built from (:class:`AdversaryVectorEnv`: one victim call per step)."""
    def make() -> AdversaryEnv:
        return AdversaryEnv(gym.make(surface.env_id), surface, radius, perturb, action_dim)

    def make_vector_env(num_envs: int, async_envs: bool = False) -> AdversaryVectorEnv:
        return AdversaryVectorEnv(surface.env_id, num_envs, surface, radius, perturb,
                                  action_dim, async_envs)
    # a function, not a callable object: the config holding it is copied by dataclasses.asdict,
    # which deep-copies objects (the victim's compiled graphs cannot be) but not functions
    make.make_vector_env = make_vector_env  # type: ignore[attr-defined]
    return make


def _adversary_ppo(factory, seed: int, overrides: dict | None):
    cfg = {**DEFAULT_PPO, **(overrides or {})}
    return PPO(env=factory, seed=seed, preset=None, **cfg)


def train_adversary(victim: Agent, eps: float, steps: int = 100_000, *, seed: int = 0,
                    kind: str = "optimal", start_radius: float | None = None,
                    curriculum: float = 0.5, eval_every: int = 10_000, eval_episodes: int = 10,
                    eval_seed: int = 1_000, ppo: dict | None = None, progress: bool = True,
                    **kind_kwargs: Any) -> LearnedAdversary:
    """Train a learned adversary of ``victim`` at radius ``eps`` for ``steps`` env steps.

    Args:
      victim: the fixed agent (deterministic actions). eps: L∞ radius in its units (> 0).
      steps: the adversary PPO's budget of env steps (> 0).
      kind: ``"optimal"`` (ATLA's adversary, this module) or ``"paad"`` (PA-AD's director,
        :mod:`agents.robustness.paad`; ``kind_kwargs`` go to its actor: ``pgd_steps``).
      start_radius: the curriculum's first radius (default ``4 · eps``; ``eps``: none);
        ``curriculum``: fraction of ``steps`` over which it shrinks linearly to eps.
      eval_every, eval_episodes, eval_seed: after the curriculum, score the adversary every
        ``eval_every`` steps on ``eval_episodes`` episodes from env seed ``eval_seed`` (held out
        from training's seed) and keep the weights of the lowest victim return.
      ppo: overrides of :data:`DEFAULT_PPO` for the adversary's :class:`agents.PPO`.
    Returns a :class:`LearnedAdversary` whose ``cost`` holds ``adversary_steps``,
    ``wall_seconds``, ``cpu_seconds`` and the held-out victim return it was kept at.
    """
    _checks.choice(kind, "kind", LEARNED_ATTACKS)
    surface, eps, steps = check_adversary_request(victim, eps, steps)
    start = 4.0 * eps if start_radius is None else float(_checks.nonnegative(start_radius,
                                                                              "start_radius"))
    if start < eps:
        raise ValueError(f"start_radius must be >= eps ({eps}) (the curriculum shrinks the "
                         f"radius to eps), got {start}")
    curriculum = _checks.probability(curriculum, "curriculum")
    eval_every = _checks.positive_int(eval_every, "eval_every")
    eval_episodes = _checks.positive_int(eval_episodes, "eval_episodes")
    seed = _checks.positive_int(seed, "seed", minimum=0)
    perturb, action_dim = None, None
    if kind == "paad":
        perturb, action_dim = director_perturbation(victim, surface, **kind_kwargs)
    elif kind_kwargs:
        raise TypeError(f"unexpected keyword(s) for kind='optimal': {sorted(kind_kwargs)}")
    radius = _Radius(start)
    t0, c0 = time.perf_counter(), time.process_time()
    agent = _adversary_ppo(_factory(surface, radius, perturb, action_dim), seed, ppo)
    adversary = LearnedAdversary(agent, surface, eps, kind, perturb=perturb, victim=victim)
    ramp = curriculum * steps
    best = {"return": math.inf, "weights": None, "step": 0}
    next_eval = [max(int(ramp), 1)]

    def on_update(ag, logs):
        done = int(ag.num_timesteps.numpy())
        radius.value = eps if done >= ramp else start + (eps - start) * done / max(ramp, 1.0)
        if done >= next_eval[0]:
            next_eval[0] = done + eval_every
            _keep_best(adversary, best, done, eval_episodes, eval_seed, progress)

    agent.learn(steps, callbacks=[on_update], progress_bar=False, handle_interrupts=False)
    radius.value = eps
    if best["step"] != int(agent.num_timesteps.numpy()):  # the final weights, unless just scored
        _keep_best(adversary, best, int(agent.num_timesteps.numpy()), eval_episodes, eval_seed,
                   progress)
    agent.set_weights(best["weights"])
    adversary.cost = {"adversary_steps": int(agent.num_timesteps.numpy()),
                      "wall_seconds": time.perf_counter() - t0,
                      "cpu_seconds": time.process_time() - c0,
                      "start_radius": start, "curriculum": curriculum,
                      "held_out_return": best["return"], "best_step": best["step"]}
    return adversary


def adversary_for(victim: Agent, kind: str, eps: float, adversaries: Any, steps: int,
                  seed: int = 0, progress: bool = True, **kwargs: Any) -> LearnedAdversary:
    """The adversary of ``kind`` at ``eps`` among ``adversaries`` (trained against ``victim``),
    else one trained now by :func:`train_adversary` (``steps``, ``seed``, ``kwargs``)."""
    for adv in adversaries or ():
        if adv.kind == kind and math.isclose(adv.eps, eps, rel_tol=1e-6):
            if adv.victim is not victim:
                raise ValueError(f"adversaries: the {kind} adversary at eps={eps} was trained "
                                 "against another agent")
            return adv
    return train_adversary(victim, eps, steps, seed=seed, kind=kind, progress=progress,
                           **kwargs)


def _keep_best(adversary, best, done, episodes, seed, progress):
    r = adversary.victim_return(episodes, seed)
    if progress:
        print(f"[train_adversary] {adversary.kind} eps={adversary.eps:g} step {done}: victim "
              f"return {r:.1f} on held-out seeds (best {min(r, best['return']):.1f})",
              file=sys.stderr, flush=True)
    if r < best["return"] or best["weights"] is None:
        best.update({"return": r, "weights": adversary.agent.get_weights(), "step": done})


# -- loading ------------------------------------------------------------------------------------
def load_adversary(directory: str, victim: Agent) -> LearnedAdversary:
    """The adversary saved by :meth:`LearnedAdversary.save`, attached to ``victim``;
    ``ValueError`` when ``victim``'s env or observation shape is not the one it was trained
    against."""
    path = os.path.join(os.fspath(directory), ADVERSARY_FILE)
    if not os.path.exists(path):
        raise ValueError(f"directory: {directory!r} holds no learned adversary (missing "
                         f"{ADVERSARY_FILE})")
    with open(path) as f:
        meta = json.load(f)
    surface = victim_surface(victim)
    if meta["victim_env"] != surface.env_id or tuple(meta["obs_shape"]) != surface.obs_shape:
        raise ValueError(f"directory: the adversary in {directory!r} was trained against a "
                         f"victim on {meta['victim_env']} (obs shape {tuple(meta['obs_shape'])}),"
                         f" not on {surface.env_id} (obs shape {surface.obs_shape})")
    kind, eps = meta["kind"], float(meta["eps"])
    perturb, action_dim = None, None
    if kind == "paad":
        perturb, action_dim = director_perturbation(victim, surface)
    factory = _factory(surface, _Radius(eps), perturb, action_dim)
    agent = load(directory, env=factory)
    return LearnedAdversary(agent, surface, eps, kind, cost=meta.get("cost"), perturb=perturb,
                            victim=victim)
