"""WocaR (robust="wocar"): the worst-attack Bellman target, the admissible actions from the bound
engine, the refusals, and one short real learning run (agents.robustness.wocar)."""

import argparse
import json

import gymnasium
import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.config import DQNConfig, PPOConfig
from agents.core.networks import MLP
from agents.robustness import certify, configs, wocar, wocar_base, wocar_box
from agents.robustness.robust import certified_margin_hinge
from robustgrad.errors import ConfigError


def test_the_worst_attack_target_on_a_hand_computed_case():
    q_next = tf.constant([[1.0, 3.0, 2.0], [5.0, 0.0, 4.0], [-1.0, 6.0, 2.0]])
    admissible = tf.constant([[False, True, True], [True, False, False], [True, True, True]])
    rewards = tf.constant([1.0, 2.0, 0.5])
    terminated = tf.constant([False, True, False])
    # row 0: 1 + 0.5 * min(3, 2); row 1: terminated, 2 alone; row 2: 0.5 + 0.5 * min(-1, 6, 2)
    target = wocar.worst_attack_target(q_next, admissible, rewards, terminated, 0.5)
    assert target.numpy().tolist() == [2.0, 2.0, 0.0]


def test_no_gradient_reaches_the_target_network():
    net = MLP(4, (8,), 2, "tanh", 1.0, seed=0)
    obs = tf.random.stateless_normal([5, 4], seed=[1, 2])
    with tf.GradientTape() as tape:
        target = wocar.worst_attack_target(net(obs), tf.ones([5, 2], tf.bool), tf.ones([5]),
                                           tf.zeros([5], tf.bool), 0.9)
        loss = tf.reduce_sum(target)
    assert all(g is None for g in tape.gradient(loss, net.trainable_variables))


def test_state_importance_is_the_spread_normalised_to_mean_one():
    w = wocar.state_importance(tf.constant([[1.0, 4.0, 2.0], [0.0, 1.0, 0.5], [2.0, 2.0, 2.0]]))
    np.testing.assert_allclose(w.numpy(), [3.0 * 3 / 4, 1.0 * 3 / 4, 0.0], rtol=1e-6)
    assert wocar.state_importance(tf.zeros([2, 3])).numpy().tolist() == [1.0, 1.0]


@pytest.mark.parametrize("method", ["ibp", "crown", "crown-ibp"])
def test_admissible_actions_are_sound_by_sampling_the_ball(method):
    """Every action greedy at a sampled point of the ball (corners too) is admissible; and the
    set is not trivially everything: some states keep only their clean greedy action."""
    agent = agents.PPO(env="Acrobot-v1", seed=3, num_envs=2, n_steps=8, preset=None,
                       hidden_sizes=(16, 16))
    surface = agent.policy_surface()
    eps = 0.05
    rng = np.random.default_rng(0)
    obs = rng.normal(size=[40, 6]).astype(np.float32)
    adm = wocar.admissible_actions(surface, obs, eps, method).numpy()
    delta = rng.uniform(-eps, eps, size=[300, 40, 6]).astype(np.float32)
    delta[:100] = eps * np.sign(delta[:100])  # corners
    logits = surface.outputs(tf.reshape(obs[None] + delta, [-1, 6])).numpy()
    reached = np.zeros_like(adm)
    greedy = logits.argmax(-1).reshape(300, 40)
    for s in range(40):
        reached[s, np.unique(greedy[:, s])] = True
    assert not (reached & ~adm).any(), "an action reached in the ball is not admissible"
    assert (adm.sum(-1) == 1).any() and (adm.sum(-1) > 1).any()


@pytest.mark.parametrize("method", ["ibp", "crown", "crown-ibp"])
def test_the_admissible_box_holds_the_mean_over_sampled_states_of_the_ball(method):
    """Box actions: the (clipped) Gaussian mean at every sampled point of the ball (corners
    too) lies in the admissible box; the box is not the whole action space, and it contains
    the clean mean; a wider ball gives a box that contains the narrower one's."""
    agent = agents.PPO(env="Pendulum-v1", seed=3, num_envs=2, n_steps=8, preset=None,
                       hidden_sizes=(16, 16))
    surface = agent.policy_surface()
    eps = 0.1
    rng = np.random.default_rng(0)
    obs = rng.normal(size=[40, 3]).astype(np.float32)
    lo, hi = (b.numpy() for b in wocar_box.admissible_box(surface, obs, eps, method))
    delta = rng.uniform(-eps, eps, size=[300, 40, 3]).astype(np.float32)
    delta[:100] = eps * np.sign(delta[:100])  # corners
    means = surface.deterministic_actions(tf.reshape(obs[None] + delta, [-1, 3])).numpy()
    means = means.reshape(300, 40, 1)
    assert (means >= lo[None] - 1e-5).all() and (means <= hi[None] + 1e-5).all()
    clean = surface.deterministic_actions(obs).numpy()
    assert (clean >= lo - 1e-6).all() and (clean <= hi + 1e-6).all()
    assert (hi - lo < 4.0).all() and (hi - lo > 0.0).all() and (lo >= -2.0).all()
    lo2, hi2 = (b.numpy() for b in wocar_box.admissible_box(surface, obs, 2 * eps, method))
    assert (lo2 <= lo + 1e-6).all() and (hi2 >= hi - 1e-6).all()


def test_the_worst_action_search_on_a_known_critic():
    """Corners and projected sign steps: the minimum of a quadratic inside the box (and at a
    corner when it lies outside); the value is never above the start's, the action in the box;
    sign=-1 finds the maximum."""
    lower = tf.constant([[-1.0, -1.0], [0.5, 0.0], [-2.0, -2.0]])
    upper = tf.constant([[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]])
    centre = tf.constant([[0.3, -0.4], [0.0, 0.0], [1.5, -1.5]])

    def q(a):
        return tf.reduce_sum(tf.square(a - centre), -1)

    start = tf.constant([[0.9, 0.9], [1.0, 1.0], [-2.0, 2.0]])
    a, v = wocar_box.worst_action_in_box(q, lower, upper, start, steps=20)
    np.testing.assert_allclose(a.numpy()[0], [0.3, -0.4], atol=0.1 + 1e-5)  # one step
    np.testing.assert_allclose(a.numpy()[1], [0.5, 0.0], atol=1e-6)  # a corner: (0.5, 0)
    np.testing.assert_allclose(a.numpy()[2], [1.5, -1.5], atol=0.2 + 1e-5)
    assert (v.numpy() <= q(tf.clip_by_value(start, lower, upper)).numpy()).all()
    assert ((a >= lower) & (a <= upper)).numpy().all()
    np.testing.assert_allclose(v.numpy(), q(a).numpy(), rtol=1e-6)
    _, top = wocar_box.worst_action_in_box(q, lower, upper, start, steps=20, sign=-1.0)
    np.testing.assert_allclose(top.numpy(), [1.3 ** 2 + 1.4 ** 2, 1.0 + 1.0, 3.5 ** 2 * 2],
                               rtol=1e-6)  # the farthest corners
    # no step, no corner (k = 5 > MAX_CORNER_DIMS): the start itself
    a5, v5 = wocar_box.worst_action_in_box(lambda x: tf.reduce_sum(x, -1), -tf.ones([2, 5]),
                                           tf.ones([2, 5]), tf.zeros([2, 5]), steps=0)
    assert a5.numpy().tolist() == [[0.0] * 5] * 2 and v5.numpy().tolist() == [0.0, 0.0]
    a5, v5 = wocar_box.worst_action_in_box(lambda x: tf.reduce_sum(x, -1), -tf.ones([2, 5]),
                                           tf.ones([2, 5]), tf.zeros([2, 5]), steps=4)
    assert v5.numpy().tolist() == [-5.0, -5.0]  # linear: sign steps walk to the min corner


def test_the_box_target_is_never_above_the_clean_actions_value():
    """The worst-attack target's next-state term ``min(Q_w^-(s', a*), Q_w^-(s', mu(s')))``: at
    most the clean action's value, below it for some states once the box has width, equal at
    eps 0 (the box is the mean); ``a*`` in the box; no gradient reaches the target network."""
    agent = agents.PPO(env="Pendulum-v1", seed=1, num_envs=2, n_steps=8, preset=None,
                       hidden_sizes=(16, 16), robust=agents.WocaR(eps=0.3))
    plugin = agent.robustness
    assert type(plugin).__name__ == "WocaRBoxPlugin"
    obs = tf.constant(np.random.default_rng(1).normal(size=[64, 3]), tf.float32)
    a_star, clean, lower, upper = plugin.worst_actions(obs, 0.3)
    assert ((a_star >= lower) & (a_star <= upper)).numpy().all()
    with tf.GradientTape() as tape:
        worst = plugin.worst_next_values(obs, a_star, clean)
        loss = tf.reduce_sum(worst)
    assert all(g is None for g in tape.gradient(loss, plugin.target.trainable_variables))
    at_clean = plugin.q_at(obs, clean).numpy()
    assert (worst.numpy() <= at_clean + 1e-6).all()
    assert (worst.numpy() < at_clean - 1e-4).any()
    a0, c0, lo0, hi0 = plugin.worst_actions(obs, 0.0)
    np.testing.assert_allclose(plugin.worst_next_values(obs, a0, c0).numpy(),
                               plugin.q_at(obs, c0).numpy(), rtol=1e-5, atol=1e-6)


