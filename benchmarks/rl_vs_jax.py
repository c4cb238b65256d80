"""PPO on CartPole-v1, ours (TensorFlow) side by side with PureJaxRL (JAX), interleaved, one run.

PureJaxRL (github.com/luchris429/purejaxrl: the whole training in one ``jax.jit``, gymnax envs,
seeds by ``vmap``) runs from a read-only scratch copy of its ``ppo.py``/``wrappers.py`` in its own
virtualenv (``jax[cpu]``, ``gymnax<1``: 1.x changed ``step``'s outputs; flax, optax, distrax),
started as a subprocess through
``benchmarks/_purejaxrl_runner.py``; nothing of it is vendored or a dependency. Ours runs in
subprocesses of this interpreter from this script's own tree (run it from a snapshot of the
committed tree: AutoGraph re-reads source files)::

    python benchmarks/rl_vs_jax.py --jax-python /work/venvs/jax/bin/python \\
        --purejaxrl /work/scratch/purejaxrl --steps 200000 --seeds 8 --rounds 2

Both sides use PureJaxRL's CartPole settings: 4 envs x 128 steps, 4 epochs of 4 minibatches,
lr 2.5e-4 annealed linearly, gamma 0.99, GAE lambda 0.95, clip 0.2, entropy 0.01, value 0.5,
max grad norm 0.5, tanh 64x64 actor and critic, Adam eps 1e-5. (Ours also bootstraps truncated
episodes and clips the value loss as CleanRL does; PureJaxRL clips the value loss too.)

Rows, each a subprocess pinned to the same cores (``--cpus``, ``taskset``), in rounds that
alternate the sides:

* ``purejaxrl x1`` / ``x S``: ``jax.jit(make_train(config))`` (``vmap`` over S keys); compile
  timed on its own (``lower().compile()``), then the run.
* ``ours graph x1``: ``agents.PPO(backend="graph", jit_compile=True)``, one compiled call per
  iteration; the first iteration (trace + XLA compile) is timed on its own.
* ``ours graph x1 K=k`` / ``x S K=k`` (``--iterations-per-call k > 1``): the same with ``k``
  iterations per compiled call (``iterations_per_call``); the first call (trace + XLA compile +
  its ``k`` iterations) is timed on its own.
* ``ours graph x S``: S seeds in one program, :func:`many_seeds` (one small function: today
  ``agents.stacked.StackedPPO``, the design ``agents.train_many`` uses; switch it to
  ``agents.PPO(num_seeds=S)`` when the tree has it). The first iteration is timed on its own.
* ``ours gymnasium x1``: ``backend="gymnasium"`` (env in Python through ``tf.numpy_function``,
  update with XLA), for the graph / gymnasium ratio per CPU second (``--gym-steps``).
* DQN 8 seeds in one program against 8 sequential runs: only when the tree offers a many-seed
  DQN (``agents.DQN(num_seeds=...)``); otherwise the row says "not available".

Figures: env steps per CPU second and per wall second after the first compile, the compile (or
first iteration) time, env steps per CPU second including it, the mean final training return
per side (each seed's last logged episodes: PureJaxRL's ``returned_episode_returns`` of the last
iteration, ours the last 20 finished episodes), and ratios ours / PureJaxRL. CPU seconds are the
subprocess's user + system time (``resource.getrusage`` of the child), so threads count; the
load average before and after the run is printed: these machines are shared.
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
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0:1] = [ROOT]

RUNNER = os.path.join(ROOT, "benchmarks", "_purejaxrl_runner.py")
RETURN_GOAL = 475.0


# -- our side (runs in a child process) ---------------------------------------------------------
def ppo_config(backend: str = "graph", seed: int = 0, iterations_per_call: int = 1):
    """Our ``PPOConfig`` with PureJaxRL's CartPole settings (module doc)."""
    import agents

    return agents.PPOConfig(
        env="CartPole-v1", seed=seed, num_envs=4, n_steps=128, n_epochs=4, n_minibatches=4,
        learning_rate=2.5e-4, anneal_lr=True, gamma=0.99, gae_lambda=0.95, clip_coef=0.2,
        ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, hidden_sizes=(64, 64), activation="tanh",
        backend=backend, jit_compile=True, iterations_per_call=iterations_per_call)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _clock() -> tuple[float, float]:
    return time.perf_counter(), _cpu()


def _final_return(agent) -> float:
    import numpy as np

    return float(np.mean(agent.episode_returns)) if agent.episode_returns else float("nan")


def _timed_learn(agent, steps: int) -> tuple:
    """``agent.learn(steps)`` with its first iteration (trace + compile) timed apart: the clocks
    at the start, after the first iteration and at the end, and the steps done by then."""
    marks: dict = {}

    def mark(_agent, logs):
        if "first" not in marks:
            marks["first"], marks["steps0"] = _clock(), logs["steps"]

    start = _clock()
    agent.learn(steps, callbacks=[mark], progress_bar=False)
    return start, marks["first"], _clock(), marks["steps0"]


