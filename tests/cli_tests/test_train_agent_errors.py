"""train-agent: the user's mistakes are one line, internal errors keep their traceback (issue 24)."""

import numpy as np
import pytest

import agents
from robustgrad import cli

TRAIN = ["train-agent", "--algo", "ppo", "--steps", "64", "--no-progress", "--eval-episodes", "0"]


@pytest.mark.parametrize("flags, message", [
    (["--set", "n_steps=0"], "robustgrad: error: --set n_steps"),  # the flag, not the field
    (["--algo", "dqn", "--env", "Pendulum-v1"], "robustgrad: error: --env: DQN needs a Discrete "
                                                "action space"),
])
def test_a_validation_error_of_the_library_is_one_line(tmp_path, capsys, flags, message):
    assert cli.main([*TRAIN, "--out", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_an_internal_value_error_keeps_its_traceback(tmp_path, monkeypatch):
    def broken_build(self):
        np.zeros(3).reshape(2)  # NumPy's ValueError: a bug, not the user's mistake

    monkeypatch.setattr(agents.PPO, "_build", broken_build)
    with pytest.raises(ValueError, match="cannot reshape array of size 3 into shape"):
        cli.main([*TRAIN, "--out", str(tmp_path / "run")])


def test_user_errors_are_told_by_type_alone():
    """A ConfigError (the library's checks, a run directory, a resume) is the user's; a plain
    ValueError is not, wherever it was raised (issue 34: no more reading the raising line)."""
    from robustgrad import checks as _checks
    from robustgrad import errors, rundir
    from robustgrad.commands import _files

    assert cli.is_user_error(errors.ConfigError("x")) and cli.is_user_error(cli.UsageError("x"))
    assert cli.is_user_error(errors.ResumeError("x"))
    assert cli.is_user_error(rundir.RunDirectoryLockedError("x"))
    with pytest.raises(errors.ConfigError, match="steps must be an int >= 1"):
        _checks.positive_int(0, "steps")
    with pytest.raises(errors.ConfigError):
        _checks.positive_int("3", "steps")  # a wrong type: ArgumentTypeError, a TypeError too
    assert not cli.is_user_error(ValueError("x")) and not cli.is_user_error(TypeError("x"))
    assert not hasattr(_files, "raised_by_validation")


@pytest.mark.parametrize("flags, hint", [
    (["--seeds", "-1,2"], "; a value that starts with '-' is written --seeds=-1,2 "),
    (["--seeds"], " "),  # no value at all: argparse's words alone
])
def test_a_value_starting_with_a_dash_gets_the_equals_spelling(tmp_path, capsys, flags, hint):
    """argparse reads ``--seeds -1,2`` as two options and says only "expected one argument"."""
    with pytest.raises(SystemExit) as exit_:
        cli.main([*TRAIN, "--out", str(tmp_path / "run"), *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err == (f"robustgrad: error: argument --seeds: expected one argument{hint}"
                   "(see 'robustgrad train-agent --help')\n")
    assert cli.main([*TRAIN, "--out", str(tmp_path / "run"), "--seeds=-1,2"]) == 2
    assert capsys.readouterr().err.startswith("robustgrad: error: --seeds must be seeds >= 0")
