"""Attack names: the one place where a string such as ``"pgd40"`` becomes a configured attack.

:func:`parse_attack` turns a name into ``(label, Attack)``; :func:`parse_attacks` does it for a
list or a comma-separated string (the command line's ``--attacks`` / ``--eval-attacks``).
:func:`attacks.evaluate` and the CLI both read names through here, so a new name added to
:data:`ATTACK_TABLE` is known everywhere at once.

A name is a base name from :data:`ATTACK_NAMES`, optionally followed by a step count and, for
attacks with restarts, ``x`` and a restart count (the forms in :data:`ATTACK_PATTERNS`):

>>> parse_attack("pgd40")
('pgd40', PGD(steps=40))
>>> parse_attack("PGD50x5")
('pgd50x5', PGD(steps=50, restarts=5))
>>> parse_attack("apgd-t")
('apgd-t', APGD(objective='dlr', steps=100, n_target_classes=9))
>>> [label for label, _ in parse_attacks("fgsm, square5000")]
['fgsm', 'square5000']
>>> parse_attack("fgsm10")
Traceback (most recent call last):
...
ValueError: attacks: 'fgsm10': fgsm has no step count to set

The default budgets (steps, restarts) are the ones the references use: PGD-20, APGD and FAB with
100 steps (Croce & Hein 2020, "Reliable evaluation of adversarial robustness with an ensemble of
diverse parameter-free attacks"), Square with 1000 queries (Andriushchenko et al. 2020).

AutoAttack's versions (``"autoattack"``, ``"autoattack-plus"``, ``"autoattack-rand"``) name
several attacks each, with settings that depend on the norm: :func:`parse_attacks` expands them
(:mod:`attacks.autoattack`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable

from robustgrad import checks as _checks
from robustgrad.errors import ConfigError

from . import _validate
from ._base import Attack
from .apgd import APGD
from .autoattack import AUTOATTACK_VERSIONS, autoattack_attacks
from .cw import CarliniWagnerL2
from .deepfool import DeepFool
from .fab import FAB
from .fgsm import FGM
from .pgd import BIM, MIM, PGD
from .square import Square

__all__ = [
    "ATTACK_NAMES",
    "ATTACK_PATTERNS",
    "ATTACK_TABLE",
    "AttackName",
    "AttackSpec",
    "describe_attacks",
    "make_attack",
    "parse_attack",
    "parse_attacks",
]

AttackSpec = str | Attack | tuple[str, Attack]
"""What :func:`parse_attack` accepts: a name, an :class:`attacks.Attack`, or ``(label, Attack)``."""


@dataclasses.dataclass(frozen=True)
class AttackName:
    """One base name of the registry.

    Attributes:
      name: the base name (lower case), e.g. ``"apgd-ce"``.
      description: one line of help text, printed by :func:`describe_attacks`.
      build: returns a fresh configured attack with the name's defaults.
      takes_steps: a number after the name sets ``steps`` (``"apgd-ce50"``).
      takes_restarts: ``"<name>KxR"`` also sets ``restarts`` (worst case over R random starts).
    """

    name: str
    description: str
    build: Callable[[], Attack]
    takes_steps: bool = True
    takes_restarts: bool = False


ATTACK_TABLE: dict[str, AttackName] = {entry.name: entry for entry in (
    AttackName("fgsm", "fast gradient sign method, one step (L-inf)", lambda: FGM(),
               takes_steps=False),
    AttackName("fgm", "fast gradient method, one step along the norm's steepest direction",
               lambda: FGM(), takes_steps=False),
    AttackName("bim", "basic iterative method, 10 steps from x", lambda: BIM(steps=10)),
    AttackName("mim", "momentum iterative method, 10 steps", lambda: MIM(steps=10)),
    AttackName("pgd", "PGD on cross-entropy, 20 steps from a random start", lambda: PGD(steps=20),
               takes_restarts=True),
    AttackName("pgd-cw", "PGD on the CW margin, 20 steps", lambda: PGD(steps=20, objective="cw"),
               takes_restarts=True),
    AttackName("pgd-dlr", "PGD on the DLR loss, 20 steps",
               lambda: PGD(steps=20, objective="dlr"), takes_restarts=True),
    AttackName("apgd-ce", "APGD on cross-entropy, 100 steps (AutoAttack)",
               lambda: APGD(objective="ce", steps=100), takes_restarts=True),
    AttackName("apgd-dlr", "APGD on the DLR loss, 100 steps",
               lambda: APGD(objective="dlr", steps=100), takes_restarts=True),
    AttackName("apgd-t", "APGD-T: targeted DLR toward each of the top-9 other classes, 100 steps",
               lambda: APGD(objective="dlr", steps=100, n_target_classes=9),
               takes_restarts=True),
    AttackName("cw", "Carlini-Wagner L2, 100 steps x 5 binary-search steps (L2 only)",
               lambda: CarliniWagnerL2(steps=100, binary_search_steps=5)),
    AttackName("deepfool", "DeepFool, up to 50 steps (L2, L-inf)", lambda: DeepFool()),
    AttackName("fab", "FAB, minimal-distortion boundary attack, 100 steps (L-inf, L2, L1)",
               lambda: FAB(steps=100), takes_restarts=True),
    AttackName("fab-t", "FAB-T: FAB toward each of the top-9 other classes, 100 steps",
               lambda: FAB(steps=100, n_target_classes=9), takes_restarts=True),
    AttackName("square", "Square attack, gradient-free, 1000 queries (L-inf, L2, L1)",
               lambda: Square(steps=1000)),
)}

ATTACK_NAMES: tuple[str, ...] = tuple(ATTACK_TABLE)
"""Every base name, in the order of the help text."""

ATTACK_PATTERNS: tuple[tuple[str, str], ...] = (
    ("<name>K", "K steps (queries for square), e.g. pgd40, apgd-ce50, square5000; for "
     + ", ".join(n for n, e in ATTACK_TABLE.items() if e.takes_steps)),
    ("<name>KxR", "K steps, worst case over R restarts, e.g. pgd50x5; for "
     + ", ".join(n for n, e in ATTACK_TABLE.items() if e.takes_restarts)),
)
"""The numbered forms of a name, as ``(pattern, help)`` pairs."""

MAX_STEPS = _validate.MAX_STEPS
"""The most steps a numbered name may set (``pgd100000``): the attacks' own bound on ``steps``
(:data:`attacks._validate.MAX_STEPS`)."""
MAX_RESTARTS = _validate.MAX_RESTARTS
"""The most restarts a ``KxR`` name may set: the attacks' own bound on ``restarts``."""

