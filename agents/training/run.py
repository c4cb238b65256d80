"""One agent training run, resumable, as a library call: :func:`train_agent`.

What ``robustgrad train-agent`` does (one seed) is this function: it takes an
:class:`~agents.core.config.AgentConfig` and a :class:`robustgrad.rundir.RunDirectory` and owns
the run from start to end -- the directory's lock, the one resume rule
(:meth:`~robustgrad.rundir.RunDirectory.resume_changes` against the checkpoint's configuration),
periodic checkpoints, Ctrl-C / SIGTERM (a checkpoint, then
:class:`robustgrad.interrupts.TrainingInterrupted`), evaluation with keep-best, the saved agent,
its learning curve and final evaluation, and the run's records (written atomically).

Files written in the run directory (:data:`ARTIFACTS`): the agent itself (``config.json``,
``agent.json``, ``weights/``, ``normalization.npz`` when observations are normalised;
``agents.load(path)`` returns it), ``checkpoint/`` (an agent saved every
``config.checkpoint_every`` steps and when the run is interrupted), ``logs/`` (TensorBoard),
``history.json`` (every update from the start, ``train_seconds`` summed over every part,
``resumed_at``), ``learning_curve.png``, ``evaluation.json`` and, with ``eval_every``, ``best/``.
``config.json`` also records the run: ``overrides`` (one ``{key: [saved, new]}`` entry per
resume that changed a setting) and ``resolved`` (every field's value and ``origin``: ``"user"``,
``"preset"``, ``"default"``, ``"run"`` or ``"override"``); loading ignores both.

A whole resumable run in Python (run it again after an interruption and it continues)::

    from agents import PPOConfig, train_agent
    from robustgrad.rundir import RunDirectory

    run = RunDirectory("runs/ppo")
    config = PPOConfig(env="CartPole-v1", seed=0, checkpoint_every=10_000)
    result = train_agent(config, run, steps=100_000, resume=run.holds(["checkpoint"]) != [])
    print(result.evaluation["mean_return"])
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from agents.algorithms.registry import algorithm_of_config
from agents.core._loading import load
from agents.core.base import Agent, NonFiniteTrainingError
from agents.core.callbacks import Callback, EvalCallback, TensorBoardCallback
from agents.core.config import AgentConfig
from agents.core.limits import check_total_steps
from agents.core.persistence import read_metadata, recover_checkpoint
from agents.core.presets import get_preset, make_config
from robustgrad.errors import ConfigError
from robustgrad.rundir import RunDirectory

__all__ = ["ARTIFACTS", "CHECKPOINT", "RESUME_FREE", "TrainedAgent", "check_checkpoint_resume",
           "plot_learning_curve", "provenance", "read_history_record", "setup_errors",
           "train_agent", "write_run_record"]

CHECKPOINT = "checkpoint"
"""The agent checkpoint's directory in the run directory."""

ARTIFACTS = ("config.json", "agent.json", "weights", "normalization.npz", CHECKPOINT, "logs",
             "learning_curve.png", "evaluation.json", "best", "history.json")
"""What a run writes in its directory (``overwrite`` removes these, and only these)."""

RESUME_FREE = frozenset({"checkpoint_dir", "checkpoint_every", "overrides", "resolved"})
"""Keys a resumed run may change without ``override``: where and how often it checkpoints, and
the run's own records."""

FLAG_NAMES = {"learning_rate": "lr"}
"""The names the command line gives config fields (in resume messages and ``override``)."""


@dataclasses.dataclass
class TrainedAgent:
    """What :func:`train_agent` returns: the trained ``agent``, the exit ``status`` (1 when
    training stopped on non-finite updates, else 0), whether it ``resumed`` a checkpoint, the
    final ``evaluation`` (the dict of ``evaluation.json``; ``None`` when not evaluated) and
    ``train_seconds`` (summed over every part of a resumed run)."""
    agent: Agent
    status: int
    resumed: bool
    evaluation: dict | None
    train_seconds: float


