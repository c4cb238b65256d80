"""Learned adversaries (issue 25) against vanilla, SA, ATLA and ATLA+SA agents at one eps.

Per seed and kind of agent (``--victims vanilla,sa,atla,atla-sa``: the env's PPO preset, plain;
with ``robust="sa"``, ``"atla"`` or ``"atla-sa"`` trained at ``--eps``), the agent is trained for
``--steps`` and evaluated with :func:`agents.evaluate_under_attack` at ``--eps`` under the greedy
attacks (``--attacks``, default ``random,action,mad,critic,rs``) and the learned ones
(``--learned``, default ``optimal``; ``paad`` is ~10x slower per adversary step: its actor runs
PGD every step), each learned adversary trained for ``--adversary-steps`` with the radius
curriculum from 4 eps and the best snapshot on held-out seeds. Printed per agent: clean mean,
mean under each attack, the worst case, ``optimal - rs`` (< 0: the learned adversary is the
stronger, whatever the sign of the returns), each adversary's cost (steps, wall and CPU
seconds), the agent's training wall and CPU seconds, and the load average; with ``--score``
also the worst case's normalised score (``(worst - random) / (clean - random)``, for envs
whose returns are negative, as Pendulum's).
``--set KEY=JSON`` overrides the agents' config (every kind: the MuJoCo settings block of
docs/benchmarks/robust-rl.md), ``--robust-set KEY=JSON`` only the robust kinds' (e.g.
``robust_method="sgld"``). ``--save-dir`` keeps agents and results (a rerun reuses them;
``--json`` writes every row; each agent's ``train.json`` keeps its training curve: rollout
return, ATLA's adversary return and the radius, about 50 points).

    python benchmarks/learned_adversary.py --env CartPole-v1 --eps 0.05 --seeds 0 \
        --victims vanilla,sa,atla,atla-sa --adversary-steps 100000 --episodes 8 \
        --rs-steps 10000 --save-dir runs/learned_adv --json learned_adv.json

Measured figures: docs/benchmarks/robust-rl.md ("Learned adversaries").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KINDS = {"vanilla": None, "sa": "sa", "atla": "atla", "atla-sa": "atla-sa"}


def _train(kind, args, seed):
    import agents

    path = os.path.join(args.save_dir, f"{kind}-seed{seed}") if args.save_dir else None
    info = os.path.join(path, "train.json") if path else None
    if path and os.path.exists(info):
        with open(info) as f:
            return agents.load(path), json.load(f)
    over = dict(args.set)
    if KINDS[kind] is not None:
        over.update({"robust": KINDS[kind], "robust_eps": args.eps, **dict(args.robust_set)})
    if KINDS[kind] in ("sa", "atla-sa") and args.kappa is not None:
        over["robust_kappa"] = args.kappa
    agent = agents.PPO(env=args.env, seed=seed, **over)
    curve = []
    t0, c0 = time.perf_counter(), time.process_time()
    agent.learn(args.steps, progress_bar=False, callbacks=[_curve_recorder(curve, args.steps)])
    cost = {"train_wall_seconds": time.perf_counter() - t0,
            "train_cpu_seconds": time.process_time() - c0, "steps": args.steps,
            "curve": curve}
    if path:
        agent.save(path)
        with open(info, "w") as f:
            json.dump(cost, f)
    return agent, cost


CURVE_KEYS = ("episode_return", "atla_adversary_return", "atla_adversary_radius", "robust_eps")


def _curve_recorder(curve, total, points=50):
    """A ``learn`` callback appending the training logs of :data:`CURVE_KEYS` (the agent's
    rollout return; ATLA's adversary return, minus the agent's under its training adversary;
    the radius) to ``curve`` about ``points`` times over a ``total``-step run."""
    next_at = [0]

    def record(agent, logs):
        if logs["steps"] >= next_at[0] or logs["steps"] >= total:
            next_at[0] = logs["steps"] + total // points
            curve.append({"steps": logs["steps"], **{k: round(float(logs[k]), 4) for k in
                                                     CURVE_KEYS if k in logs and logs[k] == logs[k]}})
            print("[train] " + " ".join(f"{k} {v:g}" for k, v in curve[-1].items()),
                  file=sys.stderr, flush=True)
    return record


def _evaluate(agent, kind, args, seed):
    import agents

    key = f"eval-{args.eps:g}-{args.attacks}-{args.learned}-{args.adversary_steps}".replace(",", "+")
    path = os.path.join(args.save_dir, f"{kind}-seed{seed}", key + ".json") if args.save_dir \
        else None
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    names = [a for a in (args.attacks + "," + args.learned).split(",") if a]
    load = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    report = agents.evaluate_under_attack(
        agent, names, eps=[args.eps], n_episodes=args.episodes, seed=10_000 + seed,
        rs_steps=args.rs_steps, adversary_steps=args.adversary_steps,
        progress=True)
    out = {"clean": report.clean["mean"],
           "rows": {r["attack"]: {"mean": r["mean"], "median": r["median"],
                                  "cost": r.get("cost")} for r in report.rows},
           "worst": report.worst_case[0], "random_policy": report.random_policy["mean"],
           "eval_wall_seconds": time.perf_counter() - t0,
           "eval_cpu_seconds": time.process_time() - c0, "load_start": load,
           "load_end": os.getloadavg()[0]}
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    return out


def _assignment(text):
    """``KEY=JSON`` (a bare word that is not JSON is taken as a string)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--eps", type=float, default=0.05)
    p.add_argument("--steps", type=int, default=100_000, help="agent training steps")
    p.add_argument("--kappa", type=float, default=None, help="SA kappa (default: the preset's)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--victims", default="vanilla,sa,atla,atla-sa")
    p.add_argument("--attacks", default="random,action,mad,critic,rs")
    p.add_argument("--learned", default="optimal")
    p.add_argument("--adversary-steps", type=int, default=100_000)
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--rs-steps", type=int, default=10_000)
    p.add_argument("--save-dir", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--set", type=_assignment, action="append", default=[],
                   help="KEY=JSON config override of every agent (repeatable)")
    p.add_argument("--robust-set", type=_assignment, action="append", default=[],
                   help="KEY=JSON config override of the robust agents only (repeatable)")
    p.add_argument("--atla-adversary", type=_assignment, action="append", default=[],
                   help="KEY=JSON override of the ATLA adversary's PPO (agents.robustness.atla."
                        "ADVERSARY_PPO; e.g. the paper's n_minibatches=32, learning_rate=3e-3)")
    p.add_argument("--score", action="store_true",
                   help="also print the worst case's normalised score")
    args = p.parse_args(argv)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    # inter-op stays >= 2: the victim acts inside the adversary's compiled rollout
    tf.config.threading.set_inter_op_parallelism_threads(max(2, args.threads))
    if args.atla_adversary:
        import agents.robustness.atla

        agents.robustness.atla.ADVERSARY_PPO.update(dict(args.atla_adversary))
    if args.save_dir:
        os.makedirs(args.save_dir, exist_ok=True)
    results = {}
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} {args.env} eps {args.eps}, "
          f"adversary {args.adversary_steps} steps, load {os.getloadavg()}", flush=True)
    for seed in args.seeds:
        for kind in args.victims.split(","):
            agent, cost = _train(kind, args, seed)
            ev = _evaluate(agent, kind, args, seed)
            results[f"{kind}-seed{seed}"] = {**ev, **cost}
            rows = ev["rows"]
            gap = (rows["optimal"]["mean"] - rows["rs"]["mean"]
                   if "optimal" in rows and "rs" in rows else float("nan"))
            cells = " ".join(f"{a} {r['mean']:.1f}" for a, r in rows.items())
            if args.score:
                cells += (f"; score {ev['worst']['normalized_score']:.2f} (random policy "
                          f"{ev['random_policy']:.1f})")
            print(f"{kind} seed {seed}: clean {ev['clean']:.1f}; {cells}; worst "
                  f"{ev['worst']['mean']:.1f} ({ev['worst']['attack']}); optimal - rs {gap:+.1f}; "
                  f"train {cost['train_wall_seconds']:.0f} s wall {cost['train_cpu_seconds']:.0f}"
                  f" s CPU; load {ev['load_start']:.1f}-{ev['load_end']:.1f}", flush=True)
            for a, r in rows.items():
                if r.get("cost"):
                    c = r["cost"]
                    print(f"  {a}: {c['adversary_steps']} steps, {c['wall_seconds']:.0f} s wall,"
                          f" {c['cpu_seconds']:.0f} s CPU, held-out {c['held_out_return']:.1f} "
                          f"(step {c['best_step']})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
