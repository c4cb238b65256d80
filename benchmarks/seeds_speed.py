"""Many seeds against one seed, per CPU second: ``agents.train_many`` before and after a change.

PPO CartPole-v1 on the graph backend with the shipped ``ppo-CartPole-v1`` preset (``--settings
preset``: 8 envs x 32 steps, 20 epochs of one 256-row minibatch, so the update dominates) or
PureJaxRL's CartPole settings (``--settings purejaxrl``: ``PPOConfig()`` with 4 envs x 128 steps,
4 epochs, 4 minibatches, lr 2.5e-4 annealed, tanh 64x64, as issue 22 quotes them). Rows, each in
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

``--algo dqn`` (issue 22, "DQN 8 seeds against 8 sequential runs"): DQN CartPole-v1 with the
shipped ``dqn-CartPole-v1`` preset (train_freq 256, 128 gradient steps of 64 rows, 256x256 net),
``--seeds`` seeds in one program (``agents.DQN(num_seeds=S)``: the seed axis) against ``S``
sequential one-seed runs (``agents.DQN(seed=s)``, one after the other in one process), the same
env steps per seed, on the graph backend and on the gymnasium backend (rows interleaved)::

    python benchmarks/seeds_speed.py --algo dqn --steps 20000 --seeds 8

Each child first trains a tiny untimed agent (TensorFlow's start-up), then a short run up to the
first gradient phase (``learning_starts`` rounded up to whole iterations: tracing and compiling
of one agent), then the full runs. Steady rate: ``S * (steps - short) / (full - k * short)`` with
``k`` the number of agents the full runs build (1 on the seed axis, ``S`` sequential: each
sequential agent traces and compiles its own functions); ``incl. compile``: ``S * steps / full``.

``--algo sa-ppo`` (robust training on the seed axis): SA-PPO on CartPole-v1, the shipped
``ppo-CartPole-v1`` preset with ``robust="sa"`` (PGD inner max, 10 steps; kappa 3 from the
preset) at ``--eps`` (default 0.05), on the graph backend: ``--seeds`` seeds in one program
(``agents.PPO(num_seeds=S)``) against ``S`` sequential one-seed runs, timed as the DQN rows (the
short run is one iteration), with each seed's clean deterministic return at the end::

    python benchmarks/seeds_speed.py --algo sa-ppo --steps 30000 --seeds 4

``--algo atla-ppo`` (ATLA on the seed axis): the same with ``robust="atla"`` (each seed against
its own learned adversary, :mod:`agents.robustness.atla`; the preset's warm-up 0.75); the short run is two
iterations (the adversaries first learn, and trace, in the second: at the first the schedule's eps
is 0). Steps are the agent's env steps; its adversaries take as many again (not counted)::

    python benchmarks/seeds_speed.py --algo atla-ppo --steps 20000 --seeds 4

``--algo wocar-ppo`` (WocaR on the seed axis): the same with ``robust="wocar"`` (each seed's
worst-attack critic, admissible sets and smoothness term; :mod:`agents.robustness.wocar`, its
default warm-up 0.3); the short run is one iteration. ``--threads N`` pins each child's
TensorFlow pools (intra-op ``N``, inter-op ``max(N, 2)``, as ``robust_rl_wocar.py``)::

    python benchmarks/seeds_speed.py --algo wocar-ppo --steps 20000 --seeds 3 --threads 1
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


def _presets():
    """The module holding ``make_config`` and ``AUTO`` in the tree being measured: today
    ``agents.core.presets``; ``agents.core.config`` in trees before the presets moved (so that
    ``--compare-tree`` can measure them)."""
    import importlib

    try:
        module = importlib.import_module("agents.core.presets")
    except ImportError:
        module = None
    if module is None or not hasattr(module, "make_config"):  # an older tree's presets module
        module = importlib.import_module("agents.core.config")
    return module


def _child(kind: str, n_seeds: int, steps: int, settings: str) -> dict:
    import agents

    if settings == "preset":
        cfg = _presets().make_config(agents.PPOConfig, "ppo", _presets().AUTO,
                                        env="CartPole-v1", backend="graph")
    else:
        cfg = _presets().make_config(agents.PPOConfig, "ppo", None, env="CartPole-v1",
                                        backend="graph", num_envs=4)
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


def _dqn_child(kind: str, n_seeds: int, steps: int, backend: str) -> dict:
    import agents

    cfg = _presets().make_config(agents.DQNConfig, "dqn", _presets().AUTO,
                                    env="CartPole-v1", backend=backend)
    per_iteration = cfg.train_freq * cfg.num_envs
    short = -(-max(cfg.learning_starts, cfg.batch_size) // per_iteration) * per_iteration
    agents.DQN(cfg, hidden_sizes=(8,), learning_starts=0, train_freq=8, gradient_steps=1,
               buffer_size=64).learn(16, progress_bar=False)  # start-up, untimed

    return _axis_against_sequential(agents.DQN, cfg, kind, n_seeds, short, steps, episodes=5)


ROBUST = {"sa-ppo": ("sa", 1), "atla-ppo": ("atla", 2), "wocar-ppo": ("wocar", 1)}
"""``--algo`` -> (``robust``, iterations of the short run)."""


def _sa_ppo_child(kind: str, n_seeds: int, steps: int, eps: float, algo: str = "sa-ppo"
                  ) -> dict:
    import agents

    robust, iterations = ROBUST[algo]
    cfg = _presets().make_config(agents.PPOConfig, "ppo", _presets().AUTO,
                                    env="CartPole-v1", backend="graph", robust=robust,
                                    robust_eps=eps)
    # tracing and compiling of one agent (ATLA: and of its adversaries, from the 2nd iteration)
    short = iterations * cfg.n_steps * cfg.num_envs
    for n in (1, 2):  # start-up and the attack code's first use, untimed (tiny agents)
        agents.PPO(cfg, n_steps=4, num_envs=1, n_epochs=1, num_seeds=n).learn(
            4, progress_bar=False)

    return _axis_against_sequential(agents.PPO, cfg, kind, n_seeds, short, steps, episodes=10)


def _axis_against_sequential(cls, cfg, kind: str, n_seeds: int, short: int, steps: int,
                             episodes: int) -> dict:
    """Train ``n_seeds`` agents of ``cls`` on the seed axis (``kind == "axis"``: one agent with
    ``num_seeds``) or one after the other, once for ``short`` steps (tracing, compiling, the
    first phase: once for the axis, once per sequential agent) and once for ``steps``; the steady
    rate takes the short runs out by difference."""

    def run(budget, seeds):
        if kind == "axis":
            many = cls(cfg, num_seeds=len(seeds), seed=seeds[0])
            many.learn(budget, progress_bar=False)
            return [many.export(k) for k in range(len(seeds))] if len(seeds) > 1 else [many]
        out = []
        for s in seeds:  # one seed after the other, each its own agent
            one = cls(cfg, seed=s)
            one.learn(budget, progress_bar=False)
            out.append(one)
        return out

    times = {}
    for name, budget, seeds in (("short", short, list(range(n_seeds)) if kind == "axis" else [0]),
                                ("full", steps, list(range(n_seeds)))):
        cpu, wall = time.process_time(), time.perf_counter()
        trained = run(budget, seeds)
        times[name] = (time.process_time() - cpu, time.perf_counter() - wall)
    done = int(trained[0].num_timesteps.numpy())  # whole iterations
    builds = 1 if kind == "axis" else n_seeds
    cpu_s = times["full"][0] - builds * times["short"][0]
    wall_s = times["full"][1] - builds * times["short"][1]
    returns = [a.evaluate(episodes)["mean_return"] for a in trained]
    return {"steps_per_cpu_second": (done - short) * n_seeds / cpu_s,
            "steps_per_wall_second": (done - short) * n_seeds / wall_s,
            "incl_compile_steps_per_cpu_second": done * n_seeds / times["full"][0],
            "incl_compile_steps_per_wall_second": done * n_seeds / times["full"][1],
            "compile_cpu_s": times["short"][0], "compile_wall_s": times["short"][1],
            "full_cpu_s": times["full"][0], "full_wall_s": times["full"][1],
            "steps_per_seed": done, "eval_returns": returns, "seeds": n_seeds}


def _run(kind, n, steps, settings, tree=None, eps=None, threads=None) -> dict:
    script = os.path.abspath(__file__)
    env = dict(os.environ)
    cwd = None
    if tree is not None:
        env["PYTHONPATH"] = os.path.abspath(tree)
        cwd = os.path.abspath(tree)
    cmd = [sys.executable, script, "--part", kind, "--n", str(n), "--steps", str(steps),
           "--settings", settings]
    if eps is not None:
        cmd += ["--eps", str(eps)]
    if threads:
        cmd += ["--threads", str(threads)]
    if tree is not None:  # the child must import that tree's packages, not this one's
        cmd += ["--root", os.path.abspath(tree)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{kind} x{n} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def _show_axis_row(label: str, row: dict, tail: str) -> None:
    """One timed row of the seed-axis mains (steady and with-compile rates, costs), then
    ``tail`` (returns)."""
    print(f"{label}: {row['steps_per_cpu_second']:7.0f} steps/CPU s, "
          f"{row['steps_per_wall_second']:7.0f} steps/wall s steady; incl. compile "
          f"{row['incl_compile_steps_per_cpu_second']:7.0f} /CPU s, "
          f"{row['incl_compile_steps_per_wall_second']:7.0f} /wall s; compile "
          f"{row['compile_cpu_s']:5.1f} CPU s ({row['compile_wall_s']:5.1f} wall) per "
          f"agent; full {row['full_cpu_s']:.0f} CPU s ({row['full_wall_s']:.0f} wall); "
          f"{tail}", flush=True)


def _show_axis_ratio(label: str, axis: dict, sequential: dict) -> None:
    """The seed axis' rates over the sequential runs', steady and including compile."""
    r = {k: axis[k] / sequential[k] for k in (
        "steps_per_cpu_second", "steps_per_wall_second", "incl_compile_steps_per_cpu_second",
        "incl_compile_steps_per_wall_second")}
    print(f"{label}: seed axis / sequential = {r['steps_per_cpu_second']:.2f}x per CPU s, "
          f"{r['steps_per_wall_second']:.2f}x per wall s steady; "
          f"{r['incl_compile_steps_per_cpu_second']:.2f}x per CPU s, "
          f"{r['incl_compile_steps_per_wall_second']:.2f}x per wall s incl. compile")


def _finish(load: tuple, rows: dict, **record) -> None:
    """The load average before and after, and every row as JSON with ``record``."""
    after = os.getloadavg()
    print(f"load average before: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, after: "
          f"{after[0]:.1f} {after[1]:.1f} {after[2]:.1f} on {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(json.dumps({"rows": rows, "load_before": load, "load_after": after, **record}))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=50_000, help="env steps per seed")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--settings", default="preset", choices=("preset", "purejaxrl"))
    p.add_argument("--compare-tree", default=None, help="also this checkout's rows (before)")
    p.add_argument("--algo", default="ppo", choices=("ppo", "dqn", *ROBUST),
                   help="dqn, sa-ppo, atla-ppo: S seeds on the seed axis against S sequential "
                        "runs (module doc)")
    p.add_argument("--eps", type=float, default=0.05,
                   help="sa-ppo, atla-ppo: the training radius")
    p.add_argument("--threads", type=int, default=None,
                   help="TensorFlow threads of each child (intra-op; inter-op at least 2)")
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.part is not None:
        if args.root:
            sys.path[0:1] = [args.root]
        if args.threads:
            import tensorflow as tf

            tf.config.threading.set_intra_op_parallelism_threads(args.threads)
            tf.config.threading.set_inter_op_parallelism_threads(max(args.threads, 2))
        if args.part.startswith(("sappo-", "atlappo-", "wocarppo-")):
            algo, kind = args.part.split("-")
            row = _sa_ppo_child(kind, args.n, args.steps, args.eps,
                                {"sappo": "sa-ppo", "atlappo": "atla-ppo",
                                 "wocarppo": "wocar-ppo"}[algo])
        elif args.part.startswith("dqn-"):
            _, kind, backend = args.part.split("-")
            row = _dqn_child(kind, args.n, args.steps, backend)
        else:
            row = _child(args.part, args.n, args.steps, args.settings)
        print("RESULT " + json.dumps(row), flush=True)
        return
    if args.algo == "dqn":
        return _dqn_main(args)
    if args.algo in ROBUST:
        return _sa_ppo_main(args)
    load = os.getloadavg()
    plan = [("ppo", 1), ("many", 1), ("many", args.seeds)]
    rows = {}
    for kind, n in plan:
        for label, tree in (("this", None), ("compared", args.compare_tree)):
            if label == "compared" and tree is None:
                continue
            name = f"{label} {kind} x{n}"
            row = rows[name] = _run(kind, n, args.steps, args.settings, tree)
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
    _finish(load, rows, steps=args.steps, settings=args.settings)


def _dqn_main(args) -> None:
    load = os.getloadavg()
    rows = {}
    for backend in ("graph", "gymnasium"):
        for kind in ("sequential", "axis"):
            name = f"dqn {backend} {kind} x{args.seeds}"
            row = rows[name] = _run(f"dqn-{kind}-{backend}", args.seeds, args.steps,
                                    args.settings)
            _show_axis_row(name.rjust(30), row,
                           f"returns {[round(r) for r in row['eval_returns']]}")
    for backend in ("graph", "gymnasium"):
        _show_axis_ratio(backend, *(rows[f"dqn {backend} {k} x{args.seeds}"]
                                    for k in ("axis", "sequential")))
    axis = {b: rows[f"dqn {b} axis x{args.seeds}"]["steps_per_cpu_second"]
            for b in ("graph", "gymnasium")}
    print(f"seed axis: graph / gymnasium = {axis['graph'] / axis['gymnasium']:.2f}x per CPU s")
    _finish(load, rows, steps=args.steps, algo="dqn")


def _sa_ppo_main(args) -> None:
    load = os.getloadavg()
    rows = {}
    algo = args.algo
    for kind in ("sequential", "axis"):
        name = f"{algo} {kind} x{args.seeds}"
        row = rows[name] = _run(f"{algo.replace('-', '')}-{kind}", args.seeds, args.steps,
                                args.settings, eps=args.eps, threads=args.threads)
        _show_axis_row(name.rjust(24), row,
                       f"{row['steps_per_seed']} steps per seed; clean returns "
                       f"{[round(r, 1) for r in row['eval_returns']]}")
    _show_axis_ratio(f"{algo.upper()} eps {args.eps}",
                     *(rows[f"{algo} {k} x{args.seeds}"] for k in ("axis", "sequential")))
    _finish(load, rows, steps=args.steps, algo=algo, eps=args.eps, threads=args.threads)


if __name__ == "__main__":
    main()
