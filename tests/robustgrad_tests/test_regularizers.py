"""Tests for robustgrad.regularizers: closed forms on linear models, second-order gradients."""

import doctest

import keras
import numpy as np
import pytest
import tensorflow as tf

from robustgrad import regularizers


class Linear(tf.Module):
    """logits = x @ W (x flattened)."""

    def __init__(self, w):
        super().__init__()
        self.w = tf.Variable(np.asarray(w, np.float32), name="w")

    def __call__(self, x, training=False):
        return tf.reshape(x, [tf.shape(x)[0], -1]) @ self.w


RNG = np.random.default_rng(0)
D, C, B = 5, 3, 6
W0 = RNG.normal(size=(D, C)).astype(np.float32)
X = tf.constant(RNG.normal(size=(B, D)).astype(np.float32))
Y = tf.constant(RNG.integers(0, C, size=B), tf.int64)


def test_docstring_examples():
    assert doctest.testmod(regularizers, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0


def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _ce_input_grads(w, x, y):
    p = _softmax(x @ w)
    return (p - np.eye(w.shape[1])[y]) @ w.T  # row i: W (p_i - e_yi)


def _grads_ok(grads):
    assert all(g is not None for g in grads)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)


def _directional_check(penalty_fn, var, seed=0, eps=1e-2):
    """Central finite difference of penalty along a random direction vs the tape gradient."""
    d = np.random.default_rng(seed).normal(size=var.shape).astype(np.float32)
    with tf.GradientTape() as tape:
        p = penalty_fn()
    g = tape.gradient(p, var)
    w = var.numpy()
    var.assign(w + eps * d)
    plus = float(penalty_fn())
    var.assign(w - eps * d)
    minus = float(penalty_fn())
    var.assign(w)
    fd = (plus - minus) / (2 * eps)
    np.testing.assert_allclose(float(np.sum(np.asarray(g) * d)), fd, rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("norm", [2, 1, np.inf])
def test_input_gradient_penalty_linear_closed_form(norm):
    model = Linear(W0)
    g = _ce_input_grads(W0, X.numpy(), Y.numpy())
    expected = np.mean(np.linalg.norm(g, ord=norm, axis=1) ** 2)
    with tf.GradientTape() as tape:
        p = regularizers.input_gradient_penalty(model, X, Y, norm=norm)
    assert p.dtype == tf.float32 and p.shape == ()
    np.testing.assert_allclose(float(p), expected, rtol=1e-5)
    _grads_ok(tape.gradient(p, [model.w]))


def test_input_gradient_penalty_second_order_matches_finite_difference():
    model = Linear(W0)
    _directional_check(lambda: regularizers.input_gradient_penalty(model, X, Y), model.w)


def test_input_gradient_penalty_one_hot_and_callable_loss():
    model = Linear(W0)
    onehot = tf.one_hot(Y, C)
    a = regularizers.input_gradient_penalty(model, X, Y)
    b = regularizers.input_gradient_penalty(model, X, onehot)
    c = regularizers.input_gradient_penalty(model, X, Y, loss=regularizers.crossentropy)
    np.testing.assert_allclose([float(b), float(c)], [float(a)] * 2, rtol=1e-6)
    # loss = sum(logits) per example: input gradient W @ 1 for every row
    p = regularizers.input_gradient_penalty(model, X, Y, loss=lambda z, y: tf.reduce_sum(z, axis=1))
    np.testing.assert_allclose(float(p), np.sum((W0 @ np.ones(C)) ** 2), rtol=1e-5)


def test_regularizers_on_keras_cnn_have_second_order_grads():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="tanh"),
                              keras.layers.Flatten(), keras.layers.Dense(10)])
    x = tf.random.stateless_uniform((4, 8, 8, 1), seed=[0, 1])
    y = tf.constant([0, 1, 2, 3])
    with tf.GradientTape(persistent=True) as tape:
        terms = [regularizers.input_gradient_penalty(model, x, y),
                 regularizers.jacobian_penalty(model, x, num_projections=2, seed=1),
                 regularizers.curvature_penalty(model, x, y, h=0.1),
                 regularizers.gradient_penalty(lambda z, training=False: model(z)[:, 0], x, x[::-1], seed=2)]
    # the output bias cannot change an input derivative: it is (correctly) unconnected
    for t in terms:
        assert t.dtype == tf.float32 and t.shape == ()
        _grads_ok(tape.gradient(t, model.trainable_variables[:-1]))


