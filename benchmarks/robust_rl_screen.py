"""A quick screen of robust-training settings: train one agent per seed, attack it on a few
budgets, print one JSON line per agent.

Cheaper than ``benchmarks/robust_rl.py`` (no vanilla side, no full grid, no radius): use it to
decide which settings deserve the full protocol. Per agent it prints the clean median and mean
return and, per attack and eps, the median and mean return under attack, the share of steps
whose action the attack changed, and the worst-case normalised score per eps (see
``agents.evaluate_under_attack``). The evaluation seed is ``10000 + seed``, as in
``robust_rl.py``, so both scripts score the same episodes.

Examples (docs/benchmarks/robust-rl.md, "What else was tried against Robust Sarsa")::

    python benchmarks/robust_rl_screen.py --steps 200000 --seeds 3 0 \\
        --set robust='"sa"' --set robust_eps=0.05 --set robust_kappa=3
    python benchmarks/robust_rl_screen.py --steps 200000 --seeds 3 0 \\
        --set robust='"adv"' --set robust_eps=0.05 --set robust_attack='"action"'
    python benchmarks/robust_rl_screen.py --env Pendulum-v1 --seeds 0 --eps 0.1,0.2,0.3 \\
        --attacks random,action,mad,critic --set robust='"adv"' --set robust_eps=0.3

Run it from a snapshot copy of the tree (AutoGraph re-reads source files).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# the repository before benchmarks/ (whose agents.py would shadow the agents package)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring).

    >>> a = parse_args(["--seeds", "3", "0", "--set", "robust_kappa=3"])
    >>> a.seeds, a.set, a.eps
    ([3, 0], ['robust_kappa=3'], '0.02,0.05')
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", default="ppo", choices=["ppo", "a2c", "dqn"])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: preset's)")
    p.add_argument("--seeds", type=int, nargs="+", default=[3, 0])
    p.add_argument("--attacks", default="rs")
    p.add_argument("--eps", default="0.02,0.05")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--rs-steps", type=int, default=10_000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override (JSON value)")
    p.add_argument("--jsonl", default=None, help="also append each line to this file")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Train and screen one agent per seed."""
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    from robust_rl import _budget, _overrides  # the same --set parsing and preset budget

    import agents

    overrides = _overrides(args, "vanilla", None)  # "vanilla": only the --set overrides
    cls = agents.algorithm(args.algo, "--algo")
    steps = _budget(args)
    grid = [float(e) for e in args.eps.split(",")]
    for seed in args.seeds:
        agent = cls(env=args.env, seed=seed, **overrides)
        c0 = time.process_time()
        agent.learn(steps, progress_bar=False)
        train_cpu = time.process_time() - c0
        report = agents.evaluate_under_attack(
            agent, args.attacks.split(","), grid, n_episodes=args.episodes, seed=seed + 10_000,
            rs_steps=args.rs_steps, progress=False).to_dict()
        line = {"algo": args.algo, "env": args.env, "seed": seed, "steps": steps,
                "overrides": overrides, "clean_median": float(report["clean"]["median"]),
                "clean_mean": float(report["clean"]["mean"]),
                "rows": {f"{r['attack']}@{r['eps']:g}": {
                    "median": float(r["median"]), "mean": float(r["mean"]),
                    "action_changed": round(float(r["action_changed"]), 3)}
                    for r in report["rows"]},
                "worst_case_score": {f"{w['eps']:g}": round(float(w["normalized_score"]), 3)
                                     for w in report["worst_case"]},
                "train_cpu_seconds": round(train_cpu, 1), "load": os.getloadavg()[0]}
        text = json.dumps(line)
        print(text, flush=True)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
