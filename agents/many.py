"""Many seeds in one run: ``train_many(config, seeds, steps)``, and the statistics over seeds.

Two designs, both one compiled call per iteration for all seeds on the graph backend
(``backend="graph"``: the environments are TensorFlow ops, :mod:`agents.graph_backend`):

* ``design="stacked"`` (PPO; the default when the config allows it):
  :class:`agents.stacked.StackedPPO`, a leading seed axis on every variable, batched matmuls,
  per-seed environments, permutations, clipping, guard and Adam. The per-op cost of TensorFlow
  is paid once for all seeds, which is where the speed-up comes from (measured in
  ``benchmarks/agents_speed.py``). The same PPO update, tested loss by loss against
  :class:`agents.PPO`; the random numbers differ from a seed trained alone, so the two agree in
  distribution.
* ``design="group"`` (PPO, A2C, REINFORCE, any config): a *batch of agents*, one ordinary agent
  per seed, every agent's ``_iteration_graph`` traced into one ``tf.function``. Each seed
  follows exactly the computation it would follow alone (tested: equal weights), but the
  per-op cost is paid once per seed, so it is barely faster than training the seeds one after
  the other (measured: slower on a loaded 2-core machine).

Either way ``train_many`` returns ordinary agents (their weights, Adam moments, step counts,
``history`` and ``episode_returns`` filled in) that save, load and evaluate like any other.
Not supported: DQN, rollout workers, callbacks.

Statistics over seeds follow rliable (Agarwal et al. 2021): mean, median and the interquartile
mean (IQM: the mean of the middle 50% of the runs), each with a percentile bootstrap
confidence interval over runs.

>>> summary = summarize_runs([500.0, 480.0, 500.0, 20.0, 500.0, 495.0, 500.0, 350.0])
>>> summary["median"], round(summary["iqm"], 2)
(497.5, 493.75)
>>> low, high = summary["iqm_ci"]
>>> bool(low <= summary["iqm"] <= high)
True
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from agents.callbacks import ProgressBar
from agents.config import OnPolicyConfig, PPOConfig
from robustgrad._checks import ArgumentTypeError, choice, positive_int


def _agent_class(config: OnPolicyConfig):
    from agents.registry import ALGORITHMS

    cls = next((c for c in ALGORITHMS.values() if c.config_cls is type(config)
                and isinstance(config, OnPolicyConfig)), None)
    if cls is None:
        raise ValueError(f"config must be a PPOConfig, A2CConfig or REINFORCEConfig "
                         f"(train_many runs on-policy agents), got {type(config).__name__}")
    return cls


def check_seeds(seeds: Sequence[int] | None = None, num_seeds: int | None = None,
                first_seed: int = 0) -> list[int]:
    """The list of seeds from ``seeds`` (distinct ints >= 0) or ``num_seeds`` (an int >= 1:
    ``first_seed, first_seed + 1, ...``); exactly one of the two.

    >>> check_seeds(num_seeds=3, first_seed=4)
    [4, 5, 6]
    >>> check_seeds(num_seeds=0)
    Traceback (most recent call last):
    ...
    ValueError: num_seeds must be an int >= 1, got 0
    """
    if (seeds is None) == (num_seeds is None):
        raise ValueError("give exactly one of seeds (a list of ints) and num_seeds (an int)")
    if num_seeds is not None:
        n = positive_int(num_seeds, "num_seeds")
        return [first_seed + i for i in range(n)]
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
        raise ArgumentTypeError(f"seeds must be a list of ints >= 0, got {seeds!r}")
    out = [positive_int(s, "seeds", minimum=0) for s in seeds]
    if not out:
        raise ValueError("seeds must hold at least one seed, got []")
    if len(set(out)) != len(out):
        raise ValueError(f"seeds must be distinct, got {out}")
    return out


def train_many(config: OnPolicyConfig, seeds: Sequence[int] | None = None,
               steps: int = 100_000, *, num_seeds: int | None = None, design: str = "auto",
               progress_bar: bool = False) -> list:
    """Train one agent per seed, all seeds in one compiled call per iteration (module doc).

    ``config``: a PPO/A2C/REINFORCE config with ``backend="graph"`` (its ``seed`` is replaced
    by each seed; ``jit_compile`` compiles the whole iteration with XLA). ``seeds``: distinct
    ints >= 0, or ``num_seeds`` (seeds ``config.seed, config.seed + 1, ...``). ``steps``:
    environment steps per seed (rounded up to whole iterations). ``design``: ``"stacked"``,
    ``"group"`` or ``"auto"`` (stacked for a PPO config it supports, group otherwise).
    Returns the trained agents in the order of the seeds. Raises
    :class:`agents.NonFiniteTrainingError` when a seed has ``max_nonfinite_updates``
    consecutive fully rejected updates.
    """
    from agents.stacked import StackedPPO, unsupported_fields

    cls = _agent_class(config)
    seed_list = check_seeds(seeds, num_seeds, config.seed)
    steps = positive_int(steps, "steps")
    choice(design, "design", ("auto", "stacked", "group"))
    if config.backend != "graph":
        raise ValueError("train_many needs config.backend='graph' (the environments must be "
                         f"TensorFlow ops to run in one compiled call), got {config.backend!r}")
    stackable = isinstance(config, PPOConfig) and not unsupported_fields(config)
    if design == "stacked" and not stackable:
        raise ValueError("design='stacked' needs a PPO config without "
                         f"{', '.join(unsupported_fields(config)) or 'another algorithm'}; "
                         "use design='group'")
    group = [cls(dataclasses.replace(config, seed=s)) for s in seed_list]
    if design == "group" or not stackable:
        return train_group(group, steps, progress_bar=progress_bar)
    return StackedPPO(group).train(steps)


def train_group(group: list, steps: int, *, progress_bar: bool = False) -> list:
    """Train the graph-backend on-policy agents of ``group`` for ``steps`` more steps each,
    all of them in one compiled call per iteration. Returns ``group``."""
    from agents.base import NonFiniteTrainingError

    steps = positive_int(steps, "steps")
    jit = any(a.config.jit_compile for a in group)
    for agent in group:
        if agent.config.backend != "graph" or not hasattr(agent, "_iteration_graph"):
            raise ValueError(f"group: every agent must be an on-policy agent with "
                             f"backend='graph', got {agent!r}")
        if not agent._env_ready:
            agent._reset_env()
    if not hasattr(group[0], "_group_iteration") or group[0]._group_members != tuple(group):
        # one trace for the whole group (kept on the first agent for repeated calls)
        group[0]._group_iteration = tf.function(
            lambda: [agent._iteration_graph() for agent in group], jit_compile=jit)
        group[0]._group_members = tuple(group)
    iteration = group[0]._group_iteration
    per_iteration = group[0].config.n_steps * group[0].config.num_envs
    bar = ProgressBar(steps * len(group), enabled=progress_bar)
    failures = [0] * len(group)
    done = 0
    start = time.perf_counter()
    for agent in group:
        agent.training_failed = True
    try:
        while done < steps:
            lrs = [agent._start_iteration(done, steps) for agent in group]
            all_stats = iteration()
            done += per_iteration
            elapsed = time.perf_counter() - start
            for k, (agent, stats, lr) in enumerate(zip(group, all_stats, lrs)):
                logs, _ = agent._finish_iteration(stats, lr)
                for ret, _length in agent.env.drain_episodes():
                    agent.episode_returns.append(ret)
                episode_return = (float(np.mean(agent.episode_returns))
                                  if agent.episode_returns else float("nan"))
                agent.history.append({"steps": int(agent.num_timesteps.numpy()),
                                      "episode_return": episode_return})
                tried, applied = logs.get("updates_tried", 0.0), logs.get("updates_applied", 0.0)
                agent.rejected_steps += int(round(tried - applied))
                failures[k] = failures[k] + 1 if tried > 0 and applied == 0 else 0
                if failures[k] >= agent.config.max_nonfinite_updates:
                    raise NonFiniteTrainingError(
                        f"seed {agent.config.seed}: training stopped after {failures[k]} "
                        "consecutive updates with non-finite gradients")
            bar.update(done * len(group), done * len(group) / max(elapsed, 1e-9))
        for agent in group:
            agent.training_failed = False
    finally:
        bar.close()
    return group


# -- statistics over seeds ---------------------------------------------------------------------
def iqm(values: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean: the mean of the middle 50% of ``values`` (rliable's definition,
    ``scipy.stats.trim_mean(values, 0.25)``: a quarter trimmed from each end).

    >>> iqm([1, 2, 3, 4, 5, 6, 7, 8])
    4.5
    """
    x = np.sort(np.asarray(values, np.float64).ravel())
    if x.size == 0:
        raise ValueError("values must hold at least one number, got none")
    cut = int(0.25 * x.size)
    return float(np.mean(x[cut:x.size - cut]))


