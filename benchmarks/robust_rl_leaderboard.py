"""Robust-RL leaderboard: every robust training method x every attack x seeds (issue 37, item 2).

Per method (``--methods``: ``vanilla``, ``sa``, ``adv``, ``atla``, ``atla-sa``, ``wocar``) and
seed, a PPO agent is trained on ``--env`` (the preset, ``--steps``) with the method at
``--robust-eps`` (SA and WocaR: ``--kappa`` or the preset's; ATLA+SA: ``--kappa`` or
:data:`ATLA_SA_KAPPA`), its training CPU seconds recorded, then evaluated by
``agents.evaluate_under_attack`` under every attack of ``--attacks`` at every eps of ``--eps``.
Per agent, the *worst case* at an eps is the lowest median return over the attacks there. Per
method, over seeds: natural and worst-case return (at ``--main-eps``) as median and IQM, each
with a 95% percentile bootstrap interval (``agents.algorithms.many.summarize_runs``,
rliable-style), the median return under each attack, the median training CPU seconds, and for
each pair of methods the probability that a seed of one has the higher worst case (rliable's
probability of improvement, with its bootstrap interval); with ``--seed-power 10,20,...``, for
each pair, how often that many seeds per method would tell the two apart at the measured gap
(:func:`seed_power`).

``--json PATH`` is rewritten after every agent (a run stopped midway keeps its rows);
``--rows-from`` takes the rows of earlier runs' JSON files instead of retraining those agents
(every row of ``--methods`` there, seeds outside ``--seeds`` included: the run says which).
An agent is its method, seed and WocaR settings: rows of one agent from several files are
merged into one row with the union of their (attack, eps) cells (:func:`merge_agent_rows`), so
attacks can be added to agents evaluated earlier by a run of only the new attacks (the agents
are deterministic given the seed and the tree: the retrained agent is the same one). Refused
with a ``ValueError``: files whose protocol (:data:`PROTOCOL`) differs from this run's, and rows
of one agent whose natural return or a shared cell differ (not the same agent: the tree
changed). ``--wocar-set KEY=VALUE`` (repeatable) sets a field of ``agents.WocaR`` for the wocar
agents (e.g. ``bound="crown-ibp"``: docs/benchmarks/robust-rl.md, 2026-12-04 night); the
leaderboard names such agents ``wocar bound="crown-ibp"``, apart from default ``wocar``.
``--agent-set KEY=VALUE`` (repeatable) sets a PPO config field of every agent, of every method
(e.g. ``hidden_sizes=[128,128]``): part of the protocol, so files of other agent settings are
refused by ``--rows-from``. ``--figure PATH``
draws worst-case return against eps per method (median over seeds, the band from the lowest to
the highest seed), e.g. under ``docs/benchmarks/``. ``--quick``: a smoke run
of the whole pipeline (2 seeds, 20k steps, 3 episodes per row, the four cheap attacks at one
eps); its numbers judge nothing.

Examples::

    python benchmarks/robust_rl_leaderboard.py --quick --json /tmp/lb.json
    python benchmarks/robust_rl_leaderboard.py --seeds 0 1 2 3 4 --episodes 8 --rs-steps 10000 \
        --eps 0.02,0.05,0.1 --json leaderboard.json \
        --figure docs/benchmarks/robust_rl_leaderboard.png
    python benchmarks/robust_rl_leaderboard.py --methods wocar,vanilla --seeds 0 1 2 3 4 \
        --attacks random,action,mad,critic,rs --eps 0.02,0.05 --wocar-set 'bound="crown-ibp"'
    # add the learned attacks at eps 0.05 to those agents, then merge (nothing retrained)
    python benchmarks/robust_rl_leaderboard.py --methods wocar --attacks rs,optimal,paad \
        --eps 0.05 --wocar-set 'bound="crown-ibp"' --json learned.json
    python benchmarks/robust_rl_leaderboard.py --methods wocar --eps 0.02,0.05 \
        --wocar-set 'bound="crown-ibp"' --rows-from cheap.json learned.json --json merged.json

Cost: a full run (6 methods x 5 seeds x 7 attacks, learned adversaries of 100k steps each per
eps) is hours of CPU; the first run at size (2026-12-04: vanilla/sa/wocar x 3 seeds x 5 cheap
attacks x 2 eps, docs/benchmarks/robust-rl.md) took 11 min wall at load 3-5; run it from a
snapshot copy of the tree under ``cpuslot``, ``--threads 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# the repository before benchmarks/ (whose agents.py would shadow the agents package)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

METHODS = ("vanilla", "sa", "adv", "atla", "atla-sa", "wocar")
ATTACKS = "random,action,mad,critic,rs,optimal,paad"
# the arguments that fix an agent and its cells: files of --rows-from must match this run's
PROTOCOL = ("env", "steps", "robust_eps", "kappa", "episodes", "rs_steps", "adversary_steps",
            "agent_set")
# a file written before a PROTOCOL field existed ran with this value of it
PROTOCOL_BEFORE = {"agent_set": []}
# PPO config fields --agent-set may not set: the script's own arguments and the robust methods'
OWN_FIELDS = ("env", "seed", "backend", "preset", "num_seeds", "robust")
# ATLA+SA's SA weight when --kappa is not given: 0.1, the CartPole value of the learned-adversary
# runs (docs/benchmarks/robust-rl.md, issue 25: with SA-PPO's kappa 3 on top of the adversary
# the policy stayed near-uniform, clean return 34.5; with 1, 107.6)
ATLA_SA_KAPPA = 0.1
QUICK = {"seeds": [0, 1], "steps": 20_000, "episodes": 3, "attacks": "random,action,mad,critic",
         "eps": "0.05", "rs_steps": 2_000, "adversary_steps": 10_000}


def robust_spec(method: str, eps: float, kappa: float | None, wocar: dict | None = None):
    """The ``robust=`` argument of ``method`` at radius ``eps`` (``None``: vanilla); ``wocar``:
    more fields of ``agents.WocaR`` (``--wocar-set``, read by :func:`wocar_settings`)."""
    import agents

    if method not in METHODS:
        raise ValueError(f"methods: {method!r} is not one of {', '.join(METHODS)}")
    return {"vanilla": lambda: None,
            "sa": lambda: agents.SA(eps=eps, kappa=kappa),
            "adv": lambda: agents.Adversarial(eps=eps, attack="action"),
            "atla": lambda: agents.ATLA(eps=eps),
            "atla-sa": lambda: agents.ATLA(eps=eps, kappa=ATLA_SA_KAPPA if kappa is None
                                           else kappa),
            "wocar": lambda: agents.WocaR(eps=eps, kappa=kappa, **(wocar or {}))}[method]()


def key_values(items: list[str], option: str) -> dict:
    """``KEY=VALUE`` items of ``option`` (``--wocar-set``, ``--agent-set``; JSON values) as
    keyword arguments; a ``ValueError`` naming ``option`` for an item without ``=`` or a value
    that is not JSON.

    >>> key_values(["gamma=0.995", 'bound="crown"'], "--wocar-set")
    {'gamma': 0.995, 'bound': 'crown'}
    """
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{option}: KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{option}: {key.strip()}'s value must be JSON (strings in double "
                             f"quotes), got {value!r}") from None
    return out


def wocar_settings(items: list[str]) -> dict:
    """``--wocar-set KEY=VALUE`` items as ``agents.WocaR`` keyword arguments.

    >>> wocar_settings(["gamma=0.995", 'bound="crown"'])
    {'gamma': 0.995, 'bound': 'crown'}
    """
    return key_values(items, "--wocar-set")


def canonical_settings(items: list[str], option: str = "--wocar-set") -> list[str]:
    """``--wocar-set`` (or ``--agent-set``) items in one spelling (sorted ``key=JSON``).

    >>> canonical_settings(['bound = "crown-ibp"', "gamma=0.995"])
    ['bound="crown-ibp"', 'gamma=0.995']
    """
    return [f"{k}={json.dumps(v)}" for k, v in sorted(key_values(items, option).items())]


def agent_settings(items: list[str], env: str) -> dict:
    """``--agent-set KEY=VALUE`` items as ``agents.PPO`` keyword arguments for every agent,
    checked against the PPO config on ``env``'s preset before any agent is trained; the
    script's own fields (:data:`OWN_FIELDS`, ``robust_*``, ``wocar_*``) are refused.

    >>> agent_settings(["hidden_sizes=[128, 128]"], "CartPole-v1")
    {'hidden_sizes': [128, 128]}
    >>> agent_settings(["robust_eps=0.1"], "CartPole-v1")
    Traceback (most recent call last):
    ValueError: --agent-set: robust_eps is set by the script's own options
    """
    from agents.config import PPOConfig
    from agents.core.presets import make_config

    settings = key_values(items, "--agent-set")
    for k in settings:
        if k in OWN_FIELDS or k.startswith(("robust_", "wocar_")):
            raise ValueError(f"--agent-set: {k} is set by the script's own options")
    make_config(PPOConfig, "ppo", env=env, **settings)  # ConfigError (a ValueError) names it
    return settings


def agent_key(row: dict) -> tuple:
    """An agent's identity: method, seed, WocaR settings (the same key, the same agent)."""
    return row["method"], int(row["seed"]), tuple(row.get("wocar_set", ()))


