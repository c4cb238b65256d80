"""Multi-worker training set-up (issue 35 item 4), without starting a cluster: TF_CONFIG read
and checked before any work, who the chief is, where each worker writes, the command's
refusals. (Two real worker processes: the slow test in test_training_distributed.py.)"""

from __future__ import annotations

import json

import pytest

from attacks.training import distributed
from robustgrad.tf_config import read_tf_config, worker_directory, worker_role

TWO = ["127.0.0.1:20001", "127.0.0.1:20002"]


def _config(index, task_type="worker", **cluster):
    return {"cluster": cluster or {"worker": TWO}, "task": {"type": task_type, "index": index}}


def test_the_chief_is_worker_zero_or_the_chief_task(tmp_path):
    assert [worker_role(_config(i)).chief for i in (0, 1)] == [True, False]
    with_chief = dict(chief=["127.0.0.1:20000"], worker=TWO)
    roles = [worker_role(_config(0, "chief", **with_chief)),
             worker_role(_config(0, **with_chief)), worker_role(_config(1, **with_chief))]
    assert [(r.index, r.workers, r.chief) for r in roles] == [(0, 3, True), (1, 3, False),
                                                              (2, 3, False)]
    out = str(tmp_path / "run")
    assert worker_directory(out, _config(0)) == out
    assert worker_directory(out, _config(1)) == str(tmp_path / "run" / "workers" / "1")
    once = worker_directory(out, _config(1))
    assert worker_directory(once, _config(1)) == once  # idempotent (checks run twice)


def test_the_environment_variable_is_read(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(_config(1)))
    assert worker_role().index == 1
    monkeypatch.delenv("TF_CONFIG")
    with pytest.raises(ValueError, match="TF_CONFIG: the environment variable is not set"):
        worker_role()


@pytest.mark.parametrize("config, message", [
    ("{not json", r"TF_CONFIG is not JSON \(Expecting property name"),
    ("[1, 2]", "TF_CONFIG must be a JSON object, got list"),
    ({"task": {"type": "worker", "index": 0}}, "'cluster' must map 'worker'"),
    (_config(0, worker="127.0.0.1:1"), r"cluster job 'worker' must be a list of 'host:port'"),
    (_config(0, worker=["127.0.0.1"]), r"cluster job 'worker' must be a list of 'host:port'"),
    (_config(0, worker=TWO, evaluator=["h:1"]), "has 'chief' and 'worker' jobs, not 'evaluator'"),
    (_config(0, chief=TWO, worker=TWO), "one chief at most"),
    (_config(0, "chief"), r"'task' must name a job of the cluster \(worker\)"),
    (_config(2), "task index 2 is not one of the 2 'worker' addresses"),
    (_config(True), "task index True is not one of the 2"),
])
def test_bad_tf_config_is_named(config, message):
    with pytest.raises(ValueError, match=message):
        read_tf_config(config)


def test_strategy_arguments_are_checked_before_tensorflow_starts_a_server():
    with pytest.raises(ValueError, match="communication must be one of ring, nccl, auto"):
        distributed.multi_worker_strategy(_config(0), communication="grpc")
    with pytest.raises(ValueError, match="task index 5 is not one of"):
        distributed.multi_worker_strategy(_config(5))


def test_train_classifier_refuses_a_bad_tf_config_before_work(tmp_path, monkeypatch, capsys):
    from robustgrad.cli import main

    out = tmp_path / "mw"
    monkeypatch.setenv("TF_CONFIG", json.dumps(_config(3)))
    flags = ["train-classifier", "--strategy", "multiworker", "--out", str(out), "--epochs", "1"]
    assert main(flags) == 2
    assert "TF_CONFIG: task index 3 is not one of the 2 'worker' addresses" in \
        capsys.readouterr().err
    monkeypatch.delenv("TF_CONFIG")
    assert main(flags) == 2
    assert "--strategy multiworker needs the TF_CONFIG environment variable" in \
        capsys.readouterr().err
    flags[2] = "multi-worker"  # the spelling: the same strategy
    assert main(flags) == 2
    assert "--strategy multiworker needs the TF_CONFIG environment variable" in \
        capsys.readouterr().err
    assert not out.exists()  # refused before anything was written
