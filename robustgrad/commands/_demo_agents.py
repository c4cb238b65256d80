"""The agents stage of ``robustgrad demo``: a short PPO run on CartPole-v1, then SA-PPO.

Trains PPO (8 envs, CleanRL defaults) for :data:`STEPS` environment steps, evaluates it
deterministically over 10 episodes and saves it under ``out_dir/agents/ppo_cartpole``
(``agents.load`` reads it back) with a learning-curve PNG. About a minute on 2 cores.
:func:`run_robust` trains SA-PPO with the same settings and compares both under the same
observation attacks (a few minutes more).

Example::

    from robustgrad.commands import _demo_agents
    result = _demo_agents.run("runs/demo")   # {'mean_return': ..., 'train_seconds': ..., 'out': ...}
"""

from __future__ import annotations

import os
import time

STEPS = 50_000


def run(out_dir: str | os.PathLike[str], steps: int = STEPS, seed: int = 0, progress: bool = True) -> dict:
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


ROBUST_EPS = 0.05
ROBUST_KAPPA = 3.0
ATTACKS = ("random", "mad", "critic")
ATTACK_EPS = (0.05, 0.1, 0.15)
EPISODES = 5


def run_robust(out_dir: str | os.PathLike[str], vanilla_dir: str, steps: int = STEPS, seed: int = 0,
               progress: bool = True) -> dict:
    """Train SA-PPO (Zhang et al. 2020; same settings as the demo's PPO, eps
    :data:`ROBUST_EPS`, kappa :data:`ROBUST_KAPPA`), evaluate it and the vanilla agent saved in
    ``vanilla_dir`` under the same observation attacks, print both side by side; returns
    ``{"eps": [...], "vanilla": [...], "sa": [...]}`` (the worst case over :data:`ATTACKS` of
    the mean return per eps, the clean return first at eps 0)."""
    import agents

    out = os.path.join(os.fspath(out_dir), "agents", "sappo_cartpole")
    print(f"[agents] SA-PPO on CartPole-v1, {steps} steps (eps {ROBUST_EPS:g}, kappa "
          f"{ROBUST_KAPPA:g}, 10 PGD steps inside the update)", flush=True)
    t0 = time.perf_counter()
    sa = agents.PPO(env="CartPole-v1", seed=seed, robust="sa", robust_eps=ROBUST_EPS,
                    robust_kappa=ROBUST_KAPPA)
    sa.learn(steps, progress_bar=progress)
    print(f"[agents] SA-PPO trained in {time.perf_counter() - t0:.1f} s", flush=True)
    sa.save(out)
    vanilla = agents.load(vanilla_dir)
    curves = {"eps": [0.0, *ATTACK_EPS]}
    for name, agent in (("vanilla", vanilla), ("sa", sa)):
        report = agents.evaluate_under_attack(agent, list(ATTACKS), list(ATTACK_EPS),
                                              n_episodes=EPISODES, seed=seed + 10_000,
                                              progress=False)
        report.save(os.path.join(out_dir, "agents", f"{name}_under_attack"))
        curves[name] = [report.clean["mean"], *(w["mean"] for w in report.worst_case)]
    print(f"[agents] worst-case mean return over {', '.join(ATTACKS)} ({EPISODES} episodes, "
          f"L∞ raw units):")
    print(f"  {'eps':>5s}  {'PPO':>7s}  {'SA-PPO':>7s}")
    for e, a, b in zip(curves["eps"], curves["vanilla"], curves["sa"]):
        print(f"  {e:5g}  {a:7.1f}  {b:7.1f}" + ("   (clean)" if e == 0 else ""))
    print(f"[agents] saved to {out}; reports under {os.path.join(out_dir, 'agents')}/"
          f"{{vanilla,sa}}_under_attack", flush=True)
    return curves
