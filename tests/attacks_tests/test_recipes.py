"""Recipes, schedules, optimizers, weight decay, label smoothing and robust early stopping of
adversarial training (attacks.training), and how train-classifier resolves its settings."""

import argparse
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from attacks import training
from attacks.training import recipes, schedules
from robustgrad.cli import main as cli_main
from robustgrad.commands import _train_classifier_flags as flags
from robustgrad.commands import train_classifier as tc

# ------------------------------------------------------------------ schedules


@pytest.mark.parametrize("name", schedules.SCHEDULES)
def test_schedule_shapes_and_serialisation(name):
    total = 100
    s = training.learning_rate_schedule(name, 0.2, total)
    lrs = np.array([float(s(t)) for t in range(total)])
    assert lrs.max() == pytest.approx(0.2, rel=1e-3)  # cosine: step 0 is 1 update in
    assert np.all(lrs >= 0)
    if name == "cyclic":  # Wong et al.: 0 -> peak at 2/5 of the run -> 0
        assert int(np.argmax(lrs)) == 39 and lrs[0] == pytest.approx(0.2 / 40)
        assert lrs[-1] == pytest.approx(0.0, abs=1e-9)
        assert np.all(np.diff(lrs[:40]) > 0) and np.all(np.diff(lrs[40:]) < 0)
    if name == "cosine":
        assert lrs[-1] == pytest.approx(0.2 * 0.01, rel=1e-4) and np.all(np.diff(lrs) <= 1e-9)
    if name == "piecewise":  # Rice et al.: x0.1 at 1/2 and 3/4
        assert set(np.round(lrs, 6)) == {0.2, 0.02, 0.002}
        assert lrs[49] == pytest.approx(0.2) and lrs[50] == pytest.approx(0.02)
        assert lrs[75] == pytest.approx(0.002)
    if name == "constant":
        assert np.all(lrs == np.float32(0.2))
    again = schedules.StepSchedule.from_config(json.loads(json.dumps(s.get_config())))
    assert [float(again(t)) for t in (0, 37, 99)] == [float(s(t)) for t in (0, 37, 99)]


def test_schedule_saved_with_the_trainer(tmp_path):
    clf = training.make_classifier((8, 8, 1), 10, width=2)
    tr = training.AdversarialTrainer(clf, method="fast", eps=0.1)
    tr.compile(optimizer=training.make_optimizer(
        "sgd", training.learning_rate_schedule("cyclic", 0.1, 50, warmup=0.5), momentum=0.8))
    tr.build((None, 8, 8, 1))
    tr.optimizer.build(clf.trainable_variables)
    path = str(tmp_path / "t.keras")
    tr.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.optimizer, keras.optimizers.SGD)
    assert loaded.optimizer.momentum == pytest.approx(0.8)
    assert float(loaded.optimizer._learning_rate(24)) == pytest.approx(0.1)


@pytest.mark.parametrize("kw, match", [
    (dict(name="linear"), "schedule must be one of"),
    (dict(peak=0.0), "lr"),
    (dict(total_steps=0), "total_steps"),
    (dict(warmup=1.5), "warmup"),
    (dict(boundaries=(0.75, 0.5)), "boundaries must be increasing"),
    (dict(decay=2.0), "decay"),
])
def test_schedule_bad_arguments(kw, match):
    args = dict(name="cyclic", peak=0.1, total_steps=10)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        training.learning_rate_schedule(**args)


def test_make_optimizer_bad_momentum():
    with pytest.raises(ValueError, match="momentum"):
        training.make_optimizer("sgd", 0.1, momentum=1.0)


# ------------------------------------------------------------------ weight decay, smoothing


def _one_sgd_step(weight_decay):
    keras.utils.set_random_seed(0)
    clf = training.make_classifier((8, 8, 1), 10, width=2)
    tr = training.AdversarialTrainer(clf, method="clean", eps=0.1, weight_decay=weight_decay)
    tr.compile(optimizer=keras.optimizers.SGD(0.5))
    x = np.random.default_rng(0).uniform(size=(8, 8, 8, 1)).astype("float32")
    y = np.arange(8) % 10
    before = [v.numpy().copy() for v in clf.trainable_variables]
    tr.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    return before, [v.numpy() for v in clf.trainable_variables]


