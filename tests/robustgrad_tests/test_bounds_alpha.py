"""alpha-CROWN (``method="alpha-crown"``): soundness by sampling, never looser than CROWN, the known
optimum of one unstable ReLU, options, chunking, tracing."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_bounds import MODELS, _assert_contains, _box, _eager_bounds, _outputs, _samples

from robustgrad import bounds as rb
from robustgrad.bounds import (
    BoundedModel,
    compute_ball_bounds,
    compute_bounds,
    compute_bounds_unchecked,
    margin_spec,
)

L = keras.layers


def _one_relu(c):
    """``relu(x) + c x`` on a scalar ``x``: one ReLU, whose best lower slope on ``[l, u]`` (with
    ``-1 <= c <= 0``) is ``-c``, giving the exact minimum 0."""
    inp = keras.Input((1,))
    relu = L.Dense(1, activation="relu")
    lin = L.Dense(1, use_bias=False)
    model = keras.Model(inp, L.Add()([relu(inp), lin(inp)]))
    relu.set_weights([np.ones((1, 1), "float32"), np.zeros(1, "float32")])
    lin.set_weights([np.full((1, 1), c, "float32")])
    return model


def test_one_unstable_relu_reaches_the_known_optimum():
    lo, hi = np.array([[-1.0]], "float32"), np.array([[2.0]], "float32")
    model = _one_relu(0.0)  # relu(x) on [-1, 2]: CROWN's slope 1 (u > -l) gives -1; slope 0 gives 0
    clb, cub = compute_bounds(model, lo, hi, "crown")
    alb, aub = compute_bounds(model, lo, hi, "alpha-crown")
    assert float(clb[0, 0]) == pytest.approx(-1.0, abs=1e-6)
    assert float(alb[0, 0]) == pytest.approx(0.0, abs=1e-6)  # the exact minimum
    assert float(aub[0, 0]) == pytest.approx(2.0, abs=1e-6) == float(cub[0, 0])  # chord: exact
    # relu(x) - x/4: the lower bound (alpha - 1/4) l or (alpha - 1/4) u peaks at alpha = 1/4 with
    # 0, the true minimum; CROWN (alpha = 1) gives -3/4. The best of Adam's iterates must close
    # at least 90% of the gap, and no sound bound exceeds the minimum.
    model = _one_relu(-0.25)
    clb, _ = compute_bounds(model, lo, hi, "crown")
    alb, _ = compute_bounds(model, lo, hi, "alpha-crown")
    assert float(clb[0, 0]) == pytest.approx(-0.75, abs=1e-6)
    assert -0.075 <= float(alb[0, 0]) <= 1e-6


@pytest.mark.parametrize("name", ["dense", "conv",
                                  pytest.param("residual", marks=pytest.mark.slow),
                                  pytest.param("pool-bn", marks=pytest.mark.slow),
                                  pytest.param("classifier", marks=pytest.mark.slow)])
def test_alpha_crown_is_sound_and_never_looser_than_crown(name):
    model = MODELS[name]()
    lower, upper = _box(model.input_shape[1:], eps=0.15)
    values = _outputs(model, _samples(lower, upper))
    spec = margin_spec([0, 1, 2], model.output_shape[-1])
    cvalues = np.einsum("bsk,bmk->bms", spec.numpy(), values)
    gains = []
    graph = rb._keras_graph.Graph(model)
    for c, vals in ((None, values), (spec, cvalues)):
        # CROWN's bounds: its propagation run eagerly (alpha-CROWN's are the traced ones)
        clb, cub = _eager_bounds(graph, lower, upper, "crown", c)
        alb, aub = compute_bounds(model, lower, upper, "alpha-crown", c)
        assert alb.shape == clb.shape and alb.dtype == tf.float32
        _assert_contains(alb.numpy().reshape(3, -1), aub.numpy().reshape(3, -1), vals)
        np.testing.assert_array_less(clb.numpy() - 1e-5, alb.numpy())  # never looser
        np.testing.assert_array_less(aub.numpy(), cub.numpy() + 1e-5)
        gains.append(float(np.mean(alb - clb) + np.mean(cub - aub)))
    assert max(gains) > 1e-3, gains  # these boxes have unstable ReLUs: the slopes help


def test_l2_ball_and_float64_are_sound():
    model = MODELS["dense"]()
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (3, 6))
    lb, ub = compute_ball_bounds(model, x, 0.4, norm="l2", method="alpha-crown")
    clb, _ = compute_ball_bounds(model, x, 0.4, norm="l2", method="crown")
    assert lb.dtype == tf.float64
    d = rng.normal(size=(3, 3000, 6))
    d *= 0.4 * rng.uniform(0, 1, (3, 3000, 1)) ** (1 / 6) / np.linalg.norm(d, axis=-1,
                                                                           keepdims=True)
    _assert_contains(lb.numpy(), ub.numpy(), _outputs(model, (x[:, None] + d).astype("float32")))
    assert np.all(lb.numpy() >= clb.numpy() - 1e-9)


def test_first_iteration_is_crown_and_more_iterations_never_loosen():
    model = MODELS["dense"]()
    lower, upper = _box((6,), eps=0.2)
    crown = compute_bounds(model, lower, upper, "crown")
    one = compute_bounds(model, lower, upper, "alpha-crown", iterations=1)
    np.testing.assert_allclose(one[0], crown[0], atol=1e-5)
    np.testing.assert_allclose(one[1], crown[1], atol=1e-5)
    # the iterates do not depend on the count (the rate decays per step), so the best of 12 is
    # the best of the first 5 or better, element by element
    five = compute_bounds(model, lower, upper, "alpha-crown", iterations=5)
    twelve = compute_bounds(model, lower, upper, "alpha-crown", iterations=12)
    assert np.all(twelve[0].numpy() >= five[0].numpy() - 1e-6)
    assert np.all(twelve[1].numpy() <= five[1].numpy() + 1e-6)


def test_networks_without_relus_get_crowns_bounds():
    model = keras.Sequential([keras.Input((4,)), L.Dense(6, activation="tanh"), L.Dense(3)])
    lower, upper = _box((4,), eps=0.3)
    crown = compute_bounds(model, lower, upper, "crown")
    alpha = compute_bounds(model, lower, upper, "alpha-crown")
    np.testing.assert_array_equal(crown[0], alpha[0])
    np.testing.assert_array_equal(crown[1], alpha[1])


def test_chunks_give_the_same_bounds_and_one_trace(monkeypatch):
    model = MODELS["dense"]()
    bm = BoundedModel(model)
    lower, upper = _box((6,), eps=0.2, batch=4)
    spec = margin_spec([0, 1, 2, 3], 5)
    whole = bm.bounds(lower, upper, "alpha-crown", spec, batch_size=None)
    again = bm.bounds(lower, upper, "alpha-crown", spec, batch_size=None)
    assert bm._fn.experimental_get_tracing_count() == 1  # the loop is in the graph
    np.testing.assert_array_equal(whole[0], again[0])
    monkeypatch.setattr(rb._alpha, "COEFFICIENT_BUDGET", 1)  # the slopes' limit: 1 per call
    assert rb._alpha.chunk_limit(bm._graph, (6,), tf.float32, 4) == 1
    chunked = bm.bounds(lower, upper, "alpha-crown", spec, batch_size=256)
    np.testing.assert_allclose(chunked[0], whole[0], atol=1e-5)
    np.testing.assert_allclose(chunked[1], whole[1], atol=1e-5)


def test_unchecked_entry_inside_tf_function_with_an_unknown_batch():
    model = MODELS["dense"]()
    lower, upper = _box((6,), eps=0.2)
    spec = margin_spec([0, 1, 2], 5)
    step = tf.function(lambda lo, hi, c: compute_bounds_unchecked(model, lo, hi, "alpha-crown",
                                                                  c, bound_upper=False),
                       input_signature=[tf.TensorSpec([None, 6]), tf.TensorSpec([None, 6]),
                                        tf.TensorSpec([None, 4, 5])])
    lb, ub = step(lower, upper, spec)
    assert ub is None
    expected, _ = compute_bounds(model, lower, upper, "alpha-crown", spec)
    np.testing.assert_allclose(lb, expected, atol=1e-5)


def test_networks_too_wide_for_dense_slopes_are_refused(monkeypatch):
    model = MODELS["dense"]()
    lower, upper = _box((6,), eps=0.1)
    need = rb._alpha.elements_per_example(rb._bounded(model)._graph, (6,), tf.float32, None)
    monkeypatch.setattr(rb._alpha, "MAX_ELEMENTS", need - 1)
    with pytest.raises(ValueError, match=r"method='alpha-crown' would hold about .* elements per "
                                         r"example .* use method='crown'"):
        compute_bounds(model, lower, upper, "alpha-crown", batch_size=None)


@pytest.mark.parametrize("kw, match", [
    ({"iterations": 0}, r"iterations must be an int >= 1, got 0"),
    ({"lr": 0.0}, r"lr must be a number > 0, got 0.0"),
    ({"lr_decay": 1.5}, r"lr_decay must be a number in \(0, 1\], got 1.5"),
    ({"method": "alpha"}, r"method must be one of \('ibp', 'crown', 'crown-ibp', 'alpha-crown'\)"),
])
def test_bad_options_raise_naming_the_argument(kw, match):
    model = MODELS["dense"]()
    lower, upper = _box((6,), eps=0.1)
    kw = {"method": "alpha-crown", **kw}
    with pytest.raises(ValueError, match=match):
        compute_bounds(model, lower, upper, **kw)
