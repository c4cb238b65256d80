"""``robustgrad train-agent --seeds 0-7``: many seeds in one run, one directory per seed.

Every algorithm trains its seeds in groups of up to :data:`GROUP_SIZE` as one agent with a seed
axis (``num_seeds``, :mod:`agents.algorithms.onpolicy`, :mod:`agents.algorithms.dqn`: one program for the
group, on
either backend), robust training too (``--robust sa`` or ``adv``: each seed attacked against its
own policy, :mod:`agents.robustness.robust`; ``--robust atla``/``atla-sa``: each seed against its own
learned adversary, :mod:`agents.robustness.atla`, whose adversaries are not checkpointed: a resumed group
starts fresh ones). Every group goes through the agents' one ``learn`` driver, so:

* each seed is written to ``--out/seed_<s>/`` (an ordinary saved agent, its
  ``learning_curve.png`` and ``evaluation.json``) as soon as its group finishes: nothing is kept
  in memory across groups, and a finished seed is never trained again;
* the running group is checkpointed in ``--out/checkpoint/`` (one saved agent per seed) every
  ``--checkpoint-every`` steps; Ctrl-C or SIGTERM saves it there and prints the ``--resume``
  command, which skips the finished seeds and continues the group from its checkpoint;
* ``--out/summary.json`` (mean, median and IQM over seeds of the final deterministic
  evaluation return and of the last training return, each with a 95% percentile bootstrap
  confidence interval, as rliable reports) and ``--out/learning_curves.png`` (median,
  interquartile and min-max bands) are written at the end from the seed directories.

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
import shutil
import sys

from robustgrad import atomic

_SEEDS_FORMAT = "seeds >= 0 like 0-7 or 0,2,5 (ranges ascending, no repeats)"
MAX_SEEDS = 10_000
"""The most seeds one ``--seeds`` run accepts (larger lists: split them over several runs)."""
GROUP_SIZE = 32
"""The most seeds of an on-policy algorithm that train together as one agent."""


def parse_seeds(text: str) -> list[int]:
    """``"0-7"`` -> ``[0, ..., 7]``; ``"0,2,5"``; ``"0-3,8"``. ``ValueError`` naming
    ``--seeds`` for anything else (empty parts, descending ranges, repeats, negatives, more than
    :data:`MAX_SEEDS` seeds), before the list is built."""
    error = ValueError(f"--seeds must be {_SEEDS_FORMAT}, got {text!r}")
    ranges: list[tuple[int, int]] = []
    for part in str(text).split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise error
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise error
        ranges.append((low, high))
    count = sum(high - low + 1 for low, high in ranges)
    if count > MAX_SEEDS:
        raise ValueError(f"--seeds: at most {MAX_SEEDS} seeds in one run, got {count} "
                         f"({text.strip()}); split the list over several runs")
    seeds = [s for low, high in ranges for s in range(low, high + 1)]
    if not seeds or len(set(seeds)) != len(seeds):
        raise error
    return seeds


def compact(seeds: list[int]) -> str:
    """A seed list as ranges: ``[0, 1, 2, 5]`` -> ``"0-2,5"``.

    >>> compact([0, 1, 2, 5, 7, 8])
    '0-2,5,7-8'
    """
    from agents.core.base import _compact

    return _compact(seeds)


def _groups(seeds: list[int], size: int) -> list[list[int]]:
    return [seeds[i:i + size] for i in range(0, len(seeds), size)]


def _on_axis(config) -> bool:
    """Whether ``config``'s seeds train together on a seed axis (every algorithm with
    ``num_seeds``, every kind of robust training)."""
    return hasattr(config, "num_seeds")


def _agent_seeds(agent) -> list[int]:
    return list(agent.seeds)


def _finished_seeds(args, seeds: list[int], dirs: dict, ckpt: str) -> list[int]:
    """The seeds already written in ``dirs`` (none after ``--overwrite``, which removes them and
    the checkpoint); a run left in ``--out`` needs ``--resume`` or ``--overwrite``."""
    from robustgrad.cli import UsageError

    finished = [s for s in seeds if os.path.exists(os.path.join(dirs[s], "agent.json"))]
    if finished and not (args.overwrite or args.resume):
        raise UsageError(f"--out: {dirs[finished[0]]} already holds an agent; pass --overwrite "
                         "(train anew) or --resume (skip the finished seeds)")
    if os.path.exists(ckpt) and not (args.overwrite or args.resume):
        raise UsageError(f"--out: {ckpt} holds the checkpoint of an interrupted run; pass "
                         "--resume (continue it) or --overwrite (train anew)")
    if args.overwrite:
        for s in seeds:
            shutil.rmtree(dirs[s], ignore_errors=True)
        shutil.rmtree(ckpt, ignore_errors=True)
        finished = []
    return finished


def _resumed_group(args, ckpt: str, every: int, seeds: list[int], finished: list[int]):
    """The interrupted group's agent from ``ckpt`` under ``--resume`` (None when there is none
    or its seeds are all finished)."""
    import agents
    from robustgrad.cli import UsageError

    if not (args.resume and os.path.exists(ckpt)):
        return None
    try:
        resumed = agents.load(ckpt, env=None, checkpoint_dir=ckpt, checkpoint_every=every)
    except (ValueError, OSError) as exc:
        raise UsageError(f"--resume: {ckpt}: {' '.join(str(exc).split())}") from None
    if resumed.algo != args.algo:
        raise UsageError(f"--algo: the checkpoint in {ckpt} is {resumed.algo}, not {args.algo}")
    if not set(_agent_seeds(resumed)) <= set(seeds):
        raise UsageError(f"--resume: {ckpt} holds seeds {compact(_agent_seeds(resumed))}, "
                         f"not all in --seeds {compact(seeds)}")
    if set(_agent_seeds(resumed)) <= set(finished):
        return None  # its seeds were written before the checkpoint was removed
    return resumed


def _train_group(args, agent, group: list[int], dirs: dict, ckpt: str) -> int:
    """Train one group to ``--steps`` and write its seeds; 1 when it went non-finite."""
    import agents

    status = 0
    try:
        done = int(agent.num_timesteps.numpy())
        if args.steps > done:
            print(f"seeds {compact(group)}: {done} -> {args.steps} steps", flush=True)
            agent.learn(args.steps - done, progress_bar=not args.no_progress,
                        schedule_start=done)
        _write_group(args, agent, dirs)
    except agents.NonFiniteTrainingError as exc:  # this group stops, the others train
        print(f"robustgrad train-agent: seeds {compact(group)}: {exc}", file=sys.stderr)
        status = 1
    finally:
        agent.close()
    shutil.rmtree(ckpt, ignore_errors=True)  # the group is in its seed directories
    return status


def _group_agent(cls, config, group: list[int], seed_axis: bool):
    """A new agent for ``group`` (one seed, or a seed axis)."""
    import dataclasses

    from agents.core.config import DQNConfig, OnPolicyConfig

    cfg = dataclasses.replace(config, seed=group[0])
    if seed_axis and isinstance(cfg, (OnPolicyConfig, DQNConfig)):  # (those with num_seeds)
        cfg = dataclasses.replace(cfg, num_seeds=len(group))
    return cls(cfg, seeds=group if len(group) > 1 else None)


def run_seeds(args, seeds: list[int], overrides: dict, preset) -> int:
    """Train ``seeds`` (already parsed) with the flags of ``train-agent``; see module doc."""
    import agents
    from agents.core.config import make_config
    from robustgrad.cli import UsageError

    out = args.out or os.path.join("runs", args.algo)
    ckpt = os.path.join(out, "checkpoint")
    cls = agents.algorithm(args.algo, "--algo")
    overrides = {k: v for k, v in overrides.items()
                 if k not in ("checkpoint_dir", "checkpoint_every")}
    every = args.checkpoint_every if args.checkpoint_every is not None else max(args.steps // 10, 1)
    dirs = {s: os.path.join(out, f"seed_{s}") for s in seeds}
    finished = _finished_seeds(args, seeds, dirs, ckpt)
    try:
        config = make_config(cls.config_cls, args.algo, preset, env=args.env, seed=seeds[0],
                             checkpoint_dir=ckpt, checkpoint_every=every, **overrides)
    except ValueError as exc:
        raise UsageError(" ".join(str(exc).split())) from None
    seed_axis = _on_axis(config)
    size = GROUP_SIZE if seed_axis else 1
    resumed = _resumed_group(args, ckpt, every, seeds, finished)
    pending = [s for s in seeds if s not in finished]
    groups = _groups([s for s in pending if resumed is None or s not in _agent_seeds(resumed)],
                     size)
    if resumed is not None:
        groups.insert(0, _agent_seeds(resumed))
    how = (f"in groups of up to {size} seeds with a seed axis" if size > 1
           else "one seed at a time")
    print(f"training {args.algo.upper()} on {args.env}: {len(seeds)} seeds ({compact(seeds)}), "
          f"{args.steps} steps each, {how} (backend {config.backend}), output {out}"
          + (f"; {len(finished)} already finished ({compact(finished)})" if finished else ""))
    if config.preset is not None:
        print(f"preset {config.preset} (agents/presets.json; --preset none for the defaults)")
    status = 0
    for group in groups:
        if resumed is not None and group == _agent_seeds(resumed):
            agent, resumed = resumed, None
        else:
            agent = _group_agent(cls, config, group, seed_axis)
        status = max(status, _train_group(args, agent, group, dirs, ckpt))
    return max(status, _summarize(args, seeds, dirs, out, config))


def _write_group(args, agent, dirs) -> None:
    """Each seed of ``agent`` as an ordinary agent in its directory, with its curve and
    evaluation."""
    from robustgrad.commands.train_agent import plot_learning_curve

    for k, seed in enumerate(_agent_seeds(agent)):
        one = agent.export(k) if agent.num_seeds > 1 else agent
        try:
            one.config.checkpoint_dir = None  # the run's checkpoint is not the seed's
            one.save(dirs[seed])
            plot_learning_curve(one.history, os.path.join(dirs[seed], "learning_curve.png"),
                                f"{one.algo.upper()} {args.env} (seed {seed})")
            if args.eval_episodes > 0:
                result = one.evaluate(args.eval_episodes)
                atomic.write_json(os.path.join(dirs[seed], "evaluation.json"), result, indent=2)
        finally:
            if one is not agent:
                one.close()


def _summarize(args, seeds, dirs, out, config) -> int:
    """``summary.json`` and ``learning_curves.png`` from the seed directories."""
    from agents.algorithms.many import learning_curves, plot_seed_curves, summarize_runs

    evaluations, last_returns, curves = [], [], []
    written = [s for s in seeds if os.path.exists(os.path.join(dirs[s], "agent.json"))]
    if not written:
        print("robustgrad train-agent: no seed finished; no summary", file=sys.stderr)
        return 1
    if len(written) < len(seeds):
        print(f"robustgrad train-agent: the summary covers the {len(written)} seeds that "
              f"finished ({compact(written)})", file=sys.stderr)
    seeds = written
    for s in seeds:
        with open(os.path.join(dirs[s], "agent.json")) as f:
            history = json.load(f).get("history", [])
        last_returns.append(history[-1]["episode_return"] if history else float("nan"))
        grid, rows = learning_curves([history], points=100)  # a bounded copy per seed
        curves.append([{"steps": float(x), "episode_return": float(y)}
                       for x, y in zip(grid, rows[0]) if y == y])
        path = os.path.join(dirs[s], "evaluation.json")
        if args.eval_episodes > 0 and os.path.exists(path):
            with open(path) as f:
                evaluations.append(json.load(f)["mean_return"])
    summary = {"algo": args.algo, "env": args.env, "steps": args.steps, "seeds": seeds,
               "backend": config.backend, "preset": config.preset,
               "design": ("one program per group of seeds (seed axis)"
                          if _on_axis(config)
                          else "sequential"),
               "train_return_last20": summarize_runs(last_returns)}
    if evaluations:
        summary["eval_return"] = summarize_runs(evaluations)
        summary["eval_return"]["per_seed"] = evaluations
        summary["eval_episodes"] = args.eval_episodes
    summary["train_return_last20"]["per_seed"] = last_returns
    atomic.write_json(os.path.join(out, "summary.json"), summary, indent=2)
    plot_seed_curves(curves, os.path.join(out, "learning_curves.png"),
                     f"{args.algo.upper()} {args.env} ({len(seeds)} seeds)")
    key = "eval_return" if evaluations else "train_return_last20"
    st = summary[key]
    print(f"{key} over {st['n']} seeds: mean {st['mean']:.1f} "
          f"[{st['mean_ci'][0]:.1f}, {st['mean_ci'][1]:.1f}], median {st['median']:.1f}, "
          f"IQM {st['iqm']:.1f} [{st['iqm_ci'][0]:.1f}, {st['iqm_ci'][1]:.1f}] (95% bootstrap)",
          file=sys.stdout)
    print(f"saved to {out}/seed_<s> (agents.load), summary {os.path.join(out, 'summary.json')}, "
          f"curves {os.path.join(out, 'learning_curves.png')}")
    return 0
