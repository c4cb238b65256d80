"""``robustgrad train-agent``: train an RL agent on a gymnasium environment.

Example::

    robustgrad train-agent --algo ppo --env CartPole-v1 --steps 100000 --seed 0 --out runs/ppo
    robustgrad train-agent --algo ppo --env CartPole-v1 --steps 100000 --out runs/ppo --resume
    robustgrad train-agent --algo dqn --set learning_rate=1e-3 --set batch_size=128 --out runs/dqn
    robustgrad train-agent --algo dqn --eval-every 5000 --keep-best --out runs/dqn
    robustgrad train-agent --algo ppo --env Pendulum-v1 --preset none --out runs/ppo-defaults
    robustgrad train-agent --algo ppo --env CartPole-v1 --backend graph --seeds 0-7 --out runs/ppo8
    robustgrad train-agent --algo ppo --env CartPole-v1 --robust sa --eps 0.2 --out runs/sappo

``--robust sa`` trains SA-PPO / SA-A2C / SA-DQN (Zhang et al. 2020), ``--robust adv`` on
attacked observations (``agents.robustness.robust``), ``--robust atla`` / ``atla-sa`` alternates PPO / A2C
with a learned adversary (``agents.robustness.atla``); ``--eps`` is the training radius (standard
deviations with ``--normalize-obs``, raw units otherwise), reached after ``--eps-warmup`` of
the budget; REINFORCE has no robust variant.

With no ``--preset`` the tuned preset for (algorithm, env) in ``agents/presets.json`` is used
when there is one (the command says which); ``--preset none`` gives the plain config defaults;
``--set`` and the other flags override either. A preset may also turn on periodic evaluation
with keep-best (``dqn-CartPole-v1`` does); ``--eval-every`` replaces its period.

Writes under ``--out``: the agent itself (``config.json``, ``agent.json``, ``weights/``,
``normalization.npz`` when observations are normalised; ``agents.load(out)`` returns it),
``checkpoint/`` (periodic checkpoints, also written when the environment raises),
``logs/`` (TensorBoard: returns, losses, entropy, KL, clip fraction, gradient norm),
``learning_curve.png`` and ``evaluation.json`` (deterministic evaluation at the end);
with ``--eval-every``, ``best/`` (the best-evaluated agent and ``best.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from robustgrad.errors import ConfigError

HELP = "train an RL agent (ppo, a2c, reinforce, dqn) on a gymnasium environment"
ALGOS = ("ppo", "a2c", "reinforce", "dqn")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``train-agent``: what to train, how the run goes, robust training."""
    _training_arguments(p)
    _running_arguments(p)
    _robust_arguments(p)


def _training_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algo", default="ppo", choices=ALGOS, help="algorithm (default ppo)")
    p.add_argument("--env", default="CartPole-v1", help="gymnasium id (default CartPole-v1)")
    p.add_argument("--steps", type=int, default=100_000,
                   help="total environment steps (default 100000)")
    p.add_argument("--seed", type=int, default=None, help="seed (default 0)")
    p.add_argument("--seeds", default=None, metavar="LIST",
                   help="many seeds in one run, e.g. 0-7 or 0,2,5: one directory per seed "
                        "under --out (written as each finishes) plus summary.json and "
                        "learning_curves.png; on-policy seeds train together with a seed axis; "
                        "--resume skips finished seeds")
    p.add_argument("--backend", default=None, choices=("gymnasium", "graph"),
                   help="gymnasium (default: Python envs) or graph (the envs in TensorFlow "
                        "ops, compiled with the update; CartPole-v1, Acrobot-v1, "
                        "MountainCar-v0, Pendulum-v1, MountainCarContinuous-v0)")
    p.add_argument("--out", default=None, help="output directory (default runs/<algo>)")
    p.add_argument("--num-envs", type=int, default=None,
                   help="parallel environments (default: the algorithm's)")
    p.add_argument("--async-envs", action="store_true",
                   help="step environments in subprocesses (AsyncVectorEnv)")
    p.add_argument("--normalize-obs", action="store_true",
                   help="normalise observations (statistics saved with the agent)")
    p.add_argument("--normalize-reward", action="store_true", help="scale rewards (on-policy)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: algorithm's)")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="tuned preset (default: the one for --algo/--env if any, see "
                        "agents/presets.json); 'none': plain config defaults")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any config field, VALUE parsed as JSON when possible (repeatable)")


