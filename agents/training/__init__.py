"""Agent training runs as library calls: what ``robustgrad train-agent`` does, for Python users.

* :func:`train_agent` -- one seed: build or resume the agent of an
  :class:`~agents.core.config.AgentConfig` in a :class:`robustgrad.rundir.RunDirectory`, train it
  with periodic checkpoints and evaluation, save it and report;
* :func:`train_seeds` -- the seed axis: many seeds of one config, in groups trained together,
  one saved agent per seed and a summary over seeds.

Both follow the run directory's rules (its lock, the one resume rule, a configuration record
with provenance, atomic writes); the command line only parses its flags into a config and calls
them. This wing sits on top of the others and imports down only.
"""

from agents.training.run import ARTIFACTS, TrainedAgent, plot_learning_curve, train_agent
from agents.training.seeds import GROUP_SIZE, SeedsResult, train_seeds

__all__ = ["ARTIFACTS", "GROUP_SIZE", "SeedsResult", "TrainedAgent", "plot_learning_curve",
           "train_agent", "train_seeds"]
