"""Attacks split a large batch into chunks by themselves (attacks._base.run_in_chunks).

Deterministic attacks give the same result chunked and whole; random ones are reproducible per
(seed, batch_size) and keep their guarantees; the counts add up; data anywhere in the batch is
checked before the first chunk runs; the last, smaller chunk does not retrace.
"""

import sys

import numpy as np
import pytest
import tensorflow as tf

import attacks
from attacks import norms
from attacks._base import DEFAULT_BATCH_SIZE

from small_models import Linear, SmallNet, small_batch

BOX = dict(clip_min=0.0, clip_max=1.0)

DETERMINISTIC = {
    "fgsm": lambda m, x, y, **kw: attacks.fast_gradient_method(m, x, y, eps=0.1, **kw),
    "fgm-l2": lambda m, x, y, **kw: attacks.fast_gradient_method(m, x, y, eps=0.5, norm="l2",
                                                                 **kw),
    "pgd-no-random-start": lambda m, x, y, **kw: attacks.projected_gradient_descent(
        m, x, y, eps=0.1, steps=5, rand_init=False, **kw),
    "pgd-early-stop-restarts": lambda m, x, y, **kw: attacks.projected_gradient_descent(
        m, x, y, eps=0.1, steps=5, restarts=2, rand_init=False, early_stop=True, **kw),
    "bim": lambda m, x, y, **kw: attacks.basic_iterative_method(m, x, y, eps=0.1, steps=5, **kw),
    "mim": lambda m, x, y, **kw: attacks.momentum_iterative_method(m, x, y, eps=0.1, steps=5,
                                                                   **kw),
    "deepfool": lambda m, x, y, **kw: attacks.deepfool(m, x, y, steps=5, eps=0.5, **kw),
    "cw": lambda m, x, y, **kw: attacks.carlini_wagner_l2(m, x, y, steps=5, binary_search_steps=2,
                                                          **kw),
}


@pytest.mark.parametrize("name", list(DETERMINISTIC))
def test_deterministic_attacks_give_the_same_result_chunked(name):
    model, x = SmallNet(), small_batch(10)
    y = np.arange(10) % 5
    whole = DETERMINISTIC[name](model, x, y, **BOX).numpy()
    chunked = DETERMINISTIC[name](model, x, y, batch_size=3, **BOX).numpy()  # 3+3+3+1
    # the same up to float32 rounding: matrix kernels differ with the number of rows (a last
    # chunk of one row is a matrix-vector product), which moves an L2 normalisation by an ulp
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=2e-7)
    assert np.abs(whole - x).max() > 0  # the attack moved the inputs


def test_the_default_chunks_a_large_batch_at_1024_examples():
    class WidestBatch(Linear):  # records the largest batch it is called on, inside the graph
        def __init__(self):
            super().__init__([1.0, -2.0])
            self.widest = tf.Variable(0, dtype=tf.int32)

        def __call__(self, x, training=False):
            self.widest.assign(tf.maximum(self.widest, tf.shape(x)[0]))
            return super().__call__(x, training)

    x = np.random.default_rng(0).uniform(0.2, 0.8, (2500, 2)).astype(np.float32)
    y = np.zeros(2500, np.int64)
    model = WidestBatch()
    whole = attacks.fast_gradient_method(model, x, y, eps=0.1, batch_size=2500, **BOX)
    assert int(model.widest.numpy()) == 2500
    model.widest.assign(0)
    default = attacks.fast_gradient_method(model, x, y, eps=0.1, **BOX)
    assert DEFAULT_BATCH_SIZE == 1024 and int(model.widest.numpy()) == 1024
    np.testing.assert_array_equal(default.numpy(), whole.numpy())
    np.testing.assert_allclose(default.numpy(), np.clip(x + 0.1 * np.array([-1.0, 1.0]), 0, 1),
                               atol=1e-6)  # class 0: lower x.w with w = (1, -2)


def test_counts_add_up_over_chunks():
    model, x = SmallNet(), small_batch(10)
    pgd = attacks.PGD(eps=0.1, steps=4, rand_init=False, **BOX)
    whole, chunked = pgd.run(model, x), pgd.run(model, x, batch_size=3)
    np.testing.assert_array_equal(chunked.x_adv.numpy(), whole.x_adv.numpy())
    assert whole.gradient_passes == chunked.gradient_passes == 40  # 4 steps x 10 rows
    assert whole.forward_passes == chunked.forward_passes == 10    # the labels (y=None)
    square = attacks.Square(eps=0.1, steps=20, early_stop=False, **BOX)
    images = small_batch(10)
    assert square.run(model, images, batch_size=4).forward_passes == 10 + 10 * 21


