"""The flags of ``robustgrad train-classifier`` (its command module, :mod:`robustgrad.commands.
train_classifier`, runs them) and the checks of their values. No TensorFlow here: the parser is
built and the values checked before TensorFlow loads.

>>> import argparse
>>> p = argparse.ArgumentParser()
>>> add_arguments(p)
>>> args = p.parse_args(["--out", "runs/x", "--method", "smoothadv", "--sigma", "0.5"])
>>> args.method, args.sigma, args.data
('smoothadv', 0.5, 'digits')
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re

from robustgrad.cli import UsageError, user_errors

__all__ = ["add_arguments", "check_values"]

METHODS = ("madry", "trades", "fast", "free", "mart", "awp", "ibp", "crown-ibp", "clean",
           "gaussian", "smoothadv")
CERTIFIED = ("ibp", "crown-ibp")  # they bound the model: arch ibp-small or mlp
# attacks.training.OPTIMIZERS / SCHEDULES (repeated: validate runs before TensorFlow loads)
OPTIMIZERS = ("adam", "sgd")
SCHEDULES = ("constant", "cosine", "cyclic", "piecewise")
# attacks.data.DATASETS and attacks.training.ARCHITECTURES, likewise
DATA_NAMES = ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100", "svhn")
ARCH_NAMES = ("cnn", "mlp", "ibp-small", "preactresnet18", "wideresnet", "wrn-28-10", "wrn-34-10")
STRATEGIES = ("none", "mirrored", "multiworker")


def _method_flags() -> dict[str, tuple[str, ...]]:
    """flag -> the methods it configures: the library's table
    (:data:`attacks.training.method_options.CONFIG_OPTIONS`, whose file is read here without
    importing ``attacks``, which loads TensorFlow), its fields spelt as flags."""
    spec = importlib.util.find_spec("attacks")  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the attacks package is not installed beside robustgrad")
    path = os.path.join(list(spec.submodule_search_locations)[0], "training",
                        "method_options.json")
    with open(path, encoding="utf-8") as f:
        table = json.load(f)["options"]
    return {"--" + name.replace("_", "-"): tuple(methods) for name, methods in table.items()}


METHOD_FLAGS = _method_flags()
"""flag -> the methods it configures; given with another ``--method`` it would do nothing
(refused, as ``AdversarialTrainer`` and ``ClassifierConfig`` refuse the option)."""
MAX_FREE_REPLAYS = 64
"""``--method free``'s most replays (``--steps``; Shafahi et al. use 2-10): each is unrolled in
the traced step, so 10**6 would trace for hours."""
MAX_NOISE_DRAWS = 1_024
"""``--noise-draws``' most draws: each multiplies the batch held in memory (Salman et al.: 1-8)."""
# flag -> the architectures it configures (--init-from brings its own: none)
ARCH_FLAGS = {"--width": ("cnn", "preactresnet18")}
DEFAULT_WIDTH = 64
EVAL_ATTACKS = "pgd50x5,apgd-ce,apgd-t,square"


