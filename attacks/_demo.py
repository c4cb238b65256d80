"""Deprecated location of the digits reference classifier (kept importable until its last users
move): use :mod:`attacks.reference` and :func:`robustgrad.data.load_digits`. The demo stage moved
to ``robustgrad/commands/_demo_attacks.py``."""

from attacks.reference import digits_cnn, train_digits_cnn  # noqa: F401
from robustgrad.data import load_digits as load_digits_arrays  # noqa: F401
