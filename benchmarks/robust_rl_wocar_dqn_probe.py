"""What limits WocaR-DQN on CartPole-v1: one agent's learning curve, admissible sets and loss balance.

Trains one agent (``--kind`` vanilla, sa or wocar; the ``dqn-CartPole-v1`` preset at ``--steps``,
the same seed and settings as ``benchmarks/robust_rl_wocar_dqn.py``) and prints one JSON line:

* ``evals``: the greedy return every ``--eval-every`` steps (``--eval-episodes`` episodes, an
  :class:`agents.core.callbacks.EvalCallback`, which touches no training state: the agent is the
  benchmark's);
* ``curve``: about ten entries of the agent's history (training return, WocaR's ``wocar_*`` logs);
* ``admissible``: on 512 replay states, the mean number of actions admissible at ``--eps`` by IBP,
  CROWN-IBP and CROWN (:func:`agents.robustness.wocar.admissible_actions`) and reached by sampling
  the ball (its corners and 200 uniform points: a lower bound of the true set); ``gap_median``:
  the median ``max_a Q - min_a Q`` there, ``q_median`` the median ``max_a Q``;
* ``grad_probe``: on one replay batch of 256, ``(value, global gradient norm)`` of the TD Huber
  loss and of WocaR-DQN's importance-weighted worst-case term (IBP bounds at ``--eps``, in units
  of the batch's Q scale, and unscaled), and of the mean IBP spread ``ub - lb``.

Example::

    python benchmarks/robust_rl_wocar_dqn_probe.py --kind wocar --seed 0 --steps 30000 --threads 1

Run it from a snapshot of the tree under ``cpuslot``. Figures: docs/benchmarks/robust-rl.md,
"What limited WocaR-DQN".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

_LOGS = ("episode_return", "wocar_td_loss", "wocar_bound_loss", "wocar_width", "wocar_scale",
         "wocar_admissible", "wocar_worst_q", "wocar_weight")


def admissible_sizes(agent, obs, eps: float, rng) -> dict:
    """Mean admissible actions per state by each bound method and by sampling the ball."""
    import tensorflow as tf

    from agents.robustness.wocar import admissible_actions

    surface = agent.policy_surface()
    sizes = {m: float(tf.reduce_mean(tf.reduce_sum(tf.cast(
        admissible_actions(surface, obs, eps, m), tf.float32), -1)))
        for m in ("ibp", "crown-ibp", "crown")}
    scale = surface.obs_scale()
    q0 = surface.outputs(obs).numpy()
    reached = np.zeros_like(q0, dtype=bool)
    reached[np.arange(len(q0)), q0.argmax(-1)] = True
    d = int(obs.shape[-1])
    corners = np.array(np.meshgrid(*[[-1.0, 1.0]] * d)).reshape(d, -1).T
    for direction in list(corners) + list(rng.uniform(-1, 1, size=(200, d))):
        q = surface.outputs(obs + eps * scale * tf.constant(direction, tf.float32)).numpy()
        reached[np.arange(len(q)), q.argmax(-1)] = True
    sizes["sampled"] = float(reached.sum(-1).mean())
    gap = q0.max(-1) - q0.min(-1)
    return {"admissible": sizes, "gap_median": float(np.median(gap)),
            "q_median": float(np.median(q0.max(-1)))}


def gradient_probe(agent, batch: dict, eps: float) -> dict:
    """``(value, gradient norm)`` of the TD loss and of the worst-case term on ``batch``."""
    import tensorflow as tf

    from agents.algorithms.dqn import huber
    from agents.robustness.certify import output_bounds
    from agents.robustness.wocar import q_scale, state_importance, worst_case_bound_loss

    surface = agent.policy_surface()
    target = tf.stop_gradient(agent.td_targets(batch["rewards"], batch["next_obs"],
                                               batch["terminated"]))
    scale = q_scale(target)
    with tf.GradientTape(persistent=True) as tape:
        q_all = agent.q(batch["obs"])
        q = tf.gather(q_all, batch["actions"], batch_dims=1)
        lb, ub = output_bounds(surface, batch["obs"], eps, "ibp")
        importance = state_importance(tf.stop_gradient(q_all))
        terms = {"td": tf.reduce_mean(huber(q - target, 1.0)),
                 "wc_scaled": tf.reduce_mean(importance * worst_case_bound_loss(
                     lb, ub, q_all, batch["actions"], target, 1.0, scale)),
                 "wc_unscaled": tf.reduce_mean(importance * worst_case_bound_loss(
                     lb, ub, q_all, batch["actions"], target, 1.0, 1.0)),
                 "width": tf.reduce_mean(ub - lb)}
    out = {k: [round(float(v), 4), round(float(tf.linalg.global_norm(
        tape.gradient(v, agent.variables))), 4)] for k, v in terms.items()}
    out["scale"] = round(float(scale), 2)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", default="wocar", choices=("vanilla", "sa", "wocar"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=30_000)
    p.add_argument("--eps", type=float, default=0.02, help="training and probing radius (raw)")
    p.add_argument("--bound", default=None, choices=("ibp", "crown", "crown-ibp"),
                   help="WocaR's admissible sets (default: WocaR-DQN's)")
    p.add_argument("--kappa", type=float, default=None)
    p.add_argument("--eval-every", type=int, default=3000)
    p.add_argument("--eval-episodes", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(args.threads, 2))
    import agents
    from agents.core.callbacks import EvalCallback

    robust = {"vanilla": {}, "sa": {"robust": agents.SA(eps=args.eps)},
              "wocar": {"robust": agents.WocaR(eps=args.eps, bound=args.bound,
                                               kappa=args.kappa)}}[args.kind]
    agent = agents.DQN(env="CartPole-v1", seed=args.seed, backend="graph", **robust)
    evaluator = EvalCallback(every=args.eval_every, n_episodes=args.eval_episodes)
    c0 = time.process_time()
    agent.learn(args.steps, callbacks=[evaluator], progress_bar=False)
    cpu = time.process_time() - c0
    history = agent.history
    curve = [{k: round(float(h[k]), 3) for k in ("steps",) + _LOGS if k in h}
             for h in history[::max(len(history) // 10, 1)]]
    rng = np.random.default_rng(0)
    size = int(agent.buffer.size.numpy())
    idx = tf.constant(rng.choice(size, 512, replace=False), tf.int64)
    out = {"kind": args.kind, "seed": args.seed, "steps": args.steps, "train_cpu_seconds": cpu,
           "load": os.getloadavg()[0], "evals": evaluator.evaluations, "curve": curve,
           **admissible_sizes(agent, tf.gather(agent.buffer.obs, idx), args.eps, rng),
           "grad_probe": gradient_probe(agent, agent.buffer.gather(idx[:256]), args.eps)}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
