"""``robustgrad evaluate-agent``: evaluate a saved RL agent.

Example::

    robustgrad evaluate-agent --agent runs/ppo --episodes 20
    robustgrad evaluate-agent --agent runs/ppo --episodes 20 --stochastic --json

Runs full episodes on a fresh vector environment of the agent's env id and prints the
mean and standard deviation of the episode return (deterministic actions unless
``--stochastic``). Observation attacks on agents are not in this version yet.
"""

from __future__ import annotations

import argparse
import json
import sys

HELP = "evaluate a saved RL agent (mean episode return)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent", required=True, help="directory written by train-agent / save()")
    p.add_argument("--episodes", type=int, default=20, help="episodes (default 20)")
    p.add_argument("--seed", type=int, default=None,
                   help="evaluation env seed (default: training seed + 10000)")
    p.add_argument("--stochastic", action="store_true", help="sample actions instead of the mode")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    import agents

    try:
        if args.episodes <= 0:
            raise ValueError(f"--episodes: must be positive, got {args.episodes}")
        agent = agents.load(args.agent)
    except ValueError as exc:
        print(f"robustgrad evaluate-agent: {exc}", file=sys.stderr)
        return 2
    result = agent.evaluate(args.episodes, deterministic=not args.stochastic, seed=args.seed)
    result["algo"] = agent.algo
    result["env"] = agent.config.env
    result["num_timesteps"] = int(agent.num_timesteps.numpy())
    if args.json:
        print(json.dumps(result))
    else:
        mode = "stochastic" if args.stochastic else "deterministic"
        print(f"{agent.algo.upper()} on {agent.config.env} after {result['num_timesteps']} steps: "
              f"mean return {result['mean_return']:.1f} +/- {result['std_return']:.1f} over "
              f"{args.episodes} episodes ({mode}); min {min(result['returns']):.1f}, "
              f"max {max(result['returns']):.1f}")
    return 0
