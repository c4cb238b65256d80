"""robustgrad.bounds: tanh/sigmoid relaxations, the plain-stack entry and the unchecked entry.

Soundness by sampling (the lines bound the activation on its interval; thousands of points in a
box never leave the output bounds), the stack entry equal to the Keras path on the same weights,
gradients w.r.t. the weights against central finite differences (float64).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from robustgrad import bounds as rb
from robustgrad.bounds import _activations as ra

METHODS = ("ibp", "crown", "crown-ibp")
L = keras.layers
FNS = {"tanh": np.tanh, "sigmoid": lambda z: 1 / (1 + np.exp(-z))}


def _intervals(seed=0):
    """(lo, hi) pairs of every case: convex, concave, crossing (both chord and tangent), narrow,
    wide."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0, 3, 4000), rng.normal(0, 3, 4000)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    narrow = rng.normal(0, 2, 200)
    lo = np.concatenate([lo, narrow, [-8.0, -0.1, 0.0, -1e-3, -20.0]])
    hi = np.concatenate([hi, narrow + rng.uniform(0, 2e-6, 200), [8.0, 0.1, 1e-3, 0.0, 20.0]])
    return lo, hi


@pytest.mark.parametrize("name", ["tanh", "sigmoid"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_s_shaped_lines_bound_the_activation_on_the_interval(name, dtype):
    lo, hi = _intervals()
    rule = ra.ACTIVATIONS[name](name)
    ls, li, us, ui = (t.numpy().astype(np.float64)
                      for t in rule.relaxation(tf.constant(lo, dtype), tf.constant(hi, dtype)))
    lo, hi = lo.astype(dtype).astype(np.float64), hi.astype(dtype).astype(np.float64)
    t = np.linspace(0, 1, 501)[:, None]
    z = lo + t * (hi - lo)  # 501 points of each of ~4200 intervals, the ends included
    f = FNS[name](z)
    tol = 2e-6 if dtype == np.float32 else 1e-12
    assert np.all(ls * z + li <= f + tol), np.max(ls * z + li - f)
    assert np.all(us * z + ui >= f - tol), np.max(f - us * z - ui)
    crossing = (lo < -0.5) & (hi > 0.5)
    assert crossing.sum() > 500  # the bisection case was exercised
    # tight where the theory says: the crossing upper line is the chord, or a tangent through
    # (l, f(l)), or the tangent at the midpoint (when that is a bound too)
    mid = (lo + hi) / 2
    touches = np.minimum.reduce([np.abs(FNS[name](lo) - (us * lo + ui)),
                                 np.abs(FNS[name](hi) - (us * hi + ui)),
                                 np.abs(FNS[name](mid) - (us * mid + ui))])
    assert np.all(touches[crossing] < (1e-5 if dtype == np.float32 else 1e-9))
    at_mid = np.abs(FNS[name](mid) - (us * mid + ui)) < 1e-9
    assert 0 < np.sum(at_mid & crossing) < np.sum(crossing)  # both tangent kinds were used


def test_relu_relaxation_is_unchanged_and_exact_where_stable():
    lo = tf.constant([-2.0, 1.0, -3.0, -1.0])
    hi = tf.constant([1.0, 2.0, -1.0, 3.0])
    ls, li, us, ui = (t.numpy().tolist() for t in ra.ReLU("r").relaxation(lo, hi))
    assert ls == [0.0, 1.0, 0.0, 1.0] and li == [0.0] * 4
    np.testing.assert_allclose(us, [1 / 3, 1.0, 0.0, 0.75])
    np.testing.assert_allclose(ui, [2 / 3, 0.0, 0.0, 0.75])


def _mlp(activation, sizes=(4, 12, 10, 3), seed=0):
    rng = np.random.default_rng(seed)
    ws = [rng.normal(0, 1.5 / np.sqrt(a), (a, b)).astype(np.float32)
          for a, b in zip(sizes[:-1], sizes[1:])]
    bs = [rng.normal(0, 0.3, b).astype(np.float32) for b in sizes[1:]]
    model = keras.Sequential([keras.Input((sizes[0],))] + [
        L.Dense(b, activation=activation if k < len(ws) - 1 else None)
        for k, b in enumerate(sizes[1:])])
    for layer, w, b in zip(model.layers, ws, bs):
        layer.set_weights([w, b])
    return model, ws, bs


def _points(lower, upper, n=3000, seed=0):
    rng = np.random.default_rng(seed)
    b, d = lower.shape
    u = rng.uniform(0, 1, (b, n, d))
    corners = rng.integers(0, 2, (b, 256, d)).astype(np.float64)
    u = np.concatenate([u, corners], 1)
    return (lower[:, None] + u * (upper - lower)[:, None]).astype(np.float32)


def _box(d, eps, batch=4, seed=1):
    x = np.random.default_rng(seed).uniform(-1, 1, (batch, d)).astype(np.float32)
    return x - eps, x + eps


@pytest.mark.parametrize("activation,method", [("tanh", "ibp"), ("tanh", "crown-ibp"),
                                               ("tanh", "crown"), ("sigmoid", "crown")])
def test_keras_models_with_s_shaped_activations_are_sound_by_sampling(activation, method):
    model, _, _ = _mlp(activation)
    lower, upper = _box(4, 0.4)
    lb, ub = rb.compute_bounds(model, lower, upper, method=method)
    pts = _points(lower, upper)
    out = model(pts.reshape(-1, 4)).numpy().reshape(pts.shape[0], pts.shape[1], -1)
    assert np.all(out >= lb.numpy()[:, None] - 1e-5)
    assert np.all(out <= ub.numpy()[:, None] + 1e-5)
    spec = rb.margin_spec([0, 1, 2, 0], 3)
    mlb, mub = rb.compute_bounds(model, lower, upper, method=method, C=spec)
    margins = np.einsum("bsk,bnk->bns", spec.numpy(), out)
    assert np.all(margins >= mlb.numpy()[:, None] - 1e-5)
    assert np.all(margins <= mub.numpy()[:, None] + 1e-5)


def test_crown_is_tighter_than_ibp_on_a_tanh_network():
    model, _, _ = _mlp("tanh", sizes=(4, 32, 32, 3))
    lower, upper = _box(4, 0.3, batch=8)
    widths = {m: np.mean(np.subtract(*rb.compute_bounds(model, lower, upper, method=m)[::-1]))
              for m in METHODS}
    assert widths["crown"] < widths["crown-ibp"] < widths["ibp"], widths


def test_conv_sigmoid_model_is_sound():
    model = keras.Sequential([keras.Input((6, 6, 1)), L.Conv2D(3, 3, activation="sigmoid"),
                              L.Activation("tanh"), L.Flatten(), L.Dense(2)])
    lower = np.random.default_rng(0).uniform(0, 1, (2, 6, 6, 1)).astype(np.float32)
    upper = lower + 0.2
    for method in METHODS:
        lb, ub = rb.compute_bounds(model, lower, upper, method=method)
        pts = lower[:, None] + np.random.default_rng(1).uniform(0, 1, (2, 2000, 6, 6, 1)) * 0.2
        out = model(pts.reshape(-1, 6, 6, 1).astype(np.float32)).numpy().reshape(2, 2000, 2)
        assert np.all(out >= lb.numpy()[:, None] - 1e-5)
        assert np.all(out <= ub.numpy()[:, None] + 1e-5)


@pytest.mark.parametrize("activation,method", [("relu", "ibp"), ("relu", "crown"),
                                               ("tanh", "ibp"), ("tanh", "crown-ibp"),
                                               ("tanh", "crown")])
def test_stack_entry_equals_the_keras_path_on_the_same_weights(activation, method):
    model, ws, bs = _mlp(activation)
    lower, upper = _box(4, 0.3)
    keras_b = rb.compute_bounds(model, lower, upper, method=method)
    stack_b = rb.affine_stack_bounds(ws, bs, activation, lower, upper, method=method)
    for k, s in zip(keras_b, stack_b):
        np.testing.assert_allclose(s, k, rtol=1e-6, atol=1e-6)
    spec = rb.margin_spec([2, 1, 0, 1], 3)
    keras_m = rb.compute_bounds(model, lower, upper, method=method, C=spec)
    variables = [tf.Variable(w) for w in ws]  # tf.Variables as in agents.core.networks.MLP
    stack_m = rb.affine_stack_bounds(variables, bs, [activation, activation], lower, upper,
                                     method=method, C=spec)
    for k, s in zip(keras_m, stack_m):
        np.testing.assert_allclose(s, k, rtol=1e-6, atol=1e-6)


def test_stack_entry_traces_with_an_unknown_batch_and_differentiates_to_the_weights():
    _, ws, bs = _mlp("tanh")
    wv, bv = [tf.Variable(w) for w in ws], [tf.Variable(b) for b in bs]
    lower, upper = _box(4, 0.2, batch=37)  # two chunks of 32, padded

    @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None, 4])])
    def loss_and_grads(lo, hi):
        with tf.GradientTape() as tape:
            lb, ub = rb.affine_stack_bounds(wv, bv, "tanh", lo, hi, method="crown-ibp")
            loss = tf.reduce_sum(ub) - 2.0 * tf.reduce_sum(lb)  # reaches the last bias too
        return lb, tape.gradient(loss, wv + bv)

    lb, grads = loss_and_grads(lower, upper)
    eager = rb.affine_stack_bounds(ws, bs, "tanh", lower, upper, method="crown-ibp")[0]
    np.testing.assert_allclose(lb, eager, rtol=1e-5, atol=1e-6)
    assert all(g is not None and float(tf.reduce_sum(tf.abs(g))) > 0 for g in grads)


