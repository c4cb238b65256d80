"""SA-DQN and adversarial DQN training on the seed axis (``agents.DQN(num_seeds=S, robust=...)``).

As for the on-policy agents (test_robust_seed_axis.py): seed ``s``'s minibatch is attacked against
seed ``s``'s own Q-network in its own units, its hinge is the one seed ``s`` computes alone, and
``S = 1`` is the code before the axis.
"""


import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.robustness import robust

from fingerprints import assert_same_fingerprint, fingerprint

SMALL = dict(env="CartPole-v1", backend="graph", num_envs=1, preset=None, learning_starts=16,
             train_freq=8, gradient_steps=2, batch_size=8, buffer_size=64, hidden_sizes=(16,),
             robust_eps=0.1, robust_eps_warmup=0.5)


def _fingerprint(agent):
    return fingerprint(agent.get_weights() + [np.asarray(v) for v in agent.optimizer.m])


# the code before robust training had a seed axis (commit 98cba6f), 64 steps, seed 3, as float
# fingerprints (tests/fingerprints.py) recorded on the CI machine from a tree whose weights are
# there byte for byte those of the commit that pinned 98cba6f's run as SHA-256 digests (digests
# written on another machine, whose float order this one does not reproduce)
@pytest.mark.parametrize("overrides,before", [
    (dict(robust="sa", normalize_obs=True),
     [56.53857269800454, 123.1096780496723, 71.08332443003347, 0.0]),
    (dict(robust="sa", robust_method="convex", normalize_obs=True),
     [56.53794874831755, 123.15496728707375, 71.0946957698212, 0.0]),
    (dict(robust="adv"),
     [-3.7739144404524474, 56.834924853896865, 4.691745421291468, 0.0]),
])
def test_one_seed_robust_dqn_is_the_run_before_the_axis(overrides, before):
    agent = agents.DQN(seed=3, **{**SMALL, **overrides})
    agent.learn(64, progress_bar=False)
    assert_same_fingerprint(_fingerprint(agent), before, "weights and moments")


def _pair():
    many = agents.DQN(num_seeds=2, seed=4, robust="sa", **{**SMALL, "normalize_obs": True})
    rms = many._obs_rms()
    rms.mean.assign([[0.1, -0.2, 0.0, 0.3], [-0.5, 0.4, 0.2, 0.0]])
    rms.var.assign([[0.5, 1.0, 2.0, 0.3], [3.0, 0.2, 1.0, 0.7]])
    return many, [many.export(s) for s in range(2)]


def test_each_seeds_sa_dqn_terms_and_attacks_are_its_own():
    many, alone = _pair()
    rng = np.random.default_rng(0)
    obs = tf.constant(rng.normal(size=[2, 6, 4]).astype(np.float32))
    obs_adv = tf.constant(rng.normal(size=[2, 6, 4]).astype(np.float32))
    _, greedy = robust.sa_dqn_observations(many, obs, 0.2, 1, tf.constant([1, 2]), "convex")
    hinge = robust.attacked_q_margin(many, obs_adv, greedy).numpy()
    convex = robust.convex_margin_hinge(many, obs, 0.2, greedy).numpy()
    fgsm = robust.adversarial_observations(many, obs, "action", 0.2, 1, tf.constant([1, 2]))
    assert hinge.shape == convex.shape == (2,) and fgsm.shape == (2, 6, 4)
    for s, one in enumerate(alone):
        _, own_greedy = robust.sa_dqn_observations(one, obs[s], 0.2, 1, tf.constant([1, 2]),
                                                   "convex")
        np.testing.assert_array_equal(greedy[s], own_greedy)
        np.testing.assert_allclose(hinge[s], robust.attacked_q_margin(one, obs_adv[s], own_greedy),
                                   rtol=1e-5)
        np.testing.assert_allclose(convex[s], robust.convex_margin_hinge(one, obs[s], 0.2),
                                   rtol=1e-4, atol=1e-6)
        own = robust.adversarial_observations(one, obs[s], "action", 0.2, 1, tf.constant([1, 2]))
        np.testing.assert_allclose(fgsm[s], own, rtol=1e-5, atol=1e-6)
        scale = np.sqrt(many._obs_rms().var.numpy()[s] + 1e-8)
        assert np.abs((fgsm[s] - obs[s]).numpy() / scale).max() == pytest.approx(0.2, rel=1e-4)
    # the PGD inner max (random start) stays in each seed's ball and pushes its hinge above the
    # clean one (the bound of the convex term covers it)
    adv, greedy = robust.sa_dqn_observations(many, obs, 0.2, 10, tf.constant([3, 4]))
    attacked = robust.attacked_q_margin(many, adv, greedy).numpy()
    clean = robust.attacked_q_margin(many, obs, greedy).numpy()
    assert (attacked >= clean).all() and (attacked <= convex + 1e-5).all()
    for s in range(2):
        scale = np.sqrt(many._obs_rms().var.numpy()[s] + 1e-8)
        assert np.abs((adv[s] - obs[s]).numpy() / scale).max() <= 0.2 + 1e-5


@pytest.mark.parametrize("overrides", [dict(robust="sa"), dict(robust="sa", robust_method="convex"),
                                       dict(robust="adv")])
def test_a_short_robust_dqn_run_on_the_seed_axis(overrides):
    many = agents.DQN(num_seeds=2, seed=0, **{**SMALL, "robust_eps_warmup": 0.0, **overrides})
    logs = []
    many.learn(48, progress_bar=False, callbacks=lambda agent, log: logs.append(log))
    assert logs[-1]["per_seed"]["updates_applied"] == [2.0, 2.0]
    for w in many.get_weights():
        assert w.shape[0] == 2 and np.isfinite(w).all()
    hinge = logs[-1]["per_seed"]["sa_hinge"]
    assert len(hinge) == 2 and np.isfinite(hinge).all()
    if overrides["robust"] == "sa":  # max(margin, -1): a margin term of each seed's own
        assert all(-1.0 <= h for h in hinge) and hinge[0] != hinge[1]
    else:
        assert hinge == [0.0, 0.0]


def test_certification_of_a_seed_axis_agent_names_export():
    from agents.robustness.certify import certified_actions

    many = agents.DQN(num_seeds=2, seed=0, **{k: v for k, v in SMALL.items()
                                              if not k.startswith("robust")})
    with pytest.raises(ValueError, match=r"agent: this agent holds 2 seeds; agent.export\(s\) "
                                         "gives seed s as an ordinary agent to certify"):
        certified_actions(many, np.zeros([3, 4], np.float32), eps=0.1)
