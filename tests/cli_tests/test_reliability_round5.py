"""Round five of the new-user probe (issue 36's kinds): one line naming the argument and its
range, before any work; a flag the run would ignore refused; nothing of the user's deleted."""

import re

import numpy as np
import pytest

from robustgrad import cli


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _model(tmp_path, outputs: int, name: str = "m.keras") -> str:
    import keras

    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(outputs)])
    path = str(tmp_path / name)
    model.save(path)
    return path


def _npz(tmp_path, name="d.npz", labels_shift=0) -> str:
    rng = np.random.default_rng(0)
    x = rng.random((12, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 2, 12) + labels_shift
    path = str(tmp_path / name)
    np.savez(path, x_train=x, y_train=y, x_test=x[:6], y_test=y[:6])
    return path


def test_evaluate_of_a_one_logit_model_names_model(tmp_path, capsys):
    out = tmp_path / "e"
    assert cli.main(["evaluate", "--model", _model(tmp_path, 1), "--data", _npz(tmp_path),
                     "--attacks", "fgsm", "--eps", "0.1", "--out", str(out)]) == 2
    assert _one_line(capsys) == (
        "robustgrad: error: --model: model returns 1 logit per example; a classifier needs one "
        "logit per class (>= 2; for a binary task return 2 logits, e.g. [0, z] for a sigmoid's z)")
    assert not out.exists()


@pytest.mark.parametrize("command", ["evaluate", "certify"])
def test_labels_outside_the_models_classes_name_data_not_model(tmp_path, capsys, command):
    data = _npz(tmp_path, labels_shift=5)
    assert cli.main([command, "--model", _model(tmp_path, 2), "--data", data, "--eps", "0.1",
                     "--out", str(tmp_path / "o")]) == 2
    assert _one_line(capsys) == (f"robustgrad: error: --data {data}: y has labels outside [0, 2) "
                                 "(min 5, max 6); the model has 2 outputs")


@pytest.mark.parametrize("call, message", [
    (dict(restarts=10**9), "restarts must be an int in [1, 1000], got 1000000000"),
    (dict(steps=10**12), "steps must be an int in [1, 100000], got 1000000000000"),
])
def test_attack_counts_are_bounded_in_the_python_api(call, message):
    import attacks

    x, y = np.zeros((2, 4), "float32"), np.array([0, 1])
    model = lambda v, training=False: v[:, :2]  # noqa: E731
    with pytest.raises(ValueError, match=re.escape(message)):
        attacks.projected_gradient_descent(model, x, y, eps=0.1, clip_min=0.0, clip_max=1.0,
                                           **call)
    with pytest.raises(ValueError, match=re.escape(message)):  # when built, not when run
        attacks.PGD(**call)


@pytest.mark.parametrize("fn, kwargs, message", [
    ("carlini_wagner_l2", dict(binary_search_steps=10**9),
     "binary_search_steps must be an int in [1, 1000], got 1000000000"),
    ("carlini_wagner_l2", dict(steps=2, learning_rate=float("nan")),
     "learning_rate must be a number > 0, got nan"),
    ("apgd", dict(eps=0.1, eot_iter=10**9), "eot_iter must be an int in [1, 1000], got 1000000000"),
    ("apgd", dict(eps=0.1, steps=2, rho=5.0), "rho must be a number in [0, 1], got 5.0"),
    ("square", dict(eps=0.1, steps=2, p_init=0.0), "p_init must be a number in (0, 1], got 0.0"),
])
def test_attack_arguments_out_of_range_are_refused(fn, kwargs, message):
    import attacks

    x, y = np.full((2, 2, 2, 1), 0.2, "float32"), np.array([0, 1])
    model = lambda v, training=False: tf_flat(v)[:, :2]  # noqa: E731
    with pytest.raises(ValueError, match=re.escape(message)):
        getattr(attacks, fn)(model, x, y, clip_min=0.0, clip_max=1.0, **kwargs)


def tf_flat(v):
    import tensorflow as tf

    return tf.reshape(v, [tf.shape(v)[0], -1])


def test_smooth_certify_noise_draws_are_bounded():
    import attacks

    with pytest.raises(ValueError, match=re.escape(
            "n must be an int in [1, 10000000], got 1000000000000")):
        attacks.smooth_certify(lambda v, training=False: v, np.zeros((1, 2), "float32"),
                               sigma=0.25, n0=10, n=10**12)


def test_adversarial_training_steps_are_bounded_free_at_64():
    import keras

    from attacks.training import AdversarialTrainer
    from attacks.training.methods import MAX_FREE_REPLAYS
    from robustgrad.commands import _train_classifier_flags as flags

    assert flags.MAX_FREE_REPLAYS == MAX_FREE_REPLAYS  # the command line checks before TF loads
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=re.escape("steps must be an int in [1, 64], got 1000")):
        AdversarialTrainer(model, method="free", eps=0.1, steps=1000)
    with pytest.raises(ValueError, match=re.escape(
            "steps must be an int in [1, 100000], got 1000000000")):
        AdversarialTrainer(model, method="madry", eps=0.1, steps=10**9)


