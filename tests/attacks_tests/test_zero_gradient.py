"""A gradient that is identically zero where the method needs it is a warning, whatever the
model's output layer (issue 24)."""

import warnings

import numpy as np
import tensorflow as tf

import attacks
from attacks.training.crafting import ascend
from robustgrad import input_gradient

W = tf.constant([[1.0], [1.0]])


def clipped(x, training=False):
    """Logits 10 * clip(x0 + x1, -1, 1) * (1, -1): flat (zero gradient) where |x0 + x1| > 1;
    no softmax anywhere."""
    z = tf.clip_by_value(x @ W, -1.0, 1.0)
    return 10.0 * tf.concat([z, -z], axis=1)


# four examples on the flat part (x0 + x1 = 1.6 or -1.6), four on the slope (|x0 + x1| <= 0.4)
X = tf.constant([[0.8, 0.8], [-0.8, -0.8], [0.9, 0.7], [-0.7, -0.9],
                 [0.1, 0.1], [-0.1, 0.2], [0.2, -0.2], [0.0, 0.1]])
Y = tf.constant([0, 1, 0, 1, 0, 1, 0, 1])


def _messages(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught]


def test_pgd_warns_when_the_gradient_is_zero_on_many_examples():
    got = _messages(lambda: attacks.projected_gradient_descent(
        clipped, X, Y, eps=0.05, clip_min=-1.0, clip_max=1.0, steps=3, rand_init=False))
    assert any(m.startswith("the input gradient is identically zero on 4 of 8 examples (50%)")
               for m in got), got
    # no warning where the gradient exists: the same attack on the slope examples only
    assert not _messages(lambda: attacks.projected_gradient_descent(
        clipped, X[4:], Y[4:], eps=0.05, clip_min=-1.0, clip_max=1.0, steps=3,
        rand_init=False))


def test_input_gradient_warns_on_zero_rows_without_a_softmax():
    got = _messages(lambda: input_gradient(clipped, X, Y))
    assert [m[:57] for m in got] == ["the input gradient is identically zero on 4 of 8 examples"]


def test_crafting_inside_a_graph_warns_when_x_has_no_gradient_path():
    bias = tf.Variable([[1.0, -1.0]])

    @tf.function
    def craft(x):  # the logits ignore x: the ascent cannot move it
        return ascend(lambda z: bias + 0.0 * tf.stop_gradient(z), lambda lg: lg[:, 0], x,
                      eps=0.1, step_size=0.05, steps=2, norm="linf", clip_min=-1.0,
                      clip_max=1.0, seed=tf.constant([0, 0]), start="none")

    got = _messages(lambda: craft(X))
    assert any("objective has no gradient with respect to x" in m for m in got), got
    np.testing.assert_array_equal(craft(X).numpy(), X.numpy())


def test_one_warning_per_call_whatever_the_restarts():
    # the count is taken once, at the first step of the first restart
    got = _messages(lambda: attacks.projected_gradient_descent(
        clipped, X, Y, eps=0.05, clip_min=-1.0, clip_max=1.0, steps=2, restarts=3,
        rand_init=False))
    assert sum("identically zero on 4 of 8" in m for m in got) == 1, got


def test_apgd_warns_when_x_has_no_gradient_path_and_leaves_x_alone():
    bias = tf.Variable([[1.0, -1.0]])

    def ignores_x(x, training=False):
        return bias + 0.0 * tf.stop_gradient(x[:, :1])

    @tf.function  # inside a graph the eager check of the model is skipped: the attack warns
    def attack(x):
        return attacks.apgd(ignores_x, x, Y, eps=0.1, clip_min=-1.0, clip_max=1.0, steps=4,
                            seed=0)

    got = _messages(lambda: attack(X))
    assert any("objective has no gradient with respect to x" in m for m in got), got
    assert float(tf.reduce_max(tf.abs(attack(X) - X))) <= 0.1 + 1e-6  # the random start only


def test_adversarial_training_warns_about_a_variable_the_loss_ignores():
    import keras

    from attacks.training import AdversarialTrainer

    inputs = keras.Input((2,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="used")(inputs))
    ghost = keras.layers.Dense(2, name="ghost")
    ghost.build((None, 2))
    model.ghost = ghost  # tracked, trainable, never called
    trainer = AdversarialTrainer(model, eps=0.05, steps=1, clip_min=-1.0, clip_max=1.0)
    trainer.compile(optimizer=keras.optimizers.SGD(0.1))
    got = _messages(lambda: trainer.fit(X, Y, batch_size=8, epochs=1, verbose=0))
    assert any(m.startswith("no gradient reaches 2 trainable variable(s) of the classifier")
               and "ghost/kernel, ghost/bias" in m for m in got), got
    # a model whose every variable gets a gradient: no such warning
    clean = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    trainer = AdversarialTrainer(clean, eps=0.05, steps=1, clip_min=-1.0, clip_max=1.0)
    trainer.compile(optimizer=keras.optimizers.SGD(0.1))
    assert not [m for m in _messages(lambda: trainer.fit(X, Y, batch_size=8, epochs=1, verbose=0))
                if m.startswith("no gradient reaches")]


def test_fgsm_warns_on_a_one_logit_model_with_labels_all_zero():
    # one logit: the cross-entropy of label 0 is log-softmax of one value, 0 everywhere
    one_logit = lambda x, training=False: x @ W  # noqa: E731
    for norm in ("linf", "l2"):
        got = _messages(lambda n=norm: attacks.fast_gradient_method(
            one_logit, X, tf.zeros([8], tf.int64), eps=0.1, norm=n, clip_min=-1.0,
            clip_max=1.0))
        assert [m[:57] for m in got] == ["the input gradient is identically zero on 8 of 8 examples"]
    # the same count through chunks (batch_size=3): one warning with the whole batch's count
    got = _messages(lambda: attacks.fast_gradient_method(
        clipped, X, Y, eps=0.05, clip_min=-1.0, clip_max=1.0, batch_size=3))
    assert [m[:57] for m in got] == ["the input gradient is identically zero on 4 of 8 examples"]
    assert not _messages(lambda: attacks.fast_gradient_method(
        clipped, X[4:], Y[4:], eps=0.05, clip_min=-1.0, clip_max=1.0))
