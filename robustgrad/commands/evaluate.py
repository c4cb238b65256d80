"""``robustgrad evaluate``: a classifier's robustness under an attack ensemble.

Example::

    robustgrad evaluate --model runs/demo/attacks/digits_cnn.keras --data digits \\
        --attacks fgsm,pgd,apgd-ce,square --eps 0.05,0.1 --out runs/eval

Prints the report table and writes ``report.json``, ``report.txt``, ``robust_accuracy.png``
(robust accuracy against eps) and ``examples.png`` (clean / adversarial / perturbation) under
``--out``. A progress bar runs on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HELP = "evaluate a classifier's robustness under attacks"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="M.keras",
                   help="a saved Keras classifier returning logits")
    p.add_argument("--data", default="digits",
                   help="digits (default: the embedded test split), mnist, fashion_mnist, cifar10 "
                        "(if already on disk), or a path.npz holding x_test, y_test (or x, y)")
    p.add_argument("--attacks", default="fgsm,pgd,apgd-ce,square",
                   help="comma-separated attacks, run as a cascade in this order "
                        "(default fgsm,pgd,apgd-ce,square); known: fgsm, fgm, bim, mim, pgd, "
                        "pgd-cw, pgd-dlr, apgd-ce, apgd-dlr, apgd-t, cw, deepfool, square; a "
                        "number sets the steps (pgd40)")
    p.add_argument("--eps", default="0.05,0.1", help="comma-separated budgets (default 0.05,0.1)")
    p.add_argument("--norm", default="linf", help="linf (default), l2 or l1")
    p.add_argument("--batch-size", type=int, default=256, help="examples per attack call")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N examples")
    p.add_argument("--clip-min", type=float, default=None,
                   help="lower input bound (default: 0 for digits, the data minimum otherwise)")
    p.add_argument("--clip-max", type=float, default=None,
                   help="upper input bound (default: 1 for digits, the data maximum otherwise)")
    p.add_argument("--no-cascade", action="store_true",
                   help="run every attack on every example instead of a cascade")
    p.add_argument("--no-sanity-checks", action="store_true",
                   help="skip the gradient-masking checks")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--out", default="runs/evaluate", help="output directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _load_data(spec):
    """``(x_test, y_test, clip_min, clip_max)`` for ``--data``."""
    import numpy as np

    if spec.endswith(".npz") and os.path.exists(spec):
        with np.load(spec) as d:
            for kx, ky in (("x_test", "y_test"), ("x", "y")):
                if "x_train" not in d.files and kx in d.files and ky in d.files:
                    # a bare evaluation set: bounds default to the data's range
                    return d[kx].astype("float32"), d[ky].astype("int64"), None, None
    try:  # the shared loader: digits, mnist, fashion_mnist, cifar10 (if on disk), .npz
        from attacks._data import load_dataset
    except ImportError:  # pragma: no cover
        load_dataset = None
    if load_dataset is not None:
        ds = load_dataset(spec)
        return ds.x_test, ds.y_test, ds.clip_min, ds.clip_max
    if spec == "digits":  # pragma: no cover
        from attacks._demo import load_digits_arrays

        _, (x, y) = load_digits_arrays()
        return x, y, 0.0, 1.0
    raise ValueError(f"--data must be 'digits' or an existing .npz file, got {spec!r}")


class _Bar:
    def __init__(self, enabled):
        self.enabled = enabled and sys.stderr is not None
        self.t0 = time.perf_counter()

    def __call__(self, done, total, desc):
        if not self.enabled:
            return
        width = 30
        fill = int(width * done / max(total, 1))
        el = time.perf_counter() - self.t0
        sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} "
                         f"{el:6.1f}s  {desc:<28}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def run(args) -> int:
    import numpy as np

    try:
        eps = [float(e) for e in args.eps.split(",") if e.strip()]
    except ValueError:
        print(f"robustgrad evaluate: --eps must be comma-separated numbers, got {args.eps!r}",
              file=sys.stderr)
        return 2
    names = [a.strip() for a in args.attacks.split(",") if a.strip()]
    if not os.path.exists(args.model):
        print(f"robustgrad evaluate: --model {args.model} does not exist", file=sys.stderr)
        return 2
    import keras

    import attacks

    try:  # the adversarial-training package registers its Keras classes on import
        import attacks.training  # noqa: F401
    except Exception:  # pragma: no cover
        pass
    try:
        x, y, lo, hi = _load_data(args.data)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"robustgrad evaluate: {exc}", file=sys.stderr)
        return 2
    if args.limit:
        x, y = x[: args.limit], y[: args.limit]
    lo = args.clip_min if args.clip_min is not None else lo
    hi = args.clip_max if args.clip_max is not None else hi
    model = keras.models.load_model(args.model, compile=False)
    print(f"evaluating {args.model} on {len(x)} examples of {args.data}: attacks "
          f"{','.join(names)}, {args.norm} eps {','.join(f'{e:g}' for e in eps)}", flush=True)
    try:
        report = attacks.evaluate(
            model, x, np.asarray(y), names, eps, args.batch_size, norm=args.norm, clip_min=lo,
            clip_max=hi, cascade=not args.no_cascade, seed=args.seed,
            sanity_checks=not args.no_sanity_checks, progress=_Bar(not args.no_progress))
    except (ValueError, TypeError) as exc:
        print(f"robustgrad evaluate: {exc}", file=sys.stderr)
        return 2
    print(report.table())
    paths = report.save(args.out)
    print("wrote " + ", ".join(paths.values()))
    return 0
