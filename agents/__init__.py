"""RL agents on gymnasium and tensorflow-probability, observation attacks and robust training.

Builds on :mod:`robustgrad` and :mod:`attacks`.
"""

# --- BEGIN agents ---
from agents.a2c import A2C
from agents.base import Agent, NonFiniteTrainingError, load
from agents.callbacks import Callback, TensorBoardCallback
from agents.config import A2CConfig, DQNConfig, PPOConfig, REINFORCEConfig
from agents.dqn import DQN
from agents.envs import VecEnv, make_vec_env
from agents.ppo import PPO
from agents.reinforce import REINFORCE
# --- END agents ---
