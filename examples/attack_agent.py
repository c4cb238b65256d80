"""Attack a CartPole agent's observations and report its return per attack and budget.

    .venv/bin/python examples/attack_agent.py            # ~45 s on 2 cores
    .venv/bin/python examples/attack_agent.py --quick    # a few seconds (the tests)

Guide: docs/guides/robust-rl.md.
"""
import argparse

import agents

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--quick", action="store_true", help="a tiny budget (used by the tests)")
args = parser.parse_args()

agent = agents.PPO(env="CartPole-v1", seed=0)
agent.learn(4_096 if args.quick else 40_000, progress_bar=False)

report = agents.evaluate_under_attack(
    agent, attacks=["random", "mad", "critic"], eps=[0.05, 0.2],
    n_episodes=4 if args.quick else 10, seed=0, progress=False)
print(report)                  # clean, random policy, each attack x eps, worst case up to eps
worst = report.worst_case[-1]        # the lowest mean return over attacks at the largest eps
print(f"clean return {report.clean['mean']:.1f}; at eps {worst['eps']}: {worst['mean']:.1f} "
      f"({worst['attack']})")