def test_jacobian_penalty_exact_for_scaled_identity():
    s = 3.0
    model = Linear(s * np.eye(4))
    x = tf.constant(RNG.normal(size=(5, 4)).astype(np.float32))
    for n in (1, 3):
        p = regularizers.jacobian_penalty(model, x, num_projections=n, seed=7)
        np.testing.assert_allclose(float(p), 4 * s ** 2, rtol=1e-5)  # ||J||_F^2 = C s^2


def test_jacobian_penalty_unbiased_on_linear_model():
    model = Linear(W0)
    x = tf.zeros((512, D))
    p = regularizers.jacobian_penalty(model, x, num_projections=4, seed=3)
    np.testing.assert_allclose(float(p), np.sum(W0 ** 2), rtol=0.1)
    with tf.GradientTape() as tape:
        p = regularizers.jacobian_penalty(model, x[:8], seed=3)
    _grads_ok(tape.gradient(p, [model.w]))
    # determinism: same int seed -> same value; a Generator works
    a = regularizers.jacobian_penalty(model, x[:8], seed=3)
    np.testing.assert_array_equal(float(a), float(p))
    regularizers.jacobian_penalty(model, x[:8], seed=tf.random.Generator.from_seed(1))


class LinearCritic(tf.Module):
    def __init__(self, u):
        super().__init__()
        self.u = tf.Variable(np.asarray(u, np.float32))

    def __call__(self, x, training=False):
        return tf.reduce_sum(x * self.u, axis=[1, 2, 3])


def test_gradient_penalty_zero_for_unit_gradient_critic():
    u = RNG.normal(size=(8, 8, 1)).astype(np.float32)
    real = tf.random.stateless_uniform((6, 8, 8, 1), seed=[1, 1])
    fake = tf.random.stateless_uniform((6, 8, 8, 1), seed=[2, 2])
    critic = LinearCritic(u / np.linalg.norm(u))
    with tf.GradientTape() as tape:
        p = regularizers.gradient_penalty(critic, real, fake, seed=0)
    assert abs(float(p)) < 1e-10
    _grads_ok(tape.gradient(p, [critic.u]))
    critic2 = LinearCritic(2 * u / np.linalg.norm(u))
    with tf.GradientTape() as tape:
        p2 = regularizers.gradient_penalty(critic2, real, fake, seed=0)
    np.testing.assert_allclose(float(p2), 1.0, rtol=1e-5)
    # d/du (||u|| - 1)^2 = 2 (||u|| - 1) u / ||u|| = u when ||u|| = 2
    np.testing.assert_allclose(tape.gradient(p2, critic2.u), critic2.u.numpy(), rtol=1e-4)
    np.testing.assert_allclose(
        float(regularizers.gradient_penalty(critic2, real, fake, seed=0, target=2.0)), 0.0, atol=1e-8)


def test_gradient_penalty_reaches_generator_and_is_seeded():
    critic = lambda x, training=False: tf.reduce_sum(tf.tanh(x), axis=[1, 2, 3])
    real = tf.random.stateless_uniform((4, 8, 8, 1), seed=[1, 1])
    z = tf.Variable(tf.random.stateless_uniform((4, 8, 8, 1), seed=[3, 3]))
    with tf.GradientTape() as tape:
        p = regularizers.gradient_penalty(critic, real, 2.0 * z, seed=5)
    _grads_ok([tape.gradient(p, z)])
    np.testing.assert_array_equal(float(p), float(regularizers.gradient_penalty(critic, real, 2.0 * z,
                                                                                seed=5)))


