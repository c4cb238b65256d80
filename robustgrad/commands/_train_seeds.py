"""``robustgrad train-agent --seeds 0-7``: many seeds in one run, one directory per seed.

The run is :func:`agents.training.train_seeds` (see there: groups of seeds trained together on a
seed axis, ``--out/seed_<s>/`` written as each group finishes, ``--out/checkpoint/`` for the
running group, ``--resume`` skipping the finished seeds, ``summary.json`` and
``learning_curves.png`` at the end). Here: the ``--seeds`` list (parsed before TensorFlow
loads) and the call.

>>> parse_seeds("0-3,8")
[0, 1, 2, 3, 8]
>>> parse_seeds("3-1")
Traceback (most recent call last):
...
ValueError: --seeds must be seeds >= 0 like 0-7 or 0,2,5 (ranges ascending, no repeats), got '3-1'
"""

from __future__ import annotations

import argparse
import re

from robustgrad.commands._bounds import MAX_SEED

_SEEDS_FORMAT = "seeds >= 0 like 0-7 or 0,2,5 (ranges ascending, no repeats)"
MAX_SEEDS = 10_000
"""The most seeds one ``--seeds`` run accepts (larger lists: split them over several runs)."""


def parse_seeds(text: str) -> list[int]:
    """``"0-7"`` -> ``[0, ..., 7]``; ``"0,2,5"``; ``"0-3,8"``. ``ValueError`` naming
    ``--seeds`` for anything else (empty parts, descending ranges, repeats, negatives, a seed
    above ``--seed``'s bound, more than :data:`MAX_SEEDS` seeds), before the list is built."""
    error = ValueError(f"--seeds must be {_SEEDS_FORMAT}, got {text!r}")
    ranges: list[tuple[int, int]] = []
    for part in str(text).split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise error
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise error
        ranges.append((low, high))
    largest = max(high for _, high in ranges)
    if largest > MAX_SEED:
        raise ValueError(f"--seeds: each seed must be at most {MAX_SEED} (as --seed), got "
                         f"{largest}")
    count = sum(high - low + 1 for low, high in ranges)
    if count > MAX_SEEDS:
        raise ValueError(f"--seeds: at most {MAX_SEEDS} seeds in one run, got {count} "
                         f"({text.strip()}); split the list over several runs")
    seeds = [s for low, high in ranges for s in range(low, high + 1)]
    if not seeds or len(set(seeds)) != len(seeds):
        raise error
    return seeds


def run_seeds(args: argparse.Namespace, seeds: list[int], config, out: str) -> int:
    """Train ``seeds`` (already parsed) of ``config`` (the flags' agent config) in ``out``:
    :func:`agents.training.train_seeds`; returns the exit status."""
    from agents.training import train_seeds
    from robustgrad.rundir import RunDirectory

    run = RunDirectory(out, command="robustgrad train-agent")
    result = train_seeds(config, run, seeds=seeds, steps=args.steps, resume=args.resume,
                         overwrite=args.overwrite, eval_episodes=args.eval_episodes,
                         progress=not args.no_progress, lock=False)  # the CLI holds the lock
    return result.status
