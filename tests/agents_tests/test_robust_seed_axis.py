"""Robust training on the seed axis (``num_seeds=S > 1`` with ``robust="sa"`` or ``"adv"``).

Seed ``s``'s observations must be attacked against seed ``s``'s own policy, in seed ``s``'s own
normaliser units, and its SA regulariser must be the one seed ``s`` computes alone (the exported
agent, same inputs); with ``S = 1`` robust training is what it was before the axis.
Random starts are one draw for all seeds (as the seed axis' other draws), so the per-seed
comparisons use deterministic attacks (FGSM, BIM, the convex bounds) or a given ``s_hat``.
"""


import numpy as np
import pytest
import tensorflow as tf

import agents
import attacks
from agents.robustness import observation_attacks as oa
from agents.robustness import robust
from agents.robustness._victim import _in_scaled_space

from fingerprints import assert_same_fingerprint, fingerprint

SMALL = dict(env="CartPole-v1", backend="graph", num_envs=2, preset=None, robust_eps=0.1,
             robust_eps_warmup=0.5)


def _fingerprint(agent):
    return fingerprint(agent.get_weights() + [np.asarray(v) for v in agent.optimizer.m])


# the code before robust training had a seed axis (commit 98cba6f), 64 steps, seed 3, as float
# fingerprints (tests/fingerprints.py) recorded on the CI machine from a tree whose weights are
# there byte for byte those of the commit that pinned 98cba6f's run as SHA-256 digests (digests
# written on another machine, whose float order this one does not reproduce)
@pytest.mark.parametrize("cls,overrides,before", [
    (agents.PPO, dict(robust="sa", n_steps=16, n_minibatches=2, n_epochs=2, normalize_obs=True),

     [69.06196615079311, 1309.8007612125905, 64.45770047594502, 0.0]),
    (agents.PPO, dict(robust="sa", robust_method="convex", n_steps=16, n_minibatches=2,
                      n_epochs=2),
     [8.69527014624373, 1246.800421873437, -2.523634914178337, 0.0]),
    (agents.PPO, dict(robust="adv", n_steps=16, n_minibatches=2, n_epochs=2, normalize_obs=True),

     [69.20274867150977, 1308.0614414189502, 64.63278623625921, 0.0]),
    (agents.A2C, dict(env="Pendulum-v1", robust="sa", robust_method="sgld", n_steps=5,
                      normalize_obs=True),
     [74.77313034468625, 1301.3308359745142, 44.43544701817533, 0.0]),
])
def test_one_seed_robust_training_is_the_run_before_the_axis(cls, overrides, before):
    agent = cls(seed=3, **{**SMALL, **overrides})
    agent.learn(64, progress_bar=False)
    assert_same_fingerprint(_fingerprint(agent), before, "weights and moments")


def _pair(cls, **overrides):
    """An S = 2 agent whose seeds have different observation statistics (so different units
    of eps) and a policy head scaled up (a trained policy's outputs move with the observation;
    the initial ones hardly do), and its two seeds exported as ordinary agents."""
    many = cls(num_seeds=2, seed=4, **{**SMALL, "normalize_obs": True, **overrides})
    rms = many._obs_rms()
    d = rms.mean.shape[-1]
    rms.mean.assign(np.stack([np.linspace(-0.3, 0.3, d), np.linspace(0.5, -0.5, d)]))
    rms.var.assign(np.stack([np.linspace(0.5, 2.0, d), np.linspace(3.0, 0.2, d)]))
    head = many.model.policy_net.weights_[-1]  # init gain 0.01: outputs far from flat
    head.assign(head * 100.0)
    return many, [many.export(s) for s in range(2)]


def _obs(shape, seed=0):
    return tf.constant(np.random.default_rng(seed).normal(size=shape).astype(np.float32))


def _bim_away_from_greedy(agent, obs, eps):
    """A deterministic 5-step attack (BIM, no random start) through the victim machinery."""
    victim, eps, norm = oa._prepare(agent, obs, eps, "linf", None)

    def run(u):
        greedy = tf.argmax(victim.policy_outputs(u), -1)
        return attacks.basic_iterative_method(victim.policy, u, greedy, eps=eps, clip_min=None,
                                              clip_max=None, steps=5)

    return _in_scaled_space(victim, obs, eps, norm, run)


