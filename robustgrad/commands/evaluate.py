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

from robustgrad.cli import UsageError, user_errors

HELP = "evaluate a classifier's robustness under attacks"

DEFAULT_OUT = "runs/evaluate"
CERTIFY = ("crown", "ibp", "crown-ibp", "alpha-crown")  # robustgrad.bounds.METHODS, without TF


DEFAULT_ATTACKS = "fgsm,pgd,apgd-ce,square"  # attacks.evaluation_run.DEFAULT_ATTACKS, without TF

FIELD_FLAGS = {name: "--" + name.replace("_", "-") for name in (
    "model", "data", "attacks", "eps", "norm", "batch_size", "limit", "clip_min", "clip_max",
    "certify", "seed", "chunk_size", "workers", "ray_address", "resume", "overwrite")}
"""The fields of :class:`attacks.evaluation_run.EvaluationConfig` -> the flags that set them."""


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
    """Build :class:`attacks.evaluation_run.EvaluationConfig` from the flags and call
    :func:`attacks.evaluation_run.evaluate_run` on ``--out``."""
    import functools

    from attacks.evaluation_run import EvaluationConfig, evaluate_run
    from robustgrad.commands._agent_flags import flag_error
    from robustgrad.commands._files import load_keras_model, removed_if_empty_on_error
    from robustgrad.progress import EvaluationProgress
    from robustgrad.rundir import RunDirectory

    if not hasattr(args, "eps_values"):  # called without the command line's validate step
        validate(args)
    with user_errors(ValueError):  # validate() checked the flags: a defence, said as it is
        config = EvaluationConfig(
            model=args.model, data=args.data,
            attacks=tuple(args.attack_names) if args.attacks_given else None,
            eps=tuple(args.eps_values), norm=args.norm, batch_size=args.batch_size,
            limit=args.limit, clip_min=args.clip_min, clip_max=args.clip_max,
            cascade=not args.no_cascade, sanity_checks=not args.no_sanity_checks,
            certify=args.certify, seed=args.seed, chunk_size=args.chunk_size,
            workers=getattr(args, "workers", None), ray_address=getattr(args, "ray_address", None))
    progress = EvaluationProgress(enabled=not args.no_progress)
    try:
        with removed_if_empty_on_error(args.out):
            evaluate_run(config, RunDirectory(args.out), load_model=load_keras_model,
                         resume=args.resume, overwrite=args.overwrite, progress=progress,
                         log=functools.partial(_log, args), lock=False)
    except UsageError:
        raise
    except ValueError as exc:
        # the entry checks the attacks against --norm, loads the data and the model, and checks
        # them against each other (shapes, label range) before any attack runs: its
        # ValueErrors are the user's, said with this command's flags
        raise UsageError(str(flag_error(exc, args, names=FIELD_FLAGS))) from exc
    finally:
        progress.close()
    return 0


def _log(args: argparse.Namespace, text: str) -> None:
    """The entry's lines, with its field names said as this command's flags."""
    print(text.replace("note: data ", "note: --data ", 1), flush=True)
