"""Train PPO on CartPole-v1 and evaluate the greedy policy.

    .venv/bin/python examples/train_agent.py            # ~30 s on 2 cores (return ~500)
    .venv/bin/python examples/train_agent.py --quick    # a few seconds (the tests)

Guide: docs/guides/rl-agents.md.
"""
import argparse
import tempfile

import agents

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--quick", action="store_true", help="a tiny budget (used by the tests)")
args = parser.parse_args()

agent = agents.PPO(env="CartPole-v1", seed=0)      # the shipped preset for (ppo, CartPole-v1)
agent.learn(4_096 if args.quick else 60_000, progress_bar=False)
score = agent.evaluate(10)                          # deterministic actions, own episode seeds
print(f"mean return over 10 episodes: {score['mean_return']:.1f}")

with tempfile.TemporaryDirectory() as directory:    # crash-safe save, no pickle
    agent.save(directory)
    again = agents.load(directory)
    print("reloaded:", again.evaluate(10)["mean_return"] == score["mean_return"])