def plot_learning_curve(history: Sequence[dict], path: str, title: str) -> None:
    """Episode return (mean of the last 20 episodes) against environment steps, saved to
    ``path`` atomically (:func:`robustgrad.atomic.save_figure`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from robustgrad.atomic import save_figure

    pts = [(h["steps"], h["episode_return"]) for h in history
           if h.get("episode_return") == h.get("episode_return")]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if pts:
        ax.plot(*zip(*pts))
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episode return (last 20)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


# ---- the run's records ---------------------------------------------------------------------
def provenance(config: AgentConfig, explicit: Collection[str] | None = None,
               saved: dict | None = None, changed: Collection[str] = ()) -> dict:
    """Where each field of ``config`` came from: ``{"values": {...}, "origin": {field: ...}}``
    with origin ``"user"`` (set by the caller: the fields named in ``explicit``, or, when it is
    None, those differing from the preset and the defaults), ``"preset"``, ``"default"``,
    ``"run"`` (the run's checkpoint settings) or ``"override"`` (changed on resume); a resumed
    run keeps the ``saved`` record's origins of the fields that did not change.

    >>> from agents.config import PPOConfig
    >>> origin = provenance(PPOConfig(env="CartPole-v1", preset="ppo-CartPole-v1", n_steps=32,
    ...                               gamma=0.9), explicit={"env", "gamma"})["origin"]
    >>> origin["gamma"], origin["n_steps"], origin["activation"]
    ('user', 'preset', 'default')
    """
    algo = algorithm_of_config(type(config)).algo
    values = config.to_dict()
    preset = get_preset(config.preset)["config"] if config.preset else {}
    default = make_config(type(config), algo, None, env=config.env).to_dict()
    old = (saved or {}).get("origin") if isinstance(saved, dict) else None
    origin = {}
    for key, value in values.items():
        if key in changed:
            origin[key] = "override"
        elif isinstance(old, dict) and key in old:
            origin[key] = old[key]
        elif key in RESUME_FREE:
            origin[key] = "run"
        elif explicit is not None:
            origin[key] = ("user" if key in explicit else "preset" if key in preset
                           else "default")
        else:
            origin[key] = ("preset" if key in preset and _same(value, preset[key])
                           else "default" if _same(value, default.get(key)) else "user")
    return {"values": values, "origin": origin}


def _same(a: Any, b: Any) -> bool:
    def norm(v):
        return [norm(x) for x in v] if isinstance(v, (list, tuple)) else v

    return norm(a) == norm(b)


def write_run_record(run: RunDirectory, where: str, *, overrides: list, resolved: dict | None,
                     history: list, train_seconds: float, resumed_at: list) -> None:
    """The run's records in the agent directory ``run/where`` (``""``: the run's own agent,
    ``"checkpoint"``): ``overrides`` and ``resolved`` added to its ``config.json`` (when there
    is one; loading ignores both keys) and ``history.json`` (every update from the start, the
    summed ``train_seconds``, the steps each resume started from). Atomic writes."""
    name = os.path.join(where, "config.json") if where else "config.json"
    config = run.read_json(name)
    if isinstance(config, dict) and (overrides or resolved is not None):
        if overrides:
            config["overrides"] = overrides
        if resolved is not None:
            config["resolved"] = resolved
        run.write_json(name, config, indent=2)
    run.write_json(os.path.join(where, "history.json") if where else "history.json",
                   {"history": history, "train_seconds": train_seconds,
                    "resumed_at": resumed_at})


def read_history_record(run: RunDirectory) -> tuple[float, list]:
    """``(train_seconds, resumed_at)`` of the run's ``history.json`` (``(0.0, [])`` if none)."""
    record = run.read_json("history.json", {})
    try:
        return float(record.get("train_seconds") or 0.0), list(record.get("resumed_at") or [])
    except (TypeError, ValueError, AttributeError):
        return 0.0, []