def test_typed_config_and_flat_fields():
    cfg = PPOConfig(robust=agents.WocaR(eps=0.05, weight=0.3, bound="crown"))
    assert (cfg.robust, cfg.robust_eps, cfg.wocar_weight, cfg.wocar_bound) == \
        ("wocar", 0.05, 0.3, "crown")
    assert cfg.robust_spec == agents.WocaR(eps=0.05, weight=0.3, bound="crown", kappa=0.1,
                                           steps=10, method="pgd")


def test_every_wocar_setting_is_a_typed_field_saved_flat_and_read_back():
    typed = agents.WocaR(eps=0.05, weight=0.4, bound="crown", kappa=0.2, steps=3, method="sgld",
                         warmup=0.5, admissible_eps=0.01, importance=False,
                         weight_over_run=True, search_per_rollout=False, double=True,
                         smoothness_every=3, search_steps=3, q_epochs=2,
                         q_minibatches=8, q_min_rows=2, q_lr=4e-4, tau=0.001, gamma=0.995)
    cfg = PPOConfig(robust=typed)
    assert (cfg.wocar_warmup, cfg.robust_eps_warmup, cfg.wocar_admissible_eps,
            cfg.wocar_importance, cfg.wocar_weight_over_run, cfg.wocar_search_per_rollout,
            cfg.wocar_double, cfg.wocar_search_steps, cfg.wocar_q_epochs,
            cfg.wocar_q_minibatches, cfg.wocar_q_min_rows, cfg.wocar_q_lr, cfg.wocar_tau,
            cfg.wocar_gamma, cfg.wocar_smoothness_every) == \
        (0.5, 0.75, 0.01, False, True, False, True, 3, 2, 8, 2, 4e-4, 0.001, 0.995, 3)
    assert PPOConfig.from_dict(cfg.to_dict()).robust_spec == typed
    assert typed.resolved() == typed  # nothing left to fill
    # the plug-in reads them: the schedule's warm-up, the critic's step count per rollout
    agent = agents.PPO(env="CartPole-v1", num_envs=2, n_steps=8, n_epochs=1, preset=None,
                       robust=typed)
    assert agent.robustness.schedule.warmup == 0.5
    assert (agent.robustness.gamma, agent.config.gamma) == (0.995, 0.99)
    agent.learn(16, progress_bar=False)  # 16 rows: 8 minibatches of 2 (q_min_rows 2)
    assert int(agent.robustness.critic_optimizer.iterations.numpy()) == 2 * 8


def test_unset_wocar_settings_take_wocars_defaults():
    spec = PPOConfig(robust="wocar", robust_eps=0.05).robust_spec.resolved()
    assert (spec.weight, spec.bound, spec.warmup, spec.admissible_eps, spec.importance,
            spec.weight_over_run, spec.search_per_rollout, spec.double, spec.search_steps,
            spec.q_epochs, spec.q_minibatches, spec.q_min_rows, spec.q_lr, spec.tau,
            spec.smoothness_every) == \
        (0.8, "ibp", 0.3, None, True, False, True, False, 10, 4, 4, 1, 1e-3, 0.01, 2)
    box = PPOConfig(robust="wocar", robust_eps=0.2).robust_spec.resolved(box=True)
    assert (box.q_epochs, box.q_minibatches, box.q_min_rows, box.weight,
            box.smoothness_every) == (10, 32, 8, 0.8, 1)
    dqn = DQNConfig(robust="wocar", robust_eps=0.02).robust_spec.resolved(value_based=True)
    assert (dqn.weight, dqn.warmup, dqn.q_lr, dqn.q_every, dqn.bound) == \
        (0.3, 0.75, 1e-3, 10, "crown-ibp")
    assert spec.gamma is None  # the agent's own


def test_the_plugins_read_typed_settings():
    """``WocaR.settings``: every default filled in, each of its declared type (what the
    plug-ins read; ``None`` only where it means "the schedule's eps" / "the agent's gamma")."""
    settings = agents.WocaR(eps=0.05, q_epochs=3, gamma=0.9).settings()
    assert settings == configs.WocaRSettings(
        weight=0.8, bound="ibp", warmup=0.3, admissible_eps=None, importance=True,
        weight_over_run=False, search_per_rollout=True, double=False, search_steps=10,
        q_epochs=3, q_minibatches=4, q_min_rows=1, q_lr=1e-3, tau=0.01, gamma=0.9,
        smoothness_every=2)
    assert agents.WocaR().settings(value_based=True).weight == 0.3
    agent = agents.PPO(env="CartPole-v1", num_envs=2, n_steps=8, preset=None,
                       robust=agents.WocaR(eps=0.05))
    assert agent.robustness.spec == configs.WocaR(eps=0.05).settings()
    assert agent.robustness.gamma == agent.config.gamma


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_the_wocar_numbers_are_in_the_agents_history(algo):
    """Each update's ``wocar_*`` logs are also in its ``agent.history`` entry (the weight
    rising over the warm-up, the critic's loss, the admissible-set size)."""
    if algo == "ppo":
        agent = agents.PPO(env="CartPole-v1", seed=0, num_envs=2, n_steps=8, n_epochs=1,
                           preset=None, robust=agents.WocaR(eps=0.05, warmup=0.5))
        keys = ["wocar_admissible", "wocar_q_loss", "wocar_weight", "wocar_worst_q"]
    else:
        agent = agents.DQN(env="CartPole-v1", seed=0, preset=None, hidden_sizes=(16,),
                           learning_starts=16, train_freq=8, gradient_steps=1, batch_size=8,
                           buffer_size=256, robust=agents.WocaR(eps=0.02, warmup=0.5))
        keys = ["wocar_admissible", "wocar_bound_loss", "wocar_q_loss", "wocar_scale",
                "wocar_td_loss", "wocar_weight", "wocar_width", "wocar_worst_q"]
    logs = []
    agent.learn(64, progress_bar=False, callbacks=lambda _, entry: logs.append(entry))
    assert len(agent.history) == len(logs) >= 4
    for entry, logged in zip(agent.history, logs, strict=True):
        assert sorted(k for k in entry if k.startswith("wocar_")) == keys
        assert {k: entry[k] for k in keys} == {k: logged[k] for k in keys}
    weights = [h["wocar_weight"] for h in agent.history]
    assert weights[0] < weights[-1] and weights == sorted(weights)  # rising over the warm-up
    assert all(1.0 <= h["wocar_admissible"] <= 2.0 for h in agent.history[1:])
    if algo == "dqn":  # the worst-case term's unit (q_scale >= 1) and the bounds' spread
        assert all(h["wocar_scale"] >= 1.0 and h["wocar_width"] >= 0.0
                   and h["wocar_td_loss"] >= 0.0 for h in agent.history[1:])


def test_box_wocar_fits_its_critic_10_x_32_per_rollout_and_a_box_agent_saved_before_keeps_4_x_4(
        tmp_path):
    """On Box actions the worst-attack critic takes 10 epochs of up to 32 minibatches of at
    least 8 rows per rollout (:attr:`agents.WocaR.BOX_DEFAULTS`; discrete agents keep 4 x 4,
    of one row and up): 32 on 2048 rows, 8 on 64, 5 on A2C's 40 (not 32 of one row); a Box
    agent saved before ``wocar_search_steps`` existed, its budget unset, trained with 4 x 4
    and loads with it (a budget it set is kept); one saved now keeps today's defaults."""
    kw = dict(env="Pendulum-v1", num_envs=2, n_steps=32, n_epochs=1, n_minibatches=2,
              preset=None, seed=0)
    agent = agents.PPO(robust=agents.WocaR(eps=0.2, kappa=0.0), **kw)
    spec = agent.robustness.spec
    assert (spec.q_epochs, spec.q_minibatches, spec.q_min_rows) == (10, 32, 8)
    agent.learn(64, progress_bar=False)  # one rollout of 64 transitions: 8 minibatches of 8
    assert int(agent.robustness.critic_optimizer.iterations.numpy()) == 10 * 8
    small = agents.PPO(robust=agents.WocaR(eps=0.2, kappa=0.0, q_min_rows=1),
                       **{**kw, "n_steps": 8})
    small.learn(16, progress_bar=False)  # 16 rows, fewer than 32: one minibatch per row
    assert int(small.robustness.critic_optimizer.iterations.numpy()) == 10 * 16
    assert all(np.isfinite(v.numpy()).all() for v in small.robustness.critic.variables)
    a2c = agents.A2C(env="Pendulum-v1", preset=None, seed=0,
                     robust=agents.WocaR(eps=0.2, kappa=0.0))
    a2c.learn(80, progress_bar=False)  # two rollouts of 8 x 5 = 40 rows: 5 minibatches each
    assert int(a2c.robustness.critic_optimizer.iterations.numpy()) == 2 * 10 * 5
    discrete = agents.PPO(env="CartPole-v1", num_envs=2, n_steps=8, preset=None,
                          robust=agents.WocaR(eps=0.05))
    assert (discrete.robustness.spec.q_epochs, discrete.robustness.spec.q_minibatches) == (4, 4)
    agent.save(tmp_path / "a")
    path = tmp_path / "a" / "config.json"
    saved = json.loads(path.read_text())
    assert (saved["wocar_q_epochs"], saved["wocar_q_minibatches"], saved["wocar_q_min_rows"],
            saved["wocar_search_steps"]) == (None, None, None, None)
    now = agents.load(tmp_path / "a").robustness.spec
    assert (now.q_epochs, now.q_minibatches, now.q_min_rows, now.search_steps) == (10, 32, 8, 10)
    del saved["wocar_q_min_rows"]  # as the version before stop 55 wrote it: minibatches of 1+
    path.write_text(json.dumps(saved))
    assert agents.load(tmp_path / "a").robustness.spec.q_min_rows == 1
    del saved["wocar_search_steps"]  # as the version before that wrote it
    path.write_text(json.dumps(saved))
    before = agents.load(tmp_path / "a")
    assert (before.config.wocar_q_epochs, before.config.wocar_q_minibatches) == (4, 4)
    assert (before.robustness.spec.q_epochs, before.robustness.spec.q_minibatches,
            before.robustness.spec.q_min_rows) == (4, 4, 1)
    saved["wocar_q_minibatches"] = 8  # set by its user: kept
    path.write_text(json.dumps(saved))
    assert agents.load(tmp_path / "a").robustness.spec.q_minibatches == 8