def _strategy_name(text: str) -> str:
    """``--strategy``: ``multi-worker`` (the issue's spelling) is ``multiworker``, from the
    parse on (the run's lock and record use it)."""
    return "multiworker" if text == "multi-worker" else text


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``train-classifier`` (data and model, method, optimisation, running)."""
    _data_arguments(p.add_argument_group("data and model"))
    _method_arguments(p.add_argument_group("method"))
    _optimisation_arguments(p.add_argument_group("optimisation"))
    _running_arguments(p.add_argument_group("running"))


def _data_arguments(g) -> None:
    g.add_argument("--data", default="digits",
                   help="digits (default, embedded), mnist, fashion_mnist, cifar10, cifar100, "
                        "svhn (downloaded on first use into the cache), or a path: an .npz "
                        "holding x_train, y_train, x_test, y_test, a directory of the IDX / "
                        "CIFAR binary / SVHN .mat files, or an image folder")
    g.add_argument("--no-download", action="store_true",
                   help="never download a named dataset (say which file to put where instead)")
    g.add_argument("--arch", default=None,
                   help="cnn (default; ibp/crown-ibp: ibp-small), mlp, ibp-small (Gowal et al.'s "
                        "small CNN for certified training), preactresnet18, wideresnet, "
                        "wrn-DEPTH-WIDEN (e.g. wrn-28-10)")
    g.add_argument("--augment", action="store_true", default=None,
                   help="pad-4 random crops, and horizontal flips for colour images (default: "
                        "the recipe's, else off)")
    g.add_argument("--limit", type=int, default=None,
                   help="use only the first N training examples (quick runs)")
    g.add_argument("--width", type=int, default=None,
                   help="channels of the first conv layer of cnn and preactresnet18 (default 64)")
    g.add_argument("--init-from", default=None, metavar="M.keras",
                   help="start from an existing classifier (logits output) instead of a new CNN")
    g.add_argument("--freeze", default=None, metavar="PATTERNS",
                   help="comma-separated layer names/globs to freeze (prefix re: for a regex)")


def _method_arguments(g) -> None:
    g.add_argument("--method", default="madry",
                   help="madry (default), trades, fast, free, mart, awp (PGD + adversarial "
                        "weight perturbation), ibp, crown-ibp (certified training: Gowal et al. "
                        "2018, Zhang et al. 2020), clean, gaussian (noise of std --eps, for "
                        "randomized smoothing: Cohen et al. 2019), smoothadv (L2 PGD of radius "
                        "--eps against the smoothed classifier, then noisy copies: Salman et "
                        "al. 2019)")
    g.add_argument("--recipe", default=None,
                   help="published settings to start from: auto (default: the recipe of this "
                        "method, dataset and architecture when one exists, e.g. "
                        "wong2020-fast-mnist), none (the method's defaults), or a recipe name "
                        "(attacks/training/recipes.json); explicit flags override it")
    g.add_argument("--eps", type=float, default=None,
                   help="perturbation budget (default: the recipe's, else 0.1)")
    g.add_argument("--norm", default=None, help="linf (default) or l2 (smoothadv: l2 only)")
    g.add_argument("--sigma", type=float, default=None,
                   help="smoothadv: std of the smoothing noise (default: the recipe's, else "
                        "0.25; gaussian takes it from --eps)")
    g.add_argument("--noise-draws", type=int, default=None,
                   help="smoothadv: noise draws m per example, in the attack and the loss "
                        "(default: the recipe's, else 2)")
    g.add_argument("--steps", type=int, default=None,
                   help="PGD steps (madry/trades, default 10) or replays (free, default 4)")
    g.add_argument("--step-size", type=float, default=None,
                   help="attack step (default 2.5*eps/steps; fast 1.25*eps; free eps)")
    g.add_argument("--beta", type=float, default=None,
                   help="TRADES / MART KL weight (default: the recipe's, else 6)")
    g.add_argument("--awp-gamma", type=float, default=None,
                   help="awp: relative size of the weight perturbation (default 0.01)")
    g.add_argument("--adv-ratio", type=float, default=1.0,
                   help="madry, fast, awp, gaussian: weight of the adversarial loss vs the "
                        "clean loss (default 1)")
    g.add_argument("--warmup-epochs", type=float, default=None,
                   help="ramp eps linearly from 0 over this many epochs (default: the recipe's, "
                        "else 0; ibp/crown-ibp: half of --epochs)")
    g.add_argument("--warmup-delay-epochs", type=float, default=None,
                   help="epochs at eps 0 before the ramp starts (default: the recipe's, else 0)")
    g.add_argument("--kappa-final", type=float, default=None,
                   help="ibp/crown-ibp: weight of the clean loss at full eps, from 1 at eps 0 "
                        "(default 0.5)")
    g.add_argument("--beta-final", type=float, default=None,
                   help="crown-ibp: weight of the CROWN-IBP bound against IBP at full eps, from 1 "
                        "at eps 0 (default 0)")
    g.add_argument("--no-random-start", action="store_true", help="start attacks at x")
    g.add_argument("--craft-training", action="store_true",
                   help="craft attacks with the model in training mode (default: inference)")
    g.add_argument("--no-guard", action="store_true",
                   help="fast: disable the catastrophic-overfitting guard")


def _optimisation_arguments(g) -> None:
    g.add_argument("--epochs", type=int, default=None,
                   help="epochs (default: the recipe's, else madry/trades/fast 40, free 10, "
                        "clean 20)")
    g.add_argument("--batch-size", type=int, default=None,
                   help="global batch size (default: the recipe's, else 64)")
    g.add_argument("--optimizer", default=None,
                   help="adam or sgd (default: the recipe's, else adam)")
    g.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default: the recipe's, else fast 5e-3, the other "
                        "methods 1e-3)")
    g.add_argument("--schedule", default=None,
                   help="learning-rate schedule: constant, cosine, cyclic (one-cycle: up to "
                        "--lr at 2/5 of the run, then down to 0) or piecewise (x0.1 at 1/2 and "
                        "3/4 of the run) (default: the recipe's, else fast cyclic, the other "
                        "methods cosine)")
    g.add_argument("--momentum", type=float, default=None,
                   help="SGD's momentum, read only when the optimizer is sgd (--optimizer "
                        "sgd, or a recipe that picks it); refused with adam, every method's "
                        "default optimizer (default with sgd: the recipe's, else 0.9)")
    g.add_argument("--weight-decay", type=float, default=None,
                   help="L2 weight decay added to the gradient, as PyTorch's SGD does "
                        "(default: the recipe's, else 0)")
    g.add_argument("--label-smoothing", type=float, default=None,
                   help="label smoothing of the training loss (default 0)")
    g.add_argument("--ema", type=float, default=None, metavar="DECAY",
                   help="save the exponential moving average of the weights (Gowal et al. "
                        "2020: 0.995) as the model; checkpoints keep the raw weights and the "
                        "average (default: the recipe's, else off)")
    g.add_argument("--early-stop", action="store_true", default=None,
                   help="robust early stopping (Rice et al. 2020): hold --val-size training "
                        "examples out, measure PGD accuracy on them each epoch and keep the "
                        "best epoch's weights")
    g.add_argument("--max-grad-norm", type=float, default=10.0,
                   help="clip the global gradient norm (default 10; 0 disables)")
    g.add_argument("--grad-accum", type=int, default=1,
                   help="accumulate gradients over K batches per update (default 1)")
    g.add_argument("--mixed-precision", action="store_true",
                   help="mixed_float16 compute with dynamic loss scaling (attacks still use "
                        "float32 inputs and input gradients)")
    g.add_argument("--recompute", nargs="?", const="blocks", default="activations",
                   choices=("none", "activations", "blocks"),
                   help="what the update's backward pass recomputes instead of keeping: "
                        "activations (default: each batch norm + ReLU before a convolution; "
                        "no more time), blocks (the flag alone: each residual block, and freed "
                        "memory returned to the system at once; less memory, more time), none; "
                        "the same weights in every mode")
    g.add_argument("--convolutions", default="auto", choices=("auto", "direct", "winograd"),
                   help="how the training step's wide 3x3 convolutions compute: auto (default: "
                        "winograd on a host without a GPU), winograd (Winograd F(4x4,3x3) by "
                        "XLA, faster on CPUs, equal to float rounding), direct (TensorFlow's)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-deterministic", action="store_true",
                   help="do not enable TensorFlow op determinism")


def _running_arguments(g) -> None:
    g.add_argument("--out", required=True,
                   help="output directory of the run (required; see the files listed above)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the artefacts of an existing run in --out")
    g.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --out (same configuration)")
    g.add_argument("--override", default=None, metavar="KEY[,KEY]",
                   help="with --resume: let these configuration keys change (e.g. epochs); "
                        "recorded in config.json")
    g.add_argument("--strategy", default="none", type=_strategy_name,
                   help="none (default), mirrored, or multiworker (or multi-worker; reads "
                        "TF_CONFIG; the chief "
                        "writes --out, worker i --out/workers/i)")
    g.add_argument("--logical-cpus", type=int, default=0,
                   help="mirrored on a CPU-only host: split the CPU into N logical devices")
    g.add_argument("--export", default=None, metavar="DIR",
                   help="also write a TF-Serving SavedModel of the classifier to DIR")
    g.add_argument("--val-size", type=int, default=512,
                   help="examples of the per-epoch validation (clean and PGD accuracy): the "
                        "first N test examples, or N held-out training examples with "
                        "--early-stop (default 512; 0: no per-epoch validation)")
    g.add_argument("--val-steps", type=int, default=10,
                   help="PGD steps of the per-epoch robust validation (default 10; 0: clean "
                        "only). PGD-10 overstates robustness: the final report is the measure")
    g.add_argument("--eval-attacks", default=EVAL_ATTACKS,
                   help="attacks of the final report (attacks.evaluate names; pgdKxR = PGD-K "
                        "with R restarts); default pgd50x5,apgd-ce,apgd-t,square")
    g.add_argument("--eval-eps", default=None, help="comma-separated eps list (default --eps)")
    g.add_argument("--eval-limit", type=int, default=None,
                   help="evaluate on the first N test examples only")
    g.add_argument("--no-eval", action="store_true", help="skip the final robustness report")
    g.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                   help="0 silent, 1 progress bar (default), 2 one line per epoch")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def _given(args: argparse.Namespace, table: dict) -> list[str]:
    """The flags of ``table`` given on the command line (a switch: given when on;
    ``--adv-ratio``: when not 1, the value that mixes in no clean loss)."""
    return [flag for flag in table
            if getattr(args, flag[2:].replace("-", "_")) not in (None, False)
            and not (flag == "--adv-ratio" and args.adv_ratio == 1.0)]


def _check_applicable(args: argparse.Namespace) -> None:
    """A flag of :data:`METHOD_FLAGS` or :data:`ARCH_FLAGS` that the chosen method or
    architecture would ignore is refused, naming it; fills ``--width``'s default."""
    from robustgrad.commands._bounds import not_applicable

    refusal = not_applicable(METHOD_FLAGS, _given(args, METHOD_FLAGS), [args.method], "--method")
    if refusal is None and args.init_from is not None and _given(args, ARCH_FLAGS):
        refusal = (f"{_given(args, ARCH_FLAGS)[0]}: --init-from brings its own architecture "
                   f"(the flag configures a new {' or '.join(ARCH_FLAGS['--width'])})")
    if refusal is None and args.init_from is None:
        arch = args.arch or ("ibp-small" if args.method in CERTIFIED else "cnn")
        refusal = not_applicable(ARCH_FLAGS, _given(args, ARCH_FLAGS), [arch], "--arch")
    if refusal:
        raise UsageError(refusal)
    if args.width is None:
        args.width = DEFAULT_WIDTH


