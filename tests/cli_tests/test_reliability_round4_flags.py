"""Issue 36's principles swept over every flag of every command: each count has an upper bound
checked before any work, and a flag the chosen method, optimiser or run would not read is
refused, naming it. Every test here stops in the command's checks (no training, no model
loaded), in-process."""

import argparse

import pytest

from robustgrad import cli

BIG = str(10**12)
MODEL = "m.keras"  # a file that only has to exist: the flags are checked before it is opened


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.fixture
def model(tmp_path):
    path = tmp_path / MODEL
    path.write_bytes(b"PK\x03\x04")
    return str(path)


@pytest.fixture
def agent(tmp_path):
    import json

    d = tmp_path / "agent"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"env": "CartPole-v1"}))
    (d / "agent.json").write_text(json.dumps({"algo": "ppo", "num_timesteps": 0}))
    return str(d)


def _range(flag, low, high, value=BIG):
    return f"{flag} must be an int in [{low}, {high}], got {value}"


COUNTS = [  # (command and its other flags, flag, value, message)
    (["train-classifier"], "--epochs", BIG, _range("--epochs", 1, 100000)),
    (["train-classifier"], "--steps", BIG, _range("--steps", 1, 100000)),
    (["train-classifier", "--method", "free"], "--steps", "1000",
     _range("--steps", 1, 64, 1000)),
    (["train-classifier"], "--batch-size", BIG, _range("--batch-size", 1, 2**20)),
    (["train-classifier"], "--width", BIG, _range("--width", 1, 4096)),
    (["train-classifier"], "--limit", BIG, _range("--limit", 2, 10**9)),
    (["train-classifier"], "--val-size", BIG, _range("--val-size", 0, 10**9)),
    (["train-classifier"], "--val-steps", BIG, _range("--val-steps", 0, 100000)),
    (["train-classifier"], "--grad-accum", BIG, _range("--grad-accum", 1, 100000)),
    (["train-classifier"], "--eval-limit", BIG, _range("--eval-limit", 1, 10**9)),
    (["train-classifier"], "--seed", BIG, _range("--seed", 0, 2**32 - 1)),
    (["train-classifier", "--strategy", "mirrored"], "--logical-cpus", BIG,
     _range("--logical-cpus", 0, 1024)),
    (["train-classifier", "--method", "smoothadv"], "--noise-draws", BIG,
     _range("--noise-draws", 1, 1024)),
    (["train-classifier"], "--warmup-epochs", "1e300",
     "--warmup-epochs must be a number in [0, 100000], got 1e+300"),
    (["evaluate", "--model", MODEL], "--batch-size", BIG, _range("--batch-size", 1, 2**20)),
    (["evaluate", "--model", MODEL], "--limit", BIG, _range("--limit", 1, 10**9)),
    (["evaluate", "--model", MODEL], "--seed", BIG, _range("--seed", 0, 2**32 - 1)),
    (["certify", "--model", MODEL], "--batch-size", BIG, _range("--batch-size", 1, 2**20)),
    (["certify", "--model", MODEL], "--limit", BIG, _range("--limit", 1, 10**9)),
    (["certify", "--model", MODEL, "--method", "smoothing"], "--seed", BIG,
     _range("--seed", 0, 2**32 - 1)),
    (["sensitivity", "--model", MODEL], "--num", BIG, _range("--num", 1, 10**9)),
    (["sensitivity", "--model", MODEL], "--power-iters", BIG,
     _range("--power-iters", 1, 100000)),
    (["sensitivity", "--model", MODEL], "--chunk-size", BIG, _range("--chunk-size", 1, 100000)),
    (["sensitivity", "--model", MODEL], "--batch-size", BIG, _range("--batch-size", 1, 2**20)),
    (["sensitivity", "--model", MODEL], "--lipschitz-steps", BIG,
     _range("--lipschitz-steps", 1, 100000)),
    (["sensitivity", "--model", MODEL], "--restarts", BIG, _range("--restarts", 1, 1000)),
    (["sensitivity", "--model", MODEL], "--smoothgrad-samples", BIG,
     _range("--smoothgrad-samples", 0, 100000)),
    (["sensitivity", "--model", MODEL], "--seed", BIG, _range("--seed", 0, 2**32 - 1)),
    (["demo"], "--seed", BIG, _range("--seed", 0, 2**32 - 1)),
    (["train-agent"], "--seed", BIG, _range("--seed", 0, 2**32 - 1)),
    (["train-agent"], "--eval-episodes", BIG, _range("--eval-episodes", 0, 100000)),
    (["train-agent"], "--eval-every", BIG, _range("--eval-every", 1, 10**10)),
    (["train-agent"], "--rollout-workers", BIG, _range("--rollout-workers", 1, 1024)),
    (["train-agent", "--rollout-workers", "1"], "--num-cpus", BIG,
     _range("--num-cpus", 1, 1024)),
    (["evaluate-agent", "--agent", "AGENT"], "--episodes", BIG, _range("--episodes", 1, 100000)),
    (["evaluate-agent", "--agent", "AGENT"], "--num-envs", BIG, _range("--num-envs", 1, 65536)),
    (["evaluate-agent", "--agent", "AGENT"], "--seed", BIG, _range("--seed", 0, 2**32 - 1)),
]


