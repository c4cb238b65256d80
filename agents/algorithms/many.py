"""Many seeds in one run: ``train_many(config, seeds, steps)``, and the statistics over seeds.

``train_many`` is the agent with a seed axis (``num_seeds = len(seeds)``, :mod:`agents.algorithms.onpolicy`,
:mod:`agents.algorithms.dqn`): one program for all seeds, batched matmuls, per-seed environments, losses,
clipping, guard, Adam, normalisation, replay buffers and ``target_kl`` masks, on either backend (the
graph backend compiles the whole iteration of every seed into one call), robust training included
(``robust="atla"``: each seed against its own slice of one learned adversary with a seed axis,
:mod:`agents.robustness.atla`; not in the checkpoints).
It trains through the one ``learn`` driver, so callbacks, ``checkpoint_dir``/``checkpoint_every``
(one ordinary saved agent per seed, ``seed_<s>/``), interrupts (Ctrl-C/SIGTERM save and raise
:class:`robustgrad.interrupts.TrainingInterrupted`) and the non-finite stop work as for one
agent. It returns ordinary one-seed agents (``agent.export(s)``) that save, load, evaluate and
are attacked like any other. Each seed in a group draws its random numbers as it draws them
alone (:mod:`agents.core.streams`; the graph envs keep a key per seed): seed ``s`` of a sweep
re-run alone trains to the same weights up to float rounding (robust training aside).

Statistics over seeds follow rliable (Agarwal et al. 2021): mean, median and the interquartile
mean (IQM: the mean of the middle 50% of the runs), each with a percentile bootstrap
confidence interval over runs; two methods compared by the probability of improvement
(:func:`probability_of_improvement`).

>>> summary = summarize_runs([500.0, 480.0, 500.0, 20.0, 500.0, 495.0, 500.0, 350.0])
>>> summary["median"], round(summary["iqm"], 2)
(497.5, 493.75)
>>> low, high = summary["iqm_ci"]
>>> bool(low <= summary["iqm"] <= high)
True
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agents.algorithms.dqn_config import DQNConfig
from agents.algorithms.onpolicy import OnPolicyConfig
from agents.algorithms.registry import ALGORITHMS
from agents.core.config import check_seeds  # noqa: F401 - agents.algorithms.many.check_seeds, as before
from agents.core.limits import check_total_steps
from robustgrad.atomic import pyplot, save_figure
from robustgrad.checks import choice, positive_int


def _agent_class(config: OnPolicyConfig | DQNConfig):
    cls = next((c for c in ALGORITHMS.values() if c.config_cls is type(config)
                and isinstance(config, (OnPolicyConfig, DQNConfig))), None)
    if cls is None:
        raise ValueError(f"config must be a PPOConfig, A2CConfig, REINFORCEConfig or DQNConfig "
                         f"(the agents with a seed axis), got {type(config).__name__}")
    return cls


def train_many(config: OnPolicyConfig | DQNConfig, seeds: Sequence[int] | None = None,
               steps: int = 100_000, *, num_seeds: int | None = None, design: str | None = None,
               progress_bar: bool = False, callbacks: Any = None,
               handle_interrupts: bool = True) -> list:
    """Train one agent per seed, all seeds in one program with a seed axis (module doc).

    ``config``: a PPO/A2C/REINFORCE/DQN config (its ``seed`` and ``num_seeds`` are replaced by the
    seeds'; any backend; ``jit_compile`` compiles the whole graph-backend iteration with XLA).
    ``seeds``: distinct ints >= 0, or ``num_seeds`` (seeds ``config.seed, config.seed + 1,
    ...``). ``steps``: environment steps per seed (rounded up to whole iterations).
    ``callbacks``, ``progress_bar``, ``handle_interrupts``: as :meth:`agents.Agent.learn` (a
    callback sees the agent of all seeds and logs averaged over seeds, each seed's under
    ``"per_seed"``). ``config.checkpoint_dir`` receives ``seed_<s>/`` checkpoints every
    ``checkpoint_every`` steps and at the end (``agents.load(checkpoint_dir)`` resumes all seeds).
    ``design`` is deprecated (one code path serves every seed count). Returns the trained
    agents in the order of the seeds. Raises :class:`agents.NonFiniteTrainingError` when a seed
    has ``max_nonfinite_updates`` consecutive fully rejected updates.

    >>> import agents
    >>> cfg = agents.PPOConfig(backend="graph", n_steps=16, num_envs=2, n_minibatches=1)
    >>> trained = train_many(cfg, seeds=[3, 8], steps=32)
    >>> [a.config.seed for a in trained], [int(a.num_timesteps.numpy()) for a in trained]
    ([3, 8], [32, 32])
    """
    cls = _agent_class(config)
    seed_list = check_seeds(seeds, num_seeds, config.seed)
    steps = check_total_steps(steps, "steps")
    if design is not None:
        choice(design, "design", ("auto", "stacked", "group"))
        warnings.warn("train_many: design= is deprecated and ignored: every number of seeds runs "
                      "on the agents' one seed-axis code path", DeprecationWarning, stacklevel=2)
    config = dataclasses.replace(config, seed=seed_list[0], num_seeds=len(seed_list))
    agent = cls(config, seeds=seed_list)
    if len(seed_list) == 1:
        return [agent.learn(steps, callbacks, progress_bar=progress_bar,
                            handle_interrupts=handle_interrupts)]
    try:
        agent.learn(steps, callbacks, progress_bar=progress_bar,
                    handle_interrupts=handle_interrupts)
        return [agent.export(k) for k in range(len(seed_list))]
    finally:
        agent.close()


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


def probability_of_improvement(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
                               confidence: float = 0.95, reps: int = 2000,
                               seed: int = 0) -> dict[str, Any]:
    """``P(X > Y)``: the probability that a run of method X scores above a run of method Y,
    with a percentile bootstrap interval (rliable's probability of improvement, Agarwal et al.
    2021, "Deep RL at the Edge of the Statistical Precipice", on one task: the Mann-Whitney
    statistic ``mean_ij S(x_i, y_j)``, ``S`` 1 for ``x_i > y_j``, 1/2 for a tie, 0 below; the
    runs of X and of Y resampled independently ``reps`` times).

    ``x``, ``y``: one score per run (seed) of each method, any lengths >= 1, finite. Returns
    ``{"p": float, "ci": [low, high], "n_x": int, "n_y": int, "confidence": float}``. Unlike a
    difference of medians it says how often one method's seed beats the other's, which is what a
    user drawing one seed gets; ``p`` near 0.5 with an interval holding 0.5 means the runs do not
    tell the two methods apart.

    >>> probability_of_improvement([3.0, 4.0], [1.0, 2.0, 5.0])["p"]  # 4 of 6 pairs above
    0.6666666666666666
    >>> probability_of_improvement([2.0], [2.0])["p"]  # a tie counts one half
    0.5
    """
    a, b = (np.asarray(v, np.float64).ravel() for v in (x, y))
    for name, v in (("x", a), ("y", b)):
        if v.size == 0:
            raise ValueError(f"{name} must hold at least one number, got none")
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{name} must be finite, got {v[~np.isfinite(v)][0]}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    rng = np.random.default_rng(seed)
    n = positive_int(reps, "reps")

    def mann_whitney(u: np.ndarray, v: np.ndarray) -> float:  # O((n_u + n_v) log n_v) pairs
        v = np.sort(v)
        below = np.searchsorted(v, u, side="left")  # the v strictly below each u
        ties = np.searchsorted(v, u, side="right") - below
        return float(np.sum(below + 0.5 * ties) / (u.size * v.size))

    draws_a = a[rng.integers(0, a.size, size=(n, a.size))]
    draws_b = b[rng.integers(0, b.size, size=(n, b.size))]
    alpha = (1.0 - confidence) / 2.0
    stats = [mann_whitney(u, v) for u, v in zip(draws_a, draws_b)]
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return {"p": mann_whitney(a, b), "ci": [float(low), float(high)],
            "n_x": int(a.size), "n_y": int(b.size), "confidence": confidence}


def summarize_runs(values: Sequence[float] | np.ndarray, confidence: float = 0.95,
                   reps: int = 2000, seed: int = 0) -> dict[str, Any]:
    """``mean``, ``median``, ``iqm``, ``std``, ``min``, ``max``, ``n`` of one number per run,
    with ``mean_ci``, ``median_ci`` and ``iqm_ci`` (percentile bootstrap, ``confidence``)."""
    x = np.asarray(values, np.float64).ravel()
    out: dict[str, float | list[float]] = {
        "n": int(x.size), "mean": float(np.mean(x)), "median": float(np.median(x)),
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
    plt = pyplot()
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
    save_figure(fig, path)


__all__ = ["bootstrap_ci", "check_seeds", "iqm", "learning_curves", "plot_seed_curves",
           "probability_of_improvement", "summarize_runs", "train_many"]