def label(row: dict) -> str:
    """The leaderboard's name of the row's method: ``wocar`` with its settings, if any."""
    return " ".join([row["method"], *row.get("wocar_set", ())])


def merge_agent_rows(a: dict, b: dict) -> dict:
    """One agent's row from two runs: the union of their (attack, eps) cells, the worst cases
    recomputed, the training figures of ``a`` (the first run). Raises ``ValueError`` when the
    natural returns or a cell both runs measured differ: then they are not the same agent.

    >>> a = {"method": "sa", "seed": 0, "natural": 500.0, "sources": ["a.json"],
    ...      "attacks": [{"attack": "rs", "eps": 0.05, "median": 187.0}]}
    >>> b = dict(a, sources=["b.json"], attacks=[{"attack": "rs", "eps": 0.05, "median": 187.0},
    ...                                           {"attack": "paad", "eps": 0.05, "median": 90.0}])
    >>> m = merge_agent_rows(a, b)
    >>> [c["attack"] for c in m["attacks"]], m["worst"], m["sources"]
    (['rs', 'paad'], {'0.05': 90.0}, ['a.json', 'b.json'])
    """
    where = f"--rows-from: {label(a)} seed {a['seed']}"
    if float(a["natural"]) != float(b["natural"]):
        raise ValueError(f"{where}: natural return {a['natural']} in {a.get('sources')} but "
                         f"{b['natural']} in {b.get('sources')}: not the same agent (did the "
                         f"tree change?); evaluate its cells in one run")
    cells = {(c["attack"], float(c["eps"])): c for c in a["attacks"]}
    for c in b["attacks"]:
        k = (c["attack"], float(c["eps"]))
        if k not in cells:
            cells[k] = c
        elif float(cells[k]["median"]) != float(c["median"]):
            raise ValueError(f"{where}: {k[0]} at eps {k[1]:g} is {cells[k]['median']} in "
                             f"{a.get('sources')} but {c['median']} in {b.get('sources')}: "
                             f"not the same agent (did the tree change?); evaluate its cells "
                             f"in one run")
    attacks = list(cells.values())
    return dict(a, attacks=attacks,
                worst={str(e): v for e, v in worst_cases(attacks).items()},
                sources=list(a.get("sources", [])) + list(b.get("sources", [])))


