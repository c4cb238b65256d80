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

__all__ = ["MAX_ENV_STEPS", "at_most", "not_applicable"]

MAX_ENV_STEPS = 10**9
"""The most env steps one training budget flag may ask for: 100x the published learned-adversary
budgets (ATLA, PA-AD: 2-10 million), about 15 CPU hours for a CartPole PPO on the gymnasium
backend (18,000 steps per CPU second, ``docs/benchmarks/agents.md``); 10**12 would run for years."""

_WHY = {MAX_ENV_STEPS: "env steps: ~15 CPU hours at 18,000 steps per CPU second"}


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