@pytest.mark.parametrize("activation,method", [("relu", "ibp"), ("relu", "crown-ibp"),
                                               ("relu", "crown"), ("tanh", "ibp"),
                                               ("tanh", "crown-ibp"), ("tanh", "crown"),
                                               ("sigmoid", "crown")])
def test_stack_bound_gradients_match_finite_differences(activation, method):
    _, ws, bs = _mlp(activation, sizes=(3, 6, 5, 2), seed=4)
    ws = [w.astype(np.float64) for w in ws]
    bs = [b.astype(np.float64) for b in bs]
    lower, upper = (t.astype(np.float64) for t in _box(3, 0.5, batch=2, seed=5))
    spec = rb.margin_spec([0, 1], 2, dtype=tf.float64)
    rng = np.random.default_rng(6)
    dirs = [rng.normal(size=w.shape) for w in ws] + [rng.normal(size=b.shape) for b in bs]

    def value(t):
        w = [a + t * d for a, d in zip(ws, dirs[:3])]
        b = [a + t * d for a, d in zip(bs, dirs[3:])]
        lb, ub = rb.affine_stack_bounds(w, b, activation, lower, upper, method=method, C=spec)
        return tf.reduce_sum(lb) - 0.5 * tf.reduce_sum(ub)

    t0 = tf.constant(0.0, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(t0)
        v = value(t0)
    auto = float(tape.gradient(v, t0))
    h = 1e-6
    fd = (float(value(tf.constant(h, tf.float64)))
          - float(value(tf.constant(-h, tf.float64)))) / (2 * h)
    assert abs(auto - fd) <= 1e-5 * (1 + abs(fd)), (auto, fd)


def test_stack_entry_rejects_bad_structure_before_any_work():
    w = [np.ones((2, 3), "float32"), np.ones((3, 1), "float32")]
    lo, hi = np.zeros((1, 2), "float32"), np.ones((1, 2), "float32")
    cases = [
        (dict(weights=[]), "weights must hold at least one"),
        (dict(biases=[None]), "biases must have one entry"),
        (dict(activations=["relu"] * 3), "activations must name 1 .* or 2"),
        (dict(activations="elu"),
         r"activations must be among \('relu', 'tanh', 'sigmoid', 'linear'\)"),
        (dict(weights=[np.ones((3, 3), "float32"), w[1]]),
         r"weights\[0\] must have shape \[2, out\]"),
        (dict(biases=[np.ones(2, "float32"), None]), r"biases\[0\] must have shape \[3\]"),
        (dict(method="alpha"), "method must be one of"),
        (dict(C=np.ones((1, 1, 2), "float32")), r"C must have shape \[B, S, 1\]"),
        (dict(lower_only=True), r"lower_only needs a specification C"),
    ]
    for change, message in cases:
        kwargs = dict(weights=w, biases=[None, None], activations="relu", lower=lo, upper=hi,
                      method="crown", C=None, lower_only=False)
        kwargs.update(change)
        with pytest.raises(ValueError, match=message):
            rb.affine_stack_bounds(**kwargs)


def test_unchecked_entry_equals_the_checked_one_inside_a_compiled_step():
    model, _, _ = _mlp("relu")
    lower, upper = _box(4, 0.3, batch=5)
    spec = rb.margin_spec([0, 1, 2, 0, 1], 3)
    step = tf.function(lambda lo, hi, c: rb.compute_bounds_unchecked(model, lo, hi, "crown", c),
                       input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None, 4]),
                                        tf.TensorSpec([None, 2, 3])])
    got = step(lower, upper, spec)
    want = rb.compute_bounds(model, lower, upper, method="crown", C=spec)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)



