"""Many seeds against one seed, per CPU second: ``agents.train_many`` before and after a change.

PPO CartPole-v1 with the shipped ``ppo-CartPole-v1`` preset on the graph backend. Rows, each in
its own subprocess, this tree's and (``--compare-tree DIR``) another checkout's interleaved in one
run so that both see the same load::

    python benchmarks/seeds_speed.py --steps 50000 --seeds 8 --compare-tree /tmp/before

* ``x1``: ``agents.train_many(config, seeds=[0], steps)`` (one seed through the many-seeds path);
* ``xS``: ``agents.train_many(config, seeds=range(S), steps)``;
* ``ppo``: ``agents.PPO(config).learn(steps)`` (the ordinary single agent).

Only the public API is used, so the script measures any tree that has it. Compilation is taken
out by difference: each child first trains one iteration (``short``: import warm-up, tracing,
compile), then the full ``steps`` from scratch (which traces again); the steady rate is
``(steps - one iteration) * seeds / (full - short)`` in CPU seconds (``time.process_time``, all
threads of the child) and in wall seconds. Compile/trace time is the short run's. The load
average before and after is printed: these machines are shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[0:1] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]


def _child(kind: str, n_seeds: int, steps: int) -> dict:
    import agents

    cfg = agents.config.make_config(agents.PPOConfig, "ppo", agents.config.AUTO,
                                    env="CartPole-v1", backend="graph")
    per_iteration = cfg.n_steps * cfg.num_envs

    def run(budget):
        if kind == "ppo":
            return [agents.PPO(cfg).learn(budget, progress_bar=False)]
        return agents.train_many(cfg, seeds=list(range(n_seeds)), steps=budget)

    times = {}
    for name, budget in (("short", per_iteration), ("full", steps)):
        cpu, wall = time.process_time(), time.perf_counter()
        trained = run(budget)
        times[name] = (time.process_time() - cpu, time.perf_counter() - wall)
    work = (steps - per_iteration) * n_seeds
    cpu_s = times["full"][0] - times["short"][0]
    wall_s = times["full"][1] - times["short"][1]
    returns = [a.evaluate(10)["mean_return"] for a in trained]
    return {"steps_per_cpu_second": work / cpu_s, "steps_per_wall_second": work / wall_s,
            "compile_cpu_s": times["short"][0], "compile_wall_s": times["short"][1],
            "full_cpu_s": times["full"][0], "full_wall_s": times["full"][1],
            "eval_returns": returns, "seeds": n_seeds}


def _run(kind, n, steps, tree=None) -> dict:
    script = os.path.abspath(__file__)
    env = dict(os.environ)
    cwd = None
    if tree is not None:
        env["PYTHONPATH"] = os.path.abspath(tree)
        cwd = os.path.abspath(tree)
    cmd = [sys.executable, script, "--part", kind, "--n", str(n), "--steps", str(steps)]
    if tree is not None:  # the child must import that tree's packages, not this one's
        cmd += ["--root", os.path.abspath(tree)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{kind} x{n} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=50_000, help="env steps per seed")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--compare-tree", default=None, help="also this checkout's rows (before)")
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.part is not None:
        if args.root:
            sys.path[0:1] = [args.root]
        print("RESULT " + json.dumps(_child(args.part, args.n, args.steps)), flush=True)
        return
    load = os.getloadavg()
    plan = [("ppo", 1), ("many", 1), ("many", args.seeds)]
    rows = {}
    for kind, n in plan:
        for label, tree in (("this", None), ("compared", args.compare_tree)):
            if label == "compared" and tree is None:
                continue
            name = f"{label} {kind} x{n}"
            row = rows[name] = _run(kind, n, args.steps, tree)
            print(f"{name:>20}: {row['steps_per_cpu_second']:8.0f} steps/CPU s, "
                  f"{row['steps_per_wall_second']:8.0f} steps/wall s, compile "
                  f"{row['compile_cpu_s']:5.1f} CPU s ({row['compile_wall_s']:5.1f} wall), "
                  f"returns {[round(r) for r in row['eval_returns']]}", flush=True)
    for label in ("this", "compared") if args.compare_tree else ("this",):
        cpu = {k: v["steps_per_cpu_second"] for k, v in rows.items() if k.startswith(label)}
        print(f"{label}: many x{args.seeds} / many x1 = "
              f"{cpu[f'{label} many x{args.seeds}'] / cpu[f'{label} many x1']:.2f}x, "
              f"many x{args.seeds} / ppo x1 = "
              f"{cpu[f'{label} many x{args.seeds}'] / cpu[f'{label} ppo x1']:.2f}x per CPU s")
    if args.compare_tree:
        for kind, n in plan:
            a, b = rows[f"this {kind} x{n}"], rows[f"compared {kind} x{n}"]
            print(f"{kind} x{n}: this / compared = "
                  f"{a['steps_per_cpu_second'] / b['steps_per_cpu_second']:.2f}x per CPU s, "
                  f"{a['steps_per_wall_second'] / b['steps_per_wall_second']:.2f}x per wall s")
    after = os.getloadavg()
    print(f"load average before: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, after: "
          f"{after[0]:.1f} {after[1]:.1f} {after[2]:.1f} on {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(json.dumps({"rows": rows, "load_before": load, "load_after": after,
                      "steps": args.steps}))


if __name__ == "__main__":
    main()