# ---- building or resuming the agent --------------------------------------------------------
@dataclasses.dataclass
class _Start:
    agent: Agent
    resumed: bool
    overrides: list  # the record of every resume's changes
    resolved: dict | None


def _requested(config: AgentConfig, explicit: Collection[str] | None) -> dict:
    """The fields a resumed run compares with its checkpoint: ``explicit`` ones (with ``env``
    and ``seed``), or every field."""
    values = config.to_dict()
    if callable(config.env):
        values.pop("env")
    keys = set(values) if explicit is None else {*explicit, "env", "seed"}
    return {k: values[k] for k in sorted(keys) if k in values and k not in RESUME_FREE}


def check_checkpoint_resume(run: RunDirectory, requested: dict, *, override: str | None,
                            steps: int) -> tuple[dict, int, dict[str, list]]:
    """The one resume rule on the run's agent checkpoint: ``requested`` (config fields) against
    the checkpoint's ``config.json`` (:meth:`~robustgrad.rundir.RunDirectory.resume_changes`,
    :class:`robustgrad.errors.ResumeError` naming every refused key); ``steps`` (the budget) must
    not be below the steps the checkpoint holds. Returns ``(saved config, steps done, allowed
    changes)``. Checkpoints of every earlier version go through it."""
    ckpt = run.join(CHECKPOINT)
    meta, saved = read_metadata(ckpt)
    done = int(meta["num_timesteps"])
    if steps < done:
        raise ConfigError(f"--steps {steps} is below the {done} steps the checkpoint in "
                          f"{ckpt} already holds (--steps is the total budget)")
    requested = dict(requested)
    if saved.get("env") is None:  # trained on a factory: the id asked for is not it
        requested.pop("env", None)
    changed = run.resume_changes(requested, saved=saved, override=override, free=RESUME_FREE,
                                 known=set(saved) | set(requested), names=FLAG_NAMES,
                                 where=ckpt)
    if changed and steps <= done:
        raise ConfigError(f"--override: the checkpoint in {ckpt} already holds the {steps} "
                          "steps of --steps; nothing is left to train with the new settings "
                          "(raise --steps)")
    return saved, done, changed


def _resume(config: AgentConfig, run: RunDirectory, ckpt: str, *, steps: int,
            override: str | None, explicit: Collection[str] | None, distributed: dict) -> _Start:
    """The checkpoint's agent with the changes ``override`` lets through (the one resume rule)."""
    requested = _requested(config, explicit)
    saved, _, changed = check_checkpoint_resume(run, requested, override=override, steps=steps)
    if saved.get("env") is None:
        requested.pop("env", None)
    fields = {k: v for k, v in requested.items() if k not in ("env", "seed")}
    fields.update({k: new for k, (_, new) in changed.items()})
    if saved.get("env") is None and callable(config.env):
        fields["env"] = config.env

    agent = load(ckpt, **distributed, **fields, checkpoint_dir=ckpt,
                 checkpoint_every=config.checkpoint_every)
    algo = algorithm_of_config(type(config)).algo
    if agent.algo != algo:
        raise ConfigError(f"--algo: the checkpoint in {ckpt} is {agent.algo}, not {algo}")
    record = saved.get("overrides", [])
    record = [*(record if isinstance(record, list) else []), *([changed] if changed else [])]
    resolved = provenance(agent.config, explicit, saved.get("resolved"), changed)
    return _Start(agent, True, record, resolved)


