"""The ``robustgrad`` command line.

The outermost layer: each sub-command lives in its own module under
:mod:`robustgrad.commands` and is imported lazily, only when it runs, so
``robustgrad --help`` stays fast and the core never imports ``attacks`` or
``agents``. A command module exposes ``HELP`` (one line), ``add_arguments(parser)``
and ``run(args) -> int``.

Example::

    $ robustgrad --version
    $ robustgrad demo --out runs/demo
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Quiet TensorFlow's C++ start-up chatter unless the user asked for it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# sub-command name -> (module under robustgrad.commands, one-line help)
COMMANDS = {
    "demo": ("demo", "run the main job on the embedded defaults (digits, CartPole)"),
    "train-classifier": ("train_classifier", "adversarially train a classifier"),
    "evaluate": ("evaluate", "evaluate a classifier's robustness under attacks"),
    "sensitivity": ("sensitivity", "input-gradient sensitivity analysis of a classifier"),
    "train-agent": ("train_agent", "train an RL agent on a gymnasium environment"),
    "evaluate-agent": ("evaluate_agent", "evaluate an RL agent, clean and under observation attacks"),
}


def _load(module: str):
    return importlib.import_module(f"robustgrad.commands.{module}")


def build_parser(load_commands: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; only the command named ``load_commands`` is imported."""
    from robustgrad import __version__

    parser = argparse.ArgumentParser(
        prog="robustgrad",
        description="Gradients as a first-class, controllable thing on TensorFlow 2.",
    )
    parser.add_argument("--version", action="version", version=f"robustgrad {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == load_commands:
            try:
                mod = _load(module)
            except ModuleNotFoundError as exc:  # a command not yet shipped
                if exc.name != f"robustgrad.commands.{module}":
                    raise
                p.set_defaults(_missing=name)
                continue
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if getattr(args, "_missing", None):
        print(f"robustgrad: the '{args._missing}' command is not available in this version",
              file=sys.stderr)
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
