"""``benchmarks/robust_rl_wocar_dqn.py --keep-best --sa-kappa``: the issue-10 protocol's training
(the preset's periodic evaluation keeping the best weights) and SA-DQN's hinge weight reach the
agent, and the periodic evaluations' CPU is taken out of the cost compared."""

from __future__ import annotations

import json
import os

from conftest import load_benchmark

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


def test_keep_best_and_sa_kappa_reach_the_agent(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(BENCHMARKS)  # the script imports robust_rl, its neighbour
    bench = load_benchmark("robust_rl_wocar_dqn")
    out = tmp_path / "dqn.json"
    # 512 steps (two of the preset's 256-step rounds, before its 1,000 learning starts: the
    # plumbing is checked, not the learning); the preset evaluates every 5,000 steps, so the
    # only periodic evaluation is the final one
    assert bench.main(["--kinds", "sa", "--seeds", "0", "--steps", "512", "--keep-best",
                       "--sa-kappa", "0.1", "--attacks", "random", "--episodes", "1",
                       "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["robust_kappa"] == 0.1  # the preset's is 0.5
    assert row["best_eval_steps"] == 512 and row["restored_best"] is False
    assert 0 < row["periodic_eval_cpu_seconds"] < row["train_cpu_seconds"]
    assert row["train_cpu_seconds_without_evals"] == (
        row["train_cpu_seconds"] - row["periodic_eval_cpu_seconds"])
    # without --keep-best no evaluation runs inside training, and the preset's kappa is kept
    assert bench.main(["--kinds", "sa", "--seeds", "0", "--steps", "512", "--attacks",
                       "random", "--episodes", "1", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["robust_kappa"] == 0.5 and "best_eval_steps" not in row
    assert row["periodic_eval_cpu_seconds"] == 0.0
    assert row["train_cpu_seconds_without_evals"] == row["train_cpu_seconds"]
    assert "sa       natural" in capsys.readouterr().out
