"""Rollouts on Ray workers (agents/backends/distributed.py): throughput scaling and overhead.

1. Scaling on an env whose step is expensive but cheap on CPU (CartPole sleeping
   ``--sleep-ms`` per step, standing in for an external simulator): env steps/s of the
   rollout phase with 1, 2, 4, 8 workers (``--envs-per-worker`` envs each), against linear
   scaling of the 1-worker rate. Goal: >= 0.8 x linear up to 8 workers.
2. Overhead on plain CartPole: the rollout phase of 2 workers against the local agent's
   compiled rollout over the same ``num_envs``, for several fragment sizes (steps per
   worker per iteration); reports the smallest fragment at which 2 workers are within
   10% of the local agent (overhead = local rate / distributed rate - 1).
3. ``--return-seeds S`` (off by default: training runs): the final greedy return of PPO on
   CartPole-v1 with the preset settings, trained with ``--return-workers`` workers against
   the local agent, over seeds 0..S-1 (10 evaluation episodes each); reports both
   distributions and a two-sided permutation p-value for the difference of means. (With
   one worker the runs are bit-identical to the local ones, see the tests; with two the
   workers' envs and action streams differ, so the returns are a sample of the same
   distribution only if nothing else changed.)

Only the collection is timed (``RolloutWorkers.collect`` vs ``OnPolicyAgent._rollout``):
the learner's update is the same code in both cases. Run it from a snapshot copy of the
tree (AutoGraph re-reads sources)::

    PYTHONPATH=/tmp/snap python benchmarks/distributed_rl.py --json runs/distributed_rl.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# the repository root, not benchmarks/ (whose agents.py would shadow the agents package)
sys.path[0:1] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402

import agents  # noqa: E402
from agents.backends.distributed import init_ray  # noqa: E402
from agents.config import PPOConfig  # noqa: E402


class SleepyCartPole(gym.Wrapper):
    """CartPole-v1 whose ``step`` sleeps ``sleep_s`` first (an external simulator's latency)."""

    sleep_s = 0.002

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))

    def step(self, action):
        time.sleep(self.sleep_s)
        return self.env.step(action)


def _config(env, num_envs, n_steps):
    return PPOConfig(env=env, num_envs=num_envs, n_steps=n_steps, n_minibatches=1, n_epochs=1,
                     seed=0)


def rollout_rate(collect, steps_per_call, iters):
    """Env steps per second of ``collect()`` over ``iters`` calls after one warm-up call."""
    collect()
    start = time.perf_counter()
    for _ in range(iters):
        collect()
    return steps_per_call * iters / (time.perf_counter() - start)


def local_rate(cfg, iters):
    agent = agents.PPO(cfg)
    try:
        agent._reset_env()
        return rollout_rate(agent._rollout, cfg.n_steps * cfg.num_envs, iters)
    finally:
        agent.close()


def distributed_rate(cfg, workers, iters):
    """Env steps/s of ``collect`` and the mean fraction of its wall time that Ray adds on
    top of the slowest worker's own rollout (weights put, calls, result transfer)."""
    agent = agents.PPO(cfg, rollout_workers=workers)
    fractions = []

    def collect():
        out = agent.rollout_workers.collect()
        logs = agent.rollout_workers.logs
        fractions.append(logs["rollout_overhead_seconds"] / logs["rollout_seconds"])
        return out

    try:
        agent._reset_env()
        rate = rollout_rate(collect, cfg.n_steps * cfg.num_envs, iters)
        return rate, sum(fractions[1:]) / len(fractions[1:])
    finally:
        agent.close()


def final_return(seed, steps, workers):
    """Mean greedy return (10 episodes) of PPO on CartPole-v1 (preset) after ``steps``."""
    agent = agents.PPO(env="CartPole-v1", seed=seed, rollout_workers=workers)
    try:
        agent.learn(steps, progress_bar=False)
        return agent.evaluate(10)["mean_return"]
    finally:
        agent.close()