RANDOM = {
    "pgd": lambda m, x, **kw: attacks.projected_gradient_descent(m, x, eps=0.1, steps=5, **kw),
    "pgd-l2-restarts": lambda m, x, **kw: attacks.projected_gradient_descent(
        m, x, eps=0.5, norm="l2", steps=5, restarts=2, **kw),
    "apgd": lambda m, x, **kw: attacks.apgd(m, x, eps=0.1, steps=10, **kw),
    "square": lambda m, x, **kw: attacks.square(m, x, eps=0.1, steps=30, **kw),
}


@pytest.mark.parametrize("name", list(RANDOM))
def test_seeded_random_attacks_chunked_are_reproducible_and_in_the_ball(name):
    model, x = SmallNet(), small_batch(10)
    eps, norm = (0.5, "l2") if "l2" in name else (0.1, "linf")
    first = RANDOM[name](model, x, seed=7, batch_size=4, **BOX).numpy()
    again = RANDOM[name](model, x, seed=7, batch_size=4, **BOX).numpy()
    np.testing.assert_array_equal(first, again)
    assert first.shape == x.shape and first.dtype == x.dtype
    assert np.all(norms.norm(tf.constant(first - x), norm).numpy() <= eps + 1e-6)
    assert first.min() >= 0.0 and first.max() <= 1.0


def test_each_chunk_draws_its_own_random_start():
    model = Linear(np.ones(16))
    x = np.full((8, 4, 4, 1), 0.5, np.float32)  # identical rows: only the random start differs
    start = attacks.projected_gradient_descent(model, x, eps=0.1, steps=1, step_size=0.0,
                                               seed=3, batch_size=4, **BOX).numpy()
    assert np.abs(start - x).max() > 0
    assert not np.array_equal(start[:4], start[4:])  # two chunks of the same shape


def test_the_smaller_last_chunk_does_not_retrace():
    model, x = SmallNet(), small_batch(10)
    attacks.basic_iterative_method(model, x, eps=0.1, steps=3, batch_size=3, **BOX)
    traces = model.traces
    attacks.basic_iterative_method(model, x, eps=0.1, steps=3, batch_size=4, **BOX)
    attacks.basic_iterative_method(model, small_batch(7), eps=0.1, steps=3, **BOX)
    assert model.traces == traces


class CallLog:
    """Linear logits over 16 features that records whether it ran eagerly (a probe) or traced."""

    def __init__(self):
        self.inner = SmallNet()
        self.calls = []

    def __call__(self, x, training=False):
        self.calls.append("eager" if tf.executing_eagerly() else "traced")
        return self.inner(x)


@pytest.mark.parametrize("bad, message", [
    (0, "batch_size must be an int >= 1, got 0"),
    (-5, "batch_size must be an int >= 1, got -5"),
    (2.5, "batch_size must be an int"),
    ("64", "batch_size must be an int"),
])
def test_a_bad_batch_size_is_refused_before_any_work(bad, message):
    model = CallLog()
    with pytest.raises(ValueError, match=message):
        attacks.projected_gradient_descent(model, small_batch(4), eps=0.1, batch_size=bad, **BOX)
    with pytest.raises(ValueError, match=message):
        attacks.PGD(eps=0.1, batch_size=bad)
    with pytest.raises(ValueError, match=message):
        attacks.square(model, small_batch(4), eps=0.1, batch_size=bad, **BOX)
    assert model.calls == []


def test_bad_data_in_a_later_chunk_is_found_before_the_first_chunk_runs():
    x = small_batch(40)
    y = np.arange(40) % 5
    nan_x = x.copy()
    nan_x[-1, 0, 0, 0] = np.nan
    model = CallLog()
    with pytest.raises(ValueError, match="x contains NaN or Inf values"):
        attacks.projected_gradient_descent(model, nan_x, y, eps=0.1, batch_size=8, **BOX)
    outside = x.copy()
    outside[-1, 0, 0, 0] = 1.5
    with pytest.raises(ValueError, match=r"x has values outside \[clip_min, clip_max\]"):
        attacks.fast_gradient_method(model, outside, y, eps=0.1, batch_size=8, **BOX)
    bad_y = y.copy()
    bad_y[-1] = 7
    with pytest.raises(ValueError, match=r"y has labels outside \[0, 5\) \(min 0, max 7\)"):
        attacks.apgd(model, x, bad_y, eps=0.1, steps=5, batch_size=8, **BOX)
    assert "traced" not in model.calls  # only the eager probe ran: no compiled work


