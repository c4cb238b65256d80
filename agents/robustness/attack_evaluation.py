"""Attack-success evaluation of agents: episode returns under observation attacks.

:func:`evaluate_under_attack` runs whole episodes on a vector env of several copies stepping
together, one batch attack per step (the fast path), for every attack and budget, and returns
an :class:`agents.robustness.attack_report.AgentAttackReport`: per attack and eps the mean / median / std /
min episode return, the fraction of steps whose action the attack changed, the mean perturbation norm (checked
``<= eps``) and env steps per second; the worst case over attacks per eps (the papers' minimum
over attacks of the mean return) and over every budget up to eps (RL attacks are not monotone
in eps: the report warns when a larger eps scores higher); the normalised score
``(R − R_random) / (R_clean − R_random)`` with ``R_random`` (uniformly random actions) measured
in the same run. Every run uses the same env seed (common random numbers).

:class:`ObservationAttackWrapper` applies one attack to any gymnasium env an agent acts in; it
calls the same batch function with the same per-step seeds, so for the same seed and the same
observations both paths give the same perturbations.

>>> import agents
>>> agent = agents.PPO(env="CartPole-v1", seed=0, num_envs=1, n_steps=32)
>>> report = evaluate_under_attack(agent, ["random"], eps=[0.1], n_episodes=2, progress=False)
>>> row = report.row("random", 0.1)
>>> bool(row["mean_perturbation"] <= 0.1 + 1e-6), len(row["returns"])
(True, 2)
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from agents.robustness._victim import _surface
from agents.robustness.adversary import (
    LEARNED_ATTACKS,
    adversary_for,
    check_adversary_request,
    train_adversary,
)
from agents.robustness.attack_report import (
    AgentAttackReport,
    _normalized,
    _stats,
    monotonicity_warnings,
    worst_cases,
)
from agents.robustness.certify import certified_rows, check_certifiable
from agents.robustness.episodes import _actions_differ, _run_episodes
from agents.robustness.observation_attacks import (
    _FUNCTIONS,
    ATTACK_NAMES,
    ObservationAttack,
    check_agent,
    check_attack,
    check_box_observations,
    perturbation_scale,
    step_seed,
)
from robustgrad import checks as _checks

if TYPE_CHECKING:
    from agents.core.base import Agent

# the report (AgentAttackReport, worst_cases, monotonicity_warnings) lives in agents.robustness.attack_report
__all__ = ["ObservationAttackWrapper", "check_evaluation", "evaluate_under_attack"]

_BUDGET_TOL = 1e-5  # relative slack on ‖δ‖ <= eps (float32 rounding of s + δ·std)


def _check_budget(norms, eps, who):
    if norms.size and float(np.max(norms)) > eps * (1 + _BUDGET_TOL) + 1e-6:
        raise AssertionError(f"{who}: a perturbation of norm {float(np.max(norms))} exceeds "
                             f"eps={eps}")


class ObservationAttackWrapper(gym.ObservationWrapper):
    """Perturb each observation ``agent`` sees in ``env`` (a 1-D Box env) with ``attack``.

    ``attack``: a name of :data:`agents.robustness.observation_attacks.ATTACK_NAMES` or an
    :class:`ObservationAttack`. Step ``t`` (counted over the wrapper's life) uses the seed
    ``step_seed(seed, t)``. Records ``perturbation_norms`` (in eps units) and
    ``action_changed`` (the agent's deterministic action differs on ŝ) per step.
    """

    def __init__(self, env: gym.Env, agent: Agent, attack: str | ObservationAttack,
                 eps: float = 0.1, seed: int = 0, norm: str = "linf", **kwargs: Any):
        check_box_observations(env.observation_space, "env")
        super().__init__(env)
        if isinstance(attack, ObservationAttack):
            self.attack = attack
        else:
            self.attack = ObservationAttack(agent, attack, eps, norm, **kwargs)
        self.agent = agent
        self.seed = _checks.positive_int(seed, "seed", minimum=0)
        self.t = 0
        self.perturbation_norms: list[float] = []
        self.action_changed: list[bool] = []

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """The attacked observation ŝ for the clean one (same shape and dtype); records its
        perturbation norm and whether it changed the agent's deterministic action."""
        obs = np.asarray(observation, np.float32)[None]
        adv, norm, a_adv, a_clean = self.attack.step(obs, seed=step_seed(self.seed, self.t))
        self.t += 1
        _check_budget(norm, self.attack.eps, "ObservationAttackWrapper")
        self.perturbation_norms.append(float(norm[0]))
        changed = _actions_differ(a_adv, a_clean, self.agent.env.single_action_space)
        self.action_changed.append(bool(changed[0]))
        return adv[0].astype(np.asarray(observation).dtype)


# -- the evaluation -----------------------------------------------------------------------------
def _units(agent, scale) -> str:
    if scale is None:
        return "normalised" if _surface(agent).normalized else "raw"
    return "raw" if isinstance(scale, str) and scale == "raw" else "per-dimension std"


def check_evaluation(agent: Agent, attacks: str | Sequence[str], eps: float | Sequence[float],
                     norm: str = "linf", scale: str | np.ndarray | None = None,
                     adversary_steps: int = 100_000) -> tuple[list, list, str]:
    """Check an evaluation request against ``agent`` (names, budgets, norm, units, a critic for
    ``critic``, Box observations, a learned adversary's budget and radii); returns
    ``(attacks, sorted budgets, norm)``."""
    check_agent(agent)
    if isinstance(attacks, str):
        attacks = [a.strip() for a in attacks.split(",") if a.strip()]
    if not isinstance(attacks, (list, tuple)) or not all(isinstance(a, str) for a in attacks):
        raise TypeError(f"attacks must be a comma-separated string or a list of attack names "
                        f"({', '.join(ATTACK_NAMES + LEARNED_ATTACKS)}), got {attacks!r}")
    attacks = list(dict.fromkeys(attacks))
    if not attacks:
        raise ValueError("attacks must name at least one attack, got []")
    budgets = sorted({float(_checks.nonnegative(e, "eps")) for e in np.atleast_1d(eps).tolist()})
    if not budgets:
        raise ValueError("eps must hold at least one budget, got []")
    for name in attacks:
        if name in LEARNED_ATTACKS:
            if _checks.norm_name(norm) != "linf":
                raise ValueError(f"norm: the learned attack {name!r} perturbs in the L-inf ball "
                                 f"only, got {norm!r}")
            for e in budgets:
                check_adversary_request(agent, e, adversary_steps, argument="agent")
            continue
        check_attack(agent, name, budgets[0], norm, argument="attacks")
    if isinstance(scale, str):
        _checks.choice(scale, "scale", ("raw", "std"))
    elif scale is not None:
        perturbation_scale(agent, scale)  # validates the array
    return attacks, budgets, _checks.norm_name(norm)


def _check_attack_kwargs(attack_kwargs: Any, attacks: Sequence[str]) -> dict:
    """``attack_kwargs`` checked before any episode runs: a dict keyed by names of ``attacks``,
    each value a dict of keywords that attack takes (``steps`` an int >= 1). A key that is not
    an attack being evaluated (``{"steps": 20}`` for ``{"mad": {"steps": 20}}``) or a keyword
    the attack does not take would otherwise be ignored without a word."""
    if attack_kwargs is None:
        return {}
    if not isinstance(attack_kwargs, dict):
        raise TypeError(f"attack_kwargs must be a dict of attack name -> keywords, got "
                        f"{type(attack_kwargs).__name__}")
    for name, kw in attack_kwargs.items():
        if name not in attacks:
            raise ValueError(f"attack_kwargs: {name!r} is not one of the attacks evaluated "
                             f"({', '.join(attacks)}); keywords go per attack, e.g. "
                             "{'mad': {'steps': 20}}")
        if not isinstance(kw, dict):
            raise TypeError(f"attack_kwargs[{name!r}] must be a dict of keywords, got "
                            f"{type(kw).__name__}")
        if name in LEARNED_ATTACKS:  # keywords of train_adversary (and PA-AD's actor)
            params = inspect.signature(train_adversary).parameters
            taken = [p for p in params if p not in ("victim", "eps", "steps", "seed", "kind",
                                                    "progress", "kind_kwargs")]
            taken += ["pgd_steps"] if name == "paad" else []
        else:
            params = inspect.signature(_FUNCTIONS[name]).parameters
            taken = [p for p in params if p not in ("agent", "obs", "q_pi", "eps", "norm",
                                                    "seed", "scale")]
        for key in kw:
            if key not in taken:
                raise ValueError(f"attack_kwargs[{name!r}]: {name} takes no keyword {key!r} "
                                 f"(it takes {', '.join(taken) or 'none'})")
        if "steps" in kw:
            _checks.positive_int(kw["steps"], f"attack_kwargs[{name!r}]['steps']")
    return dict(attack_kwargs)


def evaluate_under_attack(agent: Agent, attacks: str | Sequence[str] = ATTACK_NAMES,
                          eps: float | Sequence[float] = (0.05, 0.1, 0.2), n_episodes: int = 50,
                          seed: int = 0, *, norm: str = "linf", scale: str | np.ndarray | None = None,
                          num_envs: int | None = None,
                          rs_steps: int = 20_000, attack_kwargs: dict | None = None,
                          adversary_steps: int = 100_000, adversaries: Sequence | None = None,
                          progress: bool = True, certify: str | None = None
                          ) -> AgentAttackReport:
    """Episode returns of ``agent`` (deterministic actions) under each attack and budget.

    Args:
      attacks: names from :data:`ATTACK_NAMES`. eps: budgets (sorted, duplicates dropped),
        in the agent's units (normalised when it normalises observations, else raw).
      n_episodes: episodes per row, over ``num_envs`` copies (default ``min(n, 8)``).
      seed: env seed of every run (and the attacks' base seed).
      scale: ``None`` (the agent's units), ``"raw"``, ``"std"`` (eps per dimension times the
        observation std of the first clean episode) or an array ``[d]``.
      rs_steps: victim steps for Robust Sarsa's ``Q^π`` (trained once, shared over eps).
      attack_kwargs: per attack name, extra keywords (``{"mad": {"steps": 20}}``; for a learned
        attack, keywords of :func:`agents.robustness.adversary.train_adversary`).
      adversary_steps: training budget (env steps) of each learned adversary (``optimal``,
        ``paad``): one is trained per budget eps with :func:`agents.robustness.adversary.train_adversary`;
        its row holds its ``cost`` (steps, wall and CPU seconds).
      adversaries: already trained :class:`agents.robustness.adversary.LearnedAdversary` objects, used
        instead of training one where their kind and eps match.
      certify: a bound method (``"crown"``, ``"crown-ibp"``, ``"ibp"``): also the fraction of the
        clean run's visited states whose greedy action is certified at every eps
        (:mod:`agents.robustness.certify`; discrete policies and DQN, L-inf, the agent's units).
    All arguments are checked before any episode runs.
    """
    attacks, budgets, norm = check_evaluation(agent, attacks, eps, norm, scale, adversary_steps)
    if certify is not None:
        check_certifiable(agent, certify, norm)
        if scale is not None:
            raise ValueError("certify: certified actions are in the agent's own units; leave "
                             f"scale=None, got {scale!r}")
    n_episodes = _checks.positive_int(n_episodes, "n_episodes")
    seed = _checks.positive_int(seed, "seed", minimum=0)
    k = _checks.positive_int(min(n_episodes, 8) if num_envs is None else num_envs, "num_envs")
    rs_steps = _checks.positive_int(rs_steps, "rs_steps")
    attack_kwargs = _check_attack_kwargs(attack_kwargs, attacks)

    def say(msg):
        if progress:
            print(f"[evaluate_under_attack] {msg}", file=sys.stderr, flush=True)

    clean = _run_episodes(agent, n_episodes, k, seed, record_states=certify is not None)
    say(f"clean: mean {np.mean(clean['returns']):.1f}")
    certified = [] if certify is None else certified_rows(agent, clean["states"], budgets, certify)
    for c in certified:
        say(f"certified ({certify}) eps={c['eps']:g}: {c['certified_fraction']:.1%} of "
            f"{c['n_states']} states")
    rand = _run_episodes(agent, n_episodes, k, seed, random_actions=True)
    say(f"random policy: mean {np.mean(rand['returns']):.1f}")
    units = _units(agent, scale)
    if isinstance(scale, str) and scale == "std":
        scale = np.maximum(np.asarray(clean["trajectory"], np.float32).std(0), 1e-6) \
            if len(clean["trajectory"]) > 1 else None
    r_clean, r_rand = float(np.mean(clean["returns"])), float(np.mean(rand["returns"]))
    rows = []
    # the clean episode's observations, and each (attack, eps) run's
    trajectories: dict[str | tuple[str, float], list[list[float]]] = {"clean": clean["trajectory"]}
    for name in attacks:
        kw = dict(attack_kwargs.get(name, {}))
        if name in LEARNED_ATTACKS:
            attack = None
        else:
            attack = ObservationAttack(agent, name, budgets[0], norm, scale=scale,
                                       rs_steps=rs_steps, **kw)
            # trace (and for rs learn Q^pi) before the timed episodes: steps/s is the steady rate
            attack.step(np.zeros((k,) + tuple(agent.obs_shape), np.float32),
                        seed=step_seed(seed, 0))
        for e in budgets:
            cost = None
            if name in LEARNED_ATTACKS:
                learned = adversary_for(agent, name, e, adversaries, adversary_steps, seed,
                                        progress, **kw)
                cost = dict(learned.cost)
                say(f"{name} eps={e:g}: adversary trained for {cost.get('adversary_steps')} "
                    f"steps ({cost.get('cpu_seconds', float('nan')):.0f} s CPU)")

                def perturb(obs, t, learned=learned, e=e):
                    return learned.step(obs, seed=step_seed(seed, t), eps=e)
            else:
                def perturb(obs, t, attack=attack, e=e):
                    return attack.step(obs, seed=step_seed(seed, t), eps=e)

            run = _run_episodes(agent, n_episodes, k, seed, perturb=perturb)
            _check_budget(run["norms"], e, f"attack {name!r}")
            row = {"attack": name, "eps": e, **_stats(run["returns"]),
                   "returns": run["returns"], "action_changed": run["action_changed"],
                   "mean_perturbation": float(run["norms"].mean()) if run["norms"].size else 0.0,
                   "max_perturbation": float(run["norms"].max()) if run["norms"].size else 0.0,
                   "steps_per_second": run["steps_per_second"]}
            if cost is not None:
                row["cost"] = cost
            row["normalized_score"] = _normalized(row["mean"], r_clean, r_rand)
            rows.append(row)
            say(f"{name} eps={e:g}: mean {row['mean']:.1f}, median {row['median']:.1f}, "
                f"{row['action_changed']:.0%} actions changed, "
                f"{row['steps_per_second']:.0f} steps/s")
            trajectories[(name, e)] = run["trajectory"]
    worst = worst_cases(rows, budgets)
    warnings_ = monotonicity_warnings(rows, attacks, r_clean)
    if r_clean == r_rand:
        warnings_.append(f"normalized_score is undefined (0/0; null in report.json): the clean "
                         f"return equals the random policy's ({r_clean:g})")
    strongest = worst[-1]
    traj = {"clean": trajectories["clean"],
            "attacked": trajectories[(strongest["attack"], strongest["eps"])],
            "label": f"{strongest['attack']} eps={strongest['eps']:g}"}
    return AgentAttackReport(
        algo=agent.algo, env=agent.config.env if isinstance(agent.config.env, str) else "<factory>",
        norm=norm, units=units, eps=budgets, attacks=attacks, n_episodes=n_episodes, seed=seed,
        clean={**_stats(clean["returns"]), "returns": clean["returns"]},
        random_policy={**_stats(rand["returns"]), "returns": rand["returns"]},
        rows=rows, worst_case=worst, warnings=warnings_, trajectories=traj, certified=certified)
