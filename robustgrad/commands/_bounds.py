"""Upper bounds of the commands' numeric flags and which flags apply to which choice, checked
before any work (issue 36: every numeric argument has a sane upper bound; a flag the chosen
method would ignore is refused, naming it). Only the standard library is imported.

>>> at_most(10, "--adversary-steps", MAX_ENV_STEPS)
10
>>> at_most(10**12, "--adversary-steps", MAX_ENV_STEPS)  # doctest: +ELLIPSIS
Traceback (most recent call last):
robustgrad.errors.ConfigError: --adversary-steps must be at most 1000000000 (env steps: ...), got ...
>>> not_applicable({"--rs-steps": ("rs",)}, ["--rs-steps"], ["mad"], "--attacks")
'--rs-steps: only with --attacks rs, not with --attacks mad'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from robustgrad.errors import ConfigError

__all__ = ["MAX_BATCH", "MAX_ENVS", "MAX_ENV_STEPS", "MAX_EPISODES", "MAX_EXAMPLES",
           "MAX_PROCESSES", "MAX_REPEATS", "MAX_RESTARTS", "MAX_SEED", "MAX_WIDTH", "at_most",
           "count", "not_applicable"]

MAX_ENV_STEPS = 10**9
"""The most env steps one training budget flag may ask for: 100x the published learned-adversary
budgets (ATLA, PA-AD: 2-10 million), about 15 CPU hours for a CartPole PPO on the gymnasium
backend (18,000 steps per CPU second, ``docs/benchmarks/agents.md``); 10**12 would run for years."""

MAX_SEED = 2**32 - 1
"""The largest ``--seed``: NumPy's legacy seed range (``np.random.seed``, which
``keras.utils.set_random_seed`` calls, refuses more with a traceback)."""

MAX_EXAMPLES = 10**9
"""The most examples a count flag may name (``--limit``, ``--num``, ``--val-size``): 70x
ImageNet-21k; a count above the data's size means all of it."""

MAX_BATCH = 2**20
"""The largest ``--batch-size``: 1,048,576 examples per call, 1,024x the attacks' default chunk
and 4,096x the commands' default batch."""

MAX_REPEATS = 100_000
"""The most repetitions of one step (``--steps``, ``--epochs``, ``--val-steps``,
``--power-iters``, ``--lipschitz-steps``, ``--smoothgrad-samples``, an attack's ``pgdK``):
10,000x the published PGD-10; each multiplies the run's time, and a compiled loop is deaf to
Ctrl-C until it ends. The same bound as :data:`agents.core.limits.MAX_REPEATS`."""

MAX_RESTARTS = 1_000
"""The most restarts of an attack (``--restarts``, an attack's ``xR``): 200x AutoAttack's 5."""

MAX_WIDTH = 4_096
"""The widest first layer ``--width`` may ask for: 64x the default 64 (WideResNet-28-10's widest
block has 640 channels)."""

MAX_PROCESSES = 1_024
"""The most CPUs, devices or workers a flag may ask for (``--logical-cpus``, ``--num-cpus``,
``--rollout-workers``): as ``robustgrad --threads`` (:data:`robustgrad.cli.MAX_THREADS`)."""

MAX_EPISODES = 100_000
"""The most evaluation episodes (``--episodes``, ``--eval-episodes``): 5 * 10**7 env steps of
CartPole's 500-step episodes, about an hour at 18,000 steps per CPU second."""

MAX_ENVS = 65_536
"""The most environment copies (``evaluate-agent --num-envs``):
:data:`agents.core.limits.MAX_NUM_ENVS`, repeated here so that the flag is checked before
TensorFlow loads (a test checks that they agree)."""

_WHY = {MAX_ENV_STEPS: "env steps: ~15 CPU hours at 18,000 steps per CPU second"}


def count(value: int | None, flag: str, maximum: int, minimum: int = 1) -> int | None:
    """``value`` as an int in ``[minimum, maximum]`` (``None`` stays ``None``), or a
    :class:`ConfigError` naming ``flag`` and the range.

    >>> count(5, "--epochs", MAX_REPEATS)
    5
    >>> count(10**12, "--epochs", MAX_REPEATS)
    Traceback (most recent call last):
    robustgrad.errors.ConfigError: --epochs must be an int in [1, 100000], got 1000000000000
    """
    from robustgrad.checks import positive_int

    return positive_int(value, flag, minimum=minimum, maximum=maximum, allow_none=True)


def at_most(value: int, flag: str, maximum: int, why: str | None = None) -> int:
    """``value`` (already an int) when ``<= maximum``, else a :class:`ConfigError` (a
    ``ValueError``) naming ``flag``,
    the bound and ``why`` (the unit and what the bound means)."""
    if value > maximum:
        why = why or _WHY.get(maximum)
        raise ConfigError(f"{flag} must be at most {maximum}{f' ({why})' if why else ''}, "
                         f"got {value}")
    return value


def not_applicable(applies: Mapping[str, Iterable[str]], given: Iterable[str],
                   chosen: Iterable[str], choice_flag: str) -> str | None:
    """The refusal of the first flag in ``given`` that none of the ``chosen`` values of
    ``choice_flag`` uses (``applies``: flag -> the values it configures), or ``None``."""
    chosen = list(chosen)
    for flag in given:
        uses = tuple(applies.get(flag, ()))
        if flag in applies and not set(uses) & set(chosen):
            given_as = (f"not with {choice_flag} {','.join(chosen)}" if chosen
                        else f"and no {choice_flag} was given")
            return f"{flag}: only with {choice_flag} {'|'.join(uses)}, {given_as}"
    return None
