"""Certified actions (agents.robustness.certify) and the SA convex-relaxation regulariser
(agents.robustness.robust)."""

import re

import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.robustness import robust
from agents.robustness.certify import (
    certified_actions,
    certified_fraction,
    greedy_margin_lower_bounds,
    output_bounds,
)
from agents.robustness.observation_attacks import action_attack, mad_attack

OBS = np.random.default_rng(0).normal(0.0, 0.3, size=(32, 4)).astype(np.float32)


@pytest.fixture(scope="module")
def dqn():
    agent = agents.DQN(env="CartPole-v1", seed=0, preset=None, hidden_sizes=(32, 32),
                       normalize_obs=True)
    rms = agent.policy_surface()._rms
    rms.var.assign(np.array([0.5, 2.0, 0.1, 3.0]) - rms.epsilon)
    rms.mean.assign(np.array([0.0, 0.1, -0.1, 0.2]))
    return agent


@pytest.fixture(scope="module")
def ppo():
    """A discrete tanh policy with a sharpened head (margins well above float32 noise)."""
    agent = agents.PPO(env="CartPole-v1", seed=0, preset=None, num_envs=1, n_steps=32)
    head = agent.policy_surface().layers[-1][0]
    head.assign(head * 100.0)
    return agent


@pytest.fixture(scope="module")
def pendulum():
    agent = agents.PPO(env="Pendulum-v1", seed=0, preset=None, num_envs=1, n_steps=32,
                       log_std_init=-1.0)
    head = agent.policy_surface().layers[-1][0]
    head.assign(head * 100.0)
    return agent


