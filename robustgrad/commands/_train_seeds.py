"""``robustgrad train-agent --seeds 0-7``: many seeds in one run, one directory per seed.

With ``--backend graph`` and an on-policy algorithm the seeds train together in one compiled
program (``agents.train_many``); otherwise one after the other. Writes ``--out/seed_<s>/``
(each an ordinary saved agent with its ``learning_curve.png`` and ``evaluation.json``),
``--out/summary.json`` (mean, median and IQM over seeds of the final deterministic evaluation
return and of the last training return, each with a 95% percentile bootstrap confidence
interval, as rliable reports) and ``--out/learning_curves.png`` (median, interquartile and
min-max bands over seeds).

>>> parse_seeds("0-3,8")
[0, 1, 2, 3, 8]
>>> parse_seeds("3-1")
Traceback (most recent call last):
...
ValueError: --seeds must be seeds >= 0 like 0-7 or 0,2,5 (ranges ascending, no repeats), got '3-1'
"""

from __future__ import annotations

import json
import os
import re

_SEEDS_FORMAT = "seeds >= 0 like 0-7 or 0,2,5 (ranges ascending, no repeats)"


def parse_seeds(text: str) -> list[int]:
    """``"0-7"`` -> ``[0, ..., 7]``; ``"0,2,5"``; ``"0-3,8"``. ``ValueError`` naming
    ``--seeds`` for anything else (empty parts, descending ranges, repeats, negatives)."""
    error = ValueError(f"--seeds must be {_SEEDS_FORMAT}, got {text!r}")
    seeds: list[int] = []
    for part in str(text).split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise error
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise error
        seeds.extend(range(low, high + 1))
    if not seeds or len(set(seeds)) != len(seeds):
        raise error
    return seeds


def run_seeds(args, seeds: list[int], overrides: dict, preset) -> int:
    """Train ``seeds`` (already parsed) with the flags of ``train-agent``; see module doc."""
    import sys

    import agents
    from agents.config import make_config
    from agents.many import plot_seed_curves, summarize_runs, train_many
    from robustgrad.commands.train_agent import plot_learning_curve

    out = args.out or os.path.join("runs", args.algo)
    cls = agents.algorithm(args.algo, "--algo")
    overrides = {k: v for k, v in overrides.items()
                 if k not in ("checkpoint_dir", "checkpoint_every")}
    dirs = [os.path.join(out, f"seed_{s}") for s in seeds]
    taken = [d for d in dirs if os.path.exists(os.path.join(d, "agent.json"))]
    if taken and not args.overwrite:
        print(f"robustgrad train-agent: --out: {taken[0]} already holds an agent; pass "
              "--overwrite", file=sys.stderr)
        return 2
    try:
        config = make_config(cls.config_cls, args.algo, preset, env=args.env, seed=seeds[0],
                             **overrides)
    except ValueError as exc:
        print(f"robustgrad train-agent: {exc}", file=sys.stderr)
        return 2
    together = config.backend == "graph" and args.algo != "dqn"
    print(f"training {args.algo.upper()} on {args.env}: {len(seeds)} seeds "
          f"({', '.join(map(str, seeds))}), {args.steps} steps each, "
          f"{'in one compiled program' if together else 'one after the other'} "
          f"(backend {config.backend}), output {out}")
    if config.preset is not None:
        print(f"preset {config.preset} (agents/presets.json; --preset none for the defaults)")
    if together:
        trained = train_many(config, seeds=seeds, steps=args.steps,
                             progress_bar=not args.no_progress)
    else:
        trained = []
        for s in seeds:
            agent = cls(make_config(cls.config_cls, args.algo, preset, env=args.env, seed=s,
                                    **overrides))
            agent.learn(args.steps, progress_bar=not args.no_progress)
            trained.append(agent)
    evaluations, last_returns = [], []
    for s, agent, directory in zip(seeds, trained, dirs):
        agent.save(directory)
        plot_learning_curve(agent.history, os.path.join(directory, "learning_curve.png"),
                            f"{agent.algo.upper()} {args.env} (seed {s})")
        last_returns.append(agent.history[-1]["episode_return"] if agent.history
                            else float("nan"))
        if args.eval_episodes > 0:
            result = agent.evaluate(args.eval_episodes)
            with open(os.path.join(directory, "evaluation.json"), "w") as f:
                json.dump(result, f, indent=2)
            evaluations.append(result["mean_return"])
    summary = {"algo": args.algo, "env": args.env, "steps": args.steps, "seeds": seeds,
               "backend": config.backend, "preset": config.preset,
               "design": "one compiled program" if together else "sequential",
               "train_return_last20": summarize_runs(last_returns)}
    if evaluations:
        summary["eval_return"] = summarize_runs(evaluations)
        summary["eval_return"]["per_seed"] = evaluations
        summary["eval_episodes"] = args.eval_episodes
    summary["train_return_last20"]["per_seed"] = last_returns
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    plot_seed_curves([a.history for a in trained], os.path.join(out, "learning_curves.png"),
                     f"{args.algo.upper()} {args.env} ({len(seeds)} seeds)")
    key = "eval_return" if evaluations else "train_return_last20"
    st = summary[key]
    print(f"{key} over {st['n']} seeds: mean {st['mean']:.1f} "
          f"[{st['mean_ci'][0]:.1f}, {st['mean_ci'][1]:.1f}], median {st['median']:.1f}, "
          f"IQM {st['iqm']:.1f} [{st['iqm_ci'][0]:.1f}, {st['iqm_ci'][1]:.1f}] (95% bootstrap)")
    print(f"saved to {out}/seed_<s> (agents.load), summary {os.path.join(out, 'summary.json')}, "
          f"curves {os.path.join(out, 'learning_curves.png')}")
    return 0
