"""Round four of the new-user probe (issue 36): one line naming the argument, before any work;
a flag the chosen method would ignore refused; numeric flags bounded."""

import json
import re

import pytest

from robustgrad import cli

TRAIN = ["train-agent", "--algo", "ppo", "--env", "CartPole-v1", "--steps", "64",
         "--no-progress", "--eval-episodes", "0"]
ONE_THREAD = ("trains a learned adversary, whose compiled rollout calls the victim inside "
              "TensorFlow; that needs >= 2 inter-op threads (one would deadlock): pass "
              "--threads 2, or leave --threads out")


def _fake_agent(tmp_path):
    d = tmp_path / "agent"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"env": "CartPole-v1"}))
    (d / "agent.json").write_text(json.dumps({"algo": "ppo", "num_timesteps": 0}))
    return str(d)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("robust", ["atla", "atla-sa"])
def test_one_thread_with_a_learned_adversary_is_refused_before_training(tmp_path, capsys,
                                                                       robust):
    out = tmp_path / "run"
    assert cli.main(["--threads", "1", *TRAIN, "--out", str(out), "--robust", robust]) == 2
    assert _one_line(capsys) == f"robustgrad: error: --threads 1: --robust {robust} {ONE_THREAD}"
    assert not out.exists()


@pytest.mark.parametrize("attack", ["optimal", "paad"])
def test_one_thread_with_a_learned_attack_is_refused_before_evaluating(tmp_path, capsys, attack):
    agent = _fake_agent(tmp_path)
    out = tmp_path / "eval"
    assert cli.main(["--threads", "1", "evaluate-agent", "--agent", agent, "--attacks",
                     f"mad,{attack}", "--out", str(out)]) == 2
    assert _one_line(capsys) == f"robustgrad: error: --threads 1: --attacks {attack} {ONE_THREAD}"
    assert not out.exists()


@pytest.mark.parametrize("flags, message", [
    (["--adversary-steps", "1000"],
     "--adversary-steps: only with --attacks optimal|paad, and no --attacks was given"),
    (["--attacks", "mad,rs", "--adversary-steps", "1000"],
     "--adversary-steps: only with --attacks optimal|paad, not with --attacks mad,rs"),
    (["--attacks", "mad", "--rs-steps", "1000"],
     "--rs-steps: only with --attacks rs, not with --attacks mad"),
    (["--attacks", "optimal", "--adversary-steps", str(10**12)],
     "--adversary-steps must be at most 1000000000 (env steps: ~15 CPU hours at 18,000 steps per "
     f"CPU second), got {10**12}"),
    (["--attacks", "rs", "--rs-steps", "0"], "--rs-steps must be an int >= 1, got 0"),
])
def test_evaluate_agent_step_flags_apply_to_their_attacks_and_are_bounded(tmp_path, capsys,
                                                                         flags, message):
    agent = _fake_agent(tmp_path)
    assert cli.main(["evaluate-agent", "--agent", agent, "--out", str(tmp_path / "e"),
                     *flags]) == 2
    assert _one_line(capsys) == f"robustgrad: error: {message}"


def test_train_agent_robust_method_convex_works_as_documented(tmp_path, capsys):
    out = tmp_path / "run"
    # one epoch over the one rollout: the convex regulariser's path once, not the preset's 20
    assert cli.main([*TRAIN, "--out", str(out), "--robust", "sa", "--robust-method",
                     "convex", "--set", "n_epochs=1"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["robust"], config["robust_method"]) == ("sa", "convex")
    # its one flag that would do nothing: the steps of a search it does not run
    assert cli.main([*TRAIN, "--out", str(tmp_path / "r2"), "--robust", "sa", "--robust-method",
                     "convex", "--robust-steps", "5"]) == 2
    assert _one_line(capsys).endswith(
        "robustgrad: error: --robust-steps: --robust-method convex searches nothing (it bounds "
        "the whole ball); --robust-steps is for pgd and sgld")


def _digits_model(tmp_path, outputs: int, name: str = "m.keras") -> str:
    import keras

    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(outputs)])
    path = str(tmp_path / name)
    model.save(path)
    return path


