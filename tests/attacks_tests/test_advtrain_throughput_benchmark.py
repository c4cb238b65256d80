"""Smoke tests of ``benchmarks/advtrain_throughput.py`` (issue 26, section 4): its pieces on a
tiny PreActResNet, so that a change of the training API breaks here and not in the benchmark.
The PyTorch side needs a separate virtualenv and is not exercised."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("advtrain_throughput")


def test_ours_steps_run_on_a_tiny_preactresnet(bench):
    """The trainers and the step function the benchmark times: one clean and one PGD-2 step
    of a width-2 PreActResNet-18 move the weights; the summary has the reported fields."""
    batches = bench._batches(2, 4)
    assert batches[0][0].shape == (4, 32, 32, 3) and batches[0][0].dtype == np.float32
    for method in ("clean", "madry"):
        clf = bench._ours_model("preactresnet18", 2)
        before = [w.copy() for w in clf.get_weights()]
        tr = bench._ours_trainer(clf, method, jit=False, steps=2)
        bench._ours_step_fn(tr, batches)(0)
        assert int(tr.step_counter.numpy()) == 1
        assert any(not np.array_equal(a, b) for a, b in zip(before, clf.get_weights()))
    s = bench._summary([2.0, 1.0, 4.0], [1.0, 1.0, 3.0], batch=8)
    assert s["wall_s"] == 2.0 and s["images_per_s"] == 4.0 and s["spread"] == 1.5


def test_fused_batchnorm_experiment_keeps_keras_semantics(bench):
    """``--fused-bn`` patches TensorFlow's fused kernel into a model instance: same logits in
    training and inference mode and the same moving statistics as Keras' layer."""
    x = bench._batches(1, 8)[0][0]
    ref = bench._ours_model("preactresnet18", 2)
    fused = bench._ours_model("preactresnet18", 2)
    fused.set_weights(ref.get_weights())
    bench._fuse_batchnorm(fused)
    np.testing.assert_allclose(fused(x, training=True), ref(x, training=True), atol=1e-4)
    for a, b in zip(fused.weights, ref.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)
    np.testing.assert_allclose(fused(x, training=False), ref(x, training=False), atol=1e-5)


@pytest.mark.slow
def test_driver_runs_end_to_end_without_torch(bench, tmp_path):
    """The whole driver (worker subprocess, rounds, JSON) on a width-2 model, ours only, and
    the memory figure on a WRN-10-1 at batch 4 with one PGD step (~25 s)."""
    assert bench.main(["all", "--width", "2", "--batch", "4", "--rounds", "1", "--clean-steps",
                       "1", "--warmup", "0", "--threads", "1", "--mem-arch", "wrn-10-1",
                       "--mem-batch", "4", "--mem-steps", "1", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "advtrain_throughput.json") as f:
        result = json.load(f)
    ours = result["throughput"]["sides"]["ours"]
    assert ours["adv"]["wall_s"] > 0 and ours["info"]["intra_op_threads"] == 1
    assert result["memory"]["sides"]["ours"]["peak_mib"] >= result["memory"]["sides"]["ours"][
        "baseline_mib"]
    # --onednn tf (the default): both workers report TensorFlow's own choice, the same one
    assert isinstance(ours["info"]["onednn"], bool)
    assert result["memory"]["sides"]["ours"]["onednn"] is ours["info"]["onednn"]
