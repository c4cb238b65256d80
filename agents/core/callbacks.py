"""Callbacks for ``Agent.learn`` and its progress bar.

A callback is a :class:`Callback` or a plain callable ``fn(agent, logs)`` (called like
``on_update``). ``on_update`` returning ``False`` stops training after that update.
``logs`` holds python floats: ``steps``, ``steps_per_second``, ``episode_return``
(mean over the last 20 finished episodes), the losses and diagnostics of the update.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import IO, Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from agents.core._loading import load
from agents.core.interface import AgentInterface
from robustgrad.progress import Progress


class Callback:
    """Hooks of ``learn``: override the ones you need."""

    def on_training_start(self, agent: AgentInterface) -> None:
        """Called once before the first update of ``learn``."""

    def on_update(self, agent: AgentInterface, logs: dict[str, Any]) -> bool | None:
        """Called after every update with its ``logs``; return ``False`` to stop training."""
        return None

    def on_training_end(self, agent: AgentInterface) -> None:
        """Called once when ``learn`` ends (also when it stops early or fails)."""


class _FunctionCallback(Callback):
    def __init__(self, fn):
        self.fn = fn

    def on_update(self, agent, logs):
        return self.fn(agent, logs)


def as_callbacks(callbacks: Callback | Callable | Iterable[Callback | Callable] | None
                 ) -> list[Callback]:
    """``learn``'s ``callbacks`` argument as a list of :class:`Callback`: ``None`` is none, a plain
    callable ``fn(agent, logs)`` is wrapped as an ``on_update``.

    >>> [type(c).__name__ for c in as_callbacks(lambda agent, logs: None)]
    ['_FunctionCallback']
    >>> as_callbacks(None)
    []
    """
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
        self._writer: tf.summary.SummaryWriter | None = None

    def on_training_start(self, agent: AgentInterface) -> None:
        """Open the event-file writer in ``log_dir``."""
        global _SCALAR_METADATA
        if _SCALAR_METADATA is None:
            _SCALAR_METADATA = _scalar_metadata()
        self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_update(self, agent: AgentInterface, logs: dict[str, Any]) -> None:
        """Write every finite numeric entry of ``logs`` as a scalar at step ``logs['steps']``."""
        if self._writer is None:
            self.on_training_start(agent)
        assert self._writer is not None  # on_training_start opened it
        with self._writer.as_default():
            step = int(logs["steps"])
            for k, v in logs.items():
                if k != "steps" and isinstance(v, (int, float)) and v == v:
                    tf.summary.write(k, tf.constant(float(v), tf.float32), step=step,
                                     metadata=_SCALAR_METADATA)
        return None

    def on_training_end(self, agent: AgentInterface) -> None:
        """Flush the event file."""
        if self._writer is not None:
            self._writer.flush()


class EvalCallback(Callback):
    """Evaluate the deterministic policy every ``every`` environment steps and, with
    ``keep_best``, end training on the best-evaluated weights.

    This is Stable-Baselines3's ``EvalCallback`` with its ``best_model``: value-based agents
    in particular (DQN on CartPole) swing between good and poor greedy policies late in
    training, and keeping the best evaluated weights is the standard remedy. Evaluations
    use their own episode seeds (``seed``, default ``config.seed + 20_000``), distinct from
    :meth:`Agent.evaluate`'s default ones (``config.seed + 10_000``), so a final
    ``agent.evaluate()`` does not score the agent on the episodes it was selected on.
    Evaluation does not touch the training state (own env, no RNG draws).

    Args:
        every: environment steps between evaluations (> 0); the first comes after ``every``
            steps, and at the end of training the final weights are evaluated too.
        n_episodes: episodes per evaluation (> 0, default 10).
        keep_best: restore the weights (:meth:`Agent.get_weights`) of the best evaluation
            when training ends, if it beat the final weights (ties keep the later weights).
        seed: evaluation env seed (default ``config.seed + 20_000``).
        best_dir: if set, the agent is saved there (:meth:`Agent.save`) at each new best,
            with ``best.json`` holding its return and step.
        verbose: print one line per evaluation.

    After training: ``evaluations`` (list of ``(steps, mean_return)``), ``best_return``,
    ``best_steps``, ``restored`` (whether the best weights were put back). The update on
    which an evaluation runs gets ``logs["eval_return"]`` (before later callbacks, e.g.
    :class:`TensorBoardCallback`, see the logs).

    Example::

        cb = agents.core.callbacks.EvalCallback(every=5_000, n_episodes=10, keep_best=True)
        agent = agents.DQN(env="CartPole-v1", seed=0)
        agent.learn(100_000, callbacks=[cb])
        agent.evaluate(20)     # the best-evaluated weights, scored on fresh episodes
    """

    def __init__(self, every: int, n_episodes: int = 10, keep_best: bool = False,
                 seed: int | None = None, best_dir: str | None = None, verbose: bool = False):
        for name, value in (("every", every), ("n_episodes", n_episodes)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed: must be an integer or None, got {seed!r}")
        self.every = every
        self.n_episodes = n_episodes
        self.keep_best = bool(keep_best)
        self.seed = seed
        self.best_dir = best_dir
        self.verbose = verbose
        self.evaluations: list[tuple[int, float]] = []
        self.best_return = float("-inf")
        self.best_steps: int | None = None
        self.restored = False
        self._best_weights: list[np.ndarray] | None = None
        self._next: int | None = None

    def _evaluate(self, agent) -> float:
        seed = agent.config.seed + 20_000 if self.seed is None else self.seed
        ret = agent.evaluate(self.n_episodes, deterministic=True, seed=seed)["mean_return"]
        steps = int(agent.num_timesteps.numpy())
        self.evaluations.append((steps, ret))
        new_best = ret >= self.best_return
        if new_best:
            self.best_return, self.best_steps = ret, steps
            if self.keep_best:
                self._best_weights = agent.get_weights()
            if self.best_dir:
                agent.save(self.best_dir)
                with open(os.path.join(self.best_dir, "best.json"), "w") as f:
                    json.dump({"mean_return": ret, "steps": steps,
                               "n_episodes": self.n_episodes}, f)
        if self.verbose:
            print(f"eval at {steps} steps: {ret:.1f} over {self.n_episodes} episodes"
                  f"{' (new best)' if new_best else ''}", flush=True)
        return ret

    def load_best(self, directory: str, env: Any = None) -> None:
        """Continue from a ``best_dir`` written by an earlier (interrupted) run: take its
        best return, step and weights as the ones to beat (``--resume`` uses this)."""
        with open(os.path.join(directory, "best.json")) as f:
            best = json.load(f)
        self.best_return, self.best_steps = float(best["mean_return"]), int(best["steps"])
        if self.keep_best:
            self._best_weights = load(directory, env=env).get_weights()

    def on_training_start(self, agent: AgentInterface) -> None:
        """Schedule the first evaluation ``every`` steps from the agent's current step."""
        self._next = int(agent.num_timesteps.numpy()) + self.every
        self.restored = False

    def on_update(self, agent: AgentInterface, logs: dict[str, Any]) -> None:
        """Evaluate when ``logs['steps']`` passed the next scheduled step; the return goes into
        ``logs['eval_return']``."""
        if self._next is None:
            self.on_training_start(agent)
        assert self._next is not None  # on_training_start scheduled it
        if logs["steps"] >= self._next:
            logs["eval_return"] = self._evaluate(agent)
            while self._next <= logs["steps"]:
                self._next += self.every
        return None

    def on_training_end(self, agent: AgentInterface) -> None:
        """Evaluate the final weights (unless the last update was) and, with ``keep_best``, put
        the best-evaluated weights back if they beat them; nothing when training failed."""
        if getattr(agent, "training_failed", False):
            return  # an exception is propagating: leave the weights and the env alone
        steps = int(agent.num_timesteps.numpy())
        if self.evaluations and self.evaluations[-1][0] == steps:
            final = self.evaluations[-1][1]  # the last update was evaluated already
        else:
            final = self._evaluate(agent)
        if self.keep_best and self._best_weights is not None and self.best_return > final:
            agent.set_weights(self._best_weights)
            self.restored = True
            if self.verbose:
                print(f"restored the weights of step {self.best_steps} "
                      f"({self.best_return:.1f} against {final:.1f} at the end)", flush=True)


class ProgressBar:
    """The bar of :meth:`Agent.learn` on stderr: steps done of the budget, elapsed time, steps per
    second, time left and the mean episode return (a :class:`robustgrad.progress.Progress`).

    Quiet when ``enabled`` is false or ``stream`` (default stderr) is not a terminal.
    """

    def __init__(self, total: int, enabled: bool = True, stream: IO[str] | None = None):
        self.total = max(int(total), 1)
        self._progress = Progress(self.total, desc="training", unit="steps", enabled=enabled,
                                  stream=stream)
        self.enabled = self._progress.active

    def update(self, done: int, sps: float | None = None, episode_return: float | None = None,
               force: bool = False) -> None:
        """Report ``done`` steps (``sps`` is accepted for compatibility; the rate shown is the
        bar's own); ``force`` is accepted for compatibility (the bar refreshes itself)."""
        if episode_return is None or episode_return != episode_return:
            self._progress.update_to(done)
        else:
            self._progress.update_to(done, **{"return": f"{episode_return:.1f}"})

    def close(self) -> None:
        """End the bar's line (nothing when quiet)."""
        self._progress.close()