def test_an_agent_saved_before_smoothness_every_existed_keeps_the_term_on_every_step(tmp_path):
    """A discrete WocaR agent saved now keeps the default (every other step) unset; one whose
    config has no ``wocar_smoothness_every`` (the previous version's) loads with 1, the term on
    every step as it trained; a value its user set is kept."""
    agent = agents.PPO(env="CartPole-v1", num_envs=2, n_steps=8, preset=None, seed=0,
                       robust=agents.WocaR(eps=0.05))
    agent.save(tmp_path / "a")
    path = tmp_path / "a" / "config.json"
    saved = json.loads(path.read_text())
    assert saved["wocar_smoothness_every"] is None
    assert agents.load(tmp_path / "a").robustness.spec.smoothness_every == 2
    del saved["wocar_smoothness_every"]  # as the previous version wrote it
    path.write_text(json.dumps(saved))
    before = agents.load(tmp_path / "a")
    assert (before.config.wocar_smoothness_every, before.robustness.spec.smoothness_every) == \
        (1, 1)
    saved["wocar_smoothness_every"] = 3  # set by its user: kept
    path.write_text(json.dumps(saved))
    assert agents.load(tmp_path / "a").robustness.spec.smoothness_every == 3


def test_an_agent_saved_before_wocar_warmup_existed_loads_with_the_warmup_it_trained_with(
        tmp_path):
    agent = agents.PPO(env="CartPole-v1", num_envs=2, n_steps=8, preset=None,
                       robust=agents.WocaR(eps=0.05, warmup=0.4))
    agent.save(tmp_path / "a")
    path = tmp_path / "a" / "config.json"
    saved = json.loads(path.read_text())
    assert saved["wocar_warmup"] == 0.4
    # as an agent of the previous version wrote it: its warm-up in robust_eps_warmup
    del saved["wocar_warmup"]
    saved["robust_eps_warmup"] = 0.4
    path.write_text(json.dumps(saved))
    old = agents.load(tmp_path / "a")
    assert (old.config.wocar_warmup, old.config.robust_eps_warmup) == (0.4, 0.75)
    assert old.robustness.schedule.warmup == 0.4
    # one saved with the previous default (0.75) keeps 0.75, not WocaR's new default
    saved["robust_eps_warmup"] = 0.75
    path.write_text(json.dumps(saved))
    assert agents.load(tmp_path / "a").robustness.schedule.warmup == 0.75


@pytest.mark.parametrize("kwargs, message", [
    (dict(robust="wocar", robust_eps=0.0), "robust_eps must be a number > 0, got 0.0"),
    (dict(robust="wocar", robust_eps=float("nan")), "robust_eps must be a number >= 0, got nan"),
    (dict(robust="sa", wocar_weight=0.5),
     "wocar_weight: a WocaR setting, only with robust='wocar' (WocaR combines with no other "
     "robust method), got robust='sa'"),
    (dict(robust="atla", wocar_bound="ibp"),
     "wocar_bound: a WocaR setting, only with robust='wocar' (WocaR combines with no other "
     "robust method), got robust='atla'"),
    (dict(robust="wocar", wocar_bound="alpha-crown"),
     "wocar_bound must be one of ('ibp', 'crown', 'crown-ibp'), got 'alpha-crown'"),
    (dict(robust="wocar", robust_method="convex"),
     "robust_method: WocaR weights the KL at a searched s_hat by the state's importance; 'pgd' "
     "or 'sgld', got 'convex'"),
    (dict(robust="wocar", robust_eps_warmup=0.3),
     "robust_eps_warmup: WocaR's warm-up is wocar_warmup (agents.WocaR(warmup=...), "
     "--eps-warmup with --robust wocar), got robust_eps_warmup=0.3"),
    (dict(robust="sa", wocar_q_lr=1e-3),
     "wocar_q_lr: a WocaR setting, only with robust='wocar' (WocaR combines with no other "
     "robust method), got robust='sa'"),
    (dict(robust="wocar", wocar_warmup=1.5), "wocar_warmup must be a number in [0, 1], got 1.5"),
    (dict(robust="wocar", wocar_admissible_eps=0.0),
     "wocar_admissible_eps must be a number in (0, 1000], got 0.0"),
    (dict(robust="wocar", wocar_importance="yes"),
     "wocar_importance must be True or False, got 'yes'"),
    (dict(robust="wocar", wocar_weight_over_run=1),
     "wocar_weight_over_run must be True or False, got 1"),
    (dict(robust="wocar", wocar_q_epochs=0),
     "wocar_q_epochs must be an int in [1, 100000], got 0"),
    (dict(robust="wocar", wocar_q_minibatches=10**6),
     "wocar_q_minibatches must be an int in [1, 65536], got 1000000"),
    (dict(robust="wocar", wocar_q_min_rows=0),
     "wocar_q_min_rows must be an int in [1, 65536], got 0"),
    (dict(robust="wocar", wocar_search_steps=-1),
     "wocar_search_steps must be an int in [0, 1000], got -1"),
    (dict(robust="wocar", wocar_smoothness_every=0),
     "wocar_smoothness_every must be an int in [1, 1000], got 0"),
    (dict(robust="wocar", wocar_q_lr=2.0), "wocar_q_lr must be a number in (0, 1], got 2.0"),
    (dict(robust="wocar", wocar_tau=float("nan")), "wocar_tau must be a number in (0, 1], got nan"),
    (dict(robust="wocar", wocar_weight=1e4), "wocar_weight must be a number in [0, 1000], got "
     "10000.0"),
    (dict(robust="wocar", wocar_gamma=1.0), "wocar_gamma must be a number in [0, 1), got 1.0"),
    (dict(robust="wocar", wocar_gamma=-0.1), "wocar_gamma must be a number in [0, 1), got -0.1"),
    (dict(robust="sa", wocar_gamma=0.99),
     "wocar_gamma: a WocaR setting, only with robust='wocar' (WocaR combines with no other "
     "robust method), got robust='sa'"),
])
def test_config_refusals(kwargs, message):
    with pytest.raises(ConfigError) as info:
        PPOConfig(**kwargs)
    assert str(info.value) == message


def test_q_every_is_wocar_dqns_setting_saved_flat_and_refused_by_ppo():
    cfg = DQNConfig(robust=agents.WocaR(eps=0.02, q_every=5))
    assert cfg.wocar_q_every == 5
    assert DQNConfig.from_dict(cfg.to_dict()).robust_spec.settings(value_based=True).q_every == 5
    assert agents.WocaR().settings(value_based=True).q_every == 10  # the paper's worst_rate
    with pytest.raises(ConfigError) as info:
        PPOConfig(robust="wocar", robust_eps=0.05, wocar_q_every=5)
    assert str(info.value) == ("wocar_q_every: a setting of WocaR-DQN (its worst-attack "
                               "network's step rate on the replay), which WocaR-PPO/A2C do not "
                               "read, got wocar_q_every=5")


