"""PPO training speed on CartPole-v1: gymnasium backend vs graph backend vs many seeds at once.

Side by side in one invocation, each measurement in its own subprocess (so peak memory is
that measurement's own), the same hyper-parameters everywhere (``--settings preset``: the
shipped ``ppo-CartPole-v1`` preset, rl-zoo's; ``defaults``: ``PPOConfig()``)::

    python benchmarks/agents_speed.py --steps 100000 --seeds 8
    python benchmarks/agents_speed.py --steps 100000 --seeds 8 --xla   # jit_compile=True too
    python benchmarks/agents_speed.py --dqn-steps 20000                # + DQN gymnasium vs graph
    python benchmarks/agents_speed.py --compare-tree /tmp/old_checkout  # + that tree's rows

Rows:

* ``gymnasium``: ``agents.PPO(backend="gymnasium")``, one seed; the env steps through
  ``tf.numpy_function`` (Python per step).
* ``graph``: ``agents.PPO(backend="graph")``, one seed; rollout + targets + update in one
  compiled call.
* ``stacked xS``: ``agents.PPO(config, num_seeds=S)`` (the seed axis ``agents.train_many`` runs),
  S = 1 and ``--seeds``; aggregate env steps per second over all seeds.
* ``dqn gymnasium`` / ``dqn graph`` (with ``--dqn-steps N``): ``agents.DQN`` with the
  ``dqn-CartPole-v1`` preset's hyper-parameters (no periodic evaluation) for ``N`` steps; the
  graph backend collects and trains in one compiled call per iteration.
* ``--compare-tree DIR``: the ``gymnasium`` and ``graph`` rows once more from another checkout
  (``DIR/benchmarks/agents_speed.py`` in its own subprocess), interleaved with this tree's, so a
  change is measured before/after in one run under the same load.

Throughput is env steps per second of training, timed after the first iteration (tracing and
compilation excluded, reported separately as ``first_iteration_s``). Every seed is evaluated
at the end (20 deterministic episodes on the gymnasium env) against the preset's return
target. ``breakdown`` splits one iteration into env, policy (rollout minus env) and update
(iteration minus rollout), in milliseconds, timed over repeated calls of the compiled pieces.
Peak memory is the subprocess's maximum resident set size. Stable-Baselines3 is not run here
(it needs PyTorch in a second interpreter: ``benchmarks/agents_vs_sb3.py``); compare with the
SB3 figure that script measured (README), on the same machine but under its own load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# run as a script, benchmarks/agents.py would shadow the agents package: use the repo root
sys.path[0:1] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]


def _config(settings: str, backend: str, xla: bool):
    import agents

    preset = agents.core.presets.AUTO if settings == "preset" else None
    return agents.core.presets.make_config(agents.PPOConfig, "ppo", preset, env="CartPole-v1",
                              backend=backend, jit_compile=xla)


def _timed(fn, repeat: int) -> float:
    import tensorflow as tf

    fn()  # traced
    start = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    tf.nest.map_structure(lambda x: x.numpy() if hasattr(x, "numpy") else x, out)
    return (time.perf_counter() - start) / repeat * 1e3


def _breakdown(agent, repeat: int = 5) -> dict:
    """Milliseconds per iteration: env, policy, update (compiled pieces timed alone)."""
    import numpy as np
    import tensorflow as tf

    cfg = agent.config
    agent._reset_env()
    # as the iteration compiles it: with XLA only on the graph backend (the gymnasium rollout
    # steps its env through tf.numpy_function, which XLA cannot compile; its update is jitted)
    rollout = tf.function(agent._rollout_graph,
                          jit_compile=cfg.jit_compile and cfg.backend == "graph")
    rollout_ms = _timed(rollout, repeat)
    if cfg.backend == "graph":
        iteration_ms = _timed(agent._iteration, repeat)
        env = agent.env

        @tf.function
        def env_only():  # n_steps env steps as the rollout takes them (state carried), no policy
            state, total = env.state, tf.constant(0.0)
            for _ in tf.range(cfg.n_steps):
                state, out, _ended = env.step_state(state, tf.zeros([cfg.num_envs], tf.int32))
                total += out[1][0]
            env.write_state(state)
            return total
        env_ms = _timed(env_only, repeat)
    else:
        batch = rollout()
        iteration_ms = rollout_ms + _timed(lambda: agent._train(batch), repeat)
        actions = np.zeros(cfg.num_envs, np.int64)

        def env_only():
            for _ in range(cfg.n_steps):
                agent.env.step(actions)
        start = time.perf_counter()
        for _ in range(repeat):
            env_only()
        env_ms = (time.perf_counter() - start) / repeat * 1e3
    return {"env_ms": round(env_ms, 2), "policy_ms": round(rollout_ms - env_ms, 2),
            "update_ms": round(iteration_ms - rollout_ms, 2),
            "iteration_ms": round(iteration_ms, 2)}


def _evaluate(trained, target) -> dict:
    returns = [a.evaluate(20)["mean_return"] for a in trained]
    return {"eval_returns": returns, "reached_target": sum(r >= target for r in returns),
            "target": target}


def _measure_single(settings, backend, steps, xla) -> dict:
    import agents

    agent = agents.PPO(_config(settings, backend, xla))
    per_iteration = agent.config.n_steps * agent.config.num_envs
    marks = {}
    start = time.perf_counter()

    def mark(a, logs):
        if "t0" not in marks:
            marks["t0"], marks["steps0"] = time.perf_counter(), logs["steps"]

    agent.learn(steps, callbacks=[mark], progress_bar=False)
    seconds = time.perf_counter() - marks["t0"]
    out = {"steps_per_second": (int(agent.num_timesteps.numpy()) - marks["steps0"]) / seconds,
           "first_iteration_s": marks["t0"] - start, "iteration_steps": per_iteration}
    target = agents.core.presets.get_preset("ppo-CartPole-v1")["target"]
    out.update(_evaluate([agent], target))
    out["breakdown"] = _breakdown(agent)
    return out


def _measure_dqn(backend, steps, xla) -> dict:
    import agents

    cfg = agents.core.presets.make_config(agents.DQNConfig, "dqn", agents.core.presets.AUTO,
                                    env="CartPole-v1", backend=backend, jit_compile=xla)
    agent = agents.DQN(cfg)
    marks = {}
    start = time.perf_counter()

    def mark(a, logs):  # timing starts once the gradient steps run (both calls traced)
        if "t0" not in marks and logs.get("updates_tried", 0) > 0:
            marks["t0"], marks["steps0"] = time.perf_counter(), logs["steps"]

    agent.learn(steps, callbacks=[mark], progress_bar=False)
    seconds = time.perf_counter() - marks["t0"]
    out = {"steps_per_second": (int(agent.num_timesteps.numpy()) - marks["steps0"]) / seconds,
           "first_iteration_s": marks["t0"] - start, "iteration_steps": cfg.train_freq * cfg.num_envs}
    target = agents.core.presets.get_preset("dqn-CartPole-v1")["target"]
    out.update(_evaluate([agent], target))
    out["breakdown"] = {"iteration_ms": round(1e3 * cfg.train_freq * cfg.num_envs
                                              / out["steps_per_second"], 2)}
    return out


def _measure_stacked(settings, steps, n_seeds, xla) -> dict:
    """``n_seeds`` seeds as one agent with a seed axis (``agents.PPO(num_seeds=n_seeds)``, what
    ``agents.train_many`` runs); aggregate env steps per second over the seeds."""
    import agents

    cfg = dataclasses.replace(_config(settings, "graph", xla), num_seeds=n_seeds)
    agent = agents.PPO(cfg)
    marks = {}
    start = time.perf_counter()

    def mark(a, logs):
        if "t0" not in marks:
            marks["t0"], marks["steps0"] = time.perf_counter(), logs["steps"]

    agent.learn(steps, callbacks=[mark], progress_bar=False)
    seconds = time.perf_counter() - marks["t0"]
    done = int(agent.num_timesteps.numpy()) - marks["steps0"]
    out = {"steps_per_second": n_seeds * done / seconds,
           "first_iteration_s": marks["t0"] - start, "seeds": n_seeds}
    target = agents.core.presets.get_preset("ppo-CartPole-v1")["target"]
    trained = [agent.export(k) for k in range(n_seeds)] if n_seeds > 1 else [agent]
    out.update(_evaluate(trained, target))
    import tensorflow as tf
    rollout_ms = _timed(tf.function(agent._rollout_graph, jit_compile=cfg.jit_compile), 5)
    iteration_ms = _timed(agent._iteration, 5)
    out["breakdown"] = {"rollout_ms (env + policy)": round(rollout_ms, 2),
                        "update_ms": round(iteration_ms - rollout_ms, 2),
                        "iteration_ms": round(iteration_ms, 2)}
    return out


def _child(args) -> None:
    if args.part == "stacked":
        out = _measure_stacked(args.settings, args.steps, args.n, args.xla)
    elif args.part.startswith("dqn-"):
        out = _measure_dqn(args.part[len("dqn-"):], args.steps, args.xla)
    else:
        out = _measure_single(args.settings, args.part, args.steps, args.xla)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(out), flush=True)


def _run(args, part, n=1, xla=False, steps=None, tree=None) -> dict:
    """One measurement in a subprocess: this script, or ``tree``'s copy of it (cwd and
    ``PYTHONPATH`` there, so that tree's packages are the ones measured)."""
    script = os.path.abspath(__file__) if tree is None else os.path.join(
        os.path.abspath(tree), "benchmarks", "agents_speed.py")
    cmd = [sys.executable, script, "--part", part, "--n", str(n),
           "--steps", str(steps or args.steps), "--settings", args.settings] + (["--xla"] if xla else [])
    env = None if tree is None else {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          cwd=None if tree is None else os.path.abspath(tree))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{part} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100_000, help="env steps per seed")
    p.add_argument("--seeds", type=int, default=8, help="seeds in the many-seeds row")
    p.add_argument("--settings", default="preset", choices=("preset", "defaults"))
    p.add_argument("--xla", action="store_true", help="also the rows with jit_compile=True")
    p.add_argument("--dqn-steps", type=int, default=0,
                   help="also DQN (dqn-CartPole-v1 preset) gymnasium vs graph for this many steps")
    p.add_argument("--compare-tree", default=None,
                   help="also the gymnasium and graph rows from this checkout (before/after)")
    p.add_argument("--skip-stacked", action="store_true", help="leave out the stacked rows")
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.part is not None:
        _child(args)
        return
    load = os.getloadavg()
    rows = {}

    def show(name, row):
        print(f"{name:>22}: {row['steps_per_second']:9.0f} env steps/s, first iteration "
              f"{row['first_iteration_s']:5.1f} s, peak {row['peak_rss_mb']:6.0f} MB, "
              f"{row['reached_target']}/{len(row['eval_returns'])} seeds >= "
              f"{row['target']:.0f}, breakdown {row['breakdown']}", flush=True)

    for xla in (False, True) if args.xla else (False,):
        tag = " xla" if xla else ""
        plan = [("gymnasium", "gymnasium", 1, None, None)]
        if args.compare_tree:
            plan.append(("gymnasium (compared)", "gymnasium", 1, None, args.compare_tree))
        plan.append(("graph", "graph", 1, None, None))
        if args.compare_tree:
            plan.append(("graph (compared)", "graph", 1, None, args.compare_tree))
        if not args.skip_stacked:
            plan += [("stacked x1", "stacked", 1, None, None),
                     (f"stacked x{args.seeds}", "stacked", args.seeds, None, None)]
        if args.dqn_steps:
            plan += [("dqn gymnasium", "dqn-gymnasium", 1, args.dqn_steps, None),
                     ("dqn graph", "dqn-graph", 1, args.dqn_steps, None)]
        for name, part, n, steps, tree in plan:
            row = rows[name + tag] = _run(args, part, n, xla, steps, tree)
            show(name + tag, row)
    sps = {name: row["steps_per_second"] for name, row in rows.items()}
    ratios = {"graph / gymnasium": sps["graph"] / sps["gymnasium"]}
    if args.compare_tree:
        ratios["compared tree: graph / gymnasium"] = (sps["graph (compared)"]
                                                      / sps["gymnasium (compared)"])
        ratios["graph / compared graph"] = sps["graph"] / sps["graph (compared)"]
    if not args.skip_stacked:
        many = f"stacked x{args.seeds}"
        ratios[f"{many} / graph"] = sps[many] / sps["graph"]
        ratios[f"{many} / stacked x1"] = sps[many] / sps["stacked x1"]
    if args.dqn_steps:
        ratios["dqn graph / dqn gymnasium"] = sps["dqn graph"] / sps["dqn gymnasium"]
    if args.xla:
        ratios["graph xla / gymnasium"] = sps["graph xla"] / sps["gymnasium"]
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}x")
    after = os.getloadavg()
    print(f"load average before the run: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, after: "
          f"{after[0]:.1f} {after[1]:.1f} {after[2]:.1f} on {os.cpu_count()} CPUs")
    print(json.dumps({"rows": rows, "ratios": ratios, "load_average": load, "load_after": after,
                      "steps": args.steps, "settings": args.settings}))


if __name__ == "__main__":
    main()
