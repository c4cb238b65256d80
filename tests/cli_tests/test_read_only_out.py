"""Read-only output directories, tested for real, as root too (issue 24).

Root writes through permission bits, so a ``chmod 555`` directory is not read-only for it (and
``os.access`` says so); a read-only file system is, for everyone. As root the tests use ``/sys``
(sysfs refuses to create files), otherwise a ``chmod 555`` directory.
"""

import os
import tempfile

import pytest

from robustgrad import cli, rundir
from robustgrad.commands._files import check_output_dir


def _creatable(directory):
    try:
        fd, probe = tempfile.mkstemp(dir=directory)
    except OSError:
        return False
    os.close(fd)
    os.remove(probe)
    return True


@pytest.fixture
def read_only(tmp_path):
    if os.geteuid() != 0:
        directory = tmp_path / "read-only"
        directory.mkdir()
        directory.chmod(0o555)
        yield str(directory)
        directory.chmod(0o755)
        return
    if not os.path.isdir("/sys") or _creatable("/sys"):
        pytest.skip("running as root without a read-only file system (/sys) to write to")
    assert os.access("/sys", os.W_OK)  # what made the old check pass as root
    yield "/sys"


def test_check_output_dir_refuses_a_read_only_directory_and_one_below_it(read_only):
    with pytest.raises(cli.UsageError, match=f"^--out {read_only}: not writable$"):
        check_output_dir(read_only, overwrite=True)
    new = os.path.join(read_only, "robustgrad-new", "out")
    with pytest.raises(cli.UsageError, match=f"^--out {new}: not writable "
                                             fr"\({read_only} is not writable\)$"):
        check_output_dir(new)


def test_the_run_lock_of_a_read_only_directory_is_one_line(read_only):
    with pytest.raises(ValueError, match=f"^--out {read_only}: not writable \\(its lock file "
                                         "cannot be created: "):
        rundir.RunLock(read_only, "--out").acquire()
    new = os.path.join(read_only, "robustgrad-new")
    with pytest.raises(ValueError, match=f"^--out {new}: cannot be created"):
        rundir.RunLock(new, "--out").acquire()
    assert not os.path.exists(new)


@pytest.mark.parametrize("argv", [
    ["train-agent", "--steps", "64"],
    ["train-classifier", "--epochs", "1"],
    ["demo"],
])
def test_writing_commands_refuse_a_read_only_out_in_one_line(argv, read_only, capsys):
    for out in (read_only, os.path.join(read_only, "robustgrad-new", "out")):
        assert cli.main([*argv, "--out", out]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"robustgrad: error: --out {out}: ")
        assert "not writable" in err or "cannot be created" in err, err
