"""``robustgrad certify``: certified accuracy of a classifier at several radii.

Example::

    robustgrad certify --model runs/ibp/model.keras --data digits --eps 0.05,0.1 --method crown
    robustgrad certify --model m.keras --method smoothing --sigma 0.25 --eps 0.25,0.5 --n 10000

``--method crown``, ``ibp``, ``crown-ibp`` or ``alpha-crown`` bound the model's margins over each
L-inf (or L2) ball with :mod:`robustgrad.bounds` (:func:`attacks.certify.verified_accuracy`): a
lower bound on the accuracy under any attack. ``--method smoothing`` certifies the
Gaussian-smoothed classifier instead (Cohen et al. 2019, :func:`attacks.certify.smooth_certify`):
an example counts at radius ``r`` (L2) when the smoothed prediction is right and its certified
radius is at least ``r``. Every flag is checked before TensorFlow loads; the result goes to
``report.json``, ``report.txt`` and ``per_example.npz`` (per example: label, clean prediction,
certified or not at each radius) under ``--out`` (default ``runs/certify``).

The examples are certified in chunks of ``--chunk-size``, each committed to ``--out/results/``
as it ends: after Ctrl-C or a kill, ``--resume`` with the same flags continues where the run
stopped and never certifies a finished chunk again (a different model, data, method, radius,
norm or smoothing setting is refused, naming it)::

    robustgrad certify --model m.keras --method crown --eps 0.05 --out runs/c --resume
"""

from __future__ import annotations

import argparse
import os

from robustgrad.cli import UsageError, user_errors

HELP = ("certified accuracy of a classifier (CROWN, IBP, CROWN-IBP, alpha-CROWN, randomized "
        "smoothing)")

DEFAULT_OUT = "runs/certify"
# robustgrad.bounds.METHODS + smoothing
METHODS = ("crown", "ibp", "crown-ibp", "alpha-crown", "smoothing")
# flag -> the methods it configures (given with another method it would do nothing: refused)
APPLIES = {f"--{flag}": ("smoothing",) for flag in ("sigma", "n0", "n", "alpha", "seed")}
MAX_DRAWS = 10**7
SMOOTHING_DEFAULTS = {"sigma": 0.25, "n0": 100, "n": 10_000, "alpha": 0.001, "seed": 0}
# --method -> the norms it certifies (the first: the default)
NORMS = {"smoothing": ("l2",), **{m: ("linf", "l2") for m in METHODS[:4]}}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="M.keras",
                   help="a saved Keras classifier returning logits")
    p.add_argument("--data", default="digits",
                   help="digits (default: the embedded test split), a dataset name on disk, or a "
                        "path.npz holding x_test, y_test (or x, y)")
    p.add_argument("--eps", default="0.05,0.1",
                   help="comma-separated radii (default 0.05,0.1); L2 radii for smoothing")
    p.add_argument("--method", default="crown",
                   help="crown (default), ibp, crown-ibp, alpha-crown or smoothing")
    p.add_argument("--norm", default=None,
                   help="linf (default) or l2 for the bounds; smoothing certifies l2 only")
    p.add_argument("--sigma", type=float, default=None,
                   help="smoothing: the noise's standard deviation (default 0.25)")
    p.add_argument("--n0", type=int, default=None,
                   help="smoothing: selection draws per example (default 100)")
    p.add_argument("--n", type=int, default=None,
                   help="smoothing: estimation draws per example (default 10000)")
    p.add_argument("--alpha", type=float, default=None,
                   help="smoothing: failure probability of each certificate (default 0.001)")
    p.add_argument("--batch-size", type=int, default=256, help="examples per call (default 256)")
    p.add_argument("--limit", type=int, default=None, help="certify only the first N examples")
    p.add_argument("--clip-min", type=float, default=None,
                   help="lower input bound (default: the dataset's, else the data minimum)")
    p.add_argument("--clip-max", type=float, default=None,
                   help="upper input bound (default: the dataset's, else the data maximum)")
    p.add_argument("--seed", type=int, default=None, help="smoothing: noise seed (default 0)")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"output directory for report.json and report.txt (default {DEFAULT_OUT})")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --out (its report and results replaced)")
    p.add_argument("--resume", action="store_true",
                   help="continue the certification committed in --out/results (same model, "
                        "data, method, eps, norm, bounds and chunk size; a difference is named)")
    p.add_argument("--chunk-size", type=int, default=None, metavar="N",
                   help="examples per committed chunk (default 1000): the most an interruption "
                        "loses")
    p.add_argument("--no-progress", action="store_true", help="no per-radius progress lines")


