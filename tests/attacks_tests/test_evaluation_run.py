"""attacks.evaluation_run: an evaluation as a library object (a config and a run directory),
equal per example to attacks.evaluate, resumable, locked, with its settings checked first."""

import json
import os
import sys

import numpy as np
import pytest

import attacks
from attacks.evaluation_run import EvaluationConfig, evaluate_run
from robustgrad.errors import ConfigError
from robustgrad.rundir import RunDirectoryLockedError, RunLock


@pytest.fixture(scope="module")
def saved_mlp(mlp, tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "mlp.keras"
    mlp.save(path)
    return str(path), mlp


def test_a_run_equals_attacks_evaluate_per_example_and_writes_its_records(saved_mlp, tmp_path,
                                                                          monkeypatch):
    path, model = saved_mlp
    config = EvaluationConfig(model=path, attacks=("fgsm", "pgd10"), eps=(0.05, 0.1), limit=40,
                              chunk_size=20, sanity_checks=False)
    lines = []
    report = evaluate_run(config, tmp_path / "run", verbose=1, log=lines.append)
    x, y, lo, hi = attacks.data.load_test_set("digits")
    direct = attacks.evaluate(model, x[:40], y[:40], "fgsm,pgd10", [0.05, 0.1], 256,
                              clip_min=lo, clip_max=hi, sanity_checks=False, chunk_size=20,
                              results_dir=tmp_path / "direct")
    for key in ("robust@0.05", "robust@0.1", "broken_by@0.1", "clean_prediction"):
        np.testing.assert_array_equal(report.per_example[key], direct.per_example[key])
    assert report.worst_case == direct.worst_case and 0 < report.worst_case[0.05] < 1
    files = set(os.listdir(tmp_path / "run"))
    assert {"report.json", "report.txt", "per_example.npz", "summary.json", "results"} <= files
    assert ".robustgrad.lock" not in files  # released
    summary = json.load(open(tmp_path / "run" / "summary.json"))
    assert summary["attack_versions"] == ["fgsm", "pgd10"]
    assert lines[0] == ("evaluating " + path + " on 40 examples of digits: attacks fgsm,pgd10, "
                        "linf eps 0.05,0.1")
    # a resume reuses the committed chunks (none attacked again) and gives the same report
    def no_attack(*args, **kwargs):
        raise AssertionError("a committed chunk was attacked again")

    monkeypatch.setattr(sys.modules["attacks.evaluate"], "run_cascade", no_attack)
    again = evaluate_run(config, tmp_path / "run", resume=True, verbose=0)
    np.testing.assert_array_equal(again.per_example["robust@0.1"], report.per_example["robust@0.1"])
    assert again.worst_case == report.worst_case


def test_the_run_directory_rules_come_before_any_work(saved_mlp, tmp_path):
    path, _ = saved_mlp
    config = EvaluationConfig(model=path, attacks=("fgsm",), eps=(0.1,), limit=8)
    with pytest.raises(ConfigError, match=r"^resume: .* holds no evaluation to resume \(no "
                                          r"results/manifest.json\); run without resume$"):
        evaluate_run(config, tmp_path / "new", resume=True, verbose=0)
    with pytest.raises(ConfigError, match="^resume continues the results in the run directory; "
                                          "overwrite replaces them: give one$"):
        evaluate_run(config, tmp_path / "new", resume=True, overwrite=True, verbose=0)
    evaluate_run(config, tmp_path / "done", verbose=0)
    with pytest.raises(ConfigError, match="holds an evaluation's committed results: resume=True "
                                          "continues it, overwrite=True starts afresh$"):
        evaluate_run(config, tmp_path / "done", verbose=0)
    evaluate_run(config, tmp_path / "done", overwrite=True, verbose=0)  # afresh: allowed
    holder = RunLock(str(tmp_path / "busy"), "--out").acquire()
    try:
        with pytest.raises(RunDirectoryLockedError, match="in use by another run"):
            evaluate_run(config, tmp_path / "busy", verbose=0)
    finally:
        holder.release()


def test_an_attack_without_the_norm_is_refused_by_name(saved_mlp, tmp_path):
    path, _ = saved_mlp
    config = EvaluationConfig(model=path, attacks=("fgsm", "cw"), eps=(0.1,), norm="linf")
    with pytest.raises(ConfigError, match=r"^attacks: cw does not support norm linf \(supports "
                                          r"l2\)$"):
        evaluate_run(config, tmp_path / "o", verbose=0)
    assert not os.path.exists(tmp_path / "o")


@pytest.mark.parametrize("kwargs, message", [
    ({"eps": (-0.1,)}, "eps must be"),
    ({"eps": ()}, r"^eps must hold at least one budget >= 0, got \(\)$"),
    ({"attacks": (" ",)}, "^attacks must name at least one attack"),
    ({"batch_size": 0}, "batch_size must be an int"),
    ({"limit": 10**10}, "limit must be an int"),
    ({"certify": "lp"}, "^certify must be one of crown, ibp, crown-ibp, alpha-crown or None, "
                        "got 'lp'$"),
    ({"certify": "crown", "norm": "l1"}, "^certify certifies linf or l2 balls, not norm l1$"),
    ({"ray_address": "auto"}, "^ray_address is where the workers run: give workers too$"),
    ({"clip_min": 1.0, "clip_max": 0.0}, r"^clip_min \(1.0\) must be below clip_max \(0.0\)$"),
])
def test_the_config_checks_its_fields(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EvaluationConfig(model="m.keras", **kwargs)


def test_the_default_attacks_and_the_eps_text():
    config = EvaluationConfig(model="m.keras", eps="0.1,0.05")
    assert config.attack_names == ("fgsm", "pgd", "apgd-ce", "square")
    assert config.eps == (0.1, 0.05)
