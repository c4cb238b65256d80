"""Checks of ``benchmarks/robust_rl_leaderboard.py``'s ``--rows-from`` (no training): rows of one
agent from several runs merge into one row (the union of the attack cells, the worst case
recomputed), WocaR's settings keep agents apart, and runs that are not of the same agent or
protocol are refused before any agent is built."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import load_benchmark

ARGS = {"env": "CartPole-v1", "steps": 100_000, "robust_eps": 0.05, "kappa": None,
        "episodes": 8, "rs_steps": 10_000, "adversary_steps": 100_000}


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("robust_rl_leaderboard")


@pytest.fixture
def no_agents(monkeypatch):
    def refuse(*args, **kwargs):  # every agent is in the files: training one is a defect
        raise AssertionError("an agent was built")

    import agents

    monkeypatch.setattr(agents, "PPO", refuse)


def _row(method, seed, natural, cells, cpu=20.0):
    attacks = [{"attack": a, "eps": e, "median": m} for (a, e), m in cells.items()]
    worst: dict[str, float] = {}
    for (_, e), m in cells.items():
        worst[str(e)] = min(worst.get(str(e), float("inf")), m)
    return {"method": method, "seed": seed, "natural": natural, "worst": worst,
            "attacks": attacks, "train_cpu_seconds": cpu}


def _file(tmp_path, name, rows, **args):
    path = tmp_path / name
    path.write_text(json.dumps({"args": {**ARGS, **args}, "rows": rows}))
    return str(path)


def test_new_attack_cells_merge_into_the_agents_rows(bench, tmp_path, no_agents, capsys):
    cheap = _file(tmp_path, "cheap.json", [
        _row("sa", s, 500.0, {("rs", 0.02): 400.0 + s, ("rs", 0.05): 200.0 + s,
                              ("mad", 0.05): 500.0}, cpu=40.0 + s) for s in (0, 1, 2)],
        attacks="mad,rs", eps="0.02,0.05")
    # the second run: rs again (the reproduction check) and paad, at 0.05 only, other CPU
    learned = _file(tmp_path, "learned.json", [
        _row("sa", s, 500.0, {("rs", 0.05): 200.0 + s, ("paad", 0.05): 150.0 - 10 * s},
             cpu=99.0) for s in (0, 1, 2)], attacks="rs,paad", eps="0.05")
    out = tmp_path / "merged.json"
    assert bench.main(["--methods", "sa", "--seeds", "0", "1", "2", "--eps", "0.02,0.05",
                       "--rows-from", cheap, learned, "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    rows = merged["rows"]
    assert [r["seed"] for r in rows] == [0, 1, 2]
    for s, r in enumerate(rows):
        cells = {(c["attack"], c["eps"]): c["median"] for c in r["attacks"]}
        assert cells == {("rs", 0.02): 400.0 + s, ("rs", 0.05): 200.0 + s, ("mad", 0.05): 500.0,
                         ("paad", 0.05): 150.0 - 10 * s}
        # the worst case at 0.05 is paad's now; at 0.02 still rs's; the first run's CPU kept
        assert r["worst"] == {"0.02": 400.0 + s, "0.05": 150.0 - 10 * s}
        assert r["train_cpu_seconds"] == 40.0 + s
        assert r["sources"] == [cheap, learned]
    board = merged["leaderboard"]["sa"]
    assert board["worst"]["median"] == 140.0
    assert board["attacks"] == {"rs": 201.0, "mad": 500.0, "paad": 140.0}
    assert board["attack_seeds"] == {"rs": 3, "mad": 3, "paad": 3}
    assert board["train_cpu_seconds"] == 41.0


def test_wocar_settings_keep_agents_apart(bench, tmp_path, no_agents, capsys):
    ibp = _file(tmp_path, "ibp.json", [_row("wocar", 0, 500.0, {("rs", 0.05): 184.0})],
                attacks="rs", eps="0.05", wocar_set=[])
    crown = _file(tmp_path, "crown.json", [_row("wocar", 0, 500.0, {("rs", 0.05): 223.0})],
                  attacks="rs", eps="0.05", wocar_set=['bound = "crown-ibp"'])
    out = tmp_path / "merged.json"
    assert bench.main(["--methods", "wocar", "--seeds", "0", "--eps", "0.05", "--wocar-set",
                       'bound="crown-ibp"', "--rows-from", ibp, crown, "--json", str(out)]) == 0
    board = json.loads(out.read_text())["leaderboard"]
    assert {k: v["worst"]["median"] for k, v in board.items()} == {
        "wocar": 184.0, 'wocar bound="crown-ibp"': 223.0}


@pytest.mark.parametrize("second,message", [
    (_row("sa", 0, 475.0, {("paad", 0.05): 90.0}),
     "--rows-from: sa seed 0: natural return 500.0 in ['A'] but 475.0 in ['B']: not the same "
     "agent"),
    (_row("sa", 0, 500.0, {("rs", 0.05): 188.0}),
     "--rows-from: sa seed 0: rs at eps 0.05 is 187.0 in ['A'] but 188.0 in ['B']: not the "
     "same agent"),
])
def test_rows_of_different_agents_are_refused(bench, tmp_path, no_agents, capsys, second,
                                              message):
    a = _file(tmp_path, "a.json", [_row("sa", 0, 500.0, {("rs", 0.05): 187.0})])
    b = _file(tmp_path, "b.json", [second])
    with pytest.raises(SystemExit) as exc:
        bench.main(["--methods", "sa", "--seeds", "0", "--eps", "0.05", "--rows-from", a, b])
    assert exc.value.code == 2
    assert message.replace("'A'", repr(a)).replace("'B'", repr(b)) in capsys.readouterr().err


def test_files_of_another_protocol_are_refused(bench, tmp_path, no_agents, capsys):
    a = _file(tmp_path, "a.json", [_row("sa", 0, 500.0, {("rs", 0.05): 187.0})],
              episodes=3)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--methods", "sa", "--seeds", "0", "--eps", "0.05", "--rows-from", a])
    assert exc.value.code == 2
    assert f"--rows-from {a}: episodes is 3 there, 8 in this run: one protocol only" in \
        capsys.readouterr().err


def test_atla_sa_takes_the_cartpole_kappa_unless_given(bench):
    # kappa 3 (SA-PPO's) on top of ATLA's adversary left CartPole near-uniform (issue 25)
    assert bench.robust_spec("atla-sa", 0.05, None).kappa == 0.1
    assert bench.robust_spec("atla-sa", 0.05, 1.0).kappa == 1.0
    assert bench.robust_spec("atla", 0.05, None).kappa is None
    assert bench.robust_spec("atla-sa", 0.05, None).name == "atla-sa"


def test_rows_from_seeds_outside_seeds_are_counted_and_said(bench, tmp_path, no_agents, capsys):
    """``--rows-from`` takes every row of the methods in the files: seeds beyond ``--seeds``
    enter the leaderboard, and the run names them (nothing is trained for them)."""
    runs = _file(tmp_path, "runs.json", [
        _row(m, s, 500.0, {("rs", 0.05): 200.0 + s}) for m in ("sa", "vanilla") for s in (0, 1, 2)],
        attacks="rs", eps="0.05")
    out = tmp_path / "board.json"
    assert bench.main(["--methods", "sa,vanilla", "--seeds", "0", "1", "--eps", "0.05",
                       "--rows-from", runs, "--json", str(out)]) == 0
    assert ("--rows-from: the leaderboard also counts seeds outside --seeds: sa 2; vanilla 2"
            in capsys.readouterr().out)
    board = json.loads(out.read_text())["leaderboard"]
    assert board["sa"]["worst"]["n"] == 3 and board["sa"]["beats"]["vanilla"]["n_y"] == 3
    assert bench.main(["--methods", "sa", "--seeds", "0", "1", "2", "--eps", "0.05",
                       "--rows-from", runs]) == 0
    assert "outside --seeds" not in capsys.readouterr().out


def test_seed_power_counts_the_draws_whose_interval_excludes_one_half(bench):
    """Methods far apart are told apart by every draw, identical ones by none; at a moderate
    gap more seeds decide more often (N(1, 1) against N(0, 1): P = 0.76)."""
    assert bench.seed_power([300.0, 320.0], [100.0, 90.0], [1, 3, 10], draws=10, reps=100) == {
        1: 1.0, 3: 1.0, 10: 1.0}
    assert bench.seed_power([200.0] * 4, [200.0] * 4, [5, 40], draws=10, reps=100) == {
        5: 0.0, 40: 0.0}
    rng = np.random.default_rng(0)
    x, y = rng.normal(1.0, 1.0, 30), rng.normal(0.0, 1.0, 30)
    power = bench.seed_power(x, y, [4, 60], draws=60, reps=300)
    assert power[4] < 0.4 < 0.9 < power[60], power
    with pytest.raises(ValueError, match=r"counts must be seed counts >= 1, got \[0\]"):
        bench.seed_power(x, y, [0])
    with pytest.raises(ValueError, match="draws must be >= 1, got 0"):
        bench.seed_power(x, y, [5], draws=0)


def test_seed_power_option_prints_each_pair_and_keeps_it(bench, tmp_path, no_agents, capsys):
    runs = _file(tmp_path, "runs.json", [
        _row(m, s, 500.0, {("rs", 0.05): (300.0 if m == "sa" else 100.0) + s})
        for m in ("sa", "vanilla") for s in (0, 1, 2)], attacks="rs", eps="0.05")
    out = tmp_path / "board.json"
    assert bench.main(["--methods", "sa,vanilla", "--seeds", "0", "1", "2", "--eps", "0.05",
                       "--rows-from", runs, "--seed-power", "3,8", "--power-draws", "20",
                       "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert ("seeds per method that would tell sa from vanilla at worst@0.05 (resampling their "
            "3 and 3 seeds, 20 draws): 3: 100%, 8: 100%") in printed
    power = json.loads(out.read_text())["seed_power"]
    assert power == {"draws": 20, "pairs": {"sa vs vanilla": {"3": 1.0, "8": 1.0}}}
    for bad, message in ((["--seed-power", "0,5"], "seed counts must be >= 1"),
                         (["--seed-power", "ten"], "comma-separated seed counts"),
                         (["--power-draws", "0"], "--power-draws must be >= 1")):
        with pytest.raises(SystemExit):
            bench.main(["--methods", "sa", "--rows-from", runs, *bad])
        assert message in capsys.readouterr().err


def test_agent_settings_reach_every_agent_and_fix_the_protocol(bench, tmp_path, monkeypatch,
                                                                capsys):
    built = []

    class FirstAgentBuiltError(Exception):
        pass

    def record(**kwargs):  # the first agent's arguments are all this test needs
        built.append(kwargs)
        raise FirstAgentBuiltError

    import agents

    monkeypatch.setattr(agents, "PPO", record)
    for method in ("vanilla", "wocar"):
        with pytest.raises(FirstAgentBuiltError):
            bench.main(["--methods", method, "--seeds", "3", "--eps", "0.05", "--agent-set",
                        "hidden_sizes=[128, 128]", "--agent-set", 'activation="relu"'])
    assert [b["hidden_sizes"] for b in built] == [[128, 128], [128, 128]]
    assert [b["activation"] for b in built] == ["relu", "relu"]
    assert [b["seed"] for b in built] == [3, 3]
    assert "robust" not in built[0] and isinstance(built[1]["robust"], agents.WocaR)
    # a file of the preset's agents (written before the option existed: no agent_set) is
    # another protocol than a run of wider agents, and the same protocol as a run without it
    old = _file(tmp_path, "old.json", [_row("sa", 0, 500.0, {("rs", 0.05): 187.0})])
    with pytest.raises(SystemExit):
        bench.main(["--methods", "sa", "--seeds", "0", "--eps", "0.05", "--agent-set",
                    "hidden_sizes=[128,128]", "--rows-from", old])
    assert (f"--rows-from {old}: agent_set is [] there, ['hidden_sizes=[128, 128]'] in this "
            "run: one protocol only") in capsys.readouterr().err
    assert bench.main(["--methods", "sa", "--seeds", "0", "--eps", "0.05",
                       "--rows-from", old]) == 0


@pytest.mark.parametrize("item,message", [
    ("robust_eps=0.1", "--agent-set: robust_eps is set by the script's own options"),
    ("wocar_gamma=0.9", "--agent-set: wocar_gamma is set by the script's own options"),
    ("seed=4", "--agent-set: seed is set by the script's own options"),
    ("hidden_size=[3]", "hidden_size is not a field of PPOConfig"),
    ("hidden_sizes=[0]", "hidden_sizes must be an int in [1, 65536], got 0"),
    ("hidden_sizes", "--agent-set: KEY=VALUE, got 'hidden_sizes'"),
    ("activation=relu", "--agent-set: activation's value must be JSON"),
])
def test_agent_settings_are_refused_by_name_before_training(bench, no_agents, capsys, item,
                                                           message):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--methods", "vanilla", "--seeds", "0", "--eps", "0.05", "--agent-set",
                    item])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
