"""ATLA and ATLA+SA on the seed axis (``num_seeds=S > 1`` with ``robust="atla"``/``"atla-sa"``).

Seed ``s`` must meet its own adversary: slice ``s`` of one adversary PPO with a seed axis, built
as seed ``s``'s adversary alone, trained in one env of all seeds' copies whose block ``s`` is seed
``s``'s own adversary env against seed ``s``'s own policy (read live from the stacked variables,
one victim call per step for all seeds), and applied to seed ``s``'s rows inside the compiled
rollout; with ``S = 1`` ATLA is what it was before the axis (commit 8228735, on both backends):
pinned as float fingerprints (tests/fingerprints.py), which hold across CPUs where byte digests
did not.
"""

import json

import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.robustness import atla

from fingerprints import assert_same_fingerprint, fingerprint, history_numbers

SMALL = dict(env="CartPole-v1", num_envs=2, n_steps=8, preset=None, robust_eps=0.1)


def _fingerprints(agent):
    """Fingerprints of (agent weights + Adam's first moments, history, adversary weights)."""
    return [fingerprint(agent.get_weights() + [np.asarray(v) for v in agent.optimizer.m]),
            fingerprint([history_numbers(agent.history)]),
            fingerprint(agent.robustness.adversary.get_weights())]


# seed 3, 48 steps, warm-up 0.5. Recorded on the CI machine from a tree whose weights are, byte for
# byte there, those of dbe3a40 (the commit that pinned 8228735's run as SHA-256 digests, which
# another machine had written and this one's float order no longer reproduced)
@pytest.mark.parametrize("cls,backend,robust,extra,before", [
    (agents.PPO, "gymnasium", "atla", {},
     [[8.495655077880414, 1249.134370757382, -1.9927468040945446, 0.0],
      [128.0, 128.0, -64.0, 1.0],
      [5.811311550459095, 1276.3942853011104, -44.67631573073589, 0.0]]),
    pytest.param(agents.PPO, "graph", "atla", {},
                 [[8.460796614814281, 1252.4801940924883, -1.913713605635027, 0.0],
                  [118.0, 118.0, -86.0, 2.0],
                  [5.686027764763963, 1276.4279767771043, -44.600062445709575, 0.0]],
                 marks=pytest.mark.slow),  # 3 s; both backends and atla-sa stay in the default
    pytest.param(agents.A2C, "gymnasium", "atla-sa", {},
                 [[8.97372298578016, 1244.4814320069665, -2.7705492530667915, 0.0],
                  [119.0, 119.0, -87.0, 2.0],
                  [5.655573051665918, 1276.2502270563887, -44.63362148865659, 0.0]],
                 marks=pytest.mark.slow),
    (agents.PPO, "graph", "atla-sa", {"normalize_obs": True},
     [[53.59228638480715, 1294.8252300232098, 49.134694460388076, 0.0],
      [117.0, 117.0, -85.0, 2.0],
      [5.583837078753447, 1276.989490599622, -44.66341628751326, 0.0]]),
])
def test_one_seed_atla_is_the_run_before_the_axis(cls, backend, robust, extra, before):
    agent = cls(seed=3, backend=backend, robust=robust, robust_eps_warmup=0.5,
                **{**SMALL, **extra})
    agent.learn(48, progress_bar=False)
    for got, want, what in zip(_fingerprints(agent), before,
                               ["weights and moments", "history", "adversary weights"],
                               strict=True):
        assert_same_fingerprint(got, want, what)
    assert agent.robustness.adversary.num_seeds == 1


def _pair(backend="gymnasium", **overrides):
    """An S = 2 ATLA agent whose seeds differ in observation statistics and policy head (so
    their deterministic actions differ), its adversaries built, and its schedule at eps."""
    many = agents.PPO(num_seeds=2, seed=4, backend=backend, robust="atla", normalize_obs=True,
                      robust_eps_warmup=0.0, **{**SMALL, **overrides})
    rms = many._obs_rms()
    rms.mean.assign(np.stack([np.linspace(-0.3, 0.3, 4), np.linspace(0.5, -0.5, 4)]))
    rms.var.assign(np.stack([np.linspace(0.5, 2.0, 4), np.linspace(3.0, 0.2, 4)]))
    head = many.model.policy_net.weights_[-1]
    head.assign(head * 100.0)
    many.robustness.build_adversary()
    return many


