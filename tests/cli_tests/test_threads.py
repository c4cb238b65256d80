"""``robustgrad --threads N``: TensorFlow's thread counts, checked before any work."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from robustgrad import cli


def _env():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {**os.environ, "PYTHONPATH": root, "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.mark.parametrize("argv, word", [
    (["--threads", "1", "train-agent", "--help"], "train-agent"),
    (["--threads=2", "evaluate"], "evaluate"),
    (["-v", "--threads", "3", "certify", "--out", "x"], "certify"),
    (["--threads"], None),
])
def test_the_command_word_skips_the_threads_value(argv, word):
    assert cli._command_name(argv) == word


@pytest.mark.parametrize("value, shown", [("0", "0"), ("-2", "-2"), ("two", "'two'")])
def test_a_bad_thread_count_is_refused_before_any_work(value, shown, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--threads", value, "evaluate", "--model", "m.keras"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --threads: expected an integer >= 1, got {shown}" in err


@pytest.mark.parametrize("value", ["1025", "100000"])
def test_a_thread_count_above_the_bound_is_refused_before_tensorflow_loads(value, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--threads", value, "evaluate-agent", "--agent", "a", "--episodes", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"robustgrad: error: argument --threads: expected at most 1024 "
                          f"(TensorFlow starts that many threads per pool), got {value}")
    assert cli._thread_count("1024") == 1024


def test_threads_reach_tensorflow_in_a_fresh_process():
    code = ("import sys\nfrom robustgrad import cli\nimport tensorflow as tf\n"
            "cli.set_threads(1)\n"
            "t = tf.config.threading\n"
            "print('THREADS', t.get_intra_op_parallelism_threads(), "
            "t.get_inter_op_parallelism_threads())\n"
            "tf.constant(1.0) + 1.0  # the runtime starts\n"
            "try:\n    cli.set_threads(2)\nexcept cli.UsageError as e:\n    print('REFUSED', e)\n"
            "cli.set_threads(1)  # the same counts again: nothing to change, no error\n"
            "print('SAME OK')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "THREADS 1 1" in out
    assert ("REFUSED --threads: TensorFlow is already running in this process; its thread counts "
            "can no longer change (pass --threads to a fresh process)") in out
    assert "SAME OK" in out


def test_a_resumed_classifier_run_may_change_its_thread_count():
    """``--threads`` is how a run uses the machine, not what it computes: a resume with another
    count (or none) is not refused as a changed configuration; a changed eps still is."""
    from robustgrad import errors
    from robustgrad.commands import train_classifier
    from robustgrad.rundir import check_resume

    free = train_classifier._RESUME_FREE
    saved = {"threads": 1, "eps": 0.1}
    assert check_resume(saved, {"threads": None, "eps": 0.1}, override=None, where="runs/x",
                        free=free) == {}
    with pytest.raises(errors.ResumeError, match=r"eps: saved 0.1 != 0.2"):
        check_resume(saved, {"threads": 2, "eps": 0.2}, override=None, where="runs/x", free=free)