@pytest.mark.parametrize("flags, message", [
    (["--method", "smoothing", "--norm", "linf"],
     "--norm linf: --method smoothing certifies l2 radii (Gaussian noise); leave --norm out"),
    (["--method", "crown", "--sigma", "0.5"],
     "--sigma: only with --method smoothing, not with --method crown"),
    (["--method", "ibp", "--n", "100"], "--n: only with --method smoothing, not with --method ibp"),
    (["--method", "alpha-crown", "--seed", "3"],
     "--seed: only with --method smoothing, not with --method alpha-crown"),
    (["--method", "smoothing", "--n", str(10**9)],
     "--n must be at most 10000000 (noise draws per example: 100x Cohen et al.'s 100,000), got "
     f"{10**9}"),
])
def test_certify_refuses_flags_its_method_would_ignore(tmp_path, capsys, flags, message):
    model = tmp_path / "m.keras"
    model.write_bytes(b"PK\x03\x04")  # never opened: the flags are checked first
    out = tmp_path / "c"
    assert cli.main(["certify", "--model", str(model), "--out", str(out), *flags]) == 2
    assert _one_line(capsys) == f"robustgrad: error: {message}"
    assert not out.exists()


def test_certify_of_a_one_output_model_is_one_line(tmp_path, capsys):
    model = _digits_model(tmp_path, 1)
    assert cli.main(["certify", "--model", model, "--limit", "8", "--out",
                     str(tmp_path / "c")]) == 2
    assert _one_line(capsys) == (
        "robustgrad: error: --model: model returns 1 logit per example; a classifier needs one "
        "logit per class (>= 2; for a binary task return 2 logits, e.g. [0, z] for a sigmoid's z)")