def check_values(args: argparse.Namespace) -> None:
    """Each flag's value on its own and the exclusive pairs (:class:`robustgrad.cli.UsageError`
    naming the flag); fills ``--norm``'s default. The checks against ``--out`` follow in the
    command's ``validate``."""
    _check_names(args)
    _check_numbers(args)
    _check_combinations(args)
    _check_paths(args)


def _check_names(args: argparse.Namespace) -> None:
    """``--method``, ``--norm`` (its default filled), ``--optimizer``, ``--schedule``."""
    if args.method not in METHODS:
        raise UsageError(f"--method: unknown method {args.method!r}; choose one of "
                         + ", ".join(METHODS))
    _check_applicable(args)
    if args.norm is None:
        args.norm = "l2" if args.method == "smoothadv" else "linf"
    if args.norm not in ("linf", "l2"):
        raise UsageError(f"--norm: must be linf or l2; got {args.norm!r}")
    if args.method == "smoothadv" and args.norm != "l2":
        raise UsageError("--norm: smoothadv attacks the smoothed classifier in L2; pass --norm l2")
    if args.optimizer is not None and args.optimizer not in OPTIMIZERS:
        raise UsageError(f"--optimizer: unknown optimizer {args.optimizer!r}; choose one of "
                         + ", ".join(OPTIMIZERS))
    if args.schedule is not None and args.schedule not in SCHEDULES:
        raise UsageError(f"--schedule: unknown schedule {args.schedule!r}; choose one of "
                         + ", ".join(SCHEDULES))


