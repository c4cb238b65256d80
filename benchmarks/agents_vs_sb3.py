"""Side by side with Stable-Baselines3: training speed and returns, same settings, one run.

Stable-Baselines3 needs PyTorch, which robustgrad does not depend on, so it runs in a
second interpreter (``--sb3-python``) that has ``stable-baselines3`` installed; both
sides are measured in the same invocation, one after the other, on the same machine::

    python -m venv /tmp/sb3 && /tmp/sb3/bin/pip install torch stable-baselines3 "gymnasium>=1,<2"
    python benchmarks/agents_vs_sb3.py --sb3-python /tmp/sb3/bin/python --algos ppo dqn \\
        --seeds 0 1 2

Settings (identical on both sides):

* ``ppo``: CartPole-v1, 8 sync envs, 128 steps, 4 epochs x 4 minibatches, lr 2.5e-4 annealed,
  gamma 0.99, GAE 0.95, clip 0.2 (value clipping 0.2 too), entropy 0.01, value 0.5, max grad
  norm 0.5, separate 64-64 tanh networks with orthogonal init (``PPOConfig()`` defaults /
  CleanRL ``ppo.py``).
* ``dqn``: CartPole-v1, rl-baselines3-zoo settings with epsilon decayed over 8% of the
  budget; 256-256 relu, constant lr 2.3e-3, batch 64, 256 env steps then 128 gradient
  steps, target copied every 10 steps. SB3's DQN has no Double DQN, so
  ours runs with ``double_dqn=False`` here.

Figures: training throughput (env steps per second, after a first compiling / warm-up
iteration that is not timed), and the mean deterministic return over 20 episodes after
``--steps`` steps for each seed. The ratio printed is robustgrad / SB3.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# run as a script, benchmarks/agents.py would shadow the agents package: use the repo root
sys.path[0:1] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import numpy as np  # noqa: E402

PPO_SETTINGS = dict(num_envs=8, n_steps=128, n_epochs=4, n_minibatches=4, learning_rate=2.5e-4,
                    gamma=0.99, gae_lambda=0.95, clip_coef=0.2, ent_coef=0.01, vf_coef=0.5,
                    max_grad_norm=0.5)
DQN_SETTINGS = dict(exploration_fraction=0.08, learning_rate_final=None, double_dqn=False)

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
torch.set_num_threads(threads)

def build(seed):
    if algo == "ppo":
        env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
        lr = lambda progress: 2.5e-4 * progress
        return PPO("MlpPolicy", env, n_steps=128, batch_size=256, n_epochs=4, learning_rate=lr,
                   gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.01, vf_coef=0.5,
                   max_grad_norm=0.5, clip_range_vf=0.2, seed=seed, device="cpu",
                   policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]),
                                      activation_fn=torch.nn.Tanh))
    env = make_vec_env("CartPole-v1", n_envs=1, seed=seed)
    return DQN("MlpPolicy", env, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
               learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
               gradient_steps=128, exploration_fraction=0.08, exploration_final_eps=0.04,
               max_grad_norm=10, seed=seed, device="cpu",
               policy_kwargs=dict(net_arch=[256, 256]))

class Mark(BaseCallback):
    """Time from the first step after the warm-up (as on the robustgrad side)."""

    def __init__(self, warm):
        super().__init__()
        self.warm, self.t0, self.steps0 = warm, None, None

    def _on_step(self):
        if self.t0 is None and self.num_timesteps > self.warm:
            self.t0, self.steps0 = time.perf_counter(), self.num_timesteps
        return True

for seed in seeds:
    model = build(seed)
    mark = Mark(1024 if algo == "ppo" else 1000 + 256)
    model.learn(steps, callback=mark)
    train_s = time.perf_counter() - mark.t0
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=seed + 10_000)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=20, deterministic=True)
    print(json.dumps({"seed": seed, "mean_return": float(mean),
                      "steps_per_second": (model.num_timesteps - mark.steps0) / train_s}),
          flush=True)
'''


def _ours(algo, steps, seed):
    import agents

    if algo == "ppo":
        agent = agents.PPO(env="CartPole-v1", seed=seed, preset=None, **PPO_SETTINGS)
        warm = agent.config.n_steps * agent.config.num_envs
    else:
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


def _sb3(python, algo, steps, seeds, threads):
    proc = subprocess.run([python, "-c", _SB3_SCRIPT, algo, str(steps), json.dumps(seeds),
                           str(threads)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the SB3 side failed ({python}):\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sb3-python", required=True,
                   help="a Python interpreter with stable-baselines3 and torch installed")
    p.add_argument("--algos", nargs="+", default=["ppo"], choices=["ppo", "dqn"])
    p.add_argument("--steps", type=int, default=100_000, help="env steps per run (default 100k)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch.set_num_threads on the SB3 side (default 1: SB3's fastest setting "
                        "for these small networks on the 2-core machine, 2.8x its 2-thread speed)")
    p.add_argument("--json", default=None, help="write the results to this JSON file")
    args = p.parse_args(argv)
    if args.steps < 20_000:
        p.error(f"--steps: at least 20000 for a meaningful comparison, got {args.steps}")
    results = {}
    for algo in args.algos:
        ours = []
        for seed in args.seeds:
            ours.append(_ours(algo, args.steps, seed))
            print(f"robustgrad {algo} seed {seed}: return {ours[-1]['mean_return']:7.1f}, "
                  f"{ours[-1]['steps_per_second']:8.0f} steps/s", flush=True)
        theirs = _sb3(args.sb3_python, algo, args.steps, args.seeds, args.torch_threads)
        for r in theirs:
            print(f"SB3        {algo} seed {r['seed']}: return {r['mean_return']:7.1f}, "
                  f"{r['steps_per_second']:8.0f} steps/s", flush=True)
        ours_sps = float(np.median([r["steps_per_second"] for r in ours]))
        sb3_sps = float(np.median([r["steps_per_second"] for r in theirs]))
        print(f"{algo}: median steps/s robustgrad {ours_sps:,.0f} vs SB3 {sb3_sps:,.0f}: "
              f"{ours_sps / sb3_sps:.2f}x; mean return robustgrad "
              f"{np.mean([r['mean_return'] for r in ours]):.1f} vs SB3 "
              f"{np.mean([r['mean_return'] for r in theirs]):.1f} over seeds {args.seeds}",
              flush=True)
        results[algo] = {"robustgrad": ours, "sb3": theirs, "speed_ratio": ours_sps / sb3_sps}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
