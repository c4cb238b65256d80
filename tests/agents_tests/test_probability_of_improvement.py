"""``agents.probability_of_improvement`` (rliable's P(X > Y) on one task) against hand-counted
pairs, its bootstrap interval, its refusals, and the robust-RL leaderboard's pairwise lines."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import agents

from conftest import load_benchmark


def _count_pairs(x, y):
    """The statistic by enumeration: 1 per pair with x above, 1/2 per tie, over all pairs."""
    return sum(1.0 if a > b else 0.5 if a == b else 0.0
               for a, b in itertools.product(x, y)) / (len(x) * len(y))


def test_the_point_estimate_counts_the_pairs_a_run_of_x_wins():
    assert agents.probability_of_improvement([3.0, 4.0], [1.0, 2.0, 5.0])["p"] == pytest.approx(4 / 6)
    assert agents.probability_of_improvement([9.0, 8.0], [1.0, 2.0])["p"] == 1.0
    assert agents.probability_of_improvement([1.0, 2.0], [9.0, 8.0])["p"] == 0.0
    assert agents.probability_of_improvement([2.0, 2.0], [2.0])["p"] == 0.5
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 6, 7).astype(float), rng.integers(0, 6, 4).astype(float)  # many ties
    out = agents.probability_of_improvement(x, y)
    assert out["p"] == pytest.approx(_count_pairs(x, y))
    # P(X > Y) + P(Y > X) = 1, ties counted half on each side
    assert out["p"] + agents.probability_of_improvement(y, x)["p"] == pytest.approx(1.0)
    assert (out["n_x"], out["n_y"], out["confidence"]) == (7, 4, 0.95)


def test_the_interval_holds_the_estimate_narrows_with_runs_and_repeats_by_seed():
    rng = np.random.default_rng(0)
    x, y = rng.normal(1.0, 1.0, 6), rng.normal(0.0, 1.0, 6)
    few = agents.probability_of_improvement(x, y, seed=5)
    assert few["ci"][0] <= few["p"] <= few["ci"][1]
    assert 0.0 <= few["ci"][0] < few["ci"][1] <= 1.0
    assert agents.probability_of_improvement(x, y, seed=5) == few  # the same draws
    # every resample of a clear winner wins every pair: the interval is the point
    assert agents.probability_of_improvement([5.0, 6.0], [1.0, 2.0])["ci"] == [1.0, 1.0]
    many = agents.probability_of_improvement(rng.normal(1.0, 1.0, 300), rng.normal(0.0, 1.0, 300))
    assert many["ci"][1] - many["ci"][0] < (few["ci"][1] - few["ci"][0]) / 2
    # two draws of N(1, 1) against N(0, 1): P(X > Y) = Phi(1 / sqrt 2) = 0.760
    assert many["ci"][0] < 0.760 < many["ci"][1]
    wider = agents.probability_of_improvement(x, y, confidence=0.99, seed=5)
    assert wider["ci"][0] <= few["ci"][0] and wider["ci"][1] >= few["ci"][1]


def test_inputs_are_not_modified():
    x = np.array([3.0, 1.0, 2.0])
    agents.probability_of_improvement(x, [2.0])
    assert x.tolist() == [3.0, 1.0, 2.0]


@pytest.mark.parametrize("kwargs, message", [
    ({"x": [], "y": [1.0]}, "x must hold at least one number, got none"),
    ({"x": [1.0], "y": []}, "y must hold at least one number, got none"),
    ({"x": [1.0, float("nan")], "y": [1.0]}, "x must be finite, got nan"),
    ({"x": [1.0], "y": [float("inf")]}, "y must be finite, got inf"),
    ({"x": [1.0], "y": [1.0], "confidence": 1.0}, r"confidence must be in \(0, 1\), got 1.0"),
    ({"x": [1.0], "y": [1.0], "reps": 0}, "reps"),
])
def test_bad_arguments_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        agents.probability_of_improvement(**kwargs)


def test_the_leaderboard_gives_each_pair_of_methods_its_probability(capsys):
    bench = load_benchmark("robust_rl_leaderboard")

    def row(method, seed, worst):
        return {"method": method, "seed": seed, "natural": 500.0, "worst": {"0.05": worst},
                "attacks": [{"attack": "rs", "eps": 0.05, "median": worst}],
                "train_cpu_seconds": 10.0}

    sa, wocar = [240.0, 250.0, 260.0], [230.0, 500.0, 255.0]
    rows = [row("sa", s, v) for s, v in enumerate(sa)] + [row("wocar", s, v) for s, v in enumerate(wocar)]
    board = bench.leaderboard(rows, 0.05)
    assert board["wocar"]["beats"]["sa"]["p"] == pytest.approx(_count_pairs(wocar, sa))  # 5 of 9
    assert board["sa"]["beats"]["wocar"]["p"] == pytest.approx(4 / 9)
    assert set(board["sa"]["beats"]) == {"wocar"}
    bench.print_table(board, 0.05)
    lo, hi = board["sa"]["beats"]["wocar"]["ci"]
    assert f"P(sa > wocar) worst@0.05 = 0.44 [{lo:.2f}, {hi:.2f}] (3 and 3 seeds)" in capsys.readouterr().out