def _ball_samples(surface, obs, eps, n=300, seed=1):
    """``n`` uniform points of the L-inf ball (agent units) around each row, corners included."""
    rng = np.random.default_rng(seed)
    scale = surface.obs_scale().numpy()
    u = rng.uniform(-1, 1, size=(n,) + obs.shape)
    u[: n // 3] = np.sign(u[: n // 3])  # corners, where the extremes of near-linear nets lie
    return (obs[None] + eps * u * scale).astype(np.float32)


def _margins(out, greedy):
    """``max_{j != a*} out_j - out_{a*}`` per row of ``out [..., B, A]``."""
    a = np.arange(out.shape[-1])
    star = np.take_along_axis(out, greedy[..., None], -1)[..., 0]
    other = np.where(a == greedy[..., None], -np.inf, out).max(-1)
    return other - star


# -- certified actions ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["dqn", "ppo"])
@pytest.mark.parametrize("method", ["ibp", "crown-ibp", "crown"])
def test_certified_actions_are_sound_by_sampling_and_attack(name, method, request):
    agent = request.getfixturevalue(name)
    surface = agent.policy_surface()
    eps = 0.001 if method == "ibp" else 0.05  # IBP is loose on a 64x64 tanh net
    cert = certified_actions(agent, OBS, eps, method).numpy()
    greedy = surface.deterministic_actions(OBS).numpy()
    samples = _ball_samples(surface, OBS, eps)
    acts = surface.deterministic_actions(samples.reshape(-1, 4)).numpy().reshape(samples.shape[:2])
    attacked = surface.deterministic_actions(
        action_attack(agent, OBS, eps=eps, steps=20, seed=0)).numpy()
    assert 0 < cert.sum()  # not vacuous
    assert np.all(acts[:, cert] == greedy[cert]) and np.all(attacked[cert] == greedy[cert])
    # the bounds themselves hold at every sample (margin of the greedy action >= its lower bound)
    _, lb = greedy_margin_lower_bounds(surface, OBS, eps, method)
    out = surface.outputs(samples.reshape(-1, 4)).numpy().reshape(samples.shape[:2] + (2,))
    assert np.all(-_margins(out, np.broadcast_to(greedy, acts.shape)) >= lb.numpy()[:, 0] - 1e-5)


def test_certified_fraction_shrinks_with_eps_and_is_all_at_zero(dqn):
    fractions = [certified_fraction(dqn, OBS, e, "ibp") for e in (0.0, 0.01, 0.05, 0.2, 1.0)]
    assert fractions[0] == 1.0  # a unique greedy action cannot change at eps 0
    assert all(a >= b for a, b in zip(fractions, fractions[1:])) and fractions[-1] < 1.0
    crown = certified_actions(dqn, OBS, 0.05, "crown").numpy()
    ibp = certified_actions(dqn, OBS, 0.05, "ibp").numpy()
    assert np.all(crown[ibp])  # CROWN certifies at least what IBP does here


@pytest.mark.parametrize("kwargs, error, message", [
    ({"method": "alpha-crown"}, ValueError, "method must be one of"),
    ({"eps": -0.1}, ValueError, "eps must be a number >= 0"),
])
def test_certify_bad_arguments(dqn, kwargs, error, message):
    args = {"eps": 0.1, "method": "crown", **kwargs}
    with pytest.raises(error, match=message):
        certified_actions(dqn, OBS, **args)


def test_certify_refuses_continuous_policies_and_bad_observations(pendulum, dqn):
    with pytest.raises(ValueError, match="^" + re.escape(
            "agent: certified actions need a discrete policy or a DQN, got a 'gaussian_mean' "
            "policy (continuous actions)") + "$"):
        certified_actions(pendulum, np.zeros([2, 3], np.float32), 0.1)
    with pytest.raises(ValueError, match=r"^obs must be finite observations of shape \[B, 4\], "
                                         r"got shape \(2, 3\)$"):
        certified_actions(dqn, np.zeros([2, 3], np.float32), 0.1)


# -- the convex regulariser ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_convex_hinge_upper_bounds_the_pgd_inner_maximum(name, request):
    agent = request.getfixturevalue(name)
    surface = agent.policy_surface()
    eps = 0.05
    greedy = surface.deterministic_actions(OBS).numpy()
    _, lb = greedy_margin_lower_bounds(surface, OBS, eps, robust.CONVEX_BOUND)
    bound = np.maximum(-lb.numpy().min(-1), -robust.HINGE_MARGIN)  # per row
    obs_adv, _ = robust.sa_dqn_observations(agent, OBS, tf.constant(eps), 10, tf.constant([1, 2]))
    pgd = robust.q_margin_hinge(surface.outputs(obs_adv), greedy).numpy()
    assert np.all(bound >= pgd - 1e-5)
    samples = _ball_samples(surface, OBS, eps)
    out = surface.outputs(samples.reshape(-1, 4)).numpy().reshape(samples.shape[:2] + (-1,))
    sampled = np.maximum(_margins(out, np.broadcast_to(greedy, out.shape[:2])),
                         -robust.HINGE_MARGIN).max(0)
    assert np.all(bound >= sampled - 1e-5)
    reg = float(robust.convex_margin_hinge(agent, OBS, eps))
    assert reg == pytest.approx(bound.mean(), rel=1e-5, abs=1e-6)
    assert reg >= float(robust.attacked_q_margin(agent, obs_adv, tf.constant(greedy))) - 1e-5


def test_convex_categorical_kl_upper_bounds_the_mad_kl(ppo):
    surface = ppo.policy_surface()
    eps = 0.05
    adv = mad_attack(ppo, OBS, eps=eps, seed=0)
    kl_pgd = robust.policy_kl(surface, OBS, adv).numpy()
    assert kl_pgd.mean() > 1e-5  # the sharpened head moves: not a vacuous comparison
    samples = _ball_samples(surface, OBS, eps)
    logp = tf.nn.log_softmax(surface.outputs(OBS)).numpy()
    logq = tf.nn.log_softmax(surface.outputs(samples.reshape(-1, 4))).numpy().reshape(
        samples.shape[:2] + (2,))
    kl_samples = (np.exp(logp) * (logp - logq)).sum(-1)  # [n, B]
    reg = float(robust.convex_categorical_kl(ppo, OBS, eps))
    assert reg >= kl_pgd.mean() - 1e-6 and reg >= kl_samples.max(0).mean() - 1e-6
    # per row, from the difference bounds; exact (zero) at eps 0
    from agents.robustness.certify import difference_upper_bounds
    ub = difference_upper_bounds(surface, OBS, eps, robust.CONVEX_BOUND).numpy()
    row = (np.exp(logp) * (logp + np.log(np.exp(ub).sum(-1)))).sum(-1)
    assert reg == pytest.approx(row.mean(), rel=1e-4)
    assert np.all(row >= kl_samples.max(0) - 1e-6) and np.all(row >= kl_pgd - 1e-6)
    assert float(robust.convex_categorical_kl(ppo, OBS, 0.0)) == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("method", ["ibp", "crown-ibp", "crown"])
def test_difference_bounds_from_the_lower_pass_equal_the_upper_side_of_both(ppo, method):
    # ub(z_j - z_a) as -lb(z_a - z_j) from one lower-only pass of the off-diagonal rows: the
    # upper side of the full pass over every row (e_j - e_a), diagonal 0; gradients too
    from agents.robustness.certify import _bounds, difference_upper_bounds
    surface = ppo.policy_surface()
    n, rows = 2, len(OBS)
    eye = tf.eye(n)
    spec = tf.tile(tf.reshape(eye[None, :, :] - eye[:, None, :], [1, n * n, n]), [rows, 1, 1])
    with tf.GradientTape(persistent=True) as tape:
        _, full = _bounds(surface, OBS, 0.3, method, spec)
        full = tf.reshape(full, [rows, n, n]) * (1.0 - eye)
        got = difference_upper_bounds(surface, OBS, 0.3, method)
        loss_full, loss_got = tf.reduce_sum(tf.sin(full)), tf.reduce_sum(tf.sin(got))
    np.testing.assert_allclose(got.numpy(), full.numpy(), rtol=1e-5, atol=1e-5)
    assert np.all(np.diag(got.numpy()[0]) == 0) and np.abs(got.numpy()).max() > 0.1
    for a, b in zip(tape.gradient(loss_got, ppo.variables, unconnected_gradients="zero"),
                    tape.gradient(loss_full, ppo.variables, unconnected_gradients="zero")):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_convex_gaussian_kl_upper_bounds_the_mad_kl(pendulum):
    surface = pendulum.policy_surface()
    obs = np.random.default_rng(2).normal(0, 0.5, size=(16, 3)).astype(np.float32)
    eps = 0.05
    lb, ub = (t.numpy() for t in output_bounds(surface, obs, eps, robust.CONVEX_BOUND))
    samples = _ball_samples(surface, obs, eps)
    means = surface.outputs(samples.reshape(-1, 3)).numpy().reshape(samples.shape[:2] + (-1,))
    assert np.all(means >= lb - 1e-5) and np.all(means <= ub + 1e-5)
    adv = mad_attack(pendulum, obs, eps=eps, seed=0)
    kl_pgd = robust.policy_kl(surface, obs, adv).numpy()
    assert kl_pgd.mean() > 1e-4  # the sharpened head moves: not a vacuous comparison
    reg = float(robust.convex_gaussian_kl(pendulum, obs, eps))
    assert reg >= kl_pgd.mean() - 1e-6
    # the per-row form: sum_k max(ub - mu, mu - lb)^2 / (2 sigma^2) >= the KL at every sample
    mu = surface.outputs(obs).numpy()
    w = 0.5 * np.exp(-2.0 * surface.log_std.numpy())
    row = (w * np.maximum(ub - mu, mu - lb) ** 2).sum(-1)
    assert reg == pytest.approx(row.mean(), rel=1e-5)
    kl_samples = (w * (means - mu) ** 2).sum(-1)
    assert np.all(row >= kl_samples.max(0) - 1e-6) and np.all(row >= kl_pgd - 1e-6)


def test_convex_gradients_reach_the_policy_not_the_targets(dqn, pendulum):
    obs = tf.constant(OBS)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(obs)
        hinge = robust.convex_margin_hinge(dqn, obs, 0.05)
    grads = tape.gradient(hinge, dqn.q.trainable)
    assert all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads)
    assert max(float(tf.reduce_max(tf.abs(g))) for g in grads) > 0
    assert all(g is None for g in tape.gradient(hinge, dqn.q_target.trainable))  # target net
    assert tape.gradient(hinge, obs) is None  # the ball's centre and box are stopped
    x = tf.constant(np.random.default_rng(3).normal(size=(8, 3)).astype(np.float32))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        kl = robust.convex_gaussian_kl(pendulum, x, 0.05)
    variables = pendulum.model.policy_net.trainable_variables + (pendulum.model.log_std,)
    grads = tape.gradient(kl, list(variables))
    assert all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads)
    assert tape.gradient(kl, x) is None  # the clean mean mu(s) is a stopped target
    assert all(g is None for g in tape.gradient(kl, pendulum.model.value_net.trainable_variables))