def test_bounds_agree_with_the_command_lines():
    from attacks import _validate, certify
    from robustgrad.commands import _bounds
    from robustgrad.commands import certify as certify_command

    assert _validate.MAX_STEPS == _bounds.MAX_REPEATS
    assert _validate.MAX_RESTARTS == _bounds.MAX_RESTARTS
    assert certify.MAX_NOISE_DRAWS == certify_command.MAX_DRAWS


@pytest.mark.parametrize("flags, chosen", [
    ([], "--method madry's default is --optimizer adam"),
    (["--optimizer", "adam"], None),  # refused by the flag checks, before the recipe
])
def test_momentum_with_adam_is_refused(tmp_path, capsys, flags, chosen):
    out = tmp_path / "run"
    assert cli.main(["train-classifier", "--method", "madry", "--momentum", "0.5", "--epochs",
                     "1", "--limit", "16", "--no-eval", "--out", str(out), *flags]) == 2
    line = _one_line(capsys)
    if chosen is None:
        assert line == "robustgrad: error: --momentum: SGD's momentum, not with --optimizer adam"
    else:
        assert line == (f"robustgrad: error: --momentum: SGD's momentum, but {chosen}, which "
                        "has none: add --optimizer sgd to use it, or leave --momentum out")
    assert not (out / "model.keras").exists()


def test_momentum_in_the_python_api_with_adam_is_refused():
    from attacks.training.config import ClassifierConfig

    with pytest.raises(ValueError, match=re.escape(
            "--momentum: SGD's momentum, but you chose --optimizer adam, which has none")):
        ClassifierConfig(method="clean", optimizer="adam", momentum=0.5).resolve()
    assert ClassifierConfig(method="clean", optimizer="sgd", momentum=0.5).resolve().momentum \
        == 0.5


def _image(path, size=(8, 8)):
    from PIL import Image

    Image.fromarray(np.zeros(size, np.uint8)).save(path)


def test_an_empty_class_folder_is_refused_naming_it(tmp_path):
    from attacks._formats import read_image_folder

    for c in ("a", "b"):
        (tmp_path / c).mkdir()
    for i in range(3):
        _image(tmp_path / "a" / f"{i}.png")
    with pytest.raises(ValueError, match=re.escape(
            f"{tmp_path / 'b'}: the class folder 'b' holds no images (.png, ")):
        read_image_folder(str(tmp_path))


def test_a_folder_inside_a_class_folder_is_refused_not_skipped(tmp_path):
    from attacks._formats import read_image_folder

    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    for i in range(3):
        _image(tmp_path / "a" / "sub" / f"{i}.png")
        _image(tmp_path / "b" / f"{i}.png")
    with pytest.raises(ValueError, match=re.escape(
            f"{tmp_path / 'a' / 'sub'}: a folder inside the class folder 'a', whose images would "
            f"not be read; put each class's images directly in its folder")):
        read_image_folder(str(tmp_path))


def test_export_overwrite_never_deletes_a_directory_that_is_not_a_savedmodel(tmp_path, capsys):
    precious = tmp_path / "thesis"
    precious.mkdir()
    (precious / "chapter1.tex").write_text("years of work")
    out = tmp_path / "run"
    assert cli.main(["train-classifier", "--method", "clean", "--epochs", "1", "--limit", "16",
                     "--no-eval", "--out", str(out), "--overwrite", "--export",
                     str(precious)]) == 2
    assert _one_line(capsys) == (
        f"robustgrad: error: --export {precious}: holds files that are not a SavedModel's "
        "(chapter1.tex); --overwrite replaces a SavedModel only: choose another directory")
    assert (precious / "chapter1.tex").read_text() == "years of work"


