"""Certified training on digits at L-inf 0.1: clean, PGD and verified (CROWN) accuracy of
madry-, ibp- and crown-ibp-trained CNNs (arch ``ibp-small``), side by side in one run.

    PYTHONPATH=. python benchmarks/certified_training.py [--epochs 30] [--n 450] [--json out.json]

Every model: Adam 3e-3, batch 64, eps ramped from 0 over the first half of the run (certified
methods: kappa 1 -> 0.5, crown-ibp beta 1 -> 0). PGD: 20 steps of eps/8 with a random start
(``attacks.training.robust_accuracy``); verified: ``attacks.certify.verified_accuracy`` with
CROWN (and IBP). On the same examples verified <= PGD <= clean.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# `python benchmarks/certified_training.py` puts benchmarks/ first on sys.path, where benchmarks/attacks.py
# would shadow the attacks package: drop it (the tree root comes from PYTHONPATH=.)
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--eps", type=float, default=0.1)
    p.add_argument("--n", type=int, default=450, help="test examples")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import keras
    import numpy as np

    from attacks import training
    from attacks.certify import verified_accuracy
    from attacks.data import load_dataset

    d = load_dataset("digits")
    x, y = d.x_test[: args.n], d.y_test[: args.n]
    spe = training.steps_per_epoch(len(d.x_train), 64)
    rows = {}
    for method in ("madry", "ibp", "crown-ibp"):
        keras.utils.set_random_seed(0)
        model = training.make_model("ibp-small", (8, 8, 1), 10)
        steps = {"steps": 10} if method == "madry" else {}  # ibp, crown-ibp craft no PGD
        tr = training.AdversarialTrainer(model, method=method, eps=args.eps, eval_steps=0,
                                         warmup_steps=(args.epochs // 2) * spe, **steps)
        tr.compile(optimizer=keras.optimizers.Adam(3e-3))
        started = time.perf_counter()
        tr.fit(d.x_train, d.y_train, batch_size=64, epochs=args.epochs, verbose=0)
        seconds = time.perf_counter() - started
        clean = float(np.mean(np.argmax(model.predict(x, verbose=0), -1) == y))
        pgd = training.robust_accuracy(model, x, y, eps=args.eps, steps=20)
        rows[method] = {"clean": clean, "pgd20": float(pgd),
                        "verified_crown": verified_accuracy(model, x, y, args.eps, method="crown"),
                        "verified_ibp": verified_accuracy(model, x, y, args.eps, method="ibp"),
                        "train_seconds": seconds}
        print(method, rows[method], flush=True)
    print(f"\ndigits, {len(y)} test examples, L-inf eps {args.eps}, ibp-small CNN, "
          f"{args.epochs} epochs")
    print("| training | clean | PGD-20 | verified (CROWN) | verified (IBP) | train s |")
    print("|---|---|---|---|---|---|")
    for m, r in rows.items():
        print(f"| {m} | {r['clean']:.3f} | {r['pgd20']:.3f} | {r['verified_crown']:.3f} | "
              f"{r['verified_ibp']:.3f} | {r['train_seconds']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"eps": args.eps, "epochs": args.epochs, "n": len(y), "rows": rows}, f,
                      indent=1)
    return rows


if __name__ == "__main__":
    main()