def _start_new(config: AgentConfig, run: RunDirectory, ckpt: str, *, resume: bool,
               overwrite: bool, override: str | None, explicit: Collection[str] | None,
               distributed: dict) -> _Start:
    """A new agent in the run (refusing to replace one without ``overwrite``)."""
    out = run.path
    if override is not None:
        raise ConfigError(f"--override: only with --resume of a checkpoint (none in {ckpt})"
                          if resume else "--override: only with --resume")
    if os.path.exists(run.join("agent.json")) and not overwrite:
        if resume:
            raise ConfigError(f"--resume: {out} holds a finished agent but no checkpoint "
                              f"to resume from ({ckpt} is missing); agents.load({out!r}) "
                              "loads it, --overwrite trains anew")
        raise ConfigError(f"--out: {out} already holds an agent; pass --overwrite or --resume")
    if overwrite:
        run.remove(ARTIFACTS)
    cls = algorithm_of_config(type(config))
    agent = cls(dataclasses.replace(config, checkpoint_dir=ckpt), **distributed)
    return _Start(agent, False, [], provenance(agent.config, explicit))


@contextlib.contextmanager
def setup_errors() -> Iterator[None]:
    """Building an agent: an environment that needs a missing optional dependency, or a Ray
    cluster missing or unreachable, is the user's to fix: re-raised as
    :class:`robustgrad.errors.ConfigError` (one line, the cause kept as ``__cause__``)."""
    try:
        yield
    except (ImportError, ConnectionError, TimeoutError) as exc:
        raise ConfigError(" ".join(str(exc).split())) from exc


def _start(config: AgentConfig, run: RunDirectory, *, steps: int, resume: bool, overwrite: bool,
           override: str | None, explicit: Collection[str] | None, distributed: dict) -> _Start:
    with setup_errors():
        return _start_agent(config, run, steps=steps, resume=resume, overwrite=overwrite,
                            override=override, explicit=explicit, distributed=distributed)


def _start_agent(config: AgentConfig, run: RunDirectory, *, steps: int, resume: bool,
                 overwrite: bool, override: str | None, explicit: Collection[str] | None,
                 distributed: dict) -> _Start:
    ckpt = run.join(CHECKPOINT)
    if resume:  # a crash inside a save: the new checkpoint or the old one, said
        recovered = recover_checkpoint(ckpt)
        if recovered:
            print(f"--resume: {ckpt}: {recovered}")
    if resume and os.path.exists(os.path.join(ckpt, "agent.json")):
        return _resume(config, run, ckpt, steps=steps, override=override, explicit=explicit,
                       distributed=distributed)
    return _start_new(config, run, ckpt, resume=resume, overwrite=overwrite, override=override,
                      explicit=explicit, distributed=distributed)


# ---- training and reporting ----------------------------------------------------------------
def _evaluation_plan(agent: Agent, eval_every: int | None, keep_best: bool) -> tuple:
    """``(eval_every, keep_best)``: the caller's, else the preset's ``learn`` options."""
    learn_options = {}
    if agent.config.preset is not None:
        learn_options = get_preset(agent.config.preset).get("learn", {})
    every = eval_every or learn_options.get("eval_every")
    keep = keep_best or (eval_every is None and bool(learn_options.get("keep_best")))
    return every, keep


def _env_name(env: Any) -> str:
    return env if isinstance(env, str) else getattr(env, "__name__", "an env factory")


def _announce(start: _Start, run: RunDirectory, steps: int, done: int, plan: tuple,
              keep_best: bool) -> None:
    agent = start.agent
    print(f"{'resuming' if start.resumed else 'training'} {agent.algo.upper()} on "
          f"{_env_name(agent.config.env)}: {done} -> {steps} steps, {agent.config.num_envs} "
          f"envs, seed {agent.config.seed}, output {run.path}")
    if agent.config.preset is not None:
        extra = (f"; evaluation every {plan[0]} steps, keeping the best weights"
                 if plan[1] and not keep_best else "")
        print(f"preset {agent.config.preset} (agents/presets.json; every value in "
              f"{run.join('config.json')}; --preset none for the plain defaults){extra}")


