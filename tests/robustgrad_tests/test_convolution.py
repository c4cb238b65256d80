"""robustgrad.convolution: a convolution whose stride-1 input gradient is a forward convolution.

The values are TensorFlow's bit for bit; the gradients equal TensorFlow's own (and central
finite differences) to float rounding, to first and second order, under XLA too; the fast path is
really taken where it should be (no ``Conv2DBackpropInput`` in the graph) and nowhere else; the
Keras seam leaves Keras' class as it found it and saved models plain.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from robustgrad import convolution
from robustgrad.convolution import conv2d, forward_input_gradients, transpose

RNG = np.random.default_rng(0)


def _data(x_shape, k_shape, dtype=tf.float64):
    x = tf.constant(RNG.normal(size=x_shape), dtype)
    k = tf.constant(RNG.normal(size=k_shape) / np.sqrt(np.prod(k_shape[:3])), dtype)
    return x, k


def _grads(fn, x, k, order=1):
    """First order: (dL/dx, dL/dk) of L = sum(y sin y). Second order: the gradients of the
    squared norm of dL/dx (a gradient penalty) with respect to x and k."""
    with tf.GradientTape(persistent=True) as outer:
        outer.watch([x, k])
        with tf.GradientTape() as inner:
            inner.watch([x, k])
            y = fn(x, k)
            loss = tf.reduce_sum(y * tf.sin(y))
        gx, gk = inner.gradient(loss, [x, k])
        penalty = tf.reduce_sum(gx ** 2)
    if order == 1:
        return y, gx, gk
    return y, *outer.gradient(penalty, [x, k])


def _ops(fn, *args):
    graph = tf.function(fn).get_concrete_function(*args).graph
    return [op.type for op in graph.get_operations()]


CASES = [  # (kernel [kh, kw], padding)
    ((3, 3), "SAME"), ((3, 3), "VALID"), ((2, 2), "SAME"), ((2, 2), "VALID"),
    ((1, 1), "SAME"), ((3, 2), "SAME"), ((2, 3), "VALID"), ((5, 5), "SAME"),
    ((3, 3), [[0, 0], [2, 0], [1, 1], [0, 0]]), ((2, 3), [[1, 0], [0, 2]]),
]


@pytest.mark.parametrize("ksize,padding", CASES)
def test_gradients_equal_tensorflows_to_rounding(ksize, padding):
    x, k = _data((2, 20, 18, 8), (*ksize, 8, 5))  # "valid": at most 1.25x the positions
    ref_padding = [[0, 0], *padding, [0, 0]] if isinstance(padding, list) and len(padding) == 2 \
        else padding
    y, gx, gk = _grads(lambda a, b: conv2d(a, b, 1, padding), x, k)
    y0, gx0, gk0 = _grads(lambda a, b: tf.nn.conv2d(a, b, 1, ref_padding), x, k)
    assert gx.shape == x.shape and gk.shape == k.shape
    np.testing.assert_array_equal(y.numpy(), y0.numpy())  # the forward is TensorFlow's op
    np.testing.assert_allclose(gx.numpy(), gx0.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(gk.numpy(), gk0.numpy())  # TensorFlow's kernel gradient
    # and the fast path was the one taken: no Conv2DBackpropInput in the gradient's graph
    ops = _ops(lambda a, b: _grads(lambda u, v: conv2d(u, v, 1, padding), a, b), x, k)
    assert "Conv2DBackpropInput" not in ops and "Conv2DBackpropFilter" in ops


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_gradients_match_finite_differences(padding):
    x, k = _data((1, 12, 12, 8), (2, 2, 8, 3))
    theoretical, numerical = tf.test.compute_gradient(
        lambda a, b: conv2d(a, b, 1, padding), [x, k], delta=1e-6)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("strides,dilations,channels", [
    (2, 1, 8), ([1, 2], 1, 8), (1, 2, 8), (1, 1, convolution.MIN_CHANNELS - 1)])
def test_strides_dilations_and_few_channels_keep_tensorflows_gradient(strides, dilations,
                                                                       channels):
    x, k = _data((2, 9, 8, channels), (3, 3, channels, 4))
    for padding in ("SAME", "VALID"):
        ours = _grads(lambda a, b: conv2d(a, b, strides, padding, dilations), x, k)
        ref = _grads(lambda a, b: tf.nn.convolution(a, b, strides, padding,
                                                    dilations=dilations), x, k)
        for a, b in zip(ours, ref):  # the same ops: bit for bit
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        ops = _ops(lambda a, b: _grads(lambda u, v: conv2d(u, v, strides, padding, dilations),
                                       a, b), x, k)
        assert "Conv2DBackpropInput" in ops or dilations != 1  # dilated: by space-to-batch


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_second_order_equals_tensorflows(padding):
    """A gradient penalty (TRADES-style regularisers, robustgrad.higher) differentiates the
    custom gradient: it must be right to second order, eagerly and compiled."""
    x, k = _data((2, 6, 6, 8), (3, 3, 8, 8)) if padding == "SAME" else \
        _data((2, 16, 16, 8), (2, 2, 8, 8))
    assert convolution._uses_forward(x, k, 1, padding, 1)
    for wrap in (lambda f: f, tf.function):
        ours = wrap(lambda a, b: _grads(lambda u, v: conv2d(u, v, 1, padding), a, b, order=2))
        ref = wrap(lambda a, b: _grads(lambda u, v: tf.nn.conv2d(u, v, 1, padding), a, b,
                                       order=2))
        for a, b in zip(ours(x, k)[1:], ref(x, k)[1:]):
            assert float(tf.reduce_max(tf.abs(b))) > 1e-3  # a real second derivative
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-10)


def test_valid_on_a_map_not_much_larger_than_the_kernel_keeps_tensorflows_gradient():
    """The transposed "valid" convolution as a forward one visits every input position where
    TensorFlow's scatters from the output's: on a 5x5 map with a 5x5 kernel that is 25x the
    work (CleverHans's tutorial CNN), so TensorFlow's gradient stays."""
    x, k = _data((2, 5, 5, 8), (5, 5, 8, 4))
    assert not convolution._uses_forward(x, k, 1, "VALID", 1)
    ops = _ops(lambda a, b: _grads(lambda u, v: conv2d(u, v, 1, "VALID"), a, b), x, k)
    assert "Conv2DBackpropInput" in ops
    big, k3 = _data((2, 32, 32, 8), (3, 3, 8, 4))  # 1024 / 900 positions: the forward one
    assert convolution._uses_forward(big, k3, 1, "VALID", 1)
    assert not convolution._uses_forward(big[:, :12, :12], k3, 1, "VALID", 1)  # 144 / 100


def test_second_order_by_finite_differences_of_the_first():
    x, k = _data((1, 4, 4, 8), (3, 3, 8, 2))

    def input_grad(a):
        with tf.GradientTape() as tape:
            tape.watch(a)
            y = conv2d(a, k, 1, "SAME")
            loss = tf.reduce_sum(y ** 3)
        return tape.gradient(loss, a)

    theoretical, numerical = tf.test.compute_gradient(input_grad, [x], delta=1e-6)
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-5, atol=1e-5)


def test_compiles_with_xla_on_cpu():
    x, k = _data((2, 8, 8, 16), (3, 3, 16, 8), tf.float32)
    fn = tf.function(lambda a, b: _grads(lambda u, v: conv2d(u, v, 1, "SAME"), a, b),
                     jit_compile=True)
    ref = _grads(lambda u, v: tf.nn.conv2d(u, v, 1, "SAME"), x, k)
    for a, b in zip(fn(x, k), ref):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)


def test_transpose_is_the_adjoint_of_the_convolution():
    """<conv(x), a> = <x, transpose(a)> for every padding kind (the bound engine's use)."""
    for ksize, padding in CASES:
        x, k = _data((2, 7, 6, 4), (*ksize, 4, 3))
        pad4 = [[0, 0], *padding, [0, 0]] if isinstance(padding, list) and len(padding) == 2 \
            else padding
        y = tf.nn.conv2d(x, k, 1, pad4)
        a = tf.constant(RNG.normal(size=y.shape), tf.float64)
        lhs = tf.reduce_sum(y * a)
        rhs = tf.reduce_sum(x * transpose(a, k, padding))
        assert abs(float(lhs - rhs)) < 1e-10 * max(1.0, abs(float(lhs))), (ksize, padding)


def test_bad_arguments_are_refused_with_the_accepted_values():
    x, k = _data((1, 4, 4, 8), (3, 3, 8, 2))
    with pytest.raises(ValueError, match=r"padding must be 'SAME', 'VALID' or explicit pairs, "
                                         r"got 'full'"):
        conv2d(x, k, 1, "full")
    with pytest.raises(ValueError, match=r"padding must be between 0 and the kernel size - 1 "
                                         r"\(2, 2\) on each side, got \[\[3, 0\], \[0, 0\]\]"):
        transpose(tf.zeros([1, 4, 2, 2], tf.float64), k, [[3, 0], [0, 0]])


STRIDED = [  # (input H, W, kernel [kh, kw], stride, padding): odd and even kernels, 1x1
    (9, 9, (3, 3), 2, "VALID"), (10, 10, (3, 3), 2, "SAME"), (9, 9, (3, 3), 2, "SAME"),
    (10, 9, (4, 4), 2, "SAME"), (11, 11, (4, 2), 2, "VALID"), (8, 8, (1, 1), 2, "VALID"),
    (14, 14, (6, 6), 2, "VALID"), (10, 10, (5, 5), 3, "SAME"), (11, 11, (2, 2), 3, "VALID"),
    (10, 9, (3, 3), 2, [[0, 0], [1, 0], [2, 1], [0, 0]]),
    (9, 7, (1, 1), 2, "SAME"), (10, 11, (1, 1), 3, "VALID"), (12, 12, (1, 1), 3, "SAME"),
]


@pytest.mark.parametrize("size,ksize,stride,padding", [(c[:2], *c[2:]) for c in STRIDED])
def test_strided_gradients_equal_tensorflows_to_rounding(monkeypatch, size, ksize, stride,
                                                         padding):
    """At a stride the input gradient is the stride phases' forward convolutions: TensorFlow's
    values to float64 rounding, the value and the kernel gradient TensorFlow's own ops."""
    monkeypatch.setattr(convolution, "MIN_KERNEL_PER_OUTPUT", 0)  # every shape takes the path
    x, k = _data((2, *size, 8), (*ksize, 8, 5))
    assert convolution._uses_forward(x, k, stride, padding, 1)
    y, gx, gk = _grads(lambda a, b: conv2d(a, b, stride, padding), x, k)
    y0, gx0, gk0 = _grads(lambda a, b: tf.nn.conv2d(a, b, stride, padding), x, k)
    assert gx.shape == x.shape
    np.testing.assert_array_equal(y.numpy(), y0.numpy())
    np.testing.assert_allclose(gx.numpy(), gx0.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(gk.numpy(), gk0.numpy())
    ops = _ops(lambda a, b: _grads(lambda u, v: conv2d(u, v, stride, padding), a, b), x, k)
    assert "Conv2DBackpropInput" not in ops and "Conv2DBackpropFilter" in ops
    # the bound engine's use: the adjoint of the convolution
    a = tf.constant(RNG.normal(size=y0.shape), tf.float64)
    lhs = float(tf.reduce_sum(y0 * a))
    rhs = float(tf.reduce_sum(x * transpose(a, k, padding, stride, size)))
    assert abs(lhs - rhs) < 1e-10 * max(1.0, abs(lhs))


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_strided_gradients_match_finite_differences_and_second_order(monkeypatch, padding):
    monkeypatch.setattr(convolution, "MIN_KERNEL_PER_OUTPUT", 0)
    x, k = _data((1, 9, 8, 8), (3, 3, 8, 3))
    theoretical, numerical = tf.test.compute_gradient(
        lambda a, b: conv2d(a, b, 2, padding), [x, k], delta=1e-6)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)
    for wrap in (lambda f: f, tf.function):
        ours = wrap(lambda a, b: _grads(lambda u, v: conv2d(u, v, 2, padding), a, b, order=2))
        ref = wrap(lambda a, b: _grads(lambda u, v: tf.nn.conv2d(u, v, 2, padding), a, b,
                                       order=2))
        for a, b in zip(ours(x, k)[1:], ref(x, k)[1:]):
            assert float(tf.reduce_max(tf.abs(b))) > 1e-3  # a real second derivative
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-10)


def test_strided_compiles_with_xla_on_cpu(monkeypatch):
    monkeypatch.setattr(convolution, "MIN_KERNEL_PER_OUTPUT", 0)
    x, k = _data((2, 11, 11, 16), (3, 3, 16, 8), tf.float32)
    fn = tf.function(lambda a, b: _grads(lambda u, v: conv2d(u, v, 2, "SAME"), a, b),
                     jit_compile=True)
    ref = _grads(lambda u, v: tf.nn.conv2d(u, v, 2, "SAME"), x, k)
    for a, b in zip(fn(x, k), ref):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape,k_shape,stride,padding,forward", [
    ((1, 18, 18, 320), (3, 3, 320, 640), 2, "VALID", True),  # WRN-28-10 group 3's entry
    ((1, 34, 34, 160), (3, 3, 160, 320), 2, "VALID", False),  # group 2's entry: 16x16 out
    ((1, 16, 16, 320), (1, 1, 320, 640), 2, "VALID", True),  # group 3's 1x1 shortcut
    ((1, 32, 32, 160), (1, 1, 160, 320), 2, "SAME", False),  # group 2's: 200 per position
    ((1, 17, 17, 320), (1, 1, 320, 640), 2, "SAME", False),  # 1x1, a crop: not the pointwise
    ((1, 8, 8, 256), (1, 1, 256, 512), 2, "SAME", True),  # PreActResNet-18's last shortcut
    ((1, 14, 14, 64), (6, 6, 64, 128), 2, "VALID", True),  # CleverHans's CNN, 2nd conv
    ((1, 28, 28, 1), (8, 8, 1, 64), 2, "SAME", False),  # its first: one input channel
    ((1, 18, 18, 320), (3, 3, 320, 640), [2, 1], "VALID", False),  # unequal strides
    ((1, None, None, 320), (3, 3, 320, 640), 2, "VALID", False),  # size unknown
])
def test_strided_path_is_taken_by_the_measured_rule(x_shape, k_shape, stride, padding, forward):
    """Stride phases where the kernel has at least MIN_KERNEL_PER_OUTPUT entries per output
    position (there Eigen's transpose is slow: the shapes of the measurements); a 1x1 kernel
    from MIN_POINTWISE_PER_OUTPUT when no crop is needed."""
    x = tf.TensorSpec(x_shape, tf.float32)
    k = tf.zeros(k_shape)
    assert convolution._uses_forward(x, k, stride, padding, 1) is forward