def test_weight_decay_is_coupled_l2_added_to_the_gradient():
    """SGD(lr) with weight_decay wd moves each weight by an extra -lr * wd * w (PyTorch's)."""
    w0, plain = _one_sgd_step(0.0)
    w0b, decayed = _one_sgd_step(0.1)
    for a, b, p, d in zip(w0, w0b, plain, decayed):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(d - p, -0.5 * 0.1 * a, atol=1e-6)


def test_label_smoothing_loss():
    clf = training.make_classifier((8, 8, 1), 10, width=2)
    tr = training.AdversarialTrainer(clf, method="fast", eps=0.1, label_smoothing=0.2)
    logits = tf.constant(np.random.default_rng(1).normal(size=(4, 10)), tf.float32)
    y = tf.constant([0, 3, 9, 3])
    targets = np.full((4, 10), 0.02)
    targets[np.arange(4), y.numpy()] += 0.8
    expected = -(targets * tf.nn.log_softmax(logits).numpy()).sum(-1)
    np.testing.assert_allclose(tr._training_ce(logits, y).numpy(), expected, rtol=1e-5)
    plain = training.AdversarialTrainer(clf, method="fast", eps=0.1)
    np.testing.assert_allclose(plain._training_ce(logits, y).numpy(),
                               -tf.nn.log_softmax(logits).numpy()[np.arange(4), y.numpy()],
                               rtol=1e-5)
    with pytest.raises(ValueError, match="label_smoothing"):
        training.AdversarialTrainer(clf, method="fast", eps=0.1, label_smoothing=1.0)
    with pytest.raises(ValueError, match="weight_decay"):
        training.AdversarialTrainer(clf, method="fast", eps=0.1, weight_decay=-1e-4)


# ------------------------------------------------------------------ recipes


def test_every_recipe_is_complete_and_known():
    names = set()
    for r in training.list_recipes():
        assert r["method"] in training.METHODS
        assert r["source"] and r["name"] not in names
        names.add(r["name"])
        assert set(r["settings"]) <= set(recipes.SETTING_KEYS)
        if "schedule" in r["settings"]:
            assert r["settings"]["schedule"] in training.SCHEDULES
        if "optimizer" in r["settings"]:
            assert r["settings"]["optimizer"] in training.OPTIMIZERS
    for method in training.METHODS:
        d = recipes.method_defaults(method)
        assert d["optimizer"] in training.OPTIMIZERS and d["schedule"] in training.SCHEDULES
    # the command line repeats the names (it validates before TensorFlow loads)
    assert flags.OPTIMIZERS == training.OPTIMIZERS and flags.SCHEDULES == training.SCHEDULES
    assert set(flags.METHODS) == set(training.METHODS)


def test_resolve_priority_and_errors():
    s = training.resolve_settings("madry", "cifar10", "preactresnet18", {"lr": 0.05})
    assert s.recipe == "rice2020-pgd-cifar10"
    assert s.values["lr"] == 0.05 and s.origin["lr"] == "user"
    assert s.values["weight_decay"] == 5e-4 and s.origin["weight_decay"] == "recipe"
    assert s.values["early_stop"] is True
    assert training.resolve_settings("madry", "cifar10", "cnn", {}).recipe is None  # arch
    assert training.resolve_settings("madry", None, "cnn", {}).values["lr"] == 1e-3
    fast = training.resolve_settings("fast", None, "cnn", {})
    assert (fast.values["optimizer"], fast.values["schedule"], fast.values["lr"]) == \
        ("adam", "cyclic", 0.005)
    named = training.resolve_settings("fast", None, None, {}, recipe="wong2020-fast-mnist")
    assert named.values["eps"] == 0.3 and named.values["step_size"] == 0.375
    with pytest.raises(ValueError, match="is for method 'madry'"):
        training.resolve_settings("fast", None, None, {}, recipe="rice2020-pgd-cifar10")
    with pytest.raises(ValueError, match="recipe must be auto, none or one of"):
        training.resolve_settings("fast", None, None, {}, recipe="nope")
    with pytest.raises(ValueError, match="unknown setting"):
        training.resolve_settings("fast", None, None, {"lr_max": 1})


