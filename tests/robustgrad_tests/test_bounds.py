"""robustgrad.bounds: IBP, CROWN and CROWN-IBP on Keras models.

Soundness by sampling (random points and corners of the box never leave the bounds), exact values
computed by hand, the orderings theory guarantees, specifications, dtypes, chunking, bad input.
"""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from robustgrad import bounds as rb
from robustgrad.bounds import BoundedModel, compute_ball_bounds, compute_bounds, margin_spec

METHODS = ("ibp", "crown", "crown-ibp")
L = keras.layers


def _randomize(model, seed=0, scale=1.0):
    """Random weights (normal, scaled by fan-in) and random BatchNormalization statistics."""
    rng = np.random.default_rng(seed)
    for layer in model.layers if not hasattr(model, "_flatten_layers") else \
            model._flatten_layers(include_self=False):
        if isinstance(layer, L.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.set_weights([rng.uniform(0.5, 2.0, c), rng.normal(0, 0.5, c),
                               rng.normal(0, 0.5, c), rng.uniform(0.2, 3.0, c)])
        elif layer.weights and isinstance(layer, (L.Dense, L.Conv2D)):
            new = []
            for w in layer.get_weights():
                fan_in = int(np.prod(w.shape[:-1])) if w.ndim > 1 else 1
                new.append(rng.normal(0, scale / np.sqrt(fan_in), w.shape).astype(w.dtype))
            layer.set_weights(new)
    return model


def dense_model():
    return _randomize(keras.Sequential([
        keras.Input((6,)), L.Dense(16, activation="relu"), L.Dense(12), L.ReLU(),
        L.Dropout(0.5), L.Dense(5)]))


def conv_model():
    return _randomize(keras.Sequential([
        keras.Input((8, 8, 2)), L.Conv2D(4, 3, strides=2, padding="valid", activation="relu"),
        L.Conv2D(3, 3, padding="same"), L.ReLU(),
        L.Conv2D(4, 2, strides=2, padding="same", activation="relu"),
        L.AveragePooling2D(2, strides=1, padding="same"), L.Flatten(), L.Dense(4)]), seed=1)


def pooling_bn_model():
    return _randomize(keras.Sequential([
        keras.Input((6, 6, 1)), L.Rescaling(2.0, offset=-1.0), L.Conv2D(3, 3, padding="same"),
        L.BatchNormalization(), L.Activation("relu"), L.AveragePooling2D(2),
        L.Reshape((3, 3, 3)), L.Conv2D(5, 2), L.BatchNormalization(), L.ReLU(),
        L.GlobalAveragePooling2D(), L.Dense(3)]), seed=2)


def dense_bn_model():
    return _randomize(keras.Sequential([
        keras.Input((5,)), L.Normalization(mean=0.5, variance=0.04), L.Dense(10),
        L.BatchNormalization(), L.ReLU(), L.Dense(4)]), seed=3)


def residual_model():
    inp = keras.Input((5,))
    h = L.Dense(8, activation="relu")(inp)
    r = L.Dense(8, activation="relu")(h)
    r = L.Dense(8)(r)
    h = L.Add()([h, r])
    h = L.ReLU()(h)
    block = keras.Sequential([keras.Input((8,)), L.Dense(8, activation="relu"), L.Dense(8)])
    h = h + block(h)  # a keras.ops add and a nested model
    out = L.Dense(3)(L.Activation("relu")(h))
    return _randomize(keras.Model(inp, out), seed=4)


def conv_residual_model():
    inp = keras.Input((6, 6, 2))
    h = L.Conv2D(3, 3, padding="same", activation="relu")(inp)
    r = L.Conv2D(3, 3, padding="same", activation="relu")(h)
    h = L.Add()([h, L.Conv2D(3, 1)(r)])
    h = L.GlobalAveragePooling2D()(L.ReLU()(h))
    return _randomize(keras.Model(inp, L.Dense(4)(h)), seed=5)


def max_pooling_model():
    """Max pooling after a ReLU (2x2, valid), after a linear convolution (3x3 windows, stride 1,
    "same": overlapping, padded), with unequal windows and strides, and after zero padding."""
    return _randomize(keras.Sequential([
        keras.Input((9, 9, 2)), L.Conv2D(3, 3, padding="same", activation="relu"),
        L.MaxPooling2D(2), L.ZeroPadding2D(((1, 0), (0, 2))), L.Conv2D(4, 2, padding="same"),
        L.MaxPooling2D(3, strides=1, padding="same"), L.ReLU(),
        L.MaxPooling2D((2, 3), strides=(1, 2)), L.Flatten(), L.Dense(3)]), seed=6)


def classifier_model():
    """The layers of attacks.make_classifier's CNN (width 4, the third convolution narrower):
    3x3 "same" ReLU convolutions, two 2x2 max poolings, two dense layers."""
    conv = lambda f: L.Conv2D(f, 3, padding="same", activation="relu")  # noqa: E731
    return _randomize(keras.Sequential([
        keras.Input((8, 8, 1)), conv(4), conv(8), L.MaxPooling2D(2), conv(8), L.MaxPooling2D(2),
        L.Flatten(), L.Dense(8, activation="relu"), L.Dense(4)]), seed=7)


MODELS = {"dense": dense_model, "conv": conv_model, "pool-bn": pooling_bn_model,
          "dense-bn": dense_bn_model, "residual": residual_model,
          "conv-residual": conv_residual_model, "max-pooling": max_pooling_model,
          "classifier": classifier_model}


def _box(shape, eps, batch=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (batch, *shape)).astype(np.float32)
    return x - eps, x + eps


def _samples(lower, upper, n=2000, seed=0):
    """n uniform points and up to 256 corners of every box of the batch -> [B, n + k, ...]."""
    rng = np.random.default_rng(seed)
    b, shape = lower.shape[0], lower.shape[1:]
    u = rng.uniform(0, 1, (b, n, *shape))
    dims = int(np.prod(shape))
    if dims <= 8:
        corners = np.array(list(itertools.product([0.0, 1.0], repeat=dims))).reshape(-1, *shape)
    else:
        corners = rng.integers(0, 2, (256, *shape)).astype(np.float64)
    u = np.concatenate([u, np.broadcast_to(corners, (b, *corners.shape))], axis=1)
    return (lower[:, None] + u * (upper - lower)[:, None]).astype(np.float32)


def _outputs(model, points):
    b, m = points.shape[:2]
    out = model(points.reshape(b * m, *points.shape[2:]), training=False).numpy()
    return out.reshape(b, m, -1).astype(np.float64)


def _eager_bounds(graph, lower, upper, method, spec=None, ball=None):
    """The propagation ``BoundedModel.bounds`` and ``compute_ball_bounds`` trace (one call, no
    clip, a batch below the output chunk), run eagerly on ``graph`` (the model's
    ``rb._keras_graph.Graph``): the same rules and sums without a 5-7 s trace per setting."""
    return rb._methods.propagate(graph, tf.convert_to_tensor(lower), tf.convert_to_tensor(upper),
                                 spec, ball, method)


def _assert_contains(lb, ub, values, tol=1e-4):
    lb, ub = np.asarray(lb, np.float64), np.asarray(ub, np.float64)
    scale = tol * (1 + np.abs(values))
    assert np.all(values >= lb[:, None] - scale), float(np.max(lb[:, None] - values))
    assert np.all(values <= ub[:, None] + scale), float(np.max(values - ub[:, None]))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bounds_are_sound_by_sampling_for_every_method(name):
    model = MODELS[name]()
    shape = model.input_shape[1:]
    lower, upper = _box(shape, eps=0.15)
    values = _outputs(model, _samples(lower, upper))
    spec = margin_spec([0, 1, 2], model.output_shape[-1])
    cvalues = np.einsum("bsk,bmk->bms", spec.numpy(), values)
    widths = {}
    for method in METHODS:
        lb, ub = compute_bounds(model, lower, upper, method=method)
        assert lb.shape == ub.shape == (3, model.output_shape[-1]) and lb.dtype == tf.float32
        _assert_contains(lb.numpy().reshape(3, -1), ub.numpy().reshape(3, -1), values)
        clb, cub = compute_bounds(model, lower, upper, method=method, C=spec)
        assert clb.shape == (3, model.output_shape[-1] - 1)
        _assert_contains(clb.numpy(), cub.numpy(), cvalues)
        widths[method] = float(np.mean(ub - lb))
        # the bounds are not vacuous: a box around the sampled range, not +-inf
        assert np.all(np.isfinite(lb)) and np.all(np.isfinite(ub))
    # an unstable region: CROWN is tighter than IBP on average on these models
    assert widths["crown"] < widths["ibp"], widths


@pytest.mark.parametrize("pool,strides,padding", [((2, 2), (2, 2), "valid"),
                                                   ((3, 3), (1, 1), "same"),
                                                   ((2, 3), (1, 2), "same")])
def test_max_pooling_lines_hold_by_sampling(pool, strides, padding):
    """The relaxation's lines: every sampled point of the box has the chosen element <= the
    window's max <= the upper line (the chosen element where it dominates, else the largest
    upper bound); the dominating windows are many, and exact there."""
    from robustgrad.bounds._pooling import MaxPooling2D

    rule = MaxPooling2D("p", pool, strides, padding)
    rng = np.random.default_rng(0)
    centre = rng.normal(0, 1, (4, 7, 7, 3))
    radius = rng.uniform(0, 0.3, centre.shape) * (rng.uniform(size=centre.shape) < 0.7)
    lo, hi = tf.constant(centre - radius), tf.constant(centre + radius)
    choice, exact, top = (t.numpy() for t in rule.relaxation(lo, hi))
    assert 0.2 < exact.mean() < 1.0
    x = (centre - radius)[None] + rng.uniform(0, 1, (300, *centre.shape)) * 2 * radius[None]
    x = x.reshape(-1, *centre.shape[1:])
    windows = rule._windows(tf.constant(x)).numpy().reshape(300, *choice.shape)
    chosen = np.sum(windows * choice[None], axis=-1)
    y = tf.nn.max_pool2d(tf.constant(x), rule.ksize, rule.strides, rule.padding).numpy()
    y = y.reshape(300, *exact.shape)
    upper = np.where(exact[None] > 0, chosen, top[None])
    assert np.all(chosen <= y + 1e-12) and np.all(y <= upper + 1e-12)
    assert np.all(np.where(exact[None] > 0, y - chosen, 0.0) == 0.0)
    # the backward pass is the transpose of picking the chosen elements
    a = rng.normal(0, 1, (4, 2, *exact.shape[1:]))
    new_lo, new_hi, _, _ = rule.backward_relaxed(tf.constant(a), tf.constant(a), (lo, hi))
    xs = x[:4]  # one point per example
    picked = np.sum(rule._windows(tf.constant(xs)).numpy() * choice, axis=-1)
    lhs = np.sum(new_lo.numpy() * xs[:, None], axis=(2, 3, 4))
    rhs = np.sum(np.where(a > 0, a, a * exact[:, None]) * picked[:, None], axis=(2, 3, 4))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-10, atol=1e-10)


