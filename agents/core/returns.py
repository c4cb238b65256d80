"""Return and advantage targets of the on-policy algorithms: GAE and Monte-Carlo returns (DQN's
one-step TD target is beside DQN, :func:`agents.algorithms.dqn.td_target`).

Every function returns tensors wrapped in ``tf.stop_gradient``: targets are computed once
and are constants for the update, so no gradient flows into them (nor into a target network).

Time limits: an episode that ends because it was *truncated* did not end in the MDP;
its last transition bootstraps from the value of the final observation. A
*terminated* episode has value 0 after its last transition. Both cut the recursion
across the episode boundary. The convention used throughout:

* ``next_values[t]``: the value the transition at ``t`` bootstraps from, i.e.
  ``V(s_{t+1})`` normally, ``V(final_obs_t)`` if truncated, ``0`` if terminated.
* ``episode_ends[t]``: ``terminated[t] or truncated[t]``.
"""

from __future__ import annotations

import tensorflow as tf


def bootstrap_values(values_of_next_obs: tf.Tensor, terminated: tf.Tensor) -> tf.Tensor:
    """``next_values``: the value of the observation each transition led to, 0 if terminated.

    ``values_of_next_obs[t]`` is ``V`` of the observation the transition really reached
    (the final observation when an episode ended). Shapes ``[T, N]``.

    >>> import tensorflow as tf
    >>> bootstrap_values(tf.constant([[2.0, 3.0]]), tf.constant([[False, True]])).numpy().tolist()
    [[2.0, 0.0]]
    """
    terminated = tf.cast(terminated, values_of_next_obs.dtype)
    return tf.stop_gradient(values_of_next_obs * (1.0 - terminated))


def gae(rewards: tf.Tensor, values: tf.Tensor, next_values: tf.Tensor, episode_ends: tf.Tensor,
        gamma: float, lam: float) -> tuple[tf.Tensor, tf.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016), ``[T, N]`` tensors.

    ``delta_t = r_t + gamma * next_values_t - values_t`` and
    ``A_t = delta_t + gamma * lam * (1 - episode_ends_t) * A_{t+1}``.
    Returns ``(advantages, returns)`` with ``returns = advantages + values`` (the
    lambda-return), both under ``tf.stop_gradient``.

    >>> import tensorflow as tf
    >>> adv, ret = gae(tf.constant([[1.], [1.]]), tf.zeros([2, 1]), tf.zeros([2, 1]),
    ...                tf.constant([[0.], [1.]]), gamma=0.5, lam=1.0)
    >>> ret.numpy().ravel().tolist()
    [1.5, 1.0]
    """
    rewards = tf.convert_to_tensor(rewards, tf.float32)
    values = tf.convert_to_tensor(values, tf.float32)
    next_values = tf.convert_to_tensor(next_values, tf.float32)
    not_end = 1.0 - tf.cast(episode_ends, tf.float32)
    deltas = rewards + gamma * next_values - values

    def body(carry, inp):
        delta, cont = inp
        return delta + gamma * lam * cont * carry

    adv = tf.scan(body, (deltas, not_end), initializer=tf.zeros_like(deltas[0]), reverse=True)
    adv = tf.stop_gradient(adv)
    return adv, tf.stop_gradient(adv + values)


def discounted_returns(rewards: tf.Tensor, next_values: tf.Tensor, episode_ends: tf.Tensor,
                       gamma: float) -> tf.Tensor:
    """Monte-Carlo returns-to-go, bootstrapped only where the data ends or is truncated.

    Equal to ``gae(..., lam=1)`` returns; independent of the value estimates of the
    visited states.

    >>> import tensorflow as tf
    >>> ret = discounted_returns(tf.constant([[1.0], [1.0]]), tf.constant([[5.0], [10.0]]),
    ...                          tf.constant([[0.0], [0.0]]), gamma=0.5)
    >>> ret.numpy().ravel().tolist()   # 1 + 0.5 * (1 + 0.5 * 10): only the last row bootstraps
    [4.0, 6.0]
    """
    rewards = tf.convert_to_tensor(rewards, tf.float32)
    next_values = tf.convert_to_tensor(next_values, tf.float32)
    ends = tf.cast(episode_ends, tf.float32)
    # the last row bootstraps from next_values whether or not the episode ended there
    ends = tf.concat([ends[:-1], tf.ones_like(ends[-1:])], axis=0)

    def body(carry, inp):
        r, end, nv = inp
        return r + gamma * (end * nv + (1.0 - end) * carry)

    ret = tf.scan(body, (rewards, ends, next_values),
                  initializer=tf.zeros_like(rewards[0]), reverse=True)
    return tf.stop_gradient(ret)
