"""robustgrad.winograd: 3x3 "same" convolutions by Winograd F(2x2, 3x3) and F(4x4, 3x3) under XLA.

Values and gradients equal TensorFlow's to float rounding (float64: 1e-12; float32: the bounds the
module documents), to second order, for sizes that are not multiples of the tile and for a batch
unknown when traced; the measured rule picks the wide convolutions only; the Keras seam takes it
only when asked, in the asking thread, innermost setting first; ``AdversarialTrainer`` validates
``convolutions`` and trains to the direct step's weights within float32 rounding.
"""

from __future__ import annotations

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_convolution import _grads as conv_grads  # same directory (pytest's rootdir import)

from robustgrad import convolution, winograd
from robustgrad.convolution import conv2d, forward_input_gradients
from robustgrad.winograd import winograd_applies, winograd_conv2d, winograd_pays

RNG = np.random.default_rng(0)


def _data(x_shape, cout, dtype=tf.float64):
    x = tf.constant(RNG.normal(size=x_shape), dtype)
    k = tf.constant(RNG.normal(size=(3, 3, x_shape[-1], cout)) / np.sqrt(9 * x_shape[-1]), dtype)
    return x, k


def _rel(a, b):
    return float(tf.reduce_max(tf.abs(a - b)) / tf.reduce_max(tf.abs(b)))


def _grads(fn, x, k):
    """(y, dL/dx, dL/dk, and the gradients of |dL/dx|^2 with respect to x and k) of
    L = sum(y sin y): test_convolution's first and second order together."""
    y, gx, gk = conv_grads(fn, x, k)
    _, gxx, gkx = conv_grads(fn, x, k, order=2)
    return y, gx, gk, gxx, gkx


def _reference(x, k):
    return tf.nn.conv2d(x, k, 1, "SAME")


@pytest.mark.parametrize("tile,size", [(2, (8, 8)), (2, (4, 9)), (4, (7, 5)), (4, (1, 3))])
def test_float64_values_and_gradients_equal_tensorflows_to_second_order(tile, size):
    x, k = _data((2, *size, 5), 6)
    ours = _grads(lambda a, b: winograd_conv2d(a, b, tile), x, k)
    theirs = _grads(_reference, x, k)
    for name, a, b in zip(("y", "dx", "dk", "d2x", "d2k"), ours, theirs):
        assert a.shape == b.shape, name
        assert _rel(a, b) < 1e-12, (name, _rel(a, b))


