"""The learn driver: callbacks, the progress bar, checkpoints and interrupts around
``Agent.learn``'s loop. It exists once for every algorithm (DESIGN.md section 8).

``Agent.learn`` (:mod:`agents.core.base`) is the loop: one call to the algorithm at a time
(collect, update), then the update's bookkeeping (history, the non-finite stop). What it asks
of a :class:`LearnDriver` is what the loop is not: the checks of ``learn``'s arguments; the
callbacks' ``on_training_start``, ``on_update`` and ``on_training_end``; the progress bar;
the periodic checkpoint (``checkpoint_every`` steps into ``checkpoint_dir``, a call ending
where one is due), the final one and, on SIGINT/SIGTERM, the one written before
:class:`robustgrad.interrupts.TrainingInterrupted` is raised. It reads and writes the agent
only through its public surface (``save``, ``config``, ``history``, ``num_timesteps``,
``training_failed``).

Example (what ``Agent.learn`` does, with ``train`` standing for one call of the algorithm)::

    run = LearnDriver(agent, 10_000, callbacks=None, progress_bar=False)
    run.start()                      # on_training_start
    with run:                        # interrupts deferred; on exit: bar, on_training_end, save
        while run.done < run.total_steps:
            logs, steps = train(run.until())
            logs["steps_per_second"] = run.advance(steps)
            if run.after_call(logs):  # callbacks, checkpoint, interrupt: stop?
                break
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack, nullcontext
from typing import Any

import numpy as np

from agents.core.callbacks import Callback, ProgressBar, as_callbacks
from agents.core.interface import AgentInterface
from agents.core.limits import check_total_steps
from robustgrad.interrupts import TrainingInterrupted, deferred_interrupts


class LearnDriver:
    """One ``learn`` call's callbacks, progress bar, checkpoints and interrupt handling.

    Args:
      agent: the agent that learns (:class:`agents.Agent`).
      total_steps: environment steps of the call (checked: a positive integer of at most
        ``MAX_TOTAL_STEPS``).
      callbacks: :class:`agents.core.callbacks.Callback` objects or callables
        ``fn(agent, logs)``; returning ``False`` stops training.
      progress_bar: show the bar (:class:`agents.core.callbacks.ProgressBar`).
      schedule_start: steps of a longer schedule already done (a non-negative integer).
      handle_interrupts: defer SIGINT/SIGTERM to the end of the current call, then save and
        raise :class:`robustgrad.interrupts.TrainingInterrupted`.

    Attributes: ``total_steps``, ``schedule_start``, ``done`` (environment steps so far).

    With several iterations per compiled call (``iterations_per_call`` on the graph
    backend), Python sees the agent at call boundaries: ``history`` still gets one entry per
    iteration, but callbacks run once per call, with the logs of its last iteration
    (``logs["iterations"]``: how many the call ran) and the agent as it is then; a callback
    that stops training, an interrupt and a periodic checkpoint act at the end of the call.
    A call ends early where a checkpoint is due and at the end of the budget (:meth:`until`),
    so checkpoints and the final state are those of one iteration per call; the non-finite
    stop too.

    ``handle_interrupts``: a SIGINT (Ctrl-C) or SIGTERM stops training after the current
    update, writes a checkpoint of the current state (``checkpoint_dir``, or a temporary
    directory) and raises :class:`robustgrad.interrupts.TrainingInterrupted` (a
    ``KeyboardInterrupt``) naming it; a second signal aborts at once.
    """

    def __init__(self, agent: AgentInterface, total_steps: int,
                 callbacks: Callback | Callable | Iterable[Callback | Callable] | None = None,
                 progress_bar: bool = True, schedule_start: int = 0,
                 handle_interrupts: bool = True):
        self.total_steps = check_total_steps(total_steps)  # at most MAX_TOTAL_STEPS
        if isinstance(schedule_start, bool) or not isinstance(schedule_start, (int, np.integer)) \
                or schedule_start < 0:
            raise ValueError(f"schedule_start: must be a non-negative integer, got "
                             f"{schedule_start!r}")
        self.schedule_start = schedule_start
        self.agent = agent
        self.callbacks = as_callbacks(callbacks)
        self.bar = ProgressBar(self.total_steps, enabled=progress_bar)
        self.handle_interrupts = handle_interrupts
        self.done = 0
        self._next_checkpoint: int | None = None  # set on entering, as config then says
        self._interrupt: Any = None
        self._stack = ExitStack()
        self._start = time.perf_counter()

    def start(self) -> None:
        """The callbacks' ``on_training_start``."""
        for cb in self.callbacks:
            cb.on_training_start(self.agent)

    @property
    def interrupted(self) -> bool:
        """A SIGINT/SIGTERM arrived (``handle_interrupts``) since the block was entered."""
        return bool(self._interrupt is not None and self._interrupt.requested)

    def __enter__(self) -> LearnDriver:
        """Mark the agent's training unfinished (``training_failed``) and defer interrupts."""
        self.agent.training_failed = True  # until the loop finishes or a callback stops it
        interrupts = deferred_interrupts("training") if self.handle_interrupts \
            else nullcontext(None)
        self._interrupt = self._stack.enter_context(interrupts)
        self._stack.callback(self._close)  # runs before the interrupts' handlers are restored
        every = self.agent.config.checkpoint_every
        self._next_checkpoint = every if every else None
        self._start = time.perf_counter()
        return self

    def until(self) -> int:
        """Environment steps after which the next call must end: what is left of the budget,
        or of the way to the next periodic checkpoint."""
        until = self.total_steps - self.done
        if self._next_checkpoint is not None and self.agent.config.checkpoint_dir:
            until = min(until, self._next_checkpoint - self.done)
        return until

    def advance(self, steps: int) -> float:
        """Count ``steps`` more environment steps; returns the steps per second so far."""
        self.done += steps
        return self.done / max(time.perf_counter() - self._start, 1e-9)

    def after_call(self, logs: dict) -> bool:
        """After a call (``logs``: its last update's, with ``steps_per_second`` and
        ``episode_return``): the bar, the callbacks' ``on_update``, a periodic checkpoint if one
        is due; ``True`` when training must stop (a callback returned ``False``, or an
        interrupt: the update is complete, a safe point)."""
        ret = logs["episode_return"]
        self.bar.update(self.done, logs["steps_per_second"], ret if ret == ret else None)
        stop = any(cb.on_update(self.agent, logs) is False for cb in self.callbacks)
        cfg = self.agent.config
        if self._next_checkpoint is not None and self.done >= self._next_checkpoint \
                and cfg.checkpoint_dir:
            self.agent.save(cfg.checkpoint_dir)
            self._next_checkpoint += cfg.checkpoint_every
        return stop or self.interrupted

    def _close(self) -> None:
        history = self.agent.history
        last = history[-1]["episode_return"] if history else float("nan")
        self.bar.update(self.done, self.done / max(time.perf_counter() - self._start, 1e-9),
                        last if last == last else None, force=True)
        self.bar.close()
        for cb in self.callbacks:
            cb.on_training_end(self.agent)

    def __exit__(self, exc_type, exc, tb) -> None:
        """The bar's last line and ``on_training_end`` (always); then, if the loop ended
        without an exception, the final checkpoint (``checkpoint_dir``) or, after an
        interrupt, a checkpoint (``checkpoint_dir`` or a temporary directory) and
        :class:`robustgrad.interrupts.TrainingInterrupted` naming it."""
        if exc_type is None:
            # an interrupted run is unfinished: callbacks must not treat it as the end
            # (EvalCallback's keep_best leaves the current weights for the resume)
            self.agent.training_failed = self.interrupted
        self._stack.__exit__(exc_type, exc, tb)
        if exc_type is not None:
            return
        agent, cfg = self.agent, self.agent.config
        if self.interrupted:
            path = cfg.checkpoint_dir or tempfile.mkdtemp(prefix=f"robustgrad-{agent.algo}-")
            agent.save(path)
            raise TrainingInterrupted(
                f"training stopped by {self._interrupt.signal_name} at step "
                f"{int(agent.num_timesteps.numpy())}; checkpoint saved to {path}",
                checkpoint=path, signal_name=self._interrupt.signal_name)
        if cfg.checkpoint_dir:
            agent.save(cfg.checkpoint_dir)
