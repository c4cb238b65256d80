"""Whole episodes of an agent on a fresh vector env: clean, under a perturbation, or with random
actions; what attack evaluation (:mod:`agents.robustness.attack_evaluation`) and certification along the
agent's own episodes (:func:`agents.robustness.certify.certify_agent`) run.

>>> import agents
>>> agent = agents.PPO(env="CartPole-v1", num_envs=2, n_steps=8, preset=None)
>>> run = _run_episodes(agent, 2, 2, seed=0)
>>> len(run["returns"]), run["action_changed"]
(2, 0.0)
"""

from __future__ import annotations

import copy
import time

import gymnasium as gym
import numpy as np

from agents.envs import episodes_split_evenly, make_vec_env, take_finished_episodes

__all__: list[str] = []  # private helpers of the robustness wing


def _actions_differ(a, b, space) -> np.ndarray:
    """Per row: the attacked action differs (discrete) or moved by > 1% of the action range."""
    a, b = np.asarray(a), np.asarray(b)
    if isinstance(space, gym.spaces.Discrete):
        return a != b
    span = np.where(np.isfinite(space.high - space.low), space.high - space.low, 1.0)
    return np.any(np.abs(a - b) > 0.01 * span, axis=-1)



def _run_episodes(agent, n_episodes, num_envs, seed, perturb=None, random_actions=False,
                  record_states=False):
    """Whole episodes split evenly over ``num_envs`` copies (as ``Agent.evaluate``).

    ``perturb(obs, t) -> (obs_adv, norms, actions at obs_adv, actions at obs)``. Returns a
    dict of returns, lengths, changed fraction, perturbation norms, steps per second and env
    0's first trajectory (``record_states``: also ``states``, every observation acted on).
    """
    env = make_vec_env(agent.config.env, num_envs, seed=seed)
    space = env.single_action_space
    rng = np.random.default_rng(seed)
    if random_actions and not isinstance(space, gym.spaces.Discrete):
        space = copy.deepcopy(space)  # its own generator, seeded: the baseline repeats
        space.seed(int(rng.integers(2**31)))
    targets = episodes_split_evenly(n_episodes, num_envs)
    counts = np.zeros(num_envs, int)
    returns: list[float] = []
    lengths: list[int] = []
    changed: list[np.ndarray] = []
    norms: list[np.ndarray] = []
    trajectory: list[list[float]] = []
    states: list[np.ndarray] = []
    first_done = False
    steps = 0
    start = time.perf_counter()
    try:
        obs = env.reset()
        t = 0
        while (counts < targets).any():
            active = counts < targets
            if random_actions:
                actions = np.array([space.sample() for _ in range(num_envs)]) \
                    if not isinstance(space, gym.spaces.Discrete) \
                    else rng.integers(0, space.n, num_envs)
            elif perturb is not None:
                seen, n, actions, clean = perturb(obs, t)
                norms.append(n[active])
                changed.append(_actions_differ(actions, clean, space)[active])
            else:
                actions = agent.act(obs, deterministic=True)
            if not first_done:
                trajectory.append(obs[0].tolist())
            if record_states:
                states.append(np.asarray(obs, np.float32)[active])
            obs, _r, term, trunc, _f = env.step(actions)
            steps += int(active.sum())
            t += 1
            done = term | trunc
            first_done = first_done or bool(done[0])
            take_finished_episodes(env, done, counts, targets, returns, lengths)
    finally:
        env.close()
    seconds = time.perf_counter() - start
    return {"returns": [float(r) for r in returns], "lengths": [int(v) for v in lengths],
            "action_changed": float(np.mean(np.concatenate(changed))) if changed else 0.0,
            "norms": np.concatenate(norms) if norms else np.zeros(0),
            "steps_per_second": steps / max(seconds, 1e-9),
            "trajectory": trajectory,
            "states": np.concatenate(states) if states else np.zeros((0,) + tuple(agent.obs_shape))}