def _running_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="checkpoint period in steps (default: a tenth of --steps)")
    p.add_argument("--eval-episodes", type=int, default=20,
                   help="deterministic evaluation episodes at the end (default 20; 0: none)")
    p.add_argument("--eval-every", type=int, default=None, metavar="STEPS",
                   help="evaluate the deterministic policy every STEPS steps (10 episodes; "
                        "logged as eval_return; the best agent is saved to --out/best)")
    p.add_argument("--keep-best", action="store_true",
                   help="end on the best-evaluated weights (needs --eval-every)")
    p.add_argument("--resume", action="store_true",
                   help="continue from --out/checkpoint up to --steps in total")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing agent in --out instead of refusing")
    p.add_argument("--override", default=None, metavar="KEY[,KEY]",
                   help="with --resume: let these settings change (env, seed, lr, num_envs or "
                        "any --set field); recorded in config.json")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--rollout-workers", type=int, default=None, metavar="N",
                   help="collect rollouts on N Ray actors (ppo/a2c/reinforce/dqn; --num-envs split "
                        "evenly; needs pip install 'robustgrad[distributed]')")
    p.add_argument("--ray-address", default=None, metavar="auto|HOST:PORT",
                   help="Ray cluster for --rollout-workers (default: a local Ray instance)")
    p.add_argument("--num-cpus", type=int, default=None,
                   help="CPUs of the local Ray instance (default: --rollout-workers)")


def _robust_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--robust", default=None, choices=("sa", "adv", "atla", "atla-sa", "wocar"),
                   help="robust training: sa (SA-PPO/SA-A2C/SA-DQN regulariser), adv "
                        "(train on attacked observations), atla (ppo, a2c: alternate with a "
                        "learned adversary) or atla-sa (atla plus the SA regulariser)")
    p.add_argument("--eps", type=float, default=None,
                   help="--robust: L-inf training radius (default 0.1, at most 1000)")
    p.add_argument("--robust-kappa", type=float, default=None,
                   help="--robust sa: regulariser weight kappa (default: the preset's, "
                        "3 for ppo on CartPole-v1; else 0.1; at most 1000)")
    p.add_argument("--robust-steps", type=int, default=None,
                   help="--robust: PGD steps of the inner maximisation (default 10)")
    p.add_argument("--robust-method", default=None,
                   help="--robust sa: inner maximiser, pgd (default), sgld (SA-PPO's Langevin "
                        "dynamics; not dqn) or convex (CROWN-IBP bounds over the ball)")
    p.add_argument("--eps-warmup", type=float, default=None,
                   help="--robust: fraction of --steps over which eps and kappa rise from 0 "
                        "(default 0.75; --robust wocar: its wocar_warmup, default 0.3)")
    p.add_argument("--robust-attack", default=None,
                   help="--robust adv: random, action (default), mad or critic")


_ROBUST_FLAGS = (("eps", "robust_eps"), ("robust_kappa", "robust_kappa"),
                 ("robust_steps", "robust_steps"), ("eps_warmup", "robust_eps_warmup"),
                 ("robust_attack", "robust_attack"), ("robust_method", "robust_method"))


# flags of the inner search, which --robust-method convex does not run
SEARCH_ONLY = {"robust_steps": "--robust-steps is for pgd and sgld"}


