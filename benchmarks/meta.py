"""Sinusoid few-shot regression (Finn et al. 2017, sec. 5.1): MAML vs first-order MAML vs Reptile
vs a pre-trained-and-fine-tuned baseline.

Each learner is the paper's network (1-40-40-1, ReLU) meta-trained for ``--iterations`` meta-steps
on meta-batches of ``--meta-batch`` tasks (amplitude U[0.1, 5], phase U[0, pi], x U[-5, 5],
K = ``--k-shot`` support points), inner SGD step 0.01, outer Adam 1e-3. The baseline is the same
network regressed on points pooled over random tasks for the same number of steps. Everyone is
evaluated on the same ``--test-tasks`` held-out tasks: query MSE after 1 and 10 SGD steps of size
0.01 on the K support points. Criteria (issue 6): MAML's 1-step MSE is at least 3x lower than the
baseline's, and second-order MAML is at least as good as first-order.

Usage::

    python benchmarks/meta.py                      # full run (about 10 min on 2 busy cores)
    python benchmarks/meta.py --iterations 2000    # quicker look
    python benchmarks/meta.py --out runs/meta.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# run as a script, sys.path[0] is benchmarks/, where benchmarks/attacks.py would shadow the
# attacks package: drop it
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from robustgrad import meta  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iterations", type=int, default=12000)
    p.add_argument("--meta-batch", type=int, default=25)
    p.add_argument("--k-shot", type=int, default=10)
    p.add_argument("--inner-lr", type=float, default=0.01)
    p.add_argument("--test-tasks", type=int, default=1000)
    p.add_argument("--reptile-steps", type=int, default=5,
                   help="inner steps of Reptile's meta-training (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)

    test = meta.SinusoidTasks(k_shot=args.k_shot, k_query=100, seed=10_000 + args.seed).sample(
        args.test_tasks)
    results = {"settings": vars(args), "learners": {}}

    def record(name, model, seconds, lr=args.inner_lr):
        row = {"seconds": round(seconds, 1)}
        for steps in (0, 1, 10):
            row[f"mse_{steps}_steps"] = float(meta.finetune_mse(model, test, steps=steps, lr=lr))
        results["learners"][name] = row
        print(f"{name:>22}: MSE after 0/1/10 steps {row['mse_0_steps']:.3f} / "
              f"{row['mse_1_steps']:.3f} / {row['mse_10_steps']:.3f}   ({seconds:.0f}s)",
              flush=True)
        return row

    for method, steps in (("maml", 1), ("fomaml", 1), ("reptile", args.reptile_steps)):
        model = meta.mlp([1, 40, 40, 1], seed=args.seed)
        learner = meta.MetaLearner(model, method, inner_lr=args.inner_lr, inner_steps=steps)
        tasks = meta.SinusoidTasks(k_shot=args.k_shot, k_query=args.k_shot, seed=args.seed + 1)
        t0 = time.perf_counter()
        learner.fit(tasks, args.iterations, args.meta_batch)
        record(method, model, time.perf_counter() - t0)

    base = meta.mlp([1, 40, 40, 1], seed=args.seed)
    t0 = time.perf_counter()
    meta.pretrain(base, meta.SinusoidTasks(k_shot=args.k_shot, k_query=args.k_shot,
                                           seed=args.seed + 1),
                  args.iterations, args.meta_batch)
    seconds = time.perf_counter() - t0
    record("pretrained+finetune", base, seconds)
    # the baseline's best fine-tuning step, for an honest comparison
    best = None
    for lr in (0.001, 0.002, 0.005):
        mse1 = float(meta.finetune_mse(base, test, steps=1, lr=lr))
        if np.isfinite(mse1) and (best is None or mse1 < best[1]):
            best = (lr, mse1)
    results["learners"]["pretrained+finetune"]["best_lr_1_step"] = {"lr": best[0],
                                                                     "mse": best[1]}
    print(f"{'':>22}  (baseline with its best 1-step lr {best[0]}: MSE {best[1]:.3f})")

    learners = results["learners"]
    ratio_same = learners["pretrained+finetune"]["mse_1_steps"] / learners["maml"]["mse_1_steps"]
    ratio_best = best[1] / learners["maml"]["mse_1_steps"]
    results["criteria"] = {
        "baseline_over_maml_1_step": ratio_same,
        "best_lr_baseline_over_maml_1_step": ratio_best,
        "maml_3x_better_than_baseline": bool(ratio_same >= 3.0),
        "second_order_at_least_first_order": bool(learners["maml"]["mse_1_steps"]
                                                  <= learners["fomaml"]["mse_1_steps"]),
    }
    c = results["criteria"]
    print(f"\nbaseline / MAML 1-step MSE: {ratio_same:.2f}x with the same step "
          f"({ratio_best:.2f}x against the baseline's best step) -> "
          f"{'PASS' if c['maml_3x_better_than_baseline'] else 'FAIL'} (>= 3x)")
    print(f"second-order MAML {learners['maml']['mse_1_steps']:.3f} vs first-order "
          f"{learners['fomaml']['mse_1_steps']:.3f} -> "
          f"{'PASS' if c['second_order_at_least_first_order'] else 'FAIL'}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0 if all(v for k, v in c.items() if isinstance(v, bool)) else 1


if __name__ == "__main__":
    tf.keras.utils.set_random_seed(0)
    sys.exit(main())