def _check_numbers(args: argparse.Namespace) -> None:
    """Every numeric flag in its range (:mod:`robustgrad.checks`)."""
    from robustgrad import checks as _checks
    from robustgrad.commands._bounds import MAX_REPEATS

    _check_counts(args)
    with user_errors(ValueError):
        _checks.number(args.eps, "--eps", minimum=0, min_inclusive=False, allow_none=True)
        _checks.number(args.momentum, "--momentum", minimum=0, maximum=1, max_inclusive=False,
                       allow_none=True)
        _checks.number(args.weight_decay, "--weight-decay", minimum=0,
                       maximum=_checks.MAX_WEIGHT_DECAY, allow_none=True)
        _checks.number(args.beta, "--beta", minimum=0, maximum=_checks.MAX_LOSS_WEIGHT,
                       allow_none=True)
        _checks.number(args.label_smoothing, "--label-smoothing", minimum=0, maximum=1,
                       max_inclusive=False, allow_none=True)
        _checks.number(args.awp_gamma, "--awp-gamma", minimum=0, maximum=_checks.MAX_AWP_GAMMA,
                       allow_none=True)
        _checks.probability(args.adv_ratio, "--adv-ratio")
        for flag in ("--warmup-epochs", "--warmup-delay-epochs"):  # epochs, as --epochs
            _checks.number(getattr(args, flag[2:].replace("-", "_")), flag, minimum=0,
                           maximum=MAX_REPEATS, allow_none=True)
        _checks.number(args.kappa_final, "--kappa-final", minimum=0, maximum=1, allow_none=True)
        _checks.number(args.beta_final, "--beta-final", minimum=0, maximum=1, allow_none=True)
        _checks.number(args.sigma, "--sigma", minimum=0, min_inclusive=False, allow_none=True)
        _checks.number(args.lr, "--lr", minimum=0, min_inclusive=False,
                       maximum=_checks.MAX_LEARNING_RATE, allow_none=True)
        _checks.nonnegative(args.max_grad_norm, "--max-grad-norm")


