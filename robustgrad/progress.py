"""One progress display for every long job (training, evaluation, agents), on ``tqdm``.

A :class:`Progress` shows a bar with the count, the elapsed time, the rate and the estimated time
left, plus a few named figures (``loss=0.31``), redrawn in place on stderr at most five times a
second. It is quiet (writes nothing, costs nothing) when disabled (``--no-progress``) or when its
stream is not a terminal, so logs and CI output hold no bar fragments. Three adapters share it:

* :class:`EvaluationProgress`: the ``progress(done, total, desc)`` callable of
  :func:`attacks.evaluate`;
* :func:`keras_progress`: a Keras callback for ``fit`` (one bar over all epochs' batches);
* ``agents.core.callbacks.ProgressBar``: the bar of ``Agent.learn``.

This module imports neither TensorFlow nor ``tqdm`` until a display is actually shown.

Example:
  >>> with Progress(100, desc="crafting", unit="ex", enabled=False) as bar:
  ...     for done in range(0, 101, 25):
  ...         bar.update_to(done, loss=0.5)
  >>> bar.active, bar.done
  (False, 100)
"""

from __future__ import annotations

import sys
from typing import IO, TYPE_CHECKING, Any

from robustgrad.checks import positive_int

if TYPE_CHECKING:  # keras loads TensorFlow: only imported when a display is shown
    import keras

__all__ = ["EvaluationProgress", "Progress", "is_terminal", "keras_progress"]

_REFRESH_SECONDS = 0.2


def is_terminal(stream: IO | None) -> bool:
    """Whether ``stream`` is an interactive terminal (a bar there is redrawn in place)."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class Progress:
    """A progress bar over ``total`` units of work on ``stream`` (default: ``sys.stderr``).

    Args:
        total: units of work (an int >= 0; 0 shows a count without a bar).
        desc: what is being done, shown before the bar.
        unit: what one unit is (``"steps"``, ``"batches"``), shown in the rate.
        enabled: ``False`` (e.g. ``--no-progress``) turns the display off; it is also off when
            ``stream`` is not a terminal.
        stream: where to draw (default ``sys.stderr`` at construction time).
        initial: units already done before this display started (a resumed job): the bar
            starts there, and the rate counts only the work done since.

    ``active`` says whether anything is drawn; ``done`` is the position last reported.
    """

    def __init__(self, total: int, desc: str = "", unit: str = "it", enabled: bool = True,
                 stream: IO | None = None, initial: int = 0):
        self.total = int(positive_int(total, "total", minimum=0))
        initial = int(positive_int(initial, "initial", minimum=0))
        if self.total and initial > self.total:
            raise ValueError(f"initial must be <= total ({self.total}), got {initial}")
        self.stream = sys.stderr if stream is None else stream
        self.active = bool(enabled) and is_terminal(self.stream)
        self.done = initial
        self._bar = None
        if self.active:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total or None, desc=desc or None, unit=unit,
                             file=self.stream, mininterval=_REFRESH_SECONDS, dynamic_ncols=True,
                             leave=True, smoothing=0.1, initial=initial)

    def update_to(self, done: int, desc: str | None = None, **figures: Any) -> None:
        """Move the bar to ``done`` units (absolute, not an increment) and show ``figures``."""
        self.done = int(done)
        if self._bar is None:
            return
        if desc is not None:
            self._bar.set_description_str(desc, refresh=False)
        if figures:
            self._bar.set_postfix_str(", ".join(f"{k}={_format(v)}" for k, v in figures.items()),
                                      refresh=False)
        self._bar.update(self.done - self._bar.n)

    def close(self) -> None:
        """Draw the final state and end the line (idempotent)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class EvaluationProgress:
    """The ``progress(done, total, desc)`` callable :func:`attacks.evaluate` reports to.

    The bar starts at the first call (when the total is known) and closes when ``done`` reaches
    ``total``.

    Example:
      >>> progress = EvaluationProgress(enabled=False)
      >>> progress(3, 10, "pgd eps=0.1")
    """

    def __init__(self, enabled: bool = True, stream: IO | None = None, unit: str = "batches"):
        self.enabled = enabled
        self.stream = stream
        self.unit = unit
        self._progress: Progress | None = None

    def __call__(self, done: int, total: int, desc: str) -> None:
        if self._progress is None or self._progress.total != total:
            self.close()
            self._progress = Progress(total, desc=desc, unit=self.unit, enabled=self.enabled,
                                      stream=self.stream)
        self._progress.update_to(done, desc=desc)
        if done >= total:
            self.close()

    def close(self) -> None:
        """End the current bar, if one is shown (idempotent)."""
        if self._progress is not None:
            self._progress.close()
            self._progress = None


