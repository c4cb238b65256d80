"""The files a reader opens to read PPO's training top to bottom, and their lines.

Issue 33's goal: "PPO's training readable in at most 5 files and 1,500 lines (robustness
aside)". This script is the count: it starts at ``agents/algorithms/ppo.py`` and follows every
import of an ``agents`` module written in the code (function bodies included; imports under
``if TYPE_CHECKING:`` are annotations only and are not followed), except

- the robustness wing (``agents.robustness``) and the plug-in protocol that PPO calls
  (``agents.core.plugin``: without ``robust=`` every hook is the identity): "robustness aside";
- the seams listed in ``SEAMS``, each with the reason a PPO reader need not open it: a module
  that only builds the environments, saves or loads, runs callbacks, moves seeds between an
  ``S``-seed agent and ``S`` agents, runs Ray workers, or serves attacks, or that stands where
  CleanRL and PureJaxRL call a library (the optimizer, random keys, a linear schedule, logging).
  A seam is a place where PPO calls a named, documented function or object and reads back what
  its docstring states;
  it is never a base class: every module that defines a class of ``PPO``'s MRO is counted
  whatever the list says (the script imports ``agents`` to find them).

Counted: config fields PPO uses, the ``Agent`` shell's learn loop, rollout collection,
GAE/returns, the policy/value networks and distribution, the loss and update, and whatever
they import that is not a seam. Lines are whole files (``wc -l``): a reader who opens a file
pays for all of it.

Examples::

    python benchmarks/ppo_reading.py
    python benchmarks/ppo_reading.py --json reading.json
    python benchmarks/ppo_reading.py --max-files 5 --max-lines 1500   # exit 1 above the goal
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START = "agents.algorithms.ppo"
ASIDE = ("agents.robustness", "agents.core.plugin")
"""Robustness aside: the wing, and the protocol PPO calls (identity hooks without ``robust=``)."""

SEAMS = {
    "agents.envs": "the environment library (gymnasium's place in CleanRL): vector envs, "
                   "RunningMeanStd as gymnasium's NormalizeObservation/NormalizeReward",
    "agents.graph_envs": "environments written in TensorFlow ops (gymnax's place in PureJaxRL)",
    "agents.backends.factory": "which environments and collector (make_collector: one call)",
    "agents.backends.graph_backend": "the graph backend's env (an environment)",
    "agents.backends.seed_axis": "the S-seed env and export/import of one seed (not training)",
    "agents.backends.distributed": "Ray rollout workers (a Collector; off by default)",
    "agents.backends._ray_setup": "Ray start-up",
    "agents.core.networks": "the layers (torch.nn.Linear with CleanRL's layer_init, "
                            "flax.linen.Dense with orthogonal initialisers in PureJaxRL): "
                            "MLP(in, hidden, out, activation, out_gain, seed), and the "
                            "observation normaliser in front of it (gymnasium's "
                            "NormalizeObservation); the actor-critic built from them is "
                            "beside OnPolicyAgent and counted",
    "agents.core.limits": "the bounds a config's values are checked against (robustgrad.checks' "
                          "place): MAX_REPEATS, check_update_work(config, work, terms) and "
                          "the other limits of memory and of the wait for a stop, each "
                          "with the reason for its value",
    "agents.core.collectors": "the collector contract (gymnasium's env.step in CleanRL, env.step "
                              "in PureJaxRL): the rollout calls begin/step/end and reads back "
                              "(obs, reward, terminated, truncated, final_obs); check_batch",
    "agents.core.compiled": "own_function(method): the method as tf.function compiles it, with "
                            "its own trace count (a TensorFlow detail; it does what the "
                            "method does)",
    "agents.core.persistence": "save and load",
    "agents.core._loading": "load an agent from a directory",
    "agents.core.callbacks": "learn()'s callbacks (checkpoints, evaluation, logging)",
    "agents.core.driver": "the learn driver around Agent.learn's loop (CleanRL's and "
                          "PureJaxRL's scripts have none): learn()'s argument checks, "
                          "callbacks, the progress bar, periodic/final/interrupt checkpoints, "
                          "SIGINT/SIGTERM; it reads and writes the agent through its public "
                          "surface only",
    "agents.core.weights": "the policy as arrays: get_weights/set_weights copy and assign the "
                           "networks' variables (CleanRL's state_dict), policy_state what a Ray "
                           "worker's copy collects with (off by default)",
    "agents.core.interface": "the Protocols that callbacks and attacks use",
    "agents.core.policy": "PolicySurface: the policy as attacks and certification see it",
    "agents.core.presets": "the shipped presets file and make_config (the config of the "
                           "class asked for, from a preset and overrides; its values are the "
                           "config's)",
    "agents.core._step": "the optimizer (torch.optim.Adam and clip_grad_norm_ in CleanRL, optax "
                         "in PureJaxRL): make_adam_step gives a robustgrad.transforms "
                         "GradientStep (global-norm clip, non-finite guard, Adam); "
                         "step(grads) -> {grad_norm, applied}",
    "agents.core.streams": "the random keys (jax.random in PureJaxRL): keys(T) gives one "
                           "stateless key per step, stateless_per_seed draws each seed's",
    "agents.core.schedules": "linear(start, end, done, total), the learning rate's annealing "
                             "(optax.linear_schedule)",
    "agents.core._sums": "running sums and means of the update's logged statistics "
                         "(CleanRL's writer.add_scalar lines)",
    "agents.algorithms._iterations": "several iterations per compiled call "
                                     "(iterations_per_call > 1; off by default; the same "
                                     "iteration looped in one tf.function)",
}


def _path(module: str) -> str:
    base = os.path.join(ROOT, *module.split("."))
    return os.path.join(base, "__init__.py") if os.path.isdir(base) else base + ".py"


def _is_module(module: str) -> bool:
    return os.path.exists(_path(module))


def imports(module: str) -> list[str]:
    """The ``agents`` modules ``module`` imports (outside ``if TYPE_CHECKING:``)."""
    with open(_path(module), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found: list[str] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] == "agents":
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.append(sub if _is_module(sub) else node.module)
            elif isinstance(node, ast.Import):
                found.extend(a.name for a in node.names if a.name.split(".")[0] == "agents")
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    visit([c for c in children if isinstance(c, ast.stmt | ast.ExceptHandler)])

    visit(tree.body)
    return found


def _aside(module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in ASIDE)


def _seam(module: str) -> str | None:
    for name, reason in SEAMS.items():
        if module == name or module.startswith(name + "."):
            return reason
    return None


def mro_modules() -> set[str]:
    """The modules that define a class of ``agents.PPO``'s MRO (always counted)."""
    sys.path.insert(0, ROOT)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import agents  # noqa: PLC0415 - this tree's, after the path is set

    return {c.__module__ for c in agents.PPO.__mro__ if c.__module__.startswith("agents")}


