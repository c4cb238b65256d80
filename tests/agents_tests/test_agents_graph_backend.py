"""The graph backend of the agents, many seeds in one run, and ``train-agent --backend/--seeds``.

Agents are expensive to trace on 2 shared cores, so the configs are small (few envs, short
rollouts); learning tests are short (the seed axis: test_agents_seed_axis.py).
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.algorithms.many import bootstrap_ci, check_seeds, iqm, summarize_runs, train_many
from agents.backends.graph_backend import GraphBackendEnv
from robustgrad.cli import main
from robustgrad.commands._train_seeds import parse_seeds

SMALL = dict(env="CartPole-v1", backend="graph", num_envs=2, n_steps=16, preset=None)


def _op_types(concrete) -> set:
    graph_def = concrete.graph.as_graph_def()
    ops = {n.op for n in graph_def.node}
    for fn in graph_def.library.function:
        ops |= {n.op for n in fn.node_def}
    return ops


# -- bad input ---------------------------------------------------------------------------------


def test_graph_backend_refuses_other_env_ids_before_any_work():
    with pytest.raises(ValueError, match=r"backend='graph' needs env to be one of \('CartPole-v1', "
                                         r"'Acrobot-v1', 'MountainCar-v0', 'Pendulum-v1', "
                                         r"'MountainCarContinuous-v0'\) .*got 'FrozenLake-v1'"):
        agents.PPO(env="FrozenLake-v1", backend="graph")
    with pytest.raises(ValueError, match=r"backend must be one of \('gymnasium', 'graph'\), got 'jax'"):
        agents.PPOConfig(backend="jax")
    with pytest.raises(ValueError, match="rollout_workers: the graph backend"):
        agents.PPO(env="CartPole-v1", backend="graph", rollout_workers=2)


def test_seed_lists_and_num_seeds_are_checked():
    assert check_seeds(num_seeds=3, first_seed=5) == [5, 6, 7]
    assert check_seeds([3, 1]) == [3, 1]
    for kwargs, message in (({"num_seeds": 0}, "num_seeds must be an int >= 1, got 0"),
                            ({"num_seeds": -2}, "num_seeds must be an int >= 1, got -2"),
                            ({"seeds": [1, 1]}, r"seeds must be distinct, got \[1, 1\]"),
                            ({"seeds": []}, "seeds must hold at least one seed"),
                            ({"seeds": [1], "num_seeds": 1}, "exactly one of seeds")):
        with pytest.raises(ValueError, match=message):
            check_seeds(**kwargs)
    cfg = agents.PPOConfig(**{k: v for k, v in SMALL.items() if k != "preset"})
    with pytest.raises(ValueError, match="num_seeds must be an int >= 1, got 0"):
        train_many(cfg, num_seeds=0, steps=32)
    with pytest.raises(ValueError, match="config must be a PPOConfig, A2CConfig, "
                                         "REINFORCEConfig or DQNConfig"):
        train_many(agents.core.config.AgentConfig(), seeds=[0], steps=32)
    with pytest.raises(ValueError, match="design must be one of"):
        train_many(cfg, seeds=[0], steps=32, design="fast")


@pytest.mark.parametrize("text", ["", "a", "3-1", "0-2,2", "-1", "1,,2", "0-"])
def test_cli_seeds_that_do_not_parse_are_one_line_errors(text, capsys):
    with pytest.raises(ValueError, match="--seeds must be seeds >= 0 like 0-7"):
        parse_seeds(text)
    assert main(["train-agent", "--seeds", text, "--backend", "graph"]) == 2
    err = capsys.readouterr().err
    assert f"--seeds must be seeds >= 0 like 0-7 or 0,2,5 (ranges ascending, no repeats), got {text!r}" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_parse_seeds_ranges_and_lists():
    assert parse_seeds("0-7") == list(range(8))
    assert parse_seeds("0,2,5") == [0, 2, 5]
    assert parse_seeds(" 1-2 , 9 ") == [1, 2, 9]
    assert main(["train-agent", "--seeds", "0-1", "--seed", "5"]) == 2  # which seeds? refused


# -- the compiled environment --------------------------------------------------------------


def test_graph_backend_env_records_every_episode_in_order():
    env = GraphBackendEnv("CartPole-v1", num_envs=3, seed=4)
    env.reset()
    step = tf.function(env.step_graph)
    rng = np.random.default_rng(0)
    ret, length = np.zeros(3), np.zeros(3, int)
    expected = []
    for _ in range(120):
        _obs, reward, term, trunc, _fin = step(tf.constant(rng.integers(0, 2, 3), tf.int32))
        ret += reward.numpy()
        length += 1
        done = (term | trunc).numpy()
        expected += [(float(ret[i]), int(length[i])) for i in np.nonzero(done)[0]]
        ret[done], length[done] = 0, 0
    got = env.drain_episodes()
    assert len(expected) >= 5 and got == expected
    assert env.drain_episodes() == []


def test_graph_backend_env_ring_buffer_keeps_the_latest_episodes():
    env = GraphBackendEnv("CartPole-v1", num_envs=4, seed=0, episode_capacity=3)
    env.reset()
    step = tf.function(env.step_graph)
    lengths = []
    length = np.zeros(4, int)
    for _ in range(40):  # always left: every episode ends within ~10 steps
        _o, _r, term, trunc, _f = step(tf.zeros([4], tf.int32))
        length += 1
        done = (term | trunc).numpy()
        lengths += [int(length[i]) for i in np.nonzero(done)[0]]
        length[done] = 0
    assert len(lengths) > 3
    assert [n for _, n in env.drain_episodes()] == lengths[-3:]


# -- agents on the graph backend -----------------------------------------------------------


def test_graph_ppo_iteration_is_one_compiled_call_without_python_steps():
    agent = agents.PPO(**SMALL, seed=0)
    agent.learn(3 * 32, progress_bar=False)
    assert agent.trace_counts == {"iteration": 1, "rollout": 1, "train": 1}
    ops = _op_types(agent._iteration.get_concrete_function())
    assert not ops & {"PyFunc", "EagerPyFunc", "PyFuncStateless"}
    assert int(agent.num_timesteps.numpy()) == 96 and len(agent.history) == 3
    # the gymnasium backend steps through numpy_function (what the graph backend removes)
    gym_agent = agents.PPO(**{**SMALL, "backend": "gymnasium"}, seed=0)
    gym_agent.learn(32, progress_bar=False)
    assert _op_types(gym_agent._rollout.get_concrete_function()) & {"PyFunc", "EagerPyFunc"}


@pytest.mark.parametrize("algo", ["A2C", "REINFORCE", "DQN"])
def test_every_algorithm_accepts_the_graph_backend(algo):
    cls = getattr(agents, algo)
    extra = {} if algo == "DQN" else {"n_steps": 16}
    agent = cls(env="CartPole-v1", backend="graph", num_envs=2, preset=None, seed=1, **extra)
    agent.learn(400, progress_bar=False)
    if algo == "DQN":  # collection (the env steps) and the gradient steps: one compiled call
        concrete = agent._iteration.get_concrete_function(
            tf.constant(1), tf.constant(0, tf.int64), tf.constant(1.0), tf.constant(1),
            tf.constant(1.0))
        assert agent.trace_counts == {"iteration": 1, "collect": 1, "record": 1, "train": 1}
    else:
        concrete = agent._iteration.get_concrete_function()
        assert agent.trace_counts == {"iteration": 1, "rollout": 1, "train": 1}
    assert not _op_types(concrete) & {"PyFunc", "EagerPyFunc"}
    assert len(agent.episode_returns) > 0  # episodes recorded in the graph reach the learner
    assert all(1 <= r <= 500 for r in agent.episode_returns)


def test_rollout_action_draw_equals_the_policy_distribution_sample():
    agent = agents.PPO(env="CartPole-v1", backend="graph", num_envs=64, preset=None, seed=0)
    obs = tf.random.stateless_normal([64, 4], seed=[1, 2])
    for s in range(3):  # the rollout's one stateless_categorical is Categorical.sample
        seed = tf.constant([s, 7], tf.int32)
        fast = agent._sample_actions(obs[None], seed[None])[0].numpy()  # the seed axis of one
        np.testing.assert_array_equal(fast, agent.distribution(obs).sample(seed=seed).numpy())
        assert fast.dtype == np.int32 and 0 < fast.sum() < 64


def test_graph_dqn_one_call_iteration_equals_collect_then_train_calls():
    kwargs = dict(env="CartPole-v1", backend="graph", num_envs=2, preset=None, seed=3,
                  learning_starts=64, train_freq=8, gradient_steps=4, batch_size=16,
                  target_update_interval=20, hidden_sizes=(16,))
    fused = agents.DQN(**kwargs)
    two_calls = agents.DQN(**kwargs)
    two_calls.fuse_graph_iteration = False
    for agent in (fused, two_calls):
        agent.learn(256, progress_bar=False)
    assert fused.trace_counts["iteration"] == 1 and "iteration" not in two_calls.trace_counts
    assert int(fused.num_updates.numpy()) == int(two_calls.num_updates.numpy()) == 13
    for x, y in zip(fused.get_weights() + [v.numpy() for v in fused.q_target.trainable],
                    two_calls.get_weights() + [v.numpy() for v in two_calls.q_target.trainable]):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    for key in ("steps", "episode_return"):  # NaN before the first episode ends: equal too
        np.testing.assert_array_equal([h[key] for h in fused.history],
                                      [h[key] for h in two_calls.history])
    assert int(fused.buffer.size.numpy()) == 256
    np.testing.assert_array_equal(fused.buffer.actions.numpy(), two_calls.buffer.actions.numpy())
    assert float(fused.epsilon.numpy()) == float(two_calls.epsilon.numpy())


def test_graph_dqn_learns_cartpole_quickly():
    agent = agents.DQN(env="CartPole-v1", backend="graph", seed=0, train_freq=64,
                       gradient_steps=32, hidden_sizes=(64, 64))  # the preset, smaller
    agent.learn(6_000, progress_bar=False)  # measured: mean ~92 (seed 0), ~90 (seed 1)
    assert np.mean(agent.episode_returns) > 60  # random policy ~22


def test_graph_rollout_applies_the_adv_observation_attack_within_eps():
    agent = agents.PPO(env="CartPole-v1", backend="graph", num_envs=2, n_steps=16, preset=None,
                       seed=0, robust="adv", robust_eps=0.05, robust_eps_warmup=0.0,
                       robust_attack="mad", robust_steps=3)
    assert type(agent.env).__name__ == "GraphBackendEnv"
    agent.learn(64, progress_bar=False)  # trains through the one compiled iteration
    assert agent.trace_counts == {"iteration": 1, "rollout": 1, "train": 1}
    assert len(agent.history) == 2 and np.isfinite(agent.history[-1]["episode_return"])
    batch = tf.function(agent._rollout_graph)()
    stored, clean_next = batch["obs"].numpy()[1:], batch["final_obs"].numpy()[:-1]
    going_on = ~(batch["terminated"] | batch["truncated"]).numpy()[:-1]
    shift = np.abs(stored - clean_next)[going_on]  # stored obs: attacked; final_obs: clean
    assert shift.max() <= 0.05 + 1e-6 and shift.mean() > 0.01  # moved, within eps


def test_graph_trained_agent_evaluates_on_gymnasium_with_the_same_returns():
    graph_agent = agents.PPO(**SMALL, seed=3)
    graph_agent.learn(64, progress_bar=False)
    gym_agent = agents.PPO(**{**SMALL, "backend": "gymnasium"}, seed=3)
    gym_agent.set_weights(graph_agent.get_weights())
    a = graph_agent.evaluate(4, seed=123)
    b = gym_agent.evaluate(4, seed=123)
    assert a["returns"] == b["returns"] and a["lengths"] == b["lengths"]
    assert type(graph_agent.env).__name__ == "GraphBackendEnv"


def test_graph_agent_saves_loads_and_resumes_from_a_fresh_env_reset(tmp_path):
    agent = agents.PPO(**SMALL, seed=2)
    agent.learn(64, progress_bar=False)
    agent.save(tmp_path / "a")
    loaded = agents.load(tmp_path / "a")
    assert loaded.config.backend == "graph"
    for x, y in zip(agent.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(x, y)
    assert not loaded._env_ready  # the env state is not saved: reset from config.seed on resume
    loaded.learn(32, progress_bar=False)
    assert int(loaded.num_timesteps.numpy()) == 96


def test_graph_ppo_learns_cartpole_quickly():
    agent = agents.PPO(env="CartPole-v1", backend="graph", seed=0)  # the preset
    agent.learn(8_192, progress_bar=False)  # measured: mean ~100 (seed 0), ~144 (seed 1)
    assert np.mean(agent.episode_returns) > 60  # random policy ~22


# -- many seeds ------------------------------------------------------------------------------


# -- statistics over seeds and the CLI -------------------------------------------------------


def test_iqm_and_bootstrap_against_hand_values():
    assert iqm([1, 2, 3, 4]) == 2.5  # middle two
    assert iqm([10, 0, 1, 2, 3, 4, 5, 100]) == 3.5  # trims 0, 1 and 10, 100
    x = np.random.default_rng(0).normal(10, 1, 200)
    low, high = bootstrap_ci(x)
    se = x.std() / np.sqrt(x.size)
    assert low < x.mean() < high
    assert abs((high - low) - 2 * 1.96 * se) < 0.25 * 2 * 1.96 * se
    s = summarize_runs([1, 2, 3, 4])
    assert (s["n"], s["mean"], s["median"], s["iqm"]) == (4, 2.5, 2.5, 2.5)
    assert s["iqm_ci"][0] <= 2.5 <= s["iqm_ci"][1]


def test_cli_seeds_writes_one_directory_per_seed_and_a_summary(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train-agent", "--backend", "graph", "--seeds", "0-1", "--steps", "512",
                 "--eval-episodes", "2", "--no-progress", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [0, 1]
    assert summary["design"] == "one program per group of seeds (seed axis)"
    for key in ("mean", "median", "iqm", "mean_ci", "iqm_ci"):
        assert key in summary["eval_return"]
    assert len(summary["eval_return"]["per_seed"]) == 2
    assert (out / "learning_curves.png").stat().st_size > 1000
    for s in (0, 1):
        loaded = agents.load(out / f"seed_{s}")
        assert loaded.config.seed == s and loaded.config.backend == "graph"
        assert os.path.exists(out / f"seed_{s}" / "evaluation.json")
    assert "IQM" in capsys.readouterr().out
    assert main(["train-agent", "--backend", "graph", "--seeds", "0-1", "--steps", "512",
                 "--out", str(out)]) == 2  # refuses to overwrite


CLI_SMALL = ["--backend", "graph", "--steps", "256", "--set", "n_steps=16", "--num-envs", "2",
             "--set", "n_minibatches=1", "--preset", "none", "--eval-episodes", "0",
             "--no-progress"]


def test_cli_seeds_interrupted_saves_per_seed_and_the_printed_resume_works(tmp_path, capsys,
                                                                           monkeypatch):
    import shlex
    import signal

    from agents.core.base import Agent
    from agents.training import seeds as train_seeds

    out = tmp_path / "run"
    monkeypatch.setattr(train_seeds, "GROUP_SIZE", 2)  # groups 0-1 and 2
    record, calls = Agent._record_update, []

    def interrupting(self, logs, failures):
        calls.append(1)
        if len(calls) == 10:  # the second update of the group of seed 2
            os.kill(os.getpid(), signal.SIGINT)
        return record(self, logs, failures)

    monkeypatch.setattr(Agent, "_record_update", interrupting)
    argv = ["train-agent", "--seeds", "0-2", *CLI_SMALL, "--out", str(out)]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert f"checkpoint saved to {out / 'checkpoint'}" in err
    resume = shlex.split(err.split("resume with: ")[1].strip())
    assert resume[0] == "robustgrad" and resume[-1] == "--resume"
    # the running group (seed 2 alone) is an ordinary checkpoint; finished seeds are not in it
    assert os.path.exists(out / "checkpoint" / "agent.json")
    assert not os.path.exists(out / "checkpoint" / "seeds.json")
    for s in (0, 1):  # written when their group finished, before the interrupt
        assert int(agents.load(out / f"seed_{s}").num_timesteps.numpy()) == 256
    assert not os.path.exists(out / "seed_2")
    monkeypatch.setattr(Agent, "_record_update", record)
    assert main(argv) == 2  # without --resume nothing is silently trained over
    assert ("seed_0 already holds an agent; pass --overwrite (train anew) or --resume (skip the "
            "finished seeds)") in capsys.readouterr().err
    assert main(resume[1:]) == 0
    text = capsys.readouterr().out
    assert "3 seeds (0-2)" in text and "2 already finished (0-1)" in text
    assert "seeds 2: 64 -> 256 steps" in text  # continued from the checkpoint
    seed2 = agents.load(out / "seed_2")
    assert int(seed2.num_timesteps.numpy()) == 256 and len(seed2.history) == 8
    assert not os.path.exists(out / "checkpoint")
    assert json.loads((out / "summary.json").read_text())["seeds"] == [0, 1, 2]


def test_cli_seeds_checks_the_output_directory_and_the_list_before_work(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # --out below a file cannot be created, even by root
    assert main(["train-agent", "--seeds", "0-1", *CLI_SMALL, "--out",
                 str(blocker / "run")]) == 2
    err = capsys.readouterr().err
    assert f"--out {blocker / 'run'}: cannot be created" in err and "training" not in err
    assert main(["train-agent", "--seeds", "0-100000", "--out", str(tmp_path / "x")]) == 2
    assert ("--seeds: at most 10000 seeds in one run, got 100001 (0-100000); split the list "
            "over several runs") in capsys.readouterr().err
