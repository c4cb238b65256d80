"""Property tests (hypothesis) of the attack guarantees over random shapes, dtypes, bounds,
eps and norms: ``‖x_adv - x‖ <= eps`` (up to the dtype's rounding), ``x_adv`` inside the clip
bounds (as the dtype represents them), the dtype and shape kept, the input unchanged.

The number of examples is small (the default suite stays fast: each attack compiles once per
shape and dtype); ``HYPOTHESIS_MAX_EXAMPLES`` raises it for a longer search.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attacks

MAX_EXAMPLES = int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "8"))
SETTINGS = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

SHAPES = [(3,), (2, 3), (4, 4, 1), (3, 3, 2)]  # per-example shapes (image ones for square)
DTYPES = [np.float16, np.float32, np.float64]
_MODELS = {}


def _model(shape):
    """One small logits model per example shape (kept: attacks compile once per model)."""
    if shape not in _MODELS:
        keras.utils.set_random_seed(1)
        _MODELS[shape] = keras.Sequential([keras.Input(shape), keras.layers.Flatten(),
                                           keras.layers.Dense(8, activation="tanh"),
                                           keras.layers.Dense(4)])
    return _MODELS[shape]


@st.composite
def problems(draw, shapes=SHAPES, norms=("linf", "l2")):
    shape = draw(st.sampled_from(shapes))
    dtype = draw(st.sampled_from(DTYPES))
    batch = draw(st.integers(1, 5))
    lo = draw(st.sampled_from([0.0, -1.0, 0.25]))
    span = draw(st.sampled_from([1.0, 0.5, 2.0]))
    eps = draw(st.floats(0.01, 0.5))
    norm = draw(st.sampled_from(norms))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    x = (lo + span * rng.random((batch, *shape))).astype(dtype)
    y = rng.integers(0, 4, batch)
    return dict(shape=shape, x=x, y=y, lo=lo, hi=lo + span, eps=eps, norm=norm, seed=seed)


def _check_guarantees(p, x_adv):
    x = p["x"]
    assert x_adv.dtype == x.dtype and tuple(x_adv.shape) == x.shape
    a = np.asarray(x_adv)
    assert np.all(np.isfinite(a))
    # the bounds as the dtype represents them (x_adv is rounded to the dtype at the end)
    lo, hi = np.asarray(p["lo"], x.dtype), np.asarray(p["hi"], x.dtype)
    assert a.min() >= lo and a.max() <= hi, (a.min(), a.max(), lo, hi)
    delta = (a.astype(np.float64) - x.astype(np.float64)).reshape(len(x), -1)
    ulp = float(np.finfo(x.dtype).eps) * max(abs(p["lo"]), abs(p["hi"]))
    if p["norm"] == "linf":
        dist, tol = np.abs(delta).max(axis=1), ulp
    else:
        dist, tol = np.sqrt((delta ** 2).sum(axis=1)), ulp * np.sqrt(delta.shape[1])
    assert np.all(dist <= p["eps"] * (1 + 1e-6) + tol), (dist.max(), p["eps"], tol)


ATTACKS = {
    "fgsm": lambda m, x, y, p: attacks.fast_gradient_method(
        m, x, y, eps=p["eps"], norm=p["norm"], clip_min=p["lo"], clip_max=p["hi"],
        seed=p["seed"]),
    "pgd": lambda m, x, y, p: attacks.projected_gradient_descent(
        m, x, y, eps=p["eps"], norm=p["norm"], clip_min=p["lo"], clip_max=p["hi"], steps=3,
        seed=p["seed"]),
    "mim": lambda m, x, y, p: attacks.momentum_iterative_method(
        m, x, y, eps=p["eps"], norm=p["norm"], clip_min=p["lo"], clip_max=p["hi"], steps=3,
        seed=p["seed"]),
    "apgd": lambda m, x, y, p: attacks.apgd(
        m, x, y, eps=p["eps"], norm=p["norm"], clip_min=p["lo"], clip_max=p["hi"], steps=4,
        seed=p["seed"]),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
@SETTINGS
@given(p=problems())
def test_gradient_attacks_keep_their_guarantees(name, p):
    x_before = p["x"].copy()
    x_adv = ATTACKS[name](_model(p["shape"]), p["x"], p["y"], p)
    np.testing.assert_array_equal(p["x"], x_before)  # the input is not modified
    _check_guarantees(p, x_adv)


@SETTINGS
@given(p=problems(shapes=[(4, 4, 1), (3, 3, 2)]))
def test_square_keeps_its_guarantees(p):
    x_before = p["x"].copy()
    x_adv = attacks.square(_model(p["shape"]), p["x"], p["y"], eps=p["eps"], norm=p["norm"],
                           clip_min=p["lo"], clip_max=p["hi"], steps=5, seed=p["seed"])
    np.testing.assert_array_equal(p["x"], x_before)
    _check_guarantees(p, x_adv)


@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_model_that_ignores_x_is_refused_for_every_dtype(name, dtype):
    def constant(x, training=False):
        return tf.zeros([tf.shape(x)[0], 4], tf.float32) + tf.constant([1.0, 0.0, 0.0, 0.0])

    x = np.full((2, 3), 0.5, dtype)
    p = dict(eps=0.1, norm="linf", lo=0.0, hi=1.0, seed=0)
    with pytest.raises(ValueError, match="does not depend on the input x|ignores x"):
        ATTACKS[name](constant, x, np.array([0, 1]), p)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_labels_out_of_range_are_a_value_error_naming_y(name):
    x = np.full((2, 3), 0.5, np.float32)
    p = dict(eps=0.1, norm="linf", lo=0.0, hi=1.0, seed=0)
    with pytest.raises(ValueError, match=r"^y has labels outside \[0, 4\) \(min 0, max 7\)"):
        ATTACKS[name](_model((3,)), x, np.array([0, 7]), p)
    with pytest.raises(ValueError, match="^y has 3 labels but x has 2 examples"):
        ATTACKS[name](_model((3,)), x, np.array([0, 1, 2]), p)


@pytest.mark.parametrize("name", ["apgd", "mim", "pgd"])
def test_l2_attacks_on_float64_inputs(name):
    x = np.full((2, 3), 0.5, np.float64)
    p = dict(x=x, eps=0.1, norm="l2", lo=0.0, hi=1.0, seed=0)
    _check_guarantees(p, ATTACKS[name](_model((3,)), x, np.array([0, 1]), p))


ATTACKS_AND_SQUARE = {**ATTACKS, "square": lambda m, x, y, p: attacks.square(
    m, x, y, eps=p["eps"], norm=p["norm"], clip_min=p["lo"], clip_max=p["hi"], steps=5,
    seed=p["seed"])}


@pytest.mark.parametrize("name", sorted(ATTACKS_AND_SQUARE))
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_float16_outputs_stay_within_eps_of_x_exactly(name, norm):
    """float16 rounding of the float32 result rounds toward x: no 0.1001 at eps 0.1."""
    rng = np.random.default_rng(0)
    x = rng.random((64, 4, 4, 1)).astype(np.float16)
    p = dict(eps=0.1, norm=norm, lo=-1.0, hi=2.0, seed=0)  # loose bounds: the budget binds
    x_adv = ATTACKS_AND_SQUARE[name](_model((4, 4, 1)), x, rng.integers(0, 4, 64), p)
    assert x_adv.dtype == np.float16
    delta = (np.asarray(x_adv, np.float64) - x.astype(np.float64)).reshape(64, -1)
    dist = np.abs(delta).max(1) if norm == "linf" else np.sqrt((delta ** 2).sum(1))
    assert dist.max() <= 0.1 + 1e-6, dist.max()
    assert dist.max() > 0.05  # the attack did move x


def test_square_on_a_model_that_ignores_x_is_refused_like_the_others():
    def constant(x, training=False):
        return tf.zeros([tf.shape(x)[0], 4], tf.float32) + tf.constant([1.0, 0.0, 0.0, 0.0])

    x = np.full((2, 4, 4, 1), 0.5, np.float32)
    with pytest.raises(ValueError, match="does not depend on the input x|ignores x"):
        attacks.square(constant, x, np.array([0, 1]), eps=0.1, clip_min=0.0, clip_max=1.0,
                       steps=5, seed=0)
