"""Train PPO on CartPole-v1, evaluate the greedy policy, save and reload it.

    .venv/bin/python examples/train_agent.py            # the full run (27 s of CPU, return 500)
    .venv/bin/python examples/train_agent.py --quick    # the tests' tiny budget

Guide: docs/guides/rl-agents.md.
"""
import sys

import agents

QUICK = "--quick" in sys.argv                   # the tests' tiny budget

agent = agents.PPO(env="CartPole-v1", seed=0)      # the shipped preset for (ppo, CartPole-v1)
agent.learn(4_096 if QUICK else 60_000, progress_bar=False)
score = agent.evaluate(10)                          # deterministic actions, own episode seeds
print(f"mean return over 10 episodes: {score['mean_return']:.1f}")

agent.save("runs/ppo_cartpole")                     # crash-safe, no pickle
again = agents.load("runs/ppo_cartpole")
print("reloaded:", again.evaluate(10)["mean_return"] == score["mean_return"])
