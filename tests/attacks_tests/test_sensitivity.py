"""Tests for attacks.sensitivity and the ``robustgrad sensitivity`` command."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from attacks import sensitivity


def _linear(d_in=6, d_out=4, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((d_in,)), keras.layers.Dense(d_out)])


def _mlp(d_in=6, d_out=4, activation="tanh", seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((d_in,)), keras.layers.Dense(16, activation=activation),
                             keras.layers.Dense(d_out)])


def _x(n=5, d=6, seed=0):
    return tf.random.stateless_uniform([n, d], [seed, 1])


# -- exact values on a linear model ------------------------------------------------------------
def test_linear_model_exact_values():
    model = _linear()
    weights = model.layers[0].kernel.numpy()  # [in, out]; logits = x @ weights + b
    x = _x()
    y = tf.constant([0, 1, 2, 3, 0])
    # saliency of logit y is weights[:, y]
    np.testing.assert_allclose(sensitivity.saliency(model, x, y).numpy(), weights[:, y.numpy()].T, rtol=1e-6)
    # SmoothGrad of a linear model is the same, whatever the noise
    np.testing.assert_allclose(sensitivity.smoothgrad(model, x, y, num_samples=3, noise_level=0.5).numpy(),
                               weights[:, y.numpy()].T, rtol=1e-5, atol=1e-6)
    # per-class norms are column norms, with any chunking / batching
    for chunk, bs in ((None, 256), (1, 2), (3, 4)):
        cj = sensitivity.class_jacobian_norms(model, x, chunk_size=chunk, batch_size=bs).numpy()
        np.testing.assert_allclose(cj, np.tile(np.linalg.norm(weights, axis=0), (5, 1)), rtol=1e-5)
    cj1 = sensitivity.class_jacobian_norms(model, x, norm="linf").numpy()     # dual of linf is L1
    np.testing.assert_allclose(cj1[0], np.abs(weights).sum(0), rtol=1e-5)
    # spectral norm = largest singular value of weights
    sigma = sensitivity.jacobian_spectral_norm(model, x, num_iters=30).numpy()
    np.testing.assert_allclose(sigma, np.linalg.svd(weights, compute_uv=False)[0], rtol=1e-4)
    # Lipschitz constant of the logit-y map: dual norm of weights[:, y]
    for norm, q in (("linf", 1), ("l2", 2)):
        lip = sensitivity.local_lipschitz(model, x, y, eps=0.1, norm=norm, clip_min=0.0, clip_max=1.0,
                                          steps=3, restarts=1).numpy()
        np.testing.assert_allclose(lip, np.linalg.norm(weights[:, y.numpy()], ord=q, axis=0),
                                   rtol=1e-5)


# -- small MLP: spectral norm vs SVD of the explicit Jacobian ----------------------------------
def test_mlp_spectral_norm_matches_svd_of_explicit_jacobian():
    model = _mlp()
    x = _x(8)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = model(x)
    jacobians = tape.batch_jacobian(out, x).numpy()          # [B, C, D]
    exact = np.array([np.linalg.svd(j, compute_uv=False)[0] for j in jacobians])
    sigma, v = sensitivity.jacobian_spectral_norm(model, x, num_iters=100, return_vectors=True)
    np.testing.assert_allclose(sigma.numpy(), exact, rtol=1e-3)
    assert np.all(sigma.numpy() <= exact * (1 + 1e-4))   # power iteration approaches from below
    # the returned v is the top right singular vector (up to sign)
    vt = np.array([np.linalg.svd(j)[2][0] for j in jacobians])
    np.testing.assert_allclose(np.abs(np.sum(vt * v.numpy(), 1)), 1.0, atol=1e-2)


def test_mlp_local_lipschitz_matches_grid_search():
    """2-D input: the max of ||grad logit_y||_1 over the L-inf ball found by a 201x201 grid is
    matched by PGD on the gradient norm (double backprop)."""
    model = _mlp(d_in=2, d_out=3, activation="tanh", seed=3)
    x = tf.constant([[0.3, -0.2], [1.0, 0.5]])
    y = tf.constant([0, 2])
    eps = 0.5
    lip, (pts, method) = sensitivity.local_lipschitz(model, x, y, eps=eps, norm="linf", clip_min=-5.0,
                                                     clip_max=5.0, steps=40, restarts=4,
                                                     return_points=True)
    assert method == "pgd_gradient_norm"
    grid = np.linspace(-eps, eps, 201, dtype=np.float32)
    gx, gy = np.meshgrid(grid, grid)
    offsets = np.stack([gx.ravel(), gy.ravel()], 1)
    for i in range(2):
        pts_i = tf.constant(x.numpy()[i] + offsets)
        g = sensitivity.saliency(model, pts_i, tf.fill([len(offsets)], y[i]))
        best = float(tf.reduce_max(tf.reduce_sum(tf.abs(g), 1)))
        assert float(lip[i]) >= 0.99 * best
        assert float(lip[i]) <= 1.01 * best
    assert np.all(np.abs(pts.numpy() - x.numpy()) <= eps + 1e-6)


def test_relu_local_lipschitz_falls_back_and_bounds_center():
    model = _mlp(activation="relu")
    x = _x(6)
    lip, (pts, method) = sensitivity.local_lipschitz(model, x, eps=0.2, clip_min=0.0, clip_max=1.0,
                                                     steps=5, restarts=2, return_points=True)
    assert method == "pgd_on_function"
    center = sensitivity.dual_norm(sensitivity.saliency(model, x), "linf")
    assert np.all(lip.numpy() >= center.numpy() - 1e-6)
    assert np.all((pts.numpy() >= 0) & (pts.numpy() <= 1))


def test_compiled_once_per_model_and_not_kept_alive():
    import gc
    import weakref

    model = _mlp()
    for n, seed, b in ((5, 0, 4), (9, 1, 4), (3, 2, 7)):
        sensitivity.jacobian_spectral_norm(model, _x(b), num_iters=n, seed=seed)
    sensitivity.class_jacobian_norms(model, _x(10), batch_size=4)      # blocks of 4, 4 and 2 rows
    # spectral norm: one trace whatever the batch size, iterations and seed; per-class norms:
    # one per block size (4 and the remainder 2)
    assert sensitivity.tracing_count(model) == 3
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_smoothgrad_deterministic_and_zero_noise_is_saliency():
    model = _mlp()
    x = _x()
    a = sensitivity.smoothgrad(model, x, num_samples=4, seed=1).numpy()
    b = sensitivity.smoothgrad(model, x, num_samples=4, seed=1).numpy()
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(sensitivity.smoothgrad(model, x, num_samples=2, noise_level=0.0).numpy(),
                               sensitivity.saliency(model, x).numpy(), rtol=1e-5, atol=1e-7)


def test_bad_input():
    model = _mlp()
    x = _x()
    with pytest.raises(TypeError, match="x"):
        sensitivity.saliency(model, tf.zeros([2, 6], tf.int32))
    with pytest.raises(ValueError, match="num_iters"):
        sensitivity.jacobian_spectral_norm(model, x, num_iters=0)
    with pytest.raises(ValueError, match="norm"):
        sensitivity.class_jacobian_norms(model, x, norm="l3")
    with pytest.raises(ValueError, match="y"):
        sensitivity.saliency(model, x, tf.constant([0, 1]))
    with pytest.raises(ValueError, match="num_samples"):
        sensitivity.smoothgrad(model, x, num_samples=0)
    with pytest.raises(ValueError, match="function"):
        sensitivity.saliency(model, x, function="entropy")
    with pytest.raises(ValueError, match="logits"):
        sensitivity.saliency(lambda v, training=False: tf.reduce_sum(v, 1), x)
    with pytest.raises(TypeError, match="model"):
        sensitivity.saliency("model.keras", x)


# -- CLI ---------------------------------------------------------------------------------------
def test_cli_two_models(tmp_path):
    from robustgrad.cli import main
    from robustgrad.data import load_digits

    (xtr, ytr), _ = load_digits()
    paths = []
    for i, epochs in enumerate((3, 0)):
        keras.utils.set_random_seed(i)
        m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
        m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if epochs:
            m.fit(xtr, ytr, epochs=epochs, batch_size=64, verbose=0)
        paths.append(str(tmp_path / f"m{i}.keras"))
        m.save(paths[-1])
    out = tmp_path / "s"
    rc = main(["sensitivity", "--model", paths[0], "--model2", paths[1], "--data", "digits",
               "--out", str(out), "--num", "48", "--power-iters", "5", "--lipschitz-steps", "3",
               "--restarts", "1", "--smoothgrad-samples", "2", "--batch-size", "24"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["models"]) == 2 and summary["num_examples"] == 48
    for rec in summary["models"].values():
        assert rec["spectral_norm"]["max"] > 0 and len(rec["class_jacobian_norm_mean"]) == 10
        assert rec["local_lipschitz"]["min"] > 0
    for f in ("saliency_per_class.png", "sensitivity_distribution.png",
              "class_jacobian_norms.png"):
        assert os.path.getsize(out / f) > 1000
    assert "ratio_model2_over_model" in summary
    assert main(["sensitivity", "--model", str(tmp_path / "nope.keras"), "--out",
                 str(out)]) == 2