def test_a_wocar_dqn_saved_before_q_every_existed_resumes_with_the_settings_it_trained_with(
        tmp_path):
    """A WocaR-DQN agent saved before ``wocar_q_every`` existed, its WocaR fields unset, trained
    with that version's defaults (the worst-attack network on every minibatch, IBP sets,
    weight 0.05): it loads with those, not with today's defaults (10, CROWN-IBP, 0.3); a
    field it set keeps its value; an agent saved now keeps today's defaults."""
    agent = agents.DQN(env="CartPole-v1", seed=0, hidden_sizes=(8,), buffer_size=64,
                       batch_size=8, preset=None, robust=agents.WocaR(eps=0.02))
    agent.save(tmp_path / "a")
    path = tmp_path / "a" / "config.json"
    saved = json.loads(path.read_text())
    assert (saved["wocar_q_every"], saved["wocar_bound"], saved["wocar_weight"]) == (
        None, None, None)
    now = agents.load(tmp_path / "a").config.robust_spec.settings(value_based=True)
    assert (now.q_every, now.bound, now.weight) == (10, "crown-ibp", 0.3)
    del saved["wocar_q_every"]  # as the previous version wrote it
    saved["wocar_weight"] = 0.2  # set by its user: kept
    path.write_text(json.dumps(saved))
    before = agents.load(tmp_path / "a").config.robust_spec.settings(value_based=True)
    assert (before.q_every, before.bound, before.weight) == (1, "ibp", 0.2)