def _rates(start, first, end, run_steps: int, all_steps: int, returns: list, seeds: int) -> dict:
    return {"env_steps": run_steps, "all_env_steps": all_steps,
            "compile_wall_s": first[0] - start[0], "compile_cpu_s": first[1] - start[1],
            "run_wall_s": end[0] - first[0], "run_cpu_s": end[1] - first[1],
            "final_returns": returns, "seeds": seeds}


def one_seed(backend: str, steps: int, k: int = 1) -> dict:
    """One agent trained for ``steps`` (``k`` iterations per compiled call); the first call
    (trace + compile) timed apart."""
    import agents

    agent = agents.PPO(ppo_config(backend, iterations_per_call=k))
    start, first, end, steps0 = _timed_learn(agent, steps)
    done = int(agent.num_timesteps.numpy())
    return _rates(start, first, end, done - steps0, done, [_final_return(agent)], 1)


def many_seeds(n_seeds: int, steps: int, k: int = 1) -> dict:
    """``n_seeds`` seeds in one compiled program: one ``agents.PPO(num_seeds=S)`` agent (the
    seed axis), each seed ``steps`` env steps; the first iteration (trace + compile) timed apart."""
    import agents

    agent = agents.PPO(dataclasses.replace(ppo_config("graph", iterations_per_call=k),
                                           num_seeds=n_seeds))
    start, first, end, steps0 = _timed_learn(agent, steps)
    done = int(agent.num_timesteps.numpy().reshape(-1)[0])
    returns = [_final_return(agent.export(i)) for i in range(n_seeds)]
    return _rates(start, first, end, n_seeds * (done - steps0), n_seeds * done, returns, n_seeds)


def dqn_many_available() -> bool:
    """Whether the tree trains many DQN seeds in one program (``agents.DQN(num_seeds=...)``)."""
    import agents

    return "num_seeds" in {f.name for f in dataclasses.fields(agents.DQNConfig)}


def _child(part: str, steps: int, seeds: int, threads: int | None = None, k: int = 1) -> None:
    if threads:  # as `robustgrad --threads`: before TensorFlow's runtime starts
        from robustgrad.cli import set_threads

        set_threads(threads)
    if part == "graph":
        out = one_seed("graph", steps, k)
    elif part == "gymnasium":
        out = one_seed("gymnasium", steps)
    elif part == "many":
        out = many_seeds(seeds, steps, k)
    elif part == "dqn-available":
        out = {"available": dqn_many_available()}
    else:
        raise SystemExit(f"--part: unknown {part!r}")
    import tensorflow as tf

    out["versions"] = {"tensorflow": tf.__version__}
    print("RESULT " + json.dumps(out), flush=True)


# -- the driver ---------------------------------------------------------------------------------
def _run(cmd: list[str], cpus: str | None, cwd: str | None = None, env: dict | None = None) -> dict:
    if cpus:
        cmd = ["taskset", "-c", cpus] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def _ours(part: str, steps: int, seeds: int, cpus: str | None, threads: int | None = None,
          k: int = 1) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT}
    extra = (["--threads", str(threads)] if threads else []) + ["--iterations-per-call", str(k)]
    return _run([sys.executable, os.path.abspath(__file__), "--part", part, "--steps", str(steps),
                 "--seeds", str(seeds), *extra], cpus, cwd=ROOT, env=env)


def _jax(args, seeds: int) -> dict:
    env = dict(os.environ)
    if args.threads:  # XLA's CPU client: one Eigen pool of that many threads
        env["XLA_FLAGS"] = (f"{env.get('XLA_FLAGS', '')} --xla_cpu_multi_thread_eigen="
                            f"{'false' if args.threads == 1 else 'true'} "
                            f"intra_op_parallelism_threads={args.threads}").strip()
    return _run([args.jax_python, RUNNER, "--purejaxrl", args.purejaxrl, "--steps",
                 str(args.steps), "--seeds", str(seeds)], args.cpus, env=env)


def rates(row: dict) -> dict:
    """Env steps per CPU / wall second after the first compile, and per CPU second with it."""
    import numpy as np

    total_cpu = row["compile_cpu_s"] + row["run_cpu_s"]
    all_steps = row.get("all_env_steps", row["env_steps"])
    return {"per_cpu_s": row["env_steps"] / row["run_cpu_s"],
            "per_wall_s": row["env_steps"] / row["run_wall_s"],
            "compile_wall_s": row["compile_wall_s"],
            "with_compile_per_cpu_s": all_steps / total_cpu,
            "with_compile_per_wall_s": all_steps / (row["compile_wall_s"] + row["run_wall_s"]),
            "mean_return": float(np.mean(row["final_returns"])),
            "seeds_at_goal": int(sum(r >= RETURN_GOAL for r in row["final_returns"]))}


def _show(name: str, row: dict) -> None:
    r = rates(row)
    print(f"{name:>22}: {r['per_cpu_s']:9.0f} steps/CPU-s {r['per_wall_s']:9.0f} steps/wall-s | "
          f"compile {r['compile_wall_s']:5.1f} s wall | with compile {r['with_compile_per_cpu_s']:8.0f}"
          f" steps/CPU-s {r['with_compile_per_wall_s']:8.0f} steps/wall-s | mean return "
          f"{r['mean_return']:6.1f} ({r['seeds_at_goal']}/{row['seeds']} >= {RETURN_GOAL:.0f})",
          flush=True)


