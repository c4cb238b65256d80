"""Robust training as a plug-in (agents.core.plugin) and the typed robust configs (agents.SA,
agents.Adversarial, agents.ATLA)."""

import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.config import AUTO, DQNConfig, PPOConfig, make_config
from agents.core import plugin


@pytest.mark.parametrize("typed,flat", [
    (agents.SA(eps=0.05, kappa=0.5, steps=4, method="sgld", warmup=0.0),
     dict(robust="sa", robust_eps=0.05, robust_kappa=0.5, robust_steps=4, robust_method="sgld",
          robust_eps_warmup=0.0)),
    (agents.Adversarial(eps=0.02, attack="mad", steps=3),
     dict(robust="adv", robust_eps=0.02, robust_attack="mad", robust_steps=3)),
    (agents.ATLA(eps=0.1, start_radius=0.3), dict(robust="atla", robust_eps=0.1,
                                                  atla_start_radius=0.3)),
    (agents.ATLA(eps=0.1, kappa=0.2, method="convex"),
     dict(robust="atla-sa", robust_eps=0.1, robust_kappa=0.2, robust_method="convex")),
])
def test_a_typed_robust_config_is_the_flat_fields_it_names(typed, flat):
    config = PPOConfig(robust=typed)
    assert config.to_dict() == PPOConfig(**flat).to_dict()
    assert config.robust == flat["robust"]
    # saved and loaded as flat fields (agents of earlier versions load), read back typed
    again = PPOConfig.from_dict(config.to_dict())
    assert again.robust_spec == config.robust_spec
    assert type(again.robust_spec) is type(typed)
    for attr, value in vars(typed).items():
        if value is not None:
            assert getattr(again.robust_spec, attr) == value


def test_a_typed_config_keeps_the_fields_it_leaves_out():
    # the DQN CartPole preset carries robust_kappa 0.5; SA(eps=...) keeps it
    config = make_config(DQNConfig, "dqn", AUTO, env="CartPole-v1", robust=agents.SA(eps=0.02))
    assert (config.robust, config.robust_eps, config.robust_kappa) == ("sa", 0.02, 0.5)
    assert PPOConfig().robust_spec is None
    assert PPOConfig(robust="sa").robust_spec == agents.SA(eps=0.1, kappa=0.1, steps=10,
                                                          method="pgd", warmup=0.75)


def test_a_setting_given_both_typed_and_flat_is_refused_unless_they_agree():
    # the typed value used to win silently over the caller's flat field
    with pytest.raises(ValueError) as info:
        PPOConfig(robust=agents.SA(eps=0.1), robust_eps=0.2)
    assert str(info.value) == (
        "robust_eps: robust=SA(eps=0.1, kappa=None, steps=None, method=None, warmup=None) sets "
        "it to 0.1 and robust_eps=0.2 too; give it once (in the typed config, or as robust_eps "
        "with robust='sa')")
    with pytest.raises(ValueError, match="^robust_kappa: robust=SA"):
        DQNConfig(robust=agents.SA(kappa=1.0), robust_kappa=2.0)
    assert PPOConfig(robust=agents.SA(eps=0.1), robust_eps=0.1).robust_eps == 0.1  # agree
    # a field the typed config leaves out is the caller's
    assert PPOConfig(robust=agents.SA(eps=0.1), robust_kappa=2.0).robust_kappa == 2.0
    # a preset's value is not the caller's: the typed config wins over it (preset kappa 0.5)
    config = make_config(DQNConfig, "dqn", AUTO, env="CartPole-v1",
                         robust=agents.SA(eps=0.02, kappa=1.0))
    assert (config.robust_eps, config.robust_kappa) == (0.02, 1.0)


@pytest.mark.parametrize("typed,message", [
    (agents.SA(eps=-1.0), "robust_eps"),
    (agents.SA(method="fgsm"), "robust_method"),
    (agents.Adversarial(attack="square"), "robust_attack"),
    (agents.ATLA(eps=0.2, start_radius=0.1), "atla_start_radius"),
])
def test_a_typed_config_is_checked_as_its_flat_fields(typed, message):
    with pytest.raises(ValueError, match=message):
        PPOConfig(robust=typed)


def test_the_method_table():
    assert list(plugin.ROBUSTNESS) == ["sa", "adv", "atla", "atla-sa", "wocar"]
    with pytest.raises(TypeError):
        plugin.ROBUSTNESS["x"] = plugin.RobustnessPlugin  # read-only
    with pytest.raises(ValueError, match="already"):
        plugin.register_robustness("sa", plugin.RobustnessPlugin)
    with pytest.raises(TypeError, match="factory must be callable"):
        plugin.register_robustness("x", 3)
    with pytest.raises(ValueError, match=r"robust must be one of \('sa', 'adv', 'atla', "
                                         r"'atla-sa', 'wocar'\), got 'noise'"):
        PPOConfig(robust="noise")


class _Offset(plugin.RobustnessPlugin):
    """A new method in a few lines: the rollout perceives obs + 100; one log key per phase."""

    def __init__(self, agent):
        super().__init__(agent)
        self.phases = 0

    def perceive(self, obs, seed):
        return obs + 100.0

    def before_iteration(self, steps_done, total):
        self.phases += 1
        return {"offset_phase": float(self.phases)}

    def after_iteration(self, logs, extra):
        logs.update(extra)


def test_a_new_method_is_a_plugin_and_its_registry_entry():
    plugin.register_robustness("offset", _Offset)
    try:
        agent = agents.PPO(env="CartPole-v1", num_envs=2, n_steps=8, preset=None,
                           robust="offset")
        assert isinstance(agent.robustness, _Offset) and agent.robust_schedule is None
        logs = []
        agent.learn(32, progress_bar=False, callbacks=lambda a, lg: logs.append(dict(lg)))
        assert agent.robustness.phases == 2 and [lg["offset_phase"] for lg in logs] == [1.0, 2.0]
        batch = agent.collect()  # what the policy saw, stored and learned from
        assert float(tf.reduce_min(batch["obs"])) > 90.0
        assert np.abs(batch["final_obs"].numpy()).max() < 90.0  # the env's own observations
    finally:
        del plugin._TABLE["offset"]


def test_plain_agents_hold_the_no_op_plugin():
    for cls in (agents.PPO, agents.A2C, agents.REINFORCE, agents.DQN):
        agent = cls(env="CartPole-v1", preset=None)
        assert type(agent.robustness) is plugin.RobustnessPlugin
        obs = tf.ones([2, 4])
        assert agent.robustness.perceive(obs, tf.constant([1, 2])) is obs
        assert agent.robustness.regularizer_inputs(obs) is None
        agent.close()