def load_rows(paths: list[str], args, methods: list[str]) -> list[dict]:
    """The rows of ``methods`` in the JSON files ``paths`` (``--json`` of earlier runs), one per
    agent (:func:`merge_agent_rows`); a file whose protocol differs from ``args``' is refused
    (``ValueError`` naming the file and the field)."""
    merged: dict[tuple, dict] = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        theirs = data.get("args", {})
        for k in PROTOCOL:  # a field the file lacks: PROTOCOL_BEFORE's value, else not checked
            mine = getattr(args, k)
            value = theirs.get(k, PROTOCOL_BEFORE.get(k, mine))
            if value != mine:
                raise ValueError(f"--rows-from {path}: {k} is {value!r} there, "
                                 f"{mine!r} in this run: one protocol only")
        for r in data["rows"]:
            if r["method"] not in methods:
                continue
            # rows written before rows named their settings: the file's --wocar-set
            settings = r.get("wocar_set", theirs.get("wocar_set", []) if r["method"] == "wocar"
                             else [])
            r = dict(r, wocar_set=canonical_settings(settings), sources=[path])
            k = agent_key(r)
            merged[k] = merge_agent_rows(merged[k], r) if k in merged else r
    return list(merged.values())


def worst_cases(rows: list[dict]) -> dict[float, float]:
    """eps -> the lowest median return over the attacks at that eps (one agent's report rows)."""
    out: dict[float, float] = {}
    for r in rows:
        e = float(r["eps"])
        out[e] = min(out.get(e, np.inf), float(r["median"]))
    return out


