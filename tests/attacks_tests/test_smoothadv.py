"""SmoothAdv (Salman et al. 2019, method "smoothadv"): the attack on the smoothed classifier (exact
on a linear model, ascent of the smoothed loss, the ball and the box, the noise reused), argument
errors, and a short real run whose smoothed classifier certifies more than a clean model's."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from attacks import training
from attacks.certify import smooth_certify
from attacks.data import load_dataset
from attacks.training.crafting import ascend, cross_entropy
from attacks.training.smoothadv import (
    gaussian_noise,
    smoothadv_attack,
    smoothed_cross_entropy,
    smoothed_log_probs,
)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _linear(w):
    w = tf.constant(w, tf.float32)
    return lambda z, training=False: tf.reshape(z, [tf.shape(z)[0], -1]) @ w


def _mlp(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                             keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])


@pytest.mark.parametrize("steps", [1, 5])
def test_linear_model_optimum_is_eps_against_the_weight(steps):
    """Two classes with logits (u.x, -u.x): every noisy copy's loss grows along -u, so the
    smoothed loss's maximiser over the L2 ball is x - eps u / ||u||, whatever the noise."""
    u = np.array([3.0, -4.0], np.float32)
    model = _linear(np.stack([u, -u], axis=1))
    x = np.array([[0.5, 0.5], [0.2, 0.9]], np.float32)
    x_adv = smoothadv_attack(model, x, [0, 0], eps=0.1, sigma=0.5, noise_draws=8, steps=steps,
                             clip_min=-5.0, clip_max=5.0, seed=3).numpy()
    np.testing.assert_allclose(x_adv, x - 0.1 * u / 5.0, atol=1e-6)


def test_smoothed_log_probs_is_the_log_of_the_mean_softmax():
    logits = np.random.default_rng(0).normal(size=(3 * 2, 4)).astype(np.float32)  # m=3, B=2
    noise = tf.zeros([3, 2, 1])
    got = smoothed_log_probs(lambda z: tf.constant(logits), tf.zeros([2, 1]), noise).numpy()
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(got, np.log(p.reshape(3, 2, 4).mean(0)), rtol=1e-5, atol=1e-6)


def test_attack_raises_the_smoothed_loss_inside_the_ball_and_box(digits):
    """On a noise-trained MLP the attack (m = 8 draws) raises the smoothed cross-entropy measured
    with 256 *fresh* draws; every example stays within eps (L2) and inside [0, 1]; the input is
    unchanged."""
    model = _mlp()
    tr = training.AdversarialTrainer(model, method="gaussian", eps=0.5, eval_steps=0)
    tr.compile(optimizer=keras.optimizers.Adam(3e-3))
    tr.fit(digits.x_train, digits.y_train, batch_size=64, epochs=5, verbose=0)
    x, y = digits.x_test[:64].copy(), digits.y_test[:64]
    before = x.copy()
    x_adv = smoothadv_attack(model, x, y, eps=0.5, sigma=0.5, noise_draws=8, steps=5,
                             seed=0).numpy()
    np.testing.assert_array_equal(x, before)
    dist = np.sqrt(((x_adv - x) ** 2).reshape(len(x), -1).sum(1))
    assert dist.max() <= 0.5 + 1e-5 and dist.mean() > 0.4
    assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
    clean, attacked = (smoothed_cross_entropy(model, z, y, sigma=0.5, noise_draws=256, seed=7)
                       for z in (x, x_adv))
    assert np.mean(attacked > clean) > 0.9 and attacked.mean() > 1.5 * clean.mean()


def test_attack_follows_the_smoothed_loss_where_the_base_gradient_misleads():
    """Margin g(x) = 2 x + 0.25 sin(20 x) (logits g, -g): at 20 x = pi the base gradient
    (2 - 5 = -3) points the wrong way for the smoothed classifier, whose margin under noise of
    std 0.5 is ~2 x (the ripple averages out: e^-50). PGD on the base classifier lowers the
    smoothed loss; SmoothAdv (m = 256) raises it, both by moving eps = 0.1."""
    def model(z, training=False):
        g = 2.0 * z + 0.25 * tf.sin(20.0 * z)
        return tf.concat([g, -g], axis=1)

    x = np.full((4, 1), np.pi / 20, np.float32) + np.float32(2 * np.pi / 20) * np.arange(
        4, dtype=np.float32)[:, None]
    y = np.zeros(4, np.int64)
    smooth_adv = smoothadv_attack(model, x, y, eps=0.1, sigma=0.5, noise_draws=256, steps=1,
                                  clip_min=-10.0, clip_max=10.0, seed=0).numpy()
    base_adv = ascend(lambda z: model(z), lambda logits: cross_entropy(logits, tf.constant(y, tf.int32)),
                      tf.constant(x), eps=0.1,
                      step_size=0.2, steps=1, norm="l2", clip_min=-10.0, clip_max=10.0,
                      seed=[0, 0], start="none").numpy()
    np.testing.assert_allclose(smooth_adv, x - 0.1, atol=1e-6)
    np.testing.assert_allclose(base_adv, x + 0.1, atol=1e-6)
    clean, smooth_loss, base_loss = (
        smoothed_cross_entropy(model, z, y, sigma=0.5, noise_draws=20_000, seed=9)
        for z in (x, smooth_adv, base_adv))
    assert (smooth_loss > clean).all() and (base_loss < clean).all()