def test_each_seed_is_attacked_against_its_own_policy_in_its_own_units():
    many, alone = _pair(agents.PPO, n_steps=8, n_minibatches=1)
    obs = _obs([2, 6, 4])
    eps = 0.3
    for name, fn in (("fgsm", lambda a, o: robust.adversarial_observations(
                         a, o, "action", eps, 1, tf.constant([1, 2]))),
                     ("bim", lambda a, o: _bim_away_from_greedy(a, o, eps))):
        adv = fn(many, obs).numpy()
        assert adv.shape == (2, 6, 4)
        for s, one in enumerate(alone):
            own = fn(one, obs[s]).numpy()
            np.testing.assert_allclose(adv[s], own, rtol=1e-5, atol=1e-6, err_msg=name)
            scale = np.sqrt(many._obs_rms().var.numpy()[s] + 1e-8)
            assert np.abs((adv[s] - obs[s].numpy()) / scale).max() <= eps + 1e-5
            # the step is not zero: the attack moved each seed's observations
            assert np.abs(adv[s] - obs[s].numpy()).max() > 0.5 * eps * scale.min()
    # the random-start attacks of SA training (mad by PGD and SGLD): inside each seed's ball,
    # and they raise each seed's KL well above a random point of the ball
    kl_rand = robust.sa_policy_regularizer(
        many, obs, oa.random_attack(many, obs, eps=eps, seed=3)).numpy()
    for method in ("pgd", "sgld"):
        adv = robust.sa_observations(many, obs, eps, 10, tf.constant([5, 6]), method)
        for s in range(2):
            scale = np.sqrt(many._obs_rms().var.numpy()[s] + 1e-8)
            assert np.abs((adv[s].numpy() - obs[s].numpy()) / scale).max() <= eps + 1e-5
        kl = robust.sa_policy_regularizer(many, obs, adv).numpy()
        assert kl.shape == (2,) and (kl > 2 * kl_rand).all(), (method, kl, kl_rand)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_each_seeds_sa_term_is_its_own(env):
    many, alone = _pair(agents.PPO, env=env, n_steps=8, n_minibatches=1, robust="sa")
    d = many.obs_shape[0]
    obs, obs_adv = _obs([2, 5, d]), _obs([2, 5, d], 1)
    kl = robust.sa_policy_regularizer(many, obs, obs_adv).numpy()
    convex = robust.convex_policy_regularizer(many, obs, 0.2).numpy()
    assert kl.shape == convex.shape == (2,)
    for s, one in enumerate(alone):
        np.testing.assert_allclose(kl[s], robust.sa_policy_regularizer(one, obs[s], obs_adv[s]),
                                   rtol=1e-5)
        np.testing.assert_allclose(convex[s], robust.convex_policy_regularizer(one, obs[s], 0.2),
                                   rtol=1e-4)
    # the convex bound is an upper bound of the KL the search finds, per seed
    adv = robust.sa_observations(many, obs, 0.2, 10, tf.constant([1, 1]))
    assert (robust.sa_policy_regularizer(many, obs, adv).numpy() <= convex * (1 + 1e-4)).all()


@pytest.mark.parametrize("cls,overrides", [
    (agents.PPO, dict(robust="sa", n_steps=16, n_minibatches=2, n_epochs=2)),
    pytest.param(agents.A2C, dict(env="Pendulum-v1", robust="sa", robust_method="convex",
                                  n_steps=5), marks=pytest.mark.slow),  # 6 s; exact term above
    (agents.PPO, dict(robust="adv", n_steps=16, n_minibatches=2, n_epochs=1)),
])
def test_a_short_robust_run_on_the_seed_axis(cls, overrides):
    many = cls(num_seeds=2, seed=0, **{**SMALL, "robust_eps_warmup": 0.0, **overrides})
    many.learn(64, progress_bar=False)
    assert len(many.seed_histories[0]) and len(many.seed_histories[1])
    for w in many.get_weights():
        assert w.shape[0] == 2 and np.isfinite(w).all()
    stats = many._train(many._rollout())
    assert stats["updates_applied"].numpy().tolist() == stats["updates_tried"].numpy().tolist()
    if overrides["robust"] == "sa":
        sa = stats["sa_kl"].numpy()
        assert sa.shape == (2,) and np.isfinite(sa).all() and (sa > 0).all()


def test_robust_seed_axis_bad_input():
    many = agents.PPO(num_seeds=2, robust="sa", n_steps=8, **SMALL)
    with pytest.raises(ValueError, match=r"obs: an agent with a seed axis of 2 seeds is attacked "
                                         r"on observations \[2, B, 4\] \(each seed's rows\), got "
                                         r"shape \[3, 4\]"):
        oa.mad_attack(many, np.zeros([3, 4], np.float32), eps=0.1)


def test_train_many_and_the_cli_put_robust_seeds_on_the_axis(tmp_path, capsys):
    import json

    from robustgrad.cli import main

    cfg = agents.PPOConfig(backend="graph", num_envs=2, n_steps=8, n_minibatches=1, robust="sa",
                           robust_eps=0.05, robust_eps_warmup=0.0)
    trained = agents.train_many(cfg, seeds=[3, 8], steps=16)
    assert [(a.config.seed, a.num_seeds, a.config.robust) for a in trained] == [
        (3, 1, "sa"), (8, 1, "sa")]
    out = tmp_path / "run"
    assert main(["train-agent", "--algo", "ppo", "--backend", "graph", "--seeds", "0-1",
                 "--steps", "16", "--preset", "none", "--num-envs", "2", "--set", "n_steps=8",
                 "--set", "n_minibatches=1", "--robust", "sa", "--eps", "0.05",
                 "--eval-episodes", "0", "--no-progress", "--out", str(out)]) == 0
    assert "in groups of up to 32 seeds with a seed axis" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["design"] == "one program per group of seeds (seed axis)"
    for s in (0, 1):
        loaded = agents.load(out / f"seed_{s}")
        assert (loaded.config.seed, loaded.num_seeds, loaded.config.robust,
                loaded.config.robust_eps) == (s, 1, "sa", 0.05)
