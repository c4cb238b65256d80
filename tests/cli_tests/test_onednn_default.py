"""oneDNN's kernels for the classifier commands (``robustgrad.commands._startup.prefer_onednn``):
set before TensorFlow loads, for ``train-classifier`` and ``evaluate`` only, never over a user's
``TF_ENABLE_ONEDNN_OPTS``; and TensorFlow honours the variable."""

import os
import subprocess
import sys

import pytest

from robustgrad import cli
from robustgrad.commands import _startup


@pytest.fixture
def no_user_setting(monkeypatch):
    """TF_ENABLE_ONEDNN_OPTS unset for the test and restored after it (set first so that the
    monkeypatch records the variable's original state, absent included)."""
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "placeholder")
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS")
    return monkeypatch


def test_prefer_onednn_sets_the_variable_for_the_classifier_commands_only(no_user_setting):
    no_user_setting.delitem(sys.modules, "tensorflow")  # as before TensorFlow loads
    assert _startup.prefer_onednn("train-agent") is False
    assert _startup.prefer_onednn(None) is False
    assert "TF_ENABLE_ONEDNN_OPTS" not in os.environ
    assert _startup.prefer_onednn("evaluate") is True
    assert os.environ["TF_ENABLE_ONEDNN_OPTS"] == "1"
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # a user's choice stays
    assert _startup.prefer_onednn("train-classifier") is False
    assert os.environ["TF_ENABLE_ONEDNN_OPTS"] == "0"


def test_prefer_onednn_leaves_a_loaded_tensorflow_alone(no_user_setting):
    import tensorflow  # noqa: F401 - loaded: the variable can no longer matter

    assert _startup.prefer_onednn("train-classifier") is False
    assert "TF_ENABLE_ONEDNN_OPTS" not in os.environ


class _LoadedError(Exception):
    pass


@pytest.mark.parametrize("argv, expected", [
    (["train-classifier", "--data", "digits"], "train-classifier"),
    (["train-agent", "--env", "CartPole-v1"], "train-agent"),
])
def test_the_command_line_asks_before_loading_tensorflow(tmp_path, monkeypatch, argv,
                                                         expected):
    calls = []
    monkeypatch.setattr(_startup, "prefer_onednn", lambda command: calls.append(command))

    def load(*args, **kwargs):
        calls.append("import")
        raise _LoadedError

    monkeypatch.setattr(_startup, "import_tensorflow", load)
    with pytest.raises(_LoadedError):
        cli.main([*argv, "--out", str(tmp_path / "out")])
    assert calls == [expected, "import"]


@pytest.mark.parametrize("setting, expected", [(None, "True True"), ("0", "False False")])
def test_tensorflow_runs_onednn_when_the_command_line_sets_it(setting, expected):
    """In a fresh process: unset, the classifier commands' start-up turns oneDNN on; a user's 0
    keeps it off, whatever TensorFlow's own default on this CPU."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    if setting is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = setting
    code = ("from robustgrad.commands import _startup as s\n"
            "changed = s.prefer_onednn('train-classifier')\n"
            "s.import_tensorflow()\n"
            "from tensorflow.python.util import _pywrap_util_port as p\n"
            "print(changed, bool(p.IsMklEnabled()))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == expected.split()
