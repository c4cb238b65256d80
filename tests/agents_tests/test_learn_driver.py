"""``agents.core.driver.LearnDriver``, learn()'s driver, on a stand-in agent (no training): the
argument checks, where a call must end (budget, next periodic checkpoint), the callbacks and
checkpoints in order, and what an exception or a stopping callback leaves."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agents.core.callbacks import Callback
from agents.core.driver import LearnDriver


class _Agent:
    """What the driver uses of an agent: ``config``, ``save``, ``history``, ``num_timesteps``,
    ``algo``, ``training_failed``."""

    algo = "ppo"

    def __init__(self, checkpoint_dir=None, checkpoint_every=0):
        self.config = SimpleNamespace(checkpoint_dir=checkpoint_dir,
                                      checkpoint_every=checkpoint_every)
        self.history: list[dict] = []
        self.num_timesteps = SimpleNamespace(numpy=lambda: 0)
        self.training_failed = False
        self.saved: list[tuple[int, str]] = []
        self.done = 0

    def save(self, directory):
        self.saved.append((self.done, directory))
        return directory


class _Recorder(Callback):
    def __init__(self, stop_at=None):
        self.events: list[str] = []
        self.stop_at = stop_at

    def on_training_start(self, agent):
        self.events.append("start")

    def on_update(self, agent, logs):
        self.events.append(f"update {logs['steps']}")
        return False if logs["steps"] == self.stop_at else None

    def on_training_end(self, agent):
        self.events.append(f"end failed={agent.training_failed}")


def _run(agent, run, step=100):
    """The loop of Agent.learn with a fixed number of steps per call."""
    calls = []
    with run:
        while run.done < run.total_steps:
            until = run.until()
            calls.append(until)
            n = min(step, until)
            agent.done += n
            logs = {"steps": agent.done, "episode_return": 1.0}
            logs["steps_per_second"] = run.advance(n)
            if run.after_call(logs):
                break
    return calls


def test_calls_end_at_each_periodic_checkpoint_and_the_final_state_is_saved(tmp_path):
    agent, cb = _Agent(str(tmp_path), checkpoint_every=250), _Recorder()
    run = LearnDriver(agent, 600, cb, progress_bar=False)
    run.start()
    calls = _run(agent, run)
    # 250 and 500 are checkpoints: a call never runs past them, nor past the budget
    assert calls == [250, 150, 50, 250, 150, 50, 100]
    assert agent.saved == [(250, str(tmp_path)), (500, str(tmp_path)), (600, str(tmp_path))]
    assert cb.events[0] == "start" and cb.events[-1] == "end failed=False"
    assert agent.training_failed is False


def test_a_callback_that_returns_false_stops_after_its_update():
    agent, cb = _Agent(), _Recorder(stop_at=200)
    run = LearnDriver(agent, 1_000, cb, progress_bar=False, handle_interrupts=False)
    run.start()
    _run(agent, run)
    assert cb.events == ["start", "update 100", "update 200", "end failed=False"]
    assert agent.saved == []  # no checkpoint_dir: nothing written


def test_an_exception_in_the_loop_leaves_training_failed_and_writes_no_final_checkpoint(tmp_path):
    agent, cb = _Agent(str(tmp_path)), _Recorder()
    run = LearnDriver(agent, 1_000, cb, progress_bar=False)
    with pytest.raises(RuntimeError, match="env broke"), run:
        raise RuntimeError("env broke")
    assert cb.events == ["end failed=True"]
    assert agent.training_failed is True and agent.saved == []


@pytest.mark.parametrize("bad", [-1, 1.5, True, "0"])
def test_schedule_start_must_be_a_non_negative_integer(bad):
    with pytest.raises(ValueError, match="schedule_start: must be a non-negative integer"):
        LearnDriver(_Agent(), 100, schedule_start=bad)
