"""Many seeds of one agent config in one run, one directory per seed: :func:`train_seeds`.

What ``robustgrad train-agent --seeds 0-7`` does is this function. Every algorithm trains its
seeds in groups of up to :data:`GROUP_SIZE` as one agent with a seed axis (``num_seeds``,
:mod:`agents.algorithms.onpolicy`, :mod:`agents.algorithms.dqn`: one program for the group, on
either backend), robust training too (``robust="sa"`` or ``"adv"``: each seed attacked against
its own policy, :mod:`agents.robustness.robust`; ``"atla"``/``"atla-sa"``: each seed against its
own learned adversary, :mod:`agents.robustness.atla`, whose adversaries are not checkpointed: a
resumed group starts fresh ones). Every group goes through the agents' one ``learn`` driver, so:

* each seed is written to ``run/seed_<s>/`` (an ordinary saved agent, its
  ``learning_curve.png`` and ``evaluation.json``) as soon as its group finishes: nothing is kept
  in memory across groups, and a finished seed is never trained again;
* the running group is checkpointed in ``run/checkpoint/`` (one saved agent per seed) every
  ``config.checkpoint_every`` steps; Ctrl-C or SIGTERM saves it there and raises
  :class:`robustgrad.interrupts.TrainingInterrupted`; ``resume=True`` skips the finished seeds
  and continues the group from its checkpoint;
* ``run/summary.json`` (mean, median and IQM over seeds of the final deterministic evaluation
  return and of the last training return, each with a 95% percentile bootstrap confidence
  interval, as rliable reports) and ``run/learning_curves.png`` (median, interquartile and
  min-max bands) are written at the end from the seed directories.

A resumable sweep in Python::

    from agents import PPOConfig, train_seeds
    from robustgrad.rundir import RunDirectory

    run = RunDirectory("runs/ppo8")
    config = PPOConfig(env="CartPole-v1", backend="graph", checkpoint_every=10_000)
    result = train_seeds(config, run, seeds=range(8), steps=100_000, resume=True)
    print(result.summary["eval_return"]["iqm"])
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from agents.algorithms.dqn_config import DQNConfig
from agents.algorithms.many import learning_curves, plot_seed_curves, summarize_runs
from agents.algorithms.onpolicy import OnPolicyConfig
from agents.algorithms.registry import algorithm_of_config
from agents.core._loading import load
from agents.core.base import Agent, NonFiniteTrainingError, _compact
from agents.core.config import AgentConfig, check_seeds
from agents.training.run import _check_options, _env_name, plot_learning_curve, setup_errors
from robustgrad.errors import ConfigError, ResumeError
from robustgrad.rundir import RunDirectory

__all__ = ["GROUP_SIZE", "SeedsResult", "train_seeds"]

GROUP_SIZE = 32
"""The most seeds that train together as one agent."""


@dataclasses.dataclass
class SeedsResult:
    """What :func:`train_seeds` returns: the exit ``status`` (1 when a group went non-finite
    or no seed finished, else 0), the ``summary`` (the dict of ``summary.json``; ``None`` when no
    seed finished) and the seeds ``finished`` before this call."""
    status: int
    summary: dict | None
    finished: list[int]


def _groups(seeds: list[int], size: int) -> list[list[int]]:
    return [seeds[i:i + size] for i in range(0, len(seeds), size)]


def _on_axis(config: AgentConfig) -> bool:
    """Whether ``config``'s seeds train together on a seed axis (every algorithm with
    ``num_seeds``, every kind of robust training)."""
    return hasattr(config, "num_seeds")


def _agent_seeds(agent: Agent) -> list[int]:
    return list(agent.seeds)


@dataclasses.dataclass
class _Plan:
    config: AgentConfig
    run: RunDirectory
    seeds: list[int]
    steps: int
    eval_episodes: int
    progress: bool

    @property
    def ckpt(self) -> str:
        return self.run.join("checkpoint")

    @property
    def algo(self) -> str:
        return algorithm_of_config(type(self.config)).algo

    def dir(self, seed: int) -> str:
        return self.run.join(f"seed_{seed}")


def _finished_seeds(plan: _Plan, resume: bool, overwrite: bool) -> list[int]:
    """The seeds already written (none after ``overwrite``, which removes them and the
    checkpoint); a run left in the directory needs ``resume`` or ``overwrite``."""
    seeds, ckpt = plan.seeds, plan.ckpt
    finished = [s for s in seeds if os.path.exists(os.path.join(plan.dir(s), "agent.json"))]
    if finished and not (overwrite or resume):
        raise ConfigError(f"--out: {plan.dir(finished[0])} already holds an agent; pass "
                          "--overwrite (train anew) or --resume (skip the finished seeds)")
    if os.path.exists(ckpt) and not (overwrite or resume):
        raise ConfigError(f"--out: {ckpt} holds the checkpoint of an interrupted run; pass "
                          "--resume (continue it) or --overwrite (train anew)")
    if overwrite:
        for s in seeds:
            shutil.rmtree(plan.dir(s), ignore_errors=True)
        shutil.rmtree(ckpt, ignore_errors=True)
        finished = []
    return finished


def _resumed_group(plan: _Plan, resume: bool, finished: list[int]) -> Agent | None:
    """The interrupted group's agent from the checkpoint under ``resume`` (None when there is
    none or its seeds are all finished)."""
    ckpt = plan.ckpt
    if not (resume and os.path.exists(ckpt)):
        return None
    try:
        with setup_errors():
            resumed = load(ckpt, env=None, checkpoint_dir=ckpt,
                           checkpoint_every=plan.config.checkpoint_every)
    except ConfigError:
        raise
    except (ValueError, OSError) as exc:
        raise ResumeError(f"--resume: {ckpt}: {' '.join(str(exc).split())}") from None
    if resumed.algo != plan.algo:
        raise ConfigError(f"--algo: the checkpoint in {ckpt} is {resumed.algo}, not {plan.algo}")
    if not set(_agent_seeds(resumed)) <= set(plan.seeds):
        raise ResumeError(f"--resume: {ckpt} holds seeds {_compact(_agent_seeds(resumed))}, "
                          f"not all in --seeds {_compact(plan.seeds)}")
    if set(_agent_seeds(resumed)) <= set(finished):
        return None  # its seeds were written before the checkpoint was removed
    return resumed


def _write_group(plan: _Plan, agent: Agent) -> None:
    """Each seed of ``agent`` as an ordinary agent in its directory, with its curve and
    evaluation."""
    for k, seed in enumerate(_agent_seeds(agent)):
        one = agent.export(k) if agent.num_seeds > 1 else agent
        try:
            one.config.checkpoint_dir = None  # the run's checkpoint is not the seed's
            one.save(plan.dir(seed))
            plot_learning_curve(one.history, os.path.join(plan.dir(seed), "learning_curve.png"),
                                f"{one.algo.upper()} {_env_name(plan.config.env)} (seed {seed})")
            if plan.eval_episodes > 0:
                result = one.evaluate(plan.eval_episodes)
                plan.run.write_json(os.path.join(f"seed_{seed}", "evaluation.json"), result,
                                    indent=2)
        finally:
            if one is not agent:
                one.close()


def _train_group(plan: _Plan, agent: Agent, group: list[int]) -> int:
    """Train one group to the budget and write its seeds; 1 when it went non-finite."""
    status = 0
    try:
        done = int(agent.num_timesteps.numpy())
        if plan.steps > done:
            print(f"seeds {_compact(group)}: {done} -> {plan.steps} steps", flush=True)
            agent.learn(plan.steps - done, progress_bar=plan.progress, schedule_start=done)
        _write_group(plan, agent)
    except NonFiniteTrainingError as exc:  # this group stops, the others train
        print(f"robustgrad train-agent: seeds {_compact(group)}: {exc}", file=sys.stderr)
        status = 1
    finally:
        agent.close()
    shutil.rmtree(plan.ckpt, ignore_errors=True)  # the group is in its seed directories
    return status


def _group_agent(plan: _Plan, group: list[int], seed_axis: bool) -> Agent:
    """A new agent for ``group`` (one seed, or a seed axis)."""
    cfg = dataclasses.replace(plan.config, seed=group[0])
    if seed_axis and isinstance(cfg, (OnPolicyConfig, DQNConfig)):  # (those with num_seeds)
        cfg = dataclasses.replace(cfg, num_seeds=len(group))
    with setup_errors():
        return algorithm_of_config(type(cfg))(cfg, seeds=group if len(group) > 1 else None)


def _seed_record(plan: _Plan, seed: int) -> tuple[float, list[dict], float | None]:
    """``(last training return, bounded learning curve, evaluation return or None)`` of a
    written seed."""
    with open(os.path.join(plan.dir(seed), "agent.json")) as f:
        history = json.load(f).get("history", [])
    last = history[-1]["episode_return"] if history else float("nan")
    grid, rows = learning_curves([history], points=100)  # a bounded copy per seed
    curve = [{"steps": float(x), "episode_return": float(y)}
             for x, y in zip(grid, rows[0]) if y == y]
    evaluation = None
    path = os.path.join(plan.dir(seed), "evaluation.json")
    if plan.eval_episodes > 0 and os.path.exists(path):
        with open(path) as f:
            evaluation = json.load(f)["mean_return"]
    return last, curve, evaluation


def _print_summary(plan: _Plan, summary: dict) -> None:
    key = "eval_return" if "eval_return" in summary else "train_return_last20"
    st = summary[key]
    print(f"{key} over {st['n']} seeds: mean {st['mean']:.1f} "
          f"[{st['mean_ci'][0]:.1f}, {st['mean_ci'][1]:.1f}], median {st['median']:.1f}, "
          f"IQM {st['iqm']:.1f} [{st['iqm_ci'][0]:.1f}, {st['iqm_ci'][1]:.1f}] (95% bootstrap)",
          file=sys.stdout)
    out = plan.run.path
    print(f"saved to {out}/seed_<s> (agents.load), summary {os.path.join(out, 'summary.json')}, "
          f"curves {os.path.join(out, 'learning_curves.png')}")


def _summarize(plan: _Plan) -> dict | None:
    """``summary.json`` and ``learning_curves.png`` from the seed directories (None when no
    seed finished)."""
    seeds = [s for s in plan.seeds if os.path.exists(os.path.join(plan.dir(s), "agent.json"))]
    if not seeds:
        print("robustgrad train-agent: no seed finished; no summary", file=sys.stderr)
        return None
    if len(seeds) < len(plan.seeds):
        print(f"robustgrad train-agent: the summary covers the {len(seeds)} seeds that "
              f"finished ({_compact(seeds)})", file=sys.stderr)
    records = [_seed_record(plan, s) for s in seeds]
    last_returns = [r[0] for r in records]
    evaluations = [r[2] for r in records if r[2] is not None]
    config = plan.config
    summary: dict[str, Any] = {"algo": plan.algo, "env": _env_name(config.env), "steps": plan.steps,
               "seeds": seeds, "backend": config.backend, "preset": config.preset,
               "design": ("one program per group of seeds (seed axis)" if _on_axis(config)
                          else "sequential"),
               "train_return_last20": summarize_runs(last_returns)}
    if evaluations:
        summary["eval_return"] = summarize_runs(evaluations)
        summary["eval_return"]["per_seed"] = evaluations
        summary["eval_episodes"] = plan.eval_episodes
    summary["train_return_last20"]["per_seed"] = last_returns
    plan.run.write_json("summary.json", summary, indent=2)
    plot_seed_curves([r[1] for r in records], plan.run.join("learning_curves.png"),
                     f"{plan.algo.upper()} {_env_name(config.env)} ({len(seeds)} seeds)")
    _print_summary(plan, summary)
    return summary


def _announce(plan: _Plan, size: int, finished: list[int]) -> None:
    how = (f"in groups of up to {size} seeds with a seed axis" if size > 1
           else "one seed at a time")
    seeds, config = plan.seeds, plan.config
    print(f"training {plan.algo.upper()} on {_env_name(config.env)}: {len(seeds)} seeds "
          f"({_compact(seeds)}), {plan.steps} steps each, {how} (backend {config.backend}), "
          f"output {plan.run.path}"
          + (f"; {len(finished)} already finished ({_compact(finished)})" if finished else ""))
    if config.preset is not None:
        print(f"preset {config.preset} (agents/presets.json; --preset none for the defaults)")


def train_seeds(config: AgentConfig, run: RunDirectory | str, *, seeds: Sequence[int],
                steps: int, resume: bool = False, overwrite: bool = False,
                eval_episodes: int = 20, progress: bool = True,
                lock: bool = True) -> SeedsResult:
    """Train ``config`` once per seed of ``seeds`` in ``run`` (see the module docstring).

    Args:
      config: the agents' configuration (its ``seed`` is replaced by each seed;
        ``checkpoint_every``: the running group's checkpoint period, 0 when ``learn`` ends or
        is interrupted).
      run: the run's directory (a path is wrapped in a :class:`~robustgrad.rundir.RunDirectory`).
      seeds: distinct ints >= 0.
      steps: environment steps per seed.
      resume: skip the finished seeds and continue the interrupted group from its checkpoint.
      overwrite: remove the seeds' directories and the checkpoint first; without it or
        ``resume`` a directory holding either is refused (:class:`robustgrad.errors.ConfigError`).
      eval_episodes: deterministic evaluation episodes of each seed at the end (0: none).
      progress: show a progress bar; ``lock``: hold the directory's lock for the run (the
        command line already holds it).

    >>> import os, tempfile
    >>> from agents.config import A2CConfig
    >>> run = os.path.join(tempfile.mkdtemp(), "a2c2")
    >>> config = A2CConfig(env="CartPole-v1", num_envs=1, n_steps=16)
    >>> result = train_seeds(config, run, seeds=[0, 1], steps=32, eval_episodes=0,
    ...                      progress=False)  # doctest: +ELLIPSIS
    training A2C on CartPole-v1: 2 seeds (0-1), 32 steps each, in groups of up to 32 ...
    seeds 0-1: 0 -> 32 steps
    train_return_last20 over 2 seeds: ...
    saved to .../a2c2/seed_<s> (agents.load), ...
    >>> result.status, sorted(n for n in os.listdir(run) if n.startswith("seed_"))
    (0, ['seed_0', 'seed_1'])
    """
    if not isinstance(config, AgentConfig):
        raise TypeError(f"config: expected an AgentConfig, got {type(config).__name__}")
    run = run if isinstance(run, RunDirectory) else RunDirectory(run)
    steps = _check_options(steps, None, False)
    plan = _Plan(dataclasses.replace(config, checkpoint_dir=run.join("checkpoint")), run,
                 check_seeds(list(seeds)), steps, eval_episodes, progress)
    with contextlib.ExitStack() as stack:
        if lock:
            stack.enter_context(run)
        return _train_all(plan, resume, overwrite)


def _train_all(plan: _Plan, resume: bool, overwrite: bool) -> SeedsResult:
    finished = _finished_seeds(plan, resume, overwrite)
    seed_axis = _on_axis(plan.config)
    size = GROUP_SIZE if seed_axis else 1
    resumed = _resumed_group(plan, resume, finished)
    pending = [s for s in plan.seeds if s not in finished]
    groups = _groups([s for s in pending if resumed is None or s not in _agent_seeds(resumed)],
                     size)
    if resumed is not None:
        groups.insert(0, _agent_seeds(resumed))
    _announce(plan, size, finished)
    status = 0
    for group in groups:
        if resumed is not None and group == _agent_seeds(resumed):
            agent, resumed = resumed, None
        else:
            agent = _group_agent(plan, group, seed_axis)
        status = max(status, _train_group(plan, agent, group))
    summary = _summarize(plan)
    return SeedsResult(max(status, 1 if summary is None else 0), summary, finished)
