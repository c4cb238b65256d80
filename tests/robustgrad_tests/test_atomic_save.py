"""Crash safety of robustgrad.atomic and Agent.save: kill a writer at every step, then recover."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from robustgrad import atomic

ENTRIES = ["weights", "config.json", "agent.json", "extra.npz"]

# the subprocesses load robustgrad/atomic.py by path: importing the package would load TensorFlow
_LOAD = textwrap.dedent(f"""
    import importlib.util
    _spec = importlib.util.spec_from_file_location("atomic", {atomic.__file__!r})
    atomic = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(atomic)
""")

_WRITER = _LOAD + textwrap.dedent("""
    import os, sys
    directory, version, kill_at, kill_in_recover = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    ENTRIES = ["weights", "config.json", "agent.json", "extra.npz"]

    def writer(stage):
        os.makedirs(os.path.join(stage, "weights"))
        for name in ("weights/ckpt", "config.json", "agent.json"):
            with open(os.path.join(stage, name), "w") as f:
                f.write(version)
        if version == "v2":  # an entry only the new version has
            with open(os.path.join(stage, "extra.npz"), "w") as f:
                f.write(version)

    def fault(stage):
        if stage == kill_at:
            os._exit(9)
    if kill_in_recover == "0":
        atomic._fault_point = fault
    atomic.write_entries(directory, ENTRIES, writer, commit="agent.json")
