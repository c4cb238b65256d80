"""Side by side with Stable-Baselines3: training speed and returns, same settings, one run.

Stable-Baselines3 needs PyTorch, which robustgrad does not depend on, so it runs in a
second interpreter (``--sb3-python``) that has ``stable-baselines3`` installed; both
sides are measured in the same invocation, one after the other, on the same machine::

    python -m venv /tmp/sb3
    /tmp/sb3/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
    /tmp/sb3/bin/pip install stable-baselines3 "gymnasium>=1,<2"
    python benchmarks/agents_vs_sb3.py --sb3-python /tmp/sb3/bin/python \\
        --settings preset defaults --seeds 0 1 2          # PPO, both settings
    python benchmarks/agents_vs_sb3.py --sb3-python /tmp/sb3/bin/python --algos dqn

PPO rows (CartPole-v1, ``--steps`` env steps per seed; each of ours in its own subprocess
through ``benchmarks/agents_speed.py``'s measurement functions):

* ``gymnasium``: ``agents.PPO(backend="gymnasium")``, seed 0 (the env steps in Python).
* ``graph`` / ``graph xla``: ``agents.PPO(backend="graph")``, seed 0, without and with
  ``jit_compile=True`` (rollout + targets + update in one compiled call).
* ``train_many xS`` / ``train_many xS xla``: ``agents.train_many(config, seeds=range(S))``
  with the stacked design (``--many``, default 8); its figure is the *aggregate* env steps
  per second over all S seeds, and every seed is evaluated.
* ``SB3 1 thread`` over ``--seeds`` (SB3's fastest setting here: one ``torch`` thread) and
  ``SB3 2 threads`` on the first seed.

The ratios printed divide our rows by SB3's median over ``--seeds`` at 1 thread; the goals of
issue 12 section 4 are graph >= 4x and 8 seeds in one run >= 20x SB3 (one seed), with every
seed at the preset's return target (475).

Settings (identical on both sides; 64-64 tanh separate actor and critic, orthogonal init,
advantages standardised per minibatch, max grad norm 0.5, value coefficient 0.5, learning
rate annealed linearly to 0):

* ``--settings defaults``: ``PPOConfig()`` = CleanRL ``ppo.py``: 8 envs x 128 steps, 4 epochs
  x 4 minibatches, lr 2.5e-4, gamma 0.99, GAE 0.95, clip 0.2, value clipping 0.2, entropy 0.01.
* ``--settings preset``: the shipped ``ppo-CartPole-v1`` preset (rl-baselines3-zoo): 8 envs x
  32 steps, 20 epochs x 1 minibatch of 256, lr 1e-3, gamma 0.98, GAE 0.8, clip 0.2 (constant),
  no value clipping, no entropy bonus.
* ``dqn``: CartPole-v1, rl-baselines3-zoo settings with epsilon decayed over 8% of the
  budget; 256-256 relu, constant lr 2.3e-3, batch 64, 256 env steps then 128 gradient
  steps, target copied every 10 steps. SB3's DQN has no Double DQN, so ours runs with
  ``double_dqn=False`` here; seeds ``--seeds``, gymnasium backend.

Figures: training throughput (env steps per second, after the first iteration, whose tracing,
compilation and warm-up are not timed), and the mean deterministic return over 20 episodes
(gymnasium env, seeds ``seed + 10_000``) after ``--steps`` steps for each seed. On a loaded
machine the processes get unequal CPU shares (TensorFlow runs several threads, SB3 one), so
env steps per CPU second are printed too: SB3's over its ``learn()`` call, ours over the whole
measuring subprocess (import, tracing, compilation and evaluation included, which understates
ours).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# run as a script, benchmarks/agents.py would shadow the agents package: use the repo root
sys.path[0:1] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import numpy as np  # noqa: E402

DQN_SETTINGS = dict(exploration_fraction=0.08, learning_rate_final=None, double_dqn=False)
SPEED_GOALS = {"graph": 4.0, "many": 20.0}
"""Issue 12 section 4: graph backend / SB3 and S seeds in one run (aggregate) / SB3."""

# The SB3 side, run in the --sb3-python interpreter: prints one JSON line per measurement.
_SB3_SCRIPT = r'''
import json, sys, time
import numpy as np
import torch
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

algo, steps, seeds, threads = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
settings = sys.argv[5]
torch.set_num_threads(threads)
PPO_SETTINGS = {
    # PPOConfig() defaults = CleanRL ppo.py
    "defaults": dict(n_steps=128, batch_size=256, n_epochs=4, lr=2.5e-4, gamma=0.99,
                     gae_lambda=0.95, ent_coef=0.01, clip_range_vf=0.2),
    # the ppo-CartPole-v1 preset = rl-zoo's (clip range constant, as ours)
    "preset": dict(n_steps=32, batch_size=256, n_epochs=20, lr=1e-3, gamma=0.98,
                   gae_lambda=0.8, ent_coef=0.0, clip_range_vf=None),
}

def build(seed):
    if algo == "ppo":
        s = dict(PPO_SETTINGS[settings])
        lr0 = s.pop("lr")
        env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
        return PPO("MlpPolicy", env, learning_rate=lambda progress: lr0 * progress,
                   clip_range=0.2, vf_coef=0.5, max_grad_norm=0.5, seed=seed, device="cpu",
                   policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]),
                                      activation_fn=torch.nn.Tanh), **s)
    env = make_vec_env("CartPole-v1", n_envs=1, seed=seed)
    return DQN("MlpPolicy", env, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
               learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
               gradient_steps=128, exploration_fraction=0.08, exploration_final_eps=0.04,
               max_grad_norm=10, seed=seed, device="cpu",
               policy_kwargs=dict(net_arch=[256, 256]))

class Mark(BaseCallback):
    """Time from the first step after the first update (as on the robustgrad side)."""

    def __init__(self, warm):
        super().__init__()
        self.warm, self.t0, self.steps0 = warm, None, None

    def _on_step(self):
        if self.t0 is None and self.num_timesteps > self.warm:
            self.t0, self.steps0 = time.perf_counter(), self.num_timesteps
        return True

for seed in seeds:
    model = build(seed)
    mark = Mark(model.n_steps * model.n_envs if algo == "ppo" else 1000 + 256)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    model.learn(steps, callback=mark)
    train_s = time.perf_counter() - mark.t0
    cpu_s = time.process_time() - cpu0  # CPU and wall seconds of the whole learn() call
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=seed + 10_000)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=20, deterministic=True)
    print(json.dumps({"seed": seed, "mean_return": float(mean), "threads": threads,
                      "steps_per_second": (model.num_timesteps - mark.steps0) / train_s,
                      "cpu_seconds": cpu_s, "wall_seconds": time.perf_counter() - wall0}),
          flush=True)
'''


def _speed_module():
    """``benchmarks/agents_speed.py`` (its subprocess measurements are reused here)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agents_speed.py")
    spec = importlib.util.spec_from_file_location("agents_speed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ours_ppo(settings: str, steps: int, many: int, xla_rows: bool) -> dict:
    """Our PPO rows, each in its own subprocess (agents_speed's ``_run``)."""
    speed = _speed_module()
    args = argparse.Namespace(steps=steps, settings=settings)
    parts = [("gymnasium", "gymnasium", 1, False), ("graph", "graph", 1, False),
             (f"train_many x{many}", "stacked", many, False)]
    if xla_rows:
        parts += [("graph xla", "graph", 1, True), (f"train_many x{many} xla", "stacked", many,
                                                    True)]
    rows = {}
    for name, part, n, xla in parts:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        row = rows[name] = speed._run(args, part, n, xla)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # CPU seconds of the whole subprocess (import, tracing, compilation, evaluation too):
        # its steps per CPU second understate the timed part's, whatever the load
        row["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        row["steps_per_cpu_second"] = n * steps / row["cpu_seconds"]
        print(f"  robustgrad {name:>18}: {row['steps_per_second']:8.0f} env steps/s "
              f"({row['steps_per_cpu_second']:6.0f} per CPU s of the subprocess); returns "
              f"{', '.join(f'{r:.1f}' for r in row['eval_returns'])} "
              f"({row['reached_target']}/{len(row['eval_returns'])} >= {row['target']:.0f})",
              flush=True)
    return rows


def _ours_dqn(steps: int, seed: int) -> dict:
    import agents

    agent = agents.DQN(env="CartPole-v1", seed=seed, preset=None, **DQN_SETTINGS)
    warm = agent.config.learning_starts + agent.config.train_freq
    # one learn() call over the whole budget (so schedules match SB3's); time from the end of
    # the first update that ran (tracing and compilation excluded)
    marks = {}

    def mark(a, logs):
        if "t0" not in marks and logs["steps"] >= warm:
            marks["t0"], marks["steps0"] = time.perf_counter(), logs["steps"]

    agent.learn(steps, callbacks=[mark], progress_bar=False)
    train_s = time.perf_counter() - marks["t0"]
    sps = (int(agent.num_timesteps.numpy()) - marks["steps0"]) / train_s
    return {"seed": seed, "mean_return": agent.evaluate(20)["mean_return"],
            "steps_per_second": sps}


def _sb3(python: str, algo: str, steps: int, seeds: list, threads: int,
         settings: str = "defaults", timeout: float | None = None) -> list:
    """SB3's runs in the ``python`` interpreter; past ``timeout`` seconds, the runs finished so
    far plus a ``{"seed": None, "timed_out": ...}`` row."""
    cmd = [python, "-c", _SB3_SCRIPT, algo, str(steps), json.dumps(seeds), str(threads), settings]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as stopped:
        out = stopped.stdout.decode() if isinstance(stopped.stdout, bytes) else stopped.stdout
        rows = [json.loads(line) for line in (out or "").splitlines() if line.startswith("{")]
        print(f"  SB3 {threads} thread(s): stopped after {timeout:.0f} s "
              f"({len(rows)}/{len(seeds)} runs finished)", flush=True)
        return rows + [{"seed": None, "threads": threads, "timed_out": timeout}]
    if proc.returncode != 0:
        raise SystemExit(f"the SB3 side failed ({python}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for r in rows:
        print(f"  SB3 {threads} thread(s) seed {r['seed']}: {r['steps_per_second']:8.0f} env "
              f"steps/s; return {r['mean_return']:.1f}; CPU {r['cpu_seconds']:.0f} s of "
              f"{r['wall_seconds']:.0f} s wall", flush=True)
    return rows


def _sb3_versions(python: str) -> str:
    proc = subprocess.run([python, "-c", "import torch, stable_baselines3 as s; "
                           "print(f'stable-baselines3 {s.__version__}, torch {torch.__version__}')"],
                          capture_output=True, text=True)
    return proc.stdout.strip() or proc.stderr.strip()[-300:]


def ppo_ratios(ours: dict, sb3_sps: float, many: int,
               sb3_steps_per_cpu_second: float | None = None) -> dict:
    """Our rows' env steps/s over SB3's, with the goal each is held to (None: no goal), and
    (``cpu_ratio``) the same for env steps per CPU second where both are known.

    >>> rows = {"graph": {"steps_per_second": 9000.0},
    ...         "train_many x8": {"steps_per_second": 60000.0}}
    >>> r = ppo_ratios(rows, 3000.0, 8)
    >>> r["graph"], r["train_many x8"]
    ({'ratio': 3.0, 'goal': 4.0, 'met': False}, {'ratio': 20.0, 'goal': 20.0, 'met': True})
    """
    out = {}
    for name, row in ours.items():
        goal = (SPEED_GOALS["graph"] if name.startswith("graph")
                else SPEED_GOALS["many"] if name.startswith(f"train_many x{many}") else None)
        ratio = row["steps_per_second"] / sb3_sps
        out[name] = {"ratio": round(ratio, 2), "goal": goal,
                     "met": None if goal is None else bool(ratio >= goal)}
        if sb3_steps_per_cpu_second and "steps_per_cpu_second" in row:
            out[name]["cpu_ratio"] = round(row["steps_per_cpu_second"] / sb3_steps_per_cpu_second, 2)
    return out


def _run_ppo(args) -> dict:
    results = {}
    for settings in args.settings:
        print(f"PPO CartPole-v1, {args.steps} steps, settings {settings!r}", flush=True)
        ours = _ours_ppo(settings, args.steps, args.many, not args.no_xla)
        reference = args.torch_threads[0]
        sb3 = {threads: _sb3(args.sb3_python, "ppo", args.steps,
                             args.seeds if threads == reference else args.seeds[:1], threads,
                             settings, None if threads == reference else args.sb3_timeout)
               for threads in args.torch_threads}
        sb3_sps = float(np.median([r["steps_per_second"] for r in sb3[reference]]))
        sb3_cpu = float(np.median([args.steps / r["cpu_seconds"] for r in sb3[reference]]))
        ratios = ppo_ratios(ours, sb3_sps, args.many, sb3_cpu)
        for name, r in ratios.items():
            verdict = "" if r["goal"] is None else \
                f" (goal >= {r['goal']:.0f}x: {'met' if r['met'] else 'missed'})"
            print(f"  {name} / SB3 ({reference} thread): {r['ratio']:.2f}x{verdict}; per CPU "
                  f"second {r['cpu_ratio']:.2f}x", flush=True)
        results[settings] = {"robustgrad": ours, "sb3": {str(k): v for k, v in sb3.items()},
                             "sb3_median_steps_per_second": sb3_sps,
                             "sb3_median_steps_per_cpu_second": sb3_cpu, "ratios": ratios}
    return results


def _run_dqn(args) -> dict:
    ours = []
    for seed in args.seeds:
        ours.append(_ours_dqn(args.steps, seed))
        print(f"robustgrad dqn seed {seed}: return {ours[-1]['mean_return']:7.1f}, "
              f"{ours[-1]['steps_per_second']:8.0f} steps/s", flush=True)
    theirs = _sb3(args.sb3_python, "dqn", args.steps, args.seeds, args.torch_threads[0])
    ours_sps = float(np.median([r["steps_per_second"] for r in ours]))
    sb3_sps = float(np.median([r["steps_per_second"] for r in theirs]))
    print(f"dqn: median steps/s robustgrad {ours_sps:,.0f} vs SB3 {sb3_sps:,.0f}: "
          f"{ours_sps / sb3_sps:.2f}x; mean return robustgrad "
          f"{np.mean([r['mean_return'] for r in ours]):.1f} vs SB3 "
          f"{np.mean([r['mean_return'] for r in theirs]):.1f} over seeds {args.seeds}",
          flush=True)
    return {"robustgrad": ours, "sb3": theirs, "speed_ratio": ours_sps / sb3_sps}


def main(argv: list[str] | None = None) -> int:
    """Run the comparison (module doc); returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sb3-python", required=True,
                   help="a Python interpreter with stable-baselines3 and torch installed")
    p.add_argument("--algos", nargs="+", default=["ppo"], choices=["ppo", "dqn"])
    p.add_argument("--steps", type=int, default=100_000, help="env steps per run (default 100k)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                   help="SB3's PPO seeds (1 thread) and both sides' DQN seeds (default 0 1 2)")
    p.add_argument("--settings", nargs="+", default=["preset", "defaults"],
                   choices=["preset", "defaults"], help="PPO settings (module doc)")
    p.add_argument("--many", type=int, default=8,
                   help="seeds 0..S-1 in the train_many rows (default 8)")
    p.add_argument("--no-xla", action="store_true", help="skip our jit_compile=True rows")
    p.add_argument("--torch-threads", type=int, nargs="+", default=[1, 2],
                   help="torch.set_num_threads on the SB3 side; the first is the reference "
                        "of the ratios, the others run the first seed only (default 1 2)")
    p.add_argument("--sb3-timeout", type=float, default=900.0,
                   help="stop SB3's runs at the other thread counts after this many seconds "
                        "(on a loaded 2-core machine 2 torch threads crawl; default 900)")
    p.add_argument("--json", default=None, help="write the results to this JSON file")
    args = p.parse_args(argv)
    if args.steps < 20_000:
        p.error(f"--steps: at least 20000 for a meaningful comparison, got {args.steps}")
    if args.many < 1:
        p.error(f"--many: at least 1, got {args.many}")
    if min(args.torch_threads) < 1:
        p.error(f"--torch-threads: each at least 1, got {args.torch_threads}")
    load_before = os.getloadavg()
    versions = _sb3_versions(args.sb3_python)
    print(f"{versions}; load average {load_before[0]:.1f} {load_before[1]:.1f} "
          f"{load_before[2]:.1f} on {os.cpu_count()} CPUs", flush=True)
    results = {"sb3_versions": versions, "load_average_before": load_before,
               "steps": args.steps, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                             time.gmtime())}
    if "ppo" in args.algos:
        results["ppo"] = _run_ppo(args)
    if "dqn" in args.algos:
        results["dqn"] = _run_dqn(args)
    results["load_average_after"] = os.getloadavg()
    print(f"load average after: {' '.join(f'{x:.1f}' for x in results['load_average_after'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