@pytest.mark.parametrize("size,stride,padding", [
    ((8, 8), 2, "SAME"), ((9, 7), 2, "SAME"), ((9, 7), 2, "VALID"), ((10, 11), 3, "SAME")])
def test_strided_1x1_transpose_is_one_convolution_and_a_zero_interleave(size, stride, padding):
    """A 1x1 convolution at a stride reads the input positions (s i, s j) alone: its transpose
    is the output gradient times the transposed kernel there, exact zeros elsewhere -- one
    forward convolution and one pad, no stride phases of zeros (no depth_to_space)."""
    a = tf.constant(RNG.normal(size=(2, -(-size[0] // stride), -(-size[1] // stride), 5)),
                    tf.float64)
    k = tf.constant(RNG.normal(size=(1, 1, 8, 5)), tf.float64)
    ours = transpose(a, k, padding, stride, size)
    ref = tf.raw_ops.Conv2DBackpropInput(input_sizes=[2, *size, 8], filter=k, out_backprop=a,
                                         strides=[1, stride, stride, 1], padding=padding)
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-13, atol=1e-13)
    rows = np.arange(size[0]) % stride == 0
    cols = np.arange(size[1]) % stride == 0
    off = ours.numpy()[:, ~rows].ravel().tolist() + ours.numpy()[:, :, ~cols].ravel().tolist()
    assert off and set(off) == {0.0}
    ops = _ops(lambda u, v: transpose(u, v, padding, stride, size), a, k)
    assert ops.count("Conv2D") == 1 and "DepthToSpace" not in ops


def test_strided_transpose_refuses_bad_arguments():
    a, k = tf.zeros([1, 4, 4, 2]), tf.zeros([3, 3, 5, 2])
    with pytest.raises(ValueError, match=r"input_size \(H, W\) is required at stride 2"):
        transpose(a, k, "SAME", 2)
    with pytest.raises(ValueError, match=r"strides must be one positive stride for both axes"):
        transpose(a, k, "SAME", [2, 1], (8, 8))
    with pytest.raises(ValueError, match=r"input_size must be two positive ints \(H, W\), "
                                         r"got \(8, 0\)"):
        transpose(a, k, "SAME", 2, (8, 0))


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((12, 12, 8))
    h = keras.layers.Conv2D(8, 3, padding="same", name="c1")(inputs)
    h = keras.layers.ReLU()(h)
    h = keras.layers.Conv2D(8, 2, padding="valid", name="c2")(h)
    h = keras.layers.Conv2D(4, 3, strides=2, padding="same", name="c3")(h)
    return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(h)))