def _check_counts(args: argparse.Namespace) -> None:
    """Every count flag within its bound (:mod:`robustgrad.commands._bounds`), before any work."""
    from robustgrad.commands import _bounds as b

    steps_bound = MAX_FREE_REPLAYS if args.method == "free" else b.MAX_REPEATS
    with user_errors(ValueError):
        for flag, value, maximum, minimum in (
                ("--epochs", args.epochs, b.MAX_REPEATS, 1),
                ("--batch-size", args.batch_size, b.MAX_BATCH, 1),
                ("--val-size", args.val_size, b.MAX_EXAMPLES, 0),
                ("--val-steps", args.val_steps, b.MAX_REPEATS, 0),
                ("--grad-accum", args.grad_accum, b.MAX_REPEATS, 1),
                ("--steps", args.steps, steps_bound, 1),
                ("--noise-draws", args.noise_draws, MAX_NOISE_DRAWS, 1),
                ("--limit", args.limit, b.MAX_EXAMPLES, 2),
                ("--eval-limit", args.eval_limit, b.MAX_EXAMPLES, 1),
                ("--width", args.width, b.MAX_WIDTH, 1),
                ("--seed", args.seed, b.MAX_SEED, 0),
                ("--logical-cpus", args.logical_cpus, b.MAX_PROCESSES, 0)):
            b.count(value, flag, maximum, minimum)


