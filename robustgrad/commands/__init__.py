"""Sub-commands of the ``robustgrad`` CLI, one module each (see robustgrad.cli)."""
