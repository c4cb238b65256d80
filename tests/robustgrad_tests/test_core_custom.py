"""Custom-gradient ops: forward is identity (or the function), backward is what it promises."""

import doctest

import keras
import numpy as np
import pytest
import tensorflow as tf

import robustgrad as rg
import robustgrad.custom
import robustgrad.data
import robustgrad.higher
import robustgrad.tape


def _forward_backward(op, x, upstream):
    x = tf.constant(x, tf.float32)
    with tf.GradientTape() as t:
        t.watch(x)
        y = op(x)
        loss = tf.reduce_sum(y * tf.constant(upstream, tf.float32))
    return y.numpy(), t.gradient(loss, x).numpy()


def test_clip_gradient():
    y, g = _forward_backward(lambda x: rg.clip_gradient(x, -1.0, 0.5), [1.0, 2.0, 3.0],
                             [-5.0, 0.2, 5.0])
    np.testing.assert_array_equal(y, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(g, [-1.0, 0.2, 0.5])


def test_clip_gradient_norm_whole_and_per_axis():
    y, g = _forward_backward(lambda x: rg.clip_gradient_norm(x, 1.0), [[0.0, 0.0]], [[3.0, 4.0]])
    np.testing.assert_array_equal(y, [[0.0, 0.0]])
    np.testing.assert_allclose(g, [[0.6, 0.8]], rtol=1e-6)
    _, g = _forward_backward(lambda x: rg.clip_gradient_norm(x, 1.0), [[0.0, 0.0]], [[0.3, 0.4]])
    np.testing.assert_allclose(g, [[0.3, 0.4]], rtol=1e-6)  # under the limit: unchanged
    _, g = _forward_backward(lambda x: rg.clip_gradient_norm(x, 1.0, axis=-1),
                             np.zeros((2, 2)), [[3.0, 4.0], [0.3, 0.4]])
    np.testing.assert_allclose(g, [[0.6, 0.8], [0.3, 0.4]], rtol=1e-6)


def test_scale_and_reverse_gradient():
    y, g = _forward_backward(lambda x: rg.scale_gradient(x, 0.25), [1.0, -2.0], [4.0, 8.0])
    np.testing.assert_array_equal(y, [1.0, -2.0])
    np.testing.assert_allclose(g, [1.0, 2.0])
    y, g = _forward_backward(lambda x: rg.reverse_gradient(x, scale=2.0), [1.0], [3.0])
    np.testing.assert_array_equal(y, [1.0])
    np.testing.assert_allclose(g, [-6.0])
    _, g = _forward_backward(lambda x: rg.scale_gradient(x, tf.constant(3.0)), [1.0], [1.0])
    np.testing.assert_allclose(g, [3.0])


def test_straight_through_estimator_and_its_variables():
    ste = rg.straight_through(tf.round)
    y, g = _forward_backward(ste, [0.2, 1.7, -0.6], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(y, [0.0, 2.0, -1.0])
    np.testing.assert_allclose(g, [1.0, 2.0, 3.0])
    scale = tf.Variable(2.0)
    quantise = rg.straight_through(lambda x: tf.round(x * scale) / scale)
    x = tf.constant([0.3, 0.8])
    with tf.GradientTape() as t:
        t.watch(x)
        y = quantise(x)
        loss = tf.reduce_sum(y)
    gx, gs = t.gradient(loss, [x, scale])
    np.testing.assert_allclose(y.numpy(), [0.5, 1.0])
    np.testing.assert_allclose(gx.numpy(), [1.0, 1.0])
    # d/ds [round(x s)/s] with round's zero gradient = -round(x s)/s^2, summed
    np.testing.assert_allclose(float(gs), -(1.0 + 2.0) / 4.0)
    with pytest.raises(ValueError, match="shape"):
        rg.straight_through(lambda x: x[:1])(tf.ones(3))


def test_ops_pass_modified_gradients_into_layer_variables():
    layer = keras.layers.Dense(3, kernel_initializer="ones", use_bias=False)
    x = tf.ones([1, 2])
    layer(x)
    for op, factor in [(lambda h: rg.scale_gradient(h, 0.5), 0.5),
                       (lambda h: rg.reverse_gradient(h, 1.0), -1.0),
                       (lambda h: rg.clip_gradient(h, -10.0, 10.0), 1.0)]:
        with tf.GradientTape() as t:
            loss = tf.reduce_sum(op(layer(x)))
        g = t.gradient(loss, layer.trainable_variables)[0]
        np.testing.assert_allclose(g.numpy(), factor * np.ones((2, 3)))


def test_safe_norm_and_sqrt_are_finite_at_zero_and_correct_elsewhere():
    x = tf.constant([[0.0, 0.0], [3.0, 4.0]])
    with tf.GradientTape() as t:
        t.watch(x)
        n = rg.safe_norm(x, axis=-1)
        s = tf.reduce_sum(n)
    np.testing.assert_allclose(n.numpy(), [0.0, 5.0])
    np.testing.assert_allclose(t.gradient(s, x).numpy(), [[0.0, 0.0], [0.6, 0.8]], rtol=1e-6)
    assert rg.safe_norm(x, axis=-1, keepdims=True).shape == (2, 1)
    assert float(rg.safe_norm(x)) == pytest.approx(5.0)
    # second order stays finite too
    z = tf.zeros([3])
    with tf.GradientTape() as t2:
        t2.watch(z)
        with tf.GradientTape() as t1:
            t1.watch(z)
            v = rg.safe_norm(z)
        g = t1.gradient(v, z)
    h = t2.gradient(g, z)
    assert np.all(np.isfinite(g.numpy())) and (h is None or np.all(np.isfinite(h.numpy())))
    v = tf.constant([0.0, 4.0, -1.0])
    with tf.GradientTape() as t:
        t.watch(v)
        r = rg.safe_sqrt(v)
    np.testing.assert_allclose(r.numpy(), [0.0, 2.0, 0.0])
    np.testing.assert_allclose(t.gradient(r, v).numpy(), [0.0, 0.25, 0.0])


def test_custom_ops_compile_with_xla():
    @tf.function(jit_compile=True)
    def f(x):
        with tf.GradientTape() as t:
            t.watch(x)
            y = rg.clip_gradient(x, -1.0, 1.0) * 5.0 + rg.straight_through(tf.round)(x)
            y = rg.safe_norm(rg.scale_gradient(y, 2.0))
        return t.gradient(y, x)

    assert np.all(np.isfinite(f(tf.constant([0.5, 1.5])).numpy()))


@pytest.mark.parametrize("bad, exc, match", [
    (lambda: rg.clip_gradient(tf.ones(2), 1.0, -1.0), ValueError, "clip_min"),
    (lambda: rg.clip_gradient_norm(tf.ones(2), -1.0), ValueError, "max_norm"),
    (lambda: rg.clip_gradient_norm(tf.ones(2), 0.0), ValueError, "max_norm"),
    (lambda: rg.reverse_gradient(tf.ones(2), -2.0), ValueError, "scale"),
    (lambda: rg.scale_gradient(tf.ones(2), "2"), TypeError, "scale"),
    (lambda: rg.scale_gradient(tf.ones(2), float("nan")), ValueError, "scale"),
    (lambda: rg.safe_norm(tf.ones(2, tf.int32)), TypeError, "x must be a floating"),
    (lambda: rg.straight_through(None), TypeError, "forward_fn"),
])
def test_bad_input(bad, exc, match):
    with pytest.raises(exc, match=match):
        bad()


@pytest.mark.parametrize("module", [robustgrad.tape, robustgrad.higher, robustgrad.custom,
                                    robustgrad.data])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, extraglobs={"tf": tf},
                             optionflags=doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL)
    assert result.attempted > 0 and result.failed == 0