def _args(**kw):
    p = argparse.ArgumentParser()
    tc.add_arguments(p)
    argv = ["--out", "/nonexistent/x"]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return p.parse_args(argv)


def test_cli_resolves_recipes_and_defaults():
    args = _args(data="mnist", method="fast", epochs=3)
    s = tc._resolve_settings(args)
    assert s.recipe == "wong2020-fast-mnist"
    assert (args.eps, args.epochs, args.batch_size, args.lr, args.schedule) == \
        (0.3, 3, 100, 0.005, "cyclic")
    args = _args(data="mnist", method="fast", recipe="none")
    tc._resolve_settings(args)
    assert (args.eps, args.epochs, args.batch_size) == (0.1, 40, 64)
    line = tc._settings_line(args, tc._resolve_settings(_args(data="digits", method="madry")))
    assert "no recipe" in line and "lr=0.001 (default)" in line and "schedule=cosine" in line


def test_cli_resume_of_a_run_written_before_recipes_keeps_adam_cosine():
    saved = {"method": "fast", "lr": 0.001, "eps": 0.1, "epochs": 40, "batch_size": 64,
             "data": "digits"}
    args = _args(data="digits", method="fast")
    tc._resolve_settings(args, tc._inherit_settings(args, saved))
    assert (args.optimizer, args.schedule, args.lr, args.epochs) == ("adam", "cosine", 0.001, 40)


def test_cli_resume_keeps_the_resolved_values():
    args = _args(data="digits", method="fast")
    saved = {"method": "fast", "resolved": {"values": {"lr": 0.004, "schedule": "cyclic"}}}
    tc._resolve_settings(args, tc._inherit_settings(args, saved))
    assert args.lr == 0.004


@pytest.mark.parametrize("argv, match", [
    (["--optimizer", "rmsprop"], "--optimizer: unknown optimizer 'rmsprop'; choose one of adam, sgd"),
    (["--schedule", "linear"], "--schedule: unknown schedule 'linear'"),
    (["--early-stop", "--val-size", "0"], "--early-stop needs held-out examples"),
    (["--momentum", "1.5"], "--momentum"),
    (["--weight-decay", "-1"], "--weight-decay"),
    (["--label-smoothing", "1"], "--label-smoothing"),
    (["--val-steps", "-1"], "--val-steps"),
    (["--recipe", "../x"], "--recipe: expected auto, none or a recipe name"),
])
def test_cli_bad_settings(tmp_path, capsys, argv, match):
    assert cli_main(["train-classifier", "--out", str(tmp_path / "o"), *argv]) == 2
    assert match in capsys.readouterr().err


def test_cli_unknown_recipe_name_is_refused_before_training(tmp_path, capsys):
    rc = cli_main(["train-classifier", "--out", str(tmp_path / "o"), "--recipe", "nope",
                   "--no-eval", "--epochs", "1"])
    assert rc == 2
    assert "--recipe: recipe must be auto, none or one of" in capsys.readouterr().err
    assert not (tmp_path / "o" / "checkpoints").exists()


# ------------------------------------------------------------------ robust early stopping