def bootstrap_ci(values: Sequence[float] | np.ndarray,
                 statistic: Callable[[np.ndarray], float] = np.mean, confidence: float = 0.95,
                 reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``statistic`` over runs (resampling the
    runs with replacement ``reps`` times, as rliable does per task).

    >>> bootstrap_ci([5.0, 5.0, 5.0])
    (5.0, 5.0)
    """
    x = np.asarray(values, np.float64).ravel()
    if x.size == 0:
        raise ValueError("values must hold at least one number, got none")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, x.size, size=(positive_int(reps, "reps"), x.size))
    stats = np.array([statistic(x[row]) for row in draws])
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(low), float(high)


def summarize_runs(values: Sequence[float] | np.ndarray, confidence: float = 0.95,
                   reps: int = 2000, seed: int = 0) -> dict[str, Any]:
    """``mean``, ``median``, ``iqm``, ``std``, ``min``, ``max``, ``n`` of one number per run,
    with ``mean_ci``, ``median_ci`` and ``iqm_ci`` (percentile bootstrap, ``confidence``)."""
    x = np.asarray(values, np.float64).ravel()
    out = {"n": int(x.size), "mean": float(np.mean(x)), "median": float(np.median(x)),
           "iqm": iqm(x), "std": float(np.std(x)), "min": float(np.min(x)),
           "max": float(np.max(x)), "confidence": confidence}
    for name, fn in (("mean", np.mean), ("median", np.median), ("iqm", iqm)):
        out[f"{name}_ci"] = list(bootstrap_ci(x, fn, confidence, reps, seed))
    return out


def learning_curves(histories: Sequence[list[dict]], points: int = 100
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Common step grid and ``[runs, points]`` returns (linear interpolation of each run's
    ``history``; NaN before a run's first finished episode)."""
    curves = []
    for history in histories:
        pts = [(h["steps"], h["episode_return"]) for h in history
               if h.get("episode_return") == h.get("episode_return")]
        curves.append(np.asarray(pts, np.float64).reshape(-1, 2))
    top = max((c[-1, 0] for c in curves if len(c)), default=0.0)
    grid = np.linspace(0.0, top, points)
    rows = []
    for c in curves:
        if len(c) == 0:
            rows.append(np.full(points, np.nan))
            continue
        row = np.interp(grid, c[:, 0], c[:, 1])
        row[grid < c[0, 0]] = np.nan
        rows.append(row)
    return grid, np.asarray(rows)


def plot_seed_curves(histories: Sequence[list[dict]], path: str, title: str) -> None:
    """Learning curve over seeds: the median return and the interquartile and min-max
    bands against environment steps, written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid, rows = learning_curves(histories)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    with warnings.catch_warnings():  # all-NaN columns before the first episode
        warnings.simplefilter("ignore", RuntimeWarning)
        q = np.nanquantile(rows, [0.0, 0.25, 0.5, 0.75, 1.0], axis=0)
    ax.fill_between(grid, q[0], q[4], alpha=0.15, label="min-max")
    ax.fill_between(grid, q[1], q[3], alpha=0.35, label="interquartile")
    ax.plot(grid, q[2], label=f"median of {len(histories)} seeds")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episode return (last 20)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = ["bootstrap_ci", "check_seeds", "iqm", "learning_curves", "plot_seed_curves",
           "summarize_runs", "train_group", "train_many"]
