"""Policy snapshots (``get_weights``/``set_weights``) and ``EvalCallback`` (periodic
evaluation, keep-best, best_dir, resume), on small real agents."""

import json

import numpy as np
import pytest

import agents
from agents.core.callbacks import EvalCallback


def _small_a2c(seed=3):
    return agents.A2C(env="CartPole-v1", num_envs=2, n_steps=8, seed=seed, normalize_obs=True)


def _small_dqn(seed=0):
    return agents.DQN(env="CartPole-v1", seed=seed, learning_starts=32, train_freq=32,
                      gradient_steps=4, batch_size=16, buffer_size=500, hidden_sizes=(16, 16),
                      normalize_obs=True)


OBS = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)


@pytest.mark.parametrize("make", [_small_a2c, _small_dqn], ids=["a2c", "dqn"])
def test_get_set_weights_restore_the_policy_exactly(make):
    agent = make()
    agent.learn(64, progress_bar=False)
    snap = agent.get_weights()
    probe = (lambda: agent.q_values(OBS).numpy()) if agent.algo == "dqn" else (
        lambda: agent.distribution(OBS).logits.numpy())
    before = probe()
    agent.learn(128, progress_bar=False)
    assert not np.allclose(probe(), before)  # training moved the policy...
    agent.set_weights(snap)
    np.testing.assert_array_equal(probe(), before)  # ...and the snapshot puts it back
    # snapshots are copies: training after get_weights does not change them
    np.testing.assert_array_equal(agent.get_weights()[0], snap[0])
    names = [v.name for v in agent._model_variables()]
    assert any("mean" in n for n in names)  # observation statistics are part of the policy


def test_set_weights_rejects_wrong_count_and_shape():
    agent = _small_a2c()
    w = agent.get_weights()
    with pytest.raises(ValueError, match=f"expected {len(w)} arrays, got {len(w) - 1}"):
        agent.set_weights(w[:-1])
    bad = list(w)
    bad[0] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="array 0 .* has shape"):
        agent.set_weights(bad)
    np.testing.assert_array_equal(agent.get_weights()[1], w[1])  # nothing was assigned


@pytest.mark.parametrize("kwargs, match", [
    ({"every": 0}, "every"), ({"every": 1.5}, "every"), ({"every": True}, "every"),
    ({"every": 10, "n_episodes": 0}, "n_episodes"), ({"every": 10, "seed": "x"}, "seed")])
def test_eval_callback_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EvalCallback(**kwargs)


def test_evaluation_does_not_change_training():
    """Same seed, with and without periodic evaluation: identical weights afterwards."""
    plain = _small_a2c()
    plain.learn(160, progress_bar=False)
    evaluated = _small_a2c()
    cb = EvalCallback(every=48, n_episodes=2)
    seen = []
    evaluated.learn(160, callbacks=[cb, lambda a, logs: seen.append(logs)], progress_bar=False)
    for a, b in zip(plain.get_weights(), evaluated.get_weights()):
        np.testing.assert_array_equal(a, b)
    # evaluations at the first update at or after 48, 96, 144 steps, then the final weights
    assert [s for s, _ in cb.evaluations] == [48, 96, 144, 160]
    assert sum("eval_return" in logs for logs in seen) == 3
    assert cb.best_return == max(r for _, r in cb.evaluations)


def _scripted(agent, returns):
    """Make ``agent.evaluate`` return ``returns`` in turn and record the weights it saw."""
    seen = []
    it = iter(returns)

    def evaluate(n_episodes=10, deterministic=True, seed=None, num_envs=None):
        seen.append(agent.get_weights())
        return {"mean_return": float(next(it))}

    agent.evaluate = evaluate
    return seen


def test_keep_best_restores_the_best_evaluated_weights(tmp_path):
    agent = _small_a2c()
    seen = _scripted(agent, [10.0, 50.0, 20.0, 5.0])  # three periodic, one final
    cb = EvalCallback(every=32, keep_best=True, best_dir=str(tmp_path / "best"))
    agent.learn(112, callbacks=[cb], progress_bar=False)
    assert cb.restored and cb.best_return == 50.0 and cb.best_steps == 64
    for a, b in zip(agent.get_weights(), seen[1]):
        np.testing.assert_array_equal(a, b)
    assert json.loads((tmp_path / "best" / "best.json").read_text())["mean_return"] == 50.0
    loaded = agents.load(tmp_path / "best")
    for a, b in zip(loaded.get_weights(), seen[1]):
        np.testing.assert_array_equal(a, b)


def test_keep_best_ties_and_a_better_end_keep_the_final_weights():
    for script in ([50.0, 50.0], [10.0, 30.0]):
        agent = _small_a2c()
        seen = _scripted(agent, script)
        cb = EvalCallback(every=32, keep_best=True)
        agent.learn(48, callbacks=[cb], progress_bar=False)
        assert not cb.restored
        for a, b in zip(agent.get_weights(), seen[-1]):
            np.testing.assert_array_equal(a, b)


def test_without_keep_best_weights_are_never_restored():
    agent = _small_a2c()
    seen = _scripted(agent, [50.0, 5.0])
    cb = EvalCallback(every=32)
    agent.learn(48, callbacks=[cb], progress_bar=False)
    assert not cb.restored and cb.best_return == 50.0
    for a, b in zip(agent.get_weights(), seen[-1]):
        np.testing.assert_array_equal(a, b)


def test_no_final_evaluation_when_training_raises():
    agent = _small_a2c()
    cb = EvalCallback(every=16, keep_best=True)

    def boom(a, logs):
        if logs["steps"] >= 32:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        agent.learn(160, callbacks=[cb, boom], progress_bar=False)
    assert [s for s, _ in cb.evaluations] == [16, 32]  # none added while propagating
    assert agent.training_failed and not cb.restored


def test_load_best_continues_from_an_earlier_best(tmp_path):
    first = _small_a2c()
    _scripted(first, [40.0, 1.0])
    cb = EvalCallback(every=32, best_dir=str(tmp_path / "best"))
    first.learn(48, callbacks=[cb], progress_bar=False)
    best_weights = agents.load(tmp_path / "best").get_weights()

    resumed = _small_a2c()
    _scripted(resumed, [30.0, 20.0])  # never beats the earlier 40
    cb2 = EvalCallback(every=32, keep_best=True, best_dir=str(tmp_path / "best"))
    cb2.load_best(str(tmp_path / "best"))
    assert (cb2.best_return, cb2.best_steps) == (40.0, 32)
    resumed.learn(48, callbacks=[cb2], progress_bar=False)
    assert cb2.restored
    for a, b in zip(resumed.get_weights(), best_weights):
        np.testing.assert_array_equal(a, b)


def test_cli_eval_every_and_keep_best(tmp_path, capsys):
    from robustgrad.cli import main

    out = tmp_path / "run"
    base = ["train-agent", "--algo", "a2c", "--steps", "320", "--seed", "1", "--out", str(out),
            "--eval-episodes", "2", "--no-progress", "--num-envs", "2", "--set", "n_steps=8"]
    assert main(base + ["--keep-best"]) == 2
    assert "--keep-best: needs --eval-every" in capsys.readouterr().err
    assert main(base + ["--eval-every", "0"]) == 2
    assert "--eval-every: must be positive" in capsys.readouterr().err
    assert main(base + ["--eval-every", "160", "--keep-best"]) == 0
    best = json.loads((out / "best" / "best.json").read_text())
    assert best["steps"] in (160, 320) and best["n_episodes"] == 10
    assert int(agents.load(out / "best").num_timesteps.numpy()) == best["steps"]
