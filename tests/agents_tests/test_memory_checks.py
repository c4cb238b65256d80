"""A configuration that would allocate absurd memory says so before allocating (issue 24)."""

import gymnasium as gym
import numpy as np
import pytest

import agents
from robustgrad.memory import check_allocation, physical_memory


class _ImageEnv(gym.Env):
    """Atari-sized observations: (84, 84, 4), two actions."""

    observation_space = gym.spaces.Box(0.0, 1.0, (84, 84, 4), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros((84, 84, 4), np.float32), {}

    def step(self, action):
        return np.zeros((84, 84, 4), np.float32), 0.0, False, False, {}


def test_a_dqn_replay_buffer_larger_than_memory_is_refused_before_allocating():
    total = physical_memory()
    assert total is not None and total > 0
    per = 2 * 84 * 84 * 4 * 4 + 16
    too_many = int(total // per) + 1  # more than all of memory: refused on any machine
    with pytest.raises(ValueError, match=r"^buffer_size=\d+: a replay buffer of \(84, 84, 4\) "
                                         r"float32 observations would allocate [\d.]+ GiB, more "
                                         r"than half of this machine's memory \([\d.]+ GiB\); "
                                         r"buffer_size must be at most (\d+) here$") as info:
        agents.DQN(env=_ImageEnv, buffer_size=too_many, num_envs=1, hidden_sizes=(4,),
                   learning_starts=1, preset=None, seed=0)
    fits = int(info.value.args[0].rsplit("at most ", 1)[1].split()[0])
    assert fits * per <= total / 2 < (fits + 1) * per


def test_check_allocation_bounds():
    check_allocation(512, 2**20, argument="n", what="x", total=2**30)  # exactly half: fine
    with pytest.raises(ValueError, match=r"^n=513: x would allocate 0.5 GiB, more than half of "
                                         r"this machine's memory \(1.0 GiB\); n must be at most "
                                         "512 here$"):
        check_allocation(513, 2**20, argument="n", what="x", total=2**30)
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\], got 0"):
        check_allocation(1, 1, argument="n", what="x", fraction=0)
