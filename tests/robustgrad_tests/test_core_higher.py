"""jvp / vjp / hvp / Hessians / Jacobians against analytic results, finite differences and TF."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import robustgrad as rg
import robustgrad.higher as higher

from conftest import central_difference

RS = np.random.RandomState(0)
A = RS.randn(4, 4)
SYM = A + A.T


def quad_plus(x):  # f(x) = x^T A x + sum(x^4): H = A + A^T + diag(12 x^2)
    return tf.reduce_sum(x * tf.linalg.matvec(tf.constant(A, x.dtype), x)) + tf.reduce_sum(x ** 4)


def hess_quad_plus(x):
    return SYM + np.diag(12 * x ** 2)


def vec_fn(x):  # R^4 -> R^3
    return tf.stack([x[0] * x[1], tf.sin(x[2]), x[3] ** 2 + x[0]])


def test_jvp_and_vjp_match_explicit_jacobian():
    x = tf.constant(RS.randn(4), tf.float64)
    v = tf.constant(RS.randn(4), tf.float64)
    u = tf.constant(RS.randn(3), tf.float64)
    jacobian = rg.jacobian(vec_fn, x).numpy()
    xn = x.numpy()
    jacobian_exact = np.array([[xn[1], xn[0], 0, 0], [0, 0, np.cos(xn[2]), 0], [1, 0, 0, 2 * xn[3]]])
    np.testing.assert_allclose(jacobian, jacobian_exact, rtol=1e-12)
    out, t = rg.jvp(vec_fn, (x,), (v,))
    np.testing.assert_allclose(out.numpy(), vec_fn(x).numpy())
    np.testing.assert_allclose(t.numpy(), jacobian_exact @ v.numpy(), rtol=1e-12)
    out, pull = rg.vjp(vec_fn, x)
    (g,) = pull(u)
    np.testing.assert_allclose(g.numpy(), u.numpy() @ jacobian_exact, rtol=1e-12)
    (g2,) = pull(2 * u)  # the pullback can be called again
    np.testing.assert_allclose(g2.numpy(), 2 * u.numpy() @ jacobian_exact, rtol=1e-12)


def test_jvp_vjp_nested_structures_and_several_primals():
    def f(p, x):
        return {"y": p["w"] * x + p["b"], "z": tf.reduce_sum(x)}

    p = {"w": tf.constant(2.0), "b": tf.constant(1.0)}
    x = tf.constant([1.0, 3.0])
    out, t = rg.jvp(f, (p, x), ({"w": tf.constant(1.0), "b": tf.constant(0.0)}, tf.zeros(2)))
    np.testing.assert_allclose(t["y"].numpy(), [1.0, 3.0])
    assert float(t["z"]) == 0.0
    out, pull = rg.vjp(f, p, x)
    gp, gx = pull({"y": tf.ones(2), "z": tf.constant(1.0)})
    assert float(gp["w"]) == 4.0 and float(gp["b"]) == 2.0
    np.testing.assert_allclose(gx.numpy(), [3.0, 3.0])


@pytest.mark.parametrize("mode", ["forward_over_reverse", "reverse_over_reverse"])
def test_hvp_equals_hessian_times_v_and_finite_differences(mode):
    x = RS.randn(4)
    v = RS.randn(4)
    hv = rg.hvp(quad_plus, tf.constant(x), tf.constant(v), mode=mode).numpy()
    np.testing.assert_allclose(hv, hess_quad_plus(x) @ v, rtol=1e-10)
    g = lambda z: rg.grad(quad_plus)(tf.constant(z)).numpy()  # noqa: E731
    h = 1e-6
    np.testing.assert_allclose(hv, (g(x + h * v) - g(x - h * v)) / (2 * h), rtol=1e-5)


def test_hvp_of_keras_model_parameters_matches_full_hessian():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(2)])
    x = tf.random.normal([5, 3])
    y = tf.constant([0, 1, 1, 0, 1])
    kernel = model.layers[0].kernel.value

    def loss(w):
        h = tf.tanh(x @ w + model.layers[0].bias)
        logits = model.layers[1](h)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))

    v = tf.random.normal(kernel.shape)
    hessian_matrix = rg.hessian(loss, tf.convert_to_tensor(kernel)).numpy().reshape(12, 12)
    for mode in ("forward_over_reverse", "reverse_over_reverse"):
        hv = rg.hvp(loss, tf.convert_to_tensor(kernel), v, mode=mode).numpy().ravel()
        np.testing.assert_allclose(hv, hessian_matrix @ v.numpy().ravel(), rtol=1e-4, atol=1e-6)


def test_hvp_falls_back_with_a_warning(monkeypatch):
    def broken(fn, args, tans):
        raise LookupError("No JVP registered for op FancyOp")

    monkeypatch.setattr(higher, "_hvp_forward_over_reverse", broken)
    x = tf.constant([1.0, 2.0])
    with pytest.warns(RuntimeWarning, match="falling back"):
        hv = rg.hvp(lambda z: tf.reduce_sum(z ** 3), x, tf.ones(2))
    np.testing.assert_allclose(hv.numpy(), [6.0, 12.0])


def test_hvp_nested_primals():
    def f(a, b):
        return tf.reduce_sum(a ** 2 * b)

    a, b = tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])
    va, vb = tf.constant([1.0, 0.0]), tf.constant([0.0, 1.0])
    ha, hb = rg.hvp(f, (a, b), (va, vb))
    # H = [[2 diag(b), 2 diag(a)], [2 diag(a), 0]]
    np.testing.assert_allclose(ha.numpy(), [6.0, 4.0])
    np.testing.assert_allclose(hb.numpy(), [2.0, 0.0])


def test_hessian_and_hutchinson_diagonal():
    x = RS.randn(4)
    hessian_matrix = rg.hessian(quad_plus, tf.constant(x)).numpy()
    np.testing.assert_allclose(hessian_matrix, hess_quad_plus(x), rtol=1e-10)
    np.testing.assert_allclose(rg.hessian(quad_plus, tf.constant(x), chunk_size=3).numpy(), hessian_matrix)
    sep = lambda z: tf.reduce_sum(tf.sin(z) * z)  # noqa: E731 - diagonal Hessian: exact estimate
    d = rg.hessian_diagonal(sep, tf.constant(x), num_samples=3, seed=1).numpy()
    np.testing.assert_allclose(d, np.diag(rg.hessian(sep, tf.constant(x)).numpy()), rtol=1e-10)
    est = rg.hessian_diagonal(quad_plus, tf.constant(x), num_samples=4000, seed=3).numpy()
    np.testing.assert_allclose(est, np.diag(hessian_matrix), atol=0.35)
    again = rg.hessian_diagonal(quad_plus, tf.constant(x), num_samples=50, seed=3)
    np.testing.assert_array_equal(again.numpy(),
                                  rg.hessian_diagonal(quad_plus, tf.constant(x), 50, seed=3).numpy())
    np.testing.assert_allclose(rg.hessian(lambda z: tf.reduce_sum(2.0 * z), tf.ones(3)).numpy(),
                               np.zeros((3, 3)))


def _mlp():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(5)])


@pytest.mark.parametrize("chunk", [1, 2, 3, None])
def test_chunked_jacobians_equal_unchunked_and_tf(chunk):
    model = _mlp()
    x = tf.random.normal([4, 6])
    with tf.GradientTape(persistent=True) as t:
        t.watch(x)
        y = model(x)
    ref_full = t.jacobian(y, x).numpy()
    ref_batch = t.batch_jacobian(y, x).numpy()
    np.testing.assert_allclose(rg.jacobian(model, x, chunk_size=chunk).numpy(), ref_full,
                               rtol=1e-5, atol=1e-6)
    bj = rg.batch_jacobian(model, x, chunk_size=chunk)
    assert bj.shape == (4, 5, 6)
    np.testing.assert_allclose(bj.numpy(), ref_batch, rtol=1e-5, atol=1e-6)


def test_batch_jacobian_image_shapes_and_finite_differences():
    conv = keras.Sequential([keras.Input((5, 5, 1)), keras.layers.Conv2D(2, 3),
                             keras.layers.Flatten(), keras.layers.Dense(3)])
    x = tf.random.uniform([2, 5, 5, 1], dtype=tf.float32)
    jacobian = rg.batch_jacobian(conv, x, chunk_size=2)
    assert jacobian.shape == (2, 3, 5, 5, 1)
    f = lambda z: conv(tf.constant(z[None], tf.float32))[0, 1].numpy()  # noqa: E731
    fd = central_difference(f, x.numpy()[0].astype(np.float64), eps=1e-2)
    np.testing.assert_allclose(jacobian[0, 1].numpy(), fd, rtol=1e-2, atol=1e-3)


def test_batch_jacobian_compiles_with_xla_and_traces_once():
    model = _mlp()
    traces = []

    @tf.function(jit_compile=True)
    def bj(x):
        traces.append(1)
        return rg.batch_jacobian(model, x, chunk_size=2)

    x = tf.random.normal([3, 6])
    out = bj(x)
    bj(tf.random.normal([3, 6]))
    assert len(traces) == 1
    with tf.GradientTape() as t:
        t.watch(x)
        y = model(x)
    np.testing.assert_allclose(out.numpy(), t.batch_jacobian(y, x).numpy(), rtol=1e-4, atol=1e-6)

    @tf.function(jit_compile=True)
    def full(x):
        return rg.jacobian(model, x, chunk_size=4)

    np.testing.assert_allclose(full(x).numpy(), rg.jacobian(model, x).numpy(), rtol=1e-4, atol=1e-6)


def test_hvp_and_jvp_inside_tf_function_trace_once():
    traces = []

    @tf.function
    def f(x, v):
        traces.append(1)
        return rg.hvp(quad_plus, x, v), rg.jvp(vec_fn, (x,), (v,))[1]

    for _ in range(3):
        f(tf.random.normal([4], dtype=tf.float64), tf.random.normal([4], dtype=tf.float64))
    assert len(traces) == 1


@pytest.mark.parametrize("bad, exc, match", [
    (lambda: rg.hvp(lambda x: x * 2.0, tf.ones(2), tf.ones(2)), ValueError, "scalar"),
    (lambda: rg.hvp(quad_plus, tf.ones(4), tf.ones(4), mode="fwd"), ValueError, "mode"),
    (lambda: rg.hvp(quad_plus, tf.ones(4), tf.ones(3)), ValueError, "tangents"),
    (lambda: rg.hvp(quad_plus, tf.ones(4, tf.int32), tf.ones(4)), TypeError, "primals"),
    (lambda: rg.jvp(vec_fn, (tf.ones(4),), (tf.ones(4), tf.ones(4))), ValueError, "tangents"),
    (lambda: rg.jacobian(vec_fn, tf.ones(4), chunk_size=0), ValueError, "chunk_size"),
    (lambda: rg.batch_jacobian(lambda x: x, tf.ones([2, 3]), chunk_size=-1), ValueError,
     "chunk_size"),
    (lambda: rg.jacobian(lambda x: tf.ones(3), tf.ones(4)), ValueError, "does not depend"),
    (lambda: rg.batch_jacobian(lambda x: x[:1], tf.ones([2, 3])), ValueError, "batch size"),
    (lambda: rg.hessian_diagonal(quad_plus, tf.ones(4), num_samples=0), ValueError, "num_samples"),
    (lambda: rg.vjp(vec_fn, tf.ones(4))[1](tf.ones(2)), ValueError, "cotangents"),
    (lambda: rg.vjp(lambda a, b: a * 2.0, tf.ones(2), tf.ones(2))[1](tf.ones(2)), ValueError,
     r"primals\[1\]"),
])
def test_bad_input(bad, exc, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(exc, match=match):
            bad()


def test_hvp_through_gather_indexed_slices_both_modes_dense():
    x = tf.constant(np.random.RandomState(3).randn(10, 3), tf.float64)
    f = lambda z: tf.reduce_sum(tf.gather(z, [1, 2, 2]) ** 3)  # noqa: E731
    v = tf.ones_like(x)
    expected = np.zeros((10, 3))
    xn = x.numpy()
    expected[1] = 6 * xn[1]
    expected[2] = 2 * 6 * xn[2]
    for mode in ("forward_over_reverse", "reverse_over_reverse"):
        hv = rg.hvp(f, x, v, mode=mode)
        assert isinstance(hv, tf.Tensor)
        np.testing.assert_allclose(hv.numpy(), expected, rtol=1e-10)


@pytest.mark.parametrize("chunk", [None, 1, 2, 3, 4])
def test_jacobians_with_unknown_batch_dimension(chunk):
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    spec = [tf.TensorSpec([None, 6])]
    bj = tf.function(lambda x: rg.batch_jacobian(model, x, chunk_size=chunk), input_signature=spec)
    fj = tf.function(lambda x: rg.jacobian(model, x, chunk_size=chunk), input_signature=spec)
    x = tf.random.normal([5, 6])
    with tf.GradientTape(persistent=True) as t:
        t.watch(x)
        y = model(x)
    np.testing.assert_allclose(bj(x).numpy(), t.batch_jacobian(y, x).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fj(x).numpy(), t.jacobian(y, x).numpy(), rtol=1e-5, atol=1e-6)