def test_robust_early_stopping_keeps_and_restores_the_best_epoch(tmp_path):
    clf = training.make_classifier((8, 8, 1), 10, width=2)
    tr = training.AdversarialTrainer(clf, method="fast", eps=0.1)
    tr.build((None, 8, 8, 1))
    stop = training.RobustEarlyStopping(str(tmp_path), verbose=0)
    stop.set_model(tr)
    snapshots = []
    for epoch, acc in enumerate([0.3, 0.6, 0.5, 0.55]):
        for v in clf.trainable_variables:
            v.assign(v + 1.0)  # "training" moves every weight
        snapshots.append([v.numpy().copy() for v in clf.trainable_variables])
        stop.on_epoch_end(epoch, {"val_robust_accuracy": acc})
    assert (stop.best_epoch, stop.best) == (1, 0.6)
    counter = int(tr.step_counter.numpy())
    # a resumed run reads the best so far from disk
    again = training.RobustEarlyStopping(str(tmp_path), verbose=0)
    again.set_model(tr)
    assert (again.best_epoch, again.best) == (1, 0.6)
    assert again.restore_best(3) is True
    for v, want in zip(clf.trainable_variables, snapshots[1]):
        np.testing.assert_array_equal(v.numpy(), want)
    assert int(tr.step_counter.numpy()) == counter
    assert again.restore_best(1) is False  # the best is the last epoch: nothing to do
    with pytest.raises(ValueError, match="no 'val_robust_accuracy' in the epoch's logs"):
        stop.on_epoch_end(4, {"loss": 1.0})


def test_cli_early_stop_records_the_best_epoch(tmp_path):
    out = tmp_path / "run"
    rc = cli_main(["train-classifier", "--data", "digits", "--method", "fast", "--epochs", "2",
                   "--limit", "300", "--width", "4", "--early-stop", "--val-size", "100",
                   "--val-steps", "2", "--no-eval", "--verbose", "0", "--out", str(out)])
    assert rc == 0
    record = json.loads((out / "history.json").read_text())
    assert record["early_stopping"]["best_epoch"] in (1, 2)
    assert len(record["history"]["val_robust_accuracy"]) == 2
    config = json.loads((out / "config.json").read_text())
    assert config["resolved"]["values"]["early_stop"] is True
    assert config["resolved"]["values"]["steps"] == 1  # the values the trainer used
    assert (out / "checkpoints" / "best.weights.h5").is_file()


def test_cli_names_match_the_library():
    import attacks.data

    assert flags.DATA_NAMES == attacks.data.DATASETS
    assert set(flags.ARCH_NAMES) == set(training.ARCHITECTURES)


def test_cli_cifar_shaped_recipe_end_to_end(tmp_path):
    """A CIFAR-shaped run through Wong et al.'s CIFAR-10 recipe (SGD, weight decay, cyclic lr
    peaking at half the run, pad-crop-flip augmentation) on PreActResNet-18: the machinery
    works end to end and records every value it used."""
    rng = np.random.default_rng(0)
    data = tmp_path / "tiny_cifar.npz"
    np.savez(data, x_train=rng.uniform(size=(48, 32, 32, 3)).astype("float32"),
             y_train=np.arange(48) % 10, x_test=rng.uniform(size=(16, 32, 32, 3)).astype("float32"),
             y_test=np.arange(16) % 10)
    out = tmp_path / "run"
    rc = cli_main(["train-classifier", "--data", str(data), "--method", "fast", "--recipe",
                   "wong2020-fast-cifar10", "--arch", "preactresnet18", "--width", "4",
                   "--epochs", "1", "--batch-size", "16", "--val-size", "16", "--val-steps", "1",
                   "--no-eval", "--no-guard", "--verbose", "0", "--out", str(out)])
    assert rc == 0
    resolved = json.loads((out / "config.json").read_text())["resolved"]
    assert resolved["recipe"] == "wong2020-fast-cifar10"
    values = resolved["values"]
    assert (values["optimizer"], values["schedule"], values["weight_decay"], values["augment"]) \
        == ("sgd", "cyclic", 5e-4, True)
    assert values["eps"] == pytest.approx(8 / 255) and values["step_size"] == pytest.approx(10 / 255)
    model = keras.models.load_model(out / "model.keras")
    assert model.count_params() < 200_000 and model.output_shape == (None, 10)
    trainer = keras.models.load_model(out / "trainer.keras")
    assert isinstance(trainer.optimizer, keras.optimizers.SGD)