def _median_rows(rows: list[dict]) -> dict:
    """The round with the median steps per CPU second (a real run, not a mix of rounds)."""
    ordered = sorted(rows, key=lambda row: rates(row)["per_cpu_s"])
    return ordered[len(ordered) // 2]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jax-python", default="/work/venvs/jax/bin/python",
                   help="the interpreter of the virtualenv holding jax[cpu], gymnax, flax, ...")
    p.add_argument("--purejaxrl", default="/work/scratch/purejaxrl",
                   help="directory with PureJaxRL's ppo.py and wrappers.py (read-only copies)")
    p.add_argument("--steps", type=int, default=200_000, help="env steps per seed")
    p.add_argument("--seeds", type=int, default=8, help="seeds in the many-seed rows")
    p.add_argument("--gym-steps", type=int, default=50_000,
                   help="env steps of the gymnasium-backend row (0: leave it out)")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds (median reported)")
    p.add_argument("--cpus", default=",".join(map(str, sorted(os.sched_getaffinity(0)))),
                   help="cores every subprocess is pinned to (taskset -c)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads of both sides (ours: `robustgrad --threads`, TensorFlow's intra-"
                        " and inter-op pools; PureJaxRL: XLA_FLAGS intra_op_parallelism_threads); "
                        "default: each framework's own")
    p.add_argument("--iterations-per-call", type=int, default=1,
                   help="k > 1: add rows of ours with k iterations per compiled call")
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.part is not None:
        _child(args.part, args.steps, args.seeds, args.threads, args.iterations_per_call)
        return
    for name, path in (("--jax-python", args.jax_python), ("--purejaxrl", args.purejaxrl)):
        if not os.path.exists(path):
            raise SystemExit(f"{name}: {path} does not exist (module doc: how to set it up)")
    load = os.getloadavg()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, cores {args.cpus}, threads "
          f"{args.threads or 'default'}, "
          f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    plan = [("purejaxrl x1", lambda: _jax(args, 1)),
            ("ours graph x1", lambda: _ours("graph", args.steps, 1, args.cpus, args.threads)),
            (f"purejaxrl x{args.seeds}", lambda: _jax(args, args.seeds)),
            (f"ours graph x{args.seeds}",
             lambda: _ours("many", args.steps, args.seeds, args.cpus, args.threads))]
    k = args.iterations_per_call
    if k > 1:
        plan += [(f"ours graph x1 K={k}",
                  lambda: _ours("graph", args.steps, 1, args.cpus, args.threads, k)),
                 (f"ours graph x{args.seeds} K={k}",
                  lambda: _ours("many", args.steps, args.seeds, args.cpus, args.threads, k))]
    if args.gym_steps:
        plan.append(("ours gymnasium x1",
                     lambda: _ours("gymnasium", args.gym_steps, 1, args.cpus, args.threads)))
    rows: dict[str, list] = {name: [] for name, _ in plan}
    for rnd in range(args.rounds):
        for name, run in plan if rnd % 2 == 0 else plan[::-1]:
            rows[name].append(run())
            _show(f"{name} r{rnd + 1}", rows[name][-1])
    med = {name: _median_rows(found) for name, found in rows.items()}
    print("\nmedian over rounds:")
    for name, row in med.items():
        _show(name, row)
    r = {name: rates(row) for name, row in med.items()}
    print()
    ours_rows = [(n, f"ours graph x{n}") for n in (1, args.seeds)]
    if k > 1:
        ours_rows += [(n, f"ours graph x{n} K={k}") for n in (1, args.seeds)]
    for n, name in ours_rows:
        ours, ref = r[name], r[f"purejaxrl x{n}"]
        print(f"{name} / PureJaxRL: per CPU second {ours['per_cpu_s'] / ref['per_cpu_s']:.2f}x,"
              f" per wall second {ours['per_wall_s'] / ref['per_wall_s']:.2f}x, including compile"
              f" {ours['with_compile_per_cpu_s'] / ref['with_compile_per_cpu_s']:.2f}x (CPU)"
              f" {ours['with_compile_per_wall_s'] / ref['with_compile_per_wall_s']:.2f}x (wall)")
    if args.gym_steps:
        print(f"ours graph / ours gymnasium per CPU second: "
              f"{r['ours graph x1']['per_cpu_s'] / r['ours gymnasium x1']['per_cpu_s']:.2f}x")
    available = _ours("dqn-available", 1, 1, args.cpus)["available"]
    print(f"DQN {args.seeds} seeds in one program vs {args.seeds} sequential runs: "
          + ("benchmarks/seeds_speed.py --algo dqn measures it" if available
             else "not available (the tree has no many-seed DQN)"))
    versions = {**med["ours graph x1"].get("versions", {}), **med["purejaxrl x1"].get("versions", {})}
    after = os.getloadavg()
    print(f"versions: {versions}; load average after: {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}")


if __name__ == "__main__":
    main()
