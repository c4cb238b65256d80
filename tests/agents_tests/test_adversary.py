"""Learned adversaries (agents.robustness.adversary, agents.robustness.paad) and ATLA training
(agents.robustness.atla)."""

import gymnasium as gym
import numpy as np
import pytest

import agents
from agents.robustness.adversary import (
    LEARNED_ATTACKS,
    AdversaryEnv,
    AdversaryVectorEnv,
    LearnedAdversary,
    _factory,
    _Radius,
    load_adversary,
    train_adversary,
    victim_surface,
)
from agents.robustness.paad import director_perturbation


@pytest.fixture(scope="module")
def victim():
    """A CartPole PPO (preset) that balances: 500 on its evaluation episodes."""
    agent = agents.PPO(env="CartPole-v1", seed=0)
    agent.learn(30_000, progress_bar=False)
    assert agent.evaluate(4)["mean_return"] >= 475
    return agent


@pytest.fixture(scope="module")
def untrained():
    return agents.PPO(env="CartPole-v1", seed=1, num_envs=1, n_steps=32)


class _Recorder:
    """A victim surface that records what it saw and always pushes left."""

    def __init__(self, d=4):
        self.units = np.full(d, 2.0, np.float32)
        self.obs_shape = (d,)
        self.seen = []

    def act(self, obs):
        self.seen.append(np.array(obs))
        return np.zeros(len(obs), np.int64)


def test_adversary_env_is_the_adversary_mdp():
    """reward = minus the victim's, same termination, the victim acts on s + r tanh(a) scale."""
    rec = _Recorder()
    env = AdversaryEnv(gym.make("CartPole-v1"), rec, _Radius(0.1))
    plain = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    obs_p, _ = plain.reset(seed=3)
    np.testing.assert_array_equal(obs, obs_p)
    a = np.array([10.0, -10.0, 0.0, 0.5], np.float32)
    total, total_p, done = 0.0, 0.0, False
    while not done:
        before = env.unwrapped.state.astype(np.float32).copy()
        obs, r, term, trunc, info = env.step(a)
        obs_p, r_p, term_p, trunc_p, _ = plain.step(0)
        expected = before + 0.1 * np.tanh(a) * 2.0
        np.testing.assert_allclose(rec.seen[-1][0], expected, rtol=1e-6, atol=1e-6)
        assert r == -r_p == -info["victim_reward"]
        assert (term, trunc) == (term_p, trunc_p)
        total, total_p, done = total + r, total_p + r_p, term or trunc
    assert total == -total_p < 0
    assert env.action_space.shape == (4,)


class _BatchRecorder(_Recorder):
    """A victim that records the batch sizes it is called with and pushes left or right by
    the sign of the pole's angle (so that episodes differ between copies)."""

    def act(self, obs):
        self.seen.append(np.array(obs))
        return (np.asarray(obs)[:, 2] > 0).astype(np.int64)


