"""Seed ``s`` of a sweep against seed ``s`` trained alone: the largest weight difference.

Issue 33 item 5: each seed on the seed axis draws its random streams as that seed alone, so
``agents.PPO(num_seeds=S).learn(n).export(s)`` and ``agents.PPO(seed=seed + s).learn(n)`` agree
up to float rounding. This trains, for each backend, one ``S``-seed agent and the ``S`` agents
alone (the shipped preset of ``--env``, nothing else set) and prints, per seed, max |weight
difference| over ``get_weights()`` (networks and observation statistics), with wall and CPU
seconds. The slow test ``tests/agents_tests/test_agents_seed_axis.py`` asserts bounds; this
prints the figures.

``--settings``: ``preset`` (the default: the shipped preset of ``--algo`` on ``--env``, e.g.
PPO CartPole-v1 with 8 envs x 32 steps and one 256-row minibatch) or ``purejaxrl`` (PPO only:
PureJaxRL's CartPole settings as ``benchmarks/seeds_speed.py --settings purejaxrl`` builds them,
``PPOConfig()`` with 4 envs x 128 steps, 4 epochs of 4 minibatches of 128 rows).

Examples::

    python benchmarks/seed_rerun.py --steps 50000
    python benchmarks/seed_rerun.py --settings purejaxrl --steps 50000 --backends graph
    python benchmarks/seed_rerun.py --algo dqn --steps 2048 --backends graph
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

SETTINGS: dict[str, dict] = {
    "preset": {},
    "purejaxrl": {"preset": None, "num_envs": 4},
}
"""``--settings`` -> the agent's keyword arguments beside ``env``, ``backend`` and the seeds:
the shipped preset, or ``PPOConfig()``'s defaults (PureJaxRL's CartPole settings) with 4 envs
(as ``benchmarks/seeds_speed.py --settings purejaxrl``)."""


def max_weight_diff(a, b) -> float:
    """max |a - b| over the two agents' ``get_weights()``."""
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a.get_weights(), b.get_weights(),
                                                            strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", choices=("ppo", "dqn"), default="ppo")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--steps", type=int, default=50_000, help="env steps per seed")
    parser.add_argument("--seeds", type=int, default=2, help="S, the sweep's seeds")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--backends", nargs="+", default=["gymnasium", "graph"],
                        choices=("gymnasium", "graph"))
    parser.add_argument("--settings", choices=tuple(SETTINGS), default="preset",
                        help="preset: the shipped preset; purejaxrl: PureJaxRL's PPO settings "
                             "(--algo ppo only)")
    args = parser.parse_args(argv)
    if args.settings == "purejaxrl" and args.algo != "ppo":
        parser.error(f"--settings purejaxrl: PureJaxRL's settings are PPO's; got --algo "
                     f"{args.algo}")
    if args.steps < 1 or args.seeds < 2 or args.seed < 0:
        parser.error(f"--steps must be >= 1, --seeds >= 2 and --seed >= 0; got --steps "
                     f"{args.steps}, --seeds {args.seeds}, --seed {args.seed}")
    import agents  # noqa: PLC0415 - after the path and the log level are set

    cls = {"ppo": agents.PPO, "dqn": agents.DQN}[args.algo]
    settings = SETTINGS[args.settings]
    print(f"{args.algo} {args.env} ({args.settings} settings: {settings or 'the preset'}), "
          f"{args.steps} steps per seed, S = {args.seeds}, seeds {args.seed}.."
          f"{args.seed + args.seeds - 1}; load {os.getloadavg()[0]:.2f}")
    for backend in args.backends:
        wall, cpu = time.perf_counter(), time.process_time()
        many = cls(num_seeds=args.seeds, seed=args.seed, env=args.env, backend=backend,
                   **settings)
        many.learn(args.steps, progress_bar=False)
        diffs = []
        for s in range(args.seeds):
            one = cls(seed=args.seed + s, env=args.env, backend=backend, **settings)
            one.learn(args.steps, progress_bar=False)
            diffs.append(max_weight_diff(many.export(s), one))
        print(f"{backend:10s} max |weight difference| per seed: "
              f"{', '.join(f'{d:.3g}' for d in diffs)} ({time.perf_counter() - wall:.0f} s wall, "
              f"{time.process_time() - cpu:.0f} CPU s; load {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