def _obs(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _alone(many, s):
    """The adversary seed ``s`` of ``many`` builds alone, its weights set to slice ``s`` of
    ``many``'s adversary."""
    alone = agents.PPO(seed=many.seeds[s], robust="atla", normalize_obs=True, **SMALL)
    alone.robustness.build_adversary()
    alone.robustness.adversary.set_weights([w[s] for w in many.robustness.adversary.get_weights()])
    return alone.robustness.adversary


def test_one_adversary_with_a_seed_axis_whose_slices_are_the_seeds_own():
    many = _pair()
    adv, surface = many.robustness.adversary, many.robustness.victim
    assert adv.num_seeds == 2
    assert adv.seeds == [s + 104_729 for s in many.seeds]
    assert adv.env.vec.surface is surface and adv.env.num_envs == 4
    for s in range(2):  # slice s is exactly the adversary seed s's agent builds alone
        alone = agents.PPO(seed=many.seeds[s], robust="atla", normalize_obs=True, **SMALL)
        alone.robustness.build_adversary()
        for a, b in zip(adv.get_weights(), alone.robustness.adversary.get_weights()):
            np.testing.assert_array_equal(a[s], b)
    # block s of the victims' rows acts (and scales) as seed s alone, live: a negated head
    # flips most greedy actions, a wider normaliser widens the unit of eps
    obs = _obs([128, 4])
    for step in range(2):
        acts = surface.act(obs)
        for s in range(2):
            block = slice(64 * s, 64 * (s + 1))
            np.testing.assert_array_equal(acts[block],
                                          many.export(s).act(obs[block], deterministic=True))
            std = np.sqrt(many._obs_rms().var.numpy()[s] + 1e-8)
            np.testing.assert_allclose(surface.units[2 * s:2 * s + 2],  # num_envs rows a seed
                                       np.broadcast_to(std, (2, 4)), rtol=1e-6)
        if step == 0:
            before = acts
            head = many.model.policy_net.weights_[-1]
            head.assign(-head)
            many._obs_rms().var.assign(many._obs_rms().var * 4.0)
            surface.refresh()
    assert (acts != before).mean() > 0.5


def test_each_seeds_block_sees_its_own_victim():
    many = _pair()
    surface = many.robustness.victim
    obs = np.concatenate([_obs([64, 4])] * 2)  # the same rows in both blocks
    acts = surface.act(obs)
    assert (acts[:64] != acts[64:]).any()
    for v in many.model.variables:  # swap the two seeds' policies and normalisers
        v.assign(tf.reverse(v, [0]))
    surface.refresh()
    swapped = surface.act(obs)
    np.testing.assert_array_equal(swapped[:64], acts[64:])
    np.testing.assert_array_equal(swapped[64:], acts[:64])


def test_the_seed_axis_adversary_env_is_the_seeds_envs_with_one_victim_call_per_step():
    from agents.envs import VecEnv
    from agents.robustness.adversary import AdversaryVectorEnv, victim_surface

    many = _pair()
    adv, surface = many.robustness.adversary, many.robustness.victim
    many.robustness.radius.value = 0.5  # large enough to end episodes
    alone = []
    for s in range(2):  # what seed s's adversary alone steps (make_vec_env of its factory)
        one = victim_surface(many.export(s), "agent")
        alone.append(VecEnv(AdversaryVectorEnv("CartPole-v1", 2, one, many.robustness.radius),
                            seed=adv.seeds[s]))
    env, calls = adv.env, []
    surface.act(np.zeros([4, 4], np.float32))  # its concrete function, built on first use
    act = surface._act
    surface._act = lambda x: calls.append(x.shape) or act(x)
    got = env.reset()
    np.testing.assert_array_equal(got, np.concatenate([e.reset() for e in alone]))
    rng, ended = np.random.default_rng(1), 0
    for t in range(60):
        actions = rng.normal(size=[4, 4]).astype(np.float32)
        got = env.step(actions)
        want = [np.concatenate(x) for x in zip(*(e.step(actions[2 * s:2 * s + 2])
                                                 for s, e in enumerate(alone)))]
        for a, b in zip(got, want):  # obs, reward, terminated, truncated, final_obs
            np.testing.assert_array_equal(a, b)
        assert len(calls) == t + 1 and calls[-1] == (2, 2, 4)
        ended += int((got[2] | got[3]).sum())
    assert ended >= 4
    seeds = env.drain_seed_episodes()
    for s in range(2):
        assert [(r, n) for k, r, n in seeds if k == s] == alone[s].drain_episodes()


def _expected(many, obs, seed):
    """Seed s's rows perturbed by the adversary seed s builds alone (given slice s's
    weights), the draw of its distribution stacked over the seeds (one sample)."""
    import tensorflow_probability as tfp

    means, stds = [], []
    for s in range(2):
        dist = _alone(many, s).model.distribution(obs[s])
        means.append(dist.mean())
        stds.append(dist.stddev())
    a = tfp.distributions.Independent(tfp.distributions.Normal(tf.stack(means), tf.stack(stds)),
                                      1).sample(seed=seed).numpy()
    scale = np.sqrt(many._obs_rms().var.numpy() + 1e-8).astype(np.float32)[:, None]
    return obs + np.float32(many.robust_schedule.eps.numpy()) * np.tanh(a) * scale


@pytest.mark.parametrize("backend", ["gymnasium", "graph"])
def test_the_rollout_perturbs_each_seed_by_its_own_adversary(backend):
    many = _pair(backend)
    seed = tf.constant([7, 9], tf.int32)
    obs = np.repeat(_obs([1, 2, 4]), 2, axis=0)  # the same rows for both seeds
    seen = many.robustness.observations(tf.constant(obs), seed).numpy()
    np.testing.assert_allclose(seen, _expected(many, obs, seed), rtol=1e-5, atol=1e-6)
    scale = np.sqrt(many._obs_rms().var.numpy() + 1e-8)[:, None]
    step = np.abs(seen - obs) / scale
    assert step.max() <= 0.1 + 1e-5 and not np.allclose(seen[0], seen[1])
    # the compiled rollout's first stored observations are exactly that, at the step's seed
    many._reset_env()
    clean = many._obs.numpy()
    # the rollout's attack key on the seed axis: seed 0's stream (agents.core.streams)
    first = many.streams.generators[0]
    rng = tf.random.Generator.from_state(tf.identity(first.state), first.algorithm)
    step_seed = tf.cast(rng.make_seeds(many.config.n_steps), tf.int32)[:, 0]
    batch = many._rollout()
    expected = _expected(many, clean, tf.random.experimental.stateless_fold_in(step_seed, 1))
    np.testing.assert_allclose(batch["obs"][0].numpy(), np.reshape(expected, (-1,) + expected.shape[2:]),
                               rtol=1e-5, atol=1e-6)  # envs [S * N]


@pytest.mark.parametrize("cls,backend,robust", [
    (agents.PPO, "graph", "atla-sa"),
    (agents.A2C, "gymnasium", "atla"),
])
def test_a_short_atla_run_on_the_seed_axis(cls, backend, robust):
    many = cls(num_seeds=2, seed=0, backend=backend, robust=robust, robust_eps_warmup=0.0,
               **SMALL)
    many.robustness.build_adversary()
    initial = [w.numpy() for w in many.robustness.adversary.model.trainable]
    logs = []
    many.learn(32, progress_bar=False, callbacks=lambda a, lg: logs.append(dict(lg)))
    assert many.trace_counts["rollout" if backend == "gymnasium" else "iteration"] == 1
    for w in many.get_weights():
        assert w.shape[0] == 2 and np.isfinite(w).all()
    adv = many.robustness.adversary  # one adversary of two seeds: both slices took steps and moved
    assert adv.num_seeds == 2 and adv.trace_counts["rollout"] == 1
    assert int(adv.num_timesteps.numpy()) == 32 and int(adv.num_updates.numpy()) == 2
    for w in adv.model.trainable:
        assert np.isfinite(w.numpy()).all()
    for s in range(2):
        assert any(not np.array_equal(w.numpy()[s], w0[s])
                   for w, w0 in zip(adv.model.trainable, initial))
    assert all(len(r) > 0 for r in adv.seed_episode_returns)
    per_seed = logs[-1]["per_seed"]
    assert per_seed["atla_adversary_return"] == [atla._mean_return(r)
                                                 for r in adv.seed_episode_returns]
    assert per_seed["atla_adversary_radius"] == pytest.approx([0.1, 0.1])
    assert logs[-1]["atla_adversary_return"] == pytest.approx(
        np.nanmean(per_seed["atla_adversary_return"]))
    for s in range(2):
        entry = many.seed_histories[s][-1]
        assert entry["atla_adversary_return"] == per_seed["atla_adversary_return"][s]
        assert entry["atla_adversary_radius"] == pytest.approx(0.1)
    one = many.export(1)  # an ordinary agent, its adversary not part of it
    assert one.num_seeds == 1 and one.config.robust == robust
    assert one.history == many.seed_histories[1] and one.robustness.adversary is None
    if robust == "atla-sa":
        stats = many._iteration()
        assert np.isfinite(stats["sa_kl"].numpy()).all() and stats["sa_kl"].shape == (2,)


def test_what_atla_on_the_seed_axis_still_refuses():
    with pytest.raises(ValueError, match=r"^rollout_workers: Ray workers collect for one seed; "
                                         r"use num_seeds=1 with rollout_workers$"):
        agents.PPO(num_seeds=2, robust="atla", rollout_workers=2, **SMALL)
    with pytest.raises(ValueError, match=r"^iterations_per_call: robust training \('atla'\) "
                                         r"updates its eps/kappa schedule \(and ATLA its "
                                         r"adversary\) in Python between iterations; use "
                                         r"iterations_per_call=1, got 2$"):
        agents.PPO(num_seeds=2, robust="atla", backend="graph", iterations_per_call=2, **SMALL)
    with pytest.raises(ValueError, match=r"^robust: ATLA trains an actor-critic \(PPO, A2C\) "
                                         r"against a learned adversary; DQN supports 'sa', "
                                         r"'adv' and 'wocar', got 'atla'$"):
        agents.DQN(env="CartPole-v1", num_seeds=2, robust="atla")
    import gymnasium as gym

    many = agents.PPO(**{**SMALL, "env": lambda: gym.make("CartPole-v1")}, num_seeds=2,
                      robust="atla-sa")
    with pytest.raises(ValueError, match=r"^agent: a learned adversary needs a victim trained on "
                                         r"a gymnasium env id \(an env factory cannot be named "
                                         r"in adversary.json\)$"):
        many.learn(16, progress_bar=False)
    assert int(many.num_timesteps.numpy()) == 0
    # the seed-axis adversary's env is built for all seeds at once, never one copy at a time
    from agents.backends.seed_axis import SeedBlockVecEnv
    from agents.robustness.adversary import _Radius, victim_surface
    from agents.robustness.atla import _seed_factory

    pair = _pair()
    factory = _seed_factory(victim_surface(pair, "agent", seed_axis=True), _Radius(0.1))
    with pytest.raises(ValueError, match=r"^env: this adversary MDP steps the victims of all "
                                         r"seeds together; build its agent with num_seeds=2 "
                                         r"\(make_seed_vector_env\)$"):
        factory()
    with pytest.raises(ValueError, match=r"^num_envs: the victims' surface holds 2 seeds x 2 "
                                         r"envs, got 2 x 3$"):
        factory.make_seed_vector_env(2, 3)
    with pytest.raises(ValueError, match=r"^env: make_seed_vector_env built 4 envs for 3 "
                                         r"seeds$"):
        SeedBlockVecEnv(factory.make_seed_vector_env(2, 2), [0, 1, 2])


CLI_ATLA = ["train-agent", "--algo", "ppo", "--seeds", "0-1", "--steps", "32", "--preset", "none",
            "--num-envs", "2", "--set", "n_steps=8", "--set", "n_minibatches=1", "--robust", "atla",
            "--eps", "0.05", "--set", "robust_eps_warmup=0", "--eval-episodes", "0",
            "--no-progress"]


def _check_seed_dirs(out, steps):
    summary = json.loads((out / "summary.json").read_text())
    assert summary["design"] == "one program per group of seeds (seed axis)"
    for s in (0, 1):
        loaded = agents.load(out / f"seed_{s}")
        assert (loaded.config.seed, loaded.num_seeds, loaded.config.robust,
                loaded.config.robust_eps, int(loaded.num_timesteps.numpy())) == (
            s, 1, "atla", 0.05, steps)
        assert [h["atla_adversary_radius"] for h in loaded.history] == pytest.approx(
            [0.05] * (steps // 16))


def test_train_many_and_the_cli_put_atla_seeds_on_the_axis(tmp_path, capsys):
    from robustgrad.cli import main

    cfg = agents.A2CConfig(num_envs=2, n_steps=8, robust="atla", robust_eps=0.05,
                           robust_eps_warmup=0.0)
    trained = agents.train_many(cfg, seeds=[3, 8], steps=16)
    assert [(a.config.seed, a.num_seeds, a.config.robust) for a in trained] == [
        (3, 1, "atla"), (8, 1, "atla")]
    assert all("atla_adversary_return" in a.history[-1] for a in trained)
    out = tmp_path / "run"
    assert main([*CLI_ATLA, "--steps", "16", "--out", str(out)]) == 0
    assert "in groups of up to 32 seeds with a seed axis" in capsys.readouterr().out
    _check_seed_dirs(out, 16)


@pytest.mark.slow  # 10 s: the driver's interrupt and resume, here with fresh adversaries
def test_cli_atla_seeds_interrupted_then_resumed(tmp_path, capsys, monkeypatch):
    import os
    import shlex
    import signal

    from agents.core.base import Agent
    from robustgrad.cli import main

    out = tmp_path / "run"
    record, calls = Agent._record_update, []

    def interrupting(self, logs, failures):
        calls.append(self.config.robust)  # the adversary (no robust training) records too
        if calls.count("atla") == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return record(self, logs, failures)

    monkeypatch.setattr(Agent, "_record_update", interrupting)
    assert main([*CLI_ATLA, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"checkpoint saved to {out / 'checkpoint'}" in err
    monkeypatch.setattr(Agent, "_record_update", record)
    resume = shlex.split(err.split("resume with: ")[1].strip())
    assert main(resume[1:]) == 0
    assert "seeds 0-1: 16 -> 32 steps" in capsys.readouterr().out
    _check_seed_dirs(out, 32)
