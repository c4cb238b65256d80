"""Resumable evaluation (issue 35): chunks committed as they finish, per-example equality after
an interruption, settings checks, damaged files, the CLI's --resume and the per-example files."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import attacks
from attacks.results import chunk_base_seed

EVALUATE = sys.modules["attacks.evaluate"]  # the module (attacks.evaluate is the function)
SETTINGS = dict(attacks=["fgsm", "pgd", "square50"], eps=[0.05, 0.1], clip_min=0.0,
                clip_max=1.0, sanity_checks=False)

from small_models import trained_digits_mlp


@pytest.fixture(scope="module")
def mlp():
    return trained_digits_mlp(epochs=5, n_test=90)


def _interrupt_at(monkeypatch, chunk_calls: int):
    """Make the ``chunk_calls``-th chunk's cascade raise KeyboardInterrupt (Ctrl-C)."""
    original, calls = EVALUATE.run_cascade, []

    def cascade(*args, **kwargs):
        calls.append(1)
        if len(calls) == chunk_calls:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(EVALUATE, "run_cascade", cascade)
    return calls


def test_one_chunk_is_the_unchunked_evaluation(mlp):
    model, x, y = mlp
    plain = attacks.evaluate(model, x, y, **SETTINGS)
    chunked = attacks.evaluate(model, x, y, **SETTINGS, chunk_size=len(x))
    assert chunked.worst_case == plain.worst_case
    assert [r.robust_accuracy for r in chunked.records] == [r.robust_accuracy
                                                            for r in plain.records]
    assert chunk_base_seed(3, 0) == 3 and chunk_base_seed(3, 1) != chunk_base_seed(3, 2)
    assert not plain.per_example and len(chunked.per_example["label"]) == len(x)


@pytest.mark.parametrize("stop_at", [1, 2, 3])
def test_interrupted_and_resumed_equals_uninterrupted_per_example(mlp, tmp_path, monkeypatch,
                                                                  stop_at):
    model, x, y = mlp
    whole = attacks.evaluate(model, x, y, **SETTINGS, chunk_size=25,
                             results_dir=tmp_path / "whole")
    _interrupt_at(monkeypatch, stop_at)
    with pytest.raises(KeyboardInterrupt):
        attacks.evaluate(model, x, y, **SETTINGS, chunk_size=25, results_dir=tmp_path / "cut")
    committed = sorted(n for n in os.listdir(tmp_path / "cut") if n.startswith("chunk-"))
    assert len(committed) == stop_at - 1  # the chunk in flight is lost, nothing else
    calls = _interrupt_at(monkeypatch, 10**6)
    resumed = attacks.evaluate(model, x, y, **SETTINGS, chunk_size=25,
                               results_dir=tmp_path / "cut")
    assert len(calls) == 4 - (stop_at - 1)  # finished chunks are never attacked again
    assert set(resumed.per_example) == set(whole.per_example)
    for key, values in whole.per_example.items():
        np.testing.assert_array_equal(resumed.per_example[key], values, err_msg=key)
    assert resumed.worst_case == whole.worst_case
    for a, b in zip(resumed.records, whole.records):
        assert (a.attack, a.eps, a.robust_accuracy, a.success_rate, a.attacked, a.broken,
                a.gradient_passes) == (b.attack, b.eps, b.robust_accuracy, b.success_rate,
                                       b.attacked, b.broken, b.gradient_passes)


def test_per_example_outcome_agrees_with_the_report(mlp):
    model, x, y = mlp
    rep = attacks.evaluate(model, x, y, **SETTINGS, chunk_size=40)
    pe = rep.per_example
    np.testing.assert_array_equal(pe["correct"], pe["clean_prediction"] == pe["label"])
    for eps in rep.eps:
        robust, broken_by = pe[f"robust@{eps:g}"], pe[f"broken_by@{eps:g}"]
        assert robust.mean() == pytest.approx(rep.worst_case[eps])
        np.testing.assert_array_equal(robust, broken_by == -1)
        assert np.all(broken_by[~pe["correct"]] == -3)
        # the margin at the worst-case input is positive exactly where the model is still right
        margin = pe[f"margin@{eps:g}"]
        assert np.all(margin[robust] > 0) and np.all(margin[~robust] <= 0)
    # an example broken at 0.05 is carried at 0.1
    carried = pe["broken_by@0.1"] == -2
    np.testing.assert_array_equal(carried, pe["correct"] & ~pe["robust@0.05"])