@pytest.mark.parametrize("every", [1, 3])
def test_the_worst_attack_network_steps_on_every_q_every_th_replayed_minibatch(every):
    """``q_every``: the worst-attack network takes one Adam step on the first replayed
    minibatch and on every ``q_every``-th after it (the paper's ``worst_rate``), in the
    compiled update; the agent's own gradient steps are unchanged."""
    agent = agents.DQN(env="CartPole-v1", seed=1, hidden_sizes=(16,), learning_starts=32,
                       train_freq=16, gradient_steps=5, batch_size=16, buffer_size=256,
                       backend="graph", robust=agents.WocaR(eps=0.02, q_every=every),
                       preset=None)
    agent.learn(96, progress_bar=False)
    steps = int(agent.grad_steps.numpy())
    assert steps >= 20
    assert int(agent.robustness.critic_optimizer.iterations.numpy()) == -(-steps // every)


@pytest.mark.parametrize("kwargs, message", [
    (dict(robust="wocar", robust_eps=0.0), "robust_eps must be a number > 0, got 0.0"),
    (dict(robust="wocar", robust_eps=float("nan")), "robust_eps must be a number >= 0, got nan"),
    (dict(robust="wocar", wocar_weight=1.5),
     "wocar_weight must be a number in [0, 1], got 1.5"),
    (dict(robust="sa", wocar_weight=0.5),
     "wocar_weight: a WocaR setting, only with robust='wocar' (WocaR combines with no other "
     "robust method), got robust='sa'"),
    (dict(robust="adv", wocar_bound="crown"),
     "wocar_bound: a WocaR setting, only with robust='wocar' (WocaR combines with no other "
     "robust method), got robust='adv'"),
    (dict(robust="atla"),
     "robust: ATLA trains an actor-critic (PPO, A2C) against a learned adversary; DQN supports "
     "'sa', 'adv' and 'wocar', got 'atla'"),
    (dict(robust="wocar", wocar_q_epochs=3),
     "wocar_q_epochs: a setting of WocaR-PPO/A2C (its rollout critic and smoothness term), "
     "which WocaR-DQN does not read, got wocar_q_epochs=3"),
    (dict(robust="wocar", wocar_search_per_rollout=False),
     "wocar_search_per_rollout: a setting of WocaR-PPO/A2C (its rollout critic and smoothness "
     "term), which WocaR-DQN does not read, got wocar_search_per_rollout=False"),
    (dict(robust="wocar", wocar_search_steps=5),
     "wocar_search_steps: a setting of WocaR-PPO/A2C (its rollout critic and smoothness term), "
     "which WocaR-DQN does not read, got wocar_search_steps=5"),
    (dict(robust="wocar", wocar_smoothness_every=2),
     "wocar_smoothness_every: a setting of WocaR-PPO/A2C (its rollout critic and smoothness "
     "term), which WocaR-DQN does not read, got wocar_smoothness_every=2"),
    (dict(robust="wocar", wocar_q_min_rows=8),
     "wocar_q_min_rows: a setting of WocaR-PPO/A2C (its rollout critic and smoothness term), "
     "which WocaR-DQN does not read, got wocar_q_min_rows=8"),
    (dict(robust="wocar", wocar_q_every=0), "wocar_q_every must be an int in [1, 100000], got 0"),
    (dict(robust="wocar", wocar_term="hinge"),
     "wocar_term must be one of ('spread', 'margin'), got 'hinge'"),
    (dict(robust="wocar", wocar_term_start=1.5),
     "wocar_term_start must be a number in [0, 1], got 1.5"),
    (dict(robust="sa", wocar_term="margin"),
     "wocar_term: a WocaR setting, only with robust='wocar' (WocaR combines with no other "
     "robust method), got robust='sa'"),
])
def test_dqn_config_refusals(kwargs, message):
    with pytest.raises(ConfigError) as info:
        DQNConfig(**kwargs)
    assert str(info.value) == message


def test_dqn_takes_wocar():
    cfg = DQNConfig(robust=agents.WocaR(eps=0.02, weight=0.1, bound="crown", kappa=0.5))
    assert (cfg.robust, cfg.robust_eps, cfg.wocar_weight, cfg.wocar_bound, cfg.robust_kappa) == \
        ("wocar", 0.02, 0.1, "crown", 0.5)
    agent = agents.DQN(env="CartPole-v1", preset=None, hidden_sizes=(8,), buffer_size=64,
                       batch_size=8, robust="wocar", robust_eps=0.02)
    assert type(agent.robustness) is wocar.WocaRDQNPlugin
    # the seed axis: tests/agents_tests/test_wocar_seed_axis.py


def _hand_dqn(**kwargs):
    """A WocaR-DQN on CartPole whose Q-network is linear on the ball (ReLU kept open by a
    bias of 10): ``Q(s) = [2 s_0, 2 s_1]``; its worst-attack target network ``Q_w^-(s) =
    [3 s_2, s_3]``. Bounds of ``Q_0 − Q_1`` over the eps ball: ``2 (s_0 − s_1) ± 4 eps``."""
    kwargs = {"robust": "wocar", "robust_eps": 0.02, "wocar_warmup": 0.0, **kwargs}
    agent = agents.DQN(env="CartPole-v1", preset=None, hidden_sizes=(4,), activation="relu",
                       normalize_obs=False, buffer_size=64, batch_size=8, **kwargs)
    eye, ten = np.eye(4, dtype=np.float32), np.full([4], 10.0, np.float32)

    def linear(net, m):
        (w1, w2), (b1, b2) = net.weights_, net.biases
        w1.assign(eye), b1.assign(ten), w2.assign(m), b2.assign(-10.0 * m.sum(0))

    linear(agent.q.net, np.array([[2, 0], [0, 2], [0, 0], [0, 0]], np.float32))
    linear(agent.robustness.target, np.array([[0, 0], [0, 0], [3, 0], [0, 1]], np.float32))
    return agent


def test_the_wocar_dqn_worst_attack_target_on_a_hand_computed_net():
    agent = _hand_dqn()
    plugin = agent.robustness
    nxt = tf.constant([[0.50, 0.48, 0.2, 0.1],    # Q 1.00 / 0.96: both reachable
                       [0.50, 0.30, 0.2, 0.1],    # Q 1.00 / 0.60: the gap 0.4 > 0.08
                       [0.30, 0.50, 0.2, 0.9]])   # Q 0.60 / 1.00: only action 1
    batch = {"obs": tf.zeros([3, 4]), "actions": tf.constant([0, 1, 0]),
             "rewards": tf.constant([1.0, 1.0, 0.5]), "next_obs": nxt,
             "terminated": tf.constant([False, False, True])}
    target, admissible = plugin.worst_attack_targets(batch)
    assert admissible.numpy().tolist() == [[True, True], [True, False], [False, True]]
    gamma = agent.config.gamma  # Q_w^- = [0.6, 0.1], [0.6, 0.1], [0.6, 0.9]
    np.testing.assert_allclose(target.numpy(), [1.0 + gamma * 0.1, 1.0 + gamma * 0.6, 0.5],
                               rtol=1e-5)
    # the worst-attack network's own discount (wocar_gamma) replaces the agent's
    own, _ = _hand_dqn(wocar_gamma=0.5).robustness.worst_attack_targets(batch)
    np.testing.assert_allclose(own.numpy(), [1.0 + 0.5 * 0.1, 1.0 + 0.5 * 0.6, 0.5], rtol=1e-5)
    # the paper's interval rule (ub(Q_a) >= max_j lb(Q_j)) admits the same actions here
    lb, ub = certify.output_bounds(plugin.surface, nxt, 0.02, "ibp")
    paper = (ub.numpy() >= lb.numpy().max(-1, keepdims=True))
    assert paper.tolist() == admissible.numpy().tolist()
    # the worst-case-aware TD target chooses by (1 - w) Q + w Q_w^- (w = 0.3 here)
    scores = plugin.target_action_scores(nxt, agent.q(nxt)).numpy()
    np.testing.assert_allclose(scores[0], [0.7 * 1.0 + 0.3 * 0.6, 0.7 * 0.96 + 0.3 * 0.1],
                               rtol=1e-5)


def test_double_chooses_the_worst_action_by_the_critic_and_values_it_by_the_target():
    """``double=True`` (the paper's code): ``a* = argmin_{admissible} Q_w(s', .)`` of the online
    critic, valued by the target copy ``Q_w^-``; the hand net's target copy is ``[3 s_2, s_3]``,
    its critic here ``[s_3, 3 s_2]`` (the choice reversed)."""
    agent = _hand_dqn(robust=agents.WocaR(eps=0.02, warmup=0.0, double=True))
    plugin = agent.robustness
    eye, ten = np.eye(4, dtype=np.float32), np.full([4], 10.0, np.float32)
    m = np.array([[0, 0], [0, 0], [0, 3], [1, 0]], np.float32)
    (w1, w2), (b1, b2) = plugin.critic.weights_, plugin.critic.biases
    w1.assign(eye), b1.assign(ten), w2.assign(m), b2.assign(-10.0 * m.sum(0))
    nxt = tf.constant([[0.50, 0.48, 0.2, 0.1],    # both admissible: critic [0.1, 0.6] -> a* = 0
                       [0.30, 0.50, 0.2, 0.9]])   # only action 1
    batch = {"obs": tf.zeros([2, 4]), "actions": tf.constant([0, 1]),
             "rewards": tf.constant([1.0, 1.0]), "next_obs": nxt,
             "terminated": tf.constant([False, False])}
    target, admissible = plugin.worst_attack_targets(batch)
    assert admissible.numpy().tolist() == [[True, True], [False, True]]
    gamma = agent.config.gamma  # Q_w^- = [0.6, 0.1], [0.6, 0.9]: a* = 0 -> 0.6, not min 0.1
    np.testing.assert_allclose(target.numpy(), [1.0 + gamma * 0.6, 1.0 + gamma * 0.9],
                               rtol=1e-5)


@pytest.mark.parametrize("method", ["ibp", "crown"])
def test_dqn_admissible_actions_are_sound_by_sampling_the_ball(method):
    agent = agents.DQN(env="CartPole-v1", seed=4, preset=None, hidden_sizes=(16, 16),
                       buffer_size=64, batch_size=8)
    surface = agent.policy_surface()
    eps, rng = 0.1, np.random.default_rng(1)
    obs = rng.normal(size=[40, 4]).astype(np.float32)
    adm = wocar.admissible_actions(surface, obs, eps, method).numpy()
    delta = rng.uniform(-eps, eps, size=[300, 40, 4]).astype(np.float32)
    delta[:100] = eps * np.sign(delta[:100])  # corners
    greedy = surface.outputs(tf.reshape(obs[None] + delta, [-1, 4])).numpy().argmax(-1)
    reached = np.zeros_like(adm)
    for s, g in enumerate(greedy.reshape(300, 40).T):
        reached[s, np.unique(g)] = True
    assert not (reached & ~adm).any(), "an action reached in the ball is not admissible"
    assert (adm.sum(-1) == 1).any() and (adm.sum(-1) > 1).any()


def test_the_worst_case_bound_loss_and_its_mix():
    lb = tf.constant([[0.0, 1.0], [0.5, 0.5]])
    ub = tf.constant([[3.0, 2.0], [0.5, 4.0]])
    q = tf.constant([[1.0, 1.5], [0.5, 1.0]])
    # row 0 as the doctest: 1.5 + 0.125; row 1, action 1 taken, target 1: |4 - 1| = 3 -> 2.5,
    # action 0: 0
    wc = wocar.worst_case_bound_loss(lb, ub, q, tf.constant([0, 1]), tf.constant([2.0, 1.0]))
    np.testing.assert_allclose(wc.numpy(), [1.625, 2.5])
    agent = _hand_dqn(robust_kappa=0.5)
    obs = tf.constant([[0.5, 0.3, 0.0, 0.0], [0.4, 0.4, 0.0, 0.0]])
    q = agent.q(obs)  # [1.0, 0.6], [0.8, 0.8]: spreads 0.4, 0 -> importance 2, 0
    per_example = tf.constant([1.0, 3.0])
    mixed = agent.robustness.q_loss(per_example, obs, tf.constant([0, 1]), q,
                                    tf.constant([1.0, 0.8]))
    lb, ub = certify.output_bounds(agent.robustness.surface, obs, 0.02, "ibp")
    wc0 = wocar.worst_case_bound_loss(lb, ub, q, tf.constant([0, 1]), tf.constant([1.0, 0.8]))
    np.testing.assert_allclose(mixed.numpy(), [0.5 * 1.0 + 0.5 * 2.0 * wc0[0], 0.5 * 3.0],
                               rtol=1e-5)


def test_the_worst_case_term_is_measured_in_units_of_the_q_scale():
    """``scale · huber(x / scale)``: scale 1 is the paper's term; scaling every Q-value, bound
    and target by ``c`` with the scale scales the term by ``c`` (as the TD Huber's linear part),
    so its weight against the TD loss does not depend on the reward's units; and while the
    ball moves a Q-value by less than ``delta · scale`` its gradient is the relative spread
    ``x / scale``, not the constant ``delta`` of the unscaled term's linear part."""
    lb = tf.constant([[0.0, 1.0], [0.5, 0.5]])
    ub = tf.constant([[3.0, 2.0], [0.5, 4.0]])
    q = tf.constant([[1.0, 1.5], [0.5, 1.0]])
    actions, target = tf.constant([0, 1]), tf.constant([2.0, 1.0])
    plain = wocar.worst_case_bound_loss(lb, ub, q, actions, target)
    np.testing.assert_allclose(
        wocar.worst_case_bound_loss(lb, ub, q, actions, target, scale=1.0).numpy(), plain.numpy())
    for c in (10.0, 100.0):
        scaled = wocar.worst_case_bound_loss(c * lb, c * ub, c * q, actions, c * target,
                                             scale=c)
        np.testing.assert_allclose(scaled.numpy(), c * plain.numpy(), rtol=1e-5)
    # row 1 by hand at scale 10: action 1 taken, |4 - 1| / 10 = 0.3 -> 10 * 0.045 = 0.45
    np.testing.assert_allclose(
        wocar.worst_case_bound_loss(lb, ub, q, actions, target, scale=10.0).numpy()[1], 0.45,
        rtol=1e-5)
    # the gradient w.r.t. an upper bound 5 above its clean Q-value, scale 50: 5 / 50 = 0.1
    ub_var = tf.Variable([[3.0, 6.5]])
    for scale, expected in ((50.0, 0.1), (1.0, 1.0)):
        with tf.GradientTape() as tape:
            loss = wocar.worst_case_bound_loss(tf.constant([[1.0, 1.5]]), ub_var,
                                               tf.constant([[2.0, 1.5]]), tf.constant([0]),
                                               tf.constant([2.0]), scale=scale)
        np.testing.assert_allclose(tape.gradient(loss, ub_var).numpy()[0, 1], expected,
                                   rtol=1e-5)
    np.testing.assert_allclose(wocar.q_scale(tf.constant([30.0, -50.0, 10.0])).numpy(), 30.0)
    assert float(wocar.q_scale(tf.constant([0.3, -0.1]))) == 1.0


def test_the_dqn_plugin_measures_its_worst_case_term_in_units_of_the_td_targets():
    """WocaR-DQN's ``q_loss`` uses the batch's :func:`wocar.q_scale` of the TD targets: the same
    bounds and Q-values with targets of size 40 give the scaled term, and the ``wocar_scale``
    and ``wocar_td_loss`` logs say what it used."""
    agent = _hand_dqn(robust_kappa=0.5)
    obs = tf.constant([[0.5, 0.3, 0.0, 0.0], [0.4, 0.4, 0.0, 0.0]])
    q = agent.q(obs)  # spreads 0.4, 0 -> importance 2, 0
    per_example = tf.constant([1.0, 3.0])
    actions, target = tf.constant([0, 1]), tf.constant([40.0, 40.0])
    mixed = agent.robustness.q_loss(per_example, obs, actions, q, target)
    lb, ub = certify.output_bounds(agent.robustness.surface, obs, 0.02, "ibp")
    wc40 = wocar.worst_case_bound_loss(lb, ub, q, actions, target, scale=40.0)
    wc1 = wocar.worst_case_bound_loss(lb, ub, q, actions, target)
    np.testing.assert_allclose(mixed.numpy(), [0.5 * 1.0 + 0.5 * 2.0 * wc40[0], 0.5 * 3.0],
                               rtol=1e-5)
    assert wc40[0] < 0.6 * wc1[0]  # |40 - 1| in units of 40: quadratic, not linear
    stats = agent.robustness._stats
    assert float(stats["wocar_scale"]) == pytest.approx(40.0)
    assert float(stats["wocar_td_loss"]) == pytest.approx(2.0)


class _Unbounded(agents.PPO):
    def policy_surface(self):
        surface = super().policy_surface()
        surface.action_low = np.array([-np.inf], np.float32)  # an unbounded action dimension
        return surface


def test_unbounded_action_dims_are_refused():
    with pytest.raises(ConfigError) as info:
        _Unbounded(env="Pendulum-v1", num_envs=2, n_steps=8, preset=None, robust="wocar")
    assert str(info.value) == ("env: WocaR on Box actions needs finite action bounds (the "
                               "worst-attack critic's action input and the admissible box are "
                               "clipped to them); 'Pendulum-v1' has Box(-2.0, 2.0, (1,), "
                               "float32)")


class _Opaque(agents.PPO):
    def policy_surface(self):
        surface = super().policy_surface()
        surface.layers = None  # a network the agent declares no affine stack for
        return surface


class _Misshapen(agents.PPO):
    def policy_surface(self):
        surface = super().policy_surface()
        (w0, b0), *_ = surface.layers
        surface.layers = ((w0, b0), (tf.zeros([3, 2]), tf.zeros([2])))
        return surface


def test_a_policy_network_the_engine_cannot_bound_is_refused_naming_the_layer():
    with pytest.raises(ConfigError) as info:
        _Opaque(env="CartPole-v1", num_envs=2, n_steps=8, preset=None, robust="wocar")
    assert str(info.value) == ("policy network: its policy surface declares no affine layers "
                               "(PolicySurface(layers=...)); the bound engine cannot bound it")
    with pytest.raises(ConfigError) as info:
        _Misshapen(env="CartPole-v1", num_envs=2, n_steps=8, preset=None, robust="wocar",
                   hidden_sizes=(8,))
    assert str(info.value) == ("policy network: the bound engine cannot bound it (weights[1] "
                               "must have shape [8, out], got [3, 2])")


@pytest.mark.parametrize("algo,steps", [("ppo", 2048), ("a2c", 80)])
def test_train_agent_trains_wocar_on_pendulum(algo, steps, tmp_path):
    """Issue 37: ``train-agent --robust wocar`` on a Box action space trains WocaR-PPO/A2C for
    Box actions and saves its worst-attack critic ``[d + k] -> [1]`` with the agent. Two
    rollouts' worth for A2C (no Pendulum preset: 8 envs x 5 steps), one for PPO (its preset's
    4 x 512): each rollout fits the critic 10 x 32 times."""
    from robustgrad import cli

    out = tmp_path / "run"
    assert cli.main(["train-agent", "--algo", algo, "--env", "Pendulum-v1", "--steps", str(steps),
                     "--out", str(out), "--robust", "wocar", "--eps", "0.2"]) == 0
    agent = agents.load(str(out))
    assert type(agent.robustness).__name__ == "WocaRBoxPlugin"
    assert agent.config.robust == "wocar" and agent.config.robust_eps == 0.2
    assert agent.robustness.critic.weights_[0].shape[0] == 3 + 1
    assert any("wocar_admissible" in h for h in agent.history)


def test_train_agent_accepts_robust_wocar():
    from robustgrad.commands import train_agent

    parser = argparse.ArgumentParser()
    train_agent.add_arguments(parser)
    assert parser.parse_args(["--robust", "wocar"]).robust == "wocar"
    # --eps-warmup sets WocaR's own warm-up (robust_eps_warmup is SA's, refused with wocar)
    args = parser.parse_args(["--robust", "wocar", "--eps-warmup", "0.2"])
    args.algo = "ppo"
    assert train_agent._robust_overrides(args) == {"robust": "wocar", "wocar_warmup": 0.2}
    args = parser.parse_args(["--robust", "sa", "--eps-warmup", "0.2"])
    args.algo = "ppo"
    assert train_agent._robust_overrides(args) == {"robust": "sa", "robust_eps_warmup": 0.2}


def test_wocar_ppo_learns_cartpole_and_its_worst_case_value_is_below_the_natural_one(
        monkeypatch):
    """A short real run (graph backend, 12k steps, 10 epochs, a 2-step inner search): the policy
    learns well above random (~22), the weight follows its schedule, and the worst-attack value
    of the states the policy visits is below the natural critic's value there. The inner search
    is traced once, on the rollout's 256 states (shape_advantages), not in the epochs' loop;
    outside the compiled update, regularizer_inputs searches for its own observations."""
    calls = []
    search = wocar_base.sa_observations

    def counting(agent, obs, *args, **kwargs):
        calls.append(int(obs.shape[0]))
        return search(agent, obs, *args, **kwargs)

    monkeypatch.setattr(wocar_base, "sa_observations", counting)
    agent = agents.PPO(env="CartPole-v1", seed=0, backend="graph", n_epochs=10,
                       robust=agents.WocaR(eps=0.05, bound="ibp", steps=2))
    logs = []
    agent.learn(12_288, progress_bar=False, callbacks=lambda _, entry: logs.append(entry))
    returns = [h["episode_return"] for h in agent.history[-5:]]
    assert np.mean(returns) > 45.0, returns  # random play: ~22; this seed reaches ~60
    assert np.mean(returns) > 2.0 * agent.history[0]["episode_return"]
    last = logs[-1]
    assert last["wocar_weight"] == pytest.approx(0.8 * min(1.0, last["steps"] / 9216), rel=0.05)
    assert 1.0 <= last["wocar_admissible"] <= 2.0
    wocar_logs = {k: v for k, v in last.items() if k.startswith("wocar_")}
    assert sorted(wocar_logs) == ["wocar_admissible", "wocar_q_loss", "wocar_weight",
                                  "wocar_worst_q"]
    assert {k: agent.history[-1][k] for k in wocar_logs} == wocar_logs  # the history has them
    assert [h["wocar_weight"] for h in agent.history] == [e["wocar_weight"] for e in logs]
    assert calls == [256], calls
    assert all(np.isfinite(e["sa_kl"]) and e["sa_kl"] >= 0.0 for e in logs)
    assert logs[-1]["sa_kl"] > 0.0
    clean, x_adv, importance = agent.robustness.regularizer_inputs(tf.zeros([5, 4]))
    assert calls == [256, 5]
    assert clean.shape == (5, 2) and x_adv.shape == (5, 4) and importance.shape == (5,)
    np.testing.assert_allclose(tf.reduce_sum(tf.exp(clean), -1).numpy(), 1.0, rtol=1e-5)
    np.testing.assert_allclose(float(tf.reduce_mean(importance)), 1.0, rtol=1e-5)
    env = gymnasium.make("CartPole-v1")
    state, _ = env.reset(seed=5)
    visited = []
    for _ in range(100):  # states the trained policy visits
        visited.append(state)
        state, _, term, trunc, _ = env.step(int(agent.act(state[None], deterministic=True)[0]))
        if term or trunc:
            state, _ = env.reset()
    obs = np.asarray(visited, np.float32)
    surface = agent.policy_surface()
    adm = wocar.admissible_actions(surface, obs, 0.05, "ibp")
    worst = tf.reduce_min(tf.where(adm, agent.robustness.worst_q(obs), np.inf), -1).numpy()
    natural = agent.value(obs).numpy()
    assert worst.mean() < natural.mean(), (worst, natural)


def test_wocar_ppo_on_box_actions_learns_pendulum_and_its_worst_case_is_below_the_natural_one():
    """A short real run of WocaR-PPO on Box actions (the Pendulum preset, graph backend, 30k
    steps, the paper's critic budget of 10 epochs of 32 minibatches per 2048-step rollout):
    the episode return rises (this seed: ~-1240 over the first five iterations, ~-1110 over
    the last five; random play ~-1200 to -1300), the worst-attack critic learns the returns'
    scale (its mean value ~-0.6 after the first rollout, ~-2.8 at the end), the admissible
    box opens with the schedule's eps, and at states the policy visits the worst value over
    the box is below the natural critic's value and never above the clean action's
    worst-attack value."""
    agent = agents.PPO(env="Pendulum-v1", seed=0, backend="graph",
                       robust=agents.WocaR(eps=0.2, bound="ibp", q_epochs=10,
                                           q_minibatches=32))
    logs = []
    agent.learn(30_720, progress_bar=False, callbacks=lambda _, entry: logs.append(entry))
    returns = [e["episode_return"] for e in logs]
    assert np.mean(returns[-5:]) > np.mean(returns[:5]) + 50.0, returns
    assert logs[-1]["wocar_worst_q"] < 3.0 * logs[0]["wocar_worst_q"] < 0.0
    assert logs[0]["wocar_admissible"] == 0.0 < logs[-1]["wocar_admissible"] < 4.0
    assert sorted(k for k in logs[-1] if k.startswith("wocar_")) == [
        "wocar_admissible", "wocar_q_loss", "wocar_weight", "wocar_worst_q"]
    env = gymnasium.make("Pendulum-v1")
    state, _ = env.reset(seed=5)
    visited = []
    for _ in range(200):  # states the trained policy visits
        visited.append(state)
        state, *_ = env.step(agent.act(state[None], deterministic=True)[0])
    obs = tf.constant(np.asarray(visited, np.float32))
    plugin = agent.robustness
    a_star, clean, _, _ = plugin.worst_actions(obs, 0.2)
    worst = plugin.worst_next_values(obs, a_star, clean).numpy()
    assert (worst <= plugin.q_at(obs, clean).numpy() + 1e-6).all()
    assert worst.mean() < agent.value(obs).numpy().mean()


@pytest.mark.parametrize("every", [1, 3])
def test_the_smoothness_term_runs_on_update_steps_0_k_2k_weighted_to_the_updates_steps(every):
    """``smoothness_every = k``: of an update's ``n`` steps (here 5, counted from the rollout's
    ``shape_advantages``), steps 0, k, 2k, ... take the term and its gradient times
    ``n / ceil(n / k)`` (so the update's weights sum to ``n``, as with the term on every step);
    the steps between give 0 and no gradient to the policy; ``k = 1``: every step, once."""
    agent = agents.PPO(env="CartPole-v1", seed=0, num_envs=2, n_steps=8, n_epochs=5,
                       n_minibatches=1, preset=None,
                       robust=agents.WocaR(eps=0.05, warmup=0.0, kappa=0.5,
                                           smoothness_every=every))
    plugin = agent.robustness
    assert plugin.steps_per_update == 5
    obs = tf.constant(np.random.default_rng(0).normal(size=[6, 4]).astype(np.float32))
    inputs = plugin.regularizer_inputs(obs)
    variables = wocar_base._surface(agent).network.trainable_variables
    with tf.GradientTape() as tape:
        loss_one, term_one = plugin.smoothness_term(obs, inputs)
    grads_one = tape.gradient(loss_one, variables)
    assert float(loss_one) > 0.0 and float(term_one) > 0.0
    weights = [1.0] * 5 if every == 1 else [2.5, 0.0, 0.0, 2.5, 0.0]  # steps 0 and 3
    plugin._update_steps.assign(0)  # as shape_advantages does before each update
    for k in weights:
        with tf.GradientTape() as tape:
            loss, term = plugin.regularizer(obs, inputs)
        grads = tape.gradient(loss, variables, unconnected_gradients="zero")
        np.testing.assert_allclose([float(loss), float(term)],
                                   [k * float(loss_one), k * float(term_one)], rtol=1e-6)
        for g, g_one in zip(grads, grads_one, strict=True):
            # float32 sums in another order: to 1e-3 of the gradient's scale (zeros exactly)
            np.testing.assert_allclose(g.numpy(), k * g_one.numpy(), rtol=0,
                                       atol=1e-3 * k * float(np.abs(g_one.numpy()).max()))
    # a real update: the count restarts at each rollout and ends at its number of steps
    agent.learn(32, progress_bar=False)
    assert int(plugin._update_steps.numpy()) == (5 if every > 1 else 0)


def test_an_update_of_one_step_takes_the_smoothness_term_on_every_step():
    """A2C's update is one step: ``smoothness_every`` 2 (the discrete default) leaves the term
    on every step, unweighted."""
    agent = agents.A2C(env="CartPole-v1", seed=0, num_envs=2, n_steps=4, preset=None,
                       robust=agents.WocaR(eps=0.05, warmup=0.0, kappa=0.5))
    plugin = agent.robustness
    assert (plugin.spec.smoothness_every, plugin.steps_per_update) == (2, 1)
    obs = tf.constant(np.random.default_rng(1).normal(size=[6, 4]).astype(np.float32))
    inputs = plugin.regularizer_inputs(obs)
    once = [float(x) for x in plugin.smoothness_term(obs, inputs)]
    for _ in range(3):
        assert [float(x) for x in plugin.regularizer(obs, inputs)] == once


def test_box_wocar_with_kappa_zero_runs_no_search(monkeypatch):
    """Box actions, kappa 0: the KL term's inputs (the ``mad`` search, the importance) are not
    computed and the term is 0; with kappa > 0 the search runs once per rollout, on all of
    its states."""
    calls = []
    search = wocar_box.sa_observations

    def counting(agent, obs, *args, **kwargs):
        calls.append(int(obs.shape[0]))
        return search(agent, obs, *args, **kwargs)

    monkeypatch.setattr(wocar_box, "sa_observations", counting)
    for kappa, expected in ((0.0, []), (0.1, [128])):
        calls.clear()
        agent = agents.PPO(env="Pendulum-v1", seed=0, num_envs=2, n_steps=64, preset=None,
                           backend="graph", robust=agents.WocaR(eps=0.2, kappa=kappa))
        logs = []
        agent.learn(256, progress_bar=False, callbacks=lambda _, entry: logs.append(entry))
        assert calls == expected, (kappa, calls)
        assert (logs[-1]["sa_kl"] == 0.0) == (kappa == 0.0)


def test_term_and_term_start_are_wocar_dqns_settings_saved_flat_and_refused_by_ppo():
    cfg = DQNConfig(robust=agents.WocaR(eps=0.02, term="margin", term_start=0.4))
    assert (cfg.wocar_term, cfg.wocar_term_start) == ("margin", 0.4)
    back = DQNConfig.from_dict(cfg.to_dict()).robust_spec.settings(value_based=True)
    assert (back.term, back.term_start) == ("margin", 0.4)
    for name, value in (("wocar_term", "margin"), ("wocar_term_start", 0.4)):
        with pytest.raises(ConfigError) as info:
            PPOConfig(robust="wocar", robust_eps=0.05, **{name: value})
        assert str(info.value) == (f"{name}: a setting of WocaR-DQN (its worst-attack "
                                   f"network's step rate on the replay), which WocaR-PPO/A2C "
                                   f"do not read, got {name}={value!r}")


@pytest.mark.parametrize("bound", ["ibp", "crown", "crown-ibp"])
def test_the_margin_term_is_the_hinge_on_the_greedy_actions_certified_margin(bound):
    """``term="margin"``: ``(1 − k) · TD + k · ω(s) · max(−lb(Q_a* − Q_j), −1)``; on the hand
    net the margin ``2 (s_0 − s_1)`` is linear on the ball, so every method's lower bound is
    exact: the margin less ``4 eps`` = 0.08."""
    agent = _hand_dqn(robust_kappa=0.5, wocar_term="margin", wocar_bound=bound)
    obs = tf.constant([[0.5, 0.3, 0.0, 0.0],    # Q 1.0 / 0.6: lb 0.32 -> hinge -0.32
                       [0.4, 0.4, 0.0, 0.0],    # a tie, greedy 0: lb -0.08 -> hinge 0.08
                       [0.2, 1.0, 0.0, 0.0]])   # greedy 1, lb 1.52 -> hinge -1 (clipped)
    q = agent.q(obs)  # spreads 0.4, 0, 1.6 -> importance 0.6, 0, 2.4
    per_example = tf.constant([1.0, 3.0, 5.0])
    loss = agent.robustness.q_loss(per_example, obs, tf.constant([0, 1, 0]), q,
                                   tf.constant([1.0, 1.0, 1.0]))
    np.testing.assert_allclose(loss.numpy(), [0.5 - 0.5 * 0.6 * 0.32, 1.5, 2.5 - 0.5 * 2.4],
                               rtol=1e-5)
    np.testing.assert_allclose(certified_margin_hinge(tf.constant([[0.32], [-0.08]])),
                               [-0.32, 0.08], rtol=1e-6)
    unweighted = _hand_dqn(robust_kappa=0.5, wocar_term="margin", wocar_bound=bound,
                           wocar_importance=False)  # the paper's DQN code: every state alike
    loss = unweighted.robustness.q_loss(per_example, obs, tf.constant([0, 1, 0]), q,
                                        tf.constant([1.0, 1.0, 1.0]))
    np.testing.assert_allclose(loss.numpy(), [0.5 - 0.5 * 0.32, 1.5 + 0.5 * 0.08, 2.5 - 0.5],
                               rtol=1e-5)


def test_the_margin_term_bounds_sa_dqns_hinge_anywhere_in_the_ball():
    """Soundness by sampling: on a random ReLU Q-network the margin term's hinge is at least
    SA-DQN's hinge ``max(Q_j − Q_a*, −1)`` at 300 points of the ball around each state."""
    agent = agents.DQN(env="CartPole-v1", seed=3, preset=None, hidden_sizes=(16, 16),
                       activation="relu", normalize_obs=False, buffer_size=64, batch_size=8,
                       robust=agents.WocaR(eps=0.1, warmup=0.0, term="margin"))
    obs = tf.random.stateless_normal([5, 4], seed=[1, 2])
    greedy, margins = certify.greedy_margin_lower_bounds(agent.robustness.surface, obs, 0.1,
                                                       "crown-ibp")
    hinge = certified_margin_hinge(margins).numpy()
    noise = tf.random.stateless_uniform([300, 5, 4], seed=[3, 4], minval=-0.1, maxval=0.1)
    q_in_ball = agent.q(tf.reshape(obs[None] + noise, [-1, 4])).numpy().reshape(300, 5, 2)
    g = greedy.numpy()
    sa = np.maximum(q_in_ball[:, np.arange(5), 1 - g] - q_in_ball[:, np.arange(5), g], -1.0)
    assert np.all(hinge[None] >= sa - 1e-5)
    assert np.any(hinge > -1.0)  # not all clipped: the bound is exercised


def test_term_start_keeps_the_term_off_then_ramps_it_to_full_at_the_warmup():
    """``term_start``: kappa is 0 before that fraction of the budget, rises linearly to full at
    ``warmup`` (at once when ``term_start`` is past it); eps and the weight keep their ramp
    over ``warmup``."""
    def kappas(start, warmup=0.75):
        plugin = _hand_dqn(robust_kappa=0.5, wocar_warmup=warmup,
                           wocar_term_start=start).robustness
        out = []
        for done in (400, 499, 625, 750, 899, 900):
            plugin.before_iteration(done, 1000)
            out.append(round(float(plugin.schedule.kappa), 6))
        plugin.before_iteration(400, 1000)
        assert float(plugin.schedule.eps) == pytest.approx(0.02 * 400 / (warmup * 1000))
        assert float(plugin.weight) == pytest.approx(0.3 * 400 / (warmup * 1000))
        return out

    assert kappas(0.5) == [0.0, 0.0, 0.25, 0.5, 0.5, 0.5]
    assert kappas(0.9) == [0.0, 0.0, 0.0, 0.0, 0.0, 0.5]
    assert kappas(0.0)[:2] == [round(0.5 * 400 / 750, 6), round(0.5 * 499 / 750, 6)]


def test_the_dqn_worst_case_term_takes_ibp_bounds_whatever_bound_chooses_the_sets():
    """``wocar_bound`` chooses the admissible sets' bound method only; the worst-case term is
    the paper's, on IBP bounds (a CROWN term would cost a backward pass per step): on a random
    ReLU net, where CROWN's bounds are tighter than IBP's, the loss with ``bound="crown"`` is
    the IBP one."""
    agent = agents.DQN(env="CartPole-v1", seed=3, preset=None, hidden_sizes=(16, 16),
                       activation="relu", normalize_obs=False, buffer_size=64, batch_size=8,
                       robust=agents.WocaR(eps=0.05, warmup=0.0, bound="crown", kappa=0.5))
    obs = tf.random.stateless_normal([6, 4], seed=[4, 5])
    q = agent.q(obs)
    actions, target = tf.constant([0, 1, 0, 1, 0, 1]), tf.reduce_max(q, -1) + 0.3
    per_example = tf.ones([6])
    mixed = agent.robustness.q_loss(per_example, obs, actions, q, target).numpy()
    surface = agent.robustness.surface

    def mix(method):
        lb, ub = certify.output_bounds(surface, obs, 0.05, method)
        wc = wocar.worst_case_bound_loss(lb, ub, q, actions, target, 1.0, wocar.q_scale(target))
        return (0.5 * per_example + 0.5 * wocar.state_importance(q) * wc).numpy()

    np.testing.assert_allclose(mixed, mix("ibp"), rtol=1e-5)
    assert np.abs(mixed - mix("crown")).max() > 1e-4  # the two differ on this net


def test_wocar_dqn_learns_cartpole_and_its_worst_attack_value_is_below_the_natural_one():
    """A short real run (graph backend, 6k steps, a 64-64 Q-network, 32 gradient steps per
    64 env steps): the agent learns well above random (~22), the schedule's weight and the
    worst-attack network's logs are sane, and on the states the greedy policy visits the
    worst-attack value ``min_{a in A_adv(s)} Q_w(s, a)`` is below the natural ``max_a Q(s, a)``."""
    agent = agents.DQN(env="CartPole-v1", seed=0, backend="graph", hidden_sizes=(64, 64),
                       train_freq=64, gradient_steps=32, robust=agents.WocaR(eps=0.02))
    logs = []
    agent.learn(6144, progress_bar=False, callbacks=lambda _, entry: logs.append(entry))
    # measured after 6,144 steps: mean return ~94, greedy evaluation ~78 (seed 1: ~127, ~73)
    assert np.mean(agent.episode_returns) > 45.0, agent.episode_returns  # random play: ~22
    assert agent.evaluate(5, seed=3)["mean_return"] > 45.0
    last = logs[-1]
    assert last["wocar_weight"] == pytest.approx(0.3 * min(1.0, last["steps"] / (0.75 * 6144)),
                                                 rel=0.05)
    assert 1.0 <= last["wocar_admissible"] <= 2.0
    assert np.isfinite(last["wocar_q_loss"]) and last["wocar_bound_loss"] > 0.0
    for entry, logged in zip(agent.history, logs, strict=True):  # the history has them too
        assert entry["wocar_bound_loss"] == logged["wocar_bound_loss"]
        assert entry["wocar_weight"] == logged["wocar_weight"]
    env = gymnasium.make("CartPole-v1")
    state, _ = env.reset(seed=5)
    visited = []
    for _ in range(100):  # states the trained greedy policy visits
        visited.append(state)
        state, _, term, trunc, _ = env.step(int(agent.act(state[None], deterministic=True)[0]))
        if term or trunc:
            state, _ = env.reset()
    obs = np.asarray(visited, np.float32)
    adm = wocar.admissible_actions(agent.policy_surface(), obs, 0.02, "ibp")
    worst = tf.reduce_min(tf.where(adm, agent.robustness.worst_q(obs), np.inf), -1).numpy()
    natural = tf.reduce_max(agent.q_values(obs), -1).numpy()
    assert worst.mean() <= natural.mean(), (worst.mean(), natural.mean())


def _plugin_state(agent):
    return [v.numpy() for name, module in sorted(agent.robustness.checkpoint_modules().items())
            for v in module.variables]


def test_a_saved_wocar_ppo_keeps_its_critic_and_resumes_as_the_uninterrupted_run(tmp_path):
    """The worst-attack networks and their Adam state are saved with the agent: a loaded agent
    holds them bit for bit, and learning on from the checkpoint gives exactly the weights of the
    run that was never interrupted (its env reset where the loaded agent's is: no agent saves
    its env state). A checkpoint without them (written before they were kept) still loads, with
    a fresh critic."""
    kw = dict(env="CartPole-v1", num_envs=2, n_steps=16, n_epochs=2, preset=None, seed=4,
              robust=agents.WocaR(eps=0.05, steps=2))
    run = agents.PPO(**kw)
    run.learn(96, progress_bar=False)
    assert int(run.robustness.critic_optimizer.iterations.numpy()) == 3 * \
        agents.WocaR.DEFAULTS["q_epochs"] * agents.WocaR.DEFAULTS["q_minibatches"]
    run.save(tmp_path / "a")
    loaded = agents.load(tmp_path / "a")
    for x, y in zip(_plugin_state(run), _plugin_state(loaded), strict=True):
        np.testing.assert_array_equal(x, y)
    fresh = _plugin_state(agents.PPO(**kw))
    assert not all(np.array_equal(x, y) for x, y in zip(fresh, _plugin_state(loaded)))
    # the loaded agent resets its env from the config's seed (no agent saves its env state):
    # the uninterrupted run does the same there
    run._on_env_reset(run.env.reset(seed=run.config.seed))
    run.learn(64, progress_bar=False)
    loaded.learn(64, progress_bar=False)
    for x, y in zip(run.get_weights() + _plugin_state(run),
                    loaded.get_weights() + _plugin_state(loaded), strict=True):
        np.testing.assert_array_equal(x, y)
    # a checkpoint of the previous format (no robustness/ node) loads; the critic starts fresh
    old = agents.PPO(**kw)
    old.learn(32, progress_bar=False)
    old.robustness.checkpoint_modules = dict  # what the plug-in kept before: nothing
    old.save(tmp_path / "old")
    names = {n.split("/", 1)[0] for n, _ in tf.train.list_variables(
        str(tmp_path / "old" / "weights" / "ckpt"))}
    assert "robustness" not in names and "robustness" in {
        n.split("/", 1)[0] for n, _ in tf.train.list_variables(
            str(tmp_path / "a" / "weights" / "ckpt"))}
    again = agents.load(tmp_path / "old")
    for x, y in zip(fresh, _plugin_state(again), strict=True):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(old.get_weights(), again.get_weights(), strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_saved_wocar_dqn_keeps_its_worst_attack_network(tmp_path):
    agent = agents.DQN(env="CartPole-v1", seed=1, hidden_sizes=(16,), learning_starts=32,
                       train_freq=16, gradient_steps=2, batch_size=16, buffer_size=256,
                       robust=agents.WocaR(eps=0.02), preset=None)
    agent.learn(96, progress_bar=False)
    assert int(agent.robustness.critic_optimizer.iterations.numpy()) > 0
    agent.save(tmp_path / "d")
    loaded = agents.load(tmp_path / "d")
    for x, y in zip(_plugin_state(agent), _plugin_state(loaded), strict=True):
        np.testing.assert_array_equal(x, y)
