"""Bit-identity of seeded RL training across versions of the tree.

Trains short seeded runs that cover every shipped preset (``agents/presets.json``) and the
training paths around them, and prints, for each run, the SHA-256 of the final weights
(``Agent.get_weights()``: networks and observation statistics, in order, with dtype and shape)
and of the per-update history (``Agent.history``, JSON with exact float reprs). Run it from
snapshots of two commits and compare the JSON files: equal digests mean the two trees train
those runs to the same bits, so a learning figure measured on one carries over to the other.

Rows:

- ``cli-<preset>``: ``robustgrad train-agent --algo A --env E --steps S --seed 0`` and no other
  flag (the preset decides every value, keep-best included), in-process, with a short ``S``;
  the saved agent is loaded back and hashed; the command's 20-episode evaluation is reported.
- the others build agents in Python (``preset`` as named, then overrides): the graph backend,
  graph + XLA, A2C on the graph backend, REINFORCE, DQN on the graph backend with and without
  keep-best and without the preset's learning-rate decay, PPO with 2 seeds on the seed axis.

Each run costs seconds; all rows take about a minute and a half on one core. The script imports
the tree it sits in (it puts its repository root first on ``sys.path``): to measure another
commit, copy it into that commit's snapshot and run the copy there.

Examples::

    git -C REPO archive 42526da | tar -x -C /tmp/before
    cp benchmarks/seeded_identity.py /tmp/before/benchmarks/
    (cd /tmp/before && PYTHONPATH=$PWD python benchmarks/seeded_identity.py --json ../before.json)
    python benchmarks/seeded_identity.py --json after.json
    python benchmarks/seeded_identity.py --rows ppo-graph dqn-graph
    python benchmarks/seeded_identity.py --compare before.json after.json

With ``--weights-dir DIR`` each row's final weights are also written to ``DIR/<row>.npz``; the
comparison then prints the largest absolute difference of the weights of a row that differs.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

# preset name -> short budget for the CLI rows (the DQN ones reach two of the preset's
# evaluations every 5,000 steps, so keep-best chooses between them)
CLI_STEPS = {
    "ppo-CartPole-v1": 4096,
    "ppo-Acrobot-v1": 4096,
    "ppo-Pendulum-v1": 4096,
    "ppo-MountainCarContinuous-v0": 4096,
    "a2c-CartPole-v1": 4000,
    "dqn-CartPole-v1": 10_500,
    "dqn-MountainCar-v0": 10_500,
}

# name -> (algorithm, env, preset, steps, overrides, keep-best evaluation interval or None)
API_ROWS = {
    "ppo-graph": ("ppo", "CartPole-v1", "ppo-CartPole-v1", 4096, {"backend": "graph"}, None),
    "ppo-graph-xla": ("ppo", "CartPole-v1", "ppo-CartPole-v1", 4096,
                      {"backend": "graph", "jit_compile": True}, None),
    "ppo-graph-norm": ("ppo", "Acrobot-v1", "ppo-Acrobot-v1", 4096, {"backend": "graph"}, None),
    "ppo-graph-pendulum": ("ppo", "Pendulum-v1", "ppo-Pendulum-v1", 4096,
                           {"backend": "graph"}, None),
    "ppo-gym-2seeds": ("ppo", "CartPole-v1", "ppo-CartPole-v1", 2048, {"num_seeds": 2}, None),
    "ppo-graph-2seeds": ("ppo", "CartPole-v1", "ppo-CartPole-v1", 2048,
                         {"backend": "graph", "num_seeds": 2}, None),
    "a2c-graph": ("a2c", "CartPole-v1", "a2c-CartPole-v1", 4000, {"backend": "graph"}, None),
    "reinforce-gym": ("reinforce", "CartPole-v1", None, 4096, {}, None),
    "dqn-graph": ("dqn", "CartPole-v1", "dqn-CartPole-v1", 6000, {"backend": "graph"}, None),
    "dqn-graph-keepbest": ("dqn", "CartPole-v1", "dqn-CartPole-v1", 6000,
                           {"backend": "graph"}, 2000),
    "dqn-gym-constant-lr": ("dqn", "CartPole-v1", "dqn-CartPole-v1", 6000,
                            {"learning_rate_final": None, "exploration_fraction": 0.16}, None),
    "dqn-graph-mountaincar": ("dqn", "MountainCar-v0", "dqn-MountainCar-v0", 6000,
                              {"backend": "graph"}, None),
}

ROW_NAMES = [f"cli-{p}" for p in CLI_STEPS] + list(API_ROWS)


def weights_digest(weights) -> str:
    """SHA-256 over each array's dtype, shape and bytes, in order."""
    h = hashlib.sha256()
    for w in weights:
        w = np.ascontiguousarray(w)
        h.update(f"{w.dtype.str}{w.shape}".encode())
        h.update(w.tobytes())
    return h.hexdigest()


def history_digest(history) -> str:
    """SHA-256 of the history as JSON (floats by their exact repr, NaN as NaN)."""
    return hashlib.sha256(json.dumps(history, sort_keys=True).encode()).hexdigest()


