"""Callbacks for ``Agent.learn`` and a dependency-free progress bar.

A callback is a :class:`Callback` or a plain callable ``fn(agent, logs)`` (called like
``on_update``). ``on_update`` returning ``False`` stops training after that update.
``logs`` holds python floats: ``steps``, ``steps_per_second``, ``episode_return``
(mean over the last 20 finished episodes), the losses and diagnostics of the update.
"""

from __future__ import annotations

import sys
import time


class Callback:
    """Hooks of ``learn``: override the ones you need."""

    def on_training_start(self, agent) -> None:
        pass

    def on_update(self, agent, logs: dict) -> bool | None:
        return None

    def on_training_end(self, agent) -> None:
        pass


class _FunctionCallback(Callback):
    def __init__(self, fn):
        self.fn = fn

    def on_update(self, agent, logs):
        return self.fn(agent, logs)


def as_callbacks(callbacks) -> list[Callback]:
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback) or callable(callbacks):
        callbacks = [callbacks]
    out = []
    for cb in callbacks:
        if isinstance(cb, Callback):
            out.append(cb)
        elif callable(cb):
            out.append(_FunctionCallback(cb))
        else:
            raise ValueError(f"callbacks: expected Callback objects or callables, got {cb!r}")
    return out


def _scalar_metadata() -> bytes:
    from tensorflow.core.framework import summary_pb2

    md = summary_pb2.SummaryMetadata()
    md.plugin_data.plugin_name = "scalars"
    md.data_class = summary_pb2.DATA_CLASS_SCALAR
    return md.SerializeToString()


_SCALAR_METADATA = None


class TensorBoardCallback(Callback):
    """Write every numeric entry of ``logs`` as a TensorBoard scalar at ``logs['steps']``.

    Uses ``tf.summary.write`` with the scalars-plugin metadata (what ``tf.summary.scalar``
    does), so event files are written even when the ``tensorboard`` package is not
    installed; view them with ``tensorboard --logdir``.
    """

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self._writer = None

    def on_training_start(self, agent):
        import tensorflow as tf

        global _SCALAR_METADATA
        if _SCALAR_METADATA is None:
            _SCALAR_METADATA = _scalar_metadata()
        self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_update(self, agent, logs):
        import tensorflow as tf

        if self._writer is None:
            self.on_training_start(agent)
        with self._writer.as_default():
            step = int(logs["steps"])
            for k, v in logs.items():
                if k != "steps" and isinstance(v, (int, float)) and v == v:
                    tf.summary.write(k, tf.constant(float(v), tf.float32), step=step,
                                     metadata=_SCALAR_METADATA)
        return None

    def on_training_end(self, agent):
        if self._writer is not None:
            self._writer.flush()


class ProgressBar:
    """``[#####.....] 51200/100000 steps  4100 steps/s  return 187.3`` on stderr.

    Redraws in place on a terminal (at most 5 times a second); elsewhere prints a line
    at every 10% of the budget.
    """

    def __init__(self, total: int, enabled: bool = True, stream=None, width: int = 24):
        self.total = max(int(total), 1)
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = 0.0
        self._next_decile = 1
        self._last_line = None

    def update(self, done: int, sps: float, episode_return: float | None, force=False):
        if not self.enabled:
            return
        frac = min(done / self.total, 1.0)
        filled = int(frac * self.width)
        ret = "   n/a" if episode_return is None else f"{episode_return:8.1f}"
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} steps "
                f"{sps:7.0f} steps/s  return {ret}")
        now = time.monotonic()
        if self.tty:
            if force or now - self._last > 0.2:
                self.stream.write("\r" + line)
                self.stream.flush()
                self._last = now
        elif (force and line != self._last_line) or frac * 10 >= self._next_decile:
            while frac * 10 >= self._next_decile:
                self._next_decile += 1
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last_line = line

    def close(self):
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
