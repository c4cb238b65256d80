"""gymnasium's classic-control tasks written in TensorFlow ops: environments compiled into the graph.

CartPole-v1, Acrobot-v1, MountainCar-v0, Pendulum-v1 and MountainCarContinuous-v0 over a batch of
``N`` environments, with gymnasium 1.x's dynamics, rewards, termination, time limits and reset
distributions, and the same-step autoreset contract of :class:`agents.envs.VecEnv`. Randomness is
stateless (a key carried in the state), so a rollout is a pure function of the state and the
actions and compiles, with XLA too, inside the same ``tf.function`` as a policy and its update.
gymnax (Lange 2022) and PureJaxRL (Lu et al. 2022) do this for JAX.

* :mod:`~agents.graph_envs.core`: ``graph_env(id)`` -> :class:`GraphEnvSpec` with pure
  ``reset(seed, num_envs)`` and ``step(state, actions)``; :data:`GRAPH_ENV_IDS`.
* :mod:`~agents.graph_envs.classic_control`: the five tasks' batched equations.
* :mod:`~agents.graph_envs.vector`: :class:`GraphVecEnv`, a stateful ``VecEnv`` look-alike.

>>> spec = graph_env("Pendulum-v1")
>>> state = spec.reset(seed=1, num_envs=2)
>>> step = tf.function(spec.step, jit_compile=True)
>>> state, obs, reward, terminated, truncated, final_obs = step(state, tf.zeros([2, 1]))
>>> obs.shape.as_list(), terminated.numpy().tolist(), bool((reward <= 0).numpy().all())
([2, 3], [False, False], True)
"""

import tensorflow as tf  # noqa: F401 - used by the doctest above

from agents.graph_envs.core import GRAPH_ENV_IDS, GraphEnvSpec, GraphEnvState, graph_env  # noqa: F401
from agents.graph_envs.vector import GraphVecEnv, make_graph_vec_env  # noqa: F401

__all__ = ["GRAPH_ENV_IDS", "GraphEnvSpec", "GraphEnvState", "GraphVecEnv", "graph_env",
           "make_graph_vec_env"]