def test_adversary_vector_env_steps_the_mdp_of_its_copies_with_one_victim_call():
    """AdversaryVectorEnv == a SyncVectorEnv of AdversaryEnv copies (observations, rewards,
    ends, final observations, victim rewards), with one victim call of N rows per step."""
    n, steps = 3, 60
    one, vec = _BatchRecorder(), _BatchRecorder()
    ref = gym.vector.SyncVectorEnv(
        [lambda: AdversaryEnv(gym.make("CartPole-v1"), one, _Radius(0.2))] * n,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env = AdversaryVectorEnv("CartPole-v1", n, vec, _Radius(0.2))
    np.testing.assert_array_equal(env.reset(seed=7)[0], ref.reset(seed=7)[0])
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(steps):
        a = rng.normal(size=(n, 4)).astype(np.float32)
        got, want = env.step(a), ref.step(a)
        for x, y in zip(got[:4], want[:4]):
            np.testing.assert_array_equal(x, y)
        # every copy's victim reward (the reference's info loses it where a copy autoresets)
        np.testing.assert_array_equal(got[4]["victim_reward"], -got[1])
        kept = want[4]["_victim_reward"]
        np.testing.assert_array_equal(got[4]["victim_reward"][kept], want[4]["victim_reward"][kept])
        done = got[2] | got[3]
        ends += int(done.sum())
        for i in np.nonzero(done)[0]:
            np.testing.assert_array_equal(got[4]["final_obs"][i], want[4]["final_obs"][i])
    assert ends > 0  # autoresets were compared too
    assert [len(x) for x in vec.seen] == [n] * steps and len(one.seen) == n * steps
    assert env.single_action_space.shape == (4,) and env.action_space.shape == (n, 4)
    env.close()
    ref.close()


def test_adversary_ppo_on_the_vector_env_trains_as_on_its_copies(untrained):
    """The adversary PPO built on the factory (one victim call per vector step) ends with the
    weights it ends with on a SyncVectorEnv of AdversaryEnv copies (a discrete victim: its
    actions do not depend on the batch), and calls the victim num_envs times less often."""
    surface = victim_surface(untrained)
    calls = {"n": 0}
    act = surface.act

    def counted(obs):
        calls["n"] += 1
        return act(obs)
    surface.act = counted
    ppo = {"num_envs": 4, "n_steps": 16, "n_epochs": 2}
    vector = _factory(surface, _Radius(0.1), None, None)
    assert hasattr(vector, "make_vector_env")
    copies = lambda: vector()  # noqa: E731 - a plain factory: SyncVectorEnv of AdversaryEnv
    weights, counts = [], []
    for env in (vector, copies):
        calls["n"] = 0
        adv = agents.PPO(env=env, seed=3, preset=None, **{**agents.robustness.adversary.DEFAULT_PPO, **ppo})
        adv.learn(128, progress_bar=False)
        weights.append(adv.get_weights())
        counts.append(calls["n"])
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)
    assert counts == [128 // 4, 128]


def test_learned_adversary_lowers_a_victims_return(victim):
    """One real, short learning run (default suite): at eps 0.2 a 12k-step adversary (radius
    curriculum from 0.8) takes a balancing victim far below its clean 500, and further than
    uniform noise of the same radius does."""
    adv = train_adversary(victim, eps=0.2, steps=12_288, eval_every=4096, eval_episodes=4,
                          progress=False)
    report = agents.evaluate_under_attack(victim, ["random", "optimal"], eps=[0.2], n_episodes=4,
                                          seed=5, adversaries=[adv], progress=False)
    row = report.row("optimal", 0.2)
    assert report.clean["mean"] >= 475
    assert row["mean"] < 250 < report.row("random", 0.2)["mean"]
    assert row["max_perturbation"] <= 0.2 + 1e-5
    assert row["cost"]["adversary_steps"] >= 12_288 and row["cost"]["cpu_seconds"] > 0
    assert report.worst_case[0]["attack"] == "optimal"
    assert "learned adversary trained for" in str(report)


def test_adversary_save_load_round_trip_and_env_check(untrained, tmp_path):
    adv = train_adversary(untrained, eps=0.1, steps=64, eval_every=64, eval_episodes=1,
                          ppo={"num_envs": 2, "n_steps": 32}, progress=False)
    adv.save(str(tmp_path / "adv"))
    again = load_adversary(str(tmp_path / "adv"), untrained)
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_array_equal(adv.perturb(obs), again.perturb(obs))
    assert again.eps == 0.1 and again.kind == "optimal"
    other = agents.PPO(env="Acrobot-v1", seed=0, num_envs=1, n_steps=32)
    with pytest.raises(ValueError, match=r"trained against a victim on CartPole-v1 \(obs shape "
                                         r"\(4,\)\), not on Acrobot-v1 \(obs shape \(6,\)\)"):
        load_adversary(str(tmp_path / "adv"), other)
    with pytest.raises(ValueError, match="holds no learned adversary"):
        load_adversary(str(tmp_path), untrained)
    with pytest.raises(ValueError, match="trained at eps=0.1, got 0.2"):
        adv.step(obs, eps=0.2)


def test_bad_requests_fail_before_any_work(untrained):
    with pytest.raises(ValueError, match="adversary_steps"):
        train_adversary(untrained, eps=0.1, steps=0)
    with pytest.raises(ValueError, match="a finite radius > 0"):
        train_adversary(untrained, eps=0.0, steps=10)
    with pytest.raises(TypeError, match="must be an agents.Agent with a policy surface"):
        train_adversary("runs/ppo", eps=0.1, steps=10)
    with pytest.raises(TypeError, match="victim: PPO has no policy_surface\\(\\) method"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(type(untrained), "policy_surface", None)
            train_adversary(untrained, eps=0.1, steps=10)
    with pytest.raises(ValueError, match="start_radius must be >= eps"):
        train_adversary(untrained, eps=0.1, steps=10, start_radius=0.05)
    norm = agents.PPO(env="CartPole-v1", seed=0, num_envs=1, n_steps=32, normalize_obs=True)
    with pytest.raises(ValueError, match="beyond what the victim sees .* clips at 10 std"):
        train_adversary(norm, eps=12.0, steps=10)
    with pytest.raises(ValueError, match="L-inf ball only"):
        agents.evaluate_under_attack(untrained, ["optimal"], eps=[0.1], norm="l2")
    with pytest.raises(ValueError, match="adversary_steps"):
        agents.evaluate_under_attack(untrained, ["optimal"], eps=[0.1], adversary_steps=-1)
    with pytest.raises(ValueError, match="eps 0 leaves it no action"):
        agents.evaluate_under_attack(untrained, ["random", "paad"], eps=[0.0, 0.1])


def test_paad_actor_moves_the_policy_toward_the_direction(victim):
    """PA-AD's actor: within the ball, and <pi(s_hat), h> rises above <pi(s), h>."""
    surface = victim_surface(victim)
    perturb, k = director_perturbation(victim, surface)
    assert k == 2
    obs = np.random.default_rng(0).normal(0, 0.05, size=(16, 4)).astype(np.float32)
    direction = np.tile(np.array([[3.0, -3.0]], np.float32), (16, 1))
    seen = perturb(obs, direction, 0.1)
    assert np.abs(seen - obs).max() <= 0.1 + 1e-6
    p_clean = victim.distribution(obs).probs_parameter().numpy()
    p_seen = victim.distribution(seen).probs_parameter().numpy()
    assert np.all(p_seen[:, 0] >= p_clean[:, 0] - 1e-6)
    assert p_seen[:, 0].mean() > p_clean[:, 0].mean() + 0.05


def test_paad_adversary_trains_and_evaluates(untrained):
    adv = train_adversary(untrained, eps=0.1, steps=64, kind="paad", eval_every=64,
                          eval_episodes=1, ppo={"num_envs": 2, "n_steps": 32}, progress=False)
    assert isinstance(adv, LearnedAdversary) and adv.agent.env.single_action_space.shape == (2,)
    seen, norms, a_adv, a_clean = adv.step(np.zeros([3, 4], np.float32))
    assert seen.shape == (3, 4) and norms.max() <= 0.1 + 1e-6 and a_adv.shape == (3,)


def test_cli_names_agree():
    from robustgrad.commands.evaluate_agent import LEARNED

    assert LEARNED == LEARNED_ATTACKS


def test_atla_trains_against_its_adversary():
    agent = agents.PPO(env="CartPole-v1", seed=0, num_envs=2, n_steps=16, robust="atla",
                       robust_eps=0.1, robust_eps_warmup=0.0)
    agent.learn(64, progress_bar=False)
    assert int(agent.robustness.adversary.num_timesteps.numpy()) == 64
    # the rollout saw attacked observations: stored obs differ from a clean replay by <= eps
    seen = agent.robustness.perceive(np.zeros([2, 4], np.float32), np.array([1, 2], np.int32)).numpy()
    assert 0 < np.abs(seen).max() <= 0.1 + 1e-6
    with pytest.raises(ValueError, match="ATLA trains an actor-critic"):
        agents.DQN(env="CartPole-v1", robust="atla")


@pytest.mark.slow
def test_atla_agent_resists_a_learned_adversary():
    """ATLA-PPO (100k steps at eps 0.05) keeps more return under a fresh 200k-step learned
    adversary than a vanilla PPO of the same budget (measured: 187.9 against 49.0,
    docs/benchmarks/robust-rl.md)."""
    means = {}
    for robust in (None, "atla"):
        agent = agents.PPO(env="CartPole-v1", seed=0, robust=robust, robust_eps=0.05)
        agent.learn(100_000, progress_bar=False)
        adv = train_adversary(agent, eps=0.05, steps=200_000, progress=False)
        means[robust] = adv.victim_return(8, seed=77)
    assert means["atla"] > means[None] + 50


def test_cli_flags_of_learned_adversaries(tmp_path, capsys):
    import json

    from robustgrad import cli

    d = tmp_path / "agent"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"env": "CartPole-v1"}))
    (d / "agent.json").write_text(json.dumps({"algo": "ppo", "num_timesteps": 0}))
    assert cli.main(["evaluate-agent", "--agent", str(d), "--attacks", "optimal",
                     "--adversary-steps", "0", "--out", str(tmp_path / "o")]) == 2
    assert "--adversary-steps" in capsys.readouterr().err
    train = ["train-agent", "--env", "CartPole-v1", "--steps", "64", "--no-progress",
             "--eval-episodes", "0", "--out", str(tmp_path / "run")]
    assert cli.main([*train, "--algo", "dqn", "--robust", "atla"]) == 2
    assert "ATLA trains an actor-critic" in capsys.readouterr().err
    assert cli.main([*train, "--algo", "ppo", "--robust", "atla", "--robust-kappa", "1"]) == 2
    assert "--robust-kappa: only with --robust sa" in capsys.readouterr().err