def _learn(start: _Start, run: RunDirectory, steps: int, done: int, plan: tuple,
           progress: bool) -> int:
    """Train the remaining steps with evaluation and TensorBoard logs; returns the exit status
    (1 when training went non-finite)."""
    eval_every, keep_best = plan
    callbacks: list[Callback] = []
    evaluator = None
    if eval_every is not None:
        best_dir = run.join("best")
        evaluator = EvalCallback(eval_every, keep_best=keep_best, best_dir=best_dir,
                                 verbose=progress)
        if start.resumed and os.path.exists(os.path.join(best_dir, "best.json")):
            evaluator.load_best(best_dir)
        callbacks.append(evaluator)
    callbacks.append(TensorBoardCallback(run.join("logs")))
    try:
        start.agent.learn(steps - done, callbacks=callbacks, progress_bar=progress,
                          schedule_start=done)
    except NonFiniteTrainingError as exc:
        print(f"robustgrad train-agent: {exc}", file=sys.stderr)
        return 1
    if keep_best and evaluator is not None and evaluator.restored:
        print(f"kept the best-evaluated weights: step {evaluator.best_steps}, "
              f"return {evaluator.best_return:.1f} over {evaluator.n_episodes} episodes")
    return 0


def _report(agent: Agent, run: RunDirectory, status: int, eval_episodes: int) -> dict | None:
    """The learning curve and, after a clean run, the agent's evaluation."""
    curve = run.join("learning_curve.png")
    plot_learning_curve(agent.history, curve, f"{agent.algo.upper()} "
                        f"{_env_name(agent.config.env)} (seed {agent.config.seed})")
    result = None
    if eval_episodes > 0 and status == 0:
        result = agent.evaluate(eval_episodes)
        run.write_json("evaluation.json", result, indent=2)
        print(f"evaluation ({eval_episodes} episodes, deterministic): mean return "
              f"{result['mean_return']:.1f} +/- {result['std_return']:.1f}")
    print(f"saved to {run.path} (agents.load({run.path!r})); TensorBoard logs in "
          f"{run.join('logs')}; curve in {curve}")
    return result


def _check_options(steps: int, eval_every: int | None, keep_best: bool) -> int:
    steps = check_total_steps(steps, "steps")
    if eval_every is not None and (isinstance(eval_every, bool) or not isinstance(eval_every, int)
                                   or eval_every <= 0):
        raise ConfigError(f"eval_every: must be a positive int, got {eval_every!r}")
    if keep_best and eval_every is None:
        raise ConfigError("keep_best: needs eval_every")
    return steps


def _train(start: _Start, run: RunDirectory, steps: int, plan: tuple, progress: bool) -> tuple:
    """Train ``start.agent`` to ``steps`` in total, keeping the records for a resume when it is
    interrupted; returns ``(status, train_seconds, resumed_at)``."""
    from robustgrad.interrupts import TrainingInterrupted

    agent = start.agent
    done = int(agent.num_timesteps.numpy())
    prior_seconds, resumed_at = read_history_record(run) if start.resumed else (0.0, [])
    resumed_at = resumed_at + ([done] if start.resumed else [])
    started = time.perf_counter()
    status = 0
    if steps - done > 0:
        try:
            status = _learn(start, run, steps, done, plan, progress)
        except TrainingInterrupted:  # the checkpoint keeps the record for the resume
            seconds = prior_seconds + time.perf_counter() - started
            write_run_record(run, CHECKPOINT, overrides=start.overrides,
                             resolved=start.resolved, history=agent.history,
                             train_seconds=seconds, resumed_at=resumed_at)
            write_run_record(run, "", overrides=[], resolved=None, history=agent.history,
                             train_seconds=seconds, resumed_at=resumed_at)
            raise
    return status, prior_seconds + time.perf_counter() - started, resumed_at


