"""Gradient checkpointing of the training-mode pass (attacks.training.recompute, issue 38)."""

import numpy as np
import pytest
import tensorflow as tf

from attacks.training import AdversarialTrainer, checkpoint_segments, checkpointed_call, make_model
from robustgrad.errors import ConfigError


def _twins(arch="wrn-10-2"):
    a = make_model(arch, (8, 8, 3), 4, mean=0.5, std=0.25)
    b = make_model(arch, (8, 8, 3), 4, mean=0.5, std=0.25)
    b.set_weights(a.get_weights())
    return a, b


def test_segments_are_the_residual_blocks():
    model = make_model("wrn-10-1", (8, 8, 3), 4)
    names = [[n.operation.name for n in seg] for seg in checkpoint_segments(model)]
    assert [s[-1] for s in names] == ["group1_block1_add", "group2_block1_add",
                                      "group3_block1_add", "logits"]
    assert sum(len(s) for s in names) == len(model.layers) - 1  # every layer but the input
    assert checkpoint_segments(lambda x, training=False: x) == []


def test_same_outputs_gradients_and_statistics_as_the_plain_call():
    plain, ckpt = _twins()
    x = tf.constant(np.random.default_rng(0).random((4, 8, 8, 3)), tf.float32)
    y = tf.constant([0, 1, 2, 3])

    def step(model, call):
        with tf.GradientTape() as tape:
            tape.watch(x)
            logits = call(model, x)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        return logits, tape.gradient(loss, [x] + [v.value for v in model.trainable_variables])

    want = tf.function(lambda: step(plain, lambda m, z: m(z, training=True)))()
    got = tf.function(lambda: step(ckpt, checkpointed_call))()
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # the moving statistics moved once (not again in the recomputation), as the plain call's
    for a, b in zip(plain.non_trainable_variables, ckpt.non_trainable_variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-7)
    assert not np.allclose(plain.non_trainable_variables[1].numpy(), 1.0)  # they did move


def test_trainer_step_with_recompute_matches():
    plain, ckpt = _twins("wrn-10-1")
    x = np.random.default_rng(1).random((4, 8, 8, 3)).astype("float32")
    y = np.array([0, 1, 2, 3])
    trainers = []
    for model, recompute in ((plain, False), (ckpt, True)):
        tr = AdversarialTrainer(model, method="madry", eps=0.03, steps=1, weight_decay=5e-4,
                                recompute=recompute)
        tr.compile(optimizer="sgd")
        tr.train_on_batch(x, y)
        trainers.append(tr)
    for a, b in zip(plain.weights, ckpt.weights):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
    assert trainers[1].get_config()["recompute"] is True
    with pytest.raises(TypeError, match="recompute"):
        AdversarialTrainer(plain, recompute="yes")


def test_train_classifier_recompute_flag_reaches_the_trainer(tmp_path):
    from attacks.training import run as run_module
    from attacks.training.config import ClassifierConfig
    from robustgrad import cli

    parser = cli.build_parser("train-classifier")
    args = parser.parse_args(["train-classifier", "--out", str(tmp_path / "o"), "--method",
                              "madry", "--recompute"])
    args._validate(args)
    config = ClassifierConfig.from_record(vars(args))
    assert config.recompute is True
    assert ClassifierConfig.from_record(
        vars(parser.parse_args(["train-classifier", "--out", "o"]))).recompute is False
    resolved = config.resolve().resolved_view()
    model = make_model("wrn-10-1", (8, 8, 3), 4)
    data = type("Data", (), {"clip_min": 0.0, "clip_max": 1.0})()
    trainer = run_module._make_trainer(resolved, model, data, spe=10)
    assert trainer.recompute is True
    with pytest.raises(ConfigError, match=r"^recompute must be True or False, got 'yes'$"):
        ClassifierConfig(recompute="yes")


def test_a_sequential_model_is_recomputed_too():
    import keras

    model = keras.Sequential([keras.Input((6,))] + [keras.layers.Dense(5, activation="relu")
                                                     for _ in range(8)] + [keras.layers.Dense(3)])
    assert len(checkpoint_segments(model)) >= 3
    x = tf.constant(np.random.default_rng(2).random((4, 6)), tf.float32)

    def grads(call):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = tf.reduce_sum(call(x) ** 2)
        return tape.gradient(out, [x] + [v.value for v in model.trainable_variables])

    want = tf.function(lambda: grads(lambda z: model(z, training=True)))()
    got = tf.function(lambda: grads(lambda z: checkpointed_call(model, z)))()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_recompute_on_a_subclassed_init_from_model_is_refused():
    import keras

    from attacks.training import run as run_module
    from attacks.training.config import ClassifierConfig

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(4)

        def call(self, x, training=False):
            return self.dense(keras.ops.reshape(x, (-1, 192)))

    model = Sub()
    model(np.zeros((1, 8, 8, 3), "float32"))
    data = type("Data", (), {"num_classes": 4})()
    split = type("Split", (), {"x_te": np.zeros((2, 8, 8, 3), "float32"), "data": data})()
    config = ClassifierConfig(init_from="sub.keras", recompute=True).resolve().resolved_view()
    with pytest.raises(ConfigError, match=r"^--recompute: the model of --init-from sub\.keras is "
                                          r"not a Keras functional or Sequential model with one "
                                          r"input and one output, so it cannot be recomputed "
                                          r"block by block; train it without --recompute$"):
        run_module._initial_model(config, split, model)
    plain = ClassifierConfig(init_from="sub.keras").resolve().resolved_view()
    assert run_module._initial_model(plain, split, model) is model