@pytest.mark.parametrize("argv, match", [
    (["--arch", "resnet50"], "--arch: unknown architecture 'resnet50'"),
    (["--arch", "cnn", "--init-from", "m.keras"], "--arch and --init-from are exclusive"),
    (["--data", "imagenet"], "--data: unknown dataset 'imagenet' and no such file or directory"),
])
def test_cli_bad_arch_and_data(tmp_path, capsys, argv, match):
    assert cli_main(["train-classifier", "--out", str(tmp_path / "o"), *argv]) == 2
    assert match in capsys.readouterr().err


# ------------------------------------------------------------------ MART and AWP


def test_mart_loss_matches_its_definition():
    """MART's loss, computed by hand: boosted CE on the adversarial logits plus beta times the
    clean-to-adversarial KL weighted by 1 - p_clean(y)."""
    clf = training.make_classifier((8, 8, 1), 10, width=2)
    tr = training.AdversarialTrainer(clf, method="mart", eps=0.1, beta=3.0)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(4, 8, 8, 1)).astype("float32")
    x_adv = np.clip(x + rng.uniform(-0.1, 0.1, size=x.shape), 0, 1).astype("float32")
    y = tf.constant([1, 2, 3, 4])
    loss, adv_logits, clean_logits = training.get_method("mart").loss(tr.step_context(), x,
                                                                      x_adv, y)
    pa = tf.nn.softmax(clf(x_adv, training=True)).numpy().astype("float64")
    pc = tf.nn.softmax(clf(x, training=True)).numpy().astype("float64")
    yy = y.numpy()
    wrong = pa.copy()
    wrong[np.arange(4), yy] = 0
    bce = -np.log(pa[np.arange(4), yy]) - np.log(1.0001 - wrong.max(1) + 1e-12)
    kl = (pc * (np.log(pc) - np.log(pa))).sum(1)
    expected = bce.mean() + 3.0 * (kl * (1 - pc[np.arange(4), yy])).mean()
    assert float(loss) == pytest.approx(expected, rel=1e-4)


def _awp_step(gamma, method="awp"):
    keras.utils.set_random_seed(0)
    clf = training.make_model("preactresnet18", (8, 8, 1), 10, width=2)
    gamma = {"awp_gamma": gamma} if method == "awp" else {}  # madry reads no gamma
    tr = training.AdversarialTrainer(clf, method=method, eps=0.1, steps=1, **gamma)
    tr.compile(optimizer=keras.optimizers.SGD(0.0))  # lr 0: only the side effects remain
    x = np.random.default_rng(0).uniform(size=(8, 8, 8, 1)).astype("float32")
    y = np.arange(8) % 10
    before = {v.path: v.numpy().copy() for v in clf.weights}
    logs = tr.train_step((tf.constant(x), tf.constant(y)))
    return clf, before, logs


def test_awp_perturbation_is_undone_and_moves_no_statistics():
    """With lr 0 an AWP step leaves every kernel as it was (the perturbation is undone), and
    its probe pass moves no batch-norm statistics: with gamma 0 the statistics after the step
    are those of a madry step (one training pass), not of two passes."""
    clf, before, logs = _awp_step(0.01)
    for v in clf.trainable_variables:
        np.testing.assert_allclose(v.numpy(), before[v.path], atol=1e-6)
    assert np.isfinite(float(logs["loss"]))
    awp0, _, _ = _awp_step(0.0)
    madry, _, _ = _awp_step(0.0, method="madry")
    moved = 0
    for a, m in zip(awp0.non_trainable_variables, madry.non_trainable_variables):
        np.testing.assert_allclose(a.numpy(), m.numpy(), rtol=1e-5, atol=1e-6)
        moved += not np.allclose(m.numpy(), before[m.path])
    assert moved  # the loss's training pass does move them


