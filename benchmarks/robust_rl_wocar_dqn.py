"""WocaR-DQN against vanilla DQN and SA-DQN on CartPole-v1: issue 37's DQN goal, measured.

Per seed, three agents are trained with the ``dqn-CartPole-v1`` preset at the same budget
(``--steps``; the learning rate and exploration schedules stretch over it) and the same seed:
vanilla DQN, SA-DQN (``robust="sa"``, PGD inner search, the preset's kappa 0.5) and WocaR-DQN
(``robust="wocar"``: :class:`agents.robustness.wocar.WocaRDQNPlugin`, its admissible sets'
``wocar_bound`` ``--bound``, its worst-attack network's step rate ``--q-every``, its
worst-case term ``--term`` and that term's start ``--term-start``), both robust
kinds at ``--robust-eps``. Each is evaluated by
``agents.evaluate_under_attack`` at ``--eps`` under every attack of ``--attacks``; printed per
agent: the natural (clean) median return, the worst case (the lowest median over the attacks)
and the training CPU seconds (tracing included); then the medians over seeds and the goal
(WocaR-DQN's worst case at least SA-DQN's, at a lower training CPU). No periodic evaluation
keeps best weights unless ``--keep-best``: then each agent trains as ``benchmarks/robust_rl.py``
and ``robustgrad train-agent`` train it (the issue-10 protocol: the preset's periodic clean
evaluation every ``eval_every`` steps, the best-evaluated weights restored at the end), and the
cost compared is the training CPU without those evaluations (``train_cpu_seconds`` keeps the
total). ``--sa-kappa`` sets SA-DQN's hinge weight (the issue-10 figures used 0.1).

Example::

    python benchmarks/robust_rl_wocar_dqn.py --seeds 0 1 2 --steps 30000 --json dqn.json
    python benchmarks/robust_rl_wocar_dqn.py --kinds sa,wocar --keep-best --sa-kappa 0.1 \
        --seeds 0 1 2 3 4 --threads 1 --json dqn100k.json   # the issue-10 protocol

Run it from a snapshot copy of the tree (AutoGraph re-reads source files), under ``cpuslot``
on a shared machine; ``--threads 1`` pins TensorFlow to one thread of each pool. Figures:
docs/benchmarks/robust-rl.md, section "WocaR-DQN vs DQN and SA-DQN".
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

KINDS = ("vanilla", "sa", "wocar")
COST = "train_cpu_seconds_without_evals"  # the cost compared (= the total without --keep-best)


def worst_case(report, eps: float) -> tuple[float, str]:
    """``(lowest median return at eps over the attacks, that attack)`` of an attack report."""
    rows = [r for r in report.rows if np.isclose(r["eps"], eps)]
    row = min(rows, key=lambda r: r["median"])
    return float(row["median"]), str(row["attack"])


def run_one(kind: str, seed: int, args) -> dict:
    """Train one agent (``kind`` in :data:`KINDS`) and evaluate it."""
    from robust_rl import preset_evaluation  # benchmarks/ is on the path: this script's folder

    import agents

    robust = {"vanilla": {},
              "sa": {"robust": agents.SA(eps=args.robust_eps, kappa=args.sa_kappa)},
              "wocar": {"robust": agents.WocaR(eps=args.robust_eps, bound=args.bound,
                                               weight=args.weight, kappa=args.kappa,
                                               q_every=args.q_every, term=args.term,
                                               term_start=args.term_start,
                                               importance=args.importance)}}[kind]
    agent = agents.DQN(env="CartPole-v1", seed=seed, backend="graph", **robust)
    callbacks = preset_evaluation(agent)[1] if args.keep_best else []
    c0, t0 = time.process_time(), time.perf_counter()
    agent.learn(args.steps, callbacks=callbacks, progress_bar=False)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    eval_cpu = sum(c.cpu_seconds for c in callbacks)
    clean = agent.evaluate(args.episodes, seed=10_000 + seed)
    report = agents.evaluate_under_attack(agent, args.attacks.split(","), [args.eps],
                                          n_episodes=args.episodes, seed=10_000 + seed,
                                          rs_steps=args.rs_steps, progress=False)
    worst, attack = worst_case(report, args.eps)
    row = {"kind": kind, "seed": seed, "robust_kappa": float(agent.config.robust_kappa),
           "natural": float(np.median(clean["returns"])),
           "worst": worst, "worst_attack": attack, "train_cpu_seconds": cpu,
           "train_wall_seconds": wall, "periodic_eval_cpu_seconds": eval_cpu,
           "train_cpu_seconds_without_evals": cpu - eval_cpu, "load": os.getloadavg()[0],
           "per_attack": {r["attack"]: float(r["median"]) for r in report.rows}}
    if callbacks:
        kept = callbacks[0].inner
        row.update(best_eval_return=kept.best_return, best_eval_steps=kept.best_steps,
                   restored_best=bool(kept.restored))
    print(json.dumps(row), flush=True)
    return row


def summarise(rows: list[dict]) -> dict:
    """Medians over seeds of each kind's natural return, worst case and training CPU (without
    the periodic evaluations of ``--keep-best``)."""
    return {k: {f: float(np.median([r[f] for r in rows if r["kind"] == k]))
                for f in ("natural", "worst", COST)}
            for k in KINDS if any(r["kind"] == k for r in rows)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--steps", type=int, default=100_000, help="training budget (the preset's)")
    p.add_argument("--eps", type=float, default=0.02, help="evaluation radius (raw units)")
    p.add_argument("--robust-eps", type=float, default=0.02, help="SA's and WocaR's radius")
    p.add_argument("--bound", default=None, choices=("ibp", "crown", "crown-ibp"),
                   help="WocaR's admissible sets' bound method (default: WocaR-DQN's, "
                        "crown-ibp; its worst-case term is IBP's)")
    p.add_argument("--q-every", type=int, default=None,
                   help="gradient steps per step of WocaR's worst-attack network (default 10)")
    p.add_argument("--weight", type=float, default=None, help="wocar_weight (default 0.3)")
    p.add_argument("--term", default=None, choices=("spread", "margin"),
                   help="WocaR-DQN's worst-case term (default: spread, the paper's)")
    p.add_argument("--term-start", type=float, default=None,
                   help="fraction of the budget before which WocaR's worst-case term is off "
                        "(default 0)")
    p.add_argument("--kappa", type=float, default=None,
                   help="WocaR's worst-case term weight (default: the preset's robust_kappa, 0.5)")
    p.add_argument("--no-importance", dest="importance", action="store_const", const=False,
                   default=None, help="WocaR's worst-case term unweighted by the state "
                                      "importance (the paper's DQN code)")
    p.add_argument("--keep-best", action="store_true",
                   help="train with the preset's periodic evaluation keeping the best weights "
                        "(the issue-10 protocol)")
    p.add_argument("--sa-kappa", type=float, default=None,
                   help="SA-DQN's hinge weight (default: the preset's robust_kappa, 0.5)")
    p.add_argument("--attacks", default="random,action,mad,critic,rs")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--rs-steps", type=int, default=10_000)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(args.threads, 2))
    rows = [run_one(kind, seed, args) for seed in args.seeds for kind in args.kinds.split(",")]
    med = summarise(rows)
    print(f"medians over seeds {args.seeds} at eps {args.eps} ({args.attacks}), "
          f"{args.steps} steps:")
    for k, m in med.items():
        print(f"  {k:8s} natural {m['natural']:6.1f}  worst {m['worst']:6.1f}  "
              f"train CPU {m[COST]:7.1f} s")
    if "sa" in med and "wocar" in med:
        s, w = med["sa"], med["wocar"]
        ratio = w[COST] / s[COST]
        print(f"goal worst >= SA-DQN's: {w['worst']:.1f} vs {s['worst']:.1f} "
              f"({'met' if w['worst'] >= s['worst'] else 'MISSED'}); training CPU below "
              f"SA-DQN's: {ratio:.2f}x ({'met' if ratio < 1 else 'MISSED'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "medians": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