@pytest.mark.parametrize("tile,bound", [(2, 5e-6), (4, 1e-4)])
def test_float32_error_stays_within_the_documented_bound(tile, bound):
    x, k = _data((2, 8, 8, 64), 64, tf.float32)
    exact = _reference(tf.cast(x, tf.float64), tf.cast(k, tf.float64))
    ours = winograd_conv2d(x, k, tile)
    assert ours.dtype == tf.float32
    error = _rel(tf.cast(ours, tf.float64), exact)
    assert 0 < error < bound  # Winograd rounds differently: not bit for bit, but close
    dy = tf.constant(RNG.normal(size=ours.shape), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = winograd_conv2d(x, k, tile)
    gx = tape.gradient(y, x, output_gradients=dy)
    with tf.GradientTape() as tape:
        x64 = tf.cast(x, tf.float64)
        tape.watch(x64)
        y64 = _reference(x64, tf.cast(k, tf.float64))
    gx64 = tape.gradient(y64, x64, output_gradients=tf.cast(dy, tf.float64))
    assert _rel(tf.cast(gx, tf.float64), gx64) < bound


def test_batch_unknown_when_traced_and_compiled_once_per_shape():
    x, k = _data((3, 6, 6, 4), 4)
    fn = tf.function(lambda a, b: winograd_conv2d(a, b, 4),
                     input_signature=[tf.TensorSpec([None, 6, 6, 4], tf.float64),
                                      tf.TensorSpec([3, 3, 4, 4], tf.float64)])
    for n in (1, 3):
        assert _rel(fn(x[:n], k), _reference(x[:n], k)) < 1e-12


def test_inside_an_xla_compiled_function():
    x, k = _data((2, 6, 6, 4), 3)

    @tf.function(jit_compile=True)
    def step(a, b):
        with tf.GradientTape() as tape:
            tape.watch(a)
            y = winograd_conv2d(a, b, 2)
            loss = tf.reduce_sum(y ** 2)
        return y, tape.gradient(loss, a)

    y, gx = step(x, k)
    with tf.GradientTape() as tape:
        tape.watch(x)
        ref = _reference(x, k)
        loss = tf.reduce_sum(ref ** 2)
    assert _rel(y, ref) < 1e-12
    assert _rel(gx, tape.gradient(loss, x)) < 1e-12


def test_bad_arguments_are_refused_naming_them():
    x, k = _data((1, 6, 6, 4), 4)
    for tile in (3, True, "4", 0):
        with pytest.raises(ValueError, match=r"tile must be one of \(2, 4\)"):
            winograd_conv2d(x, k, tile)
    with pytest.raises(ValueError, match="3x3 'same'"):
        winograd_conv2d(x, tf.zeros([5, 5, 4, 4], tf.float64))
    with pytest.raises(ValueError, match="float16"):
        winograd_conv2d(tf.cast(x, tf.float16), tf.cast(k, tf.float16))
    with pytest.raises(ValueError, match="kernel"):
        winograd_conv2d(x, tf.zeros([3, 3, 2, 4], tf.float64))  # not the input's channels
    with pytest.raises(ValueError, match="winograd must be None or one of"):
        conv2d(x, k, padding="SAME", winograd=8)
    with pytest.raises(ValueError, match="winograd must be None, 'inherit' or one of"):
        with forward_input_gradients(winograd=1):
            pass


@pytest.mark.parametrize("strides,padding,dilations,expected", [
    (1, "SAME", 1, True), ([1, 1, 1, 1], "SAME", [1, 1], True),
    (1, [[1, 1], [1, 1]], 1, True), (1, [[0, 0], [1, 1], [1, 1], [0, 0]], 1, True),
    (2, "SAME", 1, False), (1, "VALID", 1, False), (1, "SAME", 2, False),
    (1, [[0, 2], [1, 1]], 1, False),
])
def test_applies_only_to_stride_1_same_undilated(strides, padding, dilations, expected):
    x, k = _data((1, 8, 8, 4), 4)
    assert winograd_applies(x, k, strides, padding, dilations) is expected


def test_the_measured_rule_takes_wide_convolutions_only():
    def pays(cin, cout, hw=8):
        return winograd_pays(tf.zeros([1, hw, hw, cin]), tf.zeros([3, 3, cin, cout]))

    assert pays(160, 160) and pays(128, 128) and pays(640, 640) and pays(512, 512, hw=4)
    assert not pays(64, 64) and not pays(16, 160) and not pays(96, 128)  # 54.9 < 64
    assert winograd.MIN_WIDTH == 64
    # unknown height or width, a 5x5 kernel: never
    assert not winograd_pays(tf.keras.Input([None, None, 256]), tf.zeros([3, 3, 256, 256]))
    assert not winograd_pays(tf.zeros([1, 8, 8, 256]), tf.zeros([5, 5, 256, 256]))


def _count_calls(monkeypatch):
    calls = []
    original = convolution.winograd_conv2d

    def counting(x, kernel, tile=4):
        calls.append(tile)
        return original(x, kernel, tile)

    monkeypatch.setattr(convolution, "winograd_conv2d", counting)
    return calls


def test_conv2d_takes_winograd_only_when_asked_and_where_it_pays(monkeypatch):
    calls = _count_calls(monkeypatch)
    x, k = _data((1, 4, 4, 128), 128)
    assert bool(tf.reduce_all(conv2d(x, k, padding="SAME") == _reference(x, k)))
    assert calls == []
    assert _rel(conv2d(x, k, padding="SAME", winograd=2), _reference(x, k)) < 1e-12
    assert calls == [2]
    narrow, kn = _data((1, 4, 4, 16), 16)
    conv2d(narrow, kn, padding="SAME", winograd=4)
    conv2d(x, k, strides=2, padding="SAME", winograd=4)
    assert calls == [2]


def test_keras_scope_winograd_in_this_thread_only_innermost_first(monkeypatch):
    calls = _count_calls(monkeypatch)
    layer = keras.layers.Conv2D(128, 3, padding="same")
    x = tf.constant(RNG.normal(size=(1, 4, 4, 128)), tf.float32)
    direct = layer(x)
    seen = []

    def other_thread():
        seen.append(bool(tf.reduce_all(layer(x) == direct)))

    with forward_input_gradients(winograd=4):
        y = layer(x)
        assert calls == [4]
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        with forward_input_gradients(winograd=None):  # the innermost setting holds: direct
            assert bool(tf.reduce_all(layer(x) == direct))
            with forward_input_gradients():  # inherits None
                assert bool(tf.reduce_all(layer(x) == direct))
        with forward_input_gradients(winograd=2):
            layer(x)
        with forward_input_gradients():  # inherits 4 (an attack traced in a training step)
            layer(x)
    assert seen == [True] and calls == [4, 2, 4]
    assert _rel(y, direct) < 1e-4
    assert bool(tf.reduce_all(layer(x) == direct))  # after the scope: Keras' own


def _cnn(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((6, 6, 3)),
        keras.layers.Conv2D(128, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(128, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])


def test_trainer_validates_and_saves_the_setting():
    from attacks.training import AdversarialTrainer

    with pytest.raises(ValueError, match="convolutions must be one of 'auto', 'direct', "
                                         "'winograd'; got 'fast'"):
        AdversarialTrainer(_cnn(), eps=0.1, convolutions="fast")
    with pytest.raises(TypeError, match="convolutions must be one of"):
        AdversarialTrainer(_cnn(), eps=0.1, convolutions=4)
    trainer = AdversarialTrainer(_cnn(), eps=0.1)
    assert trainer.convolutions == "auto" and trainer.get_config()["convolutions"] == "auto"
    assert trainer.winograd_tile() == (None if tf.config.list_physical_devices("GPU") else 4)
    assert AdversarialTrainer(_cnn(), eps=0.1, convolutions="direct").winograd_tile() is None
    assert AdversarialTrainer(_cnn(), eps=0.1, convolutions="winograd").winograd_tile() == 4


def test_trainer_step_with_winograd_matches_the_direct_step(monkeypatch):
    from attacks import projected_gradient_descent
    from attacks.training import AdversarialTrainer

    calls = _count_calls(monkeypatch)
    x = tf.constant(RNG.uniform(size=(8, 6, 6, 3)), tf.float32)
    y = tf.constant(RNG.integers(0, 4, size=8), tf.int32)
    weights = {}
    for mode in ("direct", "winograd"):
        trainer = AdversarialTrainer(_cnn(), eps=0.1, steps=3, convolutions=mode,
                                     random_start=False)
        trainer.compile(optimizer=keras.optimizers.SGD(0.5))
        trainer.fit(x, y, batch_size=8, epochs=2, verbose=0)
        weights[mode] = trainer.model.get_weights()
        # the second 3x3 layer (128 -> 128), in the crafting loop and in the update
        assert (len(calls) >= 2) == (mode == "winograd"), calls
        traced = len(calls)  # evaluation (its PGD loop too) and attacks outside: direct
        trainer.evaluate(x, y, batch_size=8, verbose=0)
        projected_gradient_descent(trainer.model, x, y, eps=0.1, steps=3, clip_min=0.0, rand_init=False,
                                   clip_max=1.0)
        assert len(calls) == traced
    moved = max(float(np.max(np.abs(a - b)))
                for a, b in zip(weights["direct"], _cnn().get_weights()))
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(weights["direct"], weights["winograd"]))
    assert moved > 1e-3 and gap < 1e-4 * max(moved, 1.0)


def test_attack_traces_are_not_shared_across_winograd_settings(monkeypatch):
    from attacks import projected_gradient_descent

    calls = _count_calls(monkeypatch)
    model = _cnn()
    x = tf.constant(RNG.uniform(size=(4, 6, 6, 3)), tf.float32)
    y = tf.constant([0, 1, 2, 3])

    def attack():
        return projected_gradient_descent(model, x, y, eps=0.1, steps=2, clip_min=0.0,
                                          clip_max=1.0, rand_init=False)

    direct = attack()  # traced (and cached) outside any scope
    assert calls == []
    with forward_input_gradients(winograd=4):
        ours = attack()  # the same configuration: traced again, with Winograd
    assert calls == [4]
    assert bool(tf.reduce_all(attack() == direct))  # and the direct trace is still the one
    assert calls == [4]
    assert float(tf.reduce_max(tf.abs(ours - direct))) <= 0.2 + 1e-6  # both inside the ball
