"""WocaR's training CPU against the vanilla agent's (issue 37, CartPole clause 3: at most 1.5x).

Each run is its own process (so each pays its own warm-up, as a user's ``train-agent`` does):
``agents.PPO(env="CartPole-v1", seed=s, backend="graph", robust=agents.WocaR(eps=0.05, ...))``
as the leaderboard builds it (``benchmarks/robust_rl_leaderboard.py``; vanilla without
``robust``), ``learn(steps)`` timed by ``time.process_time()`` (the process's CPU, all threads)
and wall clock, with the first iteration (tracing and the first call) and the steady iteration
(the median CPU of the second half's iterations, from a per-iteration callback) apart, and a
SHA-256 of the final weights (``agent.get_weights()``, and apart the worst-attack networks':
a change of computation shows as other bits). Runs are interleaved per seed (vanilla, then each WocaR
variant); ``--tree LABEL=PATH`` runs a WocaR variant from another source tree (a snapshot of
an earlier commit: before/after in the same minutes). Prints one JSON line per run and a table
of medians with each WocaR variant's CPU ratio to vanilla's::

    python benchmarks/robust_rl_wocar_cpu.py --seeds 0 1 2 --threads 1 \\
        --tree before=/tmp/snap_before --tree after=/tmp/snap_after

``--variant LABEL=JSON`` runs a WocaR variant of this tree with more ``agents.WocaR`` fields (a
JSON object, its ``bound`` before ``--bound``), e.g. ``--variant 'warmup75={"warmup": 0.75}'``;
``--bound default`` leaves the bound at WocaR's default (IBP). A run alone: ``--run wocar --seed
0`` (``--run vanilla``). ``--algo a2c``, ``--env``, ``--eps``: another agent, environment and
radius than WocaR-PPO on CartPole at 0.05 (e.g. WocaR-A2C on Pendulum-v1 at 0.2: its Box-action
critic budget, docs/benchmarks/robust-rl.md, "WocaR-A2C on Box actions"); each WocaR row also
keeps the last logged ``wocar_worst_q`` (the worst-attack critic's mean value on the rollout: its
scale says whether the critic has caught up with the returns). Timed figures go in
docs/benchmarks/robust-rl.md with the command, the date, the load and the commit.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time

import numpy as np

# this directory holds a benchmarks/agents.py: without it on the path, ``import agents`` is the
# package of PYTHONPATH (each --tree's own), not the script's tree
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


@functools.cache
def _weights_digest():
    """``seeded_identity.py``'s ``weights_digest`` (SHA-256 over each array's dtype, shape and
    bytes, in order), loaded once from its file: this directory is off ``sys.path``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_seeded_identity",
                                                  os.path.join(_HERE, "seeded_identity.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.weights_digest


def _digest(arrays) -> str:
    return _weights_digest()(arrays)


def one_run(kind: str, seed: int, steps: int, bound: str | None, threads: int | None,
            fields: dict | None = None, algo: str = "ppo", env: str = "CartPole-v1",
            eps: float = 0.05) -> dict:
    """Train one agent in this process; its timings and weight digest as a dict. ``fields``:
    more ``agents.WocaR`` fields of a WocaR run (a ``bound`` there wins over ``bound``);
    ``algo`` (``"ppo"``, ``"a2c"``), ``env`` and ``eps`` the agent, its environment and radius."""
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(threads, 2))
    import agents

    settings = ({} if bound is None else {"bound": bound}) | (fields or {})
    kw = {} if kind == "vanilla" else {"robust": agents.WocaR(eps=eps, **settings)}
    agent = {"ppo": agents.PPO, "a2c": agents.A2C}[algo](env=env, seed=seed, backend="graph",
                                                        **kw)
    marks: list[float] = []
    worst_q: list[float] = []

    def tick(_agent, logs):
        marks.append(time.process_time())
        if "wocar_worst_q" in logs:
            worst_q.append(float(logs["wocar_worst_q"]))

    c0, t0 = time.process_time(), time.perf_counter()
    agent.learn(steps, callbacks=tick, progress_bar=False)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    per_iter = np.diff([c0] + marks)
    plugin = agent.robustness
    critic = list(plugin.critic.variables) + list(plugin.target.variables) \
        if hasattr(plugin, "critic") else []
    return {"kind": kind, "bound": getattr(plugin, "bound", None), "seed": seed,
            "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
            "first_iter_s": round(float(per_iter[0]), 3),
            "steady_ms": round(1e3 * float(np.median(per_iter[len(per_iter) // 2:])), 2),
            "iterations": len(per_iter), "sha256": _digest(agent.get_weights())[:12],
            "critic_sha256": _digest([v.numpy() for v in critic])[:12],
            "worst_q": round(worst_q[-1], 3) if worst_q else None,
            "critic_steps": int(plugin.critic_optimizer.iterations.numpy())
            if hasattr(plugin, "critic_optimizer") else 0,
            "load": round(os.getloadavg()[0], 2), "tree": os.path.dirname(
                os.path.dirname(os.path.abspath(agents.__file__)))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", choices=("vanilla", "wocar"), help="one run in this process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--bound", default="crown-ibp",
                   help="WocaR's wocar_bound ('default': leave it unset)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                   help="a WocaR variant run with PYTHONPATH=PATH (default: this process's)")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL=JSON",
                   help="a WocaR variant of this tree with more agents.WocaR fields (a JSON "
                        "object), e.g. 'warmup75={\"warmup\": 0.75}'")
    p.add_argument("--fields", default=None, help="with --run: the WocaR fields (JSON object)")
    p.add_argument("--vanilla-tree", default=None,
                   help="PYTHONPATH of the vanilla runs (default: this process's)")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--algo", choices=("ppo", "a2c"), default="ppo")
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--eps", type=float, default=0.05, help="WocaR's radius (default 0.05)")
    args = p.parse_args(argv)
    if not args.eps > 0:
        p.error(f"--eps must be > 0, got {args.eps}")
    bound = None if args.bound == "default" else args.bound
    if args.run:
        fields = None if args.fields is None else json.loads(args.fields)
        print(json.dumps(one_run(args.run, args.seed, args.steps, bound, args.threads, fields,
                                 args.algo, args.env, args.eps)), flush=True)
        return 0
    variants = []
    for v in args.variant:
        label, _, text = v.partition("=")
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as exc:
            p.error(f"--variant {v!r}: the fields are not JSON ({exc})")
        if not label or not isinstance(fields, dict):
            p.error(f"--variant {v!r}: expected LABEL={{...}} (a JSON object of agents.WocaR "
                    f"fields)")
        variants.append((label, None, fields))
    # (label, PYTHONPATH, WocaR fields) of each WocaR run
    trees = [(*t.partition("=")[::2], None) for t in args.tree] + variants or \
        [("wocar", None, None)]
    rows = []
    for seed in args.seeds:
        for label, kind, path, fields in [("vanilla", "vanilla", args.vanilla_tree, None)] + \
                [(lab, "wocar", pth, flds) for lab, pth, flds in trees]:
            env = dict(os.environ)
            if path:
                env["PYTHONPATH"] = path
            cmd = [sys.executable, os.path.abspath(__file__), "--run", kind, "--seed", str(seed),
                   "--steps", str(args.steps), "--bound", args.bound,
                   "--threads", str(args.threads), "--algo", args.algo, "--env", args.env,
                   "--eps", str(args.eps)]
            if fields is not None:
                cmd += ["--fields", json.dumps(fields)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["label"] = label
            rows.append(row)
            print(json.dumps(row), flush=True)
    labels = ["vanilla"] + [lab for lab, _, _ in trees]
    van = np.median([r["cpu_s"] for r in rows if r["label"] == "vanilla"])
    print("\n| run | CPU s per seed | median CPU s | ratio to vanilla | steady ms | first iter s "
          "| critic steps | last worst_q |")
    print("|---|---|---|---|---|---|---|---|")
    for lab in labels:
        mine = [r for r in rows if r["label"] == lab]
        med = float(np.median([r["cpu_s"] for r in mine]))
        cols = [" / ".join(f"{r[k]:{fmt}}" for r in mine)
                for k, fmt in (("cpu_s", ".2f"), ("steady_ms", ".1f"), ("first_iter_s", ".2f"))]
        steps = " / ".join(str(r.get("critic_steps", 0)) for r in mine)
        wq = " / ".join("-" if r.get("worst_q") is None else f"{r['worst_q']:.1f}" for r in mine)
        print(f"| {lab} | {cols[0]} | {med:.2f} | {med / van:.2f}x | {cols[1]} | {cols[2]} "
              f"| {steps} | {wq} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