@pytest.mark.parametrize("method", METHODS)
def test_lower_only_bounds_equal_the_lower_half_of_the_full_ones(method):
    model = keras.Sequential([keras.Input((6, 6, 1)), L.Conv2D(3, 3, activation="relu"),
                              L.Flatten(), L.Dense(8, activation="tanh"), L.Dense(3)])
    lower = np.random.default_rng(0).uniform(0, 1, (4, 6, 6, 1)).astype(np.float32)
    upper = lower + 0.1
    spec = rb.margin_spec([0, 1, 2, 0], 3)
    full = rb.compute_bounds(model, lower, upper, method=method, C=spec)
    lb, ub = rb.compute_bounds_unchecked(model, tf.constant(lower), tf.constant(upper), method,
                                         spec, bound_upper=False)
    assert ub is None
    np.testing.assert_allclose(lb, full[0], rtol=1e-6, atol=1e-6)


def test_the_tangent_table_brackets_the_tangent_point_of_every_far_end():
    # h(d) = tanh(d) + tanh'(d) (p - d) - tanh(p), increasing in d >= 0, is 0 at the point d(p)
    # whose tangent passes through (p, tanh(p)): the upper end D[k] (p >= -k step) must have
    # h >= 0 (a sound tangent point), the lower end D[k - 1] (p <= -(k - 1) step) h <= 0 up to
    # its float32 rounding; checked in float64 at far ends off the grid, the ends included
    table = ra.tangent_table().astype(np.float64)
    step = ra._TABLE_STEP
    assert table[0] == 0.0 and np.all(np.diff(table) > 0)
    rng = np.random.default_rng(0)
    p = -np.concatenate([rng.uniform(0, ra._TABLE_RANGE, 20000), [step, ra._TABLE_RANGE]])
    k = np.ceil(-p / step).astype(int)

    def h(d):
        t = np.tanh(d)
        return t + (1 - t * t) * (p - d) - np.tanh(p)

    assert np.all(h(table[k]) >= 0)
    lower = table[k - 1]
    assert np.all(h(np.nextafter(lower.astype(np.float32), np.float32(-np.inf))
                    .astype(np.float64)) <= 0)
    assert np.max(table[k] - lower) < 1e-3  # the bracket the bisection starts from