def test_max_pooling_crown_is_exact_where_one_element_dominates():
    # one 2x2 window; f = 2 max(x) - x0. x0 in [2, 3] dominates x1..x3 in [-1, 1]: max = x0, so
    # f = x0 and CROWN's bounds are [2, 3], where IBP's are [2 * 2 - 3, 2 * 3 - 2] = [1, 4]
    inp = keras.Input((2, 2, 1))
    double, pick = L.Dense(1, use_bias=False), L.Conv2D(1, 2, use_bias=False)
    doubled = double(L.Flatten()(L.MaxPooling2D(2)(inp)))
    model = keras.Model(inp, L.Add()([doubled, L.Flatten()(pick(inp))]))
    double.set_weights([np.array([[2.0]], "float32")])
    kernel = np.zeros((2, 2, 1, 1), "float32")
    kernel[0, 0] = -1.0
    pick.set_weights([kernel])
    lower = np.array([2.0, -1.0, -1.0, -1.0], "float32").reshape(1, 2, 2, 1)
    upper = np.array([3.0, 1.0, 1.0, 1.0], "float32").reshape(1, 2, 2, 1)
    expect = {"ibp": [1.0, 4.0], "crown": [2.0, 3.0], "crown-ibp": [2.0, 3.0]}
    for method in METHODS:
        lb, ub = compute_bounds(model, lower, upper, method=method)
        np.testing.assert_allclose([lb.numpy().item(), ub.numpy().item()], expect[method])
    # x3 in [-4, 3.5]: nothing dominates; lower line x0 (largest lower bound), upper 3.5
    lower[0, 1, 1, 0], upper[0, 1, 1, 0] = -4.0, 3.5
    lb, ub = compute_bounds(model, lower, upper, method="crown")
    np.testing.assert_allclose([lb.numpy().item(), ub.numpy().item()], [2.0, 5.0])


