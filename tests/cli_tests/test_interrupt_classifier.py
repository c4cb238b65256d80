"""Ctrl-C during `robustgrad train-classifier`: a checkpoint of the current batch, one line, exit
130, and `--resume` ends exactly where an uninterrupted run ends, with the whole history."""

import json
import os
import subprocess

import keras
import numpy as np

from robustgrad import cli

from conftest import cli_command, interrupt_cli_once_ready, sigint_after_train_batches

ARGS = ["train-classifier", "--data", "digits", "--limit", "256", "--method", "fast",
        "--epochs", "3", "--batch-size", "16", "--width", "4", "--no-eval", "--no-progress",
        "--verbose", "0", "--no-guard"]


def _weights(out):
    return keras.models.load_model(os.path.join(out, "model.keras")).get_weights()


def _history(out):
    with open(os.path.join(out, "history.json")) as f:
        return json.load(f)


def test_mid_epoch_interrupt_then_resume_equals_uninterrupted(tmp_path, monkeypatch, capsys):
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    assert cli.main([*ARGS, "--out", ref]) == 0

    seen, restore = sigint_after_train_batches(monkeypatch, 21)  # epoch 2 (16 batches), batch 5
    assert cli.main([*ARGS, "--out", run]) == 130
    err = capsys.readouterr().err
    ckpt_dir = os.path.join(run, "checkpoints")
    line = [x for x in err.splitlines() if x.startswith("robustgrad: interrupted")]
    assert line == [f"robustgrad: interrupted: training stopped by SIGINT at epoch 2, batch 5 of "
                    f"16; checkpoint saved to {ckpt_dir}; resume with: robustgrad "
                    + " ".join([*ARGS, "--out", run, "--resume"])]
    assert len(seen) == 21  # stopped at the batch after the signal
    partial = _history(run)
    assert len(partial["history"]["loss"]) == 1 and partial["partial_epoch_seconds"] > 0

    restore()
    assert cli.main([*ARGS, "--out", run, "--resume"]) == 0
    for a, b in zip(_weights(ref), _weights(run), strict=True):
        np.testing.assert_array_equal(a, b)
    full, whole = _history(run), _history(ref)
    assert set(full["history"]) == set(whole["history"])
    for key, values in whole["history"].items():  # every epoch, the resumed one's means too
        np.testing.assert_allclose(full["history"][key], values, rtol=1e-5, err_msg=key)
    assert len(full["epoch_seconds"]) == 3
    assert full["train_seconds"] > partial["train_seconds"] > 0
    assert full["resumed_at"] == [{"epoch": 1, "batch": 5}]




def test_sigint_during_train_classifier_subprocess(tmp_path):
    out = str(tmp_path / "clf")
    args = [a if a != "3" else "200" for a in ARGS] + ["--out", out]  # stopped long before
    marker = os.path.join(out, "checkpoints", "checkpoint")
    returncode, err, line = interrupt_cli_once_ready(args, marker)
    assert returncode == 130, err[-3000:]
    assert "Traceback" not in err
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    assert "training stopped by SIGINT" in line
    assert f"checkpoint saved to {os.path.join(out, 'checkpoints')}" in line
    assert line.endswith(f"--out {out} --resume")
    stopped = _history(out)
    epochs_done = len(stopped["history"]["loss"])
    assert 1 <= epochs_done < 200
    # the printed command with fewer epochs, so that the test ends: it continues from the
    # checkpoint and the history holds every epoch from the start
    resume = [a if a != "200" else str(epochs_done + 1) for a in args] + ["--resume",
                                                                          "--override", "epochs"]
    done = subprocess.run(cli_command(*resume), env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    final = _history(out)
    assert len(final["history"]["loss"]) == epochs_done + 1
    assert final["history"]["loss"][:epochs_done] == stopped["history"]["loss"]
    assert final["train_seconds"] > stopped["train_seconds"]
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["overrides"] == [{"epochs": [200, epochs_done + 1]}]