def _loss_and_grads(model, a):
    """``[loss, d loss / d a, d loss / d weights...]`` of ``sum(model(a)^2)``."""
    with tf.GradientTape() as tape:
        tape.watch(a)
        loss = tf.reduce_sum(tf.square(model(a)))
    return [loss, *tape.gradient(loss, [a, *model.trainable_variables])]


def test_keras_layers_inside_the_scope_compute_the_same_with_the_fast_gradient(tmp_path):
    model = _model()
    x = tf.constant(RNG.normal(size=(4, 12, 12, 8)), tf.float32)

    def grads(a):
        return _loss_and_grads(model, a)

    ref = grads(x)
    inherited = "convolution_op" not in keras.layers.Conv2D.__dict__
    original = keras.layers.Conv2D.convolution_op
    with forward_input_gradients():
        with forward_input_gradients():  # re-entrant
            assert convolution.forward_input_gradients_active()
        assert keras.layers.Conv2D.convolution_op is not original
        ours = grads(x)
        graph_ops = _ops(grads, x)
    assert not convolution.forward_input_gradients_active()
    assert keras.layers.Conv2D.convolution_op is original
    assert ("convolution_op" not in keras.layers.Conv2D.__dict__) == inherited
    # c1 and c2 take the forward path; c3 (stride 2) keeps Conv2DBackpropInput
    assert graph_ops.count("Conv2DBackpropInput") == 1
    np.testing.assert_array_equal(ours[0].numpy(), ref[0].numpy())
    for a, b in zip(ours[1:], ref[1:]):  # float32 rounding, relative to the largest entry
        assert float(tf.reduce_max(tf.abs(a - b))) <= 1e-5 * float(tf.reduce_max(tf.abs(b)))
    # the model saved after use is plain Keras: it loads without custom objects
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert [type(layer) for layer in loaded.layers] == [type(layer) for layer in model.layers]
    np.testing.assert_array_equal(loaded(x).numpy(), model(x).numpy())


def test_keras_strided_layer_takes_the_phases_where_the_rule_says(monkeypatch):
    model = _model()
    x = tf.constant(RNG.normal(size=(4, 12, 12, 8)), tf.float32)

    def grads(a):
        return _loss_and_grads(model, a)

    ref = grads(x)
    monkeypatch.setattr(convolution, "MIN_KERNEL_PER_OUTPUT", 1)  # c3: 288 entries, 36 outputs
    with forward_input_gradients():
        ours = grads(x)
        graph_ops = _ops(grads, x)
    assert graph_ops.count("Conv2DBackpropInput") == 0
    for a, b in zip(ours[1:], ref[1:]):
        assert float(tf.reduce_max(tf.abs(a - b))) <= 1e-5 * float(tf.reduce_max(tf.abs(b)))


def test_the_scope_restores_keras_after_an_error():
    original = keras.layers.Conv2D.convolution_op
    with pytest.raises(RuntimeError, match="inside"):
        with forward_input_gradients():
            raise RuntimeError("inside")
    assert keras.layers.Conv2D.convolution_op is original