def _check_combinations(args: argparse.Namespace) -> None:
    """``--recipe``'s form, ``--ema``, the exclusive pairs, ``--strategy``."""
    if args.recipe is not None and args.recipe not in ("auto", "none") and \
            not str(args.recipe).replace("-", "").replace("_", "").isalnum():
        raise UsageError(f"--recipe: expected auto, none or a recipe name; got {args.recipe!r}")
    if args.ema is not None and args.ema != 0 and not 0 < args.ema < 1:
        raise UsageError(f"--ema: the decay must be in (0, 1) (0: off); got {args.ema}")
    if args.ema and args.early_stop:
        raise UsageError("--ema and --early-stop each choose the weights that are saved: pass "
                         "one of them")
    if args.early_stop and args.val_size < 1:
        raise UsageError("--early-stop needs held-out examples: --val-size must be >= 1")
    if args.strategy not in STRATEGIES:
        raise UsageError(f"--strategy: unknown strategy {args.strategy!r}; choose one of "
                         + ", ".join(STRATEGIES))
    if args.strategy == "multiworker" and not os.environ.get("TF_CONFIG"):
        raise UsageError("--strategy multiworker needs the TF_CONFIG environment variable "
                         "(cluster and task of this worker)")
    if args.strategy == "multiworker":  # the chief writes --out, worker i --out/workers/i
        from robustgrad.tf_config import worker_directory

        with user_errors(ValueError):
            args.out = worker_directory(args.out)
    if args.arch is not None and args.init_from is not None:
        raise UsageError("--arch and --init-from are exclusive (--init-from brings its own "
                         "architecture)")
    _check_run_flags(args)


def _check_run_flags(args: argparse.Namespace) -> None:
    """Flags that configure a part of the run the other flags turned off (refused, naming it)."""
    if args.momentum is not None and args.optimizer == "adam":
        raise UsageError("--momentum: SGD's momentum, not with --optimizer adam")
    if args.no_eval:
        given = [flag for flag, on in (("--eval-eps", args.eval_eps is not None),
                                       ("--eval-limit", args.eval_limit is not None),
                                       ("--eval-attacks", args.eval_attacks != EVAL_ATTACKS))
                 if on]
        if given:
            raise UsageError(f"{given[0]}: configures the final report, which --no-eval skips")
    if args.logical_cpus and args.strategy != "mirrored":
        raise UsageError(f"--logical-cpus: splits the CPU for --strategy mirrored, not with "
                         f"--strategy {args.strategy}")


def _check_paths(args: argparse.Namespace) -> None:
    """``--init-from``, ``--data``, ``--arch`` and ``--eval-eps``."""
    if args.init_from is not None:
        from robustgrad.commands._files import check_model_file

        check_model_file(args.init_from, "--init-from")
    if args.data not in DATA_NAMES and not os.path.exists(args.data):
        raise UsageError(f"--data: unknown dataset {args.data!r} and no such file or directory; "
                         f"expected one of {', '.join(DATA_NAMES)} or a path (.npz, a "
                         "directory of dataset files, an image folder)")
    if args.arch is not None and args.arch not in ARCH_NAMES and \
            not re.fullmatch(r"wrn-\d+-\d+", args.arch):
        raise UsageError(f"--arch: unknown architecture {args.arch!r}; choose one of "
                         + ", ".join(ARCH_NAMES) + " or wrn-DEPTH-WIDEN")
    if args.eval_eps is not None:
        try:
            vals = [float(v) for v in args.eval_eps.split(",") if v.strip()]
        except ValueError:
            raise UsageError(f"--eval-eps: expected comma-separated numbers; got "
                             f"{args.eval_eps!r}") from None
        if not vals or any(v <= 0 for v in vals):
            raise UsageError(f"--eval-eps: every eps must be > 0; got {args.eval_eps!r}")