def permutation_p_value(a, b, rounds=20_000, seed=0):
    """Two-sided permutation p-value of ``mean(a) - mean(b)`` (random relabellings)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    both = np.concatenate([a, b])
    observed = abs(a.mean() - b.mean())
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(rounds):
        perm = rng.permutation(both)
        hits += abs(perm[:len(a)].mean() - perm[len(a):].mean()) >= observed - 1e-12
    return (hits + 1) / (rounds + 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2,4,8")
    p.add_argument("--envs-per-worker", type=int, default=4)
    p.add_argument("--n-steps", type=int, default=64)
    p.add_argument("--sleep-ms", type=float, default=2.0)
    p.add_argument("--fragments", default="64,512,2048",
                   help="steps per worker per iteration for the overhead rows (1 env each)")
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--return-seeds", type=int, default=0,
                   help="train local and distributed PPO on CartPole for seeds 0..S-1")
    p.add_argument("--return-workers", type=int, default=2)
    p.add_argument("--return-steps", type=int, default=None,
                   help="training budget (default: the preset's, 100k)")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    SleepyCartPole.sleep_s = args.sleep_ms / 1000.0
    init_ray(None, num_cpus=max(workers + [2]))
    out = {"sleep_ms": args.sleep_ms, "envs_per_worker": args.envs_per_worker,
           "n_steps": args.n_steps, "cpu_count": os.cpu_count(),
           "loadavg": os.getloadavg(), "scaling": [], "overhead": []}
    base = None
    for k in [] if args.skip_throughput else workers:
        cfg = _config(SleepyCartPole, k * args.envs_per_worker, args.n_steps)
        rate, ray_share = distributed_rate(cfg, k, args.iters)
        base = base or rate / k
        row = {"workers": k, "steps_per_second": rate, "fraction_of_linear": rate / (base * k),
               "ray_share_of_iteration": ray_share}
        out["scaling"].append(row)
        print(f"sleep {args.sleep_ms:g} ms  workers {k}: {rate:8.0f} env steps/s  "
              f"({row['fraction_of_linear']:.2f} x linear; Ray {100 * ray_share:.0f}% of the "
              "iteration)", flush=True)
    under = under_ray = None
    for frag in [] if args.skip_throughput else [int(f) for f in args.fragments.split(",")]:
        cfg = _config("CartPole-v1", 2, frag)
        loc = local_rate(cfg, args.iters)
        dist, ray_share = distributed_rate(cfg, 2, args.iters)
        overhead = loc / dist - 1.0
        out["overhead"].append({"fragment": frag, "local_steps_per_second": loc,
                                "workers2_steps_per_second": dist, "overhead": overhead,
                                "ray_share_of_iteration": ray_share})
        if under is None and overhead < 0.10:
            under = frag
        if under_ray is None and ray_share < 0.10:
            under_ray = frag
        print(f"CartPole fragment {frag:5d}: local {loc:8.0f}  2 workers {dist:8.0f} steps/s  "
              f"overhead {100 * overhead:+.0f}% (Ray's own share {100 * ray_share:.0f}%)",
              flush=True)
    out["fragment_under_10pct"] = under
    out["fragment_ray_share_under_10pct"] = under_ray
    if args.return_seeds:
        steps = args.return_steps or agents.core.presets.load_presets()["ppo-CartPole-v1"]["steps"]
        local, dist = [], []
        for seed in range(args.return_seeds):
            local.append(final_return(seed, steps, None))
            dist.append(final_return(seed, steps, args.return_workers))
            print(f"seed {seed}: local {local[-1]:6.1f}  {args.return_workers} workers "
                  f"{dist[-1]:6.1f}", flush=True)
        pval = permutation_p_value(local, dist)
        out["returns"] = {"steps": steps, "workers": args.return_workers, "local": local,
                          "distributed": dist, "permutation_p_value": pval}
        print(f"final return over {args.return_seeds} seeds ({steps} steps): local median "
              f"{np.median(local):.1f} mean {np.mean(local):.1f}; {args.return_workers} workers "
              f"median {np.median(dist):.1f} mean {np.mean(dist):.1f}; p = {pval:.2f}")
    out["loadavg_end"] = os.getloadavg()
    print(f"smallest fragment with 2 workers within 10% of the local rollout: {under}; "
          f"with Ray's own share under 10%: {under_ray}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    ray.shutdown()
    return out


if __name__ == "__main__":
    main()
