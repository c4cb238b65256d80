"""grad / value_and_grad / input_gradient and tape control against analytic and finite-difference results."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import robustgrad as rg

from conftest import central_difference


def _f(x):  # scalar, non-linear
    return tf.reduce_sum(tf.sin(x) * x ** 2) + tf.reduce_prod(tf.cos(x))


def test_grad_matches_analytic_and_finite_differences_float64():
    x = np.array([0.3, -1.2, 2.0], dtype=np.float64)
    g = rg.grad(_f)(tf.constant(x)).numpy()
    analytic = np.cos(x) * x ** 2 + 2 * x * np.sin(x)
    prod = np.prod(np.cos(x))
    analytic += np.array([-np.sin(x[i]) * prod / np.cos(x[i]) for i in range(3)])
    np.testing.assert_allclose(g, analytic, rtol=1e-10)
    fd = central_difference(lambda z: _f(tf.constant(z)).numpy(), x)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def test_grad_against_tf_compute_gradient_matrix_input():
    x = tf.constant(np.random.RandomState(1).randn(2, 3), tf.float64)
    theoretical, numerical = tf.test.compute_gradient(lambda z: tf.reshape(_f(z), [1]), [x])
    np.testing.assert_allclose(rg.grad(_f)(x).numpy().ravel(), theoretical[0].ravel(), rtol=1e-10)
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-5, atol=1e-6)


def test_scalar_input_and_nested_structures():
    assert float(rg.grad(lambda x: x ** 3)(tf.constant(2.0, tf.float64))) == pytest.approx(12.0)
    params = {"w": tf.constant([1.0, 2.0], tf.float64), "b": (tf.constant(3.0, tf.float64),)}

    def loss(p, x):
        return tf.reduce_sum(p["w"] * x) ** 2 + p["b"][0] ** 2

    x = tf.constant([3.0, 4.0], tf.float64)
    g = rg.grad(loss)(params, x)
    assert set(g) == {"w", "b"} and isinstance(g["b"], tuple)
    np.testing.assert_allclose(g["w"].numpy(), 2 * 11 * x.numpy())
    assert float(g["b"][0]) == pytest.approx(6.0)


def test_argnums_tuple_and_has_aux():
    def f(a, b):
        return tf.reduce_sum(a * b), {"prod": a * b}

    (value, aux), (ga, gb) = rg.value_and_grad(f, argnums=(0, 1), has_aux=True)(
        tf.constant([1.0, 2.0]), tf.constant([3.0, 5.0]))
    assert float(value) == 13.0
    np.testing.assert_allclose(aux["prod"].numpy(), [3.0, 10.0])
    np.testing.assert_allclose(ga.numpy(), [3.0, 5.0])
    np.testing.assert_allclose(gb.numpy(), [1.0, 2.0])
    g, aux = rg.grad(f, argnums=1, has_aux=True)(tf.constant([1.0, 2.0]), tf.constant([3.0, 5.0]))
    np.testing.assert_allclose(g.numpy(), [1.0, 2.0])


def test_grad_of_variables_including_keras_variables():
    v = tf.Variable([1.0, -2.0])
    kv = keras.Variable([3.0, 4.0])
    g = rg.grad(lambda a, b: tf.reduce_sum(a * a) + tf.reduce_sum(b * b), argnums=(0, 1))(v, kv)
    np.testing.assert_allclose(g[0].numpy(), [2.0, -4.0])
    np.testing.assert_allclose(g[1].numpy(), [6.0, 8.0])


def test_unconnected_argument_is_named():
    f = lambda a, b: tf.reduce_sum(a) * 2.0  # noqa: E731
    with pytest.raises(ValueError, match="argument 1"):
        rg.grad(f, argnums=(0, 1))(tf.ones(2), tf.ones(2))
    with pytest.raises(ValueError, match=r"argument 0\[b\]"):
        rg.grad(lambda p: tf.reduce_sum(p["a"]))({"a": tf.ones(2), "b": tf.ones(2)})
    g = rg.grad(f, argnums=(0, 1), allow_unconnected=True)(tf.ones(2), tf.ones(2))
    np.testing.assert_allclose(g[1].numpy(), [0.0, 0.0])


@pytest.mark.parametrize("bad, exc, match", [
    (lambda: rg.grad(lambda x: x * 2.0)(tf.ones(3)), ValueError, "scalar"),
    (lambda: rg.grad(lambda x: tf.reduce_sum(x))(tf.constant([1, 2])), TypeError, "argument 0"),
    (lambda: rg.grad(lambda x: tf.reduce_sum(x), argnums=2)(tf.ones(2)), ValueError, "argnums"),
    (lambda: rg.grad(lambda x: tf.reduce_sum(x), argnums="0"), TypeError, "argnums"),
    (lambda: rg.grad(lambda x: tf.reduce_sum(x), argnums=(0, 0)), ValueError, "argnums"),
    (lambda: rg.grad(3.0), TypeError, "fn"),
    (lambda: rg.value_and_grad(lambda x: tf.reduce_sum(x), has_aux=True)(tf.ones(2)),
     ValueError, "has_aux"),
])
def test_bad_input(bad, exc, match):
    with pytest.raises(exc, match=match):
        bad()


def test_grad_inside_tf_function_traces_once_per_signature_and_jit():
    traces = []

    @tf.function
    def step(x):
        traces.append(1)
        return rg.value_and_grad(_f)(x)

    for _ in range(3):
        step(tf.random.normal([4]))
    step(tf.random.normal([5]))
    assert len(traces) == 2
    xla = tf.function(rg.grad(_f), jit_compile=True)
    x = tf.constant([0.1, 0.2, 0.3])
    np.testing.assert_allclose(xla(x).numpy(), rg.grad(_f)(x).numpy(), rtol=1e-5)


# ---------------------------------------------------------------- input_gradient


def _linear_model(weights, b):
    return lambda x, training=False: tf.reshape(x, [tf.shape(x)[0], -1]) @ weights + b


def test_input_gradient_linear_model_closed_form():
    rs = np.random.RandomState(0)
    weights = rs.randn(4, 3).astype(np.float32)
    b = rs.randn(3).astype(np.float32)
    x = rs.rand(5, 4).astype(np.float32)
    y = np.array([0, 1, 2, 0, 1])
    g = rg.input_gradient(_linear_model(weights, b), x, y).numpy()
    p = tf.nn.softmax(x @ weights + b).numpy()
    expected = (p - np.eye(3)[y]) @ weights.T  # d CE / dx = weights (softmax - onehot)
    np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-6)
    # margin loss: gradient is weights[:, j*] - weights[:, y]
    gm = rg.input_gradient(_linear_model(weights, b), x, y, loss="margin").numpy()
    z = x @ weights + b
    z_other = np.where(np.eye(3)[y] > 0, -np.inf, z)
    j = z_other.argmax(1)
    np.testing.assert_allclose(gm, (weights[:, j] - weights[:, y]).T, rtol=1e-5)
    x_before = x.copy()
    rg.input_gradient(_linear_model(weights, b), x, y)
    np.testing.assert_array_equal(x, x_before)


def test_input_gradient_float32_under_mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(10)])
        x = tf.random.uniform([3, 8, 8, 1])
        out = model(x)
        assert out.dtype == tf.float16
        g = rg.input_gradient(model, x, tf.constant([1, 2, 3]))
        assert g.dtype == tf.float32 and g.shape == x.shape
        assert bool(tf.reduce_any(g != 0))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_input_gradient_errors():
    weights = tf.ones([4, 3])
    with pytest.raises(ValueError, match="does not depend on x"):
        rg.input_gradient(lambda x, training=False: tf.ones([2, 3]) @ tf.ones([3, 3]),
                          tf.ones([2, 4]), tf.constant([0, 1]))
    with pytest.raises(TypeError, match="x must be a floating"):
        rg.input_gradient(_linear_model(weights, 0.0), tf.ones([2, 4], tf.int32), tf.constant([0, 1]))
    with pytest.raises(ValueError, match="loss must be"):
        rg.input_gradient(_linear_model(weights, 0.0), tf.ones([2, 4]), tf.constant([0, 1]), loss="l2")
    with pytest.raises(TypeError, match="model must be callable"):
        rg.input_gradient(None, tf.ones([2, 4]), tf.constant([0, 1]))


def test_input_gradient_custom_loss_per_example_rows():
    weights = tf.constant(np.random.RandomState(2).randn(4, 3), tf.float32)
    model = _linear_model(weights, 0.0)
    x = tf.random.uniform([3, 4])
    g = rg.input_gradient(model, x, None, loss=lambda logits, y: logits[:, 1])
    np.testing.assert_allclose(g.numpy(), np.tile(weights.numpy()[:, 1], (3, 1)), rtol=1e-6)


# ---------------------------------------------------------------- tape control


def test_unrecorded_and_stop_gradient_structures():
    x = tf.constant(3.0)
    with tf.GradientTape(persistent=True) as t1, tf.GradientTape() as t2:
        t1.watch(x)
        t2.watch(x)
        with rg.unrecorded(t1, t2):
            c = x * x
        y = c * x
    assert float(t1.gradient(y, x)) == 9.0 and float(t2.gradient(y, x)) == 9.0
    s = rg.stop_gradient({"a": x, "b": [x * 2.0, 7], "c": None})
    assert s["b"][1] == 7 and s["c"] is None
    with tf.GradientTape() as t:
        t.watch(x)
        z = rg.stop_gradient({"a": x * x})["a"] + x
    assert float(t.gradient(z, x)) == 1.0
    with pytest.raises(TypeError, match="tf.GradientTape"):
        with rg.unrecorded("tape"):
            pass


def test_watched_reports_variables_and_tensors():
    v = tf.Variable(2.0, name="kernel")
    kv = keras.Variable(1.0, name="keras_var")
    x = tf.constant(1.0)
    with rg.Tape() as tape:
        tape.watch(x)
        tape.watch(kv)
        _ = v * x + kv
    rep = rg.watched(tape)
    assert any("kernel" in n for n in rep.variable_names)
    assert len(rep.variables) == 2
    assert len(rep.tensors) == 1
    assert "watched variable" in str(rep)
    with tf.GradientTape() as plain:
        _ = v * 2.0
    assert rg.watched(plain).tensors is None
    assert len(rg.watched(plain).variables) == 1


def test_check_connected_names_every_unconnected_source():
    a, b, c = tf.Variable(1.0, name="a"), tf.Variable(1.0, name="b"), tf.Variable(1.0, name="c")
    with tf.GradientTape() as t:
        y = a * 2.0
    grads = t.gradient(y, [a, b, c])
    with pytest.raises(ValueError, match=r"b:0, c:0"):
        rg.check_connected(grads, [a, b, c])
    assert rg.check_connected([tf.ones(1)], [a]) is not None
    with pytest.raises(ValueError, match="leaves"):
        rg.check_connected([None, None], [a])


def test_leaf_names_one_helper_for_messages():
    import collections

    from robustgrad.checks import leaf_names

    pair = collections.namedtuple("Pair", "w b")
    tree = {"z": tf.ones(1), "a": [tf.ones(1), pair(tf.ones(1), tf.ones(1))]}
    assert leaf_names(tree) == ["a/0", "a/1/w", "a/1/b", "z"]
    assert leaf_names(tree, "argument 2") == ["argument 2[a/0]", "argument 2[a/1/w]",
                                              "argument 2[a/1/b]", "argument 2[z]"]
    assert leaf_names(tf.ones(1)) == ["0"] and leaf_names(tf.ones(1), "argument 0") == ["argument 0"]
    dense = keras.layers.Dense(2, name="head")
    dense.build((None, 3))
    v = tf.Variable(1.0, name="scale")
    assert leaf_names([dense.kernel, v, tf.ones(1)], variable_names=True) == [
        "head/kernel", "scale", "2"]
    assert leaf_names([v], "argument 0") == ["argument 0[0]"]


def test_scalar_output_is_the_one_scalar_check():
    from robustgrad.checks import ArgumentTypeError, scalar_output

    assert scalar_output(tf.constant(2.0, tf.float64)).dtype == tf.float64
    with pytest.raises(ValueError, match=r"loss must return a scalar \(shape \[\]\), got shape "
                                         r"\(2, 1\); reduce it"):
        scalar_output(tf.ones((2, 1)), "loss")
    with pytest.raises(ArgumentTypeError, match="objective must return a floating scalar, got "
                                                "dtype int32"):
        scalar_output(tf.constant(3), "objective")
    with pytest.raises(TypeError, match="fn must return a scalar tensor, got str"):
        scalar_output("1.0")


def test_input_gradient_warns_of_a_softmax_output_inside_tf_function_too():
    probs = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    x, y = tf.ones([2, 4]), tf.constant([0, 2])
    with pytest.warns(UserWarning, match="look like probabilities"):
        rg.input_gradient(probs, x, y)  # eager: on the values
    with pytest.warns(UserWarning, match="look like probabilities"):
        tf.function(lambda x: rg.input_gradient(probs, x, y))(x)  # traced: on the last layer
    layer = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Softmax()])
    with pytest.warns(UserWarning, match="look like probabilities"):
        tf.function(lambda x: rg.input_gradient(layer, x, y))(x)
    logits = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tf.function(lambda x: rg.input_gradient(logits, x, y))(x)  # logits: no warning