def test_awp_changes_the_gradient_against_madry():
    """The perturbed weights give another loss and gradient than plain PGD training."""
    clf, _, awp_logs = _awp_step(0.5)
    clf0, _, madry_like = _awp_step(0.0)
    assert float(awp_logs["loss"]) != pytest.approx(float(madry_like["loss"]), rel=1e-6)


# ------------------------------------------------------------------ weight averaging


def test_weight_averaging_follows_its_formula_over_real_training():
    keras.utils.set_random_seed(0)
    clf = training.make_classifier((8, 8, 1), 10, width=2)
    tr = training.AdversarialTrainer(clf, method="fast", eps=0.1)
    tr.compile(optimizer=keras.optimizers.Adam(1e-2))
    ema = training.WeightAveraging(clf, decay=0.9)
    expected = [v.numpy().astype("float64") for v in clf.weights]

    class Record(keras.callbacks.Callback):
        t = 0

        def on_train_batch_end(self, batch, logs=None):  # runs after ema's update
            d = min(0.9, (1 + self.t) / (10 + self.t))
            for i, v in enumerate(clf.weights):
                expected[i] = d * expected[i] + (1 - d) * v.numpy()
            self.t += 1

    x = np.random.default_rng(0).uniform(size=(64, 8, 8, 1)).astype("float32")
    y = np.arange(64) % 10
    tr.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[ema, Record()])
    assert int(ema.state.count.numpy()) == 16
    for avg, want in zip(ema.state.averages, expected):
        np.testing.assert_allclose(avg.numpy(), want, rtol=1e-4, atol=1e-6)
    raw = [v.numpy().copy() for v in clf.weights]
    ema.swap()
    np.testing.assert_allclose(clf.weights[0].numpy(), expected[0], rtol=1e-4, atol=1e-6)
    ema.swap()
    np.testing.assert_array_equal(clf.weights[0].numpy(), raw[0])
    with pytest.raises(ValueError, match="decay must be in"):
        training.WeightAveraging(clf, decay=1.0)


def test_cli_ema_saves_the_average(tmp_path, capsys):
    out = tmp_path / "run"
    rc = cli_main(["train-classifier", "--data", "digits", "--method", "fast", "--epochs", "2",
                   "--limit", "200", "--width", "4", "--ema", "0.9", "--val-size", "0",
                   "--no-eval", "--verbose", "2", "--no-guard", "--out", str(out)])
    assert rc == 0
    assert "weight averaging: saving the moving average (decay 0.9) of 8 updates" in \
        capsys.readouterr().out
    values = json.loads((out / "config.json").read_text())["resolved"]["values"]
    assert values["ema"] == 0.9
    assert cli_main(["train-classifier", "--out", str(tmp_path / "x"), "--ema", "0.9",
                     "--early-stop"]) == 2
    assert "--ema and --early-stop" in capsys.readouterr().err


def test_fast_start_is_not_clipped_to_the_box_but_the_result_is():
    """fast takes its FGSM gradient at x + U(-eps, eps) without clipping to the box (Wong et
    al.'s MNIST code); the adversarial example it returns lies in the ball and the box."""
    seen = []

    def model(z, training=False):
        seen.append(z)
        return tf.concat([tf.reduce_sum(z, axis=[1, 2, 3])[:, None], tf.zeros([tf.shape(z)[0], 1])],
                         axis=1)

    clf = training.make_classifier((4, 4, 1), 2, width=1)
    tr = training.AdversarialTrainer(clf, method="fast", eps=0.3)
    tr.model = model  # the method calls trainer.model through _logits
    x = tf.zeros([64, 4, 4, 1])  # every pixel on the lower bound
    x_adv = tr.craft(x, tf.ones([64], tf.int32), seed=tf.constant([1, 2]))
    start = seen[0]
    assert float(tf.reduce_min(start)) < -0.2  # outside the box [0, 1]
    assert float(tf.reduce_min(x_adv)) >= 0.0 and float(tf.reduce_max(x_adv)) <= 0.3 + 1e-6