def count(always: set[str] = frozenset()) -> dict:
    """``{"files": [{"module", "path", "lines"}...], "seams": {...}, "aside": [...]}``;
    the modules in ``always`` (PPO's MRO) are counted even if listed as seams."""
    read: dict[str, int] = {}
    seams: dict[str, str] = {}
    aside: set[str] = set()
    stack = [START]
    while stack:
        module = stack.pop()
        if module in read or module in seams or module in aside:
            continue
        if _aside(module):
            aside.add(module)
            continue
        reason = None if module in always else _seam(module)
        if reason is not None:
            seams[module] = reason
            continue
        with open(_path(module), encoding="utf-8") as f:
            read[module] = sum(1 for _ in f)
        stack += imports(module)
    files = [{"module": m, "path": os.path.relpath(_path(m), ROOT), "lines": n}
             for m, n in sorted(read.items())]
    return {"files": files, "total_files": len(files), "total_lines": sum(read.values()),
            "seams": dict(sorted(seams.items())), "aside": sorted(aside)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the count to this file")
    parser.add_argument("--max-files", type=int, help="exit 1 when more files are read")
    parser.add_argument("--max-lines", type=int, help="exit 1 when more lines are read")
    args = parser.parse_args(argv)
    mro = mro_modules()
    result = count(mro)
    for row in result["files"]:
        print(f"{row['lines']:6d}  {row['path']}")
    print(f"{result['total_lines']:6d}  lines in {result['total_files']} files "
          f"(from {START.replace('.', '/')}.py)")
    print("not opened (seams):")
    for module, reason in result["seams"].items():
        print(f"        {module}: {reason}")
    print(f"robustness aside: {', '.join(result['aside'])}")
    overridden = sorted(m for m in mro if _seam(m))
    if overridden:
        print(f"listed as seams but counted (they define a class of PPO's MRO): {overridden}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    over = (args.max_files is not None and result["total_files"] > args.max_files) or \
        (args.max_lines is not None and result["total_lines"] > args.max_lines)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
