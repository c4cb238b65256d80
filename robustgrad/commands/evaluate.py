"""``robustgrad evaluate``: a classifier's robustness under an attack ensemble.

Example::

    robustgrad evaluate --model runs/demo/attacks/digits_cnn.keras --data digits \\
        --attacks fgsm,pgd,apgd-ce,square --eps 0.05,0.1 --out runs/eval

Prints the report table and writes ``report.json``, ``report.txt``, ``robust_accuracy.png``
(robust accuracy against eps), ``examples.png`` (clean / adversarial / perturbation),
``per_example.npz`` (each example's label, clean prediction, and per eps whether it stayed
robust, which attack broke it, its logit margin) and ``summary.json`` (a RobustBench-style entry)
under ``--out`` (default ``runs/evaluate``), which must be empty or new unless ``--overwrite``
or ``--resume``. The examples run in chunks of ``--chunk-size``, each committed to
``--out/results/`` as it finishes: after Ctrl-C or a kill, ``--resume`` with the same flags
continues where the run stopped and never attacks a finished chunk again; with ``--certify``
each chunk's certificate is committed there too and never computed again. A progress bar runs
on stderr when it is a terminal.

``--workers N`` runs the chunks as Ray tasks on N workers (the ``distributed`` extra), each
loading ``--model`` itself and using one TensorFlow thread; ``--ray-address HOST:PORT`` (or
``auto``) runs them on a running Ray cluster instead of a local one (every node must see
``--model`` at the same path). The results are per example those of one process::

    robustgrad evaluate --model m.keras --attacks autoattack --eps 0.03 --workers 2
"""

from __future__ import annotations

import argparse
import os
import shutil

from robustgrad.cli import UsageError, user_errors

HELP = "evaluate a classifier's robustness under attacks"

DEFAULT_OUT = "runs/evaluate"
CERTIFY = ("crown", "ibp", "crown-ibp", "alpha-crown")  # robustgrad.bounds.METHODS, without TF


DEFAULT_ATTACKS = "fgsm,pgd,apgd-ce,square"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="M.keras",
                   help="a saved Keras classifier returning logits")
    p.add_argument("--data", default="digits",
                   help="digits (default: the embedded test split), mnist, fashion_mnist, cifar10 "
                        "(if already on disk), or a path.npz holding x_test, y_test (or x, y)")
    p.add_argument("--attacks", default=None,
                   help="comma-separated attacks, run as a cascade in this order "
                        "(default fgsm,pgd,apgd-ce,square); known: fgsm, fgm, bim, mim, pgd, "
                        "pgd-cw, pgd-dlr, apgd-ce, apgd-dlr, apgd-t, cw, deepfool, fab, fab-t, "
                        "square; a number sets the steps (pgd40), KxR steps and restarts "
                        "(pgd50x5); AutoAttack's versions autoattack, autoattack-plus, "
                        "autoattack-rand expand into their components for --norm")
    p.add_argument("--eps", default="0.05,0.1", help="comma-separated budgets (default 0.05,0.1)")
    p.add_argument("--norm", default="linf", help="linf (default), l2 or l1")
    p.add_argument("--batch-size", type=int, default=256,
                   help="examples per attack call (default 256)")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N examples")
    p.add_argument("--clip-min", type=float, default=None,
                   help="lower input bound (default: 0 for digits, the data minimum otherwise)")
    p.add_argument("--clip-max", type=float, default=None,
                   help="upper input bound (default: 1 for digits, the data maximum otherwise)")
    p.add_argument("--no-cascade", action="store_true",
                   help="run every attack on every example instead of a cascade")
    p.add_argument("--no-sanity-checks", action="store_true",
                   help="skip the gradient-masking checks")
    p.add_argument("--certify", default=None, metavar="METHOD",
                   help="also certify every eps with the bound engine: crown, ibp, crown-ibp or "
                        "alpha-crown "
                        "(linf/l2; the model must use supported layers); the report shows the "
                        "certified accuracy beside the attacked one and the undecided examples")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"output directory for the report and figures (default {DEFAULT_OUT})")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --out (its report files and results replaced)")
    p.add_argument("--resume", action="store_true",
                   help="continue the evaluation committed in --out/results (same model, data, "
                        "attacks, eps, norm, bounds, seed and chunk size; a difference is named)")
    p.add_argument("--chunk-size", type=int, default=None, metavar="N",
                   help="examples per committed chunk (default 1000): the most an interruption "
                        "loses")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="run the chunks as Ray tasks on N workers, one TensorFlow thread each "
                        "(needs the distributed extra: pip install 'robustgrad[distributed]')")
    p.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                   help="with --workers: the running Ray cluster to use (or auto); default a "
                        "local Ray of --workers CPUs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def parse_eps(text: str, flag: str = "--eps") -> list[float]:
    """``"0.05,0.1"`` -> ``[0.05, 0.1]``: at least one finite budget >= 0."""
    from robustgrad import checks as _checks

    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        raise UsageError(f"{flag} must be comma-separated numbers, got {text!r}")
    with user_errors(ValueError):
        return [float(_checks.nonnegative(v, flag)) for v in values]


