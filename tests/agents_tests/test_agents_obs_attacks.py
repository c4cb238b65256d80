"""Observation attacks on agents, Robust Sarsa and the attack-success evaluation."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.robustness.attack_evaluation import (
    ObservationAttackWrapper,
    evaluate_under_attack,
    monotonicity_warnings,
    worst_cases,
)
from agents.robustness.observation_attacks import (
    ObservationAttack,
    attack_observations,
    mad_attack,
    perturbation_norms,
    perturbation_scale,
    step_seed,
)
from agents.robustness.robust_sarsa import fit_q_pi

GRADIENT_ATTACKS = ("action", "mad", "critic")


@pytest.fixture(scope="module")
def trained():
    """PPO on CartPole, briefly trained (the recipe of test_agents_learning: >= 150)."""
    agent = agents.PPO(env="CartPole-v1", seed=0, preset=None)
    agent.learn(20_480, progress_bar=False)
    return agent


@pytest.fixture(scope="module")
def normalised():
    """An untrained PPO whose observation normaliser has std (0.5, 2, 0.05, 4)."""
    agent = agents.PPO(env="CartPole-v1", seed=1, num_envs=1, n_steps=32, normalize_obs=True,
                       preset=None)
    rms = agent.model.obs_norm.rms
    rms.var.assign(np.array([0.25, 4.0, 0.0025, 16.0]) - rms.epsilon)
    rms.mean.assign(np.array([0.1, -0.2, 0.0, 0.3]))
    return agent


def _obs(n=16, seed=0):
    return (np.random.default_rng(seed).standard_normal((n, 4)) * 0.1).astype(np.float32)


def test_attacks_lower_a_trained_agents_return(trained):
    report = evaluate_under_attack(trained, ["random", "action", "critic"], eps=[0.3],
                                   n_episodes=4, seed=0, progress=False)
    clean = report.clean["mean"]
    assert clean >= 100, report.clean
    noise = report.row("random", 0.3)["mean"]
    for name in ("action", "critic"):
        row = report.row(name, 0.3)
        assert row["mean"] < 0.5 * clean and row["mean"] < noise, str(report)
        assert row["action_changed"] > 0.2
        assert row["mean_perturbation"] <= 0.3 + 1e-6
    worst = report.worst_case[0]
    assert worst["mean"] == min(report.row(n, 0.3)["mean"] for n in report.attacks)
    assert worst["normalized_score"] == pytest.approx(
        (worst["mean"] - report.random_policy["mean"])
        / (clean - report.random_policy["mean"]))


def test_mad_finds_a_larger_kl_than_noise(trained):
    obs = _obs(64)
    p = tf.nn.log_softmax(trained.distribution(obs).logits)

    def kl(adv):
        q = tf.nn.log_softmax(trained.distribution(adv).logits)
        return float(tf.reduce_mean(tf.reduce_sum(tf.exp(p) * (p - q), -1)))

    k_mad = kl(attack_observations(trained, obs, "mad", eps=0.1, seed=0))
    k_rand = kl(attack_observations(trained, obs, "random", eps=0.1, seed=0))
    assert k_mad > 2 * k_rand and k_mad > 1e-3


@pytest.mark.parametrize("norm", ["linf", "l2"])
@pytest.mark.parametrize("units", ["raw", "normalised", "per-dimension"])
def test_every_perturbation_stays_in_the_ball(normalised, norm, units):
    agent = normalised
    std = np.sqrt(agent.model.obs_norm.rms.var.numpy() + agent.model.obs_norm.rms.epsilon)
    scale = {"raw": "raw", "normalised": None, "per-dimension": np.array([1, 2, 3, 4.0])}[units]
    unit = {"raw": np.ones(4), "normalised": std, "per-dimension": np.array([1, 2, 3, 4.0])}[units]
    np.testing.assert_allclose(perturbation_scale(agent, scale), unit, rtol=1e-6)
    obs = _obs()
    before = obs.copy()
    eps = 0.2
    for name in ("random",) + GRADIENT_ATTACKS:
        adv = np.asarray(attack_observations(agent, obs, name, eps=eps, norm=norm, seed=0,
                                             scale=scale))
        assert adv.shape == obs.shape and adv.dtype == np.float32
        delta = (adv.astype(np.float64) - obs) / unit
        size = np.abs(delta).max(1) if norm == "linf" else np.linalg.norm(delta, axis=1)
        assert size.max() <= eps * (1 + 1e-5) + 1e-6, (name, size.max())
        if name != "random":  # gradient attacks use the budget
            assert size.min() > 0.5 * eps, (name, size.min())
        np.testing.assert_allclose(perturbation_norms(obs, adv, unit, norm), size, atol=1e-5)
    np.testing.assert_array_equal(obs, before)  # inputs never modified


def test_normalised_budget_is_in_standard_deviations(normalised):
    obs = _obs()
    adv = np.asarray(attack_observations(normalised, obs, "action", eps=0.1, seed=0))
    std = np.sqrt(normalised.model.obs_norm.rms.var.numpy() + 1e-8)
    # L-inf steps of sign(gradient): each coordinate moves by about eps * std
    np.testing.assert_allclose(np.abs(adv - obs).max(0), 0.1 * std, rtol=1e-3)


def test_same_seed_same_perturbation_eager_compiled_and_wrapper(trained):
    obs = _obs(8)
    seed = step_seed(5, 0)
    eager = mad_attack(trained, obs, eps=0.1, seed=seed)
    compiled = tf.function(lambda o, s: mad_attack(trained, o, eps=0.1, seed=s))(obs, seed)
    np.testing.assert_allclose(eager, compiled, atol=1e-6)
    other = mad_attack(trained, obs, eps=0.1, seed=step_seed(6, 0))
    assert np.abs(np.asarray(other) - np.asarray(eager)).max() > 1e-4

    class Tap(gym.ObservationWrapper):
        def __init__(self, env):
            super().__init__(env)
            self.seen = []

        def observation(self, o):
            self.seen.append(np.array(o, np.float32))
            return o

    tap = Tap(gym.make("CartPole-v1"))
    env = ObservationAttackWrapper(tap, trained, "mad", eps=0.1, seed=3)
    shown = [env.reset(seed=0)[0]]
    for _ in range(15):
        o, _r, term, trunc, _ = env.step(trained.act(shown[-1], deterministic=True))
        shown.append(o)
        if term or trunc:
            break
    batch = ObservationAttack(trained, "mad", 0.1)
    for t, (clean, seen) in enumerate(zip(tap.seen, shown)):
        np.testing.assert_allclose(batch(clean[None], seed=step_seed(3, t))[0], seen, atol=1e-6)
    assert len(env.perturbation_norms) == len(shown)
    assert max(env.perturbation_norms) <= 0.1 + 1e-6
    assert set(env.action_changed) <= {True, False}


def test_compiled_attack_traces_once_over_eps_and_seeds(trained):
    attack = ObservationAttack(trained, "action", 0.1)
    for i, eps in enumerate((0.05, 0.1, 0.2)):
        attack(_obs(8), seed=i, eps=eps)
    assert attack._compiled.experimental_get_tracing_count() == 1


class Countdown(gym.Env):
    """5 steps, obs (t/5, 1); reward 1 + action (Discrete(2)); terminates at t = 5."""

    observation_space = gym.spaces.Box(-1.0, 2.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.t / 5, 1.0], np.float32)

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0 + float(action), self.t >= 5, False, {}


def test_robust_sarsa_q_pi_matches_monte_carlo_returns():
    victim = agents.PPO(env=Countdown, seed=0, num_envs=1, n_steps=32, gamma=0.9, preset=None)
    q_pi = fit_q_pi(victim, steps=3000, updates=1500, target_every=100, seed=0)
    states = np.array([[t / 5, 1.0] for t in range(5)], np.float32)
    greedy = victim.act(states, deterministic=True)
    rewards = 1.0 + greedy.astype(np.float64)
    v = np.zeros(6)  # Monte-Carlo returns of the deterministic victim from each state
    for t in reversed(range(5)):
        v[t] = rewards[t] + 0.9 * v[t + 1]
    q = q_pi.q_table(states).numpy()
    for t in range(5):
        for a in (0, 1):  # Q^pi(s, a) = r(a) + gamma V^pi(s')
            assert q[t, a] == pytest.approx(1.0 + a + 0.9 * v[t + 1], rel=0.05, abs=0.1), (t, a)


def test_rs_attack_stays_in_the_ball_and_lowers_q(trained):
    q_pi = fit_q_pi(trained, steps=1000, updates=200, seed=0)
    obs = _obs(32)
    adv = attack_observations(trained, obs, "rs", eps=0.2, seed=0, q_pi=q_pi)
    assert np.abs(np.asarray(adv) - obs).max() <= 0.2 + 1e-6

    def q_of_actions(seen):
        a = tf.argmax(trained.distribution(seen).logits, -1)
        return float(tf.reduce_mean(q_pi.q(obs, a)))

    assert q_of_actions(adv) < q_of_actions(obs)


def test_dqn_critic_attack_drives_to_the_lowest_q_action():
    dqn = agents.DQN(env="CartPole-v1", seed=0, preset=None)
    obs = _obs(64)
    worst = np.argmin(dqn.q_values(obs).numpy(), -1)
    adv = attack_observations(dqn, obs, "critic", eps=1.0, seed=0)
    hit = np.mean(np.argmax(dqn.q_values(adv).numpy(), -1) == worst)
    clean_hit = np.mean(np.argmax(dqn.q_values(obs).numpy(), -1) == worst)
    assert clean_hit == 0.0 and hit > 0.5


def test_report_outputs(trained, tmp_path):
    report = evaluate_under_attack(trained, ["random", "mad"], eps=[0.1, 0.02], n_episodes=2,
                                   seed=1, progress=False)
    assert report.eps == [0.02, 0.1]  # sorted increasing
    assert [w["eps"] for w in report.worst_case] == [0.02, 0.1]
    ups = [w["up_to_eps_mean"] for w in report.worst_case]
    assert ups == sorted(ups, reverse=True)  # worst case over every budget up to eps
    paths = report.save(str(tmp_path))
    for p in paths.values():
        assert (tmp_path / p.split("/")[-1]).stat().st_size > 0
    text = str(report)
    assert "mad" in text and "worst case" in text
    import json

    data = json.loads(report.to_json())
    assert data["rows"][0]["attack"] == "random" and len(data["rows"]) == 4


def test_warns_when_a_larger_budget_scores_higher():
    def row(name, eps, mean):
        return {"attack": name, "eps": eps, "mean": mean, "median": mean,
                "normalized_score": mean / 500}

    rows = [row("mad", 0.1, 50.0), row("mad", 0.2, 120.0), row("action", 0.1, 300.0),
            row("action", 0.2, 299.0)]
    warnings = monotonicity_warnings(rows, ["mad", "action"], 500.0)
    assert warnings == ["mad: eps 0.2 scores higher (120.0) than eps 0.1 (50.0); RL attacks "
                        "are not monotone in eps, use the worst case up to eps"]
    worst = worst_cases(rows, [0.1, 0.2])
    assert [(w["attack"], w["mean"], w["up_to_eps_mean"]) for w in worst] == [
        ("mad", 50.0, 50.0), ("mad", 120.0, 50.0)]


# -- bad input ----------------------------------------------------------------------------------
def test_bad_input_is_refused_before_any_work(trained):
    with pytest.raises(ValueError, match=r"eps must be a number >= 0, got -0.1"):
        evaluate_under_attack(trained, ["random"], eps=[0.1, -0.1])
    with pytest.raises(ValueError, match=r"attacks must be one of \('random', 'action', 'mad', "
                                         r"'critic', 'rs'\), got 'fgsm'"):
        evaluate_under_attack(trained, ["random", "fgsm"], eps=[0.1])
    with pytest.raises(ValueError, match=r"eps must be a number >= 0"):
        ObservationAttack(trained, "mad", -1.0)
    with pytest.raises(ValueError, match=r"norm must be one of \('linf', 'l2'\), got 'l1'"):
        attack_observations(trained, _obs(2), "random", eps=0.1, norm="l1")
    with pytest.raises(ValueError, match=r"q_pi: the 'rs' attack needs a learned Q"):
        attack_observations(trained, _obs(2), "rs", eps=0.1)


def test_critic_attack_needs_a_critic():
    no_critic = agents.REINFORCE(env="CartPole-v1", seed=0, num_envs=1, n_steps=32,
                                 vf_coef=0.0, preset=None)
    with pytest.raises(ValueError, match=r"attacks: 'critic' needs an agent with a trained "
                                         r"critic; REINFORCE has no value function"):
        evaluate_under_attack(no_critic, ["random", "critic"], eps=[0.1])
    with pytest.raises(ValueError, match=r"attack: 'critic' needs"):
        ObservationAttack(no_critic, "critic", 0.1)


class DictObs(gym.Env):
    observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,), np.float32)})
    action_space = gym.spaces.Discrete(2)


@pytest.mark.parametrize("env", [lambda: gym.make("FrozenLake-v1"), DictObs],
                         ids=["discrete", "dict"])
def test_non_box_observations_are_refused(trained, env):
    with pytest.raises(ValueError, match=r"env must have a 1-D Box observation space"):
        ObservationAttackWrapper(env(), trained, "random", eps=0.1)


# -- the command line ---------------------------------------------------------------------------
def test_cli_attack_names_match_the_library():
    from agents.robustness.observation_attacks import ATTACK_NAMES
    from robustgrad.commands.evaluate_agent import ATTACKS

    assert ATTACKS == ATTACK_NAMES


def test_cli_evaluate_agent_under_attack(trained, tmp_path, capsys):
    from robustgrad.cli import main

    saved = trained.save(str(tmp_path / "agent"))
    out = tmp_path / "report"
    args = ["evaluate-agent", "--agent", saved, "--attacks", "random,action", "--eps", "0.2,0.05",
            "--episodes", "2", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "worst case over attacks" in text and "action" in text
    for name in ("report.json", "report.txt", "return_vs_eps.png", "trajectories.png"):
        assert (out / name).stat().st_size > 0, name
    assert main(args) == 2  # --out is not empty
    assert "pass --overwrite" in capsys.readouterr().err


@pytest.mark.parametrize("extra,message", [
    (["--attacks", "random,fgsm"], "--attacks must be one of ('random', 'action', 'mad', "
                                   "'critic', 'rs', 'optimal', 'paad'), got 'fgsm'"),
    (["--attacks", "mad", "--eps", "0.1,-0.1"], "--eps must be a number >= 0, got -0.1"),
    (["--attacks", "mad", "--norm", "l1"], "--norm must be one of ('linf', 'l2'), got 'l1'"),
    (["--attacks", "mad", "--episodes", "0"], "--episodes must be an int in [1, 100000], got 0"),
    (["--attacks", "mad", "--out", "FILE"], "exists and is not a directory"),
], ids=["name", "eps", "norm", "episodes", "out-file"])
def test_cli_refuses_bad_flags_before_loading(tmp_path, capsys, extra, message):
    from robustgrad.cli import main

    (tmp_path / "agent").mkdir()  # looks like a saved agent but holds no weights:
    for name in ("config.json", "agent.json"):  # validation must stop before loading it
        (tmp_path / "agent" / name).write_text("{}")
    (tmp_path / "FILE").write_text("x")
    extra = [str(tmp_path / "FILE") if e == "FILE" else e for e in extra]
    assert main(["evaluate-agent", "--agent", str(tmp_path / "agent")] + extra) == 2
    assert message in capsys.readouterr().err


def test_cli_critic_attack_needs_a_critic(tmp_path, capsys):
    from robustgrad.cli import main

    agent = agents.REINFORCE(env="CartPole-v1", seed=0, num_envs=1, n_steps=32, vf_coef=0.0,
                             preset=None)
    saved = agent.save(str(tmp_path / "agent"))
    assert main(["evaluate-agent", "--agent", saved, "--attacks", "critic",
                 "--out", str(tmp_path / "out")]) == 2
    assert "--agent: attacks: 'critic' needs an agent with a trained critic" \
        in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_per_dimension_std_units_in_the_evaluation(normalised):
    report = evaluate_under_attack(normalised, ["random", "action"], eps=[0.1], n_episodes=1,
                                   scale="std", progress=False)
    assert report.units == "per-dimension std"
    for name in ("random", "action"):
        row = report.row(name, 0.1)
        assert 0 < row["mean_perturbation"] <= row["max_perturbation"] <= 0.1 * (1 + 1e-5) + 1e-6