""")

STAGES = ["staged", "manifest", "moved out agent.json", "moved out config.json", "moved out weights",
          "moved in config.json", "moved in extra.npz", "moved in weights", "moved in agent.json",
          "done"]


def _run(directory, version, kill_at="", kill_in_recover="0"):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-c", _WRITER, directory, version, kill_at,
                           kill_in_recover], env=env, capture_output=True, text=True).returncode


def _version(directory):
    """The complete version at the top level, asserting it is not a mixture."""
    names = sorted(n for n in os.listdir(directory))
    assert not any(n.startswith(".incoming-") or n == atomic.PREVIOUS for n in names), names
    contents = {open(os.path.join(directory, p)).read()
                for p in ("weights/ckpt", "config.json", "agent.json")}
    assert len(contents) == 1, f"mixed versions: {contents}"
    (v,) = contents
    assert os.path.exists(os.path.join(directory, "extra.npz")) == (v == "v2")
    return v


@pytest.mark.parametrize("stage", STAGES)
def test_kill_at_every_step_leaves_one_complete_version(tmp_path, stage):
    d = str(tmp_path / "ckpt")
    assert _run(d, "v1") == 0
    (tmp_path / "ckpt" / "log.txt").write_text("keep me")
    assert _run(d, "v2", kill_at=stage) == 9
    atomic.recover(d, ENTRIES, "agent.json")
    version = _version(d)
    # before the commit entry arrives the old version survives; after, the new one
    assert version == ("v2" if stage in ("moved in agent.json", "done") else "v1")
    assert (tmp_path / "ckpt" / "log.txt").read_text() == "keep me"
    # a later save works normally from the recovered state
    assert _run(d, "v2") == 0 and _version(d) == "v2"


def test_kill_during_roll_back_is_rolled_back_again(tmp_path):
    d = str(tmp_path / "ckpt")
    assert _run(d, "v1") == 0
    assert _run(d, "v2", kill_at="moved in weights") == 9
    script = _LOAD + textwrap.dedent(f"""
        import os
        def fault(stage):
            if stage == "restored config.json":
                os._exit(9)
        atomic._fault_point = fault
        atomic.recover({d!r}, {ENTRIES!r}, "agent.json")
    """)
    assert subprocess.run([sys.executable, "-c", script]).returncode == 9
    assert atomic.recover(d, ENTRIES, "agent.json") == "rolled back"
    assert _version(d) == "v1"


def test_first_save_killed_leaves_nothing_half_written(tmp_path):
    d = str(tmp_path / "ckpt")
    assert _run(d, "v1", kill_at="moved in weights") == 9
    atomic.recover(d, ENTRIES, "agent.json")
    assert os.listdir(d) == []


def test_commit_must_be_an_entry(tmp_path):
    with pytest.raises(ValueError, match="commit must be one of entries"):
        atomic.write_entries(str(tmp_path), ["a"], lambda s: None, commit="b")


def test_writer_without_commit_entry_changes_nothing(tmp_path):
    d = str(tmp_path)
    atomic.write_entries(d, ["a.json"], lambda s: open(os.path.join(s, "a.json"), "w").write("1"),
                         commit="a.json")
    with pytest.raises(RuntimeError, match="commit entry"):
        atomic.write_entries(d, ["a.json"], lambda s: None, commit="a.json")
    assert json.load(open(os.path.join(d, "a.json"))) == 1
    assert os.listdir(d) == ["a.json"]


def test_a_hostile_manifest_never_moves_or_deletes_outside_the_directory(tmp_path):
    # an interrupted save whose manifest (a file in the user's directory) names "../victim"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    d = tmp_path / "agent"
    (d / atomic.PREVIOUS).mkdir(parents=True)
    (d / "victim").write_text("planted")  # what a switch would have moved "back" over it
    (d / atomic.PREVIOUS / ".manifest.json").write_text(json.dumps(["../victim", "config.json"]))
    (d / atomic.PREVIOUS / "config.json").write_text("old")
    assert atomic.recover(str(d), ENTRIES, "agent.json") == "rolled back"
    assert victim.read_text() == "precious"
    assert sorted(os.listdir(d)) == ["config.json", "victim"]  # only an entry came back


def test_a_previous_that_is_a_symbolic_link_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".manifest.json").write_text(json.dumps(["config.json"]))
    (elsewhere / "config.json").write_text("someone else's")
    d = tmp_path / "agent"
    d.mkdir()
    os.symlink(elsewhere, d / atomic.PREVIOUS)
    with pytest.raises(ValueError, match=r"\.previous is a symbolic link; refusing"):
        atomic.recover(str(d), ENTRIES, "agent.json")
    assert (elsewhere / "config.json").read_text() == "someone else's"


@pytest.mark.parametrize("content,message", [("{broken", "cannot be read as the manifest"),
                                             ('{"a": 1}', "expected a JSON list")])
def test_a_corrupt_manifest_is_one_clear_error(tmp_path, content, message):
    d = tmp_path / "agent"
    (d / atomic.PREVIOUS).mkdir(parents=True)
    (d / atomic.PREVIOUS / ".manifest.json").write_text(content)
    with pytest.raises(ValueError, match=message):
        atomic.recover(str(d), ENTRIES, "agent.json")


@pytest.mark.parametrize("stage", STAGES)
def test_recover_says_which_version_a_kill_left(tmp_path, stage):
    d = str(tmp_path / "ckpt")
    assert _run(d, "v1") == 0
    assert _run(d, "v2", kill_at=stage) == 9
    outcome = atomic.recover(d, ENTRIES, "agent.json")
    version = _version(d)
    expected = {"staged": "discarded", "manifest": "discarded", "moved in agent.json": "completed",
                "done": None}.get(stage, "rolled back")
    assert outcome == expected
    assert version == ("v2" if outcome in ("completed", None) else "v1")


def test_a_full_disk_while_a_plot_is_written_leaves_no_truncated_png(tmp_path, monkeypatch):
    import errno

    from matplotlib.figure import Figure

    from robustgrad.commands.train_agent import plot_learning_curve

    def full_disk(self, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"\x89PNG")  # the first bytes, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    history = [{"steps": 32, "episode_return": 10.0}, {"steps": 64, "episode_return": 12.0}]
    path = tmp_path / "learning_curve.png"
    plot_learning_curve(history, str(path), "t")
    good = path.read_bytes()
    monkeypatch.setattr(Figure, "savefig", full_disk)
    with pytest.raises(OSError, match="No space left"):
        plot_learning_curve(history, str(path), "t")
    assert path.read_bytes() == good  # the previous complete file, not a truncated one
    assert os.listdir(tmp_path) == ["learning_curve.png"]  # no partial file left
    os.remove(path)
    with pytest.raises(OSError, match="No space left"):
        plot_learning_curve(history, str(path), "t")
    assert os.listdir(tmp_path) == []


def test_replacing_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic.replacing(str(target)) as tmp:
            assert tmp.endswith(".json") and os.path.dirname(tmp) == str(tmp_path)
            open(tmp, "w").write("half")
            raise RuntimeError("disk full")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["report.json"]


def test_save_figure_closes_the_figure_and_leaves_nothing_when_saving_fails(tmp_path, monkeypatch):
    import errno

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    def full_disk(self, fname, **kwargs):
        open(fname, "wb").write(b"\x89PNG")
        raise OSError(errno.ENOSPC, "No space left on device")

    fig, _ = plt.subplots()
    monkeypatch.setattr(Figure, "savefig", full_disk)
    with pytest.raises(OSError, match="No space left"):
        atomic.save_figure(fig, tmp_path / "a.png")
    assert not plt.fignum_exists(fig.number) and os.listdir(tmp_path) == []


def test_the_seed_curves_plot_is_written_crash_safely(tmp_path, monkeypatch):
    import errno

    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from agents.algorithms.many import plot_seed_curves

    histories = [[{"steps": 32, "episode_return": 10.0}, {"steps": 64, "episode_return": 12.0}]] * 2
    path = tmp_path / "learning_curves.png"
    plot_seed_curves(histories, str(path), "t")
    good, open_figures = path.read_bytes(), plt.get_fignums()

    def full_disk(self, fname, **kwargs):
        open(fname, "wb").write(b"\x89PNG")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    with pytest.raises(OSError, match="No space left"):
        plot_seed_curves(histories, str(path), "t")
    assert path.read_bytes() == good and os.listdir(tmp_path) == ["learning_curves.png"]
    assert plt.get_fignums() == open_figures
