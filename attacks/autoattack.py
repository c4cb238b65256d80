"""AutoAttack's versions by name: the ensembles of Croce & Hein, "Reliable evaluation of adversarial
robustness with an ensemble of diverse parameter-free attacks", ICML 2020 (L∞, L2), and "Mind the
box: l1-APGD for sparse adversarial attacks on image classifiers", ICML 2021 (L1).

``attacks.evaluate(model, x, y, "autoattack", eps=8/255)`` runs the ``standard`` version as a
cascade (each attack only on the examples every earlier one failed on; the report has a row per
component and the worst case), and so does ``robustgrad evaluate --attacks autoattack``.
:func:`autoattack_attacks` returns the components as ``(label, Attack)`` pairs.

The components, their order and settings are the reference implementation's
(fra31/auto-attack, ``autoattack/autoattack.py``, ``AutoAttack.set_version`` and the attack
constructors it calls; ``fab-t`` always runs one restart there), all with 100 iterations,
APGD's ``rho = 0.75``, FAB's ``alpha_max = 0.1, eta = 1.05, beta = 0.9``:

=================  ======  ==================================================================
name               norm    components, in order
=================  ======  ==================================================================
``autoattack``     L∞, L2  ``apgd-ce`` (1 restart), ``apgd-t`` (9 target classes),
                           ``fab-t`` (9 target classes), ``square`` (5000 queries,
                           ``p_init = 0.8``, schedule not rescaled)
``autoattack``     L1      ``apgd-ce`` (5 restarts), ``apgd-t`` (5 target classes), both with
                           the 3/2/1 x eps schedule (``use_largereps``), ``fab-t`` (9 target
                           classes), ``square`` (L1, as above)
``autoattack-plus`` all    ``apgd-ce`` (5 restarts), ``apgd-dlr`` (5 restarts), ``fab``
                           (5 restarts, from distance eps / 2), ``square`` (5000 queries),
                           ``apgd-t`` (9 target classes), ``fab-t``
                           (9 target classes); no eps schedule for L1 (the reference's
                           ``plus`` does not set it, and flags L1 as unchecked)
``autoattack-rand`` all    ``apgd-ce``, ``apgd-dlr``, 1 restart each, every gradient averaged
                           over 20 passes (expectation over transformation, for randomised
                           defences)
=================  ======  ==================================================================

``apgd-t`` and ``fab-t`` are untargeted in their goal (change the decision away from the label)
and run one attack per class among the most likely other classes of the clean input.

>>> [label for label, _ in autoattack_attacks("autoattack", "linf")]
['apgd-ce', 'apgd-t', 'fab-t', 'square']
>>> autoattack_attacks("autoattack", "linf")[3][1]
Square(steps=5000, p_init=0.8, rescale_schedule=False)
>>> [label for label, _ in autoattack_attacks("autoattack-plus", "l2")]
['apgd-ce', 'apgd-dlr', 'fab', 'square', 'apgd-t', 'fab-t']
"""

from __future__ import annotations

from robustgrad import checks as _checks

from ._base import Attack
from .apgd import APGD
from .fab import FAB
from .square import Square

__all__ = ["AUTOATTACK_VERSIONS", "autoattack_attacks"]

AUTOATTACK_VERSIONS: dict[str, str] = {
    "autoattack": "AutoAttack standard: apgd-ce, apgd-t, fab-t, square5000 (L-inf, L2, L1)",
    "autoattack-plus": "AutoAttack plus: apgd-ce, apgd-dlr, fab (5 restarts each), square, "
                       "apgd-t, fab-t",
    "autoattack-rand": "AutoAttack rand, for randomised models: apgd-ce, apgd-dlr with "
                       "gradients averaged over 20 passes (EOT)",
}
"""The version names and their one-line help (:func:`attacks.describe_attacks`)."""

_STEPS = 100
_SQUARE = dict(steps=5000, p_init=0.8, rescale_schedule=False)


def autoattack_attacks(version: str = "autoattack", norm: str = "linf") -> list[tuple[str, Attack]]:
    """The components of an AutoAttack version for a norm, as ``(label, Attack)`` pairs in the
    cascade's order (see the module docstring for the table and its source).

    ``version`` is a name of :data:`AUTOATTACK_VERSIONS` (``"standard"``, ``"plus"`` and
    ``"rand"`` are accepted too); ``norm`` ``"linf"``, ``"l2"`` or ``"l1"``. Raises
    ``ValueError`` naming the argument for anything else.
    """
    if not isinstance(version, str):
        raise _checks.ArgumentTypeError(f"version must be a string, got {version!r}")
    name = version.strip().lower()
    name = {"standard": "autoattack", "plus": "autoattack-plus",
            "rand": "autoattack-rand"}.get(name, name)
    if name not in AUTOATTACK_VERSIONS:
        raise ValueError(f"version must be one of {', '.join(AUTOATTACK_VERSIONS)}, "
                         f"got {version!r}")
    norm = _checks.norm_name(norm)
    if name == "autoattack":
        l1 = norm == "l1"
        parts = [
            ("apgd-ce", APGD(objective="ce", steps=_STEPS, restarts=5 if l1 else 1)),
            ("apgd-t", APGD(objective="dlr", steps=_STEPS, n_target_classes=5 if l1 else 9)),
            ("fab-t", FAB(steps=_STEPS, n_target_classes=9)),
            ("square", Square(**_SQUARE)),
        ]
        return parts
    if name == "autoattack-plus":
        no_schedule = {"eps_schedule": False} if norm == "l1" else {}
        parts = [
            ("apgd-ce", APGD(objective="ce", steps=_STEPS, restarts=5, **no_schedule)),
            ("apgd-dlr", APGD(objective="dlr", steps=_STEPS, restarts=5, **no_schedule)),
            ("fab", FAB(steps=_STEPS, restarts=5)),
            ("square", Square(**_SQUARE)),
        ]
        parts += [
            ("apgd-t", APGD(objective="dlr", steps=_STEPS, n_target_classes=9, **no_schedule)),
            ("fab-t", FAB(steps=_STEPS, n_target_classes=9)),
        ]
        return parts
    no_schedule = {"eps_schedule": False} if norm == "l1" else {}
    return [
        ("apgd-ce", APGD(objective="ce", steps=_STEPS, eot_iter=20, **no_schedule)),
        ("apgd-dlr", APGD(objective="dlr", steps=_STEPS, eot_iter=20, **no_schedule)),
    ]