def test_hand_computed_values_one_hidden_layer():
    # z1 = x1 + x2 + 1 in [-1, 3], z2 = x1 - x2 - 1 in [-3, 1]; y = relu(z1) - relu(z2), x in [-1, 1]^2
    model = keras.Sequential([keras.Input((2,)), L.Dense(2, activation="relu"), L.Dense(1)])
    model.layers[0].set_weights([np.array([[1, 1], [1, -1]], "float32"),
                                 np.array([1, -1], "float32")])
    model.layers[1].set_weights([np.array([[1], [-1]], "float32"), np.zeros(1, "float32")])
    lo, hi = -np.ones((1, 2), "float32"), np.ones((1, 2), "float32")
    # IBP: relu(z1) in [0, 3], relu(z2) in [0, 1]
    lb, ub = compute_bounds(model, lo, hi, method="ibp")
    np.testing.assert_allclose([lb.numpy()[0, 0], ub.numpy()[0, 0]], [-1.0, 3.0], atol=1e-6)
    # CROWN: z1's lower slope 1 (3 > 1), upper line 3/4 z1 + 3/4; z2's lower slope 0 (1 < 3),
    # upper line z2/4 + 3/4. Lower: z1 - z2/4 - 3/4 = 3/4 x1 + 5/4 x2 + 1/2 >= -3/2.
    # Upper: 3/4 z1 + 3/4 = 3/4 (x1 + x2) + 3/2 <= 3. (Looser than IBP below: theory allows it.)
    for method in ("crown", "crown-ibp"):
        lb, ub = compute_bounds(model, lo, hi, method=method)
        np.testing.assert_allclose([lb.numpy()[0, 0], ub.numpy()[0, 0]], [-1.5, 3.0], atol=1e-6)