def _argv(command, flag, value, tmp_path, model, agent):
    argv = [model if a == MODEL else agent if a == "AGENT" else a for a in command]
    if argv[0] != "evaluate-agent":
        argv += ["--out", str(tmp_path / "out")]
    return [*argv, flag, value]


@pytest.mark.parametrize("command, flag, value, message", COUNTS,
                         ids=[f"{c[0]}{f}" for c, f, _, _ in COUNTS])
def test_every_count_flag_has_an_upper_bound_checked_first(tmp_path, capsys, model, agent,
                                                          command, flag, value, message):
    parser = cli.build_parser(command[0])
    args = parser.parse_args(_argv(command, flag, value, tmp_path, model, agent))
    with pytest.raises(cli.UsageError) as caught:  # the checks before TensorFlow loads
        args._validate(args)
    assert str(caught.value) == message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags, message", [
    (["--method", "clean", "--steps", "5"],
     "--steps: only with --method madry|trades|free|mart|awp|smoothadv, not with --method clean"),
    (["--method", "fast", "--steps", "5"],  # one FGSM step, whatever --steps says
     "--steps: only with --method madry|trades|free|mart|awp|smoothadv, not with --method fast"),
    (["--method", "ibp", "--step-size", "0.01"],
     "--step-size: only with --method madry|trades|fast|free|mart|awp|smoothadv, not with "
     "--method ibp"),
    (["--method", "madry", "--beta", "6"],
     "--beta: only with --method trades|mart, not with --method madry"),
    (["--method", "trades", "--adv-ratio", "0.5"],
     "--adv-ratio: only with --method madry|fast|awp|gaussian, not with --method trades"),
    (["--method", "free", "--no-random-start"],
     "--no-random-start: only with --method madry|fast|mart|awp, not with --method free"),
    (["--method", "gaussian", "--craft-training"],
     "--craft-training: only with --method madry|trades|fast|mart|awp|smoothadv, not with "
     "--method gaussian"),
    (["--method", "madry", "--no-guard"],
     "--no-guard: only with --method fast, not with --method madry"),
    (["--optimizer", "adam", "--momentum", "0.9"],
     "--momentum: SGD's momentum, not with --optimizer adam"),
    (["--no-eval", "--eval-eps", "0.1"],
     "--eval-eps: configures the final report, which --no-eval skips"),
    (["--no-eval", "--eval-attacks", "pgd"],
     "--eval-attacks: configures the final report, which --no-eval skips"),
    (["--logical-cpus", "2"],
     "--logical-cpus: splits the CPU for --strategy mirrored, not with --strategy none"),
])
def test_train_classifier_refuses_a_flag_its_run_would_not_read(tmp_path, capsys, flags,
                                                                message):
    out = tmp_path / "run"
    assert cli.main(["train-classifier", "--out", str(out), *flags]) == 2
    assert _one_line(capsys) == f"robustgrad: error: {message}"
    assert not out.exists()


def test_train_classifier_accepts_the_flags_where_they_apply(tmp_path):
    parser = cli.build_parser("train-classifier")
    for flags in (["--method", "fast", "--no-guard", "--step-size", "0.1", "--adv-ratio", "0.5"],
                  ["--method", "trades", "--beta", "3", "--steps", "3", "--craft-training"],
                  ["--method", "free", "--steps", "8"],
                  ["--optimizer", "sgd", "--momentum", "0.5"],
                  ["--strategy", "mirrored", "--logical-cpus", "2"]):
        args = parser.parse_args(["train-classifier", "--out", str(tmp_path / "o"), *flags])
        args._validate(args)
    args = parser.parse_args(["train-classifier", "--out", str(tmp_path / "o"), "--method",
                              "trades", "--adv-ratio", "1"])
    args._validate(args)  # 1 mixes in no clean loss: the default, said or not


