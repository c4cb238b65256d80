"""robustgrad.rundir: paths read from files stay inside their directory; one run per directory."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from robustgrad import rundir


@pytest.mark.parametrize("value", ["../elsewhere", "/etc", "a/../../b", "./../x"])
def test_path_inside_refuses_every_way_out_naming_key_and_file(tmp_path, value):
    with pytest.raises(ValueError, match=rf"^cfg.json: checkpoint_dir '{value}' points outside"):
        rundir.path_inside(str(tmp_path), value, key="checkpoint_dir", source="cfg.json")


def test_path_inside_refuses_a_symbolic_link_out(tmp_path):
    os.symlink(tmp_path.parent, tmp_path / "out")
    with pytest.raises(ValueError, match="points outside"):
        rundir.path_inside(str(tmp_path), "out/x", key="k", source="f")


@pytest.mark.parametrize("value", [None, 3, "", ["a"]])
def test_path_inside_refuses_what_is_not_a_path(tmp_path, value):
    with pytest.raises(ValueError, match="k must be a path"):
        rundir.path_inside(str(tmp_path), value, key="k", source="f")


def test_path_inside_resolves_relative_to_the_directory(tmp_path):
    d = str(tmp_path)
    assert rundir.path_inside(d, ".", key="k", source="f") == d
    assert rundir.path_inside(d, "a/b/../c", key="k", source="f") == os.path.join(d, "a", "c")
    assert rundir.path_inside(d, os.path.join(d, "x"), key="k", source="f") == \
        os.path.join(d, "x")


def test_a_checkpoint_state_naming_a_file_outside_is_refused(tmp_path):
    (tmp_path / "ck").mkdir()
    state = tmp_path / "ck" / "checkpoint"
    state.write_text('model_checkpoint_path: "ckpt-2"\n'
                     'all_model_checkpoint_paths: "ckpt-1"\n'
                     f'all_model_checkpoint_paths: "{tmp_path}/victim/x"\n')
    with pytest.raises(ValueError, match=r"ck/checkpoint: all_model_checkpoint_paths '.*victim/x'"
                                         " points outside"):
        rundir.check_checkpoint_state(str(tmp_path / "ck"))
    state.write_text('model_checkpoint_path: "ckpt-2"\nall_model_checkpoint_paths: "ckpt-2"\n')
    rundir.check_checkpoint_state(str(tmp_path / "ck"))  # its own checkpoints: fine
    rundir.check_checkpoint_state(str(tmp_path / "none"))  # no state file: fine


# -- one run per output directory (issue 24, serious 3): real processes -------------------------

_HOLD = textwrap.dedent("""
    import importlib.util, os, sys
    spec = importlib.util.spec_from_file_location("rundir", {path!r})
    rundir = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rundir)
    lock = rundir.RunLock(sys.argv[1], "--out", command="holder").acquire()
    print("locked", flush=True)
    if sys.argv[2] == "die":
        os._exit(9)          # as kill -9: no release, the lock file stays
    sys.stdin.readline()     # hold until told
    lock.release()
