"""The command line at its edges: start-up (no TensorFlow for --help, TF's native log lines hidden
unless -v), user errors (one line, exit 2, no traceback) against internal errors (traceback),
output directories checked before the work, model files checked with one-line errors, no empty
output directory left behind, and the one progress display."""

import io
import json
import os
import subprocess
import sys
import zipfile

import keras
import numpy as np
import pytest

from robustgrad import cli
from robustgrad.commands import _startup, train_classifier
from robustgrad.commands._files import check_output_dir
from robustgrad.progress import EvaluationProgress, Progress, keras_progress

ALL_COMMANDS = tuple(cli.COMMANDS)


def _env(**extra):
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # what a user's shell has: nothing set
    env.pop("ROBUSTGRAD_DEBUG", None)
    env.update(extra)
    return env


def _run_cli(*argv, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "robustgrad.cli", *argv], capture_output=True,
                          text=True, timeout=timeout, env=env or _env())


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A small saved digits classifier (logits) and its path."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(10)])
    path = str(tmp_path_factory.mktemp("models") / "tiny.keras")
    model.save(path)
    return path


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("robustgrad: error: "), err
    assert "Traceback" not in err
    return lines[0]


# -- start-up ------------------------------------------------------------------------------------

def test_help_of_every_command_imports_no_tensorflow():
    code = ("import sys\nfrom robustgrad import cli\nfor argv in ([], *([c] for c in cli.COMMANDS)):\n"
            "    try:\n        cli.main([*argv, '--help'])\n    except SystemExit as e:\n"
            "        assert e.code == 0, (argv, e.code)\n"
            "heavy = sorted(m for m in ('tensorflow', 'keras', 'attacks', 'agents', 'numpy')\n"
            "               if m in sys.modules)\nprint('HEAVY', heavy)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY []", proc.stdout[-2000:]
    for name in ALL_COMMANDS:
        assert name in proc.stdout
    assert proc.stderr == ""


def test_tensorflow_start_up_lines_hidden_unless_verbose(tiny_model, tmp_path):
    argv = ["evaluate", "--model", tiny_model, "--attacks", "nope", "--out", str(tmp_path / "o")]
    quiet = _run_cli(*argv)
    assert quiet.returncode == 2, quiet.stderr[-3000:]
    line = _one_error_line(quiet.stderr)  # TensorFlow was imported: no start-up line survived
    assert line.startswith("robustgrad: error: --attacks: unknown attack 'nope'; known: fgsm")
    loud = _run_cli("-v", *argv)
    assert loud.returncode == 2
    noise = [ln for ln in loud.stderr.splitlines() if _startup.is_startup_noise(ln)]
    assert noise, loud.stderr[-3000:]
    assert loud.stderr.strip().splitlines()[-1] == line
    assert not (tmp_path / "o").exists()


def test_filtered_native_stderr_keeps_real_lines_and_exceptions(capfd):
    noise = ("I0000 00:00:1796114918.980825    6593 cudart_stub.cc:31] Could not find cuda "
             "drivers on your machine, GPU will not be used.\n")
    with _startup.filtered_native_stderr():
        os.write(2, noise.encode())
        os.write(2, b"E0000 00:00:17.1   12 real_problem.cc:7] a real native error\n")
        print("a Python warning", file=sys.stderr)
    with pytest.raises(RuntimeError, match="boom"):
        with _startup.filtered_native_stderr():
            os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are "
                        b"written to STDERR\n")
            raise RuntimeError("boom")
    os.write(2, b"after\n")  # fd 2 is restored
    lines = capfd.readouterr().err.splitlines()
    assert sorted(lines[:-1]) == ["E0000 00:00:17.1   12 real_problem.cc:7] a real native error",
                                  "a Python warning"]
    assert lines[-1] == "after"


# -- user errors against internal errors -----------------------------------------------------------