def keras_progress(epochs: int, steps_per_epoch: int, enabled: bool = True,
                   stream: IO | None = None, initial_epoch: int = 0,
                   initial_batch: int = 0) -> keras.callbacks.Callback:
    """A ``keras.callbacks.Callback`` showing one :class:`Progress` over every training batch of
    ``fit`` from ``initial_epoch`` on, with the epoch and the running loss; use it with
    ``fit(verbose=0)``.

    A resumed job passes ``initial_batch``, the batches of ``initial_epoch`` trained before the
    interruption: the bar counts the whole remaining job, ``(epochs - initial_epoch) *
    steps_per_epoch`` batches, and starts at ``initial_batch`` of them. The same callback may
    serve several ``fit`` calls of one job (the rest of an interrupted epoch, then the remaining
    epochs): the bar stays open between them and closes when the last batch is done, when a
    callback stops training (``model.stop_training``), or when ``close()`` (or ``on_train_end()``
    called directly, without Keras' logs) ends it early, as after an interrupt.

    Example:
      >>> callback = keras_progress(epochs=2, steps_per_epoch=10, enabled=False, initial_batch=4)
      >>> type(callback).__name__, callback.total, callback.seen
      ('ProgressCallback', 20, 4)
    """
    import keras

    epochs = int(positive_int(epochs, "epochs"))
    steps_per_epoch = int(positive_int(steps_per_epoch, "steps_per_epoch"))
    initial_epoch = int(positive_int(initial_epoch, "initial_epoch", minimum=0))
    initial_batch = int(positive_int(initial_batch, "initial_batch", minimum=0))
    if initial_batch > steps_per_epoch:
        raise ValueError(f"initial_batch must be <= steps_per_epoch ({steps_per_epoch}), "
                         f"got {initial_batch}")
    total = max(epochs - initial_epoch, 0) * steps_per_epoch

    class ProgressCallback(keras.callbacks.Callback):
        """The bar of :func:`keras_progress` (``total`` batches, ``seen`` done so far)."""

        def __init__(self) -> None:
            super().__init__()
            self.progress: Progress | None = None
            self.total = total
            self.seen = min(initial_batch, total)
            self._epoch = initial_epoch

        def on_train_begin(self, logs: dict | None = None) -> None:
            """Show the bar at the first ``fit`` of the job (a later ``fit`` continues it)."""
            if self.progress is None:
                self.progress = Progress(self.total, desc="training", unit="batches",
                                         enabled=enabled, stream=stream, initial=self.seen)

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            """Note the epoch shown beside the bar."""
            self._epoch = epoch

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            """Advance the bar by one batch and show the running loss."""
            self.seen += 1
            figures: dict[str, Any] = {"epoch": f"{self._epoch + 1}/{epochs}"}
            if logs and "loss" in logs:
                figures["loss"] = float(logs["loss"])
            if self.progress is not None:
                self.progress.update_to(self.seen, **figures)

        def on_train_end(self, logs: dict | None = None) -> None:
            """At the end of a ``fit``: close the bar once every batch is done or a callback
            stopped training. Called directly (no logs: the job ends here, e.g. interrupted),
            close it now."""
            stopped = bool(getattr(self.model, "stop_training", False))
            if logs is None or stopped or self.seen >= self.total:
                self.close()

        def close(self) -> None:
            """End the bar's line (idempotent)."""
            if self.progress is not None:
                self.progress.close()

    return ProgressCallback()