def test_certify_alpha_crown_too_wide_is_refused_before_any_radius(tmp_path, capsys,
                                                                   monkeypatch):
    from robustgrad.bounds import _alpha

    monkeypatch.setattr(_alpha, "MAX_ELEMENTS", 100)  # this small MLP is "too wide" now
    model = _digits_model(tmp_path, 10)
    assert cli.main(["certify", "--model", model, "--limit", "8", "--method", "alpha-crown",
                     "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr()
    assert "certifying" not in err.out  # no radius started
    assert err.err.strip().startswith(
        "robustgrad: error: --model: method='alpha-crown' would hold about ")
    assert err.err.strip().endswith("use method='crown' for this network, or bound fewer outputs "
                                    "(a spec C)")


@pytest.mark.parametrize("flags, message", [
    (["--method", "madry", "--awp-gamma", "0.01"],
     "--awp-gamma: only with --method awp, not with --method madry"),
    (["--method", "madry", "--sigma", "0.5"],
     "--sigma: only with --method smoothadv, not with --method madry"),
    (["--method", "madry", "--kappa-final", "0.5"],
     "--kappa-final: only with --method ibp|crown-ibp, not with --method madry"),
    (["--method", "ibp", "--beta-final", "0.5"],
     "--beta-final: only with --method crown-ibp, not with --method ibp"),
    (["--arch", "wideresnet", "--width", "8"],
     "--width: only with --arch cnn|preactresnet18, not with --arch wideresnet"),
    (["--method", "ibp", "--width", "8"],  # ibp's default architecture is ibp-small
     "--width: only with --arch cnn|preactresnet18, not with --arch ibp-small"),
])
def test_train_classifier_refuses_flags_its_method_or_arch_would_ignore(tmp_path, capsys, flags,
                                                                       message):
    out = tmp_path / "run"
    assert cli.main(["train-classifier", "--out", str(out), *flags]) == 2
    assert _one_line(capsys) == f"robustgrad: error: {message}"
    assert not out.exists()


def test_square_on_vector_data_is_refused_before_any_attack_runs():
    import numpy as np

    import attacks
    from attacks.cascade import run_cascade

    model = lambda x, training=False: tf_dense(x)  # noqa: E731
    x = np.random.default_rng(0).uniform(size=(4, 6, 1)).astype("float32")
    y = np.zeros(4, "int64")
    message = ("x: square needs images [B, H, W, C] or [B, H, W] with H, W >= 2 (it perturbs "
               "square windows), got examples of shape (6, 1); for vector data use another "
               "attack (e.g. apgd-ce)")
    with pytest.raises(ValueError, match=rf"^{re.escape(message)}$"):
        attacks.square(model, x, y, eps=0.1, clip_min=0.0, clip_max=1.0, steps=2)
    ran = []  # progress is called before each attack: FGSM would show here had it run first
    with pytest.raises(ValueError, match=rf"^attacks: square: {re.escape(message)}$"):
        run_cascade(model, x, y, [("fgsm", attacks.FGSM()), ("square", attacks.Square(steps=2))],
                    [0.1], norm="linf", clip_min=0.0, clip_max=1.0,
                    progress=lambda done, what: ran.append(what))
    assert ran == []


def tf_dense(x):
    import tensorflow as tf

    flat = tf.reshape(x, [tf.shape(x)[0], -1])
    return tf.concat([tf.reduce_sum(flat, 1, keepdims=True), -tf.reduce_sum(flat, 1,
                                                                          keepdims=True)], 1)


def test_a_full_disk_is_one_line_saying_what_out_is_left_as(tmp_path, capsys, monkeypatch):
    import errno

    from robustgrad import atomic

    def full(directory, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", directory)

    monkeypatch.setattr(atomic, "write_entries", full)
    out = tmp_path / "run"
    assert cli.main([*TRAIN, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("robustgrad: error: no space left on device writing "), err
    assert err[0].endswith(f": {out} keeps its last complete files (writes are atomic); free "
                           "space and run again with --resume"), err


def test_an_example_shape_mismatch_with_the_same_values_says_how_to_reshape():
    import keras
    import numpy as np

    from attacks._models import check_classification_data

    model = keras.Sequential([keras.Input((64, 1)), keras.layers.Flatten(), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match=re.escape(
            "x: examples of shape (64, 1, 1) but the model takes inputs of shape (64, 1); both "
            "hold 64 values per example: reshape the data to [N, 64, 1] (x.reshape(len(x), 64, "
            "1))")):
        check_classification_data(model, np.zeros((2, 64, 1, 1), "float32"), [0, 1])


def test_evaluate_on_vector_data_writes_its_report_and_exits_0(tmp_path, capsys):
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    data = tmp_path / "flat.npz"
    np.savez(data, x_train=rng.uniform(size=(8, 6)).astype("float32"), y_train=np.arange(8) % 2,
             x_test=rng.uniform(size=(8, 6)).astype("float32"), y_test=np.arange(8) % 2)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    model.save(tmp_path / "m.keras")
    out = tmp_path / "e"
    assert cli.main(["evaluate", "--model", str(tmp_path / "m.keras"), "--data", str(data),
                     "--attacks", "fgsm,pgd", "--out", str(out), "--no-progress"]) == 0
    assert {"report.json", "report.txt", "examples.png"} <= {p.name for p in out.iterdir()}
    # the default attacks on vectors: without Square, said on one line
    capsys.readouterr()
    assert cli.main(["evaluate", "--model", str(tmp_path / "m.keras"), "--data", str(data),
                     "--out", str(tmp_path / "e2"), "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert (f"note: --data {data} holds vectors (6,), not images: the default attacks run "
            "without square (it perturbs square windows)") in said
    assert "attacks fgsm,pgd,apgd-ce," in said
    # Square asked for by name on vectors: refused before any attack runs, naming it
    assert cli.main(["evaluate", "--model", str(tmp_path / "m.keras"), "--data", str(data),
                     "--attacks", "fgsm,square", "--out", str(tmp_path / "e3"),
                     "--no-progress"]) == 2
    assert "attacks: square: x: square needs images" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_an_npz_of_one_channel_sequences_is_read_as_it_is_not_as_images(tmp_path, dtype):
    import numpy as np

    from attacks.data import load_dataset, load_test_set

    rng = np.random.default_rng(0)
    x = (rng.uniform(size=(6, 64, 1)) * (255 if dtype == "uint8" else 1)).astype(dtype)
    data = tmp_path / "seq.npz"
    np.savez(data, x_train=x, y_train=np.arange(6) % 2, x_test=x, y_test=np.arange(6) % 2)
    ds = load_dataset(str(data))
    assert ds.x_train.shape == ds.x_test.shape == (6, 64, 1)  # no channel added: it has one
    expected = x.astype("float32") / (255 if dtype == "uint8" else 1)
    np.testing.assert_allclose(ds.x_test, expected, rtol=1e-6)
    bare = tmp_path / "bare.npz"
    np.savez(bare, x=x, y=np.arange(6) % 2)
    assert load_test_set(str(bare))[0].shape == (6, 64, 1)
    # grayscale images [N, H, W] still get their channel
    np.savez(data, x_train=x[..., 0].reshape(6, 8, 8), y_train=np.arange(6) % 2,
             x_test=x[..., 0].reshape(6, 8, 8), y_test=np.arange(6) % 2)
    assert load_dataset(str(data)).x_test.shape == (6, 8, 8, 1)


def test_evaluate_of_a_sequence_model_on_its_npz_runs(tmp_path, capsys):
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    data = tmp_path / "seq.npz"
    x = rng.uniform(size=(8, 64, 1)).astype("float32")
    np.savez(data, x_test=x, y_test=np.arange(8) % 3)
    model = keras.Sequential([keras.Input((64, 1)), keras.layers.Flatten(), keras.layers.Dense(3)])
    model.save(tmp_path / "m.keras")
    assert cli.main(["evaluate", "--model", str(tmp_path / "m.keras"), "--data", str(data),
                     "--attacks", "fgsm", "--out", str(tmp_path / "e"), "--no-progress"]) == 0
    assert "holds vectors (64, 1), not images" not in capsys.readouterr().err


def _disk_fills_up(monkeypatch):
    """Every crash-safe write (robustgrad.atomic.replacing: JSON records, reports, plots) runs
    its writer, then fails as a full disk does, before its file would replace the old one."""
    import contextlib
    import errno

    from robustgrad import atomic

    real = atomic.replacing

    @contextlib.contextmanager
    def full(path):
        with real(path) as tmp:
            yield tmp
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(atomic, "replacing", full)


def _nothing_half_written(out):
    """No temporary or staging file is left, and every JSON file in ``out`` parses."""
    names = [p for p in out.rglob("*")] if out.exists() else []
    assert not [p for p in names if ".tmp" in p.name or p.name.startswith(".")], names
    for p in names:
        if p.suffix == ".json":
            json.loads(p.read_text())


def test_a_full_disk_in_train_classifier_is_one_line(tmp_path, capsys, monkeypatch):
    _disk_fills_up(monkeypatch)
    out = tmp_path / "run"
    assert cli.main(["train-classifier", "--epochs", "1", "--no-eval", "--verbose", "0",
                     "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"robustgrad: error: no space left on device writing {out}"), err
    assert err.endswith(f": {out} keeps its last complete files (writes are atomic); free space "
                        "and run again with --resume"), err
    _nothing_half_written(out)


def test_a_full_disk_in_evaluate_agent_is_one_line(tmp_path, capsys, monkeypatch):
    import agents

    agent = tmp_path / "agent"
    agents.PPO(env="CartPole-v1", n_steps=8, num_envs=2, n_minibatches=1,
               preset=None).save(str(agent))
    _disk_fills_up(monkeypatch)
    out = tmp_path / "eval"
    assert cli.main(["evaluate-agent", "--agent", str(agent), "--episodes", "1", "--attacks",
                     "random", "--eps", "0.05", "--out", str(out), "--no-progress"]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"robustgrad: error: no space left on device writing {out}"), err
    assert err.endswith(f": {out} keeps its last complete files (writes are atomic); free space "
                        "and run again"), err
    _nothing_half_written(out)


def test_a_full_disk_while_train_classifier_saves_its_model_leaves_no_truncated_file(
        tmp_path, capsys, monkeypatch):
    import errno
    import zipfile

    real = zipfile.ZipFile.writestr

    def full(self, name, *args, **kwargs):  # Keras writes a .keras file as a zip
        if str(getattr(self, "filename", "")).endswith(".keras"):
            real(self, name, *args, **kwargs)  # part of the file is on disk, then none fits
            raise OSError(errno.ENOSPC, "No space left on device", self.filename)
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "writestr", full)
    out = tmp_path / "run"
    # the smallest run that saves a model (the save is the step under test, not the training)
    assert cli.main(["train-classifier", "--epochs", "1", "--limit", "64", "--method", "clean",
                     "--batch-size", "32", "--width", "4", "--val-size", "0", "--no-eval",
                     "--verbose", "0", "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert err.startswith("robustgrad: error: no space left on device writing "), err
    assert err.endswith("free space and run again with --resume"), err
    assert not (out / "model.keras").exists()  # no truncated model where a model would be
    assert not [p for p in out.iterdir() if ".partial-" in p.name]


@pytest.mark.parametrize("flags, message", [
    (["--steps", str(10**15)], f"--steps must be an int in [1, 10000000000], got {10**15}"),
    # the library names its fields; the command line names the flag that set each
    (["--num-envs", str(10**6)], f"--num-envs must be an int in [1, 65536], got {10**6}"),
    (["--set", "n_steps=1000000000"],
     "--set n_steps must be an int in [1, 16777216], got 1000000000"),
    (["--set", "n_epochs=1000000000"],
     "--set n_epochs must be an int in [1, 100000], got 1000000000"),
    (["--num-envs", "65536", "--set", "n_steps=512"],
     "--set n_steps * --num-envs * num_seeds must be at most 16777216 (transitions one rollout "
     "keeps in memory), got 512 * 65536 * 1 = 33554432"),
    (["--checkpoint-every", str(10**12)],
     f"--checkpoint-every must be an int in [0, 10000000000], got {10**12}"),
])
def test_train_agent_counts_are_bounded_by_the_library_on_one_line(tmp_path, capsys, flags,
                                                                  message):
    out = tmp_path / "run"
    assert cli.main([*TRAIN, "--out", str(out), *flags]) == 2  # the last --steps counts
    assert _one_line(capsys) == f"robustgrad: error: {message}"
