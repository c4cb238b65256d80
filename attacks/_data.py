"""Deprecated location of :mod:`attacks.data` (kept importable until its last users move)."""

from attacks.data import DATASETS, Dataset, load_dataset, load_test_set  # noqa: F401