# one user error per sub-command, with the fragment its one-line message must hold
USER_ERRORS = {
    "demo": (["--out", "{file}"], "--out {file}: exists and is not a directory"),
    "train-classifier": (["--out", "{dir}/run", "--method", "bogus"],
                         "--method: unknown method 'bogus'; choose one of madry"),
    "evaluate": (["--model", "{dir}/missing.keras"], "--model {dir}/missing.keras: no such file"),
    "certify": (["--model", "{model}", "--out", "{dir}/c", "--method", "smoothing", "--n0", "9",
                 "--n", "5"], "--n0 (9 selection draws) must be <= --n (5 estimation draws)"),
    "sensitivity": (["--model", "{model}", "--out", "{dir}/s", "--eps", "0"],
                    "--eps must be a number > 0, got 0"),
    "train-agent": (["--steps", "0", "--out", "{dir}/a"], "--steps"),
    "evaluate-agent": (["--agent", "{dir}/a", "--episodes", "0"], "--episodes"),
}


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_user_error_is_one_line_exit_2(command, tmp_path, tiny_model, capsys):
    assert set(USER_ERRORS) == set(ALL_COMMANDS)
    (tmp_path / "file").write_text("x")
    fill = {"dir": str(tmp_path), "file": str(tmp_path / "file"), "model": tiny_model}
    argv, fragment = USER_ERRORS[command]
    rc = cli.main([command, *(a.format(**fill) for a in argv)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert fragment.format(**fill) in err
    _one_error_line(err)
    assert "Traceback" not in err


def test_bad_flag_value_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["evaluate", "--model", "m.keras", "--batch-size", "x"])
    assert exc.value.code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == ("robustgrad: error: argument --batch-size: invalid int value: 'x' "
                    "(see 'robustgrad evaluate --help')")


def test_internal_error_keeps_its_traceback(monkeypatch, tiny_model, tmp_path):
    from robustgrad.commands import evaluate

    def broken(args):
        raise ValueError("an internal bug, not the user's")

    monkeypatch.setattr(evaluate, "run", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        cli.main(["evaluate", "--model", tiny_model, "--out", str(tmp_path / "o")])


def test_validation_type_error_is_a_user_error_and_debug_shows_traceback(monkeypatch, tiny_model,
                                                                         tmp_path, capsys):
    from robustgrad import checks as _checks
    from robustgrad.commands import evaluate

    monkeypatch.setattr(evaluate, "run", lambda args: _checks.positive_int("3", "--limit"))
    argv = ["evaluate", "--model", tiny_model, "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    assert _one_error_line(capsys.readouterr().err).startswith(
        "robustgrad: error: --limit must be an int")
    monkeypatch.setenv("ROBUSTGRAD_DEBUG", "1")
    with pytest.raises(_checks.ArgumentTypeError):
        cli.main(argv)


def test_interrupt_exits_130(monkeypatch, tiny_model, tmp_path, capsys):
    from robustgrad.commands import evaluate

    def interrupted(args):
        raise KeyboardInterrupt("checkpoint saved to runs/x")

    monkeypatch.setattr(evaluate, "run", interrupted)
    out = tmp_path / "o"
    assert cli.main(["evaluate", "--model", tiny_model, "--out", str(out)]) == 130
    # round six: the line also says what --out holds (here nothing was written)
    assert capsys.readouterr().err == (
        f"robustgrad: interrupted: checkpoint saved to runs/x; --out {out} holds nothing to "
        "resume (every file there is whole: each write is atomic); run the command again\n")


def test_user_errors_converts_only_the_named_types():
    with pytest.raises(cli.UsageError, match="^--data: bad$"):
        with cli.user_errors(ValueError, prefix="--data: "):
            raise ValueError("bad")
    with pytest.raises(KeyError):
        with cli.user_errors(ValueError):
            raise KeyError("not a user error")


# -- output directories, before the work ---------------------------------------------------------

def _writing_commands(model):
    """argv (without --out) of every command of this module's owner that writes an --out."""
    return {
        "evaluate": ["evaluate", "--model", model, "--limit", "8", "--attacks", "fgsm",
                     "--no-sanity-checks", "--no-progress"],
        "sensitivity": ["sensitivity", "--model", model, "--num", "8"],
        "train-classifier": ["train-classifier", "--epochs", "1", "--no-eval", "--verbose", "0"],
    }


@pytest.mark.parametrize("command", ["evaluate", "sensitivity", "train-classifier"])
def test_out_checked_before_any_work(command, tmp_path, tiny_model, capsys, monkeypatch):
    argv = _writing_commands(tiny_model)[command]
    # TensorFlow's work must not start: any model load or training would fail this test
    monkeypatch.setattr(keras.models, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    as_file = tmp_path / "taken"
    as_file.write_text("x")
    assert cli.main([*argv, "--out", str(as_file)]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"robustgrad: error: --out {as_file}: exists and is not a directory")

    full = tmp_path / "full"
    full.mkdir()
    (full / "model.keras").write_text("precious")
    assert cli.main([*argv, "--out", str(full)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--overwrite" in line and str(full) in line
    assert (full / "model.keras").read_text() == "precious"

    locked = tmp_path / "locked" / "out"
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p).endswith("locked")
                        else real_access(p, mode))
    (tmp_path / "locked").mkdir()
    assert cli.main([*argv, "--out", str(locked)]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"robustgrad: error: --out {locked}: not writable ({tmp_path / 'locked'} is not writable)")
    assert not locked.exists()


def test_check_output_dir_accepts_new_and_empty_and_overwrite(tmp_path):
    check_output_dir(str(tmp_path / "a" / "b"))  # a new directory (nothing is created)
    assert not (tmp_path / "a").exists()
    (tmp_path / "empty").mkdir()
    check_output_dir(str(tmp_path / "empty"))
    (tmp_path / "empty" / "report.json").write_text("{}")
    check_output_dir(str(tmp_path / "empty"), overwrite=True)
    with pytest.raises(cli.UsageError, match=r"--export .*: exists and is not empty \(report.json\)"):
        check_output_dir(str(tmp_path / "empty"), "--export")


def test_export_checked_before_training(tmp_path, capsys):
    export = tmp_path / "serving"
    export.mkdir()
    (export / "saved_model.pb").write_text("x")
    assert cli.main(["train-classifier", "--out", str(tmp_path / "run"), "--export",
                     str(export)]) == 2
    assert "--export" in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


# -- model files ---------------------------------------------------------------------------------

def _bad_models(tmp_path, tiny_model):
    """(path, expected message fragment) for each kind of bad model file."""
    junk = tmp_path / "junk.keras"
    junk.write_bytes(b"\x00not a zip archive" * 10)
    truncated = tmp_path / "truncated.keras"
    data = open(tiny_model, "rb").read()
    truncated.write_bytes(data[: len(data) // 2])
    other_zip = tmp_path / "other.keras"
    with zipfile.ZipFile(other_zip, "w") as z:
        z.writestr("notes.txt", "hello")
    folder = tmp_path / "saved_model_dir"
    folder.mkdir()
    wrong_ext = tmp_path / "weights.npz"
    wrong_ext.write_bytes(b"x")
    return [
        (junk, "not a valid .keras file (not a zip archive, or truncated)"),
        (truncated, "not a valid .keras file (not a zip archive, or truncated)"),
        (other_zip, "cannot be loaded as a Keras model ("),
        (folder, "is a directory, expected a .keras file"),
        (wrong_ext, "expected a .keras file (or a legacy .h5 file)"),
    ]


@pytest.mark.parametrize("flag_argv", [
    ("--model", ["evaluate", "--limit", "8", "--attacks", "fgsm", "--no-progress"]),
    ("--model", ["sensitivity", "--num", "8"]),
    ("--model2", ["sensitivity", "--num", "8", "--model", "{good}"]),
    ("--init-from", ["train-classifier", "--epochs", "1", "--no-eval", "--verbose", "0"]),
], ids=["evaluate", "sensitivity", "sensitivity-model2", "train-classifier"])
def test_bad_model_files_one_line_naming_the_file(flag_argv, tmp_path, tiny_model, capsys):
    flag, argv = flag_argv
    argv = [a.format(good=tiny_model) for a in argv]
    for i, (path, fragment) in enumerate(_bad_models(tmp_path, tiny_model)):
        out = tmp_path / f"out{i}"
        rc = cli.main([*argv, flag, str(path), "--out", str(out)])
        line = _one_error_line(capsys.readouterr().err)
        assert rc == 2
        assert line.startswith(f"robustgrad: error: {flag} {path}: {fragment}"), line
        assert "File not found" not in line and "BadZipFile" not in line
        assert not out.exists()  # no empty output directory left behind


# -- no empty output directory on failure -------------------------------------------------------

def test_failing_commands_leave_no_output_directory(tmp_path, tiny_model, capsys):
    bad_npz = tmp_path / "bad.npz"
    np.savez(bad_npz, x_test=np.zeros((0, 8, 8, 1), np.float32), y_test=np.zeros(0, np.int64))
    cases = [
        (["evaluate", "--model", tiny_model, "--data", str(bad_npz), "--no-progress"],
         "x_test is empty"),
        (["sensitivity", "--model", tiny_model, "--data", "imagenet"],
         "unknown dataset 'imagenet'"),
        (["train-classifier", "--epochs", "1", "--eval-attacks", "nope", "--verbose", "0"],
         "unknown attack 'nope'"),
    ]
    for i, (argv, fragment) in enumerate(cases):
        out = tmp_path / f"out{i}"
        assert cli.main([*argv, "--out", str(out)]) == 2
        assert fragment in _one_error_line(capsys.readouterr().err)
        assert not out.exists(), argv


def test_npz_that_is_not_a_zip_is_one_line(tmp_path, tiny_model, capsys):
    fake = tmp_path / "fake.npz"
    fake.write_text("x_test,y_test\n1,2\n")
    assert cli.main(["evaluate", "--model", tiny_model, "--data", str(fake),
                     "--out", str(tmp_path / "o")]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"robustgrad: error: --data {fake}: not an .npz file (not a zip archive, or truncated)")


def test_train_classifier_methods_are_the_library_s():
    from attacks.training import METHODS

    assert tuple(train_classifier.METHODS) == tuple(METHODS)


# -- progress ------------------------------------------------------------------------------------

class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_count_elapsed_rate_eta_and_figures_on_a_terminal():
    stream = _Terminal()
    with Progress(50, desc="crafting", unit="steps", stream=stream) as bar:
        assert bar.active
        for done in (10, 30, 50):
            bar.update_to(done, loss=0.25)
    text = stream.getvalue()
    final = text.split("\r")[-1]
    assert final.startswith("crafting: 100%") and "50/50" in final
    assert "steps/s" in final and "loss=0.25" in final
    assert "[00:00<00:00" in final  # elapsed < time left


def test_progress_is_quiet_off_a_terminal_or_when_disabled():
    for stream, enabled in ((io.StringIO(), True), (_Terminal(), False)):
        with Progress(10, stream=stream, enabled=enabled) as bar:
            bar.update_to(10)
        assert not bar.active and stream.getvalue() == ""
    with pytest.raises(ValueError, match="total must be an int >= 0, got -1"):
        Progress(-1)


def test_evaluation_progress_follows_the_evaluate_contract():
    stream = _Terminal()
    progress = EvaluationProgress(stream=stream)
    for done, desc in ((0, "fgsm eps=0.1"), (1, "pgd eps=0.1"), (2, "done")):
        progress(done, 2, desc)
    assert progress._progress is None  # closed at done == total
    final = stream.getvalue().split("\r")[-1]
    assert final.startswith("done: 100%") and "2/2" in final and final.endswith("\n")


def test_agents_progress_bar_is_backed_by_the_shared_display():
    from agents.core.callbacks import ProgressBar

    stream = _Terminal()
    bar = ProgressBar(1000, stream=stream)
    bar.update(500, 1234.0, 187.3)
    bar.update(1000, 1234.0, None, force=True)
    bar.close()
    text = stream.getvalue()
    assert "return=187.3" in text and "1000/1000" in text and "steps/s" in text
    quiet = ProgressBar(1000, stream=io.StringIO())
    quiet.update(10, 1.0, 2.0)
    quiet.close()
    assert not quiet.enabled


def test_keras_progress_one_bar_over_all_epochs():
    stream = _Terminal()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = np.ones((12, 3), np.float32), np.ones((12, 1), np.float32)
    callback = keras_progress(2, 3, stream=stream)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[callback])
    final = stream.getvalue().split("\r")[-1]
    assert final.startswith("training: 100%") and "6/6" in final and "epoch=2/2" in final
    assert "loss=" in final


def test_evaluate_end_to_end_writes_report_and_refuses_a_second_time(tiny_model, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = ["evaluate", "--model", tiny_model, "--limit", "16", "--attacks", "fgsm",
            "--eps", "0.1", "--no-sanity-checks", "--out", str(out)]
    assert cli.main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["n"] == 16 and report["attacks"] == ["fgsm"] and report["eps"] == [0.1]
    assert (out / "report.txt").exists()
    capsys.readouterr()
    assert cli.main(argv) == 2
    assert "--overwrite" in _one_error_line(capsys.readouterr().err)
    assert cli.main([*argv, "--overwrite"]) == 0


def test_resume_with_a_garbage_config_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"method": "madry", "eps"')  # truncated
    assert cli.main(["train-classifier", "--out", str(out), "--resume"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"robustgrad: error: --resume: {out / 'config.json'} is not readable "
                           "JSON (")
    (out / "config.json").write_text("[1, 2]")
    assert cli.main(["train-classifier", "--out", str(out), "--resume"]) == 2
    assert _one_error_line(capsys.readouterr().err).endswith(
        "does not hold a configuration (a JSON object), got list")


def test_evaluate_command_runs_autoattack_by_name(tiny_model, tmp_path, capsys):
    from robustgrad import cli

    # an untrained model and a budget that breaks every example in the first attack: the
    # version's four rows are there, the later attacks have nothing left to attack
    argv = ["evaluate", "--model", tiny_model, "--limit", "6", "--attacks", "autoattack",
            "--eps", "0.5", "--norm", "l2", "--no-progress", "--no-sanity-checks",
            "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "attacks apgd-ce,apgd-t,fab-t,square, l2 eps 0.5" in out
    for label in ("apgd-ce", "apgd-t", "fab-t", "square"):
        assert f"0.5  {label}" in out


def test_a_lambda_layer_refused_by_keras_safe_mode_is_said_in_full(tmp_path, capsys):
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Lambda(lambda t: t * 2.0), keras.layers.Dense(10)])
    path = tmp_path / "lambda.keras"
    model.save(path)
    assert cli.main(["evaluate", "--model", str(path), "--out", str(tmp_path / "o")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == (
        f"robustgrad: error: --model {path}: holds a Lambda layer (Python code inside the file), "
        "which Keras refuses to load by default because loading it could run arbitrary code; "
        "rebuild the model without Lambda layers (a custom layer class instead), or, if you "
        "trust the file, load it from Python with keras.models.load_model(path, "
        "safe_mode=False)")


def test_an_unregistered_custom_layer_is_named(tmp_path, capsys):
    @keras.saving.register_keras_serializable(package="issue24")
    class Doubling(keras.layers.Layer):
        def call(self, x):
            return 2.0 * x

    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), Doubling(),
                              keras.layers.Dense(10)])
    path = tmp_path / "custom.keras"
    model.save(path)
    keras.saving.get_custom_objects().pop("issue24>Doubling")  # as in a fresh process
    assert cli.main(["evaluate", "--model", str(path), "--out", str(tmp_path / "o")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"robustgrad: error: --model {path}: uses a custom class 'Doubling' "
                           "that is not registered in this process"), line
    assert line.endswith("(decorated with @keras.saving.register_keras_serializable())")
