"""Certified actions of a vanilla DQN against an SA-DQN trained with the convex regulariser, and
the training cost of the convex regulariser against the PGD (``mad``/``action``) one.

Two parts, one process:

* ``cost``: ``--cost-steps`` training steps of each kind (vanilla, SA ``pgd``, SA ``convex``)
  alternated over ``--cost-repeats`` rounds (interleaved so load changes hit every kind), for DQN
  and PPO on CartPole-v1; wall and CPU seconds per env step, and ratios to vanilla (the reference
  measured in the same run).
* ``certify``: a vanilla DQN and an SA-DQN convex (the ``dqn-CartPole-v1`` preset, ``--steps``
  each, the same seed, the preset's periodic evaluation keeping the best weights), then the
  clean return and the fraction of the clean run's visited states whose greedy action is
  certified by CROWN at every ``--eps`` (:func:`agents.robustness.certify.certify_agent`).

Example::

    python benchmarks/certified_actions.py --steps 50000 --eps 0.005,0.01,0.02 --robust-eps 0.02
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def cost(args) -> dict:
    """Seconds per env step of vanilla, SA-pgd and SA-convex training, interleaved."""
    import agents

    kinds = {"vanilla": {}, "sa-pgd": {"robust": "sa", "robust_method": "pgd"},
             "sa-convex": {"robust": "sa", "robust_method": "convex"}}
    out = {}
    for algo in ("dqn", "ppo"):
        made = {k: agents.algorithm(algo)(env="CartPole-v1", seed=0, robust_eps=args.robust_eps,
                                          robust_eps_warmup=0.0, **kw) for k, kw in kinds.items()}
        for a in made.values():  # trace and fill the replay buffer before timing
            a.learn(args.cost_steps, progress_bar=False)
        times = {k: [0.0, 0.0] for k in kinds}
        for _ in range(args.cost_repeats):
            for k, a in made.items():
                wall, cpu = _timed(lambda a=a: a.learn(args.cost_steps, progress_bar=False))
                times[k][0] += wall
                times[k][1] += cpu
        n = args.cost_steps * args.cost_repeats
        out[algo] = {k: {"wall_ms_per_step": 1e3 * w / n, "cpu_ms_per_step": 1e3 * c / n}
                     for k, (w, c) in times.items()}
    return out


def certify(args) -> dict:
    """Train vanilla and SA-DQN convex, then certified fractions along their clean episodes."""
    import agents
    from agents.core.callbacks import EvalCallback
    from agents.robustness.certify import certify_agent

    eps = [float(e) for e in args.eps.split(",")]
    out = {}
    for kind, kw in (("vanilla", {}), ("sa-convex", {"robust": "sa", "robust_method": "convex",
                                                      "robust_eps": args.robust_eps})):
        agent = agents.DQN(env="CartPole-v1", seed=args.seed, **kw)
        learn = agents.core.presets.get_preset(agent.config.preset).get("learn", {})
        cb = [EvalCallback(learn["eval_every"], keep_best=True)] if learn.get("keep_best") else []
        wall, cpu = _timed(lambda agent=agent, cb=cb: agent.learn(args.steps, callbacks=cb,
                                                                  progress_bar=False))
        clean = agent.evaluate(args.episodes, seed=args.seed + 10_000)["mean_return"]
        rows = certify_agent(agent, eps, "crown", n_episodes=args.episodes,
                             seed=args.seed + 10_000)
        out[kind] = {"clean_mean_return": clean, "train_wall_s": wall, "train_cpu_s": cpu,
                     "certified": {r["eps"]: r["certified_fraction"] for r in rows},
                     "n_states": rows[0]["n_states"]}
        print(f"{kind}: clean {clean:.1f}, trained in {wall:.0f} s wall / {cpu:.0f} s CPU, "
              f"certified (crown) " + ", ".join(f"eps {r['eps']:g}: {r['certified_fraction']:.1%}"
                                                for r in rows) + f" of {rows[0]['n_states']} states",
              flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=50_000, help="DQN training steps per agent")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eps", default="0.005,0.01,0.02")
    p.add_argument("--robust-eps", type=float, default=0.02)
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--cost-steps", type=int, default=2048)
    p.add_argument("--cost-repeats", type=int, default=2)
    p.add_argument("--only", choices=("cost", "certify"), default=None)
    args = p.parse_args(argv)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    if args.only in (None, "cost"):
        res = cost(args)
        for algo, kinds in res.items():
            ref = kinds["vanilla"]
            for k, v in kinds.items():
                print(f"{algo} {k:<10} {v['cpu_ms_per_step']:.3f} CPU ms/step "
                      f"(x{v['cpu_ms_per_step'] / ref['cpu_ms_per_step']:.2f}), "
                      f"{v['wall_ms_per_step']:.3f} wall ms/step "
                      f"(x{v['wall_ms_per_step'] / ref['wall_ms_per_step']:.2f})", flush=True)
    if args.only in (None, "certify"):
        certify(args)
    print(f"load average at end: {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
