"""A resumed training job's progress bar starts at the batches already done (robustgrad.progress).

After an interrupted ``train-classifier`` resumes mid-epoch it fits the rest of that epoch, then
the remaining epochs, with one :func:`robustgrad.progress.keras_progress` callback: the bar must
start at the skipped batches of the job's total and end at the total, as one bar.
"""

import io

import keras
import numpy as np
import pytest

from robustgrad.progress import Progress, keras_progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _frames(stream):
    """Every redraw of the bar, in order (tqdm redraws in place with a carriage return)."""
    return [f for f in stream.getvalue().replace("\n", "\r").split("\r") if f.strip()]


def test_progress_starts_at_initial():
    stream = _Terminal()
    with Progress(10, desc="training", unit="batches", stream=stream, initial=3) as bar:
        assert bar.done == 3 and bar._bar.n == 3 and bar._bar.total == 10
        first = _frames(stream)[0]
        bar.update_to(10)
    assert "3/10" in first and first.startswith("training:  30%")
    assert "10/10" in _frames(stream)[-1]
    quiet = Progress(10, initial=4, stream=io.StringIO())
    assert not quiet.active and quiet.done == 4
    with pytest.raises(ValueError, match="initial must be an int >= 0, got -1"):
        Progress(10, initial=-1)
    with pytest.raises(ValueError, match=r"initial must be <= total \(10\), got 11"):
        Progress(10, initial=11)


def _tiny_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


def test_a_resumed_run_bar_starts_at_the_skipped_batches_and_ends_at_the_total():
    # 3 epochs x 5 batches, interrupted after batch 2 of epoch 2 (index 1): the resumed job runs
    # the 3 batches left of epoch 2, then epoch 3 -- 8 batches of the 10 from epoch 2 on.
    epochs, spe, first_epoch, skipped = 3, 5, 1, 2
    x, y = np.ones((20, 3), np.float32), np.ones((20, 1), np.float32)
    stream = _Terminal()
    bar = keras_progress(epochs, spe, stream=stream, initial_epoch=first_epoch,
                         initial_batch=skipped)
    model = _tiny_model()
    model.fit(x[: 4 * (spe - skipped)], y[: 4 * (spe - skipped)], batch_size=4,
              initial_epoch=first_epoch, epochs=first_epoch + 1, verbose=0, callbacks=[bar])
    shown = bar.progress
    assert shown is not None and shown._bar is not None  # still open between the two fits
    assert (shown._bar.n, shown._bar.total) == (skipped + spe - skipped, 10)
    model.fit(x, y, batch_size=4, initial_epoch=first_epoch + 1, epochs=epochs, verbose=0,
              callbacks=[bar])
    assert bar.progress is shown and shown._bar is None  # the same bar, closed at the end
    frames = _frames(stream)
    assert "2/10" in frames[0] and "0/10" not in frames[0]
    assert frames[-1].startswith("training: 100%") and "10/10" in frames[-1]
    assert "epoch=3/3" in frames[-1]
    assert stream.getvalue().count("\n") == 1  # one bar, one line


def test_the_bar_closes_when_the_job_is_interrupted_or_stopped():
    x, y = np.ones((8, 3), np.float32), np.ones((8, 1), np.float32)
    stream = _Terminal()
    bar = keras_progress(4, 2, stream=stream)
    _tiny_model().fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[bar])
    assert bar.progress._bar is not None  # 2 of 8: a later fit may continue
    bar.on_train_end()  # called directly, as the command does after an interrupt
    assert bar.progress._bar is None and "2/8" in _frames(stream)[-1]

    class StopAfterOneEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = True

    stream = _Terminal()
    bar = keras_progress(4, 2, stream=stream)
    _tiny_model().fit(x, y, batch_size=4, epochs=4, verbose=0,
                      callbacks=[StopAfterOneEpoch(), bar])
    assert bar.progress._bar is None and "2/8" in _frames(stream)[-1]


def test_keras_progress_checks_its_arguments():
    with pytest.raises(ValueError, match=r"initial_batch must be <= steps_per_epoch \(5\), got 6"):
        keras_progress(2, 5, enabled=False, initial_batch=6)
    with pytest.raises(ValueError, match="initial_batch must be an int >= 0, got -1"):
        keras_progress(2, 5, enabled=False, initial_batch=-1)
    with pytest.raises(ValueError, match="steps_per_epoch must be an int >= 1, got 0"):
        keras_progress(2, 0, enabled=False)
    callback = keras_progress(2, 5, enabled=False, initial_epoch=1, initial_batch=5)
    assert (callback.total, callback.seen) == (5, 5)


def test_train_classifier_resumed_mid_epoch_starts_its_bar_at_the_skipped_batches(
        tmp_path, monkeypatch):
    import sys

    from robustgrad import cli

    from conftest import sigint_after_train_batches

    args = ["train-classifier", "--data", "digits", "--limit", "256", "--method", "fast",
            "--epochs", "3", "--batch-size", "16", "--width", "4", "--no-eval", "--no-guard",
            "--out", str(tmp_path / "run")]
    _, restore = sigint_after_train_batches(monkeypatch, 21)  # epoch 2 (16 batches), batch 5
    assert cli.main([*args, "--verbose", "0"]) == 130
    restore()
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli.main([*args, "--verbose", "1", "--resume"]) == 0
    bar = [f for f in _frames(terminal) if f.startswith("training:")]
    # the job from epoch 2 on: 2 x 16 batches, 5 of them done before the interruption
    assert "5/32" in bar[0] and "0/32" not in bar[0]
    assert bar[-1].startswith("training: 100%") and "32/32" in bar[-1]