def _robust_overrides(args: argparse.Namespace) -> dict:
    """Config fields of the ``--robust`` flags, checked (``ConfigError`` naming the flag)."""
    from robustgrad import checks as _checks
    from robustgrad.commands._agent_flags import ROBUST_ONLY

    given = [(flag, field) for flag, field in _ROBUST_FLAGS if getattr(args, flag) is not None]
    if args.robust is None:
        if given:
            flag = given[0][0]
            methods = "|".join(ROBUST_ONLY[flag][0]) if flag in ROBUST_ONLY else \
                "sa|adv|atla|atla-sa|wocar"  # --eps, --eps-warmup: every robust method's
            raise ConfigError(f"--{flag.replace('_', '-')}: a robust-training setting, read "
                              f"only with --robust {methods}")
        return {}
    if args.algo == "reinforce":
        raise ConfigError("--robust: reinforce has no robust variant (use ppo, a2c or dqn)")

    for flag, _field in given:  # a flag the chosen method would ignore
        if flag in ROBUST_ONLY and args.robust not in ROBUST_ONLY[flag][0]:
            raise ConfigError(f"--{flag.replace('_', '-')}: only with --robust "
                              f"{ROBUST_ONLY[flag][1]} ({ROBUST_ONLY[flag][2]}), "
                              f"not with --robust {args.robust}")
        if flag in SEARCH_ONLY and args.robust_method == "convex":
            raise ConfigError(f"--{flag.replace('_', '-')}: --robust-method convex searches "
                              f"nothing (it bounds the whole ball); {SEARCH_ONLY[flag]}")
    out = {"robust": args.robust}
    for flag, field in given:
        name = "--" + flag.replace("_", "-")
        value = getattr(args, flag)
        if flag == "robust_steps":
            from agents.core.limits import MAX_REPEATS

            value = _checks.positive_int(value, name, maximum=MAX_REPEATS)
        elif flag == "eps_warmup":
            value = _checks.probability(value, name)
        elif flag == "robust_attack":
            value = _checks.choice(value, name, ("random", "action", "mad", "critic"))
        elif flag == "robust_method":
            value = _checks.choice(value, name, ("pgd", "sgld", "convex"))  # robust.INNER_METHODS
        else:
            value = _checks.nonnegative(value, name)
        out[field] = value
    if args.robust == "wocar" and "robust_eps_warmup" in out:  # WocaR's warm-up is its own
        out["wocar_warmup"] = out.pop("robust_eps_warmup")
    return out


def one_thread_message(what: str) -> str:
    """Why ``--threads 1`` is refused with a learned adversary (``what``: the flag asking for
    one): its compiled rollout calls the victim from inside TensorFlow (``tf.numpy_function``
    around the env), a nested call that waits forever for the one inter-op thread the rollout
    holds (:func:`agents.adversary.check_inter_op_threads`)."""
    return (f"--threads 1: {what} trains a learned adversary, whose compiled rollout calls the "
            f"victim inside TensorFlow; that needs >= 2 inter-op threads (one would deadlock): "
            f"pass --threads 2, or leave --threads out")


def output_dir(args: argparse.Namespace) -> str:
    """The run directory: ``--out``, default ``runs/<algo>`` (locked for the run by the CLI)."""
    return args.out or os.path.join("runs", args.algo)


def validate(args: argparse.Namespace) -> None:
    """The checks that need no TensorFlow (before it loads): ``--seeds``."""
    from robustgrad.cli import UsageError
    from robustgrad.commands._train_seeds import parse_seeds  # (no TensorFlow)

    args.seed_list = None
    if getattr(args, "threads", None) == 1 and args.robust in ("atla", "atla-sa"):
        raise UsageError(one_thread_message(f"--robust {args.robust}"))
    if args.rollout_workers is None and (args.ray_address or args.num_cpus is not None):
        raise UsageError("--ray-address/--num-cpus: need --rollout-workers N")
    if args.rollout_workers is not None and args.rollout_workers <= 0:
        raise UsageError(f"--rollout-workers must be an int >= 1, got {args.rollout_workers}")
    from robustgrad.commands._agent_flags import check_flags

    check_flags(args)  # bounds and flags the run would ignore
    if args.rollout_workers is not None and args.seeds is not None:
        raise UsageError("--rollout-workers: cannot be combined with --seeds")
    if args.seeds is not None:
        try:
            args.seed_list = parse_seeds(args.seeds)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.seed is not None:
            raise UsageError(f"--seed: cannot be combined with --seeds (--seeds {args.seeds} "
                             "lists the seeds of the run; --seed is the seed of a single run)")
    if args.seed is None:
        args.seed = 0


