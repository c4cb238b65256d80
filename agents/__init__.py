"""RL agents on gymnasium and tensorflow-probability, observation attacks and robust training.

Builds on :mod:`robustgrad` and :mod:`attacks`.
"""

# public re-exports (ruff: F401 is expected here)
from agents.algorithms.a2c import A2C  # noqa: F401
from agents.algorithms.dqn import DQN  # noqa: F401
from agents.algorithms.many import probability_of_improvement, summarize_runs, train_many  # noqa: F401
from agents.algorithms.ppo import PPO  # noqa: F401
from agents.algorithms.registry import ALGORITHM_NAMES, ALGORITHMS, algorithm  # noqa: F401
from agents.algorithms.reinforce import REINFORCE  # noqa: F401
from agents.config import (  # noqa: F401
    ATLA,
    SA,
    A2CConfig,
    Adversarial,
    DQNConfig,
    PPOConfig,
    REINFORCEConfig,
    RobustMethod,
    WocaR,
)
from agents.core._loading import load  # noqa: F401
from agents.core.base import Agent, NonFiniteTrainingError  # noqa: F401
from agents.core.callbacks import Callback, EvalCallback, TensorBoardCallback  # noqa: F401
from agents.core.collectors import Collector, GraphCollector, GymnasiumCollector  # noqa: F401
from agents.core.policy import PolicySurface  # noqa: F401
from agents.envs import VecEnv, make_vec_env  # noqa: F401
from agents.graph_envs import GRAPH_ENV_IDS, GraphVecEnv, graph_env  # noqa: F401
from agents.robustness import atla, robust, wocar  # noqa: F401 - the robust training plug-ins (agents.core.plugin)
from agents.robustness.adversary import LearnedAdversary, load_adversary, train_adversary  # noqa: F401
from agents.robustness.attack_evaluation import ObservationAttackWrapper, evaluate_under_attack  # noqa: F401
from agents.robustness.attack_report import AgentAttackReport  # noqa: F401
from agents.robustness.observation_attacks import ObservationAttack, attack_observations  # noqa: F401
from agents.robustness.robust_sarsa import fit_q_pi  # noqa: F401
from agents.training import SeedsResult, TrainedAgent, train_agent, train_seeds  # noqa: F401

__all__ = [
    "A2C", "A2CConfig", "ALGORITHMS", "ALGORITHM_NAMES", "ATLA", "Adversarial", "Agent",
    "AgentAttackReport", "Callback", "Collector", "DQN", "DQNConfig", "EvalCallback", "GRAPH_ENV_IDS",
    "GraphCollector", "GraphVecEnv", "GymnasiumCollector", "LearnedAdversary", "NonFiniteTrainingError",
    "ObservationAttack", "ObservationAttackWrapper", "PPO", "PPOConfig", "PolicySurface", "REINFORCE",
    "REINFORCEConfig", "RobustMethod", "SA", "SeedsResult", "TensorBoardCallback", "TrainedAgent", "VecEnv",
    "WocaR", "algorithm", "atla", "attack_observations", "evaluate_under_attack", "fit_q_pi", "graph_env",
    "load", "load_adversary", "make_vec_env", "probability_of_improvement", "robust", "summarize_runs",
    "train_adversary", "train_agent", "train_many", "train_seeds", "wocar"
]