def test_crown_is_exact_where_ibp_suffers_from_dependency():
    # y = relu(x) - relu(x) on [1, 2]: IBP gives [-1, 1], CROWN the exact [0, 0] (doctest too)
    model = keras.Sequential([keras.Input((3,)), L.Dense(4, activation="relu"), L.Dense(4),
                              L.ReLU(), L.Dense(2)])
    w1 = np.abs(np.random.default_rng(0).normal(size=(3, 4))).astype("float32")
    w2 = np.abs(np.random.default_rng(1).normal(size=(4, 4))).astype("float32")
    w3 = np.random.default_rng(2).normal(size=(4, 2)).astype("float32")
    model.layers[0].set_weights([w1, np.ones(4, "float32")])
    model.layers[1].set_weights([w2, np.ones(4, "float32")])
    model.layers[3].set_weights([w3, np.zeros(2, "float32")])
    lower, upper = _box((3,), eps=0.3, batch=4, seed=3)
    lower, upper = np.abs(lower) + 0.01, np.abs(upper) + 0.61  # x >= 0: every ReLU active
    # every neuron is active, so the model is the linear map x @ w1 @ w2 @ w3 + c on the box
    w = w1 @ w2 @ w3
    mid, rad = (lower + upper) / 2, (upper - lower) / 2
    c = (np.ones(4) @ w2 + 1) @ w3
    exact_lo, exact_hi = mid @ w - rad @ np.abs(w) + c, mid @ w + rad @ np.abs(w) + c
    ibp = compute_bounds(model, lower, upper, method="ibp")
    for method in ("crown", "crown-ibp"):
        lb, ub = compute_bounds(model, lower, upper, method=method)
        np.testing.assert_allclose(lb, exact_lo, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ub, exact_hi, rtol=1e-5, atol=1e-5)
        # all neurons stable: CROWN(-IBP) is contained in IBP, strictly narrower here
        assert np.all(lb >= ibp[0] - 1e-5) and np.all(ub <= ibp[1] + 1e-5)
        assert np.mean(ub - lb) < 0.9 * np.mean(ibp[1] - ibp[0])


def test_linear_model_gets_exact_bounds_from_every_method_with_a_spec():
    model = _randomize(keras.Sequential([keras.Input((4, 4, 1)), L.Flatten(), L.Dense(6),
                                         L.Dense(3)]))
    lower, upper = _box((4, 4, 1), eps=0.2, batch=2)
    w0, b0 = model.layers[1].get_weights()
    w1, b1 = model.layers[2].get_weights()
    w, c = (w0 @ w1).astype(np.float64), (b0 @ w1 + b1).astype(np.float64)
    lo, hi = lower.reshape(2, -1), upper.reshape(2, -1)
    mid, rad = (lo + hi) / 2, (hi - lo) / 2
    for method in ("crown", "crown-ibp"):
        lb, ub = compute_bounds(model, lower, upper, method=method)
        np.testing.assert_allclose(lb, mid @ w - rad @ np.abs(w) + c, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ub, mid @ w + rad @ np.abs(w) + c, rtol=1e-5, atol=1e-5)
    # IBP with a spec merges it into the linear tail, which is the whole model here: exact too
    spec = margin_spec([0, 2], 3)
    ws = np.einsum("bsk,ik->bis", spec.numpy(), w)
    cs = np.einsum("bsk,k->bs", spec.numpy(), c)
    exact_lo = np.einsum("bi,bis->bs", mid, ws) - np.einsum("bi,bis->bs", rad, np.abs(ws)) + cs
    for method in METHODS:
        lb, _ = compute_bounds(model, lower, upper, method=method, C=spec)
        np.testing.assert_allclose(lb, exact_lo, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["dense", "conv", "residual"])
def test_ibp_contains_crown_ibp_when_every_relu_is_stable(name):
    # tiny boxes: IBP proves every ReLU stable, so CROWN-IBP bounds the exact linear piece
    model = MODELS[name]()
    lower, upper = _box(model.input_shape[1:], eps=1e-4, batch=4, seed=7)
    ibp = compute_bounds(model, lower, upper, method="ibp")
    g = BoundedModel(model)
    boxes = rb._engine.interval_pass(g._graph, tf.constant(lower), tf.constant(upper), tf.float32)
    for i, rule in enumerate(g._graph.rules):
        if isinstance(rule, rb._activations.ReLU):
            lo, hi = boxes[g._graph.inputs[i][0]]
            assert not np.any((lo.numpy() < 0) & (hi.numpy() > 0))
    lb, ub = compute_bounds(model, lower, upper, method="crown-ibp")
    assert np.all(lb >= ibp[0] - 1e-5) and np.all(ub <= ibp[1] + 1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_margin_spec_bounds_are_no_looser_than_subtracting_logit_bounds(method):
    # provable for IBP on any model, and for CROWN on one hidden layer (the same relaxation terms
    # regrouped: the merged spec picks, per neuron, the better of the two lines)
    model = _randomize(keras.Sequential([keras.Input((6,)), L.Dense(20, activation="relu"),
                                         L.Dense(5)]), seed=8)
    if method == "ibp":
        model = dense_model()
    lower, upper = _box((6,), eps=0.3, batch=8, seed=9)
    y = np.arange(8) % 5
    lb, ub = compute_bounds(model, lower, upper, method=method)
    clb, cub = compute_bounds(model, lower, upper, method=method, C=margin_spec(y, 5))
    others = np.array([[j for j in range(5) if j != t] for t in y])
    naive_lo = lb.numpy()[np.arange(8), y][:, None] - np.take_along_axis(ub.numpy(), others, 1)
    naive_hi = ub.numpy()[np.arange(8), y][:, None] - np.take_along_axis(lb.numpy(), others, 1)
    assert np.all(clb.numpy() >= naive_lo - 1e-5) and np.all(cub.numpy() <= naive_hi + 1e-5)
    assert np.mean(clb.numpy() - naive_lo) > 1e-3  # and strictly tighter on average


def test_margin_spec_rows():
    c = margin_spec(tf.constant([0, 2]), 3).numpy()
    np.testing.assert_array_equal(c[0], [[1, -1, 0], [1, 0, -1]])
    np.testing.assert_array_equal(c[1], [[-1, 0, 1], [0, -1, 1]])
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\)"):
        margin_spec([3], 3)
    with pytest.raises(ValueError, match="num_classes"):
        margin_spec([0], 1)