def run_cli(preset: str, seed: int = 0) -> tuple[dict, list]:
    """``robustgrad train-agent`` on ``preset`` with its short budget and no other flag."""
    import agents
    from robustgrad.cli import main as cli_main

    algo, env = preset.split("-", 1)
    steps = CLI_STEPS[preset]
    with tempfile.TemporaryDirectory(prefix="seeded-identity-") as root:
        out = os.path.join(root, "run")
        argv = ["train-agent", "--algo", algo, "--env", env, "--steps", str(steps),
                "--seed", str(seed), "--out", out, "--no-progress"]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            status = cli_main(argv)
        if status != 0:
            raise RuntimeError(f"train-agent {preset} exited with {status}:\n{buf.getvalue()}")
        with open(os.path.join(out, "evaluation.json")) as f:
            evaluation = json.load(f)["mean_return"]
        agent = agents.load(out)
        kept = [line for line in buf.getvalue().splitlines() if line.startswith("kept")]
        weights = agent.get_weights()
        return {"weights": weights_digest(weights), "history": history_digest(agent.history),
                "steps": int(agent.num_timesteps.numpy()), "evaluation": evaluation,
                "kept": kept[0] if kept else None}, weights


def run_api(name: str, seed: int = 0) -> tuple[dict, list]:
    """The Python-API row ``name`` of :data:`API_ROWS`."""
    import agents

    algo, env, preset, steps, overrides, keep_every = API_ROWS[name]
    agent = agents.algorithm(algo)(env=env, seed=seed, preset=preset, **overrides)
    callbacks = []
    if keep_every is not None:
        evaluator = agents.EvalCallback(keep_every, keep_best=True)
        callbacks.append(evaluator)
    agent.learn(steps, callbacks=callbacks, progress_bar=False)
    weights = agent.get_weights()
    row = {"weights": weights_digest(weights), "history": history_digest(agent.history),
           "steps": int(agent.num_timesteps.numpy())}
    if keep_every is not None:
        row["kept"] = (f"step {evaluator.best_steps}, return {evaluator.best_return:.1f}"
                       if evaluator.restored else "final weights")
    return row, weights


def run_row(name: str, weights_dir: str | None = None) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    row, weights = run_cli(name[4:]) if name.startswith("cli-") else run_api(name)
    row.update(seconds=time.perf_counter() - t0, cpu_seconds=time.process_time() - c0)
    if weights_dir is not None:
        os.makedirs(weights_dir, exist_ok=True)
        np.savez(os.path.join(weights_dir, f"{name}.npz"), *weights)
        row["weights_file"] = os.path.abspath(os.path.join(weights_dir, f"{name}.npz"))
    return row


def largest_difference(path_a: str, path_b: str) -> str:
    """The largest absolute difference between two rows' saved weights, as text."""
    with np.load(path_a) as a, np.load(path_b) as b:
        if sorted(a.files) != sorted(b.files) or any(a[k].shape != b[k].shape for k in a.files):
            return "weights of different shapes"
        diff = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]), initial=0.0))
                   for k in a.files)
        scale = max(float(np.max(np.abs(a[k]), initial=0.0)) for k in a.files)
    return f"largest |difference| {diff:.3g} (largest |weight| before {scale:.3g})"


def compare(before_path: str, after_path: str) -> int:
    """Print each row of two result files as equal or different; 1 if any differs."""
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    differs = 0
    print(f"{'row':36s} weights    history    ({before.get('commit') or before_path} -> "
          f"{after.get('commit') or after_path})")
    for name in before["rows"]:
        a, b = before["rows"][name], after["rows"].get(name)
        if b is None:
            print(f"{name:36s} not comparable (not run on {after.get('commit') or after_path})")
            continue
        if "error" in a or "error" in b:
            print(f"{name:36s} not comparable ({a.get('error') or b.get('error')})")
            continue
        w = "equal" if a["weights"] == b["weights"] else "DIFFERENT"
        h = "equal" if a["history"] == b["history"] else "DIFFERENT"
        differs += (w != "equal") or (h != "equal")
        extra = ""
        if w != "equal" and a.get("weights_file") and b.get("weights_file"):
            extra = largest_difference(a["weights_file"], b["weights_file"])
        print(f"{name:36s} {w:10s} {h:10s} {extra}")
    return 1 if differs else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", nargs="*", default=ROW_NAMES, choices=ROW_NAMES, metavar="ROW",
                   help=f"rows to run (default all): {', '.join(ROW_NAMES)}")
    p.add_argument("--json", default=None, help="write the digests to this JSON file")
    p.add_argument("--commit", default=None, help="label stored with the results")
    p.add_argument("--weights-dir", default=None, help="also save each row's weights here")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                   help="compare two result files instead of training")
    args = p.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    out = {"commit": args.commit, "load_average_before": os.getloadavg(), "rows": {}}
    for name in args.rows:
        try:
            row = run_row(name, args.weights_dir)
        except Exception as exc:  # a row the tree cannot run (an older API) is reported
            row = {"error": f"{type(exc).__name__}: {exc}"}
        out["rows"][name] = row
        if "error" in row:
            print(f"{name:36s} error: {row['error']}", flush=True)
        else:
            extra = "".join(f"; {k} {row[k]}" for k in ("evaluation", "kept") if row.get(k))
            print(f"{name:36s} weights {row['weights'][:16]} history {row['history'][:16]} "
                  f"({row['steps']} steps, {row['seconds']:.0f} s wall, "
                  f"{row['cpu_seconds']:.0f} CPU s{extra})", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    out["load_average_after"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