def train_agent(config: AgentConfig, run: RunDirectory | str, *, steps: int,
                resume: bool = False, overwrite: bool = False, override: str | None = None,
                explicit: Collection[str] | None = None, eval_episodes: int = 20,
                eval_every: int | None = None, keep_best: bool = False, progress: bool = True,
                rollout_workers: int | None = None, ray_address: str | None = None,
                num_cpus: int | None = None, lock: bool = True) -> TrainedAgent:
    """Train the agent of ``config`` in ``run`` up to ``steps`` environment steps in total.

    Args:
      config: the agent's configuration (its class names the algorithm); ``checkpoint_dir`` is
        the run's ``checkpoint/``, checkpoints are written every ``config.checkpoint_every``
        steps (0: when ``learn`` ends or is interrupted).
      run: the run's directory (a path is wrapped in a :class:`~robustgrad.rundir.RunDirectory`).
      steps: the total budget (a resumed run trains what is left of it).
      resume: continue from the run's checkpoint (a new run when there is none); a setting that
        differs from the checkpoint's is refused (:class:`robustgrad.errors.ResumeError`, every
        differing key named) unless ``override`` (``"KEY[,KEY]"``) names it; the changes are
        recorded in ``config.json`` (``overrides``).
      overwrite: replace the files of an earlier run (:data:`ARTIFACTS`); without it a
        directory holding an agent is refused.
      explicit: the fields the caller set (the command line's flags); a resume compares only
        those (with ``env`` and ``seed``) and the provenance record calls them ``"user"``.
        ``None``: every field.
      eval_episodes: deterministic evaluation episodes at the end (0: none).
      eval_every, keep_best: evaluate every so many steps (10 episodes; the best agent saved in
        ``best/``) and end on the best weights; default: the preset's ``learn`` options.
      progress: show a progress bar.
      rollout_workers, ray_address, num_cpus: collect rollouts on Ray actors (see
        :class:`agents.Agent`).
      lock: hold the directory's lock for the run (the command line already holds it).

    Returns a :class:`TrainedAgent`. Ctrl-C or SIGTERM checkpoints the agent and raises
    :class:`robustgrad.interrupts.TrainingInterrupted` (resume with ``resume=True``).

    >>> import os, tempfile
    >>> from agents.config import A2CConfig
    >>> run = RunDirectory(os.path.join(tempfile.mkdtemp(), "a2c"))
    >>> config = A2CConfig(env="CartPole-v1", num_envs=1, n_steps=16)
    >>> first = train_agent(config, run, steps=32, eval_episodes=0, progress=False)
    ... # doctest: +ELLIPSIS
    training A2C on CartPole-v1: 0 -> 32 steps, 1 envs, seed 0, output .../a2c
    saved to ...
    >>> again = train_agent(config, run, steps=48, resume=True, eval_episodes=0, progress=False)
    ... # doctest: +ELLIPSIS
    resuming A2C on CartPole-v1: 32 -> 48 steps, 1 envs, seed 0, output .../a2c
    saved to ...
    >>> int(again.agent.num_timesteps), run.read_json("history.json")["resumed_at"]
    (48, [32])
    """
    if not isinstance(config, AgentConfig):
        raise TypeError(f"config: expected an AgentConfig, got {type(config).__name__}")
    run = run if isinstance(run, RunDirectory) else RunDirectory(run)
    steps = _check_options(steps, eval_every, keep_best)
    distributed = {"rollout_workers": rollout_workers, "ray_address": ray_address,
                   "num_cpus": num_cpus}
    with contextlib.ExitStack() as stack:
        if lock:
            stack.enter_context(run)
        start = _start(config, run, steps=steps, resume=resume, overwrite=overwrite,
                       override=override, explicit=explicit, distributed=distributed)
        agent = start.agent
        plan = _evaluation_plan(agent, eval_every, keep_best)
        os.makedirs(run.path, exist_ok=True)
        _announce(start, run, steps, int(agent.num_timesteps.numpy()), plan, keep_best)
        status, seconds, resumed_at = _train(start, run, steps, plan, progress)
        agent.save(run.path)
        write_run_record(run, "", overrides=start.overrides, resolved=start.resolved,
                         history=agent.history, train_seconds=seconds, resumed_at=resumed_at)
        evaluation = _report(agent, run, status, eval_episodes)
    return TrainedAgent(agent, status, start.resumed, evaluation, seconds)
