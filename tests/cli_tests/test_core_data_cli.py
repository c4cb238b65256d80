"""The digits data, the tf.data helper and the CLI's outer shell."""

import subprocess
import sys

import numpy as np
import pytest

import robustgrad
from robustgrad import cli
from robustgrad.data import load_digits, make_dataset


def test_load_digits_shapes_range_split_and_determinism():
    (xtr, ytr), (xte, yte) = load_digits()
    assert xtr.shape == (1347, 8, 8, 1) and xte.shape == (450, 8, 8, 1)
    assert xtr.dtype == np.float32 and ytr.dtype == np.int64
    assert xtr.min() >= 0.0 and xtr.max() == 1.0
    # stratified: each class's share in test within 1 example of 25 %
    counts_tr, counts_te = np.bincount(ytr), np.bincount(yte)
    assert np.all(np.abs(counts_te - 0.25 * (counts_tr + counts_te)) <= 1.0)
    (xtr2, ytr2), _ = load_digits()
    np.testing.assert_array_equal(xtr, xtr2)
    np.testing.assert_array_equal(ytr, ytr2)
    (_, ytr3), _ = load_digits(seed=1)
    assert not np.array_equal(ytr, ytr3)
    with pytest.raises(ValueError, match="test_size"):
        load_digits(test_size=1.5)


def test_make_dataset():
    (x, y), _ = load_digits()
    batches = list(make_dataset(x, y, batch_size=500, shuffle=False))
    assert [b[0].shape[0] for b in batches] == [500, 500, 347]
    np.testing.assert_array_equal(batches[0][1].numpy(), y[:500])
    shuffled = next(iter(make_dataset(x, y, batch_size=500, seed=3)))[1].numpy()
    again = next(iter(make_dataset(x, y, batch_size=500, seed=3)))[1].numpy()
    np.testing.assert_array_equal(shuffled, again)
    with pytest.raises(ValueError, match="batch_size"):
        make_dataset(x, y, batch_size=0)
    with pytest.raises(ValueError, match="same length"):
        make_dataset(x, y[:10])


def test_cli_version_help_and_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert robustgrad.__version__ in capsys.readouterr().out
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    for name in ("train-classifier", "evaluate", "train-agent", "evaluate-agent", "demo"):
        assert name in out
    assert "-v, --verbose" in out and "start-up log lines" in out


def test_console_script_is_installed():
    exe = __import__("shutil").which("robustgrad") or str(
        __import__("pathlib").Path(sys.executable).parent / "robustgrad")
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "train-classifier" in out.stdout