def test_structures_and_dtypes_survive_chunking():
    net = SmallNet()

    def two_heads(x, training=False):
        return {"logits": net(x), "features": x}

    x = small_batch(10)
    heads = attacks.select_output(two_heads, "logits")
    kw = dict(eps=0.1, steps=3, rand_init=False, **BOX)
    np.testing.assert_array_equal(
        attacks.projected_gradient_descent(heads, x, batch_size=3, **kw).numpy(),
        attacks.projected_gradient_descent(heads, x, **kw).numpy())

    # y a structure with a leading batch dimension, for a callable objective
    clean = {"away": tf.one_hot(tf.argmax(net(x), -1), 5),
             "weight": tf.range(1, 11, dtype=tf.float32)}

    def kl_away(logits, y):  # weighted cross-entropy away from the clean class
        return -y["weight"] * tf.reduce_sum(y["away"] * tf.nn.log_softmax(logits), -1)

    np.testing.assert_array_equal(
        attacks.projected_gradient_descent(net, x, clean, objective=kl_away, batch_size=4,
                                           **kw).numpy(),
        attacks.projected_gradient_descent(net, x, clean, objective=kl_away, **kw).numpy())

    # model=None with a per-example loss_fn
    def loss_fn(xa):
        return tf.reduce_sum(tf.reshape(xa, [tf.shape(xa)[0], -1]) ** 2, axis=1)

    np.testing.assert_array_equal(
        attacks.projected_gradient_descent(None, x, loss_fn=loss_fn, batch_size=3, **kw).numpy(),
        attacks.projected_gradient_descent(None, x, loss_fn=loss_fn, **kw).numpy())

    # numpy and tf inputs, and the input dtype comes back
    for given in (x.astype(np.float64), tf.constant(x, tf.float16), tf.constant(x)):
        out = attacks.fast_gradient_method(net, given, eps=0.1, batch_size=4, **BOX)
        whole = attacks.fast_gradient_method(net, given, eps=0.1, **BOX)
        assert out.dtype == tf.as_dtype(given.dtype) and out.shape == (10, 4, 4, 1)
        np.testing.assert_array_equal(out.numpy(), whole.numpy())


def test_images_without_a_channel_axis_chunk_in_square():
    model = Linear(np.ones(16))
    x = small_batch(6)[..., 0]
    out = attacks.square(model, x, eps=0.1, steps=10, seed=1, batch_size=4, **BOX).numpy()
    assert out.shape == (6, 4, 4)
    assert np.abs(out - x).max() <= 0.1 + 1e-6


def test_inside_a_tf_function_the_batch_runs_in_one_piece():
    net, x = SmallNet(), tf.constant(small_batch(10))
    y = tf.constant(np.arange(10) % 5)

    @tf.function
    def craft(xb, yb):
        return attacks.fast_gradient_method(net, xb, yb, eps=0.1, batch_size=3, **BOX)

    np.testing.assert_array_equal(craft(x, y).numpy(),
                                  attacks.fast_gradient_method(net, x, y, eps=0.1, **BOX).numpy())


def test_the_attack_config_keeps_batch_size():
    pgd = attacks.PGD(eps=0.1, steps=3, batch_size=256)
    assert pgd.get_config()["batch_size"] == 256
    assert attacks.PGD.from_config(pgd.get_config()).config == pgd.config
    assert pgd.replace(batch_size=None).config["batch_size"] is None


@pytest.mark.parametrize("attack", [attacks.deepfool, attacks.fab])
def test_jacobian_attacks_chunk_at_1024_over_the_classes_by_default(attack, monkeypatch):
    # DeepFool and FAB differentiate every class: one default chunk of 1024 examples of 10
    # classes took 4-5 GiB (benchmarks/attack_memory.py); their default chunk is 1024 // 10
    import attacks._base as base

    sizes, real = [], base.run_in_chunks
    monkeypatch.setattr(sys.modules[attack.__module__], "run_in_chunks",
                        lambda p, call: sizes.append(p.batch_size) or real(p, call))
    model = lambda x, training=False: tf.matmul(x, tf.eye(2, 10))  # noqa: E731 - 10 classes
    x = tf.random.stateless_uniform([4, 2], [0, 1], 0.2, 0.8)
    attack(model, x, eps=0.1, steps=2, **BOX)
    attack(model, x, eps=0.1, steps=2, batch_size=3, **BOX)
    assert sizes == [102, 3]