def validate(args: argparse.Namespace) -> None:
    """The checks that need no TensorFlow (before it loads)."""
    from robustgrad import checks as _checks
    from robustgrad.commands._bounds import MAX_BATCH, MAX_EXAMPLES, MAX_SEED
    from robustgrad.commands._files import check_clip_flags, check_model_file, check_output_dir

    args.eps_values = parse_eps(args.eps)
    args.attacks_given = args.attacks is not None
    if args.attacks is None:
        args.attacks = DEFAULT_ATTACKS
    args.attack_names = [a.strip() for a in args.attacks.split(",") if a.strip()]
    if not args.attack_names:
        raise UsageError(f"--attacks: give at least one attack name, got {args.attacks!r}")
    with user_errors(ValueError):
        args.norm = _checks.norm_name(args.norm, "--norm")
        _checks.positive_int(args.batch_size, "--batch-size", maximum=MAX_BATCH)
        if args.limit is not None:
            _checks.positive_int(args.limit, "--limit", maximum=MAX_EXAMPLES)
        _checks.positive_int(args.seed, "--seed", minimum=0, maximum=MAX_SEED)
    if args.certify is not None:
        if args.certify not in CERTIFY:
            raise UsageError(f"--certify: unknown method {args.certify!r}; choose one of "
                             + ", ".join(CERTIFY))
        if args.norm not in ("linf", "l2"):
            raise UsageError(f"--certify certifies linf or l2 balls, not --norm {args.norm}")
    with user_errors(ValueError):
        if args.chunk_size is not None:
            _checks.positive_int(args.chunk_size, "--chunk-size", maximum=10**9)
    _check_workers(args)
    check_clip_flags(args.clip_min, args.clip_max)
    check_model_file(args.model)
    if args.resume and args.overwrite:
        raise UsageError("--resume continues the results in --out; --overwrite replaces them: "
                         "give one")
    if args.resume:
        if not os.path.isfile(os.path.join(args.out, "results", "manifest.json")):
            raise UsageError(f"--resume: {args.out} holds no evaluation to resume (no "
                             "results/manifest.json); run without --resume")
    else:
        check_output_dir(args.out, "--out", overwrite=args.overwrite)


