"""``robustgrad evaluate-agent``: a saved RL agent's return, clean and under observation attacks.

Example::

    robustgrad evaluate-agent --agent runs/ppo --episodes 20
    robustgrad evaluate-agent --agent runs/ppo --episodes 20 --stochastic --json
    robustgrad evaluate-agent --agent runs/ppo --attacks random,action,mad,critic,rs \\
        --eps 0.05,0.1,0.2 --episodes 50 --out runs/ppo-attacks
    robustgrad evaluate-agent --agent runs/dqn --attacks action,mad --certify crown --eps 0.01,0.05
    robustgrad evaluate-agent --agent runs/dqn --certify crown --eps 0.01,0.05
    robustgrad evaluate-agent --agent runs/ppo --attacks rs,optimal --eps 0.05 \\
        --adversary-steps 200000 --out runs/ppo-learned

``optimal`` and ``paad`` are learned adversaries (``agents.robustness.adversary``,
``agents.robustness.paad``): one is
trained per eps for ``--adversary-steps`` env steps, and the report gives each one's cost.

Without ``--attacks``: full episodes on a fresh vector environment of the agent's env id, the
mean and standard deviation of the episode return (deterministic actions unless
``--stochastic``). With ``--attacks``: :func:`agents.evaluate_under_attack` (deterministic
actions), the report table on stdout, progress on stderr, and under ``--out`` (default
``runs/evaluate-agent``; new or empty unless ``--overwrite``) ``report.json``, ``report.txt``,
``return_vs_eps.png`` and ``trajectories.png``. Budgets are in the agent's units: standard
deviations of its observation normaliser when it has one, raw units otherwise (``--scale``).
``--certify crown|crown-ibp|ibp`` (discrete policies and DQN, L-inf): the fraction of the clean
run's visited states whose greedy action is certified not to change within each eps
(:mod:`agents.robustness.certify`), beside the attacked figures (in the report) or alone (without
``--attacks``: printed, nothing written).
"""

from __future__ import annotations

import argparse
import json
import os

from robustgrad.cli import UsageError, user_errors

HELP = "evaluate an RL agent, clean and under observation attacks"

DEFAULT_OUT = "runs/evaluate-agent"
# the names of agents.robustness.observation_attacks.ATTACK_NAMES, repeated here so that flags are checked
# before TensorFlow loads (tests/agents_tests/test_agents_obs_attacks.py checks that both agree)
ATTACKS = ("random", "action", "mad", "critic", "rs")
LEARNED = ("optimal", "paad")  # agents.robustness.adversary.LEARNED_ATTACKS (trained per victim and eps)
SCALES = ("auto", "raw", "std")
# agents.robustness.certify.CERTIFY_METHODS, repeated so that flags are checked before TensorFlow loads
CERTIFY = ("crown", "crown-ibp", "ibp")
# flag -> the attacks it configures: given without one of them it would do nothing (refused)
APPLIES = {"--adversary-steps": LEARNED, "--rs-steps": ("rs",)}
DEFAULT_STEPS = {"adversary_steps": 100_000, "rs_steps": 20_000}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent", required=True, help="directory written by train-agent / save()")
    p.add_argument("--episodes", type=int, default=20, help="episodes per row (default 20)")
    p.add_argument("--seed", type=int, default=None,
                   help="evaluation env seed (default: training seed + 10000)")
    p.add_argument("--stochastic", action="store_true",
                   help="sample actions instead of the mode (clean evaluation only)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--attacks", default=None,
                   help=f"comma-separated observation attacks: {', '.join(ATTACKS + LEARNED)} "
                        "(default: none, a clean evaluation)")
    p.add_argument("--eps", default=None,
                   help="with --attacks: comma-separated budgets (default 0.05,0.1,0.2)")
    p.add_argument("--norm", default="linf", help="linf (default) or l2")
    p.add_argument("--scale", default="auto", choices=SCALES,
                   help="units of eps: auto (the agent's normaliser std if it has one, else "
                        "raw), raw, or std (per dimension, the observation std of a clean "
                        "episode)")
    p.add_argument("--certify", default=None, metavar="METHOD",
                   help="also certify the greedy actions of the clean run's states at every eps: "
                        "crown, crown-ibp or ibp (discrete policies and DQN, linf)")
    p.add_argument("--rs-steps", type=int, default=None,
                   help="victim steps to learn Robust Sarsa's Q^pi (default 20000)")
    p.add_argument("--adversary-steps", type=int, default=None,
                   help="training budget (env steps) of each learned adversary, optimal and "
                        "paad, one per eps (default 100000)")
    p.add_argument("--num-envs", type=int, default=None,
                   help="environment copies stepping together (default min(episodes, 8))")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"output directory with --attacks (default {DEFAULT_OUT})")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --out (its report files are replaced)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")


