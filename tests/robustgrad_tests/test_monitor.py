"""Tests for robustgrad.monitor."""

import doctest
import glob

import keras
import numpy as np
import pytest
import tensorflow as tf

from robustgrad import monitor


def test_docstring_examples():
    assert doctest.testmod(monitor, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0


def test_gradient_stats_values_and_none_by_name():
    w = tf.Variable(tf.zeros((2, 2)), name="w")
    b = tf.Variable(tf.zeros((2,)), name="b")
    c = tf.Variable(tf.zeros((1,)), name="c")
    grads = [tf.constant([[3.0, 0.0], [0.0, -4.0]]), None, tf.constant([np.nan])]
    s = monitor.gradient_stats(grads, [w, b, c])
    assert s["none"] == ("b",)
    assert set(s["norms"]) == {"w", "c"}
    np.testing.assert_allclose(float(s["norms"]["w"]), 5.0)
    assert int(s["nonfinite_count"]) == 1
    np.testing.assert_allclose(float(s["max_abs"]), 4.0)
    assert np.isnan(float(s["global_norm"]))
    s = monitor.gradient_stats(grads[:2], [w, b])
    np.testing.assert_allclose(float(s["global_norm"]), 5.0)
    assert int(s["nonfinite_count"]) == 0


def test_gradient_stats_keras_paths_and_tf_function():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d1"),
                              keras.layers.Dense(2, name="d2")])
    vs = model.trainable_variables
    traces = []

    @tf.function
    def f(x):
        traces.append(1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        return monitor.gradient_stats(tape.gradient(loss, vs), vs)

    for _ in range(2):
        s = f(tf.ones((4, 3)))
    assert len(traces) == 1
    assert set(s["norms"]) == {v.path for v in vs}
    expected = np.sqrt(sum(float(tf.reduce_sum(tf.square(n))) for n in s["norms"].values()))
    np.testing.assert_allclose(float(s["global_norm"]), expected, rtol=1e-6)


def test_duplicate_names_are_disambiguated():
    a, b = tf.Variable(1.0, name="v"), tf.Variable(2.0, name="v")
    s = monitor.gradient_stats([tf.constant(1.0), tf.constant(2.0)], [a, b])
    assert set(s["norms"]) == {"v", "v_1"}


def test_write_gradient_summaries(tmp_path):
    w = tf.Variable(tf.zeros((2,)), name="w")
    stats = monitor.gradient_stats([tf.constant([3.0, 4.0])], [w])
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def write(step):
        return monitor.write_gradient_summaries(stats, step, writer=writer, prefix="g")

    assert bool(write(tf.constant(3, tf.int64)))
    writer.flush()
    tags = {}
    for path in glob.glob(str(tmp_path / "events*")):
        for rec in tf.data.TFRecordDataset(path):
            ev = tf.compat.v1.Event.FromString(rec.numpy())
            for v in ev.summary.value:
                tags[v.tag] = (ev.step, float(tf.make_ndarray(v.tensor)))
    assert tags["g/global_norm"] == (3, 5.0)
    assert tags["g/norm/w"] == (3, 5.0)
    assert {"g/nonfinite_count", "g/max_abs", "g/none_count"} <= set(tags)
    # no writer and no default writer: nothing written
    assert not bool(monitor.write_gradient_summaries(stats, 0))


def test_bad_input():
    with pytest.raises(ValueError, match="variables"):
        monitor.gradient_stats([tf.ones(1)], [])
    with pytest.raises(ValueError, match="stats"):
        monitor.write_gradient_summaries({}, 0)
    with pytest.raises(TypeError, match="grads"):
        monitor.gradient_stats([tf.constant([1])], [tf.Variable([1])])