def _parse_sets(items):
    """``["lr=1e-3", "hidden_sizes=[32, 32]"]`` -> ``{"lr": 0.001, "hidden_sizes": [32, 32]}``;
    a VALUE that is not JSON stays a string (``activation=relu``)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ConfigError(f"--set must be KEY=VALUE with KEY a config field, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def plot_learning_curve(history, path, title):
    """:func:`agents.training.plot_learning_curve` (episode return against steps)."""
    from agents.training.run import plot_learning_curve as plot

    plot(history, path, title)


def _flag_overrides(args: argparse.Namespace) -> dict:
    """The config fields the flags set (``--set`` and the named flags), checked."""
    overrides = _parse_sets(args.set)
    from agents.core.limits import check_total_steps

    check_total_steps(args.steps, "--steps")  # the library's bound
    if args.num_envs is not None:
        overrides["num_envs"] = args.num_envs
    if args.lr is not None:
        overrides["learning_rate"] = args.lr
    for flag in ("async_envs", "normalize_obs", "normalize_reward"):
        if getattr(args, flag):
            overrides[flag] = True
    if args.backend is not None:
        overrides["backend"] = args.backend
    if args.eval_every is not None and args.eval_every <= 0:
        raise ConfigError(f"--eval-every: must be positive, got {args.eval_every}")
    if args.keep_best and args.eval_every is None:
        raise ConfigError("--keep-best: needs --eval-every STEPS")
    overrides.update(_robust_overrides(args))
    return overrides


def _preset(args: argparse.Namespace):
    """``--preset``: ``AUTO`` (default), ``None`` (``none``) or a preset's name (checked; a
    warning when it was tuned for another environment)."""
    from agents.core import presets as config

    preset = config.AUTO if args.preset is None else args.preset
    if isinstance(preset, str) and preset.lower() == "none":
        return None
    if preset not in (None, config.AUTO):
        try:
            config.get_preset(preset, args.algo)
        except ValueError as exc:
            raise ConfigError(f"--{exc}") from None
        tuned_for = preset.split("-", 1)[1]
        if tuned_for != args.env:
            print(f"robustgrad train-agent: warning: --preset {preset} was tuned for "
                  f"{tuned_for}, not {args.env}", file=sys.stderr)
    return preset


def _config(args: argparse.Namespace, overrides: dict, preset):
    """The flags as the agent's config (preset < ``--set`` and the named flags), with the run's
    checkpoint period (``--checkpoint-every``, default a tenth of ``--steps``)."""
    import agents
    from agents.core.presets import make_config

    cls = agents.algorithm(args.algo, "--algo")
    every = args.checkpoint_every if args.checkpoint_every is not None else max(
        args.steps // 10, 1)
    seed = args.seed_list[0] if getattr(args, "seed_list", None) else args.seed
    return make_config(cls.config_cls, args.algo, preset, env=args.env, seed=seed,
                       checkpoint_every=every, **overrides)


def _train(args: argparse.Namespace, config, explicit: set) -> int:
    """:func:`agents.training.train_agent` as the flags say; returns the exit status."""
    from agents.training import train_agent
    from robustgrad.rundir import RunDirectory

    run = RunDirectory(output_dir(args), command="robustgrad train-agent")
    result = train_agent(config, run, steps=args.steps, resume=args.resume,
                         overwrite=args.overwrite, override=args.override, explicit=explicit,
                         eval_episodes=args.eval_episodes, eval_every=args.eval_every,
                         keep_best=args.keep_best, progress=not args.no_progress,
                         rollout_workers=args.rollout_workers, ray_address=args.ray_address,
                         num_cpus=args.num_cpus, lock=False)  # the CLI holds the lock
    return result.status


def run(args: argparse.Namespace) -> int:
    """Parse the flags into an agent config and train it: :func:`agents.training.train_agent`,
    or with ``--seeds`` :func:`agents.training.train_seeds`
    (:func:`robustgrad.commands._train_seeds.run_seeds`). A ``ConfigError`` (the user's mistake,
    the library's checks among them) prints as one line; anything else keeps its traceback."""
    try:
        return _run(args)
    except ConfigError as exc:  # the library's checks name fields: name the flags that set them
        from robustgrad.commands._agent_flags import flag_error

        named = flag_error(exc, args)
        if named is exc:
            raise
        raise named from exc


def _run(args: argparse.Namespace) -> int:
    """:func:`run` before the library's field names become flag names."""
    from robustgrad.cli import user_errors

    overrides = _flag_overrides(args)
    preset = _preset(args)
    seeds = getattr(args, "seed_list", None)
    if seeds is not None:  # --seeds: one directory per seed
        from robustgrad.commands._train_seeds import run_seeds

        with user_errors(ValueError):
            config = _config(args, overrides, preset)
        return run_seeds(args, seeds, config, output_dir(args))
    config = _config(args, overrides, preset)
    return _train(args, config, {*overrides, "env", "seed"})