def test_noise_is_drawn_once_from_the_seed_and_reused():
    """The objective the attack maximises is the one smoothed_cross_entropy evaluates for the same
    seed (same draws at every step): its ascent is monotone there step after step."""
    model = _mlp(1)
    x = np.random.default_rng(0).random((16, 8, 8, 1)).astype(np.float32)
    y = np.arange(16) % 10
    losses = [smoothed_cross_entropy(model, smoothadv_attack(
        model, x, y, eps=0.05 * k, sigma=0.25, noise_draws=4, steps=k, step_size=0.05, seed=5),
        y, sigma=0.25, noise_draws=4, seed=5).mean() for k in (1, 2, 3)]
    assert losses[0] < losses[1] < losses[2]
    a = smoothadv_attack(model, x, y, eps=0.3, sigma=0.25, noise_draws=2, seed=1)
    b = smoothadv_attack(model, x, y, eps=0.3, sigma=0.25, noise_draws=2, seed=1)
    c = smoothadv_attack(model, x, y, eps=0.3, sigma=0.25, noise_draws=2, seed=2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    noise = gaussian_noise(tf.zeros([500, 8]), 0.5, 3, tf.constant([0, 0])).numpy()
    assert noise.shape == (3, 500, 8) and abs(noise.std() - 0.5) < 0.01


@pytest.mark.parametrize("kwargs, message", [
    ({"noise_draws": 0}, "noise_draws must be an int >= 1, got 0"),
    ({"sigma": 0.0}, "sigma must be a number > 0, got 0"),
    ({"eps": -0.1}, "eps must be a number >= 0, got -0.1"),
])
def test_bad_arguments_of_the_attack(kwargs, message):
    args = {"eps": 0.5, "sigma": 0.25, "noise_draws": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        smoothadv_attack(_linear(np.eye(64, 10)), np.zeros((2, 8, 8, 1)), [0, 1], **args)


@pytest.mark.parametrize("kwargs, message", [
    ({"noise_draws": 0}, re.escape("noise_draws must be an int in [1, 1024], got 0")),
    ({"sigma": -1.0}, "sigma must be a number > 0, got -1"),
    ({"eps": -0.5}, "eps must be a number > 0, got -0.5"),
    ({"norm": "linf"}, "norm 'linf' is not supported by method 'smoothadv'; use l2"),
])
def test_bad_arguments_of_the_trainer(kwargs, message):
    with pytest.raises(ValueError, match=message):
        training.AdversarialTrainer(training.make_classifier((8, 8), 10, width=4),
                                    method="smoothadv", **kwargs)


def test_trainer_defaults_and_config_round_trip():
    tr = training.AdversarialTrainer(training.make_classifier((8, 8), 10, width=4),
                                     method="smoothadv", eps=0.5, sigma=0.5, noise_draws=3)
    assert (tr.norm, tr.steps, tr.step_size, tr.sigma, tr.noise_draws) == ("l2", 2, 0.5, 0.5, 3)
    again = training.AdversarialTrainer.from_config(tr.get_config())
    assert (again.sigma, again.noise_draws, again.norm) == (0.5, 3, "l2")
    assert training.AdversarialTrainer(training.make_classifier((8, 8), 10, width=4),
                                       method="madry").norm == "linf"


def test_smoothadv_training_certifies_more_than_clean_training(digits, clean_mlp64):
    """A real learning test (~6 s): at sigma 0.5 the clean model's smoothed classifier certifies
    few digits at radius 0.5; the SmoothAdv-trained one (eps 1.0, m 2, 2 steps) many more."""
    model = _mlp()
    tr = training.AdversarialTrainer(model, method="smoothadv", eps=1.0, sigma=0.5, noise_draws=2,
                                     eval_steps=0)
    tr.compile(optimizer=keras.optimizers.Adam(3e-3))
    history = tr.fit(digits.x_train, digits.y_train, batch_size=64, epochs=15, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    models = {"smoothadv": model, "clean": clean_mlp64}
    x, y = digits.x_test[:100], digits.y_test[:100]
    acc = {}
    for method, model in models.items():
        pred, radius = smooth_certify(model, x, 0.5, n0=50, n=500, alpha=0.01, seed=0)
        acc[method] = float(np.mean((np.asarray(pred) == y) & (np.asarray(radius) >= 0.5)))
    assert acc["smoothadv"] > acc["clean"] + 0.2, acc


@pytest.mark.parametrize("flags, message", [
    (["--norm", "linf"], "--norm: smoothadv attacks the smoothed classifier in L2; pass --norm l2"),
    (["--noise-draws", "0"], "--noise-draws must be an int in [1, 1024], got 0"),
    (["--sigma", "0"], "--sigma must be a number > 0, got 0"),
])
def test_command_line_refuses_bad_smoothadv_flags(tmp_path, capsys, flags, message):
    from robustgrad import cli

    assert cli.main(["train-classifier", "--method", "smoothadv", *flags,
                     "--out", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