@pytest.mark.parametrize("flags, message", [
    (["--algo", "dqn", "--normalize-reward"],
     "--normalize-reward: scales the returns of on-policy training (ppo, a2c, reinforce); dqn "
     "does not read it"),
    (["--rollout-workers", "2", "--ray-address", "auto", "--num-cpus", "4"],
     "--num-cpus: sizes the local Ray instance; the cluster at --ray-address has its own CPUs"),
])
def test_train_agent_refuses_a_flag_its_run_would_not_read(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    assert cli.main(["train-agent", "--steps", "64", "--out", str(out), *flags]) == 2
    assert _one_line(capsys) == f"robustgrad: error: {message}"
    assert not out.exists()


def _robust_fields(*flags):
    from robustgrad.commands import train_agent

    args = cli.build_parser("train-agent").parse_args(["train-agent", *flags])
    return train_agent._robust_overrides(args)


def test_robust_flags_follow_the_methods_that_read_them():
    from robustgrad.errors import ConfigError

    # WocaR reads SA's kappa, inner maximiser and steps (they were refused as "sa only")
    assert _robust_fields("--robust", "wocar", "--robust-kappa", "0.2", "--robust-method",
                          "sgld", "--robust-steps", "5") == {
        "robust": "wocar", "robust_kappa": 0.2, "robust_method": "sgld", "robust_steps": 5}
    assert _robust_fields("--robust", "adv", "--robust-steps", "3")["robust_steps"] == 3
    # plain ATLA learns its adversary: no inner search to step
    with pytest.raises(ConfigError, match=r"^--robust-steps: only with --robust "
                                          r"sa\|adv\|atla-sa\|wocar \(the steps of an inner "
                                          r"search; atla's adversary is learned\), not with "
                                          r"--robust atla$"):
        _robust_fields("--robust", "atla", "--robust-steps", "5")
    with pytest.raises(ConfigError, match=r"^--robust-steps must be an int in \[1, 100000\], "
                                          r"got 1000000000000$"):
        _robust_fields("--robust", "sa", "--robust-steps", BIG)


def test_attack_names_bound_their_steps_and_restarts():
    import attacks
    from robustgrad.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^steps of 'pgd1000000' must be at most 100000, "
                                          r"got 1000000$"):
        attacks.parse_attack("pgd1000000")
    with pytest.raises(ConfigError, match=r"^restarts of 'pgd10x5000' must be at most 1000, "
                                          r"got 5000$"):
        attacks.parse_attack("pgd10x5000")
    assert attacks.parse_attack("pgd100000x1000")[0] == "pgd100000x1000"  # the bounds themselves


@pytest.mark.parametrize("field, value, message", [
    ("train_freq", 10**9, "train_freq must be an int in [1, 16777216], got 1000000000"),
    ("target_update_interval", 10**12,
     "target_update_interval must be an int in [1, 10000000000], got 1000000000000"),
    ("learning_starts", 10**12,
     "learning_starts must be an int in [0, 10000000000], got 1000000000000"),
    ("checkpoint_every", 10**12,
     "checkpoint_every must be an int in [0, 10000000000], got 1000000000000"),
])
def test_dqn_periods_are_bounded_in_the_library(field, value, message):
    from agents.config import DQNConfig
    from robustgrad.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        DQNConfig(**{field: value})
    assert str(caught.value) == message  # the Python API keeps the field's name


def test_dqn_collection_per_phase_is_bounded():
    from agents.config import DQNConfig
    from robustgrad.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^train_freq \* num_envs \* num_seeds must be at most "
                                          r"16777216 .*got 65536 \* 512 \* 1 = 33554432$"):
        DQNConfig(train_freq=65536, num_envs=512)


def test_a_dqn_set_field_is_named_as_the_flag_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train-agent", "--algo", "dqn", "--steps", "64", "--no-progress",
                     "--eval-episodes", "0", "--preset", "none", "--out", str(out), "--set",
                     "target_update_interval=1000000000000"]) == 2
    assert _one_line(capsys) == ("robustgrad: error: --set target_update_interval must be an "
                                 "int in [1, 10000000000], got 1000000000000")


def test_flag_error_names_only_the_fields_the_command_line_set():
    from robustgrad.commands._agent_flags import flag_error
    from robustgrad.errors import ConfigError

    args = argparse.Namespace(num_envs=None, lr=0.1, seeds=None, set=["tau=2"], robust=None)
    renamed = flag_error(ConfigError("learning_rate must be a number > 0, got -1"), args)
    assert type(renamed) is ConfigError and str(renamed) == "--lr must be a number > 0, got -1"
    # a preset's num_envs keeps its name; a name without "_" only as the subject
    assert str(flag_error(ConfigError("tau must be in (0, 1], got 2; tau"), args)) == \
        "--set tau must be in (0, 1], got 2; tau"
    same = ConfigError("num_envs must be an int in [1, 65536], got 0")
    assert flag_error(same, args) is same


def test_the_commands_copies_of_the_library_bounds_agree():
    import agents.core.limits as limits
    from robustgrad.commands import _agent_flags, _bounds

    assert _bounds.MAX_ENVS == limits.MAX_NUM_ENVS
    assert _bounds.MAX_REPEATS == limits.MAX_REPEATS
    assert _agent_flags.MAX_TOTAL_STEPS == limits.MAX_TOTAL_STEPS