def test_the_library_checks_the_export_directory_too(tmp_path):
    from robustgrad.rundir import check_export_dir

    d = tmp_path / "x"
    d.mkdir()
    (d / "saved_model.pb").write_bytes(b"")
    (d / "variables").mkdir()
    check_export_dir(str(d), overwrite=True)  # a SavedModel: replaceable
    (d / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files that are not a SavedModel's"):
        check_export_dir(str(d), overwrite=True)


def test_a_resumed_run_keeps_its_own_momentum_with_adam():
    """The saved run's resolved momentum (the default 0.9, unused by adam) is not a user's
    --momentum: ``--resume`` must not refuse it (it did, in this round's first fix)."""
    from attacks.training.config import ClassifierConfig

    first = ClassifierConfig(method="clean").resolve()
    record = {**first.to_record(), "resolved": first.resolved}
    resumed = ClassifierConfig(method="clean").inherit(record)
    assert resumed.momentum == 0.9 and resumed.resolve(record).optimizer == "adam"
    with pytest.raises(ValueError, match="--momentum: SGD's momentum"):
        ClassifierConfig(method="clean", momentum=0.5).inherit(record).resolve(record)


def test_a_negative_agent_seed_is_refused_naming_seed():
    import agents

    with pytest.raises(ValueError, match=re.escape("seed must be an int >= 0, got -1")):
        agents.PPO(env="CartPole-v1", seed=-1)  # was NumPy's "expected non-negative integer"


@pytest.mark.parametrize("flag", ["--clip-min", "--clip-max"])
def test_a_nan_clip_flag_is_refused_before_loading(tmp_path, capsys, flag):
    model = tmp_path / "m.keras"
    model.write_bytes(b"PK\x03\x04")  # never opened: the flags are checked first
    assert cli.main(["evaluate", "--model", str(model), flag, "nan", "--out",
                     str(tmp_path / "e")]) == 2
    assert _one_line(capsys) == f"robustgrad: error: {flag} must be a finite number, got nan"


def test_an_export_path_that_names_a_file_is_refused_before_training(tmp_path, capsys):
    out, export = tmp_path / "run", tmp_path / "m.keras"
    assert cli.main(["train-classifier", "--method", "clean", "--epochs", "1", "--limit", "16",
                     "--no-eval", "--out", str(out), "--export", str(export)]) == 2
    assert _one_line(capsys) == (
        f"robustgrad: error: --export {export}: a SavedModel is a directory, and .keras names a "
        "file (the Keras model is written as model.keras in the run's directory): give a "
        "directory name")
    assert not export.exists() and not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["train-classifier", "--method", "clean", "--lr", "1e30", "--out", "{out}"],
     "robustgrad: error: --lr must be a number in (0, 10], got 1e+30"),
    (["train-agent", "--env", "CartPole-v1", "--lr", "1e30", "--steps", "64", "--out", "{out}"],
     "robustgrad: error: --lr must be a number in (0, 10], got 1e+30"),
])
def test_a_learning_rate_that_can_only_overflow_is_refused(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    assert cli.main([a.replace("{out}", str(out)) for a in argv]) == 2
    assert _one_line(capsys) == message
    assert not out.exists()


def test_the_library_bounds_the_learning_rate_too():
    import agents
    from attacks.training import ClassifierConfig
    from robustgrad.checks import MAX_LEARNING_RATE

    assert MAX_LEARNING_RATE == 10.0
    with pytest.raises(ValueError, match=re.escape("lr must be a number in (0, 10], got 1e+30")):
        ClassifierConfig(lr=1e30)
    with pytest.raises(ValueError, match=re.escape("learning_rate must be a number in (0, 10], "
                                                   "got 1e+30")):
        agents.PPO(env="CartPole-v1", learning_rate=1e30)
    ClassifierConfig(lr=10.0)  # the bound itself is allowed
