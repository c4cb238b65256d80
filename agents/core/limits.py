"""The limits an agent's config is checked against, each with the reason for its value.

A config (:mod:`agents.core.config` and each algorithm's beside it) refuses, before any work, a
value that would exhaust memory or keep a stop request waiting for minutes: the most
environments, transitions in one rollout, units in a hidden layer, repetitions of a step, gradient
passes in one compiled update, and env steps in one ``learn`` budget. The command line checks
the same bounds before TensorFlow starts, in its own flag checks.

>>> check_total_steps(2048)
2048
"""

from __future__ import annotations

from typing import Any

from robustgrad.checks import positive_int
from robustgrad.errors import ConfigError

MAX_NUM_ENVS = 65_536
"""The largest ``num_envs``: 16x the widest vectorised batches of the graph-env literature
(PureJaxRL's 4,096 per device); a Python (gymnasium) env per copy costs far more first."""

MAX_ASYNC_ENVS = 1_024
"""The largest ``num_envs`` with ``async_envs=True``: each environment is a subprocess."""

MAX_ROLLOUT_TRANSITIONS = 2**24
"""The most transitions one on-policy rollout holds (``n_steps * num_envs * num_seeds``, kept in
memory with their observations until the update): 16.8 million, 128x the 131,072 of a
PureJaxRL-sized batch (2,048 envs x 64 steps), about 1 GiB for CartPole's four floats."""

MAX_HIDDEN_SIZE = 65_536
"""The widest hidden layer: a 65,536 x 65,536 float32 weight matrix alone is 16 GiB."""

MAX_REPEATS = 100_000
"""The most repetitions of one step per update (``n_epochs``, ``robust_steps``,
``gradient_steps``): each multiplies the time of every update, and none of the published
settings of these methods uses more than a few hundred."""

MAX_UPDATE_WORK = 2**22
"""The most per-transition gradient passes one compiled update makes: PPO's ``n_epochs * n_steps
* num_envs * num_seeds``, DQN's ``gradient_steps * batch_size * num_seeds``, each times ``1 +
robust_steps`` when a robust regulariser searches every minibatch (``robust`` ``"sa"``,
``"atla-sa"``, ``"wocar"`` with ``robust_method`` ``"pgd"``/``"sgld"``). Ctrl-C and SIGTERM reach
Python only between compiled calls, so this bounds the wait for a stop: at the bound
(``n_epochs=8192`` over 512 transitions, the 64x64 network, ``--threads 1``) ``train-agent``
exited 21 s after SIGTERM on a 2-core machine at load 5, where ``n_epochs=100000`` (51 million
passes) took 197 s. The largest published settings stay well inside it
(IsaacGym's humanoid PPO, 4,096 envs x 32 steps x 5 epochs = 655,360; SA-PPO's MuJoCo runs,
2,048 x 10 epochs x 11 = 225,280)."""

MAX_TOTAL_STEPS = 10**10
"""The largest ``learn`` budget (``total_steps``, ``robustgrad train-agent --steps``): about six
CPU days at 18,000 environment steps per CPU second, 50x Atari's 200M-frame benchmark budget."""


def check_total_steps(value: Any, name: str = "total_steps") -> int:
    """``value`` as a learn budget: an int in ``[1, MAX_TOTAL_STEPS]``, or a
    :class:`robustgrad.errors.ConfigError` naming ``name`` (``"--steps"`` on the command line).

    >>> check_total_steps(1e5)
    100000
    >>> check_total_steps(10**15, "--steps")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: --steps must be an int in [1, 10000000000], got 1000000000000000
    """
    return positive_int(value, name, maximum=MAX_TOTAL_STEPS)


EPISODE_SLOT_BYTES = 16
"""Bytes per slot of the graph env's ring buffer of finished episodes (a float32 return and an
int32 length, allocated from zeros of the same size): ``iterations_per_call * n_steps * num_envs
* num_seeds`` slots when ``K > 1`` (:func:`agents.backends.graph_backend.episode_capacity`)."""


def check_rollout_size(n_steps: int, num_envs: int, num_seeds: int) -> None:
    """Refuse an on-policy rollout of more than :data:`MAX_ROLLOUT_TRANSITIONS` transitions
    (``n_steps * num_envs * num_seeds``): a :class:`ConfigError` naming the fields and values."""
    rollout = n_steps * num_envs * num_seeds
    if rollout > MAX_ROLLOUT_TRANSITIONS:
        raise ConfigError(f"n_steps * num_envs * num_seeds must be at most "
                          f"{MAX_ROLLOUT_TRANSITIONS} (transitions one rollout keeps in "
                          f"memory), got {n_steps} * {num_envs} * {num_seeds} = {rollout}")


def check_update_work(config: Any, work: int, terms: str) -> None:
    """Refuse an update of more than :data:`MAX_UPDATE_WORK` passes (``work``, the product
    ``terms`` names), times ``1 + robust_steps`` when the robust regulariser searches each
    minibatch; a :class:`ConfigError` naming the fields and their values."""
    if config.robust in ("sa", "atla-sa", "wocar") and config.robust_method != "convex":
        work, terms = work * (1 + config.robust_steps), f"{terms} * (1 + robust_steps)"
    if work > MAX_UPDATE_WORK:
        raise ConfigError(f"{terms} must be at most {MAX_UPDATE_WORK} (gradient passes of one "
                          f"update, which a stop request waits for), got {work}")