def run_agent(method: str, seed: int, args) -> dict:
    """Train one agent and evaluate it; one JSON-able row."""
    import agents

    spec = robust_spec(method, args.robust_eps, args.kappa, wocar_settings(args.wocar_set))
    kw = {} if spec is None else {"robust": spec}
    agent = agents.PPO(env=args.env, seed=seed, backend="graph",
                       **key_values(args.agent_set, "--agent-set"), **kw)
    c0, t0 = time.process_time(), time.perf_counter()
    agent.learn(args.steps, progress_bar=False)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    clean = agent.evaluate(args.episodes, seed=10_000 + seed)
    report = agents.evaluate_under_attack(
        agent, args.attacks.split(","), [float(e) for e in args.eps.split(",")],
        n_episodes=args.episodes, seed=10_000 + seed, rs_steps=args.rs_steps,
        adversary_steps=args.adversary_steps)
    rows = [{"attack": str(r["attack"]), "eps": float(r["eps"]), "median": float(r["median"])}
            for r in report.rows]
    row = {"method": method, "seed": seed,
           "wocar_set": canonical_settings(args.wocar_set) if method == "wocar" else [],
           "natural": float(np.median(clean["returns"])),
           "worst": {str(e): v for e, v in worst_cases(rows).items()}, "attacks": rows,
           "train_cpu_seconds": cpu, "train_wall_seconds": wall, "load": os.getloadavg()[0]}
    print(json.dumps({k: row[k] for k in ("method", "wocar_set", "seed", "natural", "worst",
                                          "train_cpu_seconds")}), flush=True)
    return row


def worst_by_method(rows: list[dict], main_eps: float) -> dict[str, list[float]]:
    """Per method (:func:`label`'s names, in the rows' order), each seed's worst case at
    ``main_eps``."""
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(label(r), []).append(r["worst"][str(float(main_eps))])
    return out


def leaderboard(rows: list[dict], main_eps: float) -> dict:
    """Per method: natural and worst case (at ``main_eps``) summaries over seeds (median, IQM,
    bootstrap intervals), each attack's median over seeds and how many seeds it has, the median
    training CPU seconds, and ``"beats"``: for every other method, the probability that a seed
    of this method has the higher worst case (``agents.probability_of_improvement``, with its
    bootstrap interval). Methods are :func:`label`'s names (WocaR's settings apart)."""
    from agents.algorithms.many import probability_of_improvement, summarize_runs

    out, worst = {}, worst_by_method(rows, main_eps)
    for method in worst:
        mine = [r for r in rows if label(r) == method]
        per_attack: dict[str, list[float]] = {}
        for r in mine:
            for a in r["attacks"]:
                if np.isclose(a["eps"], main_eps):
                    per_attack.setdefault(a["attack"], []).append(a["median"])
        out[method] = {
            "natural": summarize_runs([r["natural"] for r in mine]),
            "worst": summarize_runs(worst[method]),
            "attacks": {k: float(np.median(v)) for k, v in per_attack.items()},
            "attack_seeds": {k: len(v) for k, v in per_attack.items()},
            "train_cpu_seconds": float(np.median([r["train_cpu_seconds"] for r in mine]))}
    for m in out:
        out[m]["beats"] = {o: probability_of_improvement(worst[m], worst[o])
                           for o in out if o != m}
    return out


