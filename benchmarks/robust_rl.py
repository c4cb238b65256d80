"""Robustness of trained agents under observation attacks: return per attack and eps, and the
robustness radius.

The robustness radius of an agent is the largest eps of the grid (0.02, 0.05, 0.075, 0.1, 0.15,
0.2, 0.3 by default) up to which its median episode return under the strongest attack (the lowest
median over every attack, ``rs`` included) stays >= ``--threshold`` (400 on CartPole-v1: 80% of
the maximum 500). Budgets are in the agent's units (raw for the default PPO, which does not
normalise observations). The attack evaluation's speed is printed next to a clean evaluation's
(env steps per second, same env copies, same episodes) as a ratio.

Examples::

    python benchmarks/robust_rl.py --seeds 0 --episodes 8             # PPO CartPole preset
    python benchmarks/robust_rl.py --agent runs/ppo --episodes 20     # a saved agent
    python benchmarks/robust_rl.py --seeds 0 1 2 3 4 --json robust_rl.json

Run it from a snapshot copy of the tree (AutoGraph re-reads source files).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# the repository before benchmarks/ (whose agents.py would shadow the agents package)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

GRID = (0.02, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)


def robustness_radius(report, threshold: float) -> tuple[float, dict]:
    """Largest eps such that, at it and at every smaller budget, the lowest median over the
    attacks stays >= ``threshold`` (0.0 when the smallest budget already fails); and the
    strongest attack's median per eps."""
    strongest = {}
    for e in report.eps:
        rows = [r for r in report.rows if np.isclose(r["eps"], e)]
        worst = min(rows, key=lambda r: r["median"])
        strongest[e] = (worst["attack"], worst["median"])
    radius = 0.0
    for e in report.eps:
        if strongest[e][1] < threshold:
            break
        radius = e
    return radius, strongest


def evaluate_agent(agent, attacks, grid, episodes, seed, rs_steps, threshold):
    import agents

    t0 = time.perf_counter()
    clean = agent.evaluate(episodes, seed=seed)
    clean_seconds = time.perf_counter() - t0
    clean_sps = sum(clean["lengths"]) / clean_seconds
    t0 = time.perf_counter()
    report = agents.evaluate_under_attack(agent, attacks, grid, n_episodes=episodes, seed=seed,
                                          rs_steps=rs_steps)
    seconds = time.perf_counter() - t0
    radius, strongest = robustness_radius(report, threshold)
    attack_sps = float(np.median([r["steps_per_second"] for r in report.rows]))
    return {"report": report, "radius": radius, "strongest": strongest, "seconds": seconds,
            "clean_steps_per_second": clean_sps, "attack_steps_per_second": attack_sps}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agent", default=None, help="a saved agent directory (default: train)")
    p.add_argument("--algo", default="ppo", help="ppo (default), a2c, reinforce or dqn")
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (default: the preset's budget)")
    p.add_argument("--episodes", type=int, default=20, help="episodes per row (default 20)")
    p.add_argument("--attacks", default="random,action,mad,critic,rs")
    p.add_argument("--eps", default=",".join(str(e) for e in GRID))
    p.add_argument("--rs-steps", type=int, default=20_000)
    p.add_argument("--threshold", type=float, default=400.0)
    p.add_argument("--json", default=None, help="write the results to this JSON file")
    args = p.parse_args(argv)

    import agents
    from agents.config import get_preset, preset_for

    grid = [float(e) for e in args.eps.split(",")]
    attacks = [a for a in args.attacks.split(",") if a]
    results = []
    for seed in ([None] if args.agent else args.seeds):
        t0 = time.perf_counter()
        if args.agent:
            agent = agents.load(args.agent)
            label = args.agent
        else:
            cls = {"ppo": agents.PPO, "a2c": agents.A2C, "reinforce": agents.REINFORCE,
                   "dqn": agents.DQN}[args.algo]
            agent = cls(env=args.env, seed=seed)
            preset = preset_for(args.algo, args.env)
            steps = args.steps or (get_preset(preset)["steps"] if preset else 100_000)
            agent.learn(steps, progress_bar=False)
            label = f"{args.algo} {args.env} seed {seed} ({steps} steps)"
        train_seconds = time.perf_counter() - t0
        eval_seed = (agent.config.seed if seed is None else seed) + 10_000
        out = evaluate_agent(agent, attacks, grid, args.episodes, eval_seed, args.rs_steps,
                             args.threshold)
        print(f"\n== {label} (trained/loaded in {train_seconds:.0f} s, evaluated in "
              f"{out['seconds']:.0f} s)")
        print(out["report"])
        print("strongest attack per eps (median): " + ", ".join(
            f"{e:g}: {a} {m:.0f}" for e, (a, m) in out["strongest"].items()))
        print(f"robustness radius (median >= {args.threshold:g} under the strongest attack): "
              f"{out['radius']:g}")
        print(f"attack evaluation {out['attack_steps_per_second']:.0f} env steps/s (median over "
              f"rows) vs clean evaluation {out['clean_steps_per_second']:.0f} steps/s: ratio "
              f"{out['attack_steps_per_second'] / out['clean_steps_per_second']:.3f}")
        sys.stdout.flush()
        results.append({"agent": label, "radius": out["radius"],
                        "strongest": {str(e): v for e, v in out["strongest"].items()},
                        "clean_steps_per_second": out["clean_steps_per_second"],
                        "attack_steps_per_second": out["attack_steps_per_second"],
                        "report": out["report"].to_dict()})
    if len(results) > 1:
        radii = [r["radius"] for r in results]
        print(f"\nrobustness radius over {len(radii)} seeds: median {np.median(radii):g} "
              f"(all: {radii})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