@pytest.mark.parametrize("method", METHODS)
def test_l2_ball_bounds_are_sound_and_crown_uses_the_dual_norm(method):
    model = dense_model()
    rng = np.random.default_rng(3)
    x = rng.uniform(0.2, 0.8, (3, 6)).astype(np.float32)
    eps = 0.3
    lb, ub = compute_ball_bounds(model, x, eps, norm="l2", method=method, clip_min=0.0,
                                 clip_max=1.0)
    d = rng.normal(size=(3, 3000, 6))
    d *= (eps * rng.uniform(0, 1, (3, 3000, 1)) ** (1 / 6)) / np.linalg.norm(d, axis=-1,
                                                                             keepdims=True)
    points = np.clip(x[:, None] + d, 0.0, 1.0).astype(np.float32)
    _assert_contains(lb.numpy(), ub.numpy(), _outputs(model, points))
    box_lb, box_ub = compute_ball_bounds(model, x, eps, norm="linf", method=method,
                                         clip_min=0.0, clip_max=1.0)
    # the L2 ball lies in its bounding box: never looser; CROWN strictly tighter (dual norm)
    assert np.all(lb >= box_lb - 1e-5) and np.all(ub <= box_ub + 1e-5)
    if method != "ibp":
        assert np.mean(ub - lb) < np.mean(box_ub - box_lb) - 1e-3


def test_ball_intersects_the_clip_box():
    model = keras.Sequential([keras.Input((2,)), L.Dense(1, use_bias=False)])
    model.layers[0].set_weights([np.array([[1.0], [1.0]], "float32")])
    lb, ub = compute_ball_bounds(model, [[0.0, 0.9]], 0.5, clip_min=0.0, clip_max=1.0,
                                 method="ibp")
    np.testing.assert_allclose([lb.numpy()[0, 0], ub.numpy()[0, 0]], [0.4, 1.5], atol=1e-6)


def test_float64_bounds_are_float64_and_agree_with_float32():
    model = conv_model()
    lower, upper = _box((8, 8, 2), eps=0.1, batch=2)
    for method in METHODS:
        lb32, ub32 = compute_bounds(model, lower, upper, method=method)
        lb64, ub64 = compute_bounds(model, lower.astype(np.float64), upper.astype(np.float64),
                                    method=method)
        assert lb64.dtype == ub64.dtype == tf.float64
        np.testing.assert_allclose(lb64, lb32, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ub64, ub32, rtol=1e-4, atol=1e-4)