def validate(args: argparse.Namespace) -> None:
    """Every flag, before TensorFlow loads."""
    from robustgrad import checks as _checks
    from robustgrad.commands._bounds import (
        MAX_BATCH,
        MAX_EXAMPLES,
        MAX_SEED,
        at_most,
        not_applicable,
    )
    from robustgrad.commands._files import check_clip_flags, check_model_file
    from robustgrad.commands.evaluate import parse_eps

    if args.method not in METHODS:
        raise UsageError(f"--method: unknown method {args.method!r}; choose one of "
                         + ", ".join(METHODS))
    args.eps_values = sorted(set(parse_eps(args.eps)))
    refusal = not_applicable(APPLIES, [f for f in APPLIES if getattr(args, f[2:]) is not None],
                             [args.method], "--method")
    if refusal:
        raise UsageError(refusal)
    for field, default in SMOOTHING_DEFAULTS.items():
        if getattr(args, field) is None:
            setattr(args, field, default)
    with user_errors(ValueError):
        args.norm = _checks.norm_name(args.norm or NORMS[args.method][0], "--norm")
    if args.norm not in NORMS[args.method]:
        raise UsageError(f"--norm {args.norm}: --method {args.method} certifies "
                         f"{' or '.join(NORMS[args.method])} radii"
                         + (" (Gaussian noise); leave --norm out" if args.method == "smoothing"
                            else ""))
    with user_errors(ValueError):
        _checks.positive_int(args.batch_size, "--batch-size", maximum=MAX_BATCH)
        _checks.positive_int(args.limit, "--limit", maximum=MAX_EXAMPLES, allow_none=True)
        _checks.positive_int(args.seed, "--seed", minimum=0, maximum=MAX_SEED)
        _checks.positive_int(args.chunk_size, "--chunk-size", allow_none=True, maximum=10**9)
        if args.method == "smoothing":
            _checks.number(args.sigma, "--sigma", minimum=0, min_inclusive=False)
            _checks.positive_int(args.n0, "--n0")
            at_most(_checks.positive_int(args.n, "--n"), "--n", MAX_DRAWS,
                    "noise draws per example: 100x Cohen et al.'s 100,000")
            _checks.number(args.alpha, "--alpha", minimum=0, maximum=1, min_inclusive=False,
                           max_inclusive=False)
    if args.method == "smoothing":
        if args.n0 > args.n:
            raise UsageError(f"--n0 ({args.n0} selection draws) must be <= --n ({args.n} "
                             f"estimation draws)")
    check_clip_flags(args.clip_min, args.clip_max)
    check_model_file(args.model)
    _check_out(args)


def _check_out(args: argparse.Namespace) -> None:
    """``--out``: new or empty (or ``--overwrite``), or with ``--resume`` a certification's
    committed results."""
    from robustgrad.commands._files import check_output_dir

    if getattr(args, "resume", False):
        if args.overwrite:
            raise UsageError("--resume continues the results in --out; --overwrite replaces "
                             "them: give one")
        if not os.path.isfile(os.path.join(args.out, "results", "manifest.json")):
            raise UsageError(f"--resume: {args.out} holds no certification to resume (no "
                             "results/manifest.json); run without --resume")
    else:
        check_output_dir(args.out, "--out", overwrite=args.overwrite)


FIELD_FLAGS = {name: "--" + name.replace("_", "-") for name in (
    "model", "data", "eps", "method", "norm", "sigma", "n0", "n", "alpha", "seed", "batch_size",
    "limit", "clip_min", "clip_max", "chunk_size", "resume", "overwrite")}
"""The fields of :class:`attacks.certification.CertifyConfig` -> the flags that set them."""


def run(args: argparse.Namespace) -> int:
    """Certify the model at every radius of ``--eps``: :func:`attacks.certification.certify_run`
    writes ``report.json``, ``report.txt`` and ``per_example.npz``, committing each chunk to
    ``--out/results`` (``--resume`` continues them)."""
    from attacks.certification import CertifyConfig, certify_run
    from robustgrad.commands._agent_flags import flag_error
    from robustgrad.commands._files import load_keras_model, removed_if_empty_on_error
    from robustgrad.errors import ConfigError
    from robustgrad.rundir import RunDirectory

    if not hasattr(args, "eps_values"):
        validate(args)
    config = CertifyConfig(
        model=args.model, data=args.data, eps=tuple(args.eps_values), method=args.method,
        norm=args.norm, sigma=args.sigma, n0=args.n0, n=args.n, alpha=args.alpha, seed=args.seed,
        batch_size=args.batch_size, limit=args.limit, clip_min=args.clip_min,
        clip_max=args.clip_max, chunk_size=getattr(args, "chunk_size", None))
    with removed_if_empty_on_error(args.out):
        try:
            certify_run(config, RunDirectory(args.out), model=load_keras_model, lock=False,
                        verbose=1 if args.no_progress else 2,
                        resume=getattr(args, "resume", False))
        except ConfigError as exc:  # the library's field names, said as this command's flags
            raise UsageError(str(flag_error(exc, args, names=FIELD_FLAGS))) from exc
    print("wrote " + ", ".join(os.path.join(args.out, name) for name in
                               ("report.json", "report.txt", "per_example.npz")))
    return 0