def test_curvature_penalty_quadratic_closed_form():
    model = Linear(W0)
    h = 0.3
    half_sq = lambda z, y: 0.5 * tf.reduce_sum(tf.square(z), axis=1)
    a = W0 @ W0.T
    x = X.numpy()
    g = x @ a  # grad of 0.5 ||x W||^2 = W W^T x
    for direction, d in (("sign", np.sign(g)), ("normalized", g)):
        z = d / np.linalg.norm(d, axis=1, keepdims=True)
        expected = np.mean(np.sum((h * z @ a) ** 2, axis=1))
        p = regularizers.curvature_penalty(model, X, Y, h=h, loss=half_sq, direction=direction)
        np.testing.assert_allclose(float(p), expected, rtol=1e-4)
    # a loss linear in the logits has zero curvature
    lin = lambda z, y: tf.reduce_sum(z, axis=1)
    assert float(regularizers.curvature_penalty(model, X, Y, h=h, loss=lin)) < 1e-10


def test_curvature_penalty_second_order_matches_finite_difference():
    model = Linear(W0)
    _directional_check(lambda: regularizers.curvature_penalty(model, X, Y, h=0.5), model.w, eps=1e-2)


def test_regularizer_in_tf_function_traces_once():
    model = Linear(W0)
    opt = keras.optimizers.SGD(0.01)
    opt.build([model.w])
    traces = []

    @tf.function
    def step(x, y):
        traces.append(1)
        with tf.GradientTape() as tape:
            logits = model(x)
            loss = tf.reduce_mean(regularizers.crossentropy(logits, y))
            loss += 0.1 * regularizers.input_gradient_penalty(model, x, y)
            loss += 0.1 * regularizers.jacobian_penalty(model, x, seed=1)
            loss += 0.1 * regularizers.curvature_penalty(model, x, y)
        g = tape.gradient(loss, [model.w])
        opt.apply_gradients(zip(g, [model.w]))
        return loss

    for _ in range(3):
        loss = step(X, Y)
    assert len(traces) == 1 and np.isfinite(float(loss))


def test_bad_input_errors():
    model = Linear(W0)
    with pytest.raises(ValueError, match="norm"):
        regularizers.input_gradient_penalty(model, X, Y, norm=3)
    with pytest.raises(ValueError, match="loss"):
        regularizers.input_gradient_penalty(model, X, Y, loss="hinge")
    with pytest.raises(ValueError, match="loss"):
        regularizers.input_gradient_penalty(model, X, Y, loss=lambda z, y: tf.reduce_sum(z))
    with pytest.raises(TypeError, match="x"):
        regularizers.input_gradient_penalty(model, tf.ones((2, D), tf.int32), Y[:2])
    with pytest.raises(ValueError, match="x"):
        regularizers.input_gradient_penalty(lambda x, training=False: tf.ones((2, C)), X[:2], Y[:2])
    with pytest.raises(ValueError, match="num_projections"):
        regularizers.jacobian_penalty(model, X, num_projections=0)
    with pytest.raises(TypeError, match="seed"):
        regularizers.jacobian_penalty(model, X, seed=1.5)
    with pytest.raises(ValueError, match="h"):
        regularizers.curvature_penalty(model, X, Y, h=-1.0)
    with pytest.raises(ValueError, match="direction"):
        regularizers.curvature_penalty(model, X, Y, direction="random")
    critic = LinearCritic(np.ones((8, 8, 1)))
    with pytest.raises(ValueError, match="fake"):
        regularizers.gradient_penalty(critic, tf.ones((2, 8, 8, 1)), tf.ones((3, 8, 8, 1)))
    with pytest.raises(ValueError, match="target"):
        regularizers.gradient_penalty(critic, tf.ones((2, 8, 8, 1)), tf.ones((2, 8, 8, 1)), target=-1.0)
