"""``train-agent``'s flags in the library's messages: an agent's configuration is checked by the
library (:class:`agents.core.config.AgentConfig`), whose messages name its fields (``num_envs must
be ...``), the right words for the Python API. On the command line the user typed flags, so
:func:`flag_error` names the flag that set each field (``--num-envs must be ...``, ``--set
n_steps must be ...``); a field no flag set (a preset's value, a default) keeps its name. Only
the standard library is imported.

>>> import argparse
>>> args = argparse.Namespace(num_envs=10**6, lr=None, set=["n_steps=64"], seeds=None)
>>> str(flag_error(ValueError("num_envs must be an int in [1, 65536], got 1000000"), args))
'--num-envs must be an int in [1, 65536], got 1000000'
>>> str(flag_error(ValueError("n_steps * num_envs * num_seeds must be at most 16777216"), args))
'--set n_steps * --num-envs * num_seeds must be at most 16777216'
"""

from __future__ import annotations

import argparse
import re

__all__ = ["FIELD_FLAGS", "MAX_TOTAL_STEPS", "ROBUST_ONLY", "check_flags", "field_flags",
           "flag_error"]

MAX_TOTAL_STEPS = 10**10
"""The largest step count of a period flag (``--eval-every``):
:data:`agents.core.limits.MAX_TOTAL_STEPS`, repeated so that it is checked before TensorFlow
loads (a test checks that they agree)."""

ROBUST_ONLY = {
    "robust_method": (("sa", "atla-sa", "wocar"), "sa",
                      "the inner maximiser of the SA regulariser"),
    "robust_kappa": (("sa", "atla-sa", "wocar"), "sa", "the weight of the SA regulariser"),
    "robust_attack": (("adv",), "adv", "the attack adversarial training trains on"),
    "robust_steps": (("sa", "adv", "atla-sa", "wocar"), "sa|adv|atla-sa|wocar",
                     "the steps of an inner search; atla's adversary is learned"),
}
"""``--robust`` flag (as its field) -> (the methods that read it, how the refusal names them, what
it is). Given with another ``--robust`` it would do nothing: refused."""

FIELD_FLAGS = {
    "num_envs": "--num-envs", "learning_rate": "--lr", "async_envs": "--async-envs",
    "normalize_obs": "--normalize-obs", "normalize_reward": "--normalize-reward",
    "backend": "--backend", "checkpoint_every": "--checkpoint-every", "robust": "--robust",
    "robust_eps": "--eps", "robust_kappa": "--robust-kappa", "robust_steps": "--robust-steps",
    "robust_method": "--robust-method", "robust_eps_warmup": "--eps-warmup",
    "robust_attack": "--robust-attack", "num_seeds": "--seeds", "seed": "--seed", "env": "--env",
    "wocar_warmup": "--eps-warmup",
}
"""Config field -> the ``train-agent`` flag that sets it (``--set KEY`` sets any field)."""


def _given(args: argparse.Namespace, field: str, flag: str) -> bool:
    """Whether ``flag`` was given (a store_true flag: set; another: not None)."""
    value = getattr(args, flag[2:].replace("-", "_"), None)
    if field == "num_seeds":
        return getattr(args, "seeds", None) is not None
    return value is not None and value is not False


def field_flags(args: argparse.Namespace) -> dict[str, str]:
    """Config field -> how this command line set it: its flag, or ``--set FIELD``."""
    out = {field: flag for field, flag in FIELD_FLAGS.items() if _given(args, field, flag)}
    for item in getattr(args, "set", None) or ():
        key = str(item).partition("=")[0].strip()
        if key.isidentifier():
            out[key] = f"--set {key}"
    return out


def flag_error(exc: BaseException, args: argparse.Namespace,
               names: dict[str, str] | None = None) -> BaseException:
    """``exc`` (a library check's error) with each field the command line set named as its flag
    (``names``: field -> flag, default :func:`field_flags` of ``args``); ``exc`` itself when its
    message names none. A name with an underscore is replaced wherever it appears, one without
    (``env``, ``seed``) only as the message's subject (its first word)."""
    names = field_flags(args) if names is None else names
    message = str(exc)

    def flag(match: re.Match) -> str:
        word = match.group(0)
        if word in names and ("_" in word or match.start() == 0):
            return names[word]
        return word

    renamed = re.sub(r"(?<![\w.'\"-])[a-z][a-z0-9_]*(?![\w'\"(=-])", flag, message)
    if renamed == message:
        return exc
    try:
        new = type(exc)(renamed)
    except TypeError:  # an exception class with another constructor: keep it as it is
        return exc
    return new


def check_flags(args: argparse.Namespace) -> None:
    """``train-agent``'s counts within their bounds and the flags its run would not read,
    before TensorFlow loads (:class:`robustgrad.cli.UsageError` naming the flag)."""
    from robustgrad.cli import UsageError, user_errors
    from robustgrad.commands import _bounds as b

    with user_errors(ValueError):
        b.count(args.seed, "--seed", b.MAX_SEED, minimum=0)
        b.count(args.eval_episodes, "--eval-episodes", b.MAX_EPISODES, minimum=0)
        b.count(args.rollout_workers, "--rollout-workers", b.MAX_PROCESSES)
        b.count(args.num_cpus, "--num-cpus", b.MAX_PROCESSES)
        if args.eval_every is not None and args.eval_every > 0:
            b.count(args.eval_every, "--eval-every", MAX_TOTAL_STEPS)
    if args.rollout_workers is not None and getattr(args, "backend", None) == "graph":
        raise UsageError("--rollout-workers: Ray actors step gymnasium environments, and "
                         "--backend graph steps them inside the compiled iteration: give one")
    if args.num_cpus is not None and args.ray_address is not None:
        raise UsageError("--num-cpus: sizes the local Ray instance; the cluster at "
                         "--ray-address has its own CPUs")
    if args.normalize_reward and args.algo == "dqn":
        raise UsageError("--normalize-reward: scales the returns of on-policy training (ppo, "
                         "a2c, reinforce); dqn does not read it")