def seed_power(x, y, counts, draws: int = 200, reps: int = 1000, confidence: float = 0.95,
               seed: int = 0) -> dict[int, float]:
    """How often ``n`` seeds per method would tell two methods apart, for each ``n`` of
    ``counts``: each method's measured worst cases (``x``, ``y``, one per seed) taken as its
    true distribution, ``n`` seeds drawn from each with replacement ``draws`` times, and the
    fraction of the draws whose probability-of-improvement interval
    (``agents.probability_of_improvement``, ``reps`` resamples at ``confidence``) excludes one
    half. A fraction near 1 says ``n`` seeds decide which method is better at the measured gap;
    near ``1 - confidence``, that they do not (the interval's own error rate). Resampling the
    measured seeds is a plug-in estimate: it takes the spread of a few seeds for the truth.

    >>> seed_power([300.0, 310.0], [100.0, 110.0], [5], draws=20, reps=200)  # far apart
    {5: 1.0}
    """
    from agents.algorithms.many import probability_of_improvement

    counts = [int(n) for n in counts]
    if not counts or min(counts) < 1:
        raise ValueError(f"counts must be seed counts >= 1, got {counts}")
    if int(draws) < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    a, b = np.asarray(x, np.float64), np.asarray(y, np.float64)
    rng = np.random.default_rng(seed)
    out = {}
    for n in counts:
        decided = 0
        for d in range(int(draws)):
            u, v = rng.choice(a, n), rng.choice(b, n)
            low, high = probability_of_improvement(u, v, confidence, reps, seed=d)["ci"]
            decided += low > 0.5 or high < 0.5
        out[n] = decided / int(draws)
    return out


def print_seed_power(rows: list[dict], main_eps: float, counts: list[int], draws: int) -> dict:
    """For each pair of methods (in the board's order), :func:`seed_power` over their worst
    cases at ``main_eps``: printed, and returned as ``{"m vs n": {"seeds": fraction, ...}}``
    (with the draws)."""
    worst = worst_by_method(rows, main_eps)
    methods, out = list(worst), {"draws": draws, "pairs": {}}
    for i, m in enumerate(methods):
        for n in methods[i + 1:]:
            t0 = time.process_time()
            power = seed_power(worst[m], worst[n], counts, draws)
            out["pairs"][f"{m} vs {n}"] = {str(k): v for k, v in power.items()}
            print(f"seeds per method that would tell {m} from {n} at worst@{main_eps} "
                  f"(resampling their {len(worst[m])} and {len(worst[n])} seeds, {draws} draws): "
                  + ", ".join(f"{k}: {100 * v:.0f}%" for k, v in power.items())
                  + f" ({time.process_time() - t0:.0f} s CPU)")
    return out


def print_table(board: dict, main_eps: float) -> None:
    def cell(s: dict, k: str) -> str:
        lo, hi = s[f"{k}_ci"]
        return f"{s[k]:6.1f} [{lo:5.1f}, {hi:5.1f}]"

    print(f"method    natural median [95% CI]   worst@{main_eps} median [95% CI]   "
          f"worst IQM [95% CI]       train CPU s")
    for m, b in board.items():
        print(f"{m:9s} {cell(b['natural'], 'median')}   {cell(b['worst'], 'median')}   "
              f"{cell(b['worst'], 'iqm')}   {b['train_cpu_seconds']:8.1f}")
        n = b["natural"]["n"]
        print("          " + ", ".join(
            f"{a} {v:.1f}" + ("" if b["attack_seeds"][a] == n else
                              f" ({b['attack_seeds'][a]} seeds)")
            for a, v in b["attacks"].items()))
    methods = list(board)
    for i, m in enumerate(methods):  # one line per pair: P(n > m) is 1 - P(m > n)
        for n in methods[i + 1:]:
            pi = board[m]["beats"][n]
            print(f"P({m} > {n}) worst@{main_eps} = {pi['p']:.2f} "
                  f"[{pi['ci'][0]:.2f}, {pi['ci'][1]:.2f}] ({pi['n_x']} and {pi['n_y']} seeds)")