""").format(path=rundir.__file__)  # by path: the package would import numpy/TensorFlow


def _holder(directory, how="hold"):
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, directory, how], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_process_is_refused_naming_the_holder_then_gets_the_lock(tmp_path):
    d = str(tmp_path / "run")
    proc = _holder(d)
    try:
        with pytest.raises(rundir.RunDirectoryLockedError,
                           match=rf"^--out {d}: in use by another run \(process {proc.pid}, "
                                 r"holder, started .* UTC\); wait for it to end"):
            rundir.RunLock(d, "--out").check()
        with pytest.raises(rundir.RunDirectoryLockedError, match="in use by another run"):
            rundir.RunLock(d, "--out").acquire()
    finally:
        proc.communicate("\n", timeout=30)
    assert proc.returncode == 0
    assert not os.path.exists(os.path.join(d, rundir.LOCK_FILE))  # released on exit
    with rundir.RunLock(d, "--out") as lock:
        assert lock.took_over is None


def test_a_lock_left_by_a_killed_process_is_taken_over_and_said(tmp_path):
    d = str(tmp_path / "run")
    proc = _holder(d, "die")
    proc.wait(timeout=30)
    assert proc.returncode == 9 and os.path.exists(os.path.join(d, rundir.LOCK_FILE))
    rundir.RunLock(d, "--out").check()  # a dead holder holds nothing
    with rundir.RunLock(d, "--out") as lock:
        assert re.match(rf"--out {d}: took over the lock of process {proc.pid}, holder, "
                        r"started .* UTC, which is no longer running$", lock.took_over)
        assert json.load(open(lock.path))["pid"] == os.getpid()
    assert os.listdir(d) == []


def test_the_lock_removes_the_directory_it_created_when_left_empty(tmp_path):
    d = tmp_path / "new"
    with rundir.RunLock(str(d)):
        assert d.is_dir()
    assert not d.exists()
    with rundir.RunLock(str(d)):
        (d / "result.txt").write_text("kept")
    assert os.listdir(d) == ["result.txt"]
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        rundir.RunLock(str(f), "--out").acquire()


# -- the RunDirectory object (issue 34) ----------------------------------------------------------

def test_run_directory_lifecycle_lock_records_and_the_resume_rule(tmp_path):
    from robustgrad.errors import ConfigError, ResumeError

    run = rundir.RunDirectory(str(tmp_path / "run"))
    with run:
        assert os.path.exists(run.join(rundir.LOCK_FILE))
        with pytest.raises(rundir.RunDirectoryLockedError):
            rundir.RunDirectory(run.path).check_lock()  # the same process's flock is its own fd
        run.write_config({"epochs": 10, "lr": 0.1}, provenance={"origin": {"lr": "default"}})
        assert run.has_config() and run.read_config()["resolved"] == {"origin": {"lr": "default"}}
        assert run.resume_changes({"epochs": 10, "lr": 0.1}, override=None) == {}
        with pytest.raises(ResumeError, match=r"\(lr: saved 0.1 != 0.2\); pass --override lr"):
            run.resume_changes({"epochs": 12, "lr": 0.2}, override="epochs")
        with pytest.raises(ConfigError, match="--override: expected configuration keys"):
            run.resume_changes({"epochs": 12}, override="nope")
        changed = run.resume_changes({"epochs": 12, "lr": 0.1, "out": "x"}, override="epochs",
                                     free={"out"})
        assert changed == {"epochs": [10, 12]}
        run.record_resume({"epochs": 12, "lr": 0.1}, changed)
        assert run.read_config()["overrides"] == [{"epochs": [10, 12]}]
        assert run.holds(["config.json", "model.keras"]) == ["config.json"]
    assert not os.path.exists(run.join(rundir.LOCK_FILE))


def test_run_directory_writes_records_atomically(tmp_path, monkeypatch):
    run = rundir.RunDirectory(str(tmp_path))
    run.write_json("history.json", {"epochs": 1})

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", full_disk)
    with pytest.raises(OSError, match="No space left"):
        run.write_json("history.json", {"epochs": 2})
    monkeypatch.undo()
    assert run.read_json("history.json") == {"epochs": 1}  # the old file, whole
    assert sorted(os.listdir(tmp_path)) == ["history.json"]  # no partial file left
    assert run.read_json("missing.json", "none") == "none"


def test_no_hand_rolled_tmp_then_replace_is_left():
    """Every "write .tmp, os.replace" goes through robustgrad.atomic (issue 34)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = []
    for package in ("robustgrad", "attacks", "agents"):
        for here, _, files in os.walk(os.path.join(root, package)):
            for name in files:
                path = os.path.join(here, name)
                if name.endswith(".py") and path != os.path.join(root, "robustgrad", "atomic.py"):
                    text = open(path, encoding="utf-8").read()
                    if re.search(r"\.tmp\b", text) and "os.replace(" in text:
                        found.append(os.path.relpath(path, root))
    assert found == []
