"""Several on-policy iterations per compiled call (``iterations_per_call``, graph backend).

The contract: the same seeded run with ``K = 4`` is bit-identical to ``K = 1`` (weights, Adam
moments and counts, learning rate, observation statistics, history), the budget holds when it is
not a multiple of ``K``, and callbacks, checkpoints, interrupts and the non-finite stop act at
call boundaries that fall where a ``K = 1`` run would have been.
"""

import os
import signal

import numpy as np
import pytest

import agents
from robustgrad.interrupts import TrainingInterrupted

SMALL = dict(env="CartPole-v1", backend="graph", num_envs=2, n_steps=16, n_epochs=2,
             n_minibatches=2, hidden_sizes=(16,), preset=None, seed=3)
N = 32  # env steps per iteration


def _state(agent) -> list[np.ndarray]:
    opt = agent.optimizer
    return ([w for w in agent.get_weights()] + [v.numpy() for v in opt.m + opt.v]
            + [opt.iterations.numpy(), opt.learning_rate.numpy(), agent.num_timesteps.numpy(),
               agent.num_updates.numpy()] + [v.numpy() for v in agent.reward_rms.variables])


def _assert_same(a, b):
    for x, y in zip(_state(a), _state(b), strict=True):
        np.testing.assert_array_equal(x, y)


def _histories(agent) -> list:
    return [agent.history] + [h for h in agent.seed_histories if agent.num_seeds > 1]


def test_iterations_per_call_is_checked_before_any_work():
    with pytest.raises(ValueError, match="iterations_per_call must be an int >= 1, got 0"):
        agents.PPOConfig(backend="graph", iterations_per_call=0)
    with pytest.raises(ValueError, match=r"iterations_per_call: several iterations per compiled "
                                         r"call need backend='graph' .* got iterations_per_call=4 "
                                         r"with backend='gymnasium'"):
        agents.PPO(env="CartPole-v1", iterations_per_call=4, preset=None)
    with pytest.raises(ValueError, match=r"iterations_per_call: robust training \('sa'\) updates"):
        agents.A2CConfig(backend="graph", robust="sa", iterations_per_call=2)


@pytest.mark.parametrize("num_seeds", [1, 2])
def test_four_iterations_per_call_are_bit_identical_to_one(num_seeds):
    calls = {1: [], 4: []}
    run = {}
    for k in (1, 4):
        agent = agents.PPO(**SMALL, num_seeds=num_seeds, normalize_reward=True,
                           iterations_per_call=k)
        # 11 iterations: not a multiple of 4, the last call runs 3
        agent.learn(11 * N - 5, progress_bar=False,
                    callbacks=[lambda a, logs, k=k: calls[k].append(
                        (logs["steps"], logs.get("iterations"), a.num_timesteps.numpy().max()))])
        run[k] = agent
    one, four = run[1], run[4]
    assert four.trace_counts == {"iterations": 1, "rollout": 1, "train": 1}
    _assert_same(one, four)
    assert int(four.num_timesteps.numpy()) == 11 * N
    for h1, h4 in zip(_histories(one), _histories(four), strict=True):
        assert len(h1) == len(h4) == 11
        for e1, e4 in zip(h1, h4):  # NaN (no episode yet) compares equal here
            np.testing.assert_equal(e1, e4)
    assert np.isfinite(one.history[-1]["episode_return"])
    # callbacks: once per iteration with K = 1; once per call, the agent as it then is, with K = 4
    assert calls[1] == [(N * (i + 1), None, N * (i + 1)) for i in range(11)]
    assert calls[4] == [(4 * N, 4, 4 * N), (8 * N, 4, 8 * N), (11 * N, 3, 11 * N)]


def test_nonfinite_stop_falls_on_the_same_iteration(monkeypatch):
    stopped = {}
    for k in (1, 4):
        agent = agents.PPO(**SMALL, iterations_per_call=k, max_nonfinite_updates=3)
        agent._reset_env()
        physics = agent.env.variables.physics
        physics.assign(np.full(physics.shape, np.nan, np.float32))  # NaN from the first step on
        agent._obs.assign(np.full(agent._obs.shape, np.nan, np.float32))
        before = agent.get_weights()
        with pytest.raises(agents.NonFiniteTrainingError, match="after 3 consecutive updates"):
            agent.learn(20 * N, progress_bar=False)
        for x, y in zip(before, agent.get_weights()):
            np.testing.assert_array_equal(x, y)  # every step rejected: weights untouched
        stopped[k] = (int(agent.num_timesteps.numpy()), len(agent.history), agent.rejected_steps)
    assert stopped[4] == stopped[1] == (3 * N, 3, 3 * 2 * 2)


def test_checkpoints_and_interrupts_fall_on_call_boundaries_and_resume(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    agent = agents.PPO(**SMALL, iterations_per_call=4, checkpoint_dir=ckpt, checkpoint_every=3 * N)
    seen = []

    def interrupt_on_second_call(a, logs):
        seen.append(logs["steps"])
        if len(seen) == 2:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(TrainingInterrupted, match=f"at step {6 * N}; checkpoint saved to"):
        agent.learn(40 * N, callbacks=[interrupt_on_second_call], progress_bar=False)
    assert seen == [3 * N, 6 * N]  # each call ends where a checkpoint is due (every 3 iterations)
    reference = agents.PPO(**SMALL)  # the same run with one iteration per call, stopped there
    reference.learn(40 * N, progress_bar=False,  # (the same budget: the same annealing)
                    callbacks=[lambda a, logs: logs["steps"] < 6 * N])
    loaded = agents.load(ckpt)
    _assert_same(reference, loaded)
    assert loaded.config.iterations_per_call == 4 and len(loaded.history) == 6
    loaded.learn(5 * N, progress_bar=False, schedule_start=6 * N)  # resumes
    assert int(loaded.num_timesteps.numpy()) == 11 * N and len(loaded.history) == 11


def test_iterations_per_call_has_an_upper_bound_and_a_memory_check():
    with pytest.raises(ValueError, match=r"^iterations_per_call must be at most 4096 \(Python's "
                                         r"share of a call is already negligible at 32\), got "
                                         r"1000000$"):
        agents.PPOConfig(backend="graph", iterations_per_call=10**6)
    # within the bound (and a rollout within its own, 2**24 transitions), a ring buffer of
    # finished episodes larger than the machine (4096 x 16 bytes x 2**24 = 1 TiB): refused
    with pytest.raises(ValueError, match=r"^iterations_per_call=4096: the record of the episodes "
                                         r"one call can finish \(4096 steps x 4096 envs per "
                                         r"iteration\) would allocate .* iterations_per_call must "
                                         r"be at most \d+ here$"):
        agents.PPOConfig(backend="graph", iterations_per_call=4096, n_steps=2**12,
                         num_envs=2**12, n_minibatches=1)


def test_the_compiled_loop_is_sized_by_the_budget_not_by_k():
    agent = agents.PPO(**SMALL, iterations_per_call=4096)
    agent.learn(3 * N, progress_bar=False)
    assert agent.iteration_loop.pad == 3  # 3 iterations in the budget, not 4096
    lengths = {c.structured_input_signature[0][0].shape.as_list()[0]
               for c in agent.iteration_loop.compiled._list_all_concrete_functions()}
    assert lengths == {3}
    assert int(agent.num_timesteps.numpy()) == 3 * N and len(agent.history) == 3
    agent.learn(2 * N, progress_bar=False)  # a shorter call: the same loop, no second trace
    assert agent.trace_counts["iterations"] == 1 and agent.iteration_loop.pad == 3
