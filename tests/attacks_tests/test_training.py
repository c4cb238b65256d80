"""Adversarial training (attacks.training) and the train-classifier CLI: fast unit tests,
one short real training run, save/load, export, bad input."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import attacks
from attacks import training
from attacks.data import load_dataset
from robustgrad.cli import main as cli_main


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _tiny_clf(width=4):
    return training.make_classifier((8, 8, 1), 10, width=width)


def _weights(model):
    return [w.numpy().copy() for w in model.weights]


# ------------------------------------------------------------------ trainer unit tests

def test_config_roundtrip_and_keras_save(tmp_path, digits):
    clf = _tiny_clf()
    tr = training.AdversarialTrainer(clf, method="trades", eps=0.2, steps=3, beta=4.0, warmup_steps=7,
                              label_smoothing=0.1, max_grad_norm=2.0, seed=3)
    tr.compile(optimizer=keras.optimizers.Adam(1e-3))
    x = digits.x_test[:16]
    cfg = tr.get_config()
    tr2 = training.AdversarialTrainer.from_config(json.loads(json.dumps(cfg)))
    cfg2 = tr2.get_config()
    for k in ("method", "eps", "steps", "beta", "warmup_steps", "adv_ratio", "max_grad_norm",
              "seed", "step_size", "norm", "clip_min", "clip_max", "label_smoothing"):
        assert cfg2[k] == cfg[k], k
    path = str(tmp_path / "trainer.keras")
    tr.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, attacks.AdversarialTrainer)
    assert loaded.method == "trades" and loaded.beta == 4.0
    np.testing.assert_allclose(loaded(x).numpy(), tr(x).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw, match", [
    (dict(method="bogus"), "method"),
    (dict(eps=0.0), "eps"),
    (dict(eps=1.5), "eps"),
    (dict(eps=float("nan")), "eps"),
    (dict(clip_min=1.0, clip_max=0.0), "clip_min"),
    (dict(adv_ratio=1.5), "adv_ratio"),
    (dict(steps=0, method="madry"), "steps"),
    (dict(norm="l3"), "norm"),
    (dict(method="fast", norm="l1"), "l1"),
    (dict(max_grad_norm=-1.0), "max_grad_norm"),
])
def test_trainer_rejects_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        training.AdversarialTrainer(_tiny_clf(), **kw)


@pytest.mark.parametrize("method", ["madry", "trades", "fast", "free"])
def test_each_method_takes_finite_steps(method, digits):
    clf = _tiny_clf()
    steps = {} if method == "fast" else {"steps": 2}  # fast: one FGSM step
    tr = training.AdversarialTrainer(clf, method=method, eps=0.1, eval_steps=2, warmup_steps=4,
                              **steps)
    tr.compile(optimizer=keras.optimizers.Adam(1e-3))
    before = _weights(clf)
    h = tr.fit(digits.x_train[:64], digits.y_train[:64], batch_size=32, epochs=1, verbose=0,
               validation_data=(digits.x_test[:32], digits.y_test[:32]))
    assert np.isfinite(h.history["loss"][0])
    assert "val_robust_accuracy" in h.history
    assert int(tr.step_counter.numpy()) == 2
    # warm-up: eps of the two steps were 0.025 and 0.05
    np.testing.assert_allclose(h.history["eps"][0], 0.0375, rtol=1e-5)
    assert any(not np.array_equal(a, b) for a, b in zip(before, _weights(clf)))
    expected_updates = 2 * (2 if method == "free" else 1)
    assert int(tr.optimizer.iterations.numpy()) == expected_updates


def test_crafted_examples_respect_budget_and_bounds(digits):
    tr = training.AdversarialTrainer(_tiny_clf(), method="madry", eps=0.1, steps=3)
    x = tf.constant(digits.x_test[:32])
    y = digits.y_test[:32]
    for method in ("madry", "fast", "trades"):
        tr.method = method
        x_adv = tr.craft(x, y).numpy()
        assert np.abs(x_adv - x.numpy()).max() <= 0.1 + 1e-6
        assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
        assert x_adv.dtype == np.float32 and x_adv.shape == x.shape


def test_nonfinite_step_is_skipped(digits):
    clf = _tiny_clf()
    tr = training.AdversarialTrainer(clf, method="clean", eps=0.1, max_grad_norm=1.0)
    tr.compile(optimizer=keras.optimizers.Adam(1e-3))
    tr.fit(digits.x_train[:8], digits.y_train[:8], batch_size=8, epochs=1, verbose=0)
    before = _weights(clf)
    x_bad = digits.x_train[:8].copy()
    x_bad[0, 0, 0, 0] = np.nan
    tr.fit(x_bad, digits.y_train[:8], batch_size=8, epochs=1, verbose=0)
    after = _weights(clf)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert int(tr.nonfinite_count.numpy()) == 1
    assert int(tr.optimizer.iterations.numpy()) == 1


def test_catastrophic_overfitting_guard_restores_best(digits):
    clf = _tiny_clf()
    tr = training.AdversarialTrainer(clf, method="fast", eps=0.1)
    tr.compile(optimizer=keras.optimizers.Adam(1e-3))
    guard = training.CatastrophicOverfittingGuard(digits.x_train, digits.y_train, eps=0.1, size=32,
                                           verbose=0)
    seq = iter([0.5, 0.6, 0.1, 0.7])
    guard._measure = lambda: next(seq)
    guard.set_model(tr)
    snapshots = []
    for epoch in range(4):
        for w in clf.weights:
            w.assign(w + 1.0)
        snapshots.append(_weights(tr))
        guard.on_epoch_end(epoch, {})
        if tr.stop_training:
            break
    assert guard.collapsed_epoch == 2 and tr.stop_training
    for a, b in zip(_weights(tr), snapshots[1]):
        np.testing.assert_array_equal(a, b)


def test_freeze_layers_by_glob_and_regex():
    clf = _tiny_clf()
    assert training.freeze_layers(clf, "conv1,re:^dense") == ["conv1", "dense1"]
    paths = " ".join(v.path for v in clf.trainable_variables)
    assert "conv1/" not in paths and "dense1/" not in paths and "conv2/" in paths
    with pytest.raises(ValueError, match="nothing"):
        training.freeze_layers(clf, "nothing*")


def test_epoch_dataset_order_depends_only_on_seed_and_epoch():
    x = np.arange(20, dtype=np.float32).reshape(20, 1)
    y = np.arange(20)
    full = [b[1].numpy().tolist() for b in training.epoch_dataset(x, y, 8, seed=1, epochs=3)]
    resumed = [b[1].numpy().tolist() for b in training.epoch_dataset(x, y, 8, seed=1, first_epoch=2,
                                                               epochs=3)]
    assert len(full) == 9 and full[6:] == resumed
    assert full[:3] != full[3:6]


def test_softmax_output_and_class_mismatch_rejected(digits):
    probs = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(10, activation="softmax")])
    with pytest.raises(ValueError, match="probabilities"):
        training.check_classifier(probs, digits.x_test, 10)
    with pytest.raises(ValueError, match="12 classes"):
        training.check_classifier(_tiny_clf(), digits.x_test, 12)


# ------------------------------------------------------------------ CLI: bad input

def _cli(*argv):
    return cli_main(["train-classifier", *argv])


@pytest.mark.parametrize("argv, match", [
    (["--method", "bogus"], "unknown method"),
    (["--data", "imagenet"], "unknown dataset"),
    (["--eps", "-0.1"], "eps"),
    (["--eps", "0"], "eps"),
    (["--strategy", "tpu"], "unknown strategy"),
    (["--data", "mnist"], "mnist.npz"),
    (["--eps", "1.5"], "larger than the input range"),
    (["--freeze", "nosuchlayer"], "matches no layer"),
])
def test_cli_bad_input(tmp_path, capsys, argv, match, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    out = tmp_path / "run"
    rc = _cli("--out", str(out), "--epochs", "1", "--no-deterministic", *argv)
    assert rc == 2
    assert match in capsys.readouterr().err
    assert not (out / "checkpoints").exists()


def test_cli_bad_npz_labels_and_probability_model(tmp_path, capsys, digits):
    npz = tmp_path / "d.npz"
    y_tr = digits.y_train.copy()
    y_tr[0] = 11  # 12 classes
    np.savez(npz, x_train=digits.x_train, y_train=y_tr, x_test=digits.x_test,
             y_test=digits.y_test)
    m = tmp_path / "m.keras"
    _tiny_clf().save(m)
    rc = _cli("--data", str(npz), "--init-from", str(m), "--out", str(tmp_path / "a"),
              "--no-deterministic")
    assert rc == 2 and "y_train holds label 11, outside" in capsys.readouterr().err
    probs = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(10, activation="softmax")])
    pm = tmp_path / "p.keras"
    probs.save(pm)
    rc = _cli("--init-from", str(pm), "--out", str(tmp_path / "b"), "--no-deterministic")
    assert rc == 2 and "probabilities" in capsys.readouterr().err
    bad = tmp_path / "bad.npz"
    np.savez(bad, x_train=digits.x_train)
    rc = _cli("--data", str(bad), "--out", str(tmp_path / "c"), "--no-deterministic")
    assert rc == 2 and "y_train" in capsys.readouterr().err


def test_a_stray_training_label_is_refused_not_a_bigger_model(tmp_path, capsys, digits):
    npz = tmp_path / "d.npz"
    y_tr = digits.y_train.copy()
    y_tr[5] = 12  # one stray label: 10 test classes
    arrays = dict(x_train=digits.x_train, y_train=y_tr, x_test=digits.x_test,
                  y_test=digits.y_test)
    np.savez(npz, **arrays)
    message = (f"--data {npz}: y_train holds label 12, outside the classes of y_test (labels "
               "0-9); fix the labels, or declare num_classes in the file")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_dataset(str(npz))
    out = tmp_path / "run"
    rc = _cli("--data", str(npz), "--out", str(out), "--epochs", "1", "--no-deterministic")
    assert rc == 2 and message in capsys.readouterr().err
    assert not out.exists()
    # the rule is the declared num_classes when the file has one
    np.savez(npz, num_classes=13, **arrays)
    assert load_dataset(str(npz)).num_classes == 13
    np.savez(npz, num_classes=12, **arrays)
    with pytest.raises(ValueError, match="y_train holds label 12, outside the num_classes the "
                                         r"file declares \(labels 0-11\)"):
        load_dataset(str(npz))
    np.savez(npz, num_classes=np.array([1.5]), **arrays)
    with pytest.raises(ValueError, match="num_classes must be one integer >= 1, got"):
        load_dataset(str(npz))


def test_train_classifier_runs_without_the_keras_shuffle_warning(tmp_path):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _cli("--method", "clean", "--epochs", "1", "--limit", "64", "--no-eval",
                    "--no-progress", "--out", str(tmp_path / "run")) == 0
    shuffle = [str(w.message) for w in caught if "shuffle" in str(w.message)]
    assert shuffle == []  # epoch_dataset shuffles; Keras warned on every run (issue 24)


def test_cli_existing_output_and_resume_mismatch(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "model.keras").write_text("precious")
    rc = _cli("--out", str(out), "--no-deterministic")
    assert rc == 2 and "--overwrite" in capsys.readouterr().err
    assert (out / "model.keras").read_text() == "precious"
    (out / "config.json").write_text(json.dumps({"method": "trades", "eps": 0.1}))
    rc = _cli("--out", str(out), "--resume", "--method", "madry", "--no-deterministic")
    err = capsys.readouterr().err
    assert rc == 2 and "different configuration" in err and "method" in err
    rc = _cli("--out", str(tmp_path / "none"), "--resume")
    assert rc == 2 and "no run" in capsys.readouterr().err


# ------------------------------------------------------------------ real runs

def test_short_real_training_is_robust(digits):
    """Madry training for a few epochs beats a plainly trained model under PGD by a wide margin."""
    keras.utils.set_random_seed(0)
    results = {}
    for method, epochs in (("clean", 6), ("madry", 6)):
        clf = training.make_classifier((8, 8, 1), 10, width=16)
        steps = {"steps": 5} if method == "madry" else {}  # clean crafts nothing
        tr = training.AdversarialTrainer(clf, method=method, eps=0.1, eval_steps=0, **steps)
        tr.compile(optimizer=keras.optimizers.Adam(2e-3))
        ds = training.epoch_dataset(digits.x_train, digits.y_train, 64, epochs=epochs)
        tr.fit(ds, epochs=epochs, steps_per_epoch=training.steps_per_epoch(len(digits.x_train), 64),
               verbose=0)
        clean = float(np.mean(np.argmax(clf.predict(digits.x_test, verbose=0), 1)
                              == digits.y_test))
        robust = training.robust_accuracy(clf, digits.x_test, digits.y_test, eps=0.1, steps=20)
        results[method] = (clean, robust)
    assert results["clean"][0] > 0.9
    assert results["madry"][0] > 0.85
    assert results["madry"][1] > results["clean"][1] + 0.1, results


def test_cli_finetune_freeze_mixed_precision_accum_export(tmp_path, digits):
    """--init-from + --freeze + --mixed-precision + --grad-accum + --export, then reload the
    SavedModel and the .keras file and compare outputs; frozen layers do not move."""
    base = _tiny_clf(8)
    base_path = tmp_path / "base.keras"
    base.save(base_path)
    out, exp = tmp_path / "ft", tmp_path / "serving"
    try:
        rc = _cli("--init-from", str(base_path), "--freeze", "conv1", "--method", "fast",
                  "--no-guard", "--mixed-precision", "--grad-accum", "2", "--epochs", "1",
                  "--limit", "256", "--export", str(exp), "--out", str(out), "--no-eval",
                  "--no-deterministic", "--verbose", "0")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert rc == 0
    for name in ("model.keras", "trainer.keras", "config.json", "history.json"):
        assert (out / name).exists(), name
    assert any((out / "checkpoints").iterdir()) and any((out / "logs").rglob("*tfevents*"))
    m = keras.models.load_model(out / "model.keras")
    np.testing.assert_array_equal(m.get_layer("conv1").get_weights()[0],
                                  base.get_layer("conv1").get_weights()[0])
    assert not np.array_equal(m.get_layer("conv2").get_weights()[0],
                              base.get_layer("conv2").get_weights()[0])
    assert m.get_layer("conv2").dtype_policy.name == "mixed_float16"
    x = digits.x_test[:20]
    served = tf.saved_model.load(str(exp))
    y_served = served.serve(tf.constant(x)).numpy()
    np.testing.assert_allclose(y_served, m(x).numpy(), rtol=1e-3, atol=1e-3)
    trainer = keras.models.load_model(out / "trainer.keras")
    assert trainer.method == "fast"


# ------------------------------------------------------------------ methods, crafting, old files

def test_methods_are_defined_once():
    from attacks.training import registry

    assert training.METHODS == ("madry", "trades", "fast", "free", "mart", "awp", "ibp",
                                "crown-ibp", "clean", "gaussian", "smoothadv") \
        == registry.METHODS == registry.registered_methods()
    assert training.DEFAULT_STEPS == {"madry": 10, "trades": 10, "fast": 1, "free": 4, "mart": 10,
                                      "awp": 10, "ibp": 0, "crown-ibp": 0, "clean": 0,
                                      "gaussian": 0, "smoothadv": 2}
    assert training.get_method("trades").name == "trades"
    with pytest.raises(ValueError, match=r"method must be one of \('madry', 'trades', 'fast', "
                                         r"'free', 'mart', 'awp', 'ibp', 'crown-ibp', 'clean', 'gaussian', "
                                         r"'smoothadv'\), "
                                         r"got 'pgd'"):
        training.get_method("pgd")
    tr = training.AdversarialTrainer(_tiny_clf(), method="free", eps=0.1)
    with pytest.raises(ValueError, match="crafts inside its train step"):
        tr.craft(np.zeros((2, 8, 8, 1), np.float32), [0, 1])


def test_robust_correct_matches_the_linear_margin():
    """logits [s, -s] with s = x.w: label 0 survives an L-inf eps iff s - eps ||w||_1 > 0."""
    w = np.array([[1.0], [-2.0], [0.5]], np.float32)          # ||w||_1 = 3.5

    def model(x, training=False):
        s = x @ w
        return tf.concat([s, -s], axis=1)

    # s = 0.55, 0.20, 0.15 at x; eps 0.1 costs 0.35 (no coordinate reaches a bound)
    x = np.array([[0.9, 0.4, 0.9], [0.8, 0.45, 0.6], [0.5, 0.3, 0.5]], np.float32)
    y = np.zeros(3, np.int32)
    ok = training.robust_correct(lambda z: model(z), tf.constant(x), tf.constant(y), eps=0.1,
                                 norm="linf", clip_min=0.0, clip_max=1.0, steps=10).numpy()
    np.testing.assert_array_equal(ok, [1.0, 0.0, 0.0])
    assert training.robust_accuracy(model, x, y, eps=0.1, steps=10) == pytest.approx(1 / 3)
    assert training.robust_accuracy(model, x, y, eps=0.01, steps=10, restarts=2) == 1.0


def test_keras_file_saved_before_the_split_loads(tmp_path, digits):
    """A .keras file names the class's module; files written when it was attacks.training load."""
    import zipfile

    tr = training.AdversarialTrainer(_tiny_clf(), method="fast", eps=0.1, seed=5)
    new = str(tmp_path / "new.keras")
    tr.save(new)
    old = str(tmp_path / "old.keras")
    with zipfile.ZipFile(new) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "config.json":
                cfg = json.loads(data)
                assert cfg["registered_name"] == "attacks>AdversarialTrainer"
                cfg["module"] = "attacks.training"
                data = json.dumps(cfg).encode()
            dst.writestr(item, data)
    loaded = keras.models.load_model(old)
    assert isinstance(loaded, training.AdversarialTrainer) and loaded.method == "fast"
    x = digits.x_test[:4]
    np.testing.assert_allclose(loaded(x).numpy(), tr(x).numpy(), rtol=1e-5, atol=1e-6)