def test_different_settings_and_damaged_files_are_named(mlp, tmp_path):
    model, x, y = mlp
    d = tmp_path / "r"
    attacks.evaluate(model, x, y, **SETTINGS, chunk_size=30, results_dir=d)
    with pytest.raises(ValueError, match=r"eps: recorded \[0.05, 0.1\], now \[0.05\]"):
        attacks.evaluate(model, x, y, **dict(SETTINGS, eps=[0.05]), chunk_size=30,
                         results_dir=d)
    with pytest.raises(ValueError, match="chunk_size: recorded 30, now 45"):
        attacks.evaluate(model, x, y, **SETTINGS, chunk_size=45, results_dir=d)
    with pytest.raises(ValueError, match="data: recorded"):
        attacks.evaluate(model, x[::-1].copy(), y[::-1].copy(), **SETTINGS, chunk_size=30,
                         results_dir=d)
    other = tf.keras.models.clone_model(model)  # same architecture, other weights
    with pytest.raises(ValueError, match="model: recorded"):
        attacks.evaluate(other, x, y, **SETTINGS, chunk_size=30, results_dir=d)
    (d / "chunk-000001.npz").write_bytes(b"not an archive")
    with pytest.raises(ValueError, match=r"chunk-000001.npz is not a readable chunk .*not an "
                                         r"npz archive.*remove it to recompute"):
        attacks.evaluate(model, x, y, **SETTINGS, chunk_size=30, results_dir=d)
    (d / "manifest.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="is not a results manifest of this library"):
        attacks.evaluate(model, x, y, **SETTINGS, chunk_size=30, results_dir=d)
    with pytest.raises(ValueError, match=r"chunk_size must be an int in \[1, 1000000000\], got 0"):
        attacks.evaluate(model, x, y, **SETTINGS, chunk_size=0)


def test_cli_resume_writes_per_example_and_summary(mlp, tmp_path, capsys):
    from robustgrad.cli import main

    model, _, _ = mlp
    path = str(tmp_path / "m.keras")
    model.save(path)
    out = tmp_path / "eval"
    flags = ["evaluate", "--model", path, "--data", "digits", "--attacks", "fgsm,pgd",
             "--eps", "0.05,0.1", "--limit", "60", "--chunk-size", "20", "--out", str(out),
             "--no-sanity-checks", "--no-progress"]
    assert main(flags) == 0
    first = dict(np.load(out / "per_example.npz"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "m" and summary["dataset"] == "digits"
    assert summary["examples"] == 60 and set(summary["robust_accuracy"]) == {"0.05", "0.1"}
    # lose a chunk (as a kill would), resume: the same per-example results
    os.remove(out / "results" / "chunk-000002.npz")
    assert main(flags + ["--resume"]) == 0
    again = dict(np.load(out / "per_example.npz"))
    for key, values in first.items():
        np.testing.assert_array_equal(again[key], values, err_msg=key)
    capsys.readouterr()
    assert main([*flags[:8], "0.1", *flags[9:], "--resume"]) == 2
    assert "eps: recorded [0.05, 0.1], now [0.1]" in capsys.readouterr().err
    assert main(flags + ["--resume", "--overwrite"]) == 2
    assert "give one" in capsys.readouterr().err
    empty = tmp_path / "empty"
    assert main([str(empty) if f == str(out) else f for f in flags] + ["--resume"]) == 2
    assert "holds no evaluation to resume" in capsys.readouterr().err
    assert main(flags) == 2  # without --resume a used --out is refused, as before