_NUMBERED = re.compile(r"(?P<base>[a-z]+(?:-[a-z]+)*)-?(?P<steps>\d+)(?:x(?P<restarts>\d+))?")


def describe_attacks() -> str:
    """The names and patterns with their help text, one per line (for a CLI to print).

    >>> print(describe_attacks().splitlines()[0])
    fgsm             fast gradient sign method, one step (L-inf)
    """
    width = max(len(k) for k in (*ATTACK_NAMES, *(p for p, _ in ATTACK_PATTERNS)))
    width = max(width, *(len(v) for v in AUTOATTACK_VERSIONS))
    lines = [f"{e.name:<{width}}  {e.description}" for e in ATTACK_TABLE.values()]
    lines += [f"{p:<{width}}  {h}" for p, h in ATTACK_PATTERNS]
    lines += [f"{v:<{width}}  {h}" for v, h in AUTOATTACK_VERSIONS.items()]
    return "\n".join(lines)


def _at_most(value: int, name: str, maximum: int) -> int:
    """``value``, or a ``ConfigError`` naming ``name`` when it is over ``maximum``."""
    if value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {value}")
    return value


def _unknown(spec: str) -> ValueError:
    return ValueError(f"attacks: unknown attack {spec!r}; known: {', '.join(ATTACK_NAMES)} "
                      "(a number after the name sets the steps, e.g. 'pgd40'; 'pgd50x5' also "
                      "sets 5 restarts)")


