"""Attack a CartPole agent's observations and report its return per attack and budget.

    .venv/bin/python examples/attack_agent.py            # the full run (48 s of CPU)
    .venv/bin/python examples/attack_agent.py --quick    # the tests' tiny budget

Guide: docs/guides/robust-rl.md.
"""
import sys

import agents

QUICK = "--quick" in sys.argv                   # the tests' tiny budget

agent = agents.PPO(env="CartPole-v1", seed=0)
agent.learn(4_096 if QUICK else 40_000, progress_bar=False)

report = agents.evaluate_under_attack(
    agent, attacks=["random", "mad", "critic"], eps=[0.05, 0.2],
    n_episodes=4 if QUICK else 10, seed=0, progress=False)
print(report)                  # clean, random policy, each attack x eps, worst case up to eps
worst = report.worst_case[-1]        # the lowest mean return over attacks at the largest eps
print(f"clean return {report.clean['mean']:.1f}; at eps {worst['eps']}: {worst['mean']:.1f} "
      f"({worst['attack']})")
report.save("runs/attack_agent")                # report.json, report.txt, plots
