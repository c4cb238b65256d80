"""Compiled environments: random-action env steps per second, graph vs XLA vs gymnasium.

For each task and each batch size N (default 1, 8, 64, 1024), measured side by side in one run:

* ``graph``: ``agents.graph_envs`` stepped ``T`` times in one ``tf.function`` loop
  (``tf.range``), random actions drawn in the graph;
* ``xla``: the same loop with ``jit_compile=True``;
* ``sync``: gymnasium's ``SyncVectorEnv`` of N envs (same-step autoreset), stepped from Python
  with pre-drawn random actions (the drawing is not timed);
* ``gym-vec`` (CartPole only): gymnasium's own NumPy-vectorised ``CartPoleVectorEnv``
  (``vectorization_mode="vector_entry_point"``, its own next-step autoreset), a stronger
  reference than ``sync``.

Each figure is the median of ``--repeats`` timed calls of about ``--seconds`` each (the number of
steps per call is calibrated) after a warm-up (compile excluded); the
ratio columns divide by ``sync``. The machine's load is printed: on a shared machine the absolute
figures move, the ratios less.

Run:  .venv/bin/python benchmarks/graph_envs.py [--envs CartPole-v1,Pendulum-v1] [--sizes 1,8,64,1024]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# the repository root instead of benchmarks/ (whose agents.py would shadow the package)
sys.path[0:1] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import gymnasium as gym  # noqa: E402
import tensorflow as tf  # noqa: E402
from gymnasium.vector import AutoresetMode  # noqa: E402

from agents.graph_envs import GRAPH_ENV_IDS, graph_env  # noqa: E402


def graph_rollout(spec, jit_compile: bool):
    """``rollout(state, key, steps) -> (state, reward sum)``: ``steps`` random-action steps."""

    @tf.function(jit_compile=jit_compile)
    def rollout(state, key, steps):
        n = tf.shape(state.time)[0]
        total = tf.zeros([n])
        for t in tf.range(steps):
            k = tf.random.experimental.stateless_fold_in(key, t, alg="philox")
            if spec.discrete:
                a = tf.random.stateless_uniform([n], k, 0, spec.action_space.n, tf.int32, alg="philox")
            else:
                a = tf.random.stateless_uniform([n, 1], k, 0, 2001, tf.int32, alg="philox")
                a = (tf.cast(a, tf.float32) / 1000.0 - 1.0) * spec.action_space.high[0]
            state, _, reward, _, _, _ = spec.step(state, a)
            total += reward
        return state, total

    return rollout


def steps_per_second(run, n: int, seconds: float, repeats: int) -> float:
    """Env steps per second of ``run(steps)`` (``steps`` batched steps of ``n`` envs).

    ``steps`` is calibrated so that one timed call lasts about ``seconds``; the figure is the
    median of ``repeats`` timed calls after a warm-up (which compiles).
    """
    steps, elapsed = 16, 0.0
    while steps < 10_000_000:
        run(steps)  # XLA specialises on the loop length: compile before timing each new length
        t0 = time.perf_counter()
        run(steps)
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds / 5:
            break
        steps *= 8
    steps = max(1, int(steps * seconds / max(elapsed, 1e-9)))
    run(steps)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(steps)
        times.append(time.perf_counter() - t0)
    return n * steps / statistics.median(times)


def graph_steps_per_second(env_id: str, n: int, jit_compile: bool, seconds: float, repeats: int) -> float:
    spec = graph_env(env_id)
    rollout = graph_rollout(spec, jit_compile)
    state = spec.reset(0, n)
    key = tf.constant([0, 1], tf.int64)

    def run(steps):
        _, total = rollout(state, key, tf.constant(steps))
        total.numpy()

    return steps_per_second(run, n, seconds, repeats)


def gym_steps_per_second(env_id: str, n: int, mode: str, seconds: float, repeats: int) -> float:
    kwargs = {} if mode == "vector_entry_point" else {  # the NumPy CartPole takes no vector_kwargs
        "vector_kwargs": {"autoreset_mode": AutoresetMode.SAME_STEP}}
    vec = gym.make_vec(env_id, num_envs=n, vectorization_mode=mode, **kwargs)
    vec.reset(seed=0)
    vec.action_space.seed(0)
    pool = [vec.action_space.sample() for _ in range(256)]  # drawn before timing

    def run(steps):
        for t in range(steps):
            vec.step(pool[t % len(pool)])

    out = steps_per_second(run, n, seconds, repeats)
    vec.close()
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", default="CartPole-v1,Pendulum-v1",
                   help=f"comma-separated ids or 'all' ({', '.join(GRAPH_ENV_IDS)})")
    p.add_argument("--sizes", default="1,8,64,1024")
    p.add_argument("--seconds", type=float, default=0.5, help="length of one timed call")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    envs = GRAPH_ENV_IDS if args.envs == "all" else tuple(args.envs.split(","))
    sizes = [int(s) for s in args.sizes.split(",")]

    print(f"TF {tf.__version__}, gymnasium {gym.__version__}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}; median of {args.repeats}; env steps per second")
    print(f"{'env':26} {'N':>5} {'graph':>11} {'xla':>11} {'sync':>10} {'gym-vec':>10} "
          f"{'graph/sync':>10} {'xla/sync':>9}")
    for env_id in envs:
        for n in sizes:
            t, r = args.seconds, args.repeats
            graph = graph_steps_per_second(env_id, n, False, t, r)
            xla = graph_steps_per_second(env_id, n, True, t, r)
            sync = gym_steps_per_second(env_id, n, "sync", t, r)
            vec = (gym_steps_per_second(env_id, n, "vector_entry_point", t, r)
                   if env_id == "CartPole-v1" else float("nan"))
            print(f"{env_id:26} {n:5d} {graph:11,.0f} {xla:11,.0f} {sync:10,.0f} {vec:10,.0f} "
                  f"{graph / sync:10.1f} {xla / sync:9.1f}", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
