"""Gradient checkpointing of the training-mode pass (attacks.training.recompute, issue 38)."""

import numpy as np
import pytest
import tensorflow as tf

from attacks.training import (
    AdversarialTrainer,
    activation_groups,
    checkpoint_segments,
    checkpointed_call,
    make_model,
    recomputed_activations_call,
)
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
    assert trainers[0].recompute == "none"
    assert trainers[1].get_config()["recompute"] == "blocks"  # True: the earlier boolean
    with pytest.raises(ValueError, match=r"^recompute must be one of 'none', 'activations', "
                                         r"'blocks' \(or True/False\); got 'yes'$"):
        AdversarialTrainer(plain, recompute="yes")
    with pytest.raises(TypeError, match=r"^recompute must be one of .*; got 1$"):
        AdversarialTrainer(plain, recompute=1)


def test_the_trainer_recomputes_activations_by_default_with_the_same_weights():
    plain, ours = _twins("wrn-10-1")
    x = np.random.default_rng(4).random((4, 8, 8, 3)).astype("float32")
    y = np.array([0, 1, 2, 3])
    trainers = []
    for model, options in ((plain, {"recompute": "none"}), (ours, {})):
        tr = AdversarialTrainer(model, method="madry", eps=0.03, steps=1, weight_decay=5e-4,
                                **options)
        tr.compile(optimizer="sgd")
        tr.train_on_batch(x, y)
        trainers.append(tr)
    assert trainers[1].recompute == "activations"
    assert AdversarialTrainer.from_config(trainers[1].get_config()).recompute == "activations"
    for a, b in zip(plain.weights, ours.weights):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-7)


def test_train_classifier_recompute_flag_reaches_the_trainer(tmp_path):
    from attacks.training import run as run_module
    from attacks.training.config import ClassifierConfig
    from robustgrad import cli

    parser = cli.build_parser("train-classifier")
    args = parser.parse_args(["train-classifier", "--out", str(tmp_path / "o"), "--method",
                              "madry", "--recompute"])
    args._validate(args)
    config = ClassifierConfig.from_record(vars(args))
    assert config.recompute == "blocks"  # the flag alone, as before
    assert ClassifierConfig.from_record(
        vars(parser.parse_args(["train-classifier", "--out", "o"]))).recompute == "activations"
    assert ClassifierConfig.from_record(vars(parser.parse_args(
        ["train-classifier", "--out", "o", "--recompute", "none"]))).recompute == "none"
    assert ClassifierConfig(recompute=False).recompute == "none"  # an earlier run's record
    resolved = config.resolve().resolved_view()
    model = make_model("wrn-10-1", (8, 8, 3), 4)
    data = type("Data", (), {"clip_min": 0.0, "clip_max": 1.0})()
    trainer = run_module._make_trainer(resolved, model, data, spe=10)
    assert trainer.recompute == "blocks"
    with pytest.raises(ConfigError, match=r"^recompute must be one of 'none', 'activations', "
                                          r"'blocks' \(or True/False\); got 'yes'$"):
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


# ---------------------------------------------- recomputing batch norm + ReLU only (activations)

def test_activation_groups_are_bn_relu_and_the_convolutions_reading_it():
    model = make_model("wrn-10-1", (8, 8, 3), 4)
    names = [[n.operation.name for n in g] for g in activation_groups(model)]
    # (16 channels in and out: group 1's block has no shortcut convolution)
    assert names[0] == ["group1_block1_bn1", "group1_block1_relu1", "group1_block1_conv1"]
    assert names[2] == ["group2_block1_bn1", "group2_block1_relu1", "group2_block1_conv1_pad",
                        "group2_block1_conv1", "group2_block1_shortcut"]
    assert len(names) == 6  # two per block; the head's BN-ReLU feeds pooling, not a convolution
    assert all("final" not in n for g in names for n in g)
    assert activation_groups(lambda x, training=False: x) == []
    assert activation_groups(make_model("mlp", (8, 8, 3), 4)) == []


def test_recomputed_activations_give_the_plain_call_s_outputs_gradients_and_statistics():
    plain, ckpt = _twins()
    x = tf.constant(np.random.default_rng(3).random((4, 8, 8, 3)), tf.float32)
    y = tf.constant([0, 1, 2, 3])

    def step(model, call):
        with tf.GradientTape() as tape:
            tape.watch(x)
            logits = call(model, x)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        return logits, tape.gradient(loss, [x] + [v.value for v in model.trainable_variables])

    want = tf.function(lambda: step(plain, lambda m, z: m(z, training=True)))()
    got = tf.function(lambda: step(ckpt, recomputed_activations_call))()
    # the same operations on the same values: equal to the last bit
    np.testing.assert_array_equal(got[0], want[0])
    for g, w in zip(got[1], want[1]):
        np.testing.assert_array_equal(g, w)
    for a, b in zip(plain.non_trainable_variables, ckpt.non_trainable_variables):
        np.testing.assert_array_equal(b.numpy(), a.numpy())  # moved once, as the plain call's
    assert not np.allclose(plain.non_trainable_variables[1].numpy(), 1.0)


def _relus_read_by_the_backward_pass(call, model):
    """The Relu ops of the traced gradient whose outputs a gradient op reads, and for each
    whether it runs only after the backward pass has started (depends on a gradient op)."""
    x = tf.constant(np.random.default_rng(0).random((2, 8, 8, 3)), tf.float32)

    @tf.function
    def grads(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(call(model, x))
        return tape.gradient(loss, model.trainable_variables)

    graph = grads.get_concrete_function(x).graph
    memo: dict = {}

    def after_backward_started(op):
        if op.name not in memo:
            memo[op.name] = False
            memo[op.name] = op.name.startswith("gradient_tape/") or any(
                after_backward_started(t.op) for t in op.inputs) or any(
                after_backward_started(c) for c in op.control_inputs)
        return memo[op.name]

    read = {}
    for op in graph.get_operations():
        if op.type == "Relu" and any(c.name.startswith("gradient_tape/")
                                     for c in op.outputs[0].consumers()):
            read[op.name] = after_backward_started(op)
    return read


def test_the_backward_pass_reads_recomputed_relus_not_the_forward_pass_s():
    model = make_model("wrn-10-1", (8, 8, 3), 4)
    plain = _relus_read_by_the_backward_pass(lambda m, z: m(z, training=True), model)
    assert len(plain) == 7 and not any(plain.values())  # the plain call keeps all 7 ReLU maps
    ours = _relus_read_by_the_backward_pass(recomputed_activations_call, model)
    kept = sorted(name for name, late in ours.items() if not late)
    assert kept == ["final_relu_1/Relu"]  # the head's (it feeds pooling), nothing else
    assert sum(ours.values()) == 6  # one recomputed ReLU per group