def plot(rows: list[dict], path: str, env: str) -> None:
    """Worst-case return against eps per method (median over seeds, min-max band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for method in dict.fromkeys(label(r) for r in rows):
        mine = [r["worst"] for r in rows if label(r) == method]
        eps = sorted(float(e) for e in mine[0])
        vals = np.array([[w[str(e)] for e in eps] for w in mine])
        ax.plot(eps, np.median(vals, 0), marker="o", label=method)
        ax.fill_between(eps, vals.min(0), vals.max(0), alpha=0.15)
    ax.set_xlabel("attack budget eps (L-inf)")
    ax.set_ylabel("worst-case return (lowest attack median)")
    ax.set_title(f"{env}: worst case over attacks, median over seeds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _write(path: str, args, rows: list[dict], board: dict | None, power: dict | None = None
           ) -> None:
    """The run's JSON: its arguments, one row per agent, the leaderboard (``None`` until every
    agent is done) and, with ``--seed-power``, :func:`print_seed_power`'s fractions."""
    out = {"args": vars(args), "rows": rows, "leaderboard": board}
    if power is not None:
        out["seed_power"] = power
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--robust-eps", type=float, default=0.05, help="every method's training eps")
    p.add_argument("--kappa", type=float, default=None,
                   help="SA/WocaR/ATLA+SA regulariser weight (default: the preset's; "
                        f"ATLA+SA {ATLA_SA_KAPPA})")
    p.add_argument("--wocar-set", action="append", default=[], metavar="KEY=VALUE",
                   help="an agents.WocaR field of the wocar agents (JSON value), e.g. "
                        "gamma=0.995; repeatable")
    p.add_argument("--agent-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a PPO config field of every agent (JSON value), e.g. "
                        "hidden_sizes=[128,128]; repeatable; part of the protocol")
    p.add_argument("--attacks", default=ATTACKS)
    p.add_argument("--eps", default="0.02,0.05,0.1", help="evaluation budgets (comma-separated)")
    p.add_argument("--main-eps", type=float, default=0.05, help="the leaderboard's eps")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--rs-steps", type=int, default=10_000)
    p.add_argument("--adversary-steps", type=int, default=100_000)
    p.add_argument("--quick", action="store_true", help="smoke run (module doc)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--figure", default=None, help="PNG of worst case against eps")
    p.add_argument("--rows-from", nargs="*", default=[],
                   help="JSON files of earlier runs (--json): their agents of --methods are "
                        "taken as they are (one agent's rows merged, the protocol checked), "
                        "the others trained")
    p.add_argument("--seed-power", default=None, metavar="N,N,...",
                   help="for each pair of methods, how often N seeds per method would tell them "
                        "apart (seed_power: resampling the measured worst cases), e.g. "
                        "10,20,40,80,160")
    p.add_argument("--power-draws", type=int, default=200,
                   help="draws per seed count of --seed-power (default 200)")
    args = p.parse_args(argv)
    counts = []
    if args.seed_power is not None:
        try:
            counts = [int(n) for n in args.seed_power.split(",")]
        except ValueError:
            p.error(f"--seed-power: comma-separated seed counts, got {args.seed_power!r}")
        if not counts or min(counts) < 1:
            p.error(f"--seed-power: seed counts must be >= 1, got {args.seed_power!r}")
    if args.power_draws < 1:
        p.error(f"--power-draws must be >= 1, got {args.power_draws}")
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
        args.main_eps = float(args.eps)
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        p.error(f"--methods: {', '.join(unknown) or 'none given'} not among {', '.join(METHODS)}")
    if not any(np.isclose(float(e), args.main_eps) for e in args.eps.split(",")):
        p.error(f"--main-eps {args.main_eps} is not one of --eps {args.eps}")
    if args.threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(args.threads, 2))
    try:
        agent_settings(args.agent_set, args.env)
        args.agent_set = canonical_settings(args.agent_set, "--agent-set")
        wocar_set = canonical_settings(args.wocar_set)
        # agents already trained and evaluated by earlier runs, one row per agent
        rows = load_rows(args.rows_from, args, methods)
    except (ValueError, OSError) as e:
        p.error(str(e))
    beyond: dict[str, list[int]] = {}
    for r in rows:  # taken as they are: said, so a board over more seeds is never a surprise
        if int(r["seed"]) not in args.seeds:
            beyond.setdefault(label(r), []).append(int(r["seed"]))
    if beyond:
        print("--rows-from: the leaderboard also counts seeds outside --seeds: " + "; ".join(
            f"{m} {', '.join(map(str, sorted(s)))}" for m, s in beyond.items()))
    done = {agent_key(r) for r in rows}
    for m in methods:
        for s in args.seeds:
            if (m, s, tuple(wocar_set if m == "wocar" else ())) in done:
                continue
            rows.append(run_agent(m, s, args))
            if args.json:  # after every agent: a run stopped midway keeps what it measured
                _write(args.json, args, rows, None)
    board = leaderboard(rows, args.main_eps)
    print_table(board, args.main_eps)
    power = (print_seed_power(rows, args.main_eps, counts, args.power_draws)
             if counts else None)
    if args.json:
        _write(args.json, args, rows, board, power)
    if args.figure:
        plot(rows, args.figure, args.env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
