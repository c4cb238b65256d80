"""ATLA's adversary radius curriculum (agents.robustness.atla.adversary_radius, ``atla_start_radius``)."""

import math

import numpy as np
import pytest

import agents
import agents.robustness.adversary
import agents.robustness.atla
from agents.robustness.atla import adversary_radius


def test_adversary_radius_shrinks_from_the_start_radius_to_eps():
    # schedule at 0, 40% and 100% of its target 0.05: 0.2 -> 0.2 - 0.4 * 0.15 -> 0.05
    assert adversary_radius(0.0, 0.05, 0.2) == pytest.approx(0.2)
    assert adversary_radius(0.02, 0.05, 0.2) == pytest.approx(0.14)
    assert adversary_radius(0.05, 0.05, 0.2) == pytest.approx(0.05)
    # a start radius equal to eps is no curriculum; without one the adversary follows the agent
    assert adversary_radius(0.01, 0.05, 0.05) == pytest.approx(0.05)
    assert adversary_radius(0.01, 0.05, None) == pytest.approx(0.01)
    assert adversary_radius(0.0, 0.0, 0.0) == 0.0


def _radii_seen(monkeypatch, **config):
    """The radii of every perturbation of the ATLA adversary's own rollouts, per agent
    iteration (recorded where the adversary env applies them), and the agent's logs."""
    seen, logs = [], []
    original = agents.robustness.adversary._squash_step

    def recording(obs, action, radius, scale):
        seen[-1].add(round(float(radius), 6))
        return original(obs, action, radius, scale)

    monkeypatch.setattr(agents.robustness.adversary, "_squash_step", recording)
    agent = agents.PPO(env="CartPole-v1", seed=0, num_envs=2, n_steps=8, robust="atla",
                       robust_eps=0.05, robust_eps_warmup=0.5, **config)
    orig_phase = agents.robustness.atla.ATLAPlugin.adversary_phase

    def phase(plugin):
        seen.append(set())
        return orig_phase(plugin)

    monkeypatch.setattr(agents.robustness.atla.ATLAPlugin, "adversary_phase", phase)
    agent.learn(64, progress_bar=False, callbacks=lambda a, lg: logs.append(dict(lg)))
    return agent, seen, logs


def test_atla_start_radius_trains_the_adversary_wider_than_the_agent(monkeypatch):
    # 4 iterations of 16 steps, warm-up over the first 32: the agent's eps 0, 0.025, 0.05, 0.05
    agent, seen, logs = _radii_seen(monkeypatch, atla_start_radius=0.2)
    assert [lg["robust_eps"] for lg in logs] == pytest.approx([0.0, 0.025, 0.05, 0.05])
    assert [lg["atla_adversary_radius"] for lg in logs] == pytest.approx([0.2, 0.125, 0.05, 0.05])
    assert seen == [{0.2}, {0.125}, {0.05}, {0.05}]
    # it learns from the first iteration on (at eps 0 the default adversary does not)
    assert int(agent.robustness.adversary.num_timesteps.numpy()) == 64


def test_atla_default_adversary_follows_the_agents_radius(monkeypatch):
    agent, seen, logs = _radii_seen(monkeypatch)
    assert [lg["atla_adversary_radius"] for lg in logs] == pytest.approx([0.0, 0.025, 0.05, 0.05])
    assert seen == [set(), {0.025}, {0.05}, {0.05}]
    assert int(agent.robustness.adversary.num_timesteps.numpy()) == 48


def test_atla_start_radius_is_validated():
    with pytest.raises(ValueError, match=r"atla_start_radius: only with robust='atla' or "
                                         r"'atla-sa' .*got robust='sa'"):
        agents.PPO(env="CartPole-v1", robust="sa", atla_start_radius=0.2)
    with pytest.raises(ValueError, match=r"atla_start_radius must be a number >= 0.05, got 0.01"):
        agents.PPO(env="CartPole-v1", robust="atla", robust_eps=0.05, atla_start_radius=0.01)
    with pytest.raises(ValueError, match="atla_start_radius must be a number >= 0.05, got nan"):
        agents.PPO(env="CartPole-v1", robust="atla", robust_eps=0.05,
                   atla_start_radius=math.nan)
    with pytest.raises(TypeError, match="atla_start_radius must be a number"):
        agents.PPO(env="CartPole-v1", robust="atla-sa", atla_start_radius="wide")
    cfg = agents.PPO(env="CartPole-v1", robust="atla", robust_eps=0.05,
                     atla_start_radius=np.float32(0.2)).config
    assert type(cfg.atla_start_radius) is float and cfg.atla_start_radius == pytest.approx(0.2)