def _check_workers(args: argparse.Namespace) -> None:
    """--workers in range, Ray installed and --ray-address reachable (before TensorFlow loads)."""
    from robustgrad import ray_setup

    workers, address = getattr(args, "workers", None), getattr(args, "ray_address", None)
    if workers is None:
        if address is not None:
            raise UsageError("--ray-address is where --workers run: give --workers too")
        return
    with user_errors(ValueError, TypeError, ImportError, ConnectionError):
        ray_setup.check_workers(workers, "--workers")
        ray_setup.address_host_port(address, "--ray-address")
        ray_setup.import_ray("--workers")
        ray_setup.check_ray_address(address, "--ray-address")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    import attacks
    from attacks.data import load_test_set
    from robustgrad.commands._files import load_keras_model, removed_if_empty_on_error
    from robustgrad.progress import EvaluationProgress

    if not hasattr(args, "eps_values"):  # called without the command line's validate step
        validate(args)
    with user_errors(ValueError):
        specs = attacks.parse_attacks(args.attack_names, norm=args.norm)
        for label, attack in specs:
            if args.norm not in attack.norms:
                raise ValueError(f"--attacks: {label} does not support --norm {args.norm} "
                                 f"(supports {', '.join(attack.norms)})")
    with user_errors(ValueError, OSError):
        x, y, lo, hi = load_test_set(args.data)
    if args.limit:
        x, y = x[: args.limit], y[: args.limit]
    if not getattr(args, "attacks_given", True) and np.ndim(x) not in (3, 4):
        # the default list on vector data: Square needs images, the others run
        specs = [(label, attack) for label, attack in specs if label != "square"]
        print(f"note: --data {args.data} holds vectors {tuple(np.shape(x)[1:])}, not images: "
              f"the default attacks run without square (it perturbs square windows)", flush=True)
    lo = args.clip_min if args.clip_min is not None else lo
    hi = args.clip_max if args.clip_max is not None else hi
    model = load_keras_model(args.model)
    with user_errors(ValueError, TypeError):  # one forward pass: the model's errors name --model
        attacks.check_classification_data(model, x, np.asarray(y), x_name=f"--data {args.data}: x",
                                  y_name=f"--data {args.data}: y", model_name="--model")
    eps_text = ",".join(f"{e:g}" for e in args.eps_values)
    print(f"evaluating {args.model} on {len(x)} examples of {args.data}: attacks "
          f"{','.join(label for label, _ in specs)}, {args.norm} eps {eps_text}", flush=True)
    progress = EvaluationProgress(enabled=not args.no_progress)
    results = os.path.join(args.out, "results")
    if args.overwrite and not args.resume and os.path.isdir(results):
        shutil.rmtree(results)  # --overwrite: a new evaluation, not the old one's chunks
    try:
        # attacks.evaluate checks the model against the data (shapes, label range) before any
        # attack runs: those ValueErrors are the user's
        with user_errors(ValueError):
            report = attacks.evaluate(
                model, x, np.asarray(y), specs, args.eps_values, args.batch_size, norm=args.norm,
                clip_min=lo, clip_max=hi, cascade=not args.no_cascade, seed=args.seed,
                sanity_checks=not args.no_sanity_checks, progress=progress,
                certify=args.certify, results_dir=results, chunk_size=args.chunk_size,
                **_sharding(args))
    finally:
        progress.close()
    print(report.table())
    with removed_if_empty_on_error(args.out):
        paths = report.save(args.out)
        paths["summary"] = _write_summary(report, args)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _sharding(args: argparse.Namespace) -> dict:
    """evaluate's keywords for --workers: each worker loads --model itself."""
    import functools

    import keras

    if getattr(args, "workers", None) is None:
        return {}
    return {"workers": args.workers, "ray_address": getattr(args, "ray_address", None),
            "model_factory": functools.partial(keras.models.load_model,
                                               os.path.abspath(args.model), compile=False)}


def _write_summary(report, args: argparse.Namespace) -> str:
    """``summary.json``: the report's RobustBench-style entry (model file name, dataset), with
    the attack versions as asked (``autoattack`` names AutoAttack's standard version; its
    robust accuracy is then ``autoattack_robust_accuracy``), the library's version and, with
    ``--certify``, the certified accuracy per eps."""
    import json

    import robustgrad
    from robustgrad.atomic import replacing

    path = os.path.join(args.out, "summary.json")
    name = os.path.splitext(os.path.basename(os.path.normpath(args.model)))[0]
    entry = report.summary(name, args.data)
    entry["attack_versions"] = list(args.attack_names)
    if any(a.lower().startswith("autoattack") for a in args.attack_names):
        entry["autoattack_robust_accuracy"] = entry["robust_accuracy"]
    if report.certified:
        entry["certified_accuracy"] = {f"{e:g}": c["certified_accuracy"]
                                       for e, c in report.certified.items()}
        entry["certify"] = report.certify
    entry["library_version"] = robustgrad.__version__
    with replacing(path) as tmp, open(tmp, "w") as f:
        json.dump(entry, f, indent=2)
    return path
