"""The PGD engine's ``gradient_noise`` hook (stochastic gradient Langevin steps): exact paths on a
linear model, the step index, chunking with ``y``, XLA, and bad input."""

import numpy as np
import pytest
import tensorflow as tf

import attacks

W = tf.constant([[1.0], [-2.0], [0.5]])
X = tf.constant(np.linspace(-1.0, 1.0, 15, dtype=np.float32).reshape(5, 3))


def _model(x, training=False):
    return x @ W


def _score(outputs, y):
    """Maximise the linear score: the gradient with respect to x is W, sign (+, -, +)."""
    return outputs[:, 0]


def _noise_of_y(step, y):
    return y["noise"][:, step]


def _pgd(y, noise, **kw):
    kw = dict(dict(eps=0.1, steps=3, step_size=0.1, clip_min=None, clip_max=None,
                   rand_init=False), **kw)
    return attacks.projected_gradient_descent(_model, X, y, objective=_score,
                                              gradient_noise=noise, **kw).numpy()


def _y(noise):
    return {"label": tf.zeros([5], tf.int64), "noise": tf.constant(noise, tf.float32)}


@pytest.mark.parametrize("jit_compile", [False, True])
def test_noise_that_outweighs_the_gradient_reverses_the_step_per_row(jit_compile):
    noise = np.zeros([5, 3, 3], np.float32)
    noise[1::2] = -10.0 * np.sign(W.numpy()[:, 0])  # odd rows: every step against the gradient
    got = _pgd(_y(noise), _noise_of_y, jit_compile=jit_compile)
    direction = np.where(np.arange(5)[:, None] % 2 == 1, -1.0, 1.0) * np.sign(W.numpy()[:, 0])
    np.testing.assert_allclose(got, X.numpy() + 0.1 * direction, atol=1e-6)


def test_zero_noise_is_plain_pgd_bit_for_bit():
    zero = lambda step, y: tf.zeros([1, 3])  # noqa: E731
    y = _y(np.zeros([5, 3, 3]))
    plain = attacks.projected_gradient_descent(_model, X, y, objective=_score, eps=0.1, steps=3,
                                               clip_min=None, clip_max=None, seed=4).numpy()
    noisy = attacks.projected_gradient_descent(_model, X, y, objective=_score, eps=0.1, steps=3,
                                               clip_min=None, clip_max=None, seed=4,
                                               gradient_noise=zero).numpy()
    np.testing.assert_array_equal(noisy, plain)


def test_the_hook_gets_the_step_index():
    against = -10.0 * np.sign(W.numpy()[:, 0])
    first, last = np.zeros([5, 3, 3], np.float32), np.zeros([5, 3, 3], np.float32)
    first[:, 0], last[:, 2] = against, against
    # steps of the full radius: -eps, back to x, +eps / +eps, +eps (clipped), back to x
    np.testing.assert_allclose(_pgd(_y(first), _noise_of_y),
                               X.numpy() + 0.1 * np.sign(W.numpy()[:, 0]), atol=1e-6)
    np.testing.assert_allclose(_pgd(_y(last), _noise_of_y), X.numpy(), atol=1e-6)


def test_noise_carried_in_y_is_chunked_with_the_batch():
    noise = np.random.default_rng(0).normal(0.0, 3.0, [5, 3, 3]).astype(np.float32)
    whole = _pgd(_y(noise), _noise_of_y, step_size=0.04)
    chunked = _pgd(_y(noise), _noise_of_y, step_size=0.04, batch_size=2)
    np.testing.assert_array_equal(chunked, whole)
    assert np.abs(whole - X.numpy()).max() <= 0.1 + 1e-6


def test_gradient_noise_must_be_callable():
    with pytest.raises(TypeError, match=r"gradient_noise must be a callable "
                                        r"gradient_noise\(step, y\) -> noise .* got float"):
        _pgd(_y(np.zeros([5, 3, 3])), 0.5)
