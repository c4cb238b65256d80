"""Float fingerprints of a trained agent's state, for regression pins that hold across machines.

A SHA-256 of the weights' bytes pins a run bit for bit, but only on the machine and library build
that recorded it: another CPU (or oneDNN kernel) rounds matrix products in another order, and the
bytes differ at the last bit while the run is the same run. A fingerprint here is four float64
numbers of the concatenated arrays (their sum, their sum of absolute values and their projection
on a fixed +-1 vector, NaNs counted as 0; and the number of NaNs), compared to a tolerance of
1e-5 of the sum of absolute values: last-bit rounding moves it by ~1e-7, any change of what is
computed (another random draw, another update, a missed step) by far more than 1e-5.
"""

import json

import numpy as np

RTOL = 1e-5


def fingerprint(arrays):
    """``[sum, sum |x|, sum x * sign, NaN count]`` of ``arrays`` (any numbers) flattened, NaNs
    counted as 0 in the first three, as Python floats."""
    flat = np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in arrays]) if arrays else (
        np.zeros(0))
    nan = np.isnan(flat)
    flat = np.where(nan, 0.0, flat)
    signs = np.random.default_rng(0).choice([-1.0, 1.0], size=flat.size)
    return [float(np.sum(flat)), float(np.sum(np.abs(flat))), float(flat @ signs),
            float(np.sum(nan))]


def history_numbers(history):
    """Every number of a training history (a list of dicts), in a fixed order, as float64."""
    numbers = []

    def walk(value):
        if isinstance(value, dict):
            for key in sorted(value):
                walk(value[key])
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, (bool, int, float, np.number)):
            numbers.append(float(value))

    walk(json.loads(json.dumps(history, default=float)))
    return np.asarray(numbers, np.float64)


def assert_same_fingerprint(got, want, what="state"):
    """``got`` within ``RTOL`` of ``want`` (relative to the sum of absolute values)."""
    scale = max(abs(want[1]), 1e-30)
    diff = max(abs(g - w) for g, w in zip(got, want, strict=True))
    assert diff <= RTOL * scale, (
        f"{what}: fingerprint {got} differs from the pinned {want} by {diff:.3g} "
        f"(> {RTOL:g} of {scale:.6g})")
