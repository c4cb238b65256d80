"""Adversarial-training benchmark (issue 4, section 3): figures and cost ratios in one run.

For each method (default settings of ``robustgrad train-classifier``, i.e. exactly what the CLI
does with no other flags than ``--method --eps --seed``) and each seed, train on digits and
report clean accuracy and the worst-case robust accuracy over PGD-50 x 5 restarts, APGD-CE,
APGD-T and Square (``attacks.evaluate``, cascade), plus whether the catastrophic-overfitting
guard fired (``fast``). Then measure the cost of one training epoch of each method against a
clean epoch of the same model, interleaving the methods in rounds so that load from other
processes hits them alike, and compare with the issue's limits:

    madry (k steps) <= 1.15 (k + 1) x clean;  fast <= 2.3 x clean;  free (m replays) <= 1.15 m x clean

Usage::

    python benchmarks/advtrain.py                                  # everything (long: ~1 h on 2 cores)
    python benchmarks/advtrain.py --methods madry --seeds 0 --eps 0.1
    python benchmarks/advtrain.py --methods fast --seeds 0,1,2     # catastrophic overfitting check
    python benchmarks/advtrain.py --cost-only                      # only the cost ratios (~2 min)

Writes ``--out``/advtrain.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# `python benchmarks/advtrain.py` puts benchmarks/ first on sys.path, where benchmarks/attacks.py
# would shadow the `attacks` package: drop the script's directory.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

LIMITS = {"madry": ("1.15*(k+1)", lambda k: 1.15 * (k + 1)), "trades": (None, None),
          "fast": ("2.3", lambda k: 2.3), "free": ("1.15*m", lambda m: 1.15 * m)}
TARGETS = {"madry": (0.98, 0.88), "trades": (0.98, 0.88), "fast": (0.97, 0.80)}


def train_and_evaluate(method, eps, seed, out_root, extra=()):
    from robustgrad.cli import main as cli_main

    out = os.path.join(out_root, f"{method}-eps{eps:g}-seed{seed}")
    argv = ["train-classifier", "--method", method, "--eps", str(eps), "--seed", str(seed),
            "--out", out, "--verbose", "0", *extra]
    if os.path.exists(os.path.join(out, "report.json")):
        print(f"  (reusing {out})", flush=True)
    else:
        if os.path.exists(out):
            argv.append("--overwrite")
        t0 = time.time()
        rc = cli_main(argv)
        if rc != 0:
            raise SystemExit(f"train-classifier failed ({rc}): {' '.join(argv)}")
        print(f"  trained+evaluated in {time.time() - t0:.0f} s", flush=True)
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)
    with open(os.path.join(out, "history.json")) as f:
        hist = json.load(f)
    worst = report["worst_case"]
    robust = float(worst[str(eps)] if str(eps) in worst else list(worst.values())[0])
    per_attack = {}
    for rec in report.get("records", []):
        if abs(float(rec.get("eps", eps)) - eps) < 1e-9:
            per_attack[rec.get("attack")] = rec.get("robust_accuracy")
    guard = hist.get("guard") or {}
    return {
        "method": method, "eps": eps, "seed": seed, "clean": float(report["clean_accuracy"]),
        "robust": robust, "per_attack": per_attack,
        "catastrophic_overfitting": guard.get("collapsed_epoch") is not None,
        "guard": guard or None, "train_seconds": hist.get("train_seconds"),
        "epochs_run": len(hist.get("epoch_seconds", [])), "out": out,
        "warnings": report.get("warnings", []), "attacks": report.get("attacks"),
    }


def measure_costs(methods, rounds=3, batch=64, width=64, eps=0.1):
    """Median seconds of one training epoch per method (after a warm-up epoch), interleaved."""
    import keras
    import numpy as np

    from attacks import training
    from attacks.data import load_dataset

    d = load_dataset("digits")
    spe = training.steps_per_epoch(len(d.x_train), batch)
    trainers = {}
    for m in ["clean", *methods]:
        keras.utils.set_random_seed(0)
        clf = training.make_classifier(d.input_shape, 10, width=width)
        tr = training.AdversarialTrainer(clf, method=m, eps=eps, max_grad_norm=10.0)
        tr.compile(optimizer=keras.optimizers.Adam(1e-3))
        ds = training.epoch_dataset(d.x_train, d.y_train, batch, epochs=rounds + 1)
        it = iter(ds)
        trainers[m] = (tr, it)
    times = {m: [] for m in trainers}

    def one_epoch(m, record):
        tr, it = trainers[m]
        batches = [next(it) for _ in range(spe)]
        timer = training.EpochTimer()
        tr.fit(_as_dataset(batches), epochs=1, steps_per_epoch=spe, verbose=0, callbacks=[timer])
        if record:
            times[m].append(timer.seconds[0])

    for m in trainers:  # warm-up (tracing)
        one_epoch(m, False)
    for _ in range(rounds):
        for m in trainers:
            one_epoch(m, True)
    med = {m: statistics.median(v) for m, v in times.items()}
    rows = []
    for m in methods:
        tr = trainers[m][0]
        k = tr.steps
        ratio = med[m] / med["clean"]
        label, limit_fn = LIMITS.get(m, (None, None))
        limit = limit_fn(k) if limit_fn else None
        rows.append({"method": m, "k": k, "epoch_s": med[m], "clean_epoch_s": med["clean"],
                     "ratio": ratio, "limit": limit, "limit_rule": label,
                     "ok": (ratio <= limit) if limit else None,
                     "per_unit": ratio / ((k + 1) if m in ("madry", "trades") else max(k, 1))})
    _ = np  # keep numpy imported for the datasets
    return rows, med


class _Replay:
    """A finite iterable of pre-built batches (so data loading is not timed)."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def _as_dataset(batches):
    import tensorflow as tf

    xs = tf.concat([b[0] for b in batches], 0)
    ys = tf.concat([b[1] for b in batches], 0)
    n = int(batches[0][0].shape[0])
    return tf.data.Dataset.from_tensor_slices((xs, ys)).batch(n)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default="madry,trades,fast,free")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (fast: use 0,1,2)")
    p.add_argument("--eps", default="0.1,0.2", help="comma-separated training/evaluation eps")
    p.add_argument("--out", default="runs/advtrain")
    p.add_argument("--cost-only", action="store_true", help="only the cost ratios")
    p.add_argument("--no-cost", action="store_true", help="skip the cost ratios")
    p.add_argument("--rounds", type=int, default=3, help="timed epochs per method (cost)")
    p.add_argument("--eval-attacks", default=None,
                   help="override the evaluation ensemble (default: the CLI's, "
                        "pgd50x5,apgd-ce,apgd-t,square), e.g. pgd50x5 for quick seed sweeps")
    args = p.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    eps_list = [float(e) for e in args.eps.split(",") if e.strip()]
    os.makedirs(args.out, exist_ok=True)
    result = {"command": "python benchmarks/advtrain.py " + " ".join(argv or sys.argv[1:]),
              "figures": [], "cost": None}

    if not args.cost_only:
        for eps in eps_list:
            for m in methods:
                for s in seeds:
                    print(f"{m} eps={eps} seed={s} ...", flush=True)
                    extra = ("--eval-attacks", args.eval_attacks) if args.eval_attacks else ()
                    row = train_and_evaluate(m, eps, s, args.out, extra)
                    result["figures"].append(row)
                    print(f"  clean {row['clean']:.4f}  worst-case robust {row['robust']:.4f}  "
                          f"{row['per_attack']}  CO={row['catastrophic_overfitting']}",
                          flush=True)
    if not args.no_cost:
        cost_methods = [m for m in methods if m in ("madry", "trades", "fast", "free")]
        rows, med = measure_costs(cost_methods, rounds=args.rounds)
        result["cost"] = {"rows": rows, "median_epoch_seconds": med}

    with open(os.path.join(args.out, "advtrain.json"), "w") as f:
        json.dump(result, f, indent=1)

    if result["figures"]:
        print("\nmethod  eps   seed  clean   worst-case robust  target (clean/robust)  CO  attacks")
        for r in result["figures"]:
            tgt = TARGETS.get(r["method"]) if abs(r["eps"] - 0.1) < 1e-9 else None
            ok = ("" if tgt is None else
                  ("  ok" if r["clean"] >= tgt[0] and r["robust"] >= tgt[1] else "  MISSED"))
            print(f"{r['method']:<7} {r['eps']:<5g} {r['seed']:<5} {r['clean']:.4f}  "
                  f"{r['robust']:.4f}            {str(tgt or '-'):<22} "
                  f"{r['catastrophic_overfitting']}{ok}  {','.join(r['attacks'] or [])}")
    if result["cost"]:
        print(f"\nclean epoch: {result['cost']['median_epoch_seconds']['clean']:.3f} s (median)")
        print("method  k   epoch s  ratio to clean  limit          within")
        for r in result["cost"]["rows"]:
            lim = "-" if r["limit"] is None else f"{r['limit']:.2f} ({r['limit_rule']})"
            print(f"{r['method']:<7} {r['k']:<3} {r['epoch_s']:.3f}    {r['ratio']:.2f}"
                  f"            {lim:<14} {r['ok']}")
    print(f"\nwrote {os.path.join(args.out, 'advtrain.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
