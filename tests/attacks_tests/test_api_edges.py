"""The API at its edges: dict/tuple-output models, the softmax warning of the core gradient,
label and data errors as one-line ValueErrors with the numbers, non-finite observations."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import agents
import attacks
import robustgrad
from attacks.training import AdversarialTrainer, check_classifier, make_classifier

KW = dict(eps=0.1, clip_min=0.0, clip_max=1.0)


@pytest.fixture(scope="module")
def two_heads():
    inp = keras.Input((4,))
    logits = keras.layers.Dense(3)(inp)
    as_dict = keras.Model(inp, {"logits": logits, "features": inp * 1.0})
    as_tuple = keras.Model(inp, (logits, inp * 1.0))
    return as_dict, as_tuple


def _x(n=5, d=4, seed=0):
    return np.random.default_rng(seed).random((n, d)).astype("float32")


@pytest.mark.parametrize("attack", [attacks.projected_gradient_descent,
                                    attacks.fast_gradient_method, attacks.apgd])
def test_dict_and_tuple_outputs_are_refused_in_one_short_line(two_heads, attack):
    as_dict, as_tuple = two_heads
    with pytest.raises(TypeError) as exc:
        attack(as_dict, _x(), np.array([0, 1, 2, 0, 1]), **KW)
    assert str(exc.value) == ("model returns a dict (keys 'logits', 'features'), not one tensor "
                              "of logits; attack attacks.select_output(model, KEY)")
    with pytest.raises(TypeError) as exc:
        attack(as_tuple, _x(), np.array([0, 1, 2, 0, 1]), **KW)
    assert str(exc.value) == ("model returns a tuple of 2 outputs, not one tensor of logits; "
                              "attack attacks.select_output(model, INDEX)")


def test_select_output_attacks_one_head_within_the_budget(two_heads):
    as_dict, as_tuple = two_heads
    x, y = _x(), np.array([0, 1, 2, 0, 1])
    for model in (attacks.select_output(as_dict, "logits"), attacks.select_output(as_tuple, 0)):
        x_adv = attacks.projected_gradient_descent(model, x, y, steps=5, seed=0, **KW).numpy()
        assert np.abs(x_adv - x).max() <= 0.1 + 1e-6 and x_adv.min() >= 0 and x_adv.max() <= 1
        assert np.abs(x_adv - x).max() > 0.05  # it did move
    # the same answer as attacking the logits head directly
    head = keras.Model(as_dict.inputs, as_dict.outputs["logits"] if isinstance(
        as_dict.outputs, dict) else as_dict.output["logits"])
    direct = attacks.fast_gradient_method(head, x, y, **KW).numpy()
    picked = attacks.fast_gradient_method(attacks.select_output(as_dict, "logits"), x, y,
                                          **KW).numpy()
    np.testing.assert_array_equal(direct, picked)
    with pytest.raises(KeyError, match="output_key 'nope' is not one of the model's outputs "
                                       r"\['features', 'logits'\]"):
        attacks.fast_gradient_method(attacks.select_output(as_dict, "nope"), x, y, **KW)
    with pytest.raises(TypeError, match="output_key must be a dict key"):
        attacks.select_output(as_dict, 1.5)


def test_input_gradient_gives_the_attacks_softmax_warning():
    softmax = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    x, y = _x(), np.array([0, 1, 2, 0, 1])
    with pytest.warns(UserWarning) as core:
        robustgrad.input_gradient(softmax, tf.constant(x), tf.constant(y))
    with pytest.warns(UserWarning) as attack:
        attacks.fast_gradient_method(softmax, x, y, **KW)
    texts = {str(w.message) for w in core} & {str(w.message) for w in attack}
    assert any(t.startswith("model outputs look like probabilities") for t in texts)
    logits = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning for logits
        robustgrad.input_gradient(logits, tf.constant(x), tf.constant(y))


@pytest.mark.parametrize("y, message", [
    ([0, 1, 2, 0, 3], r"^y has labels outside \[0, 3\) \(min 0, max 3\); the model has 3 outputs"),
    ([0, 1, -1, 0, 1], r"^y has labels outside \[0, 3\) \(min -1, max 1\)"),
    ([0, 1, 2], "^y has 3 labels but x has 5 examples"),
])
def test_label_errors_are_value_errors_naming_y(y, message):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match=message):
        robustgrad.input_gradient(model, tf.constant(_x()), tf.constant(y))
    with pytest.raises(ValueError, match=message):
        attacks.projected_gradient_descent(model, _x(), np.array(y), steps=2, **KW)
    with pytest.raises(ValueError, match=message):
        attacks.evaluate(model, _x(), np.array(y), attacks=["fgsm"], eps=0.1, clip_min=0.0,
                         clip_max=1.0)


def test_float_labels_are_value_errors_too():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match="^y must hold integer class labels, got dtype float64"):
        attacks.evaluate(model, _x(), np.zeros(5), attacks=["fgsm"], eps=0.1, clip_min=0.0,
                         clip_max=1.0)


def test_evaluate_checks_the_image_shape_before_any_work():
    model = make_classifier((8, 8), 10, width=4)
    x = np.zeros((4, 9, 8, 1), "float32")
    with pytest.raises(ValueError, match=r"^x: examples of shape \(9, 8, 1\) but the model takes "
                                         r"inputs of shape \(8, 8, 1\)$"):
        attacks.evaluate(model, x, np.zeros(4, int), attacks=["fgsm"], eps=0.1, clip_min=0.0,
                         clip_max=1.0)


def test_trainer_and_check_classifier_check_the_data():
    model = make_classifier((8, 8), 10, width=4)
    with pytest.raises(ValueError, match=r"the data's examples have shape \(9, 8, 1\) but the "
                                         r"model takes inputs of shape \(8, 8, 1\)"):
        check_classifier(model, np.zeros((2, 9, 8, 1), "float32"), 10)
    trainer = AdversarialTrainer(model, method="clean", eps=0.1)
    trainer.compile(optimizer=keras.optimizers.Adam())
    x = np.zeros((6, 8, 8, 1), "float32")
    with pytest.raises(ValueError, match=r"^y has labels outside \[0, 10\) \(min 0, max 12\)"):
        trainer.fit(x, np.array([0, 1, 2, 3, 4, 12]), epochs=1, verbose=0)
    with pytest.raises(ValueError, match="^y has 5 labels but x has 6 examples"):
        trainer.fit(x, np.arange(5), epochs=1, verbose=0)
    assert int(trainer.optimizer.iterations.numpy()) == 0  # refused before any step


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_act_refuses_non_finite_observations(algo):
    cls = agents.algorithm(algo)
    agent = cls(env="CartPole-v1", hidden_sizes=(8,), seed=0, preset=None)
    for bad in (np.array([0.0, np.nan, 0.0, 0.0]), np.array([0.0, 0.0, np.inf, 0.0])):
        with pytest.raises(ValueError, match=r"^obs: must be finite; observation\(s\) \[0\] of 1 "
                                             "hold NaN or inf$"):
            agent.act(bad)
    batch = np.zeros((3, 4))
    batch[2, 1] = -np.inf
    with pytest.raises(ValueError, match=r"observation\(s\) \[2\] of 3"):
        agent.act(batch, deterministic=True)
    actions = agent.act(np.zeros((3, 4)))
    assert actions.shape == (3,) and set(actions.tolist()) <= {0, 1}


def test_distribution_refuses_non_finite_observations():
    agent = agents.PPO(env="CartPole-v1", hidden_sizes=(8,), seed=0, preset=None)
    obs = np.zeros((3, 4), np.float32)
    obs[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"^obs: must be finite; observation\(s\) \[1\] of 3 "
                                         "hold NaN or inf$"):
        agent.distribution(obs)
    assert agent.distribution(np.zeros((2, 4), np.float32)).logits.shape == (2, 2)