def parse_attack(spec: AttackSpec) -> tuple[str, Attack]:
    """``(label, Attack)`` for a name (see the module docstring), an :class:`attacks.Attack`
    (labelled by its ``name``), or a ``(label, Attack)`` pair (returned as is).

    The label of a name is the name in lower case without surrounding spaces. Raises
    ``ValueError`` for an unknown name or a bad count, :class:`robustgrad.checks.ArgumentTypeError`
    (a ``TypeError`` and a ``ValueError``) for anything else.
    """
    if isinstance(spec, Attack):
        return spec.name, spec
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], Attack):
        return str(spec[0]), spec[1]
    if not isinstance(spec, str):
        raise _checks.ArgumentTypeError(
            f"attacks: each entry must be a name or an attacks.Attack, got {spec!r}")
    name = spec.strip().lower()
    if name in AUTOATTACK_VERSIONS:
        raise ValueError(f"attacks: {spec!r} names several attacks (an AutoAttack version); "
                         "use parse_attacks(names, norm=...)")
    if name in ATTACK_TABLE:
        return name, ATTACK_TABLE[name].build()
    match = _NUMBERED.fullmatch(name)
    if match is None or match["base"] not in ATTACK_TABLE:
        raise _unknown(spec)
    entry = ATTACK_TABLE[match["base"]]
    if not entry.takes_steps:
        raise ValueError(f"attacks: {spec!r}: {entry.name} has no step count to set")
    overrides = {"steps": _at_most(_checks.positive_int(int(match["steps"]),
                                                        f"steps of {spec!r}"),
                                   f"steps of {spec!r}", MAX_STEPS)}
    if match["restarts"] is not None:
        if not entry.takes_restarts:
            raise ValueError(f"attacks: {spec!r}: {entry.name} has no restarts to set "
                             "(KxR works for "
                             + ", ".join(n for n, e in ATTACK_TABLE.items() if e.takes_restarts)
                             + ")")
        overrides["restarts"] = _at_most(_checks.positive_int(int(match["restarts"]),
                                                              f"restarts of {spec!r}"),
                                         f"restarts of {spec!r}", MAX_RESTARTS)
    return name, entry.build().replace(**overrides)


make_attack = parse_attack
"""The first version's name of :func:`parse_attack` (``attacks.make_attack``), kept as an alias."""


def parse_attacks(specs: AttackSpec | Iterable[AttackSpec],
                  norm: str = "linf") -> list[tuple[str, Attack]]:
    """``[(label, Attack), ...]`` for a comma-separated string of names, one
    :class:`attacks.Attack`, or a sequence of specs (each as :func:`parse_attack` takes; a
    ``(label, Attack)`` pair goes inside the sequence: ``[("mine", PGD())]``). Refuses an empty
    list and duplicate labels.

    An AutoAttack version name (``"autoattack"``, ``"autoattack-plus"``, ``"autoattack-rand"``,
    :mod:`attacks.autoattack`) expands into its components for ``norm`` (the versions differ
    between norms).

    >>> [(label, attack.config["steps"]) for label, attack in parse_attacks(["pgd", "pgd40"])]
    [('pgd', 20), ('pgd40', 40)]
    >>> [label for label, _ in parse_attacks("fgsm,autoattack", norm="l1")]
    ['fgsm', 'apgd-ce', 'apgd-t', 'fab-t', 'square']
    """
    if isinstance(specs, str):
        specs = [s for s in specs.split(",") if s.strip()]
    elif isinstance(specs, Attack):
        specs = [specs]
    parsed: list[tuple[str, Attack]] = []
    origins: list[str | None] = []  # the spec each attack came from (a name, or None)
    for s in specs:
        if isinstance(s, str) and s.strip().lower() in AUTOATTACK_VERSIONS:
            expanded = autoattack_attacks(s.strip().lower(), norm)
            parsed += expanded
            origins += [s.strip().lower()] * len(expanded)
        else:
            parsed.append(parse_attack(s))
            origins.append(s.strip().lower() if isinstance(s, str) else None)
    if not parsed:
        raise ValueError("attacks: give at least one attack")
    labels = [label for label, _ in parsed]
    if len(set(labels)) != len(labels):
        twice = next(label for label in labels if labels.count(label) > 1)
        sources = [o for label, o in zip(labels, origins) if label == twice]
        if None in sources:  # an Attack object among them: only a label tells them apart
            raise ValueError(f"attacks: duplicate names {labels}; wrap in (label, attack) "
                             f"tuples")
        runs = [f"{o} runs {twice}" for o in dict.fromkeys(sources) if o != twice]
        raise ValueError(f"attacks: duplicate names {labels}: {twice} is listed twice"
                         + (f" ({'; '.join(runs)})" if runs else "") + "; list it once")
    return parsed
