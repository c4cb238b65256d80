"""Runs written by the previous version resume through the RunDirectory (issue 34): the one resume
rule applied to a classifier run's ``config.json`` written by ba70c33 (kept as test data) and to a
saved agent of an earlier format."""

import os
import shutil

import pytest

from robustgrad import cli, errors, rundir
from robustgrad.commands import train_classifier

HERE = os.path.dirname(__file__)
OLD_RUN = os.path.join(HERE, "data", "classifier_run_ba70c33")
OLD_AGENT = os.path.join(HERE, "..", "agents_tests", "data", "saved_v2", "ppo")


def _args(out, *flags):
    return cli.build_parser("train-classifier").parse_args(
        ["train-classifier", "--out", out, "--resume", "--limit", "128", *flags])


@pytest.fixture
def old_run(tmp_path):
    out = str(tmp_path / "run")
    shutil.copytree(OLD_RUN, out)
    return out


def test_an_old_classifier_run_resumes_with_the_settings_it_resolved(old_run):
    args = _args(old_run)
    train_classifier.validate(args)
    saved, changed = train_classifier._resume_plan(args, train_classifier._run_directory(args))
    assert changed == {}
    # given then: eps, epochs, batch size; resolved then: lr, optimizer, schedule (defaults)
    assert (args.eps, args.epochs, args.batch_size) == (0.1, 1, 64)
    assert (args.lr, args.optimizer, args.schedule) == (0.001, "adam", "cosine")
    assert saved.config["method"] == "madry" and not saved.legacy


def test_an_old_classifier_run_refuses_a_change_then_records_the_override(old_run):
    with pytest.raises(cli.UsageError, match=r"epochs: saved 1 != 3\); pass --override epochs"):
        train_classifier.validate(_args(old_run, "--epochs", "3"))
    args = _args(old_run, "--epochs", "3", "--override", "epochs")
    train_classifier.validate(args)
    run = train_classifier._run_directory(args)
    saved, changed = train_classifier._resume_plan(args, run)
    assert changed == {"epochs": [1, 3]}
    record = run.record_resume({**saved.config, "epochs": 3}, changed)
    assert run.read_config() == record and record["overrides"] == [{"epochs": [1, 3]}]


def test_an_old_agent_checkpoint_goes_through_the_same_rule(tmp_path):
    from agents.training.run import check_checkpoint_resume

    shutil.copytree(OLD_AGENT, str(tmp_path / "checkpoint"))
    run = rundir.RunDirectory(str(tmp_path))
    same = {"env": "CartPole-v1", "seed": 3}
    assert check_checkpoint_resume(run, same, override=None, steps=128)[2] == {}
    with pytest.raises(errors.ResumeError,
                       match=r"lr: saved 0.00025 != 0.001\); pass --override lr"):
        check_checkpoint_resume(run, {**same, "learning_rate": 1e-3}, override=None, steps=128)
    assert check_checkpoint_resume(run, {**same, "learning_rate": 1e-3}, override="lr",
                                   steps=128)[2] == {"learning_rate": [0.00025, 0.001]}


def test_the_resume_error_is_a_config_error(tmp_path):
    with pytest.raises(errors.ResumeError, match="holds no run"):
        train_classifier._run_directory(_args(str(tmp_path))).read_config()
