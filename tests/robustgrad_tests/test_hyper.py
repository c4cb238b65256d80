"""Tests for robustgrad.hyper: SGD-HD / Adam-HD optimisers and unrolled hypergradients."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from robustgrad import hyper, meta


def _quadratic_grads(x):
    # f(x) = 0.5 * sum(a * x^2)  ->  grad = a * x
    a = np.array([1.0, 3.0, 0.5], np.float32)
    return a * x


# -- hypergradient-descent optimisers ----------------------------------------------------------
def test_sgd_hd_matches_reference_equations():
    x = keras.Variable(np.array([1.0, -2.0, 0.5], np.float32))
    opt = hyper.SGDHD(learning_rate=0.1, hypergradient_lr=0.01)
    xr, lr, prev = x.numpy().astype(np.float64), 0.1, np.zeros(3)
    for _ in range(4):
        g = _quadratic_grads(x.numpy())
        opt.apply_gradients([(tf.constant(g), x)])
        lr = lr + 0.01 * float(np.dot(g, prev))            # alpha_t = alpha + beta g_t.g_{t-1}
        xr = xr - lr * g
        prev = g
        np.testing.assert_allclose(x.numpy(), xr, rtol=1e-5, atol=1e-6)
        assert float(opt.learning_rate) == pytest.approx(lr, rel=1e-5)


def test_adam_hd_matches_reference_equations():
    x = keras.Variable(np.array([1.0, -2.0, 0.5], np.float32))
    beta, b1, b2, eps = 1e-2, 0.9, 0.999, 1e-7
    opt = hyper.AdamHD(learning_rate=0.05, hypergradient_lr=beta, beta_1=b1, beta_2=b2,
                       epsilon=eps)
    xr, lr = x.numpy().astype(np.float64), 0.05
    m = v = u = np.zeros(3)
    for t in range(1, 5):
        g = _quadratic_grads(x.numpy()).astype(np.float64)
        opt.apply_gradients([(tf.constant(g, tf.float32), x)])
        lr = lr + beta * float(np.dot(g, u))
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        u = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        xr = xr - lr * u
        np.testing.assert_allclose(x.numpy(), xr, rtol=1e-4, atol=1e-6)
        assert float(opt.learning_rate) == pytest.approx(lr, rel=1e-4)


def test_hd_optimisers_with_zero_beta_are_plain_sgd_and_adam():
    for ours, ref in ((hyper.SGDHD(0.05, hypergradient_lr=0.0), keras.optimizers.SGD(0.05)),
                      (hyper.AdamHD(0.05, hypergradient_lr=0.0), keras.optimizers.Adam(0.05))):
        a = keras.Variable(np.array([1.0, -2.0, 0.5], np.float32))
        b = keras.Variable(np.array([1.0, -2.0, 0.5], np.float32))
        for _ in range(5):
            ours.apply_gradients([(tf.constant(_quadratic_grads(a.numpy())), a)])
            ref.apply_gradients([(tf.constant(_quadratic_grads(b.numpy())), b)])
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)


def test_hd_optimiser_in_keras_fit_adapts_rate_and_round_trips_config():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 4)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)
    for opt in (hyper.SGDHD(0.001, hypergradient_lr=1e-3), hyper.AdamHD(0.001, 1e-4)):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=opt, loss="mse")
        hist = model.fit(x, y, epochs=4, batch_size=32, verbose=0).history["loss"]
        assert hist[-1] < hist[0]
        assert float(opt.learning_rate) > 0.001       # a too-small rate is increased
        clone = type(opt).from_config(opt.get_config())
        assert clone.hypergradient_lr == opt.hypergradient_lr


def test_hd_optimiser_bad_arguments():
    with pytest.raises(ValueError, match="hypergradient_lr"):
        hyper.SGDHD(0.1, hypergradient_lr=-1.0)
    with pytest.raises(TypeError, match="learning_rate"):
        hyper.SGDHD(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9))
    with pytest.raises(ValueError, match="beta_1"):
        hyper.AdamHD(beta_1=1.0)


# -- unrolled hypergradients -------------------------------------------------------------------
def _small_problem(dtype=tf.float64):
    rng = np.random.default_rng(0)
    xtr = rng.normal(size=(40, 4))
    ytr = (xtr[:, 0] + xtr[:, 1] > 0).astype(np.int64) + (xtr[:, 2] > 1).astype(np.int64)
    xva = rng.normal(size=(30, 4))
    yva = (xva[:, 0] + xva[:, 1] > 0).astype(np.int64) + (xva[:, 2] > 1).astype(np.int64)
    model = meta.mlp([4, 6, 3], activation="tanh", seed=0, dtype=dtype)
    cast = lambda a: tf.constant(a, dtype)  # noqa: E731
    return model, cast(xtr), tf.constant(ytr), cast(xva), tf.constant(yva)


def test_hypergradient_matches_finite_differences():
    model, xtr, ytr, xva, yva = _small_problem()
    batches = hyper.make_batches(40, 10, steps=6, seed=0)
    params0 = [v.numpy() for v in model.params]
    hp = hyper.HyperParams(tf.constant(math.log(0.3), tf.float64),
                           tf.constant(math.log(0.05), tf.float64))
    fn = tf.function(lambda h: hyper.hypergradient(model, params0, h, xtr, ytr, xva, yva,
                                                   batches))
    val, g = fn(hp)

    value = tf.function(lambda h: hyper.unrolled_loss(model, params0, h, xtr, ytr, xva, yva,
                                                      batches)[0])
    eps = 1e-5
    for i, name in enumerate(hyper.HyperParams._fields):
        plus = [float(h) for h in hp]
        minus = list(plus)
        plus[i] += eps
        minus[i] -= eps
        fd = (float(value(hyper.HyperParams(*map(lambda a: tf.constant(a, tf.float64), plus))))
              - float(value(hyper.HyperParams(*map(lambda a: tf.constant(a, tf.float64),
                                                   minus))))) / (2 * eps)
        assert float(getattr(g, name)) == pytest.approx(fd, rel=1e-5, abs=1e-9), name
    assert float(val) == pytest.approx(float(value(hp)), rel=1e-12)


def test_unrolled_hyper_optimisation_on_digits_lowers_validation_loss():
    model, (xtr, ytr), (xva, yva) = hyper.digits_problem(hidden=32, seed=0)
    h = hyper.UnrolledHyperOptimizer(model, xtr, ytr, xva, yva, steps=20, batch_size=64,
                                     learning_rate=0.01, weight_decay=1e-2, outer_lr=0.2)
    start = h.validation_loss()
    theta0 = model.get_weights()
    hist = h.fit(12)
    assert h.trace_count == 1
    assert h.validation_loss() < start - 0.2
    assert h.learning_rate > 0.01                       # the too-small rate was raised
    assert all(np.array_equal(a, b) for a, b in zip(theta0, model.get_weights()))
    assert np.all(np.isfinite(hist["val_loss"]))


def test_unrolled_bad_input():
    model, xtr, ytr, xva, yva = _small_problem(tf.float32)
    with pytest.raises(ValueError, match="steps"):
        hyper.UnrolledHyperOptimizer(model, xtr, ytr, xva, yva, steps=0)
    with pytest.raises(ValueError, match="x_train"):
        hyper.UnrolledHyperOptimizer(model, xtr, ytr[:10], xva, yva, steps=2)
    with pytest.raises(ValueError, match="batch_size"):
        hyper.UnrolledHyperOptimizer(model, xtr, ytr, xva, yva, steps=2, batch_size=1000)
    with pytest.raises(ValueError, match="learning_rate"):
        hyper.UnrolledHyperOptimizer(model, xtr, ytr, xva, yva, steps=2, learning_rate=0.0)
    h = hyper.UnrolledHyperOptimizer(model, xtr, ytr, xva, yva, steps=2, batch_size=10,
                                     loss=lambda logits, y: tf.reduce_sum(logits, axis=1))
    with pytest.raises(ValueError, match="scalar"):
        h.step()


def test_unrolled_non_differentiable_parameter_is_named():
    w = tf.Variable(tf.zeros([4, 3]), name="w")
    q = tf.Variable(1.0, name="quantised_gain")

    def apply(params, x):  # the gain goes through an int cast: no gradient
        return tf.matmul(x, params[0]) * tf.cast(tf.cast(params[1], tf.int32), tf.float32)

    model = meta.FunctionalModel(apply, [w, q])
    _, xtr, ytr, xva, yva = _small_problem(tf.float32)
    h = hyper.UnrolledHyperOptimizer(model, xtr, ytr, xva, yva, steps=2, batch_size=10)
    with pytest.raises(ValueError, match="quantised_gain"):
        h.step()
