"""The report of :func:`agents.evaluate_under_attack`: per (attack, eps) rows, worst cases, text,
JSON and plots.

:class:`AgentAttackReport` holds one dict per (attack, eps) (mean / median / std / min episode
return, the fraction of steps whose action the attack changed, the mean perturbation norm, env
steps per second, the normalised score ``(R - R_random) / (R_clean - R_random)``);
:func:`worst_cases` takes the attack of lowest mean return per eps and over every budget up to
eps (RL attacks are not monotone in eps); :func:`monotonicity_warnings` names where a larger eps
scores higher.

>>> rows = [{"attack": "mad", "eps": 0.1, "mean": 80.0, "median": 80.0, "normalized_score": 0.8},
...         {"attack": "rs", "eps": 0.1, "mean": 50.0, "median": 50.0, "normalized_score": 0.5},
...         {"attack": "mad", "eps": 0.2, "mean": 60.0, "median": 60.0, "normalized_score": 0.6},
...         {"attack": "rs", "eps": 0.2, "mean": 70.0, "median": 70.0, "normalized_score": 0.7}]
>>> [(w["eps"], w["attack"], w["up_to_eps_mean"]) for w in worst_cases(rows, [0.1, 0.2])]
[(0.1, 'rs', 50.0), (0.2, 'mad', 50.0)]
>>> monotonicity_warnings(rows, ["rs"], clean_return=100.0)[0][:36]
'rs: eps 0.2 scores higher (70.0) tha'
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import numpy as np

from robustgrad.atomic import pyplot, replacing, save_figure

__all__ = ["AgentAttackReport", "monotonicity_warnings", "worst_cases"]

def _stats(returns):
    r = np.asarray(returns, np.float64)
    return {"mean": float(r.mean()), "median": float(np.median(r)), "std": float(r.std()),
            "min": float(r.min()), "max": float(r.max())}


def _json_ready(value):
    """``value`` with every NaN or infinite float replaced by ``None`` (valid JSON)."""
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if isinstance(value, (float, np.floating)) and not math.isfinite(float(value)):
        return None
    if isinstance(value, np.ndarray):
        return _json_ready(value.tolist())
    return value


def _normalized(r, clean, random):
    den = clean - random
    return float((r - random) / den) if den != 0 else float("nan")


# -- the report ---------------------------------------------------------------------------------
@dataclasses.dataclass
class AgentAttackReport:
    """What :func:`evaluate_under_attack` measured; ``rows`` hold one dict per (attack, eps)."""

    algo: str
    env: str
    norm: str
    units: str
    eps: list
    attacks: list
    n_episodes: int
    seed: int
    clean: dict
    random_policy: dict
    rows: list
    worst_case: list
    warnings: list
    trajectories: dict
    certified: list = dataclasses.field(default_factory=list)
    """``certify=``: per eps the fraction of the clean run's visited states whose greedy action is
    certified (:func:`agents.robustness.certify.certified_rows`); empty otherwise."""

    def row(self, attack: str, eps: float) -> dict:
        """The row of ``attack`` at budget ``eps``."""
        for r in self.rows:
            if r["attack"] == attack and math.isclose(r["eps"], eps):
                return r
        raise KeyError(f"no row for attack={attack!r}, eps={eps}")

    def to_dict(self) -> dict[str, Any]:
        """The report as plain Python data (every field, rows included)."""
        return dataclasses.asdict(self)

    def to_json(self, path: str | None = None) -> str:
        """The report as JSON (written to ``path`` when given). JSON has no NaN: an undefined
        number (a normalised score of 0/0, see ``warnings``) is written as ``null``."""
        text = json.dumps(_json_ready(self.to_dict()), indent=1, allow_nan=False)
        if path is not None:
            with replacing(path) as tmp, open(tmp, "w") as f:
                f.write(text)
        return text

    def __str__(self):
        head = (f"{self.algo.upper()} on {self.env}: {self.n_episodes} episodes per row, "
                f"{self.norm} ball in {self.units} units\n"
                f"clean {self.clean['mean']:.1f} (median {self.clean['median']:.1f}), "
                f"random policy {self.random_policy['mean']:.1f}\n")
        cols = (f"{'attack':<8} {'eps':>6} {'mean':>8} {'median':>8} {'std':>7} {'min':>7} "
                f"{'changed':>8} {'|d|':>7} {'score':>6} {'steps/s':>8}")
        lines = [head + cols]
        for r in self.rows:
            lines.append(f"{r['attack']:<8} {r['eps']:>6.3g} {r['mean']:>8.1f} "
                         f"{r['median']:>8.1f} {r['std']:>7.1f} {r['min']:>7.1f} "
                         f"{r['action_changed']:>8.1%} {r['mean_perturbation']:>7.4f} "
                         f"{r['normalized_score']:>6.2f} {r['steps_per_second']:>8.0f}")
        for r in self.rows:
            if r.get("cost"):
                c = r["cost"]
                lines.append(f"{r['attack']} eps {r['eps']:g}: learned adversary trained for "
                             f"{c['adversary_steps']} steps, {c['wall_seconds']:.0f} s wall, "
                             f"{c['cpu_seconds']:.0f} s CPU")
        lines.append("worst case over attacks (and over every budget up to eps):")
        for w in self.worst_case:
            lines.append(f"  eps {w['eps']:<6.3g} {w['attack']:<7} mean {w['mean']:.1f} "
                         f"(score {w['normalized_score']:.2f}); up to eps: "
                         f"{w['up_to_eps_mean']:.1f} ({w['up_to_eps_attack']} at "
                         f"{w['up_to_eps_eps']:.3g})")
        lines += _certified_lines(self.certified, self.rows)
        lines += [f"warning: {m}" for m in self.warnings]
        return "\n".join(lines)

    def plot(self, path: str) -> str:
        """Mean return vs eps per attack, with the clean and random-policy returns."""
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6, 4))
        for name in self.attacks:
            rows = [r for r in self.rows if r["attack"] == name]
            ax.plot([r["eps"] for r in rows], [r["mean"] for r in rows], "o-", label=name)
        ax.axhline(self.clean["mean"], color="k", ls="--", lw=1, label="clean")
        ax.axhline(self.random_policy["mean"], color="gray", ls=":", lw=1,
                   label="random policy")
        ax.set_xlabel(f"eps ({self.norm}, {self.units} units)")
        ax.set_ylabel("mean episode return")
        ax.set_title(f"{self.algo.upper()} {self.env} under observation attacks")
        ax.legend(fontsize=8)
        fig.tight_layout()
        save_figure(fig, path)
        return path

    def plot_trajectories(self, path: str) -> str:
        """Each observation dimension over time: one clean and one attacked episode."""
        plt = pyplot()
        clean = np.asarray(self.trajectories["clean"])
        attacked = np.asarray(self.trajectories["attacked"])
        d = min(clean.shape[1], 8)
        fig, axes = plt.subplots(d, 1, figsize=(7, 1.6 * d), sharex=True, squeeze=False)
        for i in range(d):
            ax = axes[i, 0]
            ax.plot(clean[:, i], lw=1, label="clean")
            ax.plot(attacked[:, i], lw=1, label=self.trajectories["label"])
            ax.set_ylabel(f"obs[{i}]")
        axes[0, 0].legend(fontsize=8)
        axes[-1, 0].set_xlabel("step")
        fig.tight_layout()
        save_figure(fig, path)
        return path

    def save(self, directory: str) -> dict:
        """Write ``report.json``, ``report.txt``, ``return_vs_eps.png``, ``trajectories.png``."""
        os.makedirs(directory, exist_ok=True)
        paths = {k: os.path.join(directory, k) for k in
                 ("report.json", "report.txt", "return_vs_eps.png", "trajectories.png")}
        self.to_json(paths["report.json"])
        with replacing(paths["report.txt"]) as tmp, open(tmp, "w") as f:
            f.write(str(self) + "\n")
        self.plot(paths["return_vs_eps.png"])
        self.plot_trajectories(paths["trajectories.png"])
        return paths


def _certified_lines(certified: list, rows: list) -> list:
    """The certified-actions table: per eps the certified fraction of the clean run's states (a
    lower bound of the actions no attack can change) beside the most actions an attack changed
    (on its own trajectories; an upper bound of the unchanged ones)."""
    if not certified:
        return []
    lines = [f"certified actions ({certified[0]['method']}, {certified[0]['n_states']} clean "
             "states) vs the strongest attack:", f"  {'eps':>6} {'certified':>9} "
             f"{'unchanged under attack':>22}"]
    for c in certified:
        changed = [r["action_changed"] for r in rows if math.isclose(r["eps"], c["eps"])]
        attacked = f"{1 - max(changed):>22.1%}" if changed else f"{'-':>22}"
        lines.append(f"  {c['eps']:>6.3g} {c['certified_fraction']:>9.1%} {attacked}")
    return lines


def worst_cases(rows: list, budgets: list) -> list:
    """Per eps: the attack of lowest mean return, and the lowest over every budget up to eps."""
    out, so_far = [], None
    for e in budgets:
        w = min((r for r in rows if math.isclose(r["eps"], e)), key=lambda r: r["mean"])
        if so_far is None or w["mean"] < so_far["mean"]:
            so_far = w
        out.append({"eps": e, "attack": w["attack"], "mean": w["mean"], "median": w["median"],
                    "normalized_score": w["normalized_score"], "up_to_eps_mean": so_far["mean"],
                    "up_to_eps_attack": so_far["attack"], "up_to_eps_eps": so_far["eps"]})
    return out


def monotonicity_warnings(rows: list, attacks: list, clean_return: float) -> list:
    """A warning per attack and pair of consecutive budgets where the larger eps scores higher
    (by more than 1% of the clean return)."""
    slack = 0.01 * max(abs(clean_return), 1.0)
    out = []
    for name in attacks:
        series = sorted((r for r in rows if r["attack"] == name), key=lambda r: r["eps"])
        for lo, hi in zip(series, series[1:]):
            if hi["mean"] > lo["mean"] + slack:
                out.append(f"{name}: eps {hi['eps']:g} scores higher ({hi['mean']:.1f}) than "
                           f"eps {lo['eps']:g} ({lo['mean']:.1f}); RL attacks are not monotone "
                           "in eps, use the worst case up to eps")
    return out
