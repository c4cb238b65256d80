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
    with pytest.raises(ValueError, match="data: other examples than the recorded run.s"):
        attacks.evaluate(model, x[::-1].copy(), y[::-1].copy(), **SETTINGS, chunk_size=30,
                         results_dir=d)
    other = tf.keras.models.clone_model(model)  # same architecture, other weights
    with pytest.raises(ValueError, match="model: other weights than the recorded run.s"):
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
    assert summary["attack_versions"] == ["fgsm", "pgd"] and summary["library_version"]
    assert "autoattack_robust_accuracy" not in summary and "certified_accuracy" not in summary
    assert summary["clean_accuracy"] == pytest.approx(first["correct"].mean())
    assert summary["robust_accuracy"]["0.1"] == pytest.approx(first["robust@0.1"].mean())
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


# ---------------------------------------------------------------- certification (resumable)

CERTIFY = dict(attacks=["fgsm", "pgd"], eps=[0.004, 0.02], clip_min=0.0, clip_max=1.0,
               sanity_checks=False, certify="crown", chunk_size=25)


def _count_calls(monkeypatch, module, name, raise_at=None):
    """Count calls of ``module.name``; the ``raise_at``-th raises KeyboardInterrupt (Ctrl-C)."""
    original, calls = getattr(module, name), []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == raise_at:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)
    return calls


@pytest.mark.parametrize("stop_after", [0, 2])
def test_certification_interrupted_and_resumed_equals_uninterrupted(mlp, tmp_path, monkeypatch,
                                                                    stop_after):
    """Ctrl-C during chunk ``stop_after + 1``'s certificate: the attacks' chunks and the
    finished certificates are committed; the resume attacks nothing, certifies only the
    missing chunks and ends per example equal to an uninterrupted run."""
    model, x, y = mlp
    certify_module = sys.modules["attacks.certify"]
    whole = attacks.evaluate(model, x, y, **CERTIFY, results_dir=tmp_path / "whole")
    direct = [certify_module.verified_mask(model, x, y, e, clip_min=0.0, clip_max=1.0).numpy()
              for e in CERTIFY["eps"]]
    for e, mask in zip(CERTIFY["eps"], direct):  # chunks certify what the whole set does
        np.testing.assert_array_equal(whole.per_example[f"verified@{e:g}"], mask)
        assert whole.certified[e]["certified_accuracy"] == pytest.approx(mask.mean())
    assert 0 < direct[0].sum() and direct[1].sum() < direct[0].sum()  # a test that can fail

    # two budgets per chunk: the first call of chunk stop_after + 1 raises
    _count_calls(monkeypatch, certify_module, "verified_mask", raise_at=2 * stop_after + 1)
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        attacks.evaluate(model, x, y, **CERTIFY, results_dir=cut)
    names = os.listdir(cut)
    assert sum(n.startswith("chunk-") for n in names) == 4  # every attack chunk committed
    assert sorted(n for n in names if n.startswith("certified-")) == [
        f"certified-crown-{c:06d}.npz" for c in range(stop_after)]

    cascades = _count_calls(monkeypatch, EVALUATE, "run_cascade")
    bounds_calls = _count_calls(monkeypatch, certify_module, "verified_mask")
    resumed = attacks.evaluate(model, x, y, **CERTIFY, results_dir=cut)
    assert len(cascades) == 0  # nothing attacked again
    assert len(bounds_calls) == 2 * (4 - stop_after)  # only the missing certificates
    assert set(resumed.per_example) == set(whole.per_example)
    for key, values in whole.per_example.items():
        np.testing.assert_array_equal(resumed.per_example[key], values, err_msg=key)
    for e in CERTIFY["eps"]:
        for field in ("certified_accuracy", "attacked_accuracy", "undecided", "undecided_count"):
            assert resumed.certified[e][field] == whole.certified[e][field], field


def test_certificates_resume_by_method_and_damaged_ones_are_named(mlp, tmp_path, monkeypatch):
    model, x, y = mlp
    d = tmp_path / "r"
    plain = dict(CERTIFY, certify=None)
    attacks.evaluate(model, x, y, **plain, results_dir=d)
    cascades = _count_calls(monkeypatch, EVALUATE, "run_cascade")
    # --certify added on resume: the attacks are reused, the certificates computed
    ibp = attacks.evaluate(model, x, y, **dict(CERTIFY, certify="ibp"), results_dir=d)
    crown = attacks.evaluate(model, x, y, **CERTIFY, results_dir=d)
    assert len(cascades) == 0
    assert len([n for n in os.listdir(d) if n.startswith("certified-ibp-")]) == 4
    assert len([n for n in os.listdir(d) if n.startswith("certified-crown-")]) == 4
    # IBP is looser than CROWN on the same examples: never verifies more
    assert not np.any(ibp.per_example["verified@0.004"] & ~crown.per_example["verified@0.004"])
    (d / "certified-crown-000001.npz").write_bytes(b"not an archive")
    with pytest.raises(ValueError, match=r"certified-crown-000001.npz is not a readable "
                                         r"certificate .*not an npz archive.*remove it"):
        attacks.evaluate(model, x, y, **CERTIFY, results_dir=d)
    os.replace(d / "certified-ibp-000002.npz", d / "certified-crown-000001.npz")
    with pytest.raises(ValueError, match=r"not a crown certificate of chunk 1"):
        attacks.evaluate(model, x, y, **CERTIFY, results_dir=d)


def test_cli_certify_resume_recomputes_a_lost_certificate(mlp, tmp_path):
    from robustgrad.cli import main

    model, _, _ = mlp
    path = str(tmp_path / "m.keras")
    model.save(path)
    out = tmp_path / "eval"
    flags = ["evaluate", "--model", path, "--data", "digits", "--attacks", "fgsm",
             "--eps", "0.004", "--limit", "40", "--chunk-size", "20", "--certify", "crown",
             "--out", str(out), "--no-sanity-checks", "--no-progress"]
    assert main(flags) == 0
    first = dict(np.load(out / "per_example.npz"))
    assert first["verified@0.004"].shape == (40,)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["certify"] == "crown"
    assert summary["certified_accuracy"]["0.004"] == pytest.approx(first["verified@0.004"].mean())
    os.remove(out / "results" / "certified-crown-000001.npz")  # as a kill in flight would
    assert main(flags + ["--resume"]) == 0
    assert os.path.exists(out / "results" / "certified-crown-000001.npz")
    again = dict(np.load(out / "per_example.npz"))
    for key, values in first.items():
        np.testing.assert_array_equal(again[key], values, err_msg=key)