DEFAULT_EPS = "0.05,0.1,0.2"


def output_dir(args: argparse.Namespace) -> str | None:
    """The directory this run writes (locked for the run): ``--out`` with ``--attacks``; a
    clean evaluation writes none."""
    return args.out if args.attacks is not None else None


def _check_not_a_factory(directory: str) -> None:
    """An agent trained on an env factory cannot be rebuilt from the command line: say so and
    what to do, instead of the API's "pass env=" (the CLI has no such option)."""
    try:
        with open(os.path.join(directory, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return  # agents.load names what is wrong with the file
    if isinstance(config, dict) and "env" in config and config["env"] is None:
        raise UsageError(f"--agent {directory}: the agent was trained on an env factory (a "
                         "Python function), which the command line cannot rebuild; evaluate it "
                         "from Python: agents.load(path, env=factory), then agent.evaluate() or "
                         "agents.evaluate_under_attack(agent, ...)")


def _check_numbers_and_agent(args: argparse.Namespace) -> None:
    """The counts (``--episodes``, step budgets, ``--num-envs``, ``--seed``) and the saved agent
    of ``--agent``."""
    from robustgrad import checks as _checks
    from robustgrad.commands._bounds import (
        MAX_ENV_STEPS,
        MAX_ENVS,
        MAX_EPISODES,
        MAX_SEED,
        at_most,
    )

    with user_errors(ValueError):
        _checks.positive_int(args.episodes, "--episodes", maximum=MAX_EPISODES)
        for field in DEFAULT_STEPS:
            flag = "--" + field.replace("_", "-")
            if getattr(args, field) is not None:
                at_most(_checks.positive_int(getattr(args, field), flag), flag, MAX_ENV_STEPS)
        if args.num_envs is not None:
            _checks.positive_int(args.num_envs, "--num-envs", maximum=MAX_ENVS)
        if args.seed is not None:
            _checks.positive_int(args.seed, "--seed", minimum=0, maximum=MAX_SEED)
    if not os.path.isdir(args.agent):
        raise UsageError(f"--agent {args.agent}: no such directory")
    for name in ("config.json", "agent.json"):
        if not os.path.exists(os.path.join(args.agent, name)):
            raise UsageError(f"--agent {args.agent}: does not contain a saved agent (missing "
                             f"{name})")
    _check_not_a_factory(args.agent)


def _check_certify(args: argparse.Namespace) -> None:
    """``--certify`` and the flags it constrains (``eps_values`` filled)."""
    from robustgrad import checks as _checks
    from robustgrad.commands.evaluate import parse_eps

    with user_errors(ValueError):
        _checks.choice(args.certify, "--certify", CERTIFY)
    if args.stochastic:
        raise UsageError("--stochastic: certified actions are the deterministic policy's")
    with user_errors(ValueError):
        norm = _checks.norm_name(args.norm, "--norm")
    if norm != "linf":
        raise UsageError(f"--certify certifies linf balls, not --norm {args.norm}")
    if args.scale != "auto":
        raise UsageError("--scale: --certify bounds the ball in the agent's own units "
                         "(leave --scale auto)")
    args.eps_values = parse_eps(DEFAULT_EPS if args.eps is None else args.eps)


def _check_attacks(args: argparse.Namespace, names: list[str]) -> None:
    """``--attacks`` (``attack_names``, ``eps_values`` and ``--norm`` filled) and ``--out``."""
    from robustgrad import checks as _checks
    from robustgrad.commands._files import check_output_dir
    from robustgrad.commands.evaluate import parse_eps

    if not names:
        raise UsageError(f"--attacks: give at least one attack name, got {args.attacks!r}")
    with user_errors(ValueError):
        for name in names:
            _checks.choice(name, "--attacks", ATTACKS + LEARNED)
        args.norm = _checks.choice(_checks.norm_name(args.norm, "--norm"), "--norm",
                                   ("linf", "l2"))
    if args.stochastic:
        raise UsageError("--stochastic: attacks are evaluated on deterministic actions")
    learned = [name for name in names if name in LEARNED]
    if getattr(args, "threads", None) == 1 and learned:
        from robustgrad.commands.train_agent import one_thread_message

        raise UsageError(one_thread_message(f"--attacks {learned[0]}"))
    args.attack_names = names
    args.eps_values = parse_eps(DEFAULT_EPS if args.eps is None else args.eps)
    check_output_dir(args.out, "--out", overwrite=args.overwrite)


def validate(args: argparse.Namespace) -> None:
    """The checks that need no TensorFlow (before it loads)."""
    from robustgrad.commands._bounds import not_applicable

    _check_numbers_and_agent(args)
    args.attack_names = None
    if args.certify is not None:
        _check_certify(args)
    steps_given = [f for f in APPLIES if getattr(args, f[2:].replace("-", "_")) is not None]
    names = [] if args.attacks is None else \
        list(dict.fromkeys(a.strip() for a in args.attacks.split(",") if a.strip()))
    refusal = not_applicable(APPLIES, steps_given, names, "--attacks")
    if refusal:
        raise UsageError(refusal)
    for field, default in DEFAULT_STEPS.items():
        if getattr(args, field) is None:
            setattr(args, field, default)
    if args.attacks is not None:
        _check_attacks(args, names)
    elif args.certify is None:
        given = [flag for flag, on in (("--eps", args.eps is not None),
                                       ("--norm", args.norm != "linf"),
                                       ("--scale", args.scale != "auto")) if on]
        if given:
            raise UsageError(f"{given[0]}: only with --attacks (a clean evaluation has no "
                             "budget); name the attacks, e.g. --attacks action,mad")


def _clean(agent, args) -> int:
    result = agent.evaluate(args.episodes, deterministic=not args.stochastic, seed=args.seed)
    result["algo"] = agent.algo
    result["env"] = agent.config.env
    result["num_timesteps"] = int(agent.num_timesteps.numpy())
    if args.json:
        print(json.dumps(result))
    else:
        mode = "stochastic" if args.stochastic else "deterministic"
        print(f"{agent.algo.upper()} on {agent.config.env} after {result['num_timesteps']} steps: "
              f"mean return {result['mean_return']:.1f} +/- {result['std_return']:.1f} over "
              f"{args.episodes} episodes ({mode}); min {min(result['returns']):.1f}, "
              f"max {max(result['returns']):.1f}")
    return 0


def _certify_only(agent, args, seed) -> int:
    from agents.robustness.certify import certify_agent, check_certifiable

    with user_errors(ValueError, prefix="--agent: "):
        check_certifiable(agent, args.certify)
    rows = certify_agent(agent, args.eps_values, args.certify, n_episodes=args.episodes,
                         seed=seed, num_envs=args.num_envs)
    if args.json:
        print(json.dumps({"algo": agent.algo, "env": agent.config.env, "certified": rows}))
        return 0
    print(f"{agent.algo.upper()} on {agent.config.env}: certified actions ({args.certify}, linf, "
          f"{'normalised' if agent.policy_surface().normalized else 'raw'} units) over "
          f"{rows[0]['n_states']} states of {args.episodes} clean episodes")
    for r in rows:
        print(f"  eps {r['eps']:<6g} {r['certified_fraction']:.1%} certified")
    return 0


def run(args: argparse.Namespace) -> int:
    import agents
    from agents.robustness.attack_evaluation import check_evaluation
    from robustgrad.commands._files import removed_if_empty_on_error

    if not hasattr(args, "attack_names"):  # called without the command line's validate step
        validate(args)
    with user_errors(ValueError):
        agent = agents.load(args.agent)
    seed = agent.config.seed + 10_000 if args.seed is None else args.seed
    if args.attack_names is None:
        return _clean(agent, args) if args.certify is None else _certify_only(agent, args, seed)
    # the agent-dependent checks (a critic for 'critic', Box observations) run before any episode
    scale = None if args.scale == "auto" else args.scale
    with user_errors(ValueError, prefix="--agent: "):
        check_evaluation(agent, args.attack_names, args.eps_values, args.norm, scale,
                         args.adversary_steps)
        if args.certify is not None:
            from agents.robustness.certify import check_certifiable

            check_certifiable(agent, args.certify, args.norm)
    report = agents.evaluate_under_attack(
        agent, args.attack_names, args.eps_values, n_episodes=args.episodes, seed=seed,
        norm=args.norm, scale=scale, num_envs=args.num_envs, rs_steps=args.rs_steps,
        adversary_steps=args.adversary_steps, progress=not args.no_progress,
        certify=args.certify)
    print(report.to_json() if args.json else report)
    with removed_if_empty_on_error(args.out):
        paths = report.save(args.out)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
