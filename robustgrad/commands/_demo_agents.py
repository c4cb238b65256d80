"""The agents stage of ``robustgrad demo``: a short PPO run on CartPole-v1.

Trains PPO (8 envs, CleanRL defaults) for :data:`STEPS` environment steps, evaluates it
deterministically over 10 episodes and saves it under ``out_dir/agents/ppo_cartpole``
(``agents.load`` reads it back) with a learning-curve PNG. About a minute on 2 cores.

Example::

    from robustgrad.commands import _demo_agents
    result = _demo_agents.run("runs/demo")   # {'mean_return': ..., 'train_seconds': ..., 'out': ...}
"""

from __future__ import annotations

import os
import time

STEPS = 50_000


def run(out_dir: str, steps: int = STEPS, seed: int = 0, progress: bool = True) -> dict:
    """Train, evaluate and save the demo agent; returns its mean return, time and directory."""
    import agents
    from robustgrad.commands.train_agent import plot_learning_curve

    out = os.path.join(os.fspath(out_dir), "agents", "ppo_cartpole")
    print(f"[agents] PPO on CartPole-v1, {steps} steps, 8 envs, seed {seed}", flush=True)
    t0 = time.perf_counter()
    agent = agents.PPO(env="CartPole-v1", seed=seed)
    agent.learn(steps, progress_bar=progress)
    train_s = time.perf_counter() - t0
    result = agent.evaluate(10)
    agent.save(out)
    plot_learning_curve(agent.history, os.path.join(out, "learning_curve.png"),
                        f"PPO CartPole-v1 (seed {seed})")
    print(f"[agents] trained in {train_s:.1f} s ({steps / train_s:.0f} env steps/s incl. "
          f"compilation); deterministic evaluation over 10 episodes: mean return "
          f"{result['mean_return']:.1f} +/- {result['std_return']:.1f} (random policy: ~22, "
          f"maximum 500)")
    print(f"[agents] saved to {out} (agents.load({out!r}))")
    return {"mean_return": result["mean_return"], "train_seconds": train_s, "out": out}