def test_batch_chunks_and_spec_row_chunks_give_the_same_bounds(monkeypatch):
    model = conv_model()
    lower, upper = _box((8, 8, 2), eps=0.1, batch=7)
    whole = compute_bounds(BoundedModel(model), lower, upper, batch_size=None)
    parts = compute_bounds(model, lower, upper, batch_size=3)
    np.testing.assert_allclose(parts[0], whole[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(parts[1], whole[1], rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(rb._engine, "WORK_BUDGET", 8 * 7 * 3 * 128)  # a few rows per chunk
    rows = compute_bounds(BoundedModel(model), lower, upper, batch_size=None)
    np.testing.assert_allclose(rows[0], whole[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rows[1], whole[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["crown", "crown-ibp"])
def test_output_pass_in_chunks_of_examples_gives_the_same_bounds(method, monkeypatch):
    # the output's backward pass split into chunks of 2 examples (7 = 2 + 2 + 2 + 1, the last
    # zero-padded), with and without a spec, over a box and an L2 ball: the same sums per example
    model = conv_model()
    lower, upper = (b.astype(np.float64) for b in _box((8, 8, 2), eps=0.1, batch=7))
    spec = margin_spec([0, 1, 2, 3, 0, 1, 2], 4, dtype=tf.float64)
    x = (lower + upper) / 2
    widest = 8 * 8 * 2  # conv_model's widest node: its input

    graph, lo, hi, xt, e = (rb._keras_graph.Graph(model), tf.constant(lower), tf.constant(upper),
                            tf.constant(x), tf.constant(0.3, tf.float64))

    def run():
        # the propagation BoundedModel.bounds and compute_ball_bounds trace (one call each, no
        # clip: the ball's box is x -+ 0.3), run eagerly: the same sums without six traces
        return [_eager_bounds(graph, lo, hi, method, c) for c in (spec, None)] + [
            _eager_bounds(graph, xt - e, xt + e, method, spec, (xt, e))]

    whole = run()
    monkeypatch.setattr(rb._engine, "OUTPUT_CHUNK", 2 * 4 * widest)  # 2 examples of 4 rows
    backward, batches = rb._engine._backward, []

    def spy(graph, target, spec, *args, **kw):
        if target == graph.output:
            batches.append(spec.shape[0])
        return backward(graph, target, spec, *args, **kw)

    monkeypatch.setattr(rb._engine, "_backward", spy)
    chunked = run()
    assert batches == [2] * len(batches) and len(batches) >= 3, batches  # never whole
    for (a_lo, a_hi), (b_lo, b_hi) in zip(chunked, whole):
        np.testing.assert_allclose(a_lo.numpy(), b_lo.numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(a_hi.numpy(), b_hi.numpy(), rtol=1e-12, atol=1e-12)
    values = _outputs(model, _samples(lower.astype(np.float32), upper.astype(np.float32)))
    _assert_contains(*(t.numpy() for t in chunked[1]), values)


def test_traced_once_per_shape_and_model_untouched():
    model = dense_model()
    before = [w.copy() for w in model.get_weights()]
    bm = BoundedModel(model)
    for seed in range(3):
        lower, upper = _box((6,), eps=0.1, batch=4, seed=seed)
        bm.bounds(lower, upper, "crown")
    assert bm._fn.experimental_get_tracing_count() == 1
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # weights are read at call time: a model that changes is bounded with its new weights
    lower, upper = _box((6,), eps=0.0, batch=2)
    w = model.layers[-1].get_weights()
    model.layers[-1].set_weights([w[0], w[1] + 10.0])
    lb, ub = bm.bounds(lower, upper, "crown")
    np.testing.assert_allclose(lb, model(lower), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ub, model(lower), rtol=1e-5, atol=1e-4)


def test_one_bounded_model_serves_every_method_shape_and_spec_like_fresh_ones():
    """The compiled functions are looked up by shapes, method and spec: a call never gets the
    function of another call's shapes or method (each result equals the propagation run
    eagerly, with no compiled function at all)."""
    model = conv_model()
    bm = BoundedModel(model)
    # each call differs from an earlier one in one of method, batch and spec alone (and every
    # method meets both batches and both specs), so a lookup that ignored any of them would
    # hand a call an earlier call's function
    calls = [("crown", 2, False), ("crown", 3, False), ("crown", 3, True), ("ibp", 3, True),
             ("crown-ibp", 3, True), ("ibp", 2, False), ("crown-ibp", 2, False)]
    for method, batch, spec in calls:
        lower, upper = _box((8, 8, 2), eps=0.05, batch=batch, seed=batch)
        c = margin_spec(np.arange(batch) % 4, 4) if spec else None
        got = bm.bounds(lower, upper, method, c)
        want = _eager_bounds(bm._graph, lower, upper, method, c)
        assert got[0].shape == want[0].shape == ((batch, 3) if spec else (batch, 4))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_channel_dot_is_the_sum_of_products():
    rng = np.random.default_rng(0)
    for shape in ((3, 4, 5), (3, 4, 6, 7, 5)):
        a = tf.constant(rng.normal(size=shape))
        c = tf.constant(rng.normal(size=(5,)))
        want = np.sum(a.numpy() * c.numpy(), axis=tuple(range(2, len(shape))))
        np.testing.assert_allclose(rb._rules.channel_dot(a, c), want, rtol=1e-12)
    # a per-channel batch-norm offset [1, 1, C] and a full one give the same backward bias
    a = tf.constant(rng.normal(size=(2, 3, 4, 4, 5)))
    t = rng.normal(size=(1, 1, 5))
    s = rng.uniform(0.5, 2.0, size=(1, 1, 5))
    per_channel = rb._rules.Elementwise("bn", lambda dtype, rank: (tf.constant(s),
                                                                   tf.constant(t)))
    full = rb._rules.Elementwise("bn", lambda dtype, rank: (
        tf.constant(s), tf.constant(np.broadcast_to(t, (4, 4, 5)) + 0.0)))
    (a1,), b1 = per_channel.backward(a, [(4, 4, 5)], tf.float64)
    (a2,), b2 = full.backward(a, [(4, 4, 5)], tf.float64)
    np.testing.assert_allclose(a1, a2)
    np.testing.assert_allclose(b1, b2, rtol=1e-12)
    np.testing.assert_allclose(b1, np.sum(a.numpy() * t, axis=(2, 3, 4)), rtol=1e-12)


def test_xla_compiles_on_cpu_and_agrees():
    model = pooling_bn_model()
    lower, upper = _box((6, 6, 1), eps=0.1, batch=2)
    plain = BoundedModel(model).bounds(lower, upper, "crown")
    xla = BoundedModel(model, jit_compile=True).bounds(lower, upper, "crown")
    np.testing.assert_allclose(xla[0], plain[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(xla[1], plain[1], rtol=1e-4, atol=1e-5)


# -- bad input ------------------------------------------------------------------------------

def test_unsupported_layers_are_named():
    cases = [
        (keras.Sequential([keras.Input((4, 4, 1)), L.UpSampling2D(2, name="up_a"), L.Flatten(),
                           L.Dense(2)]), r"'up_a' of type UpSampling2D is not supported"),
        (keras.Sequential([keras.Input((3,)), L.Dense(4, activation="elu", name="hidden_e"),
                           L.Dense(2)]), r"'hidden_e' \(Dense\) has activation 'elu'"),
        (keras.Sequential([keras.Input((3,)), L.LeakyReLU(name="leaky")]), r"'leaky'"),
        (keras.Sequential([keras.Input((3,)), L.ReLU(max_value=6.0, name="relu6")]), r"'relu6'"),
        (keras.Sequential([keras.Input((6, 6, 1)), L.Conv2D(2, 3, dilation_rate=2, name="dil")]),
         r"'dil' \(Conv2D\) has dilation_rate"),
    ]
    for model, message in cases:
        with pytest.raises(ValueError, match=message):
            compute_bounds(model, np.zeros((1, *model.input_shape[1:]), "float32"),
                           np.ones((1, *model.input_shape[1:]), "float32"))


def test_softmax_outputs_are_refused():
    for model in (keras.Sequential([keras.Input((3,)), L.Dense(2, activation="softmax",
                                                                name="probs")]),
                  keras.Sequential([keras.Input((3,)), L.Dense(2), L.Softmax(name="probs")])):
        with pytest.raises(ValueError, match=r"'probs'.*probabilities.*Bound the logits"):
            compute_bounds(model, np.zeros((1, 3), "float32"), np.ones((1, 3), "float32"))


def test_subclassed_models_are_refused():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.d = L.Dense(2)

        def call(self, x):
            return self.d(x)

    net = Net()
    net(np.zeros((1, 3), "float32"))
    with pytest.raises(ValueError, match="not a Keras Sequential or functional model"):
        compute_bounds(net, np.zeros((1, 3), "float32"), np.ones((1, 3), "float32"))


def test_bad_arguments_raise_before_any_work():
    model = dense_model()
    lo, hi = _box((6,), eps=0.1, batch=2)
    with pytest.raises(ValueError, match="lower must be <= upper everywhere; 1 entries"):
        bad = lo.copy()
        bad[0, 0] = hi[0, 0] + 1
        compute_bounds(model, bad, hi)
    with pytest.raises(ValueError, match=r"method must be one of \('ibp', 'crown', 'crown-ibp', "
                                         r"'alpha-crown'\)"):
        compute_bounds(model, lo, hi, method="deeppoly")
    with pytest.raises(ValueError, match=r"C must have shape \[B, S, num_outputs\] = \[2, S >= 1, 5\]"):
        compute_bounds(model, lo, hi, C=np.ones((2, 3, 4), "float32"))
    with pytest.raises(ValueError, match=r"C must have shape"):
        compute_bounds(model, lo, hi, C=np.ones((3, 5), "float32"))
    with pytest.raises(ValueError, match="same shape"):
        compute_bounds(model, lo, hi[:1])
    with pytest.raises(ValueError, match="NaN or Inf"):
        compute_bounds(model, lo * np.nan, hi)
    # the wrong example shape: named, before TensorFlow's MatMul error (issue 36)
    name = model.name
    with pytest.raises(ValueError, match=rf"^lower and upper must have shape \[B, 6\] \(model "
                                         rf"'{name}' takes examples of shape \[6\]\), got "
                                         rf"\[2, 3, 2\]$"):
        compute_bounds(model, lo.reshape(2, 3, 2), hi.reshape(2, 3, 2))
    with pytest.raises(ValueError, match=r"^lower and upper must have shape \[B, 6\]"):
        compute_bounds(model, lo[:, :4], hi[:, :4], method="ibp")
    with pytest.raises(ValueError, match="eps must be a number >= 0, got -0.1"):
        compute_ball_bounds(model, lo, -0.1)
    with pytest.raises(ValueError, match="norm must be 'linf' or 'l2'"):
        compute_ball_bounds(model, lo, 0.1, norm="l1")
    with pytest.raises(ValueError, match="outside"):
        compute_ball_bounds(model, lo + 5, 0.1, clip_min=0.0, clip_max=1.0)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        compute_bounds(model, lo, hi, batch_size=0)


# -- agreement with a second implementation ---------------------------------------------------

def _numpy_relaxation(lo, hi):
    unstable = (lo < 0) & (hi > 0)
    width = np.where(unstable, hi - lo, 1.0)
    up = np.where(unstable, hi / width, (lo >= 0).astype(float))
    up_int = np.where(unstable, -lo * hi / width, 0.0)
    low = np.where(unstable, (hi > -lo).astype(float), (lo >= 0).astype(float))
    return low, up, up_int


def _numpy_mlp_bounds(weights, xl, xu, method):
    """IBP / CROWN / CROWN-IBP of one example through ReLU MLP layers [(W, b), ...], written
    from the papers' matrix form (Zhang et al. 2018, Theorem 3.2) in float64, one layer's
    pre-activation bounds after another; CROWN's hidden bounds intersected with IBP's, as the
    engine does."""
    def ibp_layer(lo, hi, w, b):
        mid, rad = (lo + hi) / 2, (hi - lo) / 2
        return mid @ w + b - rad @ np.abs(w), mid @ w + b + rad @ np.abs(w)

    def crown(k, pre):  # bounds of z_k (k 0-based) from the relaxations of z_0 .. z_{k-1}
        w, b = weights[k]
        a_lo, a_hi = w.T.copy(), w.T.copy()            # rows: outputs; columns: a_{k-1}
        c_lo, c_hi = b.copy(), b.copy()
        for j in range(k - 1, -1, -1):
            low, up, up_int = _numpy_relaxation(*pre[j])
            pos, neg = np.maximum(a_lo, 0), np.minimum(a_lo, 0)
            c_lo = c_lo + neg @ up_int
            a_lo = pos * low + neg * up
            pos, neg = np.maximum(a_hi, 0), np.minimum(a_hi, 0)
            c_hi = c_hi + pos @ up_int
            a_hi = pos * up + neg * low
            wj, bj = weights[j]
            c_lo, c_hi = c_lo + a_lo @ bj, c_hi + a_hi @ bj
            a_lo, a_hi = a_lo @ wj.T, a_hi @ wj.T
        lo = np.maximum(a_lo, 0) @ xl + np.minimum(a_lo, 0) @ xu + c_lo
        hi = np.maximum(a_hi, 0) @ xu + np.minimum(a_hi, 0) @ xl + c_hi
        return lo, hi

    ibp, lo, hi = [], xl, xu
    for w, b in weights:
        zl, zu = ibp_layer(lo, hi, w, b)
        ibp.append((zl, zu))
        lo, hi = np.maximum(zl, 0), np.maximum(zu, 0)
    if method == "ibp":
        return ibp[-1]
    pre = []
    for k in range(len(weights) - 1):
        if method == "crown-ibp" or k == 0:
            pre.append(ibp[k])
        else:
            c_lo, c_hi = crown(k, pre)
            pre.append((np.maximum(c_lo, ibp[k][0]), np.minimum(c_hi, ibp[k][1])))
    return crown(len(weights) - 1, pre)


@pytest.mark.parametrize("depth", [2, 4])
@pytest.mark.parametrize("method", METHODS)
def test_bounds_equal_an_independent_numpy_implementation(depth, method):
    keras.utils.set_random_seed(depth)
    model = keras.Sequential([keras.Input((5,))]
                             + [L.Dense(12, activation="relu") for _ in range(depth)]
                             + [L.Dense(4)])
    _randomize(model, seed=depth)
    for layer in model.layers:  # non-zero biases
        w, b = layer.get_weights()
        layer.set_weights([w, np.random.default_rng(1).normal(0, 0.3, b.shape).astype("float32")])
    weights = [tuple(v.astype(np.float64) for v in layer.get_weights()) for layer in model.layers]
    lower, upper = _box((5,), eps=0.2, batch=6, seed=depth)
    lb, ub = compute_bounds(model, lower.astype(np.float64), upper.astype(np.float64),
                            method=method)
    unstable = 0
    for i in range(6):
        ref_lo, ref_hi = _numpy_mlp_bounds(weights, lower[i].astype(np.float64),
                                           upper[i].astype(np.float64), method)
        np.testing.assert_allclose(lb[i], ref_lo, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(ub[i], ref_hi, rtol=1e-9, atol=1e-9)
        xl, xu = lower[i].astype(np.float64), upper[i].astype(np.float64)
        zl, zu = _numpy_mlp_bounds(weights[:1], xl, xu, "ibp")
        unstable += int(np.sum((zl < 0) & (zu > 0)))
    assert unstable > 0  # the relaxations were exercised


@pytest.mark.parametrize("method", METHODS)
def test_bounds_run_inside_a_tf_function_and_differentiate_to_the_weights(method):
    # what certified training needs: the margin bounds as a loss, in graph mode, with gradients
    model = conv_residual_model()
    x = tf.constant(_box((6, 6, 2), eps=0.0, batch=4)[0])
    spec = margin_spec([0, 1, 2, 3], 4)
    bounded = BoundedModel(model)

    @tf.function
    def loss_and_grads(x):
        with tf.GradientTape() as tape:
            lb, _ = bounded.bounds(x - 0.05, x + 0.05, method, spec, batch_size=None)
            loss = -tf.reduce_mean(lb)
        return lb, tape.gradient(loss, model.trainable_variables)

    lb, grads = loss_and_grads(x)
    # against the same propagation run eagerly (no second trace)
    eager_lb, _ = _eager_bounds(bounded._graph, x - 0.05, x + 0.05, method, spec)
    np.testing.assert_allclose(lb, eager_lb, rtol=1e-5, atol=1e-5)
    assert all(g is not None for g in grads)
    assert sum(float(tf.reduce_sum(tf.abs(g))) for g in grads) > 0