def test_dqn_convex_update_is_one_trace():
    agent = agents.DQN(env="CartPole-v1", seed=0, preset=None, learning_starts=64, batch_size=32,
                       train_freq=32, gradient_steps=4, hidden_sizes=(32, 32), robust="sa",
                       robust_method="convex", robust_eps=0.05, robust_eps_warmup=0.0)
    hinges = []
    agent.learn(256, progress_bar=False,
                callbacks=lambda a, logs: hinges.append(logs.get("sa_hinge", np.nan)))
    assert agent.trace_counts["train"] == 1 and int(agent.grad_steps.numpy()) > 4
    assert np.isfinite(hinges[-1]) and hinges[-1] > -robust.HINGE_MARGIN


def test_sa_ppo_convex_learns_cartpole():
    agent = agents.PPO(env="CartPole-v1", seed=0, preset=None, robust="sa", robust_eps=0.05,
                       robust_kappa=0.1, robust_method="convex")
    regs = []
    agent.learn(20_480, progress_bar=False, callbacks=lambda a, logs: regs.append(logs["sa_kl"]))
    assert agent.trace_counts["train"] == 1
    assert np.all(np.isfinite(regs)) and regs[-1] > -robust.HINGE_MARGIN
    assert agent.evaluate(10)["mean_return"] >= 150.0


