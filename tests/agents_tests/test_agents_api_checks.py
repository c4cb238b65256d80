"""Wrong arguments and edited files of the agents' API (issue 24): one clear error each."""

import json
import math
import os

import gymnasium as gym
import numpy as np
import pytest

import agents
from agents.robustness.attack_evaluation import evaluate_under_attack
from agents.robustness.observation_attacks import ObservationAttack

SMALL = dict(env="CartPole-v1", num_envs=2, n_steps=8, hidden_sizes=(8,), seed=0)


@pytest.fixture(scope="module")
def ppo():
    return agents.PPO(**SMALL)


def test_num_envs_zero_is_refused_not_replaced_by_a_default(ppo):
    with pytest.raises(ValueError, match="num_envs: must be a positive integer or None, got 0"):
        ppo.evaluate(2, num_envs=0)
    with pytest.raises(ValueError, match="num_envs must be an int >= 1, got 0"):
        evaluate_under_attack(ppo, ["random"], eps=[0.1], n_episodes=2, num_envs=0,
                              progress=False)


@pytest.mark.parametrize("agent, message", [
    (None, "got NoneType$"),
    ("runs/ppo", r"got str \(a path: load it first with agents.load\(path\)\)"),
])
def test_what_is_not_an_agent_is_a_type_error(agent, message):
    with pytest.raises(TypeError, match=r"^agent must be an agents.Agent \(PPO, A2C, REINFORCE, "
                                        r"DQN\), " + message):
        evaluate_under_attack(agent, ["random"], eps=[0.1])
    with pytest.raises(TypeError, match="^agent must be an agents.Agent"):
        ObservationAttack(agent, "mad", 0.1)


@pytest.mark.parametrize("attacks", [5, [1, 2], {"mad": 1}])
def test_attacks_of_the_wrong_type_are_a_type_error(ppo, attacks):
    with pytest.raises(TypeError, match="^attacks must be a comma-separated string or a list of "
                                        r"attack names \(random, action, mad, critic, rs, "
                                        r"optimal, paad\), got"):
        evaluate_under_attack(ppo, attacks, eps=[0.1])


