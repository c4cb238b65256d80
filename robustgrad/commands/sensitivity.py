"""``robustgrad sensitivity``: input-gradient sensitivity analysis of one or two classifiers.

Example::

    robustgrad train-classifier --data digits --method clean --out runs/clean
    robustgrad train-classifier --data digits --method madry --eps 0.1 --out runs/madry
    robustgrad sensitivity --model runs/clean/model.keras --model2 runs/madry/model.keras \\
        --data digits --out runs/sens

Writes under ``--out``:

* ``summary.json`` -- per model: clean accuracy on the analysed test examples; per-example Jacobian
  spectral norm (power iteration), per-class Jacobian norms, empirical local Lipschitz constant
  over the ``--eps`` ball (PGD), saliency statistics -- as mean/median/p90/max -- and timings.
* ``saliency_per_class.png`` -- mean |saliency| (and |SmoothGrad|) of the true-class logit for
  each class, one row per model (image inputs only).
* ``sensitivity_distribution.png`` -- histograms of the per-example spectral norms and Lipschitz
  estimates, the two models overlaid.
* ``class_jacobian_norms.png`` -- mean per-class Jacobian norm, per model.

``--out`` must be new or empty unless ``--overwrite``; it is created only when the results exist.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from robustgrad.atomic import save_figure
from robustgrad.cli import user_errors

HELP = "input-gradient sensitivity analysis of a classifier"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="M.keras",
                   help="a Keras classifier returning logits")
    p.add_argument("--model2", default=None, metavar="M2.keras",
                   help="a second classifier (e.g. adversarially trained) analysed side by side")
    p.add_argument("--data", default="digits",
                   help="digits (default), a keras dataset name, or a path.npz (test split used)")
    p.add_argument("--out", required=True,
                   help="output directory for summary.json and the figures (no default)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --out (its summary and figures are replaced)")
    p.add_argument("--num", type=int, default=256, help="test examples analysed (default 256)")
    p.add_argument("--eps", type=float, default=0.1, help="Lipschitz ball radius (default 0.1)")
    p.add_argument("--norm", default="linf", help="ball norm: linf (default), l2, l1")
    p.add_argument("--power-iters", type=int, default=20,
                   help="power iterations for the spectral norm (default 20)")
    p.add_argument("--chunk-size", type=int, default=5,
                   help="classes differentiated at once for the per-class norms (default 5)")
    p.add_argument("--batch-size", type=int, default=128, help="mini-batch size (default 128)")
    p.add_argument("--lipschitz-steps", type=int, default=10, help="PGD steps (default 10)")
    p.add_argument("--restarts", type=int, default=2, help="PGD restarts (default 2)")
    p.add_argument("--smoothgrad-samples", type=int, default=16,
                   help="noise samples for SmoothGrad (default 16; 0 skips it)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def _stats(v):
    import numpy as np

    v = np.asarray(v, np.float64)
    return {"mean": float(v.mean()), "median": float(np.median(v)),
            "p90": float(np.percentile(v, 90)), "max": float(v.max()), "min": float(v.min())}


def _analyse(name, path, model, x, y, args, lo, hi):
    import numpy as np
    import tensorflow as tf

    from attacks import sensitivity

    rec = {"path": path}
    bs = args.batch_size
    batches = [(x[i:i + bs], y[i:i + bs]) for i in range(0, len(x), bs)]
    t0 = time.perf_counter()
    logits = np.concatenate([model(xb, training=False).numpy() for xb, _ in batches])
    rec["accuracy"] = float((logits.argmax(1) == y).mean())
    if np.allclose(np.exp(logits).sum(1), 1.0, atol=1e-3) or (
            (logits >= 0).all() and np.allclose(logits.sum(1), 1.0, atol=1e-3)):
        print(f"[sensitivity] warning: {name} seems to output probabilities, not logits; "
              "gradients through a saturated softmax understate sensitivity", file=sys.stderr)

    t = time.perf_counter()
    sal = np.concatenate([sensitivity.saliency(model, xb, yb).numpy() for xb, yb in batches])
    rec["saliency_seconds"] = time.perf_counter() - t
    sg = None
    if args.smoothgrad_samples > 0:
        t = time.perf_counter()
        sg = np.concatenate([sensitivity.smoothgrad(model, xb, yb, num_samples=args.smoothgrad_samples,
                                                    value_range=float(np.max(hi) - np.min(lo)),
                                                    seed=args.seed).numpy() for xb, yb in batches])
        rec["smoothgrad_seconds"] = time.perf_counter() - t
    rec["saliency_l2"] = _stats(np.linalg.norm(sal.reshape(len(sal), -1), axis=1))

    t = time.perf_counter()
    spec = np.concatenate([sensitivity.jacobian_spectral_norm(model, xb, num_iters=args.power_iters,
                                                              seed=args.seed).numpy()
                           for xb, _ in batches])
    rec["spectral_norm_seconds"] = time.perf_counter() - t
    rec["spectral_norm"] = _stats(spec)

    t = time.perf_counter()
    cj = sensitivity.class_jacobian_norms(model, x, chunk_size=args.chunk_size, batch_size=bs,
                                          norm="l2").numpy()
    rec["class_jacobian_seconds"] = time.perf_counter() - t
    rec["class_jacobian_norm_mean"] = [float(v) for v in cj.mean(0)]

    t = time.perf_counter()
    lips, methods = [], set()
    for xb, yb in batches:
        v, (_, method) = sensitivity.local_lipschitz(
            model, xb, tf.constant(yb), eps=args.eps, norm=args.norm, clip_min=lo, clip_max=hi,
            function="logit", steps=args.lipschitz_steps, restarts=args.restarts,
            seed=args.seed, return_points=True)
        lips.append(v.numpy())
        methods.add(method)
    lipschitz = np.concatenate(lips)
    rec["lipschitz_seconds"] = time.perf_counter() - t
    rec["local_lipschitz"] = _stats(lipschitz)
    rec["local_lipschitz_method"] = sorted(methods)
    rec["total_seconds"] = time.perf_counter() - t0
    arrays = {"saliency": sal, "smoothgrad": sg, "spectral": spec, "lipschitz": lipschitz,
              "class_jacobian": cj}
    return rec, arrays


def _saliency_figure(out, results, y, num_classes, image_shape) -> str:
    """Mean |saliency| (and |SmoothGrad|) per class, one row per model: image inputs."""
    import matplotlib.pyplot as plt
    import numpy as np

    rows = []
    for n in results:
        rows.append((f"{n}: |saliency|", results[n][1]["saliency"]))
        if results[n][1]["smoothgrad"] is not None:
            rows.append((f"{n}: |SmoothGrad|", results[n][1]["smoothgrad"]))
    fig, axes = plt.subplots(len(rows), num_classes, figsize=(1.3 * num_classes,
                                                              1.5 * len(rows)),
                             squeeze=False)
    for r, (label, arr) in enumerate(rows):
        a = np.abs(arr).reshape((len(arr),) + image_shape).mean(-1)
        for c in range(num_classes):
            ax = axes[r, c]
            sel = a[y == c]
            ax.imshow(sel.mean(0) if len(sel) else np.zeros(image_shape[:2]), cmap="hot")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"class {c}", fontsize=8)
        axes[r, 0].set_ylabel(label, fontsize=7)
    fig.tight_layout()
    p = os.path.join(out, "saliency_per_class.png")
    save_figure(fig, p, dpi=90)
    return p


def _figures(out, results, y, num_classes, image_shape):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(results)
    files = []
    if image_shape is not None:  # saliency per class
        files.append(_saliency_figure(out, results, y, num_classes, image_shape))
    # distributions
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for key, ax, title in (("spectral", axes[0], "Jacobian spectral norm per example"),
                           ("lipschitz", axes[1], "empirical local Lipschitz (logit, dual norm)")):
        vals = [results[n][1][key] for n in names]
        bins = np.linspace(min(v.min() for v in vals), max(v.max() for v in vals), 40)
        for n, v in zip(names, vals):
            ax.hist(v, bins=bins, alpha=0.55, label=n)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    p = os.path.join(out, "sensitivity_distribution.png")
    save_figure(fig, p, dpi=90)
    files.append(p)
    # per-class Jacobian norms
    fig, ax = plt.subplots(figsize=(7, 3))
    w = 0.8 / len(names)
    for i, n in enumerate(names):
        m = results[n][1]["class_jacobian"].mean(0)
        ax.bar(np.arange(len(m)) + i * w, m, width=w, label=n)
    ax.set_xlabel("class")
    ax.set_ylabel("mean ||d logit_c / dx||_2")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = os.path.join(out, "class_jacobian_norms.png")
    save_figure(fig, p, dpi=90)
    files.append(p)
    return files


def validate(args: argparse.Namespace) -> None:
    """The checks that need no TensorFlow (before it loads)."""
    from robustgrad import checks as _checks
    from robustgrad.commands import _bounds as b
    from robustgrad.commands._files import check_model_file, check_output_dir

    with user_errors(ValueError):
        for name, maximum in (("num", b.MAX_EXAMPLES), ("power_iters", b.MAX_REPEATS),
                              ("chunk_size", b.MAX_REPEATS), ("batch_size", b.MAX_BATCH),
                              ("lipschitz_steps", b.MAX_REPEATS),
                              ("restarts", b.MAX_RESTARTS)):
            _checks.positive_int(getattr(args, name), f"--{name.replace('_', '-')}",
                                 maximum=maximum)
        _checks.positive_int(args.smoothgrad_samples, "--smoothgrad-samples", minimum=0,
                             maximum=b.MAX_REPEATS)
        _checks.positive_int(args.seed, "--seed", minimum=0, maximum=b.MAX_SEED)
        _checks.number(args.eps, "--eps", minimum=0, min_inclusive=False)
        args.norm = _checks.norm_name(args.norm, "--norm")
    check_model_file(args.model, "--model")
    if args.model2:
        check_model_file(args.model2, "--model2")
    check_output_dir(args.out, "--out", overwrite=args.overwrite)


def run(args) -> int:
    import numpy as np

    import attacks  # noqa: F401  (registers the package's Keras classes for loading)
    from attacks.data import load_dataset
    from robustgrad.commands._files import load_keras_model, removed_if_empty_on_error

    paths = [("model", args.model)] + ([("model2", args.model2)] if args.model2 else [])
    with user_errors(ValueError, OSError):
        data = load_dataset(args.data, seed=args.seed)
    lo, hi = float(data.clip_min), float(data.clip_max)
    x = np.asarray(data.x_test[: args.num], np.float32)
    y = np.asarray(data.y_test[: args.num], np.int64)
    models = [(flag, p, load_keras_model(p, f"--{flag}")) for flag, p in paths]

    results = {}
    for flag, p, model in models:
        base = os.path.basename(p)
        if base == "model.keras":  # train-classifier's layout: name it after its run directory
            base = os.path.basename(os.path.dirname(os.path.abspath(p)))
        label = f"{flag} ({base})"
        print(f"[sensitivity] analysing {label}: {p} on {len(x)} {args.data} test examples")
        results[label] = _analyse(label, p, model, x, y, args, lo, hi)
        r = results[label][0]
        print(f"[sensitivity]   accuracy {r['accuracy']:.3f}; spectral norm median "
              f"{r['spectral_norm']['median']:.3f}; local Lipschitz (eps={args.eps}, "
              f"{args.norm}) median {r['local_lipschitz']['median']:.3f} "
              f"[{', '.join(r['local_lipschitz_method'])}]; {r['total_seconds']:.1f}s")
    num_classes = len(results[next(iter(results))][1]["class_jacobian"][0])
    image_shape = tuple(x.shape[1:]) if x.ndim == 4 else None
    with removed_if_empty_on_error(args.out):
        os.makedirs(args.out, exist_ok=True)
        files = _figures(args.out, results, y, num_classes, image_shape)
    summary = {
        "data": args.data, "num_examples": int(len(x)),
        "settings": {k: getattr(args, k) for k in ("eps", "norm", "power_iters", "chunk_size",
                                                   "batch_size", "lipschitz_steps", "restarts",
                                                   "smoothgrad_samples", "seed")},
        "models": {k: v[0] for k, v in results.items()},
        "figures": [os.path.basename(f) for f in files],
    }
    if len(results) == 2:
        a, b = (v[0] for v in results.values())
        summary["ratio_model2_over_model"] = {
            "spectral_norm_median": b["spectral_norm"]["median"] / a["spectral_norm"]["median"],
            "local_lipschitz_median": (b["local_lipschitz"]["median"]
                                       / a["local_lipschitz"]["median"]),
        }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"[sensitivity] wrote {os.path.join(args.out, 'summary.json')} and "
          f"{', '.join(os.path.basename(f) for f in files)}")
    return 0