# -- evaluate-agent --certify ---------------------------------------------------------------
def test_cli_names_match_the_library():
    from agents.robustness.certify import CERTIFY_METHODS
    from robustgrad.commands.evaluate_agent import CERTIFY

    assert CERTIFY == CERTIFY_METHODS


def test_evaluate_agent_certify_beside_the_attacks(dqn, tmp_path, capsys):
    from robustgrad.cli import main

    saved = dqn.save(str(tmp_path / "agent"))
    out = tmp_path / "report"
    args = ["evaluate-agent", "--agent", saved, "--attacks", "action", "--eps", "0.001,0.05",
            "--episodes", "2", "--certify", "crown", "--out", str(out), "--no-progress",
            "--num-envs", "2"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "certified actions (crown, " in text and "unchanged under attack" in text
    import json

    report = json.loads((out / "report.json").read_text())
    rows = {r["eps"]: r for r in report["certified"]}
    assert set(rows) == {0.001, 0.05}
    assert rows[0.001]["certified_fraction"] >= rows[0.05]["certified_fraction"]
    # the same states through the library: the clean run of the same seed
    from agents.robustness.certify import certify_agent

    again = certify_agent(agents.load(saved), [0.001, 0.05], "crown", n_episodes=2,
                          seed=dqn.config.seed + 10_000, num_envs=2)
    assert [r["certified_fraction"] for r in again] == [rows[0.001]["certified_fraction"],
                                                       rows[0.05]["certified_fraction"]]
    assert again[0]["n_states"] == rows[0.001]["n_states"] > 0
    assert main(["evaluate-agent", "--agent", saved, "--certify", "ibp", "--eps", "0.01",
                 "--episodes", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["certified"][0]["method"] == "ibp"


@pytest.mark.parametrize("extra, message", [
    (["--certify", "alpha"], "--certify must be one of ('crown', 'crown-ibp', 'ibp'), got 'alpha'"),
    (["--certify", "crown", "--norm", "l2"], "--certify certifies linf balls, not --norm l2"),
    (["--certify", "crown", "--stochastic"], "--stochastic: certified actions are the "
                                             "deterministic policy's"),
    (["--certify", "crown", "--scale", "raw"], "--scale: --certify bounds the ball in the "
                                               "agent's own units"),
], ids=["method", "norm", "stochastic", "scale"])
def test_cli_certify_flags_refused_before_loading(tmp_path, capsys, extra, message):
    from robustgrad.cli import main

    (tmp_path / "agent").mkdir()  # no weights: validation must stop before loading
    for name in ("config.json", "agent.json"):
        (tmp_path / "agent" / name).write_text("{}")
    assert main(["evaluate-agent", "--agent", str(tmp_path / "agent")] + extra) == 2
    assert message in capsys.readouterr().err


def test_cli_certify_refuses_a_continuous_agent(pendulum, tmp_path, capsys):
    from robustgrad.cli import main

    saved = pendulum.save(str(tmp_path / "agent"))
    assert main(["evaluate-agent", "--agent", saved, "--certify", "crown"]) == 2
    assert "--agent: agent: certified actions need a discrete policy or a DQN" \
        in capsys.readouterr().err