def test_a_wrong_scale_value_is_named_not_called_a_shape(ppo):
    with pytest.raises(ValueError, match=r"scale must hold positive finite values, got -1.0 at "
                                         r"index 2"):
        ObservationAttack(ppo, "mad", 0.1, scale=np.array([1.0, 1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match=r"of shape \(4,\), got shape \(3,\)"):
        ObservationAttack(ppo, "mad", 0.1, scale=np.ones(3))


class _Constant(gym.Env):
    """Five steps of reward 1 whatever the actions: every policy scores 5."""
    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(3, np.float32), 1.0, False, self.t >= 5, {}


def test_a_normalised_score_of_0_over_0_is_null_in_report_json_with_the_reason(tmp_path):
    agent = agents.PPO(env=_Constant, num_envs=1, n_steps=8, hidden_sizes=(8,), seed=0)
    report = evaluate_under_attack(agent, ["random"], eps=[0.1], n_episodes=2, progress=False)
    assert math.isnan(report.rows[0]["normalized_score"])  # in Python: a float, as before
    paths = report.save(str(tmp_path / "report"))
    text = open(paths["report.json"]).read()

    def refuse(constant):
        raise AssertionError(f"report.json holds {constant}, which is not JSON")

    data = json.loads(text, parse_constant=refuse)
    assert data["rows"][0]["normalized_score"] is None
    assert any("normalized_score is undefined (0/0; null in report.json): the clean return "
               "equals the random policy's (5)" in w for w in data["warnings"])


def test_an_agent_json_edited_to_another_algorithm_is_refused(tmp_path):
    path = str(tmp_path / "ppo")
    agents.PPO(**SMALL).save(path)
    meta_path = os.path.join(path, "agent.json")
    meta = json.load(open(meta_path))
    meta["algo"] = "a2c"
    json.dump(meta, open(meta_path, "w"))
    with pytest.raises(ValueError, match=r"agent.json says 'a2c' but config.json holds clip_coef, "
                                         r"clip_vloss, n_epochs, n_minibatches, fields of a 'ppo' "
                                         "config that a2c does not have"):
        agents.load(path)


def _edit(path, name, **changes):
    file = os.path.join(path, name)
    data = json.load(open(file))
    data.update(changes)
    json.dump(data, open(file, "w"))


def test_an_a2c_agent_json_edited_to_ppo_is_refused(tmp_path):
    # A2C's config fields are a subset of PPO's: without the check the A2C loaded as a PPO
    path = str(tmp_path / "a2c")
    agents.A2C(**SMALL).save(path)
    _edit(path, "agent.json", algo="ppo")
    with pytest.raises(ValueError, match=r"agent.json says 'ppo' but config.json lacks clip_coef, "
                                         r"clip_vloss, n_epochs, n_minibatches, fields every 'ppo' "
                                         r"config has, and holds the fields of the 'a2c' config"):
        agents.load(path)


def test_an_env_id_naming_a_module_in_a_saved_config_is_refused_unless_passed(tmp_path):
    path = str(tmp_path / "ppo")
    agents.PPO(**SMALL).save(path)
    _edit(path, "config.json", env="robustgrad_no_such_module:Env-v0")
    with pytest.raises(ValueError, match=r"config.json: env 'robustgrad_no_such_module:Env-v0' "
                                         r"names a module to import \('robustgrad_no_such_module'\)"
                                         r"; a saved file does not choose code to run"):
        agents.load(path)
    assert agents.load(path, env="CartPole-v1").config.env == "CartPole-v1"


@pytest.mark.parametrize("attack_kwargs, error, message", [
    ({"steps": 20}, ValueError, r"^attack_kwargs: 'steps' is not one of the attacks evaluated "
                                r"\(mad\); keywords go per attack"),
    ({"mad": {"stepz": 3}}, ValueError, r"^attack_kwargs\['mad'\]: mad takes no keyword 'stepz' "
                                        r"\(it takes steps, step_size"),
    ({"mad": {"steps": -1}}, ValueError, r"attack_kwargs\['mad'\]\['steps'\] must be an int >= 1"),
    ({"mad": 3}, TypeError, r"^attack_kwargs\['mad'\] must be a dict of keywords, got int$"),
])
def test_attack_kwargs_are_checked_before_any_episode(ppo, monkeypatch, attack_kwargs, error,
                                                      message):
    import agents.robustness.attack_evaluation as evaluation

    monkeypatch.setattr(evaluation, "_run_episodes",
                        lambda *a, **k: pytest.fail("an episode ran before the check"))
    with pytest.raises(error, match=message):
        evaluate_under_attack(ppo, ["mad"], eps=[0.1], n_episodes=2, progress=False,
                              attack_kwargs=attack_kwargs)


@pytest.mark.parametrize("attack, kwargs, message", [
    ("optimal", {"bogus": 1}, r"^attack_kwargs\['optimal'\]: optimal takes no keyword 'bogus' "
                              r"\(it takes start_radius, curriculum"),
    ("paad", {"stepz": 1}, r"^attack_kwargs\['paad'\]: paad takes no keyword 'stepz' \(it takes "
                           r"start_radius, .*, ppo, pgd_steps\)$"),
])
def test_learned_attacks_kwargs_are_train_adversarys_keywords(ppo, monkeypatch, attack, kwargs,
                                                             message):
    """A learned attack's keywords are those of agents.robustness.adversary.train_adversary (and PA-AD's
    actor's pgd_steps), checked before any episode or adversary training."""
    import agents.robustness.attack_evaluation as evaluation

    monkeypatch.setattr(evaluation, "_run_episodes",
                        lambda *a, **k: pytest.fail("an episode ran before the check"))
    with pytest.raises(ValueError, match=message):
        evaluate_under_attack(ppo, [attack], eps=[0.1], n_episodes=2, progress=False,
                              attack_kwargs={attack: kwargs})
